// The embedded Kafka as the benchmarks use it: produce fast, read the
// group's progress.
#pragma once

#include <librdkafka/rdkafka.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace idemsink::bench {

/// Produces `n` records, record i being {key, value} = record_of(i), and
/// waits until all are acknowledged.
inline void produce(const std::string& bootstrap, const std::string& topic, int n,
                    const std::function<std::pair<std::string, std::string>(int)>& record_of) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap.c_str(), err, sizeof err);
  rd_kafka_conf_set(conf, "linger.ms", "20", err, sizeof err);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  for (int i = 0; i < n; ++i) {
    auto [key, value] = record_of(i);
    while (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_KEY(key.data(), key.size()),
                             RD_KAFKA_V_VALUE(value.data(), value.size()), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                             RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
      rd_kafka_poll(rk, 10);
  }
  rd_kafka_flush(rk, 60000);
  rd_kafka_destroy(rk);
}

/// A producer for records sent one at a time (a paced stream).
class Producer {
 public:
  explicit Producer(const std::string& bootstrap) {
    char err[512];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap.c_str(), err, sizeof err);
    rd_kafka_conf_set(conf, "linger.ms", "0", err, sizeof err);
    rk_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  }
  ~Producer() {
    rd_kafka_flush(rk_, 60000);
    rd_kafka_destroy(rk_);
  }
  void send(const std::string& topic, std::string key, std::string value) {
    while (rd_kafka_producev(rk_, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_KEY(key.data(), key.size()),
                             RD_KAFKA_V_VALUE(value.data(), value.size()), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                             RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
      rd_kafka_poll(rk_, 10);
    rd_kafka_poll(rk_, 0);
  }

 private:
  rd_kafka_t* rk_;
};

/// One record as read back.
struct Read {
  int32_t partition;
  int64_t offset;
  int64_t timestamp_ms;
  std::string value;
};

/// Every record of the topic's partitions, from the beginning to the end.
inline std::vector<Read> read_all(const std::string& bootstrap, const std::string& topic, int partitions) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap.c_str(), err, sizeof err);
  rd_kafka_conf_set(conf, "enable.partition.eof", "true", err, sizeof err);
  rd_kafka_conf_set(conf, "group.id", "peers-bench-reader", err, sizeof err);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  rd_kafka_topic_partition_list_t* l = rd_kafka_topic_partition_list_new(partitions);
  for (int p = 0; p < partitions; ++p)
    rd_kafka_topic_partition_list_add(l, topic.c_str(), p)->offset = RD_KAFKA_OFFSET_BEGINNING;
  rd_kafka_assign(rk, l);
  rd_kafka_topic_partition_list_destroy(l);
  std::vector<Read> out;
  int at_end = 0;
  for (int idle = 0; at_end < partitions && idle < 100;) {
    rd_kafka_message_t* m = rd_kafka_consumer_poll(rk, 100);
    if (m == nullptr) {
      ++idle;
      continue;
    }
    if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
      ++at_end;
    } else if (!m->err) {
      out.push_back({m->partition, m->offset, rd_kafka_message_timestamp(m, nullptr),
                     std::string(static_cast<const char*>(m->payload), m->len)});
    }
    rd_kafka_message_destroy(m);
  }
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
  return out;
}

/// The group's committed offsets over the topic's partitions, summed.
inline int64_t committed_total(const std::string& bootstrap, const std::string& group, const std::string& topic,
                               int partitions) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap.c_str(), err, sizeof err);
  rd_kafka_conf_set(conf, "group.id", group.c_str(), err, sizeof err);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  rd_kafka_topic_partition_list_t* l = rd_kafka_topic_partition_list_new(partitions);
  for (int p = 0; p < partitions; ++p) rd_kafka_topic_partition_list_add(l, topic.c_str(), p);
  rd_kafka_committed(rk, l, 10000);
  int64_t total = 0;
  for (int i = 0; i < l->cnt; ++i) total += std::max<int64_t>(0, l->elems[i].offset);
  rd_kafka_topic_partition_list_destroy(l);
  rd_kafka_destroy(rk);
  return total;
}

}  // namespace idemsink::bench
