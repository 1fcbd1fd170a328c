#include "core/pipeline/metrics.h"

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
      {"idemsink_claim_takeovers_total", "Claims taken over from a vanished or expired owner.", &RouteMetrics::takeovers},
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

  auto scalar = [&](const char* name, const char* type, const char* help, auto value) {
    family(name, type, help);
    out += std::string(name) + " " + std::to_string(value) + "\n";
  };
  scalar("idemsink_offset_commits_total", "counter", "Offset commits sent.", commits.load());
  scalar("idemsink_offset_commit_failures_total", "counter", "Offset commits that failed.", commit_failures.load());
  scalar("idemsink_dlq_published_total", "counter", "DLQ records published.", dlq_published.load());
  scalar("idemsink_dlq_publish_failures_total", "counter", "DLQ publish attempts that failed (the record stays in the outbox).",
         dlq_publish_failures.load());
  scalar("idemsink_dlq_pending", "gauge", "DLQ outbox rows not yet published (all hosts).", dlq_pending.load());
  scalar("idemsink_buffered_records", "gauge", "Consumed records not yet durable.", buffered.load());
  scalar("idemsink_fetch_paused", "gauge", "1 while fetching is paused.", paused.load());
  scalar("idemsink_assigned_partitions", "gauge", "Partitions assigned to this host.", assigned_partitions.load());
  scalar("idemsink_consumer_lag", "gauge", "Records between the commit point and the high watermark, summed.",
         lag.load());
  scalar("idemsink_stuck_pending", "gauge", "Pending claims nobody holds, untouched for claim.stuck_after (all hosts).", stuck_pending.load());
  scalar("idemsink_reconciled_done_total", "counter", "Unknown or stuck claims resolved done by reconciliation.",
         reconciled_done.load());
  scalar("idemsink_reconcile_undecided", "gauge", "Claims the last reconcile round could not settle (alert on it).",
         reconcile_undecided.load());
  scalar("idemsink_db_statements_total", "counter", "Statements sent to MariaDB.", db_statements.load());
  scalar("idemsink_db_reconnects_total", "counter", "Reconnects to MariaDB.", db_reconnects.load());
  scalar("idemsink_db_healthy", "gauge", "0 while a database worker cannot reach MariaDB.", db_healthy.load());
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
  j["stuck_pending"] = stuck_pending.load();
  j["db_healthy"] = db_healthy.load() != 0;
  std::lock_guard lk(mu_);
  for (const auto& [name, m] : routes_) {
    j["routes"][name] = {{"consumed", m->consumed.load()}, {"done", m->done.load()},
                         {"duplicates", m->duplicates.load()}, {"dead", m->dead.load()},
                         {"unknown", m->unknown.load()}, {"retries", m->retries.load()},
                         {"in_flight", m->in_flight.load()}, {"takeovers", m->takeovers.load()}};
  }
  return j.dump();
}

}  // namespace idemsink::pipeline
