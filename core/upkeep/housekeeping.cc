#include "core/upkeep/housekeeping.h"

#include "core/claim/order_hold.h"

#include <mysqld_error.h>

#include "core/claim/schema.h"
#include "core/common/log.h"

namespace idemsink::upkeep {

namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {
constexpr int kMonthsAhead = 3;
constexpr size_t kPurgeBatch = 1000;
constexpr auto kPurgeEvery = std::chrono::minutes(10);
constexpr auto kGaugesEvery = std::chrono::seconds(5);
}  // namespace

Housekeeping::Housekeeping(asio::io_context& io, db::Pool& pool, const config::Config& cfg, claim::ClaimStore& store,
                           const dlq::Outbox& outbox, metrics::Metrics& all, metrics::SliceMetrics& metrics)
    : io_(io),
      pool_(pool),
      cfg_(cfg),
      store_(store),
      outbox_(outbox),
      metrics_(metrics),
      partitions_timer_(io),
      purge_timer_(io),
      gauges_timer_(io) {
  for (const auto& rc : cfg.routes) {
    routes_[rc.name] = &all.route(rc.name);
    if (rc.order_by.enabled()) ordered_.push_back(rc.name);
    if (rc.order_by.hold_on_dead()) hold_on_dead_.push_back(rc.name);
  }
}

void Housekeeping::add_route(const config::RouteConfig& route, metrics::RouteMetrics& metrics) {
  routes_[route.name] = &metrics;
}

void Housekeeping::start() {
  // Schema changes are the DBA's when claim.apply_schema is off: then the
  // partitions are only watched (the gauge), never changed.
  // Once now, so the partitions-ahead gauge is known from the start, then on the timer.
  std::function<void()> round;
  if (cfg_.claim.apply_schema) {
    round = [this] { maintain(false, nullptr); };
  } else {
    round = [this] {
      pool_.submit("watch claim partitions", [this](db::Connection& c) {
        const int ahead = claim::months_ahead(c, std::chrono::system_clock::now());
        metrics_.claim_partitions_ahead.store(ahead);
        if (ahead < 1)
          spdlog::error(
              "claim partitions: the newest covers {} month(s) beyond this one; records of later months "
              "will be refused (no_claim_partition) until `idemsink schema apply` adds partitions",
              ahead);
      });
    };
  }
  round();
  partitions_timer_.start(cfg_.claim.maintenance_interval, round);
  purge_outbox();
  purge_timer_.start(kPurgeEvery, [this] { purge_outbox(); });
  gauges_timer_.start(kGaugesEvery, [this] { refresh_gauges(); });
}

void Housekeeping::stop() {
  stopped_ = true;
  partitions_timer_.stop();
  purge_timer_.stop();
  gauges_timer_.stop();
}

void Housekeeping::ensure_partitions(std::function<void(bool)> done) {
  waiting_.push_back(std::move(done));
  if (ensuring_) return;
  ensuring_ = true;
  maintain(true, [this](bool ok) {
    ensuring_ = false;
    for (auto& fn : std::exchange(waiting_, {})) fn(ok);
  });
}

void Housekeeping::maintain(bool wait_for_lock, std::function<void(bool)> done) {
  pool_.submit(
      "claim partitions",
      [this, wait_for_lock, done](db::Connection& c) {
        // One host at a time: the others skip a round, or wait for it.
        claim::PartitionLock lock(c, wait_for_lock ? 30 : 0);
        const bool locked = lock.held();
        claim::PartitionReport report;
        bool done_now = true;
        if (locked) {
          try {
            report = claim::maintain_partitions(c, std::chrono::system_clock::now(),
                                                {cfg_.claim.retention_days, kMonthsAhead});
          } catch (const db::DbError& e) {
            lock.release();
            if (e.code() != ER_LOCK_WAIT_TIMEOUT) throw;
            // Re-run at once, it would queue the claims behind it again.
            spdlog::warn(
                "claim partitions: a long transaction holds idemsink_claim ({}); maintenance gave way and runs "
                "again at the next round",
                e.what());
            done_now = false;
            report.months_ahead = claim::months_ahead(c, std::chrono::system_clock::now());
          }
          lock.release();
        } else {
          report.months_ahead = claim::months_ahead(c, std::chrono::system_clock::now());
        }
        for (const auto& p : report.added) spdlog::info("claim partitions: added {}", p);
        for (const auto& p : report.dropped) spdlog::info("claim partitions: dropped {} (past retention)", p);
        metrics_.claim_partitions_ahead.store(report.months_ahead);
        if (done) asio::post(io_, [done, ok = done_now && (locked || !wait_for_lock)] { done(ok); });
      },
      [this, done](const db::DbError& e) {
        spdlog::error("claim partitions: maintenance failed: {}", e.what());
        if (done) asio::post(io_, [done] { done(false); });
      });
}

void Housekeeping::purge_outbox() {
  pool_.submit("purge outbox", [this](db::Connection& c) {
    // Holds whose record finished are garbage (order_hold.h: liveness is
    // read from the claim); cleared in the same short rounds.
    if (!ordered_.empty()) claim::OrderHolds::purge_stale(c, hold_on_dead_, kPurgeBatch);
    const uint64_t n = outbox_.purge_published(c, cfg_.claim.outbox_retention, kPurgeBatch);
    if (n > 0)
      spdlog::info("DLQ outbox: purged {} row(s) published more than {}h ago", n,
                   cfg_.claim.outbox_retention.count() / 3'600'000);
    // A full batch: more are old enough; go on in another short job.
    if (n == kPurgeBatch)
      asio::post(io_, [this] {
        if (!stopped_) purge_outbox();
      });
  });
}

void Housekeeping::refresh_gauges() {
  if (gauges_running_) return;  // the last round is still waiting for the database
  gauges_running_ = true;
  pool_.submit(
      "gauges",
      [this, routes = routes_](db::Connection& c) {
        const auto backlog = outbox_.backlog_by_route(c);
        for (const auto& [name, m] : routes) {
          const auto it = backlog.find(name);
          m->dlq_pending.store(it == backlog.end() ? 0 : static_cast<int64_t>(it->second.first));
          m->dlq_unpublishable.store(it == backlog.end() ? 0 : static_cast<int64_t>(it->second.second));
        }
        metrics_.stuck_pending.store(static_cast<int64_t>(store_.count_stuck(c, cfg_.claim.stuck_after)));
        // `idemsink schema migrate` finished filling the key directory in
        // while this host ran: claim reads go through it from now on.
        if (store_.claim_read() == claim::ClaimRead::AllMonths && claim::key_directory_complete(c)) {
          store_.set_claim_read(claim::ClaimRead::KeyDirectory);
          spdlog::info("claims: the key directory is complete; claim reads now look keys up there alone");
        }
        if (!ordered_.empty()) {
          const auto holds = claim::OrderHolds::live_by_route(c, hold_on_dead_);
          for (const auto& name : ordered_) {
            const auto it = holds.find(name);
            routes.at(name)->order_holds.store(it == holds.end() ? 0 : static_cast<int64_t>(it->second));
          }
        }
        asio::post(io_, [this] { gauges_running_ = false; });
      },
      [this](const db::DbError&) { asio::post(io_, [this] { gauges_running_ = false; }); });
}

}  // namespace idemsink::upkeep
