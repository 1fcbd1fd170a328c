#include "core/metrics/metrics.h"

#include <cmath>
#include <fmt/format.h>
#include <string_view>
#include <nlohmann/json.hpp>

namespace idemsink::metrics {

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

PartitionMetrics& Metrics::partition(const std::string& route, const std::string& topic, int32_t partition) {
  std::lock_guard lk(mu_);
  auto& slot = partitions_[{route, topic, partition}];
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

void SliceMetrics::add_consumer(std::string group, const kafka::ClientHealth* health) {
  std::lock_guard lk(mu_);
  consumers_.push_back({std::move(group), health});
}

void SliceMetrics::remove_consumer(const kafka::ClientHealth* health) {
  std::lock_guard lk(mu_);
  std::erase_if(consumers_, [&](const Consumer& c) { return c.health == health; });
}

std::vector<SliceMetrics::Consumer> SliceMetrics::consumers() const {
  std::lock_guard lk(mu_);
  return consumers_;
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

void Metrics::set_config(std::string file, std::string hash) {
  std::lock_guard lk(mu_);
  config_file_ = std::move(file);
  config_hash_ = std::move(hash);
}

void Metrics::count_reload(const std::string& result, std::string message) {
  std::lock_guard lk(mu_);
  ++reloads_[result];
  last_reload_ = {
      result, std::move(message),
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count()};
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

void Metrics::watch_registry(std::string url, std::function<std::string()> problem, std::function<size_t()> waiting) {
  std::lock_guard lk(mu_);
  registries_.push_back({std::move(url), std::move(problem), std::move(waiting)});
}

std::string Metrics::readiness_problem() const {
  std::string out = db_problem();
  std::lock_guard lk(mu_);
  // Records whose schema it has not given wait: their partitions hold.
  for (const auto& r : registries_)
    if (const std::string p = r.problem(); !p.empty())
      out += "schema registry " + r.url + " does not answer (" + p + "); records needing a schema it has not given " +
             "wait (" + std::to_string(r.waiting()) + " schemas)\n";
  for (const auto& s : slices_) {
    const auto consumers = s->consumers();
    if (consumers.empty()) continue;
    const std::string which = slices_.size() > 1 ? " (database " + s->database + ")" : "";
    std::string problems;
    bool joining = false;
    for (const auto& consumer : consumers) {
      if (const std::string p = consumer.health->problem(); !p.empty()) {
        if (problems.find(p) == std::string::npos) problems += p + which + "\n";
        continue;
      }
      const auto k = consumer.health->snapshot();
      joining = joining || !k.stats_seen || k.group_state != "up" || k.join_state != "steady";
    }
    if (!problems.empty()) {
      out += problems;
      continue;
    }
    // Joined and settled with nothing to do is not ready: a member beyond
    // the partition count, or subscribed to topics that do not exist.
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

namespace {

// A label value as Prometheus' text format writes it (a file path may hold any of these).
std::string escape_label(std::string_view v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string value_text(uint64_t v) { return std::to_string(v); }
std::string value_text(int64_t v) { return std::to_string(v); }
std::string value_text(double v) { return std::isnan(v) ? "NaN" : fmt::format("{:g}", v); }

/// A count held as a double (NaN while unknown), as /status shows it: a whole number, or null.
nlohmann::json count_or_null(double v) {
  return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(static_cast<int64_t>(v));
}

void family(std::string& out, const char* name, const char* type, const char* help) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

}  // namespace

std::string Metrics::prometheus() const {
  const bool ready = readiness_problem().empty();
  std::string out;
  std::lock_guard lk(mu_);
  render_routes(out);
  render_partitions(out);
  render_slices(out);
  if (!build_info_.empty()) {
    family(out, "idemsink_build_info", "gauge", "Always 1; the labels say which build runs.");
    std::string labels;
    for (const auto& [k, v] : build_info_) labels += (labels.empty() ? "" : ",") + k + "=\"" + v + "\"";
    out += "idemsink_build_info{" + labels + "} 1\n";
  }
  if (!config_hash_.empty()) {
    family(out, "idemsink_config_info", "gauge", "Always 1; the labels say which config file the host runs.");
    out += "idemsink_config_info{file=\"" + escape_label(config_file_) + "\",hash=\"" + config_hash_ + "\"} 1\n";
    family(out, "idemsink_config_reloads_total", "counter",
           "Reloads asked for (SIGHUP, the API, idemsink reload), by what came of them.");
    for (const char* result : {"applied", "refused", "unchanged"}) {
      const auto it = reloads_.find(result);
      out += std::string("idemsink_config_reloads_total{result=\"") + result + "\"} " +
             std::to_string(it == reloads_.end() ? 0 : it->second) + "\n";
    }
  }
  family(out, "idemsink_ready", "gauge",
         "1 while /readyz answers 200: databases reachable, Kafka reachable and authenticated, partitions assigned "
         "or the group joining.");
  out += "idemsink_ready " + std::to_string(ready ? 1 : 0) + "\n";
  if (!registries_.empty()) {
    family(out, "idemsink_schema_registry_up", "gauge",
           "1 while the schema registry answers; 0 while records needing a schema it has not given wait.");
    for (const auto& r : registries_)
      out += "idemsink_schema_registry_up{url=\"" + r.url + "\"} " + (r.problem().empty() ? "1" : "0") + "\n";
    family(out, "idemsink_schema_registry_waiting_schemas", "gauge",
           "Schemas being fetched that records wait for (their partitions hold until the schema is known).");
    for (const auto& r : registries_)
      out += "idemsink_schema_registry_waiting_schemas{url=\"" + r.url + "\"} " + std::to_string(r.waiting()) + "\n";
  }
  render_clients(out);
  return out;
}

void Metrics::render_routes(std::string& out) const {
#define IDEMSINK_RENDER(field, T, initial, type, name, help) \
  family(out, name, #type, help);                            \
  for (const auto& [route, m] : routes_) out += name "{route=\"" + route + "\"} " + value_text(m->field.load()) + "\n";
  IDEMSINK_ROUTE_METRICS(IDEMSINK_RENDER)
#undef IDEMSINK_RENDER
  family(out, "idemsink_handler_latency_seconds", "histogram", "Handler call latency.");
  for (const auto& [route, m] : routes_)
    m->handler_latency.render(out, "idemsink_handler_latency_seconds", "route=\"" + route + "\"");
}

void Metrics::render_partitions(std::string& out) const {
  // A gauge describes the partition while this host holds it; a counter
  // stays after a revoke.
#define IDEMSINK_RENDER(field, T, initial, type, name, help)                                                           \
  family(out, name, #type, help);                                                                                      \
  for (const auto& [rtp, p] : partitions_) {                                                                           \
    if (std::string_view(#type) == "gauge" && !p->assigned.load()) continue;                                           \
    const auto& [route, topic, partition] = rtp;                                                                       \
    out += name "{route=\"" + route + "\",topic=\"" + topic + "\",partition=\"" + std::to_string(partition) + "\"} " + \
           value_text(p->field.load()) + "\n";                                                                         \
  }
  IDEMSINK_PARTITION_METRICS(IDEMSINK_RENDER)
#undef IDEMSINK_RENDER
}

void Metrics::render_slices(std::string& out) const {
  // One series per slice: unlabelled with one database, database="..." with more.
  const bool labelled = slices_.size() > 1;
#define IDEMSINK_RENDER(field, T, initial, type, name, help)                                \
  family(out, name, #type, help);                                                           \
  for (const auto& s : slices_)                                                             \
    out += name + (labelled ? "{database=\"" + s->database + "\"}" : std::string()) + " " + \
           value_text(s->field.load()) + "\n";
  IDEMSINK_SLICE_METRICS(IDEMSINK_RENDER)
#undef IDEMSINK_RENDER
}

void Metrics::render_clients(std::string& out) const {
  // librdkafka's statistics, per consumer (statistics.interval.ms), and the
  // database jobs' failures, per slice.
  const bool labelled = slices_.size() > 1;
  auto slice_label = [&](const SliceMetrics& s) { return labelled ? "database=\"" + s.database + "\"" : ""; };
  // A slice with consumers of several groups (routes sharing a topic) labels
  // each by its group.
  std::vector<std::pair<std::string, kafka::ClientHealth::Snapshot>> clients;
  for (const auto& s : slices_) {
    const auto consumers = s->consumers();
    for (const auto& consumer : consumers) {
      std::string label = slice_label(*s);
      if (consumers.size() > 1) label += (label.empty() ? "" : ",") + ("group=\"" + consumer.group + "\"");
      clients.emplace_back(label, consumer.health->snapshot());
    }
  }
  auto with = [](const std::string& label, const std::string& more) {
    if (label.empty()) return more.empty() ? std::string() : "{" + more + "}";
    return "{" + label + (more.empty() ? "" : "," + more) + "}";
  };
  family(out, "idemsink_kafka_broker_up", "gauge", "1 while the consumer's connection to the broker is up.");
  for (const auto& [label, k] : clients)
    for (const auto& [name, b] : k.brokers)
      out += "idemsink_kafka_broker_up" + with(label, "broker=\"" + name + "\"") + " " + (b.up ? "1" : "0") + "\n";
  family(out, "idemsink_kafka_broker_rtt_seconds", "gauge",
         "Average request round trip to the broker over the last statistics interval.");
  for (const auto& [label, k] : clients)
    for (const auto& [name, b] : k.brokers)
      out += "idemsink_kafka_broker_rtt_seconds" + with(label, "broker=\"" + name + "\"") + " " +
             std::to_string(b.rtt_seconds) + "\n";
  family(out, "idemsink_kafka_rebalances_total", "counter", "Group rebalances this host's consumer went through.");
  for (const auto& [label, k] : clients)
    out += "idemsink_kafka_rebalances_total" + with(label, "") + " " + std::to_string(k.rebalances) + "\n";
  family(out, "idemsink_kafka_fetch_queue_messages", "gauge",
         "Records fetched by librdkafka and waiting in its queues (not yet handed to the pipeline).");
  for (const auto& [label, k] : clients)
    out +=
        "idemsink_kafka_fetch_queue_messages" + with(label, "") + " " + std::to_string(k.fetch_queue_messages) + "\n";
  family(out, "idemsink_db_job_failures_total", "counter",
         "Failed runs of database jobs, by job and class (connection_lost, transient, data, unexpected).");
  for (const auto& s : slices_) {
    const std::string label = slice_label(*s);
    for (const auto& [key, n] : s->db_job_failures())
      out += "idemsink_db_job_failures_total{" + (label.empty() ? "" : label + ",") + "job=\"" + key.first +
             "\",class=\"" + key.second + "\"} " + std::to_string(n) + "\n";
  }
}

std::string Metrics::status_json(const std::string& host, bool paused_by_operator) const {
  nlohmann::json j;
  j["host"] = host;
  j["paused_by_operator"] = paused_by_operator;
  std::lock_guard lk(mu_);
  status_host(j);
  status_partitions(j);
  status_routes(j);
  return j.dump();
}

void Metrics::status_host(nlohmann::json& j) const {
  // The host as a whole (summed over its databases), then each database.
  bool paused = false, healthy = true;
  int64_t buffered = 0, assigned = 0, dlq_pending = 0, dlq_unpublishable = 0, stuck = 0;
  double lag = 0;  // NaN (null) while any partition's is unknown
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
                              {"lag", count_or_null(s->lag.load())}});
  }
  for (const auto& [name, m] : routes_) {
    dlq_pending += m->dlq_pending.load();
    dlq_unpublishable += m->dlq_unpublishable.load();
  }
  j["config"] = {{"file", config_file_}, {"hash", config_hash_}, {"last_reload", nullptr}};
  if (!last_reload_.result.empty())
    j["config"]["last_reload"] = {
        {"result", last_reload_.result}, {"message", last_reload_.message}, {"at_epoch_s", last_reload_.at_epoch_s}};
  j["fetch_paused"] = paused;
  j["buffered"] = buffered;
  j["assigned_partitions"] = assigned;
  j["lag"] = count_or_null(lag);
  j["dlq_pending"] = dlq_pending;
  j["dlq_unpublishable"] = dlq_unpublishable;
  j["stuck_pending"] = stuck;
  j["db_healthy"] = healthy;
}

void Metrics::status_partitions(nlohmann::json& j) const {
  j["partitions"] = nlohmann::json::array();
  for (const auto& [rtp, p] : partitions_) {
    if (!p->assigned.load()) continue;
    const auto& [route, topic, partition] = rtp;
    j["partitions"].push_back({{"route", route},
                               {"topic", topic},
                               {"partition", partition},
                               {"committed", p->committed.load()},
                               {"high_watermark", p->high_watermark.load()},
                               {"lag", count_or_null(p->lag.load())},
                               {"stalled", p->stalled.load() != 0},
                               {"fetching", p->fetching.load() != 0},
                               {"in_pipeline", p->in_pipeline.load()},
                               {"gaps", p->gaps.load()}});
  }
}

void Metrics::status_routes(nlohmann::json& j) const {
  for (const auto& [name, m] : routes_) {
    j["routes"][name] = {{"paused", m->paused.load() != 0},
                         {"dlq_pending", m->dlq_pending.load()},
                         {"consumed", m->consumed.load()},
                         {"done", m->done.load()},
                         {"duplicates", m->duplicates.load()},
                         {"skipped", m->skipped.load()},
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
}

}  // namespace idemsink::metrics
