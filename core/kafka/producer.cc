#include "core/kafka/producer.h"

#include "core/common/log.h"
#include "core/kafka/consumer.h"
#include "core/kafka/oauth.h"

namespace idemsink::kafka {

Producer::Producer(const config::KafkaConfig& cfg, DeliveryFn on_delivery) : on_delivery_(std::move(on_delivery)) {
  std::map<std::string, std::string> props{
      // No delivery deadline: retriable errors are retried until the broker
      // takes the record, and the idempotent producer never writes its own
      // retries twice. A finite timeout could expire while a request is in
      // flight, report a failure for a record the broker did append, and the
      // relay would then publish it again. Permanent errors (unknown topic,
      // authorization) are still reported at once.
      {"message.timeout.ms", "0"},
      {"linger.ms", "5"},
      // A partition that lost its leader is looked up again only a few
      // times in quick succession, then at this interval (5 min by
      // default): records waiting for it would wait that long after it has
      // a leader again.
      {"topic.metadata.refresh.interval.ms", "10000"},
  };
  for (const auto& [k, v] : cfg.properties) props[k] = v;
  for (const auto& [k, v] : cfg.producer_properties) props[k] = v;
  props["bootstrap.servers"] = cfg.bootstrap_servers;
  props["enable.idempotence"] = "true";
  props["acks"] = "all";
  login_ = LoginSettings::of(props);
  rd_kafka_conf_t* conf = make_conf(props);
  route_librdkafka_logs(conf);
  rd_kafka_conf_set_dr_msg_cb(conf, &dr_cb);
  rd_kafka_conf_set_error_cb(conf, &error_cb);
  rd_kafka_conf_set_opaque(conf, this);
  oauth::prepare(conf, cfg);
  char err[512];
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (rk == nullptr) {
    rd_kafka_conf_destroy(conf);
    throw KafkaError(std::string("cannot create DLQ producer: ") + err);
  }
  rk_.reset(rk);
  oauth::attach(rk, cfg);
  poller_ = std::thread([this] {
    while (!stop_.load()) rd_kafka_poll(rk_.get(), 100);
  });
}

Producer::~Producer() {
  // What is still queued after a short flush (a partition without a leader,
  // a fatal error) is dropped rather than waited for: its rows are still in
  // the outbox, unstamped, and the next relay publishes them. Without a
  // delivery deadline the wait could be forever, and a host must stop.
  if (!fatal_.load()) flush(5000);
  rd_kafka_purge(rk_.get(), RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
  flush(1000);  // the purged records' reports
  stop_.store(true);
  poller_.join();
}

void Producer::dr_cb(rd_kafka_t*, const rd_kafka_message_t* msg, void* opaque) {
  auto* self = static_cast<Producer*>(opaque);
  self->on_delivery_(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(msg->_private)), msg->err);
}

void Producer::error_cb(rd_kafka_t* rk, int err, const char* reason, void* opaque) {
  auto* self = static_cast<Producer*>(opaque);
  if (err == RD_KAFKA_RESP_ERR__FATAL) {
    char buf[512];
    rd_kafka_fatal_error(rk, buf, sizeof buf);
    spdlog::error("DLQ producer fatal error: {}; it will be recreated", buf);
    self->fatal_.store(true);
    return;
  }
  const auto code = static_cast<rd_kafka_resp_err_t>(err);
  if (const auto refusal = login_refusal(code, reason, self->login_)) {
    spdlog::error("DLQ producer: the cluster refused this client: {} ({}); letters wait in the outbox", *refusal,
                  rd_kafka_err2name(code));
    return;
  }
  spdlog::warn("DLQ producer: {} ({})", reason, rd_kafka_err2name(code));
}

std::optional<TopicRefusal> Producer::topic_refused(const std::string& topic, int timeout_ms) {
  rd_kafka_topic_t* t = rd_kafka_topic_new(rk_.get(), topic.c_str(), nullptr);
  if (t == nullptr) return TopicRefusal{"topic " + topic + ": invalid topic name", false};
  const rd_kafka_metadata_t* md = nullptr;
  const rd_kafka_resp_err_t err = rd_kafka_metadata(rk_.get(), 0, t, &md, timeout_ms);
  rd_kafka_topic_destroy(t);
  if (err) return std::nullopt;  // the cluster did not answer: nothing known for good
  std::optional<TopicRefusal> refused;
  if (md->topic_cnt == 1) {
    const rd_kafka_resp_err_t e = md->topics[0].err;
    switch (e) {
      case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
      case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
      case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
        refused = TopicRefusal{std::string("topic ") + topic + ": " + rd_kafka_err2str(e),
                               e == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART};
        break;
      default: break;
    }
  }
  rd_kafka_metadata_destroy(md);
  return refused;
}

void Producer::produce(const OutRecord& rec) {
  rd_kafka_headers_t* hdrs = rd_kafka_headers_new(rec.headers.size());
  for (const auto& h : rec.headers)
    rd_kafka_header_add(hdrs, h.name.data(), static_cast<ssize_t>(h.name.size()), h.value ? h.value->data() : nullptr,
                        h.value ? static_cast<ssize_t>(h.value->size()) : 0);
  const void* key = rec.key ? rec.key->data() : nullptr;
  const size_t key_len = rec.key ? rec.key->size() : 0;
  void* value = rec.value ? const_cast<char*>(rec.value->data()) : nullptr;
  const size_t value_len = rec.value ? rec.value->size() : 0;
  rd_kafka_resp_err_t err = rd_kafka_producev(
      rk_.get(), RD_KAFKA_V_TOPIC(rec.topic.c_str()), RD_KAFKA_V_KEY(key, key_len), RD_KAFKA_V_VALUE(value, value_len),
      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(hdrs), RD_KAFKA_V_TIMESTAMP(rec.timestamp_ms),
      RD_KAFKA_V_OPAQUE(reinterpret_cast<void*>(static_cast<uintptr_t>(rec.id))), RD_KAFKA_V_END);
  if (err) {
    rd_kafka_headers_destroy(hdrs);  // ownership passes to librdkafka only on success
    on_delivery_(rec.id, err);
  }
}

void Producer::flush(int timeout_ms) { rd_kafka_flush(rk_.get(), timeout_ms); }

}  // namespace idemsink::kafka
