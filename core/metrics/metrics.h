// Counters and gauges of the pipeline, rendered as Prometheus text and as the
// JSON of /status. Written by the engine thread, read by the admin server.
#pragma once

#include <array>
#include <atomic>
#include <limits>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "core/kafka/client_health.h"

namespace idemsink::metrics {

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

// Every series /metrics renders from these structs is declared once, in the
// lists below (as ClickHouse lists its ProfileEvents): a line gives the
// struct's field, its value type and first value, the Prometheus type, name
// and help. The fields, the renderer's loops and the metric-name check of
// the alert rules and dashboard (conf/prometheus/check_names.py reads the
// names here) all follow from the one line.
//   M(field, value type, initial value, counter|gauge, "name", "help")

/// Per route; every series carries route="...".
/// A gauge's value while it cannot be known (rendered NaN, null in /status).
inline constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();

#define IDEMSINK_ROUTE_METRICS(M)                                                                                   \
  M(consumed, uint64_t, 0, counter, "idemsink_records_consumed_total", "Records taken from Kafka.")                 \
  M(claimed, uint64_t, 0, counter, "idemsink_claims_total", "Claims won (new or taken over).")                      \
  M(takeovers, uint64_t, 0, counter, "idemsink_claim_takeovers_total",                                              \
    "Claims taken over from a vanished or expired owner.")                                                          \
  M(done, uint64_t, 0, counter, "idemsink_records_done_total", "Side effects applied and recorded done.")           \
  M(duplicates, uint64_t, 0, counter, "idemsink_idempotent_hits_total",                                             \
    "Records skipped because their key was already done or dead.")                                                  \
  M(dead, uint64_t, 0, counter, "idemsink_records_dead_total", "Records dead-lettered (failed or refused).")        \
  M(unknown, uint64_t, 0, counter, "idemsink_records_unknown_total",                                                \
    "Records whose at-most-once effect may or may not have happened.")                                              \
  M(retries, uint64_t, 0, counter, "idemsink_retries_total", "Handler calls retried.")                              \
  M(skipped, uint64_t, 0, counter, "idemsink_records_skipped_total",                                                \
    "Records the route does not take ([route.when]): committed without a claim.")                                   \
  M(busy_waits, uint64_t, 0, counter, "idemsink_busy_waits_total",                                                  \
    "Claim checks that found the key held by another live host.")                                                   \
  M(order_waits, uint64_t, 0, counter, "idemsink_order_waits_total",                                                \
    "Claim checks that found an earlier record of the record's entity unfinished ([route.order_by]).")              \
  M(order_holds, int64_t, 0, gauge, "idemsink_order_holds",                                                         \
    "Live order holds: records of an ordered route left unfinished, holding back their entity's later "             \
    "records ([route.order_by]; all hosts).")                                                                       \
  M(events_written, uint64_t, 0, counter, "idemsink_output_events_total",                                           \
    "Outcome events written to the outbox ([route.output]), published by the relay.")                               \
  M(fenced, uint64_t, 0, counter, "idemsink_fenced_total",                                                          \
    "Completions refused because the claim was taken over meanwhile.")                                              \
  M(db_rejected, uint64_t, 0, counter, "idemsink_db_rejected_total",                                                \
    "Rows the database refused for their data (isolated; the record ended another way).")                           \
  M(let_go, uint64_t, 0, counter, "idemsink_records_let_go_total",                                                  \
    "Records that could not be recorded (a database job kept failing): left uncommitted, read again later.")        \
  M(commits, uint64_t, 0, counter, "idemsink_offset_commits_total",                                                 \
    "Offset commits sent carrying offsets of the route's topics.")                                                  \
  M(commit_failures, uint64_t, 0, counter, "idemsink_offset_commit_failures_total",                                 \
    "Offset commits that failed (sent again).")                                                                     \
  M(dlq_published, uint64_t, 0, counter, "idemsink_dlq_published_total",                                            \
    "DLQ records (and retry-topic forwards) published.")                                                            \
  M(dlq_publish_failures, uint64_t, 0, counter, "idemsink_dlq_publish_failures_total",                              \
    "DLQ publish attempts that failed (the record stays in the outbox).")                                           \
  M(rate_limit_waits, uint64_t, 0, counter, "idemsink_route_rate_limit_waits_total",                                \
    "Times the route's next call waited for its budget (route.rate_limit, or a Retry-After hold).")                 \
  M(holds, uint64_t, 0, counter, "idemsink_route_holds_total", "Retry-After answers that held the route's calls.")  \
  M(circuit_open, int64_t, 0, gauge, "idemsink_route_circuit_open",                                                 \
    "1 while the route's circuit is open: its remote is failing, no calls but probes, its partitions paused.")      \
  M(circuit_opens, uint64_t, 0, counter, "idemsink_route_circuit_opens_total", "Times the route's circuit opened.") \
  M(in_flight, int64_t, 0, gauge, "idemsink_in_flight", "Handler calls in flight.")                                 \
  M(paused, int64_t, 0, gauge, "idemsink_route_paused",                                                             \
    "1 while an operator paused the route (every host of the group obeys).")                                        \
  M(dlq_pending, int64_t, 0, gauge, "idemsink_dlq_pending", "DLQ outbox rows not yet published (all hosts).")       \
  M(dlq_unpublishable, int64_t, 0, gauge, "idemsink_dlq_unpublishable",                                             \
    "DLQ outbox rows Kafka refused for good (too large, unknown topic, not authorised), set aside for an "          \
    "operator (`idemsink outbox --list`), all hosts.")                                                              \
  M(held, int64_t, 0, gauge, "idemsink_route_held",                                                                 \
    "1 while the route's calls wait out a Retry-After its remote answered.")                                        \
  M(rate_limit, double, 0, gauge, "idemsink_route_rate_limit",                                                      \
    "Calls per second this host may start for the route: its share of route.rate_limit (0: no limit).")

/// Per partition of this host's assignment; every series carries route,
/// topic and partition. A gauge is shown only while the partition is assigned, a
/// counter always (it stays after a revoke).
#define IDEMSINK_PARTITION_METRICS(M)                                                                            \
  M(committed, int64_t, -1, gauge, "idemsink_partition_committed_offset",                                        \
    "Offset the group last committed for the partition.")                                                        \
  M(lag, double, kUnknown, gauge, "idemsink_partition_lag",                                                      \
    "Records between the partition's commit point (its committed offset before any record) and its high "        \
    "watermark; NaN until the partition's ends are known (never 0 by default).")                                 \
  M(fetching, int64_t, 0, gauge, "idemsink_partition_fetching",                                                  \
    "1 while the partition fetches; 0 while a pause holds it (operator, backpressure, circuit, a retry "         \
    "tier not due, its start being read).")                                                                      \
  M(in_pipeline, int64_t, 0, gauge, "idemsink_partition_in_pipeline",                                            \
    "Records of the partition consumed and not yet ended (durable, or handed back).")                            \
  M(stalled, int64_t, 0, gauge, "idemsink_partition_stalled",                                                    \
    "1 while the partition has records below its high watermark but nothing arrives (alert on it).")             \
  M(stalls, uint64_t, 0, counter, "idemsink_partition_stalls_total", "Stalls detected and recovered by a seek.") \
  M(gaps, uint64_t, 0, counter, "idemsink_offset_gaps_total",                                                    \
    "Holes in the offsets (transaction markers, compaction) that a re-read confirmed and the commit passed.")    \
  M(skips_recovered, uint64_t, 0, counter, "idemsink_offset_skips_recovered_total",                              \
    "Jumps of the consumer over existing records, caught and re-read.")                                          \
  M(offsets_rewound, uint64_t, 0, counter, "idemsink_offsets_rewound_total",                                     \
    "Records Kafka had committed whose outcomes the database lost (its stored offset behind Kafka's, at "        \
    "assignment or after a failover to a replica that lacked the last commits): read again.")                    \
  M(lost_to_retention, uint64_t, 0, counter, "idemsink_records_lost_to_retention_total",                         \
    "Offsets Kafka deleted by retention before this group consumed them: records no outcome exists for (alert "  \
    "on it; idemsink audit lists them).")

/// Per database slice (see SliceMetrics): unlabelled with one database,
/// database="..." with more.
#define IDEMSINK_SLICE_METRICS(M)                                                                                \
  M(claim_partitions_ahead, int64_t, -1, gauge, "idemsink_claim_partitions_ahead",                               \
    "Monthly claim partitions beyond the current month (maintained at 3; alert below 1: records of a month "     \
    "without a partition are refused or need a partition created on the spot).")                                 \
  M(dlq_set_aside, uint64_t, 0, counter, "idemsink_dlq_set_aside_total",                                         \
    "DLQ outbox rows this host set aside as unpublishable.")                                                     \
  M(buffered, int64_t, 0, gauge, "idemsink_buffered_records", "Consumed records not yet durable.")               \
  M(paused, int64_t, 0, gauge, "idemsink_fetch_paused", "1 while fetching is paused.")                           \
  M(assigned_partitions, int64_t, 0, gauge, "idemsink_assigned_partitions", "Partitions assigned to this host.") \
  M(lag, double, kUnknown, gauge, "idemsink_consumer_lag",                                                       \
    "Records between the commit point and the high watermark, summed; NaN while a partition's is unknown.")      \
  M(stuck_pending, int64_t, 0, gauge, "idemsink_stuck_pending",                                                  \
    "Pending claims nobody holds, untouched for claim.stuck_after (all hosts).")                                 \
  M(reconciled_done, uint64_t, 0, counter, "idemsink_reconciled_done_total",                                     \
    "Unknown or stuck claims resolved done by reconciliation.")                                                  \
  M(reconcile_undecided, int64_t, 0, gauge, "idemsink_reconcile_undecided",                                      \
    "Claims the last reconcile round could not settle (alert on it).")                                           \
  M(db_statements, uint64_t, 0, counter, "idemsink_db_statements_total", "Statements sent to MariaDB.")          \
  M(db_reconnects, uint64_t, 0, counter, "idemsink_db_reconnects_total", "Reconnects to MariaDB.")               \
  M(db_healthy, int64_t, 1, gauge, "idemsink_db_healthy", "0 while a database worker cannot reach MariaDB.")     \
  M(db_jobs_failing, int64_t, 0, gauge, "idemsink_db_jobs_failing",                                              \
    "Database jobs failing right now for another reason than the connection (the server is reachable).")

#define IDEMSINK_METRIC_FIELD(field, T, initial, type, name, help) std::atomic<T> field{initial};

struct RouteMetrics {
  IDEMSINK_ROUTE_METRICS(IDEMSINK_METRIC_FIELD)
  Histogram handler_latency;  // idemsink_handler_latency_seconds
};

/// One partition of this host's assignment (kept after it is revoked, for
/// its counters; gauges are shown only while assigned).
struct PartitionMetrics {
  IDEMSINK_PARTITION_METRICS(IDEMSINK_METRIC_FIELD)
  std::atomic<bool> assigned{false};
  std::atomic<int64_t> high_watermark{-1};  // for /status
};

/// What one database's slice of the host measures: the engine, consumer,
/// pool, claim table and outbox serving the routes that use that database.
/// A host with one database (the usual case) has one slice and its series
/// carry no label; with more, each series carries database="...".
struct SliceMetrics {
  explicit SliceMetrics(std::string label) : database(std::move(label)) {}
  const std::string database;  // "<schema>@<host>:<port>" or "<schema>@<socket>"

