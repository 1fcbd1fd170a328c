#include "core/pipeline/metrics.h"

#include <fmt/format.h>
#include <functional>
#include <nlohmann/json.hpp>

namespace idemsink::pipeline {

void Histogram::observe(double seconds) {
  size_t i = 0;
  while (i < kBounds.size() && seconds > kBounds[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_micros_.fetch_add(static_cast<uint64_t>(seconds * 1e6), std::memory_order_relaxed);
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= kBounds.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    const std::string le = i < kBounds.size() ? std::to_string(kBounds[i]) : "+Inf";
    out += name + "_bucket{" + labels + ",le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_sum{" + labels + "} " + std::to_string(sum_micros_.load() / 1e6) + "\n";
  out += name + "_count{" + labels + "} " + std::to_string(count_.load()) + "\n";
}

RouteMetrics& Metrics::route(const std::string& name) {
  std::lock_guard lk(mu_);
  auto& slot = routes_[name];
  if (!slot) slot = std::make_unique<RouteMetrics>();
  return *slot;
}

PartitionMetrics& Metrics::partition(const std::string& topic, int32_t partition) {
  std::lock_guard lk(mu_);
  auto& slot = partitions_[{topic, partition}];
  if (!slot) slot = std::make_unique<PartitionMetrics>();
  return *slot;
}

SliceMetrics& Metrics::slice(const std::string& database) {
  std::lock_guard lk(mu_);
  for (auto& s : slices_)
    if (s->database == database) return *s;
  slices_.push_back(std::make_unique<SliceMetrics>(database));
  return *slices_.back();
}

void SliceMetrics::set_db_job_failures(std::map<std::pair<std::string, std::string>, uint64_t> failures,
                                       std::string last_error) {
  std::lock_guard lk(mu_);
  db_job_failures_ = std::move(failures);
  db_last_job_error_ = std::move(last_error);
}

std::string SliceMetrics::db_last_job_error() const {
  std::lock_guard lk(mu_);
  return db_last_job_error_;
}

void SliceMetrics::set_start_problem(std::string problem) {
  std::lock_guard lk(mu_);
  start_problem_ = std::move(problem);
}

std::string SliceMetrics::start_problem() const {
  std::lock_guard lk(mu_);
  return start_problem_;
}

std::map<std::pair<std::string, std::string>, uint64_t> SliceMetrics::db_job_failures() const {
  std::lock_guard lk(mu_);
  return db_job_failures_;
}

void Metrics::set_build_info(std::map<std::string, std::string> labels) {
  std::lock_guard lk(mu_);
  build_info_ = std::move(labels);
}

void Metrics::heartbeat() { heartbeat_ms_.store(now_ms(), std::memory_order_relaxed); }

std::chrono::milliseconds Metrics::since_heartbeat() const {
  return std::chrono::milliseconds(now_ms() - heartbeat_ms_.load(std::memory_order_relaxed));
}

std::string Metrics::db_problem() const {
  std::lock_guard lk(mu_);
  std::string out;
  for (const auto& s : slices_) {
    const std::string which = slices_.size() > 1 ? " (database " + s->database + ")" : "";
    if (const std::string why = s->start_problem(); !why.empty()) {
      out += "database " + s->database + " unreachable since start-up: " + why + "; its routes wait for it\n";
    } else if (s->db_healthy.load() == 0) {
      out += "database unreachable" + which + "\n";
    } else if (s->db_jobs_failing.load() != 0) {
      out += "a database job is failing" + which + ": " + s->db_last_job_error() + "\n";
    }
  }
  return out;
}

std::string Metrics::readiness_problem() const {
  std::string out = db_problem();
  std::lock_guard lk(mu_);
  for (const auto& s : slices_) {
    if (s->kafka == nullptr) continue;
    const std::string which = slices_.size() > 1 ? " (database " + s->database + ")" : "";
    if (const std::string p = s->kafka->problem(); !p.empty()) {
      out += p + which + "\n";
      continue;
    }
    const auto k = s->kafka->snapshot();
    // Joined and settled with nothing to do is not ready: a member beyond
    // the partition count, or subscribed to topics that do not exist.
    const bool joining = !k.stats_seen || k.group_state != "up" || k.join_state != "steady";
    // Statistics lag behind a rebalance by up to their interval: a member
    // between its revoke and its new assignment looks settled and empty.
    // Only a lasting state counts.
    const auto now = std::chrono::steady_clock::now();
    if (joining || s->assigned_partitions.load() != 0) {
      unassigned_since_.erase(s.get());
    } else if (now - unassigned_since_.try_emplace(s.get(), now).first->second >= kUnassignedGrace) {
      out += "kafka: the group assigned no partitions to this host" + which + "\n";
    }
  }
  return out;
}

std::string Metrics::prometheus() const {
  const bool ready = readiness_problem().empty();
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  std::lock_guard lk(mu_);
  struct Counter {
    const char* name;
    const char* help;
    std::atomic<uint64_t> RouteMetrics::*field;
  };
  static const Counter kCounters[] = {
      {"idemsink_records_consumed_total", "Records taken from Kafka.", &RouteMetrics::consumed},
      {"idemsink_claims_total", "Claims won (new or taken over).", &RouteMetrics::claimed},
      {"idemsink_claim_takeovers_total", "Claims taken over from a vanished or expired owner.",
       &RouteMetrics::takeovers},
      {"idemsink_records_done_total", "Side effects applied and recorded done.", &RouteMetrics::done},
      {"idemsink_idempotent_hits_total", "Records skipped because their key was already done or dead.",
       &RouteMetrics::duplicates},
      {"idemsink_records_dead_total", "Records dead-lettered (failed or refused).", &RouteMetrics::dead},
      {"idemsink_records_unknown_total", "Records whose at-most-once effect may or may not have happened.",
       &RouteMetrics::unknown},
      {"idemsink_retries_total", "Handler calls retried.", &RouteMetrics::retries},
      {"idemsink_busy_waits_total", "Claim checks that found the key held by another live host.",
       &RouteMetrics::busy_waits},
      {"idemsink_fenced_total", "Completions refused because the claim was taken over meanwhile.",
       &RouteMetrics::fenced},
      {"idemsink_db_rejected_total",
       "Rows the database refused for their data (isolated; the record ended another way).",
       &RouteMetrics::db_rejected},
      {"idemsink_records_let_go_total",
       "Records that could not be recorded (a database job kept failing): left uncommitted, read again later.",
       &RouteMetrics::let_go},
      {"idemsink_offset_commits_total", "Offset commits sent carrying offsets of the route's topics.",
       &RouteMetrics::commits},
      {"idemsink_offset_commit_failures_total", "Offset commits that failed (sent again).",
       &RouteMetrics::commit_failures},
      {"idemsink_dlq_published_total", "DLQ records (and retry-topic forwards) published.",
       &RouteMetrics::dlq_published},
      {"idemsink_dlq_publish_failures_total", "DLQ publish attempts that failed (the record stays in the outbox).",
       &RouteMetrics::dlq_publish_failures},
      {"idemsink_route_rate_limit_waits_total",
       "Times the route's next call waited for its budget (route.rate_limit, or a Retry-After hold).",
       &RouteMetrics::rate_limit_waits},
      {"idemsink_route_holds_total", "Retry-After answers that held the route's calls.", &RouteMetrics::holds},
  };
  for (const auto& c : kCounters) {
    family(c.name, "counter", c.help);
    for (const auto& [name, m] : routes_)
      out += std::string(c.name) + "{route=\"" + name + "\"} " + std::to_string(((*m).*(c.field)).load()) + "\n";
  }
  family("idemsink_route_circuit_open", "gauge",
         "1 while the route's circuit is open: its remote is failing, no calls but probes, its partitions paused.");
  for (const auto& [name, m] : routes_)
    out += "idemsink_route_circuit_open{route=\"" + name + "\"} " + std::to_string(m->circuit_open.load()) + "\n";
  family("idemsink_route_circuit_opens_total", "counter", "Times the route's circuit opened.");
  for (const auto& [name, m] : routes_)
    out +=
        "idemsink_route_circuit_opens_total{route=\"" + name + "\"} " + std::to_string(m->circuit_opens.load()) + "\n";
  struct RouteGauge {
    const char* name;
    const char* help;
    std::atomic<int64_t> RouteMetrics::*field;
  };
  static const RouteGauge kRouteGauges[] = {
      {"idemsink_in_flight", "Handler calls in flight.", &RouteMetrics::in_flight},
      {"idemsink_route_paused", "1 while an operator paused the route (every host of the group obeys).",
       &RouteMetrics::paused},
      {"idemsink_dlq_pending", "DLQ outbox rows not yet published (all hosts).", &RouteMetrics::dlq_pending},
      {"idemsink_dlq_unpublishable",
       "DLQ outbox rows Kafka refused for good (too large, unknown topic, not authorised), set aside for an "
       "operator (`idemsink dlq --list`), all hosts.",
       &RouteMetrics::dlq_unpublishable},
      {"idemsink_route_held", "1 while the route's calls wait out a Retry-After its remote answered.",
       &RouteMetrics::held},
  };
  for (const auto& g : kRouteGauges) {
    family(g.name, "gauge", g.help);
    for (const auto& [name, m] : routes_)
      out += std::string(g.name) + "{route=\"" + name + "\"} " + std::to_string(((*m).*(g.field)).load()) + "\n";
  }
  family("idemsink_route_rate_limit", "gauge",
         "Calls per second this host may start for the route: its share of route.rate_limit (0: no limit).");
  for (const auto& [name, m] : routes_)
    out += "idemsink_route_rate_limit{route=\"" + name + "\"} " + fmt::format("{:g}", m->rate_limit.load()) + "\n";
  family("idemsink_handler_latency_seconds", "histogram", "Handler call latency.");

  for (const auto& [name, m] : routes_)
    m->handler_latency.render(out, "idemsink_handler_latency_seconds", "route=\"" + name + "\"");

  struct PartitionSeries {
    const char* name;
    const char* type;
    const char* help;
    bool assigned_only;
    std::function<int64_t(const PartitionMetrics&)> value;
  };
  static const PartitionSeries kPartitionSeries[] = {
      {"idemsink_partition_committed_offset", "gauge", "Offset the group last committed for the partition.", true,
       [](const PartitionMetrics& p) { return p.committed.load(); }},
      {"idemsink_partition_lag", "gauge",
       "Records between the partition's commit point (its committed offset before any record) and its high watermark.",
       true, [](const PartitionMetrics& p) { return p.lag.load(); }},
      {"idemsink_partition_stalled", "gauge",
       "1 while the partition has records below its high watermark but nothing arrives (alert on it).", true,
       [](const PartitionMetrics& p) { return p.stalled.load(); }},
      {"idemsink_partition_stalls_total", "counter", "Stalls detected and recovered by a seek.", false,
       [](const PartitionMetrics& p) { return static_cast<int64_t>(p.stalls.load()); }},
      {"idemsink_offset_gaps_total", "counter",
       "Holes in the offsets (transaction markers, compaction) that a re-read confirmed and the commit passed.", false,
       [](const PartitionMetrics& p) { return static_cast<int64_t>(p.gaps.load()); }},
      {"idemsink_offset_skips_recovered_total", "counter",
       "Jumps of the consumer over existing records, caught and re-read.", false,
       [](const PartitionMetrics& p) { return static_cast<int64_t>(p.skips_recovered.load()); }},
      {"idemsink_offsets_rewound_total", "counter",
       "Records Kafka had committed whose outcomes the database lost (its stored offset behind Kafka's, at "
       "assignment or after a failover to a replica that lacked the last commits): read again.",
       false, [](const PartitionMetrics& p) { return static_cast<int64_t>(p.offsets_rewound.load()); }},
      {"idemsink_records_lost_to_retention_total", "counter",
       "Offsets Kafka deleted by retention before this group consumed them: records no outcome exists for (alert "
       "on it; idemsink audit lists them).",
       false, [](const PartitionMetrics& p) { return static_cast<int64_t>(p.lost_to_retention.load()); }},
  };
  for (const auto& series : kPartitionSeries) {
    family(series.name, series.type, series.help);
    for (const auto& [tp, p] : partitions_) {
      if (series.assigned_only && !p->assigned.load()) continue;
      out += std::string(series.name) + "{topic=\"" + tp.first + "\",partition=\"" + std::to_string(tp.second) +
             "\"} " + std::to_string(series.value(*p)) + "\n";
    }
  }

  // One series per slice: unlabelled with one database, database="..." with more.
  const bool labelled = slices_.size() > 1;
  auto slice_label = [&](const SliceMetrics& s) { return labelled ? "database=\"" + s.database + "\"" : ""; };
  auto scalar = [&](const char* name, const char* type, const char* help, auto value_of) {
    family(name, type, help);
    for (const auto& s : slices_) {
      const std::string label = slice_label(*s);
      out += std::string(name) + (label.empty() ? "" : "{" + label + "}") + " " + std::to_string(value_of(*s)) + "\n";
    }
  };
#define IDEMSINK_SLICE(field) [](const SliceMetrics& s) { return s.field.load(); }

  scalar("idemsink_claim_partitions_ahead", "gauge",
         "Monthly claim partitions beyond the current month (maintained at 3; alert below 1: records of a month "
         "without a partition are refused or need a partition created on the spot).",
         IDEMSINK_SLICE(claim_partitions_ahead));

  scalar("idemsink_dlq_set_aside_total", "counter", "DLQ outbox rows this host set aside as unpublishable.",
         IDEMSINK_SLICE(dlq_set_aside));
  scalar("idemsink_buffered_records", "gauge", "Consumed records not yet durable.", IDEMSINK_SLICE(buffered));
  scalar("idemsink_fetch_paused", "gauge", "1 while fetching is paused.", IDEMSINK_SLICE(paused));
  scalar("idemsink_assigned_partitions", "gauge", "Partitions assigned to this host.",
         IDEMSINK_SLICE(assigned_partitions));
  scalar("idemsink_consumer_lag", "gauge", "Records between the commit point and the high watermark, summed.",
         IDEMSINK_SLICE(lag));
  scalar("idemsink_stuck_pending", "gauge", "Pending claims nobody holds, untouched for claim.stuck_after (all hosts).",
         IDEMSINK_SLICE(stuck_pending));
  scalar("idemsink_reconciled_done_total", "counter", "Unknown or stuck claims resolved done by reconciliation.",
         IDEMSINK_SLICE(reconciled_done));
  scalar("idemsink_reconcile_undecided", "gauge", "Claims the last reconcile round could not settle (alert on it).",
         IDEMSINK_SLICE(reconcile_undecided));
  scalar("idemsink_db_statements_total", "counter", "Statements sent to MariaDB.", IDEMSINK_SLICE(db_statements));
  scalar("idemsink_db_reconnects_total", "counter", "Reconnects to MariaDB.", IDEMSINK_SLICE(db_reconnects));
  scalar("idemsink_db_healthy", "gauge", "0 while a database worker cannot reach MariaDB.", IDEMSINK_SLICE(db_healthy));
  scalar("idemsink_db_jobs_failing", "gauge",
         "Database jobs failing right now for another reason than the connection (the server is reachable).",
         IDEMSINK_SLICE(db_jobs_failing));
  if (!build_info_.empty()) {
    family("idemsink_build_info", "gauge", "Always 1; the labels say which build runs.");
    std::string labels;
    for (const auto& [k, v] : build_info_) labels += (labels.empty() ? "" : ",") + k + "=\"" + v + "\"";
    out += "idemsink_build_info{" + labels + "} 1\n";
  }
  family("idemsink_ready", "gauge",
         "1 while /readyz answers 200: databases reachable, Kafka reachable and authenticated, partitions assigned "
         "or the group joining.");
  out += "idemsink_ready " + std::to_string(ready ? 1 : 0) + "\n";
  // librdkafka's statistics, per consumer (statistics.interval.ms).
  std::vector<std::pair<std::string, kafka::ClientHealth::Snapshot>> clients;
  for (const auto& s : slices_)
    if (s->kafka != nullptr) clients.emplace_back(slice_label(*s), s->kafka->snapshot());
  auto with = [](const std::string& label, const std::string& more) {
    if (label.empty()) return more.empty() ? std::string() : "{" + more + "}";
    return "{" + label + (more.empty() ? "" : "," + more) + "}";
  };
  family("idemsink_kafka_broker_up", "gauge", "1 while the consumer's connection to the broker is up.");
  for (const auto& [label, k] : clients)
    for (const auto& [name, b] : k.brokers)
      out += "idemsink_kafka_broker_up" + with(label, "broker=\"" + name + "\"") + " " + (b.up ? "1" : "0") + "\n";
  family("idemsink_kafka_broker_rtt_seconds", "gauge",
         "Average request round trip to the broker over the last statistics interval.");
  for (const auto& [label, k] : clients)
    for (const auto& [name, b] : k.brokers)
      out += "idemsink_kafka_broker_rtt_seconds" + with(label, "broker=\"" + name + "\"") + " " +
             std::to_string(b.rtt_seconds) + "\n";
  family("idemsink_kafka_rebalances_total", "counter", "Group rebalances this host's consumer went through.");
  for (const auto& [label, k] : clients)
    out += "idemsink_kafka_rebalances_total" + with(label, "") + " " + std::to_string(k.rebalances) + "\n";
  family("idemsink_kafka_fetch_queue_messages", "gauge",
         "Records fetched by librdkafka and waiting in its queues (not yet handed to the pipeline).");
  for (const auto& [label, k] : clients)
    out +=
        "idemsink_kafka_fetch_queue_messages" + with(label, "") + " " + std::to_string(k.fetch_queue_messages) + "\n";
  family("idemsink_db_job_failures_total", "counter",
         "Failed runs of database jobs, by job and class (connection_lost, transient, data, unexpected).");
  for (const auto& s : slices_) {
    const std::string label = slice_label(*s);
    for (const auto& [key, n] : s->db_job_failures())
      out += "idemsink_db_job_failures_total{" + (label.empty() ? "" : label + ",") + "job=\"" + key.first +
             "\",class=\"" + key.second + "\"} " + std::to_string(n) + "\n";
  }
#undef IDEMSINK_SLICE
  return out;
}

std::string Metrics::status_json(const std::string& host, bool paused_by_operator) const {
  nlohmann::json j;
  j["host"] = host;
  j["paused_by_operator"] = paused_by_operator;
  std::lock_guard lk(mu_);
  // The host as a whole (summed over its databases), then each database.
  bool paused = false, healthy = true;
  int64_t buffered = 0, assigned = 0, lag = 0, dlq_pending = 0, dlq_unpublishable = 0, stuck = 0;
  j["databases"] = nlohmann::json::array();
  for (const auto& s : slices_) {
    paused = paused || s->paused.load() != 0;
    healthy = healthy && s->db_healthy.load() != 0;
    buffered += s->buffered.load();
    assigned += s->assigned_partitions.load();
    lag += s->lag.load();

    stuck += s->stuck_pending.load();
    j["databases"].push_back({{"database", s->database},
                              {"db_healthy", s->db_healthy.load() != 0},
                              {"fetch_paused", s->paused.load() != 0},
                              {"buffered", s->buffered.load()},
                              {"assigned_partitions", s->assigned_partitions.load()},
                              {"lag", s->lag.load()}});
  }
  for (const auto& [name, m] : routes_) {
    dlq_pending += m->dlq_pending.load();
    dlq_unpublishable += m->dlq_unpublishable.load();
  }
  j["fetch_paused"] = paused;
  j["buffered"] = buffered;
  j["assigned_partitions"] = assigned;
  j["lag"] = lag;
  j["dlq_pending"] = dlq_pending;
  j["dlq_unpublishable"] = dlq_unpublishable;
  j["stuck_pending"] = stuck;
  j["db_healthy"] = healthy;
  j["partitions"] = nlohmann::json::array();
  for (const auto& [tp, p] : partitions_) {
    if (!p->assigned.load()) continue;
    j["partitions"].push_back({{"topic", tp.first},
                               {"partition", tp.second},
                               {"committed", p->committed.load()},
                               {"high_watermark", p->high_watermark.load()},
                               {"lag", p->lag.load()},
                               {"stalled", p->stalled.load() != 0},
                               {"gaps", p->gaps.load()}});
  }
  for (const auto& [name, m] : routes_) {
    j["routes"][name] = {{"paused", m->paused.load() != 0},
                         {"dlq_pending", m->dlq_pending.load()},
                         {"consumed", m->consumed.load()},
                         {"done", m->done.load()},
                         {"duplicates", m->duplicates.load()},
                         {"dead", m->dead.load()},
                         {"unknown", m->unknown.load()},
                         {"retries", m->retries.load()},
                         {"in_flight", m->in_flight.load()},
                         {"takeovers", m->takeovers.load()},
                         {"circuit_open", m->circuit_open.load() != 0},
                         {"circuit_opens", m->circuit_opens.load()},
                         {"rate_limit_per_second", m->rate_limit.load()},
                         {"held", m->held.load() != 0},
                         {"holds", m->holds.load()},
                         {"rate_limit_waits", m->rate_limit_waits.load()}};
  }
  return j.dump();
}

}  // namespace idemsink::pipeline
