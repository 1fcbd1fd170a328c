#include "tests/support/test_kafka.h"

#include "core/kafka/watermarks.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <thread>

namespace idemsink::test {

std::string idemsink_binary() { return IDEMSINK_BINARY; }
std::string test_plugin_dir() { return IDEMSINK_TEST_PLUGIN_DIR; }
std::string shipped_plugin(const std::string& name) {
  return std::string(IDEMSINK_PLUGIN_DIR) + "/libidemsink_" + name + ".so";
}
std::string fake_services_binary() { return IDEMSINK_FAKE_SERVICES; }

TestKafka::Backend TestKafka::backend_from_env() {
  const char* v = std::getenv("IDEMSINK_TEST_KAFKA");
  const std::string b = v ? v : "";
  if (b.empty() || b == "mock") return Backend::Mock;
  if (b == "real") return Backend::Real;
  throw std::invalid_argument("IDEMSINK_TEST_KAFKA must be mock or real, not \"" + b + "\"");
}

namespace {

int real_nodes(int brokers) {
  const char* v = std::getenv("IDEMSINK_TEST_KAFKA_NODES");
  return std::max(brokers, v && *v ? std::atoi(v) : 3);
}

}  // namespace

TestKafka::TestKafka(int brokers) {
  if (backend_from_env() == Backend::Real) {
    real_ = std::make_shared<devkit::KafkaCluster>(devkit::KafkaCluster::Options{real_nodes(brokers)});
  } else {
    mock_ =
        std::make_unique<DevKafka>(idemsink_binary(), std::vector<std::string>{"--brokers", std::to_string(brokers)});
  }
  make_producer();
}

TestKafka::TestKafka(std::shared_ptr<devkit::KafkaCluster> cluster) : real_(std::move(cluster)) { make_producer(); }

void TestKafka::make_producer() {
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

TestKafka::~TestKafka() {
  if (producer_) rd_kafka_destroy(producer_);
}

void TestKafka::command(const std::string& line) {
  if (!mock_)
    throw std::logic_error("\"" + line + "\" is a mock-cluster command: give the test the mock_only precondition");
  mock_->command(line);
}

boost::test_tools::assertion_result mock_only(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result r(TestKafka::backend_from_env() == TestKafka::Backend::Mock);
  r.message() << "injects a fault only the mock cluster has";
  return r;
}

boost::test_tools::assertion_result real_only(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result r(TestKafka::backend_from_env() == TestKafka::Backend::Real);
  r.message() << "about what only a real cluster does (IDEMSINK_TEST_KAFKA=real)";
  return r;
}

std::optional<std::string> TestKafka::mock_died() {
  if (!mock_ || mock_->running()) return std::nullopt;
  const std::string log = mock_->log();
  const size_t at = log.find("Assertion");
  return log.substr(at != std::string::npos ? at : (log.size() > 600 ? log.size() - 600 : 0), 600);
}

void TestKafka::create_topic(const std::string& name, int partitions,
                             const std::map<std::string, std::string>& configs) {
  if (mock_) {
    command("create_topic " + name + " " + std::to_string(partitions));
    return;
  }
  real_->create_topic(name, partitions, configs);
}

void TestKafka::produce_transaction(const std::string& topic, const std::vector<TestMessage>& msgs, bool commit) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap().c_str(), err, sizeof err);
  rd_kafka_conf_set(conf, "transactional.id", ("idemsink-test-tx-" + topic).c_str(), err, sizeof err);
  rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
  rd_kafka_t* p = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (p == nullptr) throw std::runtime_error(std::string("transactional producer: ") + err);
  auto check = [&](rd_kafka_error_t* e, const char* what) {
    if (e == nullptr) return;
    const std::string msg = std::string(what) + ": " + rd_kafka_error_string(e);
    rd_kafka_error_destroy(e);
    rd_kafka_destroy(p);
    throw std::runtime_error(msg);
  };
  check(rd_kafka_init_transactions(p, 60000), "init_transactions");
  check(rd_kafka_begin_transaction(p), "begin_transaction");
  for (const auto& m : msgs) {
    const void* key = m.key ? m.key->data() : nullptr;
    const size_t key_len = m.key ? m.key->size() : 0;
    void* value = m.value ? const_cast<char*>(m.value->data()) : nullptr;
    const size_t value_len = m.value ? m.value->size() : 0;
    rd_kafka_resp_err_t e;
    while ((e = rd_kafka_producev(p, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_KEY(key, key_len),
                                  RD_KAFKA_V_VALUE(value, value_len), RD_KAFKA_V_PARTITION(m.partition),
                                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END)) ==
           RD_KAFKA_RESP_ERR__QUEUE_FULL)
      rd_kafka_poll(p, 10);
    if (e) {
      rd_kafka_destroy(p);
      throw std::runtime_error(std::string("transactional produce: ") + rd_kafka_err2str(e));
    }
  }
  check(commit ? rd_kafka_commit_transaction(p, 60000) : rd_kafka_abort_transaction(p, 60000),
        commit ? "commit_transaction" : "abort_transaction");
  rd_kafka_destroy(p);
}