  IDEMSINK_SLICE_METRICS(IDEMSINK_METRIC_FIELD)
  /// The slice's consumers, one per consumer group its routes use; a
  /// reload adds and removes them. A removed one's health outlives it.
  struct Consumer {
    std::string group;
    const kafka::ClientHealth* health;
  };
  void add_consumer(std::string group, const kafka::ClientHealth* health);
  void remove_consumer(const kafka::ClientHealth* health);
  std::vector<Consumer> consumers() const;

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
  std::vector<Consumer> consumers_;
  std::map<std::pair<std::string, std::string>, uint64_t> db_job_failures_;
  std::string db_last_job_error_;
  std::string start_problem_;
};

class Metrics {
 public:
  RouteMetrics& route(const std::string& name);
  /// A partition as a route reads it (routes of one topic read it apart,
  /// each in its group): every series carries route, topic and partition.
  PartitionMetrics& partition(const std::string& route, const std::string& topic, int32_t partition);
  /// The slice of one database (created on first use).
  SliceMetrics& slice(const std::string& database);

  /// A schema registry the host reads writer schemas from: `problem` says
  /// why it cannot answer (empty: it does), `waiting` how many schemas
  /// records wait for (core/format/registry.h).
  void watch_registry(std::string url, std::function<std::string()> problem, std::function<size_t()> waiting);

