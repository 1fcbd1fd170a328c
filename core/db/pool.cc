#include "core/db/pool.h"

#include <algorithm>
#include <random>

#include "core/common/log.h"

namespace idemsink::db {

Pool::Pool(config::DatabaseConfig cfg, int threads) : cfg_(std::move(cfg)) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this, i] { worker(i); });
}

Pool::~Pool() { stop(std::chrono::steady_clock::now()); }

void Pool::submit(std::string name, Job job) {
  {
    std::lock_guard lk(mu_);
    queue_.push_back(Item{std::move(name), std::move(job)});
  }
  cv_.notify_one();
}

size_t Pool::queued() const {
  std::lock_guard lk(mu_);
  return queue_.size();
}

void Pool::run_once(const config::DatabaseConfig& cfg, const Job& job) {
  Connection conn(cfg);
  job(conn);
}

void Pool::stop(std::chrono::steady_clock::time_point deadline) {
  {
    std::unique_lock lk(mu_);
    if (threads_.empty()) return;
    stopping_ = true;
    cv_.notify_all();
    idle_cv_.wait_until(lk, deadline, [this] { return queue_.empty() && active_ == 0; });
    abandon_ = true;
    if (!queue_.empty()) spdlog::warn("database pool stopping with {} jobs not run", queue_.size());
    queue_.clear();
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void Pool::worker(int index) {
  std::unique_ptr<Connection> conn;
  std::mt19937 rng(std::random_device{}());
  for (;;) {
    Item item;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [this] { return !queue_.empty() || stopping_; });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      ++active_;
    }
    bool failing = false;
    for (int attempt = 0;; ++attempt) {
      try {
        if (!conn) {
          conn = std::make_unique<Connection>(cfg_);
          if (attempt > 0) reconnects_.fetch_add(1);
        }
        const uint64_t before = conn->statements_sent();
        item.job(*conn);
        statements_.fetch_add(conn->statements_sent() - before);
        break;
      } catch (const DbError& e) {
        job_failures_.fetch_add(1);
        if (conn) conn->rollback_quietly();
        if (e.error_class() != ErrorClass::Transient) conn.reset();
        // First failure, then every tenth retry: an outage must not flood the log.
        const bool loud = attempt % 10 == 0;
        if (e.error_class() == ErrorClass::ConnectionLost) {
          if (loud)
            spdlog::warn("db worker {}: job '{}' cannot reach the database ({}); retry {}, reconnecting", index,
                         item.name, e.what(), attempt + 1);
        } else if (e.error_class() == ErrorClass::Transient) {
          spdlog::info("db worker {}: job '{}' hit {}; re-running it", index, item.name, e.what());
        } else if (loud) {
          spdlog::error("db worker {}: job '{}' failed: {}; will re-run it after backoff (retry {})", index, item.name,
                        e.what(), attempt + 1);
        }
      } catch (const std::exception& e) {
        job_failures_.fetch_add(1);
        if (conn) conn->rollback_quietly();
        if (attempt % 10 == 0)
          spdlog::error("db worker {}: job '{}' threw: {}; will re-run it after backoff (retry {})", index, item.name,
                        e.what(), attempt + 1);
      }
      if (!failing) {
        failing = true;
        unhealthy_workers_.fetch_add(1);
      }
      // Exponential backoff with jitter, capped.
      const auto cap = std::min<int64_t>(cfg_.reconnect_backoff_max.count(), 50LL << std::min(attempt, 10));
      const auto wait = std::chrono::milliseconds(std::uniform_int_distribution<int64_t>(cap / 2, cap)(rng));
      std::unique_lock lk(mu_);
      if (cv_.wait_for(lk, wait, [this] { return abandon_; })) break;
    }
    if (failing) {
      unhealthy_workers_.fetch_sub(1);
      spdlog::info("db worker {}: job '{}' went through after the database came back", index, item.name);
    }
    {
      std::lock_guard lk(mu_);
      --active_;
    }
    idle_cv_.notify_all();
  }
}

}  // namespace idemsink::db