std::map<int32_t, int32_t> TestKafka::leaders(const std::string& topic) {
  std::map<int32_t, int32_t> out;
  rd_kafka_topic_t* rkt = rd_kafka_topic_new(producer_, topic.c_str(), nullptr);
  const rd_kafka_metadata_t* md = nullptr;
  const auto err = rd_kafka_metadata(producer_, 0, rkt, &md, 10000);
  rd_kafka_topic_destroy(rkt);
  if (err) throw std::runtime_error(std::string("metadata of ") + topic + ": " + rd_kafka_err2str(err));
  if (md->topic_cnt == 1)
    for (int i = 0; i < md->topics[0].partition_cnt; ++i)
      out[md->topics[0].partitions[i].id] = md->topics[0].partitions[i].leader;
  rd_kafka_metadata_destroy(md);
  return out;
}

int64_t TestKafka::low_watermark(const std::string& topic, int32_t partition) {
  kafka::Watermarks w;
  if (auto err = kafka::query_watermarks(producer_, topic, partition, 10000, w))
    throw std::runtime_error(std::string("watermarks: ") + rd_kafka_err2str(err));
  return w.low;
}

void TestKafka::set_topic_configs(const std::string& topic, const std::map<std::string, std::string>& configs) {
  if (mock_) throw std::logic_error("set_topic_configs needs the real cluster");
  rd_kafka_ConfigResource_t* res = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, topic.c_str());
  for (const auto& [k, v] : configs) rd_kafka_ConfigResource_set_config(res, k.c_str(), v.c_str());
  rd_kafka_queue_t* q = rd_kafka_queue_new(producer_);
  rd_kafka_AlterConfigs(producer_, &res, 1, nullptr, q);
  rd_kafka_event_t* ev = rd_kafka_queue_poll(q, 60000);
  std::string problem = ev == nullptr ? "no answer within 60s" : "";
  if (ev != nullptr && rd_kafka_event_error(ev)) problem = rd_kafka_event_error_string(ev);
  if (ev != nullptr) rd_kafka_event_destroy(ev);
  rd_kafka_queue_destroy(q);
  rd_kafka_ConfigResource_destroy(res);
  if (!problem.empty()) throw std::runtime_error("set_topic_configs " + topic + ": " + problem);
}

void TestKafka::broker_down(int id) {
  if (mock_) {
    command("broker_down " + std::to_string(id));
  } else {
    real_->kill(id);
  }
}

void TestKafka::broker_up(int id) {
  if (mock_) {
    command("broker_up " + std::to_string(id));
  } else {
    real_->restart(id);
  }
}

void TestKafka::produce(const std::string& topic, const std::vector<TestMessage>& msgs) {
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

std::map<int32_t, int64_t> TestKafka::high_watermarks(const std::string& topic, int partitions) {
  std::vector<int32_t> all;
  for (int p = 0; p < partitions; ++p) all.push_back(p);
  return high_watermarks(topic, all);
}

std::map<int32_t, int64_t> TestKafka::high_watermarks(const std::string& topic,
                                                      const std::vector<int32_t>& partitions) {
  std::map<int32_t, int64_t> out;
  for (int32_t p : partitions) {
    kafka::Watermarks w;
    if (auto err = kafka::query_watermarks(producer_, topic, p, 10000, w))
      throw std::runtime_error(std::string("watermarks: ") + rd_kafka_err2str(err));
    out[p] = w.high;
  }
  return out;
}

std::vector<ConsumedMessage> TestKafka::read_all(const std::string& topic, int partitions, int timeout_ms) {
  std::vector<int32_t> all;
  for (int p = 0; p < partitions; ++p) all.push_back(p);
  return read_partitions(topic, all, timeout_ms);
}

std::vector<ConsumedMessage> TestKafka::read_partitions(const std::string& topic,
                                                        const std::vector<int32_t>& partitions, int timeout_ms) {
  // A client of its own, with fresh metadata: a partition's leader may have
  // moved since the test's producer looked.
  rd_kafka_t* rk = make_consumer(bootstrap(), "idemsink-test-reader");
  std::map<int32_t, int64_t> hi;
  for (int32_t p : partitions) {
    kafka::Watermarks w;
    const auto err = kafka::query_watermarks(rk, topic, p, 10000, w);
    hi[p] = w.high;
    if (err) {
      rd_kafka_destroy(rk);
      throw std::runtime_error(std::string("watermarks: ") + rd_kafka_err2str(err));
    }
  }
  rd_kafka_topic_partition_list_t* l = rd_kafka_topic_partition_list_new(static_cast<int>(partitions.size()));
  for (int32_t p : partitions)
    if (hi[p] > 0) rd_kafka_topic_partition_list_add(l, topic.c_str(), p)->offset = RD_KAFKA_OFFSET_BEGINNING;
  rd_kafka_assign(rk, l);
  rd_kafka_topic_partition_list_destroy(l);
  std::vector<ConsumedMessage> out;
  std::map<int32_t, int64_t> next;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto done = [&] {
    for (int32_t p : partitions)
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

void TestKafka::commit(const std::string& group, const std::string& topic, const std::map<int32_t, int64_t>& offsets) {
  rd_kafka_t* rk = make_consumer(bootstrap(), group);
  rd_kafka_topic_partition_list_t* l = rd_kafka_topic_partition_list_new(static_cast<int>(offsets.size()));
  for (const auto& [p, o] : offsets) rd_kafka_topic_partition_list_add(l, topic.c_str(), p)->offset = o;
  auto err = rd_kafka_commit(rk, l, 0);
  rd_kafka_topic_partition_list_destroy(l);
  rd_kafka_destroy(rk);
  if (err) throw std::runtime_error(std::string("commit: ") + rd_kafka_err2str(err));
}

std::map<int32_t, int64_t> TestKafka::committed(const std::string& group, const std::string& topic, int partitions) {
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