  /// Labels of the idemsink_build_info gauge (version, commit, library versions).
  void set_build_info(std::map<std::string, std::string> labels);
  /// The config file the host runs and its hash (the first 16 hex digits of
  /// its text's XXH3-128): hosts running different files show different hashes.
  void set_config(std::string file, std::string hash);
  /// What came of a reload (applied, refused or unchanged) and why, for
  /// idemsink_config_reloads_total and /status.
  void count_reload(const std::string& result, std::string message);
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
  // Parts of prometheus(), under mu_.
  void render_routes(std::string& out) const;
  void render_partitions(std::string& out) const;
  void render_slices(std::string& out) const;
  void render_clients(std::string& out) const;
  // Parts of status_json(), under mu_: the host as a whole and each of its
  // databases, then the assigned partitions, then the routes.
  void status_host(nlohmann::json& j) const;
  void status_partitions(nlohmann::json& j) const;
  void status_routes(nlohmann::json& j) const;

  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<RouteMetrics>> routes_;
  std::map<std::tuple<std::string, std::string, int32_t>, std::unique_ptr<PartitionMetrics>> partitions_;
  std::vector<std::unique_ptr<SliceMetrics>> slices_;
  std::map<std::string, std::string> build_info_;
  std::string config_file_, config_hash_;
  std::map<std::string, uint64_t> reloads_;  // by result
  struct LastReload {
    std::string result;  // empty: none yet
    std::string message;
    int64_t at_epoch_s = 0;
  } last_reload_;
  struct WatchedRegistry {
    std::string url;
    std::function<std::string()> problem;
    std::function<size_t()> waiting;
  };
  std::vector<WatchedRegistry> registries_;
  // Since when each slice has been settled in its group with no partition (readiness).
  static constexpr std::chrono::seconds kUnassignedGrace{12};
  mutable std::map<const SliceMetrics*, std::chrono::steady_clock::time_point> unassigned_since_;
  std::atomic<int64_t> heartbeat_ms_{now_ms()};

  static int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace idemsink::metrics
