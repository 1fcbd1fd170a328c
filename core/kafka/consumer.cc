#include "core/kafka/consumer.h"

#include <cstring>

#include "core/common/log.h"

namespace idemsink::kafka {
namespace {

void log_cb(const rd_kafka_t*, int level, const char* fac, const char* buf) {
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

void error_cb(rd_kafka_t*, int err, const char* reason, void*) {
  // Transport errors while a broker is down are expected and retried by
  // librdkafka; the pipeline simply stops receiving records meanwhile.
  spdlog::warn("kafka: {} ({})", reason, rd_kafka_err2name(static_cast<rd_kafka_resp_err_t>(err)));
}

std::vector<TopicPartitionOffset> offsets_of(const rd_kafka_topic_partition_list_t* l) {
  std::vector<TopicPartitionOffset> out;
  if (l == nullptr) return out;
  for (int i = 0; i < l->cnt; ++i) out.push_back({{l->elems[i].topic, l->elems[i].partition}, l->elems[i].offset});
  return out;
}

}  // namespace

void route_librdkafka_logs(rd_kafka_conf_t* conf) { rd_kafka_conf_set_log_cb(conf, &log_cb); }

Consumer::Consumer(const config::KafkaConfig& cfg, std::vector<std::string> topics, Listener& listener)
    : cfg_(cfg), topics_(std::move(topics)), listener_(listener) {
  std::map<std::string, std::string> props{
      {"auto.offset.reset", "earliest"},  // a sink starts at the beginning of what it has never seen
      {"session.timeout.ms", "45000"},
      {"max.poll.interval.ms", "300000"},
  };
  for (const auto& [k, v] : cfg.properties) props[k] = v;
  for (const auto& [k, v] : cfg.consumer_properties) props[k] = v;
  // Not negotiable: offsets move only past durable outcomes.
  props["bootstrap.servers"] = cfg.bootstrap_servers;
  props["group.id"] = cfg.group_id;
  props["enable.auto.commit"] = "false";
  props["enable.auto.offset.store"] = "false";
  props["isolation.level"] = "read_committed";
  rd_kafka_conf_t* conf = make_conf(props);
  route_librdkafka_logs(conf);
  rd_kafka_conf_set_error_cb(conf, &error_cb);
  rd_kafka_conf_set_rebalance_cb(conf, &rebalance_cb);
  rd_kafka_conf_set_offset_commit_cb(conf, &commit_cb);
  rd_kafka_conf_set_opaque(conf, this);
  char err[512];
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  if (rk == nullptr) {
    rd_kafka_conf_destroy(conf);
    throw KafkaError(std::string("cannot create Kafka consumer: ") + err);
  }
  rk_.reset(rk);
  rd_kafka_poll_set_consumer(rk);
  queue_ = rd_kafka_queue_get_consumer(rk);
}

Consumer::~Consumer() {
  close();
  if (queue_) rd_kafka_queue_destroy(queue_);
}

void Consumer::start() {
  auto subs = PartitionListPtr(rd_kafka_topic_partition_list_new(static_cast<int>(topics_.size())));
  for (const auto& t : topics_) rd_kafka_topic_partition_list_add(subs.get(), t.c_str(), RD_KAFKA_PARTITION_UA);
  if (auto err = rd_kafka_subscribe(rk_.get(), subs.get()))
    throw KafkaError(std::string("subscribe failed: ") + rd_kafka_err2str(err));
  poller_ = std::thread([this] { poll_loop(); });
}

void Consumer::close() {
  stop_.store(true);
  if (poller_.joinable()) poller_.join();
}

void Consumer::poll_loop() {
  std::vector<rd_kafka_message_t*> buf(static_cast<size_t>(cfg_.max_poll_records));
  while (!stop_.load()) {
    ssize_t n = rd_kafka_consume_batch_queue(queue_, static_cast<int>(cfg_.poll_timeout.count()), buf.data(), buf.size());
    if (n < 0) {
      spdlog::error("kafka poll failed: {}", rd_kafka_err2str(rd_kafka_last_error()));
      continue;
    }
    if (n == 0) continue;
    std::vector<MessagePtr> batch;
    batch.reserve(static_cast<size_t>(n));
    for (ssize_t i = 0; i < n; ++i) batch.emplace_back(buf[static_cast<size_t>(i)]);
    listener_.on_messages(std::move(batch));
  }
  // Leaving the group revokes everything through rebalance_cb on this thread.
  if (auto err = rd_kafka_consumer_close(rk_.get()))
    spdlog::warn("kafka consumer close: {}", rd_kafka_err2str(err));
}

void Consumer::rebalance_cb(rd_kafka_t* rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* parts,
                            void* opaque) {
  auto* self = static_cast<Consumer*>(opaque);
  const bool cooperative = std::strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE") == 0;
  const auto tps = from_list(parts);
  if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
    spdlog::info("kafka: assigned {}{}", describe(tps), cooperative ? " (incremental)" : "");
    self->listener_.on_assigned(tps);
    if (cooperative) {
      if (rd_kafka_error_t* e = rd_kafka_incremental_assign(rk, parts)) {
        spdlog::error("kafka incremental assign failed: {}", rd_kafka_error_string(e));
        rd_kafka_error_destroy(e);
      }
    } else if (auto e = rd_kafka_assign(rk, parts)) {
      spdlog::error("kafka assign failed: {}", rd_kafka_err2str(e));
    }
    return;
  }
  const bool lost = err != RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS || rd_kafka_assignment_lost(rk);
  spdlog::info("kafka: {} {}", lost ? "lost" : "revoking", describe(tps));
  auto offsets = self->listener_.on_revoking(tps, lost);
  if (!lost && !offsets.empty()) self->commit_sync(offsets);
  if (cooperative) {
    if (rd_kafka_error_t* e = rd_kafka_incremental_unassign(rk, parts)) {
      spdlog::error("kafka incremental unassign failed: {}", rd_kafka_error_string(e));
      rd_kafka_error_destroy(e);
    }
  } else {
    rd_kafka_assign(rk, nullptr);
  }
}

void Consumer::commit_cb(rd_kafka_t*, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* offsets,
                         void* opaque) {
  static_cast<Consumer*>(opaque)->listener_.on_commit_result(err, offsets_of(offsets));
}

void Consumer::commit_sync(const std::vector<TopicPartitionOffset>& offsets) {
  auto list = to_list(offsets);
  if (auto err = rd_kafka_commit(rk_.get(), list.get(), 0)) {
    spdlog::warn("kafka: commit on revoke failed ({}); the next owner re-reads from the previous commit and the "
                 "claim table turns those records into duplicates",
                 rd_kafka_err2str(err));
  }
}

void Consumer::commit_async(const std::vector<TopicPartitionOffset>& offsets) {
  if (offsets.empty()) return;
  auto list = to_list(offsets);
  if (auto err = rd_kafka_commit(rk_.get(), list.get(), 1))
    listener_.on_commit_result(err, offsets);
}

void Consumer::pause(const std::vector<TopicPartition>& tps) {
  if (tps.empty()) return;
  auto list = to_list(tps);
  rd_kafka_pause_partitions(rk_.get(), list.get());
}

void Consumer::seek(const TopicPartitionOffset& tpo) {
  auto list = to_list(std::vector<TopicPartitionOffset>{tpo});
  if (rd_kafka_error_t* e = rd_kafka_seek_partitions(rk_.get(), list.get(), 0)) {
    spdlog::warn("kafka: seek {}[{}] to {} failed: {}", tpo.tp.topic, tpo.tp.partition, tpo.offset,
                 rd_kafka_error_string(e));
    rd_kafka_error_destroy(e);
  }
}

void Consumer::resume(const std::vector<TopicPartition>& tps) {
  if (tps.empty()) return;
  auto list = to_list(tps);
  rd_kafka_resume_partitions(rk_.get(), list.get());
}

std::vector<TopicPartition> Consumer::assignment() {
  rd_kafka_topic_partition_list_t* l = nullptr;
  if (rd_kafka_assignment(rk_.get(), &l) != RD_KAFKA_RESP_ERR_NO_ERROR) return {};
  PartitionListPtr owned(l);
  return from_list(l);
}

std::optional<int64_t> Consumer::high_watermark(const TopicPartition& tp) {
  int64_t lo = 0, hi = 0;
  if (rd_kafka_get_watermark_offsets(rk_.get(), tp.topic.c_str(), tp.partition, &lo, &hi) != RD_KAFKA_RESP_ERR_NO_ERROR ||
      hi < 0)
    return std::nullopt;
  return hi;
}

std::vector<TopicPartitionOffset> Consumer::committed(const std::vector<TopicPartition>& tps, int timeout_ms) {
  auto list = to_list(tps);
  if (auto err = rd_kafka_committed(rk_.get(), list.get(), timeout_ms))
    throw KafkaError(std::string("reading committed offsets failed: ") + rd_kafka_err2str(err));
  return offsets_of(list.get());
}

}  // namespace idemsink::kafka
