#include "core/db/pool.h"

#include <algorithm>
#include <optional>
#include <random>

#include "core/common/log.h"

namespace idemsink::db {

Pool::Pool(config::DatabaseConfig cfg, int threads) : cfg_(std::move(cfg)) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this, i] { worker(i); });
}

Pool::~Pool() { stop(std::chrono::steady_clock::now()); }

void Pool::submit(std::string name, Job job, GiveUp give_up) {
  {
    std::lock_guard lk(mu_);
    queue_.push_back(Item{std::move(name), std::move(job), std::move(give_up)});
  }
  cv_.notify_one();
}

void Pool::on_server_changed(ServerChanged fn) {
  std::lock_guard lk(mu_);
  on_server_changed_ = std::move(fn);
}

void Pool::note_server(uint64_t id) {
  ServerChanged fn;
  uint64_t from = 0;
  {
    std::lock_guard lk(mu_);
    if (id == 0 || id == server_id_) return;
    from = std::exchange(server_id_, id);
    if (from == 0) return;  // the first server seen
    fn = on_server_changed_;
  }
  spdlog::warn("database {}: another server answers now (server_id {} -> {}): a failover", cfg_.label(), from, id);
  if (fn) fn(from, id);
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

namespace {

const char* class_name(ErrorClass c) {
  switch (c) {
    case ErrorClass::ConnectionLost: return "connection_lost";
    case ErrorClass::Transient: return "transient";
    case ErrorClass::Data: return "data";
    case ErrorClass::Unexpected: return "unexpected";
  }
  return "?";
}

}  // namespace

std::map<std::pair<std::string, std::string>, uint64_t> Pool::failures_by_job() const {
  std::lock_guard lk(mu_);
  return failures_;
}

std::string Pool::last_job_error() const {
  std::lock_guard lk(mu_);
  return last_job_error_;
}

void Pool::count_failure(const std::string& job, ErrorClass cls, const std::string& error) {
  job_failures_.fetch_add(1);
  std::lock_guard lk(mu_);
  ++failures_[{job, class_name(cls)}];
  if (cls == ErrorClass::Data || cls == ErrorClass::Unexpected) last_job_error_ = "job '" + job + "': " + error;
}

void Pool::worker(int index) {
  std::unique_ptr<Connection> conn;
  std::mt19937 rng(std::random_device{}());
  while (std::optional<Item> item = next_item()) {
    run_job(index, *item, conn, rng);
    {
      std::lock_guard lk(mu_);
      --active_;
    }
    idle_cv_.notify_all();
  }
}

std::optional<Pool::Item> Pool::next_item() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [this] { return !queue_.empty() || stopping_; });
  if (queue_.empty()) return std::nullopt;
  Item item = std::move(queue_.front());
  queue_.pop_front();
  ++active_;
  return item;
}

// One job, re-run until it goes through, gives up, or the pool is abandoned.
void Pool::run_job(int index, Item& item, std::unique_ptr<Connection>& conn, std::mt19937& rng) {
  Trouble trouble;
  for (int attempt = 0;; ++attempt) {
    const std::optional<DbError> error = run_once(item, conn, attempt);
    if (!error) break;
    const AfterFailure next = on_failure(index, item, *error, attempt, trouble, conn);
    if (next == AfterFailure::GaveUp) break;
    if (next == AfterFailure::BackOff && !back_off(attempt, rng)) break;
  }
  if (trouble.unreachable) {
    unhealthy_workers_.fetch_sub(1);
    spdlog::info("db worker {}: job '{}' went through after the database came back", index, item.name);
  }
  if (trouble.failing) failing_jobs_.fetch_sub(1);
}

// The job on the worker's connection (made afresh if it has none): nothing,
// or what went wrong.
std::optional<DbError> Pool::run_once(Item& item, std::unique_ptr<Connection>& conn, int attempt) {
  try {
    if (!conn) {
      conn = std::make_unique<Connection>(cfg_);
      if (attempt > 0) reconnects_.fetch_add(1);
      note_server(conn->server_id());
    }
    const uint64_t before = conn->statements_sent();
    item.job(*conn);
    statements_.fetch_add(conn->statements_sent() - before);
    return std::nullopt;
  } catch (const DbError& e) {
    return e;
  } catch (const std::exception& e) {
    return DbError(0, std::string("job threw: ") + e.what());  // unexpected
  }
}

// A failed run counted, logged and judged by its class (pool.h).
Pool::AfterFailure Pool::on_failure(int index, Item& item, const DbError& error, int attempt, Trouble& trouble,
                                    std::unique_ptr<Connection>& conn) {
  const ErrorClass cls = error.error_class();
  count_failure(item.name, cls, error.what());
  if (conn) conn->rollback_quietly();
  if (cls != ErrorClass::Transient && cls != ErrorClass::Data) conn.reset();
  // First failure, then every tenth retry: an outage must not flood the log.
  const bool loud = attempt % 10 == 0;
  if (cls == ErrorClass::ConnectionLost) {
    if (!trouble.unreachable) {
      trouble.unreachable = true;
      unhealthy_workers_.fetch_add(1);
    }
    if (loud)
      spdlog::warn("db worker {}: job '{}' cannot reach the database ({}); retry {}, reconnecting", index, item.name,
                   error.what(), attempt + 1);
    return AfterFailure::BackOff;
  }
  if (cls == ErrorClass::Transient) {
    spdlog::info("db worker {}: job '{}' hit {}; re-running it", index, item.name, error.what());
    return AfterFailure::RunAgain;
  }
  if (!trouble.failing) {
    trouble.failing = true;
    trouble.failing_since = std::chrono::steady_clock::now();
    failing_jobs_.fetch_add(1);
  }
  // A row the server refuses is isolated by the job's owner; anything else is
  // retried for a while, then handed over too.
  const bool give_up =
      item.give_up &&
      (cls == ErrorClass::Data || std::chrono::steady_clock::now() - trouble.failing_since >= cfg_.job_give_up_after);
  if (give_up) {
    spdlog::error(
        "db worker {}: job '{}' failed: {}; {}", index, item.name, error.what(),
        cls == ErrorClass::Data ? "isolating the row it refuses" : "giving up on it after database.job_give_up_after");
    item.give_up(error);
    return AfterFailure::GaveUp;
  }
  if (loud)
    spdlog::error("db worker {}: job '{}' failed: {}; will re-run it after backoff (retry {})", index, item.name,
                  error.what(), attempt + 1);
  return AfterFailure::BackOff;
}

// Exponential backoff with jitter, capped; false if the pool was abandoned
// meanwhile.
bool Pool::back_off(int attempt, std::mt19937& rng) {
  const auto cap = std::min<int64_t>(cfg_.reconnect_backoff_max.count(), 50LL << std::min(attempt, 10));
  const auto wait = std::chrono::milliseconds(std::uniform_int_distribution<int64_t>(cap / 2, cap)(rng));
  std::unique_lock lk(mu_);
  return !cv_.wait_for(lk, wait, [this] { return abandon_; });
}

}  // namespace idemsink::db
