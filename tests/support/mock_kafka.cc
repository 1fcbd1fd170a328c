#include "tests/support/mock_kafka.h"

#include <atomic>
#include <stdexcept>

namespace idemsink::test {

std::string idemsink_binary() { return IDEMSINK_BINARY; }
std::string test_plugin_dir() { return IDEMSINK_TEST_PLUGIN_DIR; }
std::string shipped_plugin(const std::string& name) {
  return std::string(IDEMSINK_PLUGIN_DIR) + "/libidemsink_" + name + ".so";
}
std::string fake_services_binary() { return IDEMSINK_FAKE_SERVICES; }

MockKafka::MockKafka(int brokers) : cluster_(idemsink_binary(), {"--brokers", std::to_string(brokers)}) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap().c_str(), err, sizeof err);
  rd_kafka_conf_set(conf, "enable.idempotence", "true", err, sizeof err);
  rd_kafka_conf_set(conf, "linger.ms", "2", err, sizeof err);
  rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
  rd_kafka_conf_set_dr_msg_cb(conf, [](rd_kafka_t*, const rd_kafka_message_t* m, void*) {
    if (m->err)
      static_cast<std::atomic<int>*>(m->_private)->fetch_add(1000000);
    else
      static_cast<std::atomic<int>*>(m->_private)->fetch_add(1);
  });
  producer_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (producer_ == nullptr) throw std::runtime_error(std::string("test producer: ") + err);
}

MockKafka::~MockKafka() {
  if (producer_) rd_kafka_destroy(producer_);
}

void MockKafka::create_topic(const std::string& name, int partitions) {
  command("create_topic " + name + " " + std::to_string(partitions));
}

void MockKafka::produce(const std::string& topic, const std::vector<TestMessage>& msgs) {
  std::atomic<int> acks{0};
  for (const auto& m : msgs) {
    rd_kafka_headers_t* hdrs = rd_kafka_headers_new(m.headers.size());
    for (const auto& [k, v] : m.headers)
      rd_kafka_header_add(hdrs, k.data(), static_cast<ssize_t>(k.size()), v ? v->data() : nullptr,
                          v ? static_cast<ssize_t>(v->size()) : 0);
    const void* key = m.key ? m.key->data() : nullptr;
    const size_t key_len = m.key ? m.key->size() : 0;
    void* value = m.value ? const_cast<char*>(m.value->data()) : nullptr;
    const size_t value_len = m.value ? m.value->size() : 0;
    for (;;) {
      auto err = rd_kafka_producev(producer_, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_KEY(key, key_len),
                                   RD_KAFKA_V_VALUE(value, value_len), RD_KAFKA_V_PARTITION(m.partition),
                                   RD_KAFKA_V_TIMESTAMP(m.timestamp_ms), RD_KAFKA_V_HEADERS(hdrs),
                                   RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_OPAQUE(&acks), RD_KAFKA_V_END);
      if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
        rd_kafka_poll(producer_, 10);
        continue;
      }
      if (err) {
        rd_kafka_headers_destroy(hdrs);
        throw std::runtime_error(std::string("produce failed: ") + rd_kafka_err2str(err));
      }
      break;
    }
  }
  rd_kafka_flush(producer_, 30000);
  if (acks.load() != static_cast<int>(msgs.size()))
    throw std::runtime_error("produce: " + std::to_string(acks.load()) + " acks for " + std::to_string(msgs.size()) +
                             " messages (>=1000000 means failures)");
}

namespace {

rd_kafka_t* make_consumer(const std::string& bootstrap, const std::string& group) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap.c_str(), err, sizeof err);
  rd_kafka_conf_set(conf, "group.id", group.c_str(), err, sizeof err);
  rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof err);
  rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  if (rk == nullptr) throw std::runtime_error(std::string("test consumer: ") + err);
  return rk;
}

}  // namespace

std::map<int32_t, int64_t> MockKafka::high_watermarks(const std::string& topic, int partitions) {
  std::map<int32_t, int64_t> out;
  for (int p = 0; p < partitions; ++p) {
    int64_t lo = 0, hi = 0;
    if (auto err = rd_kafka_query_watermark_offsets(producer_, topic.c_str(), p, &lo, &hi, 10000))
      throw std::runtime_error(std::string("watermarks: ") + rd_kafka_err2str(err));
    out[p] = hi;
  }
  return out;
}

