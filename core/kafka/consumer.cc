#include "core/kafka/consumer.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "core/common/fault.h"
#include "core/common/log.h"
#include "core/kafka/librdkafka_fixes.h"
#include "core/kafka/oauth.h"
#include "core/kafka/watermarks.h"

namespace idemsink::kafka {
namespace {

void log_line(int level, const char* fac, const char* buf) {
  // syslog levels: 0..3 error, 4 warning, 5..6 info, 7 debug
  if (level <= 3)
    spdlog::error("librdkafka {}: {}", fac, buf);
  else if (level == 4)
    spdlog::warn("librdkafka {}: {}", fac, buf);
  else if (level <= 6)
    spdlog::info("librdkafka {}: {}", fac, buf);
  else
    spdlog::debug("librdkafka {}: {}", fac, buf);
}

std::vector<TopicPartitionOffset> offsets_of(const rd_kafka_topic_partition_list_t* l) {
  std::vector<TopicPartitionOffset> out;
  if (l == nullptr) return out;
  for (int i = 0; i < l->cnt; ++i) out.push_back({{l->elems[i].topic, l->elems[i].partition}, l->elems[i].offset});
  return out;
}

}  // namespace

void route_librdkafka_logs(rd_kafka_conf_t* conf) {
  rd_kafka_conf_set_log_cb(
      conf, [](const rd_kafka_t*, int level, const char* fac, const char* buf) { log_line(level, fac, buf); });
}

config::KafkaConfig slice_consumer_config(const config::KafkaConfig& cfg, size_t slice) {
  config::KafkaConfig out = cfg;
  if (slice == 0) return out;
  for (auto* props : {&out.properties, &out.consumer_properties})
    if (auto it = props->find("group.instance.id"); it != props->end()) it->second += "-" + std::to_string(slice);
  return out;
}

namespace {

bool cooperative_sticky(const config::KafkaConfig& cfg) {
  for (const auto* props : {&cfg.properties, &cfg.consumer_properties}) {
    auto it = props->find("partition.assignment.strategy");
    if (it != props->end() && it->second.find("cooperative-sticky") != std::string::npos) return true;
  }
  return false;
}

}  // namespace

std::string library_workarounds(const config::KafkaConfig& cfg) {
  const int v = rd_kafka_version();
  std::string out = std::string("librdkafka ") + rd_kafka_version_str() +
                    ": records are polled one at a time and every offset jump is re-read before it is committed";
  if (v < kBatchConsumeFixed) out += "; batch consume is not used (it skips offsets around pause/resume before 2.1.0)";
  if (v < kSeekTimeoutFixed) out += "; seek timeouts scaled (read as microseconds before 2.1.0)";
  if (v < kStickyCloseFixed && cooperative_sticky(cfg))
    out += "; a cooperative-sticky consumer is closed only after its first assignment (it aborts before 2.3.0)";
  if (v < kIllegalGenerationFixed && cooperative_sticky(cfg))
    out += "; periodic commits wait out rebalances (ILLEGAL_GENERATION loses the assignment before 2.10.0)";
  return out;
}

Consumer::Consumer(const config::KafkaConfig& cfg, std::vector<std::string> topics, Listener& listener)
    : cfg_(cfg), topics_(std::move(topics)), listener_(listener) {
  std::map<std::string, std::string> props{
      {"auto.offset.reset", "earliest"},  // a sink starts at the beginning of what it has never seen
      {"session.timeout.ms", "45000"},
      {"max.poll.interval.ms", "300000"},
      {"statistics.interval.ms", "5000"},  // /readyz and the kafka metrics; 0 turns them off
  };
  for (const auto& [k, v] : cfg.properties) props[k] = v;
  for (const auto& [k, v] : cfg.consumer_properties) props[k] = v;
  // Not negotiable: offsets move only past durable outcomes.
  props["bootstrap.servers"] = cfg.bootstrap_servers;
  props["group.id"] = cfg.group_id;
  props["enable.auto.commit"] = "false";
  props["enable.auto.offset.store"] = "false";
  props["isolation.level"] = "read_committed";
  if (props["statistics.interval.ms"] == "0") health_.statistics_disabled();
  login_ = LoginSettings::of(props);
  health_.set_login(login_);
  rd_kafka_conf_t* conf = make_conf(props);
  rd_kafka_conf_set_log_cb(conf, &log_cb);
  rd_kafka_conf_set_error_cb(conf, &error_cb);
  rd_kafka_conf_set_stats_cb(conf, &stats_cb);
  rd_kafka_conf_set_rebalance_cb(conf, &rebalance_cb);
  rd_kafka_conf_set_offset_commit_cb(conf, &commit_cb);
  rd_kafka_conf_set_opaque(conf, this);
  oauth::prepare(conf, cfg);
  char err[512];
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  if (rk == nullptr) {
    rd_kafka_conf_destroy(conf);
    throw KafkaError(std::string("cannot create Kafka consumer: ") + err);
  }
  rk_.reset(rk);
  oauth::attach(rk, cfg);
  rd_kafka_poll_set_consumer(rk);
  queue_ = rd_kafka_queue_get_consumer(rk);
  configured_cooperative_ = cooperative_sticky(cfg);
  must_wait_first_assignment_ = rd_kafka_version() < kStickyCloseFixed && configured_cooperative_;
}

Consumer::~Consumer() {
  close();
  if (rk_) rd_kafka_queue_destroy(queue_);
}

void Consumer::start() {
  auto subs = PartitionListPtr(rd_kafka_topic_partition_list_new(static_cast<int>(topics_.size())));
  for (const auto& t : topics_) rd_kafka_topic_partition_list_add(subs.get(), t.c_str(), RD_KAFKA_PARTITION_UA);
  if (auto err = rd_kafka_subscribe(rk_.get(), subs.get()))
    throw KafkaError(std::string("subscribe failed: ") + rd_kafka_err2str(err));
  poller_ = std::thread([this] { poll_loop(); });
}

void Consumer::close(std::chrono::steady_clock::time_point deadline) {
  if (!poller_.joinable()) return;
  close_deadline_ = deadline;
  stop_.store(true);
  wake();
  poller_.join();
}

void Consumer::poll_loop() {
  const size_t max_batch = static_cast<size_t>(cfg_.max_poll_records);
  const int timeout_ms = static_cast<int>(cfg_.poll_timeout.count());
  for (;;) {
    if (stop_.load() && (!must_wait_first_assignment_ || first_rebalance_seen_.load() ||
                         std::chrono::steady_clock::now() >= close_deadline_))
      break;
    apply_commands();
    batch_.seek_generation = seeks_applied_;
    // One record at a time, never the batch API: see kBatchConsumeFixed.
    rd_kafka_message_t* m = rd_kafka_consume_queue(queue_, timeout_ms);
    while (m != nullptr) {
      if (admit(m)) {
        batch_.messages.emplace_back(m);
      } else {
        rd_kafka_message_destroy(m);
      }
      if (batch_.messages.size() >= max_batch) break;
      m = rd_kafka_consume_queue(queue_, 0);
    }
    flush();
    check_streams();
  }
  if (must_wait_first_assignment_ && !first_rebalance_seen_.load()) {
    // Closing or destroying now would abort the process (docs/librdkafka.md):
    // leave the handle to the process exit. This host holds no partitions,
    // so there is nothing to drain or commit; the group drops the member
    // after session.timeout.ms.
    spdlog::warn(
        "kafka: no partitions were assigned before the shutdown deadline; leaving the group by session "
        "timeout instead of closing (librdkafka {} aborts when a cooperative-sticky consumer closes before "
        "its first assignment)",
        rd_kafka_version_str());
    (void)rk_.release();
    abandoned_.store(true);
    return;
  }
  {
    std::lock_guard lk(commands_mu_);
    closing_ = true;
  }
  // Test fault: a close that hangs past the shutdown deadline (the host
  // names it in the log while it waits).
  if (fault::once("close_hangs")) std::this_thread::sleep_until(close_deadline_ + std::chrono::seconds(7));
  revoke_before_close();
  // Leaves the group; anything still assigned is revoked through rebalance_cb
  // on this thread.
  if (auto err = rd_kafka_consumer_close(rk_.get())) spdlog::warn("kafka consumer close: {}", rd_kafka_err2str(err));
  flush();
}

int Consumer::assigned_count() {
  rd_kafka_topic_partition_list_t* list = nullptr;
  if (rd_kafka_assignment(rk_.get(), &list) != RD_KAFKA_RESP_ERR_NO_ERROR) return -1;
  const int n = list->cnt;
  rd_kafka_topic_partition_list_destroy(list);
  return n;
}

void Consumer::flush() {
  if (batch_.messages.empty()) return;
  Batch out;
  std::swap(out, batch_);
  batch_.seek_generation = out.seek_generation;
  listener_.on_messages(std::move(out));
}

void Consumer::log_cb(const rd_kafka_t* rk, int level, const char* fac, const char* buf) {
  log_line(level, fac, buf);
  // Test fault (needs "topic" among the consumer's librdkafka debug
  // contexts): a resume from the engine reaches librdkafka between its start
  // of a partition's fetcher and the start being carried out.
  if (level == 7 && std::strcmp(fac, "CONSUMER") == 0)
    if (const char* start = std::strstr(buf, "Start consuming ")) {
      auto* self = static_cast<Consumer*>(rd_kafka_opaque(rk));
      // Not while the poll thread waits in a pause or resume of its own: it
      // waits for this thread, and would stay behind the start.
      if (self->holding_fetch_start_.load() && !self->in_fetch_call_.load())
        self->resume_during_start(start + std::strlen("Start consuming "));
    }
}

void Consumer::resume_during_start(std::string_view line) {
  // "orders [3] at offset INVALID (v4)". On librdkafka's main thread, after
  // the start took its version and before it is queued; it waits here 1 s,
  // and a resume the poll thread sends meanwhile is queued ahead of it.
  const auto open = line.find(" [");
  const auto close = line.find(']', open);
  if (open == std::string_view::npos || close == std::string_view::npos) return;
  const TopicPartition tp{std::string(line.substr(0, open)),
                          std::stoi(std::string(line.substr(open + 2, close - open - 2)))};
  spdlog::warn("kafka: fault fetch_command_overtakes_start: resuming {}[{}] while its fetcher starts", tp.topic,
               tp.partition);
  {
    // First in line: the poll thread may be about to apply other commands.
    std::lock_guard lk(commands_mu_);
    commands_.insert(commands_.begin(), Command{Command::Kind::Resume, {tp}});
  }
  wake();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  holding_fetch_start_.store(false);
}

void Consumer::error_cb(rd_kafka_t*, int err, const char* reason, void* opaque) {
  // Transport errors while a broker is down are expected and retried by
  // librdkafka; the pipeline simply stops receiving records meanwhile. A
  // refused login is not retried into success: it is an error, and /readyz
  // says so until a broker is up again.
  auto* self = static_cast<Consumer*>(opaque);
  const auto code = static_cast<rd_kafka_resp_err_t>(err);
  if (const auto refusal = login_refusal(code, reason, self->login_)) {
    spdlog::error("kafka: the cluster refused this client: {} ({}); the host waits and tries again", *refusal,
                  rd_kafka_err2name(code));
  } else {
    spdlog::warn("kafka: {} ({})", reason, rd_kafka_err2name(code));
  }
  self->health_.on_error(err, reason);
}

int Consumer::stats_cb(rd_kafka_t*, char* json, size_t len, void* opaque) {
  static_cast<Consumer*>(opaque)->health_.on_statistics(std::string_view(json, len));
  return 0;  // librdkafka frees the buffer
}

void Consumer::commit_cb(rd_kafka_t*, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* offsets, void* opaque) {
  static_cast<Consumer*>(opaque)->listener_.on_commit_result(err, offsets_of(offsets));
}

void Consumer::commit_sync(const std::vector<TopicPartitionOffset>& offsets) {
  auto list = to_list(offsets);
  if (auto err = rd_kafka_commit(rk_.get(), list.get(), 0)) {
    spdlog::warn(
        "kafka: commit on revoke failed ({}); the next owner re-reads from the previous commit and the "
        "claim table turns those records into duplicates",
        rd_kafka_err2str(err));
  }
}

void Consumer::commit_async(const std::vector<TopicPartitionOffset>& offsets) {
  if (offsets.empty()) return;
  auto list = to_list(offsets);
  if (auto err = rd_kafka_commit(rk_.get(), list.get(), 1)) listener_.on_commit_result(err, offsets);
}

std::optional<Consumer::Watermarks> Consumer::watermarks(const TopicPartition& tp) {
  Watermarks w;
  if (rd_kafka_get_watermark_offsets(rk_.get(), tp.topic.c_str(), tp.partition, &w.low, &w.high) ==
          RD_KAFKA_RESP_ERR_NO_ERROR &&
      w.high >= 0 && w.low >= 0)
    return w;
  std::lock_guard lk(asked_marks_mu_);
  auto it = asked_marks_.find(tp);
  if (it == asked_marks_.end()) return std::nullopt;
  return it->second;
}

void Consumer::ask_unknown_watermarks(std::chrono::steady_clock::time_point now) {
  std::vector<std::pair<std::string, int32_t>> unknown, due;
  for (const auto& [tp, s] : streams_) {
    Watermarks w;
    if (rd_kafka_get_watermark_offsets(rk_.get(), tp.topic.c_str(), tp.partition, &w.low, &w.high) ==
            RD_KAFKA_RESP_ERR_NO_ERROR &&
        w.high >= 0 && w.low >= 0)
      continue;
    unknown.emplace_back(tp.topic, tp.partition);
    auto [ask, fresh] = marks_asks_.try_emplace(tp, MarksAsk{now + kAskMarksEvery});
    if (fresh || now < ask->second.next) continue;
    due.emplace_back(tp.topic, tp.partition);
    ask->second.next = now + ask->second.interval;
    ask->second.interval = std::min(ask->second.interval * 2, kAskMarksAtMost);
  }
  std::erase_if(marks_asks_, [&](const auto& e) {
    return std::find(unknown.begin(), unknown.end(), std::pair{e.first.topic, e.first.partition}) == unknown.end();
  });
  std::map<TopicPartition, Watermarks> asked;
  if (!due.empty())
    for (const auto& [tp, w] : query_watermarks(rk_.get(), due, kAskMarksWithin))
      asked[TopicPartition{tp.first, tp.second}] = Watermarks{w.low, w.high};
  // Only partitions still assigned and still unknown to librdkafka: the rest
  // go (a revoked partition's, or one a fetch has told about since).
  std::lock_guard lk(asked_marks_mu_);
  for (const auto& [tp, w] : asked) asked_marks_[tp] = w;
  std::erase_if(asked_marks_, [&](const auto& e) {
    return std::find(unknown.begin(), unknown.end(), std::pair{e.first.topic, e.first.partition}) == unknown.end();
  });
}

std::vector<TopicPartitionOffset> Consumer::committed(const std::vector<TopicPartition>& tps, int timeout_ms) {
  auto list = to_list(tps);
  if (auto err = rd_kafka_committed(rk_.get(), list.get(), timeout_ms))
    throw KafkaError(std::string("reading committed offsets failed: ") + rd_kafka_err2str(err));
  return offsets_of(list.get());
}

std::optional<int> Consumer::partition_count(const std::string& topic, int timeout_ms) {
  rd_kafka_topic_t* t = rd_kafka_topic_new(rk_.get(), topic.c_str(), nullptr);
  if (t == nullptr) return std::nullopt;
  const rd_kafka_metadata_t* md = nullptr;
  const rd_kafka_resp_err_t err = rd_kafka_metadata(rk_.get(), 0, t, &md, timeout_ms);
  rd_kafka_topic_destroy(t);
  if (err) return std::nullopt;
  std::optional<int> n;
  if (md->topic_cnt == 1 && !md->topics[0].err) n = md->topics[0].partition_cnt;
  rd_kafka_metadata_destroy(md);
  return n;
}

}  // namespace idemsink::kafka
