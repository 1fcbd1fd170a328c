// What a host that runs for months must do on its own, on timers:
//   - the claim table's monthly partitions: created three months ahead and
//     dropped past retention, every
//     claim.maintenance_interval, by one host at a time (a MariaDB named
//     lock); a record whose month has no partition asks for it at once;
//   - published DLQ outbox rows (payloads included): deleted after
//     claim.outbox_retention, in small batches that hold no long locks;
//   - the gauges only the database knows (DLQ backlog, letters set aside,
//     stuck claims), every 5 s; in the same round, until it is, whether the
//     key directory is complete (claim reads through it alone).
// Jobs run on the database pool; results come back on the engine thread.
#pragma once

#include "core/common/asio.h"
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/claim/claim_store.h"
#include "core/config/config.h"
#include "core/db/pool.h"
#include "core/dlq/outbox.h"
#include "core/metrics/metrics.h"
#include "core/common/periodic.h"

namespace idemsink::upkeep {

class Housekeeping {
 public:
  Housekeeping(boost::asio::io_context& io, db::Pool& pool, const config::Config& cfg, claim::ClaimStore& store,
               const dlq::Outbox& outbox, metrics::Metrics& all, metrics::SliceMetrics& metrics);

  /// A route a reload added (engine thread; config/reload.h: never one with
  /// [route.order_by], whose holds are kept by the lists made at start).
  void add_route(const config::RouteConfig& route, metrics::RouteMetrics& metrics);
  void start();
  void stop();

  /// Creates the claim partitions the calendar needs now (waiting for
  /// another host's maintenance if one runs), then calls `done` with whether
  /// it could (engine thread).
  void ensure_partitions(std::function<void(bool ok)> done);

 private:
  void maintain(bool wait_for_lock, std::function<void(bool ok)> done);
  void purge_outbox();
  void refresh_gauges();

  boost::asio::io_context& io_;
  db::Pool& pool_;
  const config::Config& cfg_;
  claim::ClaimStore& store_;
  const dlq::Outbox& outbox_;
  metrics::SliceMetrics& metrics_;
  std::vector<std::string> ordered_;                      // routes with [route.order_by]
  std::vector<std::string> hold_on_dead_;                 // of them, those that hold an entity on a dead record
  std::map<std::string, metrics::RouteMetrics*> routes_;  // this database's routes (DLQ backlog gauges)
  bool stopped_ = false;
  bool ensuring_ = false;
  bool gauges_running_ = false;
  std::vector<std::function<void(bool)>> waiting_;  // ensure_partitions callers
  Periodic partitions_timer_;
  Periodic purge_timer_;
  Periodic gauges_timer_;
};

}  // namespace idemsink::upkeep