std::vector<ConsumedMessage> MockKafka::read_all(const std::string& topic, int partitions, int timeout_ms) {
  auto hi = high_watermarks(topic, partitions);
  rd_kafka_t* rk = make_consumer(bootstrap(), "idemsink-test-reader");
  rd_kafka_topic_partition_list_t* l = rd_kafka_topic_partition_list_new(partitions);
  for (int p = 0; p < partitions; ++p)
    if (hi[p] > 0) rd_kafka_topic_partition_list_add(l, topic.c_str(), p)->offset = RD_KAFKA_OFFSET_BEGINNING;
  rd_kafka_assign(rk, l);
  rd_kafka_topic_partition_list_destroy(l);
  std::vector<ConsumedMessage> out;
  std::map<int32_t, int64_t> next;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto done = [&] {
    for (int p = 0; p < partitions; ++p)
      if (hi[p] > 0 && next[p] < hi[p]) return false;
    return true;
  };
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    rd_kafka_message_t* m = rd_kafka_consumer_poll(rk, 100);
    if (m == nullptr) continue;
    if (!m->err) {
      ConsumedMessage c;
      c.partition = m->partition;
      c.offset = m->offset;
      if (m->key) c.key = std::string(static_cast<const char*>(m->key), m->key_len);
      if (m->payload) c.value = std::string(static_cast<const char*>(m->payload), m->len);
      rd_kafka_headers_t* hdrs = nullptr;
      if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        const char* name;
        const void* val;
        size_t size;
        for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &val, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; ++i) {
          std::string v = val ? std::string(static_cast<const char*>(val), size) : std::string();
          c.headers[name] = v;
          c.all_headers.emplace_back(name, v);
        }
      }
      rd_kafka_timestamp_type_t tt;
      c.timestamp_ms = rd_kafka_message_timestamp(m, &tt);
      next[m->partition] = m->offset + 1;
      out.push_back(std::move(c));
    }
    rd_kafka_message_destroy(m);
  }
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
  if (!done()) throw std::runtime_error("read_all(" + topic + "): did not reach the high watermarks in time");
  return out;
}

void MockKafka::commit(const std::string& group, const std::string& topic, const std::map<int32_t, int64_t>& offsets) {
  rd_kafka_t* rk = make_consumer(bootstrap(), group);
  rd_kafka_topic_partition_list_t* l = rd_kafka_topic_partition_list_new(static_cast<int>(offsets.size()));
  for (const auto& [p, o] : offsets) rd_kafka_topic_partition_list_add(l, topic.c_str(), p)->offset = o;
  auto err = rd_kafka_commit(rk, l, 0);
  rd_kafka_topic_partition_list_destroy(l);
  rd_kafka_destroy(rk);
  if (err) throw std::runtime_error(std::string("commit: ") + rd_kafka_err2str(err));
}

std::map<int32_t, int64_t> MockKafka::committed(const std::string& group, const std::string& topic, int partitions) {
  rd_kafka_t* rk = make_consumer(bootstrap(), group);
  rd_kafka_topic_partition_list_t* l = rd_kafka_topic_partition_list_new(partitions);
  for (int p = 0; p < partitions; ++p) rd_kafka_topic_partition_list_add(l, topic.c_str(), p);
  auto err = rd_kafka_committed(rk, l, 10000);
  std::map<int32_t, int64_t> out;
  for (int i = 0; i < l->cnt; ++i) out[l->elems[i].partition] = l->elems[i].offset;
  rd_kafka_topic_partition_list_destroy(l);
  rd_kafka_destroy(rk);
  if (err) throw std::runtime_error(std::string("committed: ") + rd_kafka_err2str(err));
  return out;
}

std::vector<TestMessage> order_messages(int from, int to) {
  std::vector<TestMessage> out;
  for (int i = from; i < to; ++i) {
    const std::string id = "K" + std::to_string(i);
    out.push_back({id, "{\"order_id\":\"" + id + "\"}"});
  }
  return out;
}

}  // namespace idemsink::test
