// Counters and gauges of the pipeline, rendered as Prometheus text and as the
// JSON of /status. Written by the engine thread, read by the admin server.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/kafka/client_health.h"

namespace idemsink::pipeline {

/// Latency histogram with fixed buckets (seconds).
class Histogram {
 public:
  static constexpr std::array<double, 12> kBounds{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.35, 0.5, 1, 2.5, 5, 10};
  void observe(double seconds);
  void render(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> buckets_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_micros_{0};
};

struct RouteMetrics {
  std::atomic<uint64_t> consumed{0};
  std::atomic<uint64_t> claimed{0};  // claims won (fresh or taken over)
  std::atomic<uint64_t> takeovers{0};
  std::atomic<uint64_t> done{0};        // side effect applied, claim done
  std::atomic<uint64_t> duplicates{0};  // idempotent hits: already done (or already dead)
  std::atomic<uint64_t> dead{0};        // failed / refused, with a DLQ entry
  std::atomic<uint64_t> unknown{0};     // may or may not have happened; parked and dead-lettered
  std::atomic<uint64_t> retries{0};
  std::atomic<uint64_t> busy_waits{0};   // key held by another live host
  std::atomic<uint64_t> fenced{0};       // completion lost its claim to a takeover
  std::atomic<uint64_t> db_rejected{0};  // rows the database refused (the record ended another way)
  std::atomic<uint64_t> let_go{0};       // records that could not be recorded: left uncommitted
  std::atomic<int64_t> in_flight{0};
  std::atomic<int64_t> circuit_open{0};  // 1 while the route's circuit is open (or probing)
  std::atomic<uint64_t> circuit_opens{0};
  std::atomic<int64_t> paused{0};    // 1 while an operator paused the route (route_control.h)
  std::atomic<uint64_t> rate_limit_waits{0};  // times a ready call waited for the route's budget
  std::atomic<uint64_t> holds{0};             // Retry-After answers that held the route's calls
  std::atomic<int64_t> held{0};               // 1 while a Retry-After hold lasts
  std::atomic<double> rate_limit{0};          // calls per second this host may start (0: no limit)
  std::atomic<uint64_t> commits{0};  // offset commits sent carrying offsets of the route's topics
  std::atomic<uint64_t> commit_failures{0};
  std::atomic<uint64_t> dlq_published{0};
  std::atomic<uint64_t> dlq_publish_failures{0};
  std::atomic<int64_t> dlq_pending{0};        // unpublished outbox rows (all hosts), refreshed periodically
  std::atomic<int64_t> dlq_unpublishable{0};  // outbox rows Kafka refused for good (all hosts)
  Histogram handler_latency;
};

/// One partition of this host's assignment (kept after it is revoked, for
/// its counters; gauges are shown only while assigned).
struct PartitionMetrics {
  std::atomic<bool> assigned{false};
  std::atomic<int64_t> committed{-1};  // last offset the group acknowledged (-1: none)
  std::atomic<int64_t> high_watermark{-1};
  std::atomic<int64_t> lag{0};      // high watermark - commit point (the committed offset before any record)
  std::atomic<int64_t> stalled{0};  // 1 while the partition is stalled
  std::atomic<uint64_t> stalls{0};
  std::atomic<uint64_t> gaps{0};               // verified holes (transaction markers, compaction) the commit passed
  std::atomic<uint64_t> skips_recovered{0};    // jumps of the consumer that a re-read filled with records
  std::atomic<uint64_t> lost_to_retention{0};  // offsets deleted by retention before the group consumed them
  std::atomic<uint64_t> offsets_rewound{0};     // records read again: the database's offset was behind Kafka's
};

/// What one database's slice of the host measures: the engine, consumer,
/// pool, claim table and outbox serving the routes that use that database.
/// A host with one database (the usual case) has one slice and its series
/// carry no label; with more, each series carries database="...".
struct SliceMetrics {
  explicit SliceMetrics(std::string label) : database(std::move(label)) {}
  const std::string database;  // "<schema>@<host>:<port>" or "<schema>@<socket>"

  std::atomic<uint64_t> dlq_set_aside{0};           // rows this host set aside as unpublishable
  std::atomic<int64_t> claim_partitions_ahead{-1};  // monthly claim partitions beyond the current month
  std::atomic<int64_t> buffered{0};                 // consumed, not yet durable
  std::atomic<int64_t> paused{0};                   // 1 while fetching is paused
  std::atomic<int64_t> assigned_partitions{0};
  std::atomic<int64_t> lag{0};                  // sum over assigned partitions of high watermark - commit point
  std::atomic<int64_t> stuck_pending{0};        // pending, nobody's lease, untouched for stuck_after (all hosts)
  std::atomic<uint64_t> reconciled_done{0};     // unknown/stuck rows resolved done by the reconcile hook
  std::atomic<int64_t> reconcile_undecided{0};  // rows the last reconcile round could not settle
  std::atomic<uint64_t> db_statements{0};
  std::atomic<uint64_t> db_reconnects{0};
  std::atomic<int64_t> db_healthy{1};
  std::atomic<int64_t> db_jobs_failing{0};     // database jobs failing for another reason than the connection
  const kafka::ClientHealth* kafka = nullptr;  // the slice's consumer (set before the admin port opens)

  /// Why the slice has not started yet (its database unreachable at
  /// start-up), or "" once it runs.
  void set_start_problem(std::string problem);
  std::string start_problem() const;

  /// Snapshot of the pool's failures by job and class, and its last job error.
  void set_db_job_failures(std::map<std::pair<std::string, std::string>, uint64_t> failures, std::string last_error);
  std::string db_last_job_error() const;
  std::map<std::pair<std::string, std::string>, uint64_t> db_job_failures() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, uint64_t> db_job_failures_;
  std::string db_last_job_error_;
  std::string start_problem_;
};

class Metrics {
 public:
  RouteMetrics& route(const std::string& name);
  PartitionMetrics& partition(const std::string& topic, int32_t partition);
  /// The slice of one database (created on first use).
  SliceMetrics& slice(const std::string& database);

  /// Labels of the idemsink_build_info gauge (version, commit, library versions).
  void set_build_info(std::map<std::string, std::string> labels);
  /// The engine loop proves it runs (every second); /livez reads how long ago.
  void heartbeat();
  std::chrono::milliseconds since_heartbeat() const;

  std::string prometheus() const;
  std::string status_json(const std::string& host, bool paused_by_operator) const;
  /// Empty when every database is reachable and no database job is failing;
  /// otherwise why not, naming the database.
  std::string db_problem() const;
  /// Empty when the host is ready for work: every database reachable, every
  /// consumer talking to its cluster, and partitions assigned or the group
  /// still joining. Otherwise why not, one line per problem.
  std::string readiness_problem() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<RouteMetrics>> routes_;
  std::map<std::pair<std::string, int32_t>, std::unique_ptr<PartitionMetrics>> partitions_;
  std::vector<std::unique_ptr<SliceMetrics>> slices_;
  std::map<std::string, std::string> build_info_;
  // Since when each slice has been settled in its group with no partition (readiness).
  static constexpr std::chrono::seconds kUnassignedGrace{12};
  mutable std::map<const SliceMetrics*, std::chrono::steady_clock::time_point> unassigned_since_;
  std::atomic<int64_t> heartbeat_ms_{now_ms()};

  static int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace idemsink::pipeline
