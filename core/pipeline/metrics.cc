#include "core/pipeline/metrics.h"

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

void Metrics::set_db_job_failures(std::map<std::pair<std::string, std::string>, uint64_t> failures,
                                  std::string last_error) {
  std::lock_guard lk(mu_);
  db_job_failures_ = std::move(failures);
  db_last_job_error_ = std::move(last_error);
}

std::string Metrics::db_last_job_error() const {
  std::lock_guard lk(mu_);
  return db_last_job_error_;
}

std::string Metrics::prometheus() const {
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
  };
  for (const auto& c : kCounters) {
    family(c.name, "counter", c.help);
    for (const auto& [name, m] : routes_)
      out += std::string(c.name) + "{route=\"" + name + "\"} " + std::to_string(((*m).*(c.field)).load()) + "\n";
  }
  family("idemsink_in_flight", "gauge", "Handler calls in flight.");
  for (const auto& [name, m] : routes_)
    out += "idemsink_in_flight{route=\"" + name + "\"} " + std::to_string(m->in_flight.load()) + "\n";
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
  };
  for (const auto& series : kPartitionSeries) {
    family(series.name, series.type, series.help);
    for (const auto& [tp, p] : partitions_) {
      if (series.assigned_only && !p->assigned.load()) continue;
      out += std::string(series.name) + "{topic=\"" + tp.first + "\",partition=\"" + std::to_string(tp.second) +
             "\"} " + std::to_string(series.value(*p)) + "\n";
    }
  }

  auto scalar = [&](const char* name, const char* type, const char* help, auto value) {
    family(name, type, help);
    out += std::string(name) + " " + std::to_string(value) + "\n";
  };
  scalar("idemsink_offset_commits_total", "counter", "Offset commits sent.", commits.load());
  scalar("idemsink_offset_commit_failures_total", "counter", "Offset commits that failed.", commit_failures.load());
  scalar("idemsink_dlq_published_total", "counter", "DLQ records published.", dlq_published.load());
  scalar("idemsink_dlq_publish_failures_total", "counter",
         "DLQ publish attempts that failed (the record stays in the outbox).", dlq_publish_failures.load());
  scalar("idemsink_dlq_pending", "gauge", "DLQ outbox rows not yet published (all hosts).", dlq_pending.load());
  scalar("idemsink_claim_partitions_ahead", "gauge",
         "Monthly claim partitions beyond the current month (maintained at 3; alert below 1: records of a month "
         "without a partition are refused or need a partition created on the spot).",
         claim_partitions_ahead.load());
  scalar("idemsink_dlq_unpublishable", "gauge",
         "DLQ outbox rows Kafka refused for good (too large, unknown topic, not authorised), set aside for an "
         "operator (`idemsink dlq --list`), all hosts.",
         dlq_unpublishable.load());
  scalar("idemsink_dlq_set_aside_total", "counter", "DLQ outbox rows this host set aside as unpublishable.",
         dlq_set_aside.load());
  scalar("idemsink_buffered_records", "gauge", "Consumed records not yet durable.", buffered.load());
  scalar("idemsink_fetch_paused", "gauge", "1 while fetching is paused.", paused.load());
  scalar("idemsink_assigned_partitions", "gauge", "Partitions assigned to this host.", assigned_partitions.load());
  scalar("idemsink_consumer_lag", "gauge", "Records between the commit point and the high watermark, summed.",
         lag.load());
  scalar("idemsink_stuck_pending", "gauge", "Pending claims nobody holds, untouched for claim.stuck_after (all hosts).",
         stuck_pending.load());
  scalar("idemsink_reconciled_done_total", "counter", "Unknown or stuck claims resolved done by reconciliation.",
         reconciled_done.load());
  scalar("idemsink_reconcile_undecided", "gauge", "Claims the last reconcile round could not settle (alert on it).",
         reconcile_undecided.load());
  scalar("idemsink_db_statements_total", "counter", "Statements sent to MariaDB.", db_statements.load());
  scalar("idemsink_db_reconnects_total", "counter", "Reconnects to MariaDB.", db_reconnects.load());
  scalar("idemsink_db_healthy", "gauge", "0 while a database worker cannot reach MariaDB.", db_healthy.load());
  scalar("idemsink_db_jobs_failing", "gauge",
         "Database jobs failing right now for another reason than the connection (the server is reachable).",
         db_jobs_failing.load());
  family("idemsink_db_job_failures_total", "counter",
         "Failed runs of database jobs, by job and class (connection_lost, transient, data, unexpected).");
  for (const auto& [key, n] : db_job_failures_)
    out += "idemsink_db_job_failures_total{job=\"" + key.first + "\",class=\"" + key.second + "\"} " +
           std::to_string(n) + "\n";
  return out;
}

std::string Metrics::status_json(const std::string& host, bool paused_by_operator) const {
  nlohmann::json j;
  j["host"] = host;
  j["paused_by_operator"] = paused_by_operator;
  j["fetch_paused"] = paused.load() != 0;
  j["buffered"] = buffered.load();
  j["assigned_partitions"] = assigned_partitions.load();
  j["lag"] = lag.load();
  j["dlq_pending"] = dlq_pending.load();
  j["dlq_unpublishable"] = dlq_unpublishable.load();
  j["stuck_pending"] = stuck_pending.load();
  j["db_healthy"] = db_healthy.load() != 0;
  std::lock_guard lk(mu_);
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
    j["routes"][name] = {{"consumed", m->consumed.load()},     {"done", m->done.load()},
                         {"duplicates", m->duplicates.load()}, {"dead", m->dead.load()},
                         {"unknown", m->unknown.load()},       {"retries", m->retries.load()},
                         {"in_flight", m->in_flight.load()},   {"takeovers", m->takeovers.load()}};
  }
  return j.dump();
}

}  // namespace idemsink::pipeline
