#include "core/offline/offset_move.h"

#include <chrono>
#include <ctime>
#include <regex>

#include "core/common/util.h"
#include "core/kafka/client.h"
#include "core/kafka/consumer.h"
#include "core/kafka/watermarks.h"
#include "core/offline/reader.h"

namespace idemsink::offline {

namespace {

constexpr int kTimeoutMs = 10000;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The timestamp of the record at `offset` (-1: none is there), read with
// the reader's own assignment.
int64_t timestamp_at(rd_kafka_t* rk, const std::string& topic, int32_t partition, int64_t offset) {
  kafka::PartitionListPtr list(rd_kafka_topic_partition_list_new(1));
  rd_kafka_topic_partition_list_add(list.get(), topic.c_str(), partition)->offset = offset;
  rd_kafka_assign(rk, list.get());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
  int64_t stamp = -1;
  while (std::chrono::steady_clock::now() < deadline) {
    kafka::MessagePtr msg(rd_kafka_consumer_poll(rk, 500));
    if (!msg || msg->partition != partition) continue;
    if (msg->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) break;
    if (msg->err)
      throw kafka::KafkaError("reading " + topic + "[" + std::to_string(partition) + "] at " + std::to_string(offset) +
                              ": " + rd_kafka_message_errstr(msg.get()));
    stamp = rd_kafka_message_timestamp(msg.get(), nullptr);
    break;
  }
  rd_kafka_assign(rk, nullptr);
  return stamp;
}

}  // namespace

int64_t point_in_time_ms(const std::string& text) {
  constexpr int64_t kTenYearsMs = 10LL * 366 * 86'400'000;
  if (auto d = parse_duration(text); d && d->count() <= kTenYearsMs) return now_ms() - d->count();
  static const std::regex time(R"((\d{4})-(\d{2})-(\d{2})( (\d{2}):(\d{2})(:(\d{2}))?)?)");
  std::smatch m;
  if (std::regex_match(text, m, time)) {
    std::tm tm{};
    tm.tm_year = std::stoi(m[1]) - 1900;
    tm.tm_mon = std::stoi(m[2]) - 1;
    tm.tm_mday = std::stoi(m[3]);
    tm.tm_hour = m[5].matched ? std::stoi(m[5]) : 0;
    tm.tm_min = m[6].matched ? std::stoi(m[6]) : 0;
    tm.tm_sec = m[8].matched ? std::stoi(m[8]) : 0;
    if (tm.tm_mon <= 11 && tm.tm_mday >= 1 && tm.tm_mday <= 31 && tm.tm_hour <= 23 && tm.tm_min <= 59 &&
        tm.tm_sec <= 59)
      return static_cast<int64_t>(timegm(&tm)) * 1000;
  }
  throw std::invalid_argument("--to-time \"" + text +
                              "\": expected a duration back from now (\"30m\", \"1h\", \"2d\") or a UTC time "
                              "(\"2026-12-06\", \"2026-12-06 14:05\", \"2026-12-06 14:05:30\")");
}

std::pair<int32_t, int64_t> partition_offset(const std::string& text, const std::string& topic) {
  static const std::regex form(R"((.+):(\d{1,9}):(\d{1,18}))");
  std::smatch m;
  if (!std::regex_match(text, m, form))
    throw std::invalid_argument("--to-offset \"" + text + "\": expected TOPIC:PARTITION:OFFSET");
  if (m[1] != topic)
    throw std::invalid_argument("--to-offset \"" + text + "\": the route reads topic " + topic +
                                " (its retry topics move with it)");
  return {std::stoi(m[2]), std::stoll(m[3])};
}

namespace {

// Each partition's first offset stamped at `time_ms` or later.
void add_offsets_at_time(rd_kafka_t* reader, const std::string& topic, int partitions, int64_t time_ms,
                         std::vector<std::pair<int32_t, int64_t>>& targets) {
  for (int32_t p = 0; p < partitions; ++p) {
    int64_t at = 0;
    if (auto err = kafka::offset_at_time(reader, topic, p, time_ms, kTimeoutMs, at))
      throw kafka::KafkaError("offsets for times of " + topic + "[" + std::to_string(p) +
                              "]: " + rd_kafka_err2str(err));
    targets.push_back({p, at});
  }
}

// The claims' horizon: a record stamped before `ms` may have lost its claim.
struct ClaimsHorizon {
  int64_t days;
  int64_t ms;
};

// Plans the move of partition `p` to `to`: its line, or why it is refused;
// and, once the partition exists, the move itself (refused or not).
void plan_partition(rd_kafka_t* reader, const config::RouteConfig& route, const MoveAsk& ask, int partitions, int32_t p,
                    int64_t to, const ClaimsHorizon& claims, MovePlan& plan, std::vector<std::string>& refused) {
  if (p < 0 || p >= partitions) {
    refused.push_back(route.topic + "[" + std::to_string(p) + "] does not exist (the topic has " +
                      std::to_string(partitions) + " partitions)");
    return;
  }
  kafka::Watermarks marks;
  if (auto err = kafka::query_watermarks(reader, route.topic, p, kTimeoutMs, marks))
    throw kafka::KafkaError("watermarks of " + route.topic + "[" + std::to_string(p) + "]: " + rd_kafka_err2str(err));
  int64_t horizon = 0;
  if (auto err = kafka::offset_at_time(reader, route.topic, p, claims.ms, kTimeoutMs, horizon))
    throw kafka::KafkaError("offsets for times of " + route.topic + "[" + std::to_string(p) +
                            "]: " + rd_kafka_err2str(err));
  // Decided by the record's own stamp (a cluster's time index may not
  // answer: docs/librdkafka.md); the time index names where to go instead.
  const int64_t first = std::max(marks.low, horizon);
  const std::string name = route.topic + "[" + std::to_string(p) + "]";
  const bool rereads = ask.kind == claim::OffsetMove::Kind::Rewind && to >= marks.low && to < marks.high;
  const int64_t stamp = rereads ? timestamp_at(reader, route.topic, p, to) : -1;
  if (to < marks.low)
    refused.push_back(name + ": " + std::to_string(to) + " is before the first offset Kafka still has, " +
                      std::to_string(marks.low));
  else if (rereads && stamp < 0)
    refused.push_back(name + ": the record at " + std::to_string(to) +
                      " could not be read to check it is within the claims' horizon");
  else if (stamp >= 0 && stamp < claims.ms)
    refused.push_back(name + ": the record at " + std::to_string(to) + " is past the claims' horizon of " +
                      std::to_string(claims.days) +
                      " days (its claim may be gone, and its effect would run again); the first offset that can "
                      "be read again is " +
                      std::to_string(first));
  else if (to > marks.high)
    refused.push_back(name + ": " + std::to_string(to) + " is beyond the partition's end, " +
                      std::to_string(marks.high));
  else
    plan.lines.push_back(name + ": to " + std::to_string(to) + " (Kafka has " + std::to_string(marks.low) + ".." +
                         std::to_string(marks.high) + ")");
  claim::OffsetMove m;
  m.group = route.group_id;
  m.route = route.name;
  m.topic = route.topic;
  m.partition = p;
  m.to = to;
  m.kind = ask.kind;
  plan.moves.push_back(std::move(m));
}

MovePlan plan_move_asking_kafka(const config::Config& cfg, const MoveAsk& ask) {
  MovePlan plan;
  const config::RouteConfig* route = cfg.route_by_name(ask.route);
  if (route == nullptr) {
    plan.refusal = "no route named " + ask.route + " in " + cfg.file.string();
    return plan;
  }
  auto reader = consumer_handle(cfg, route->group_id);
  const int partitions = partition_count(reader.get(), route->topic);
  if (partitions == 0) {
    plan.refusal = "topic " + route->topic + " does not exist";
    return plan;
  }
  std::vector<std::pair<int32_t, int64_t>> targets = ask.to_offsets;
  if (ask.to_time_ms) add_offsets_at_time(reader.get(), route->topic, partitions, *ask.to_time_ms, targets);
  if (targets.empty()) {
    plan.refusal = "say where to: a time (rewind) or TOPIC:PARTITION:OFFSET";
    return plan;
  }
  // A record stamped before this may have lost its claim: read again, its
  // effect could run again (admission dead-letters it instead).
  const int64_t horizon_days = cfg.claim.retention_days - cfg.claim.horizon_margin_days;
  const int64_t horizon_ms = now_ms() - horizon_days * 86'400'000;
  std::vector<std::string> refused;
  for (const auto& [p, to] : targets)
    plan_partition(reader.get(), *route, ask, partitions, p, to, {horizon_days, horizon_ms}, plan, refused);
  for (const auto& r : refused) plan.refusal += (plan.refusal.empty() ? "" : "; ") + r;
  return plan;
}

}  // namespace

MovePlan plan_move(const config::Config& cfg, const MoveAsk& ask) {
  try {
    return plan_move_asking_kafka(cfg, ask);
  } catch (const kafka::KafkaError& e) {
    throw KafkaUnavailable(e.what());
  }
}

}  // namespace idemsink::offline
