#include "core/offline/reader.h"

#include <map>

#include "core/kafka/consumer.h"
#include "core/kafka/oauth.h"

namespace idemsink::offline {

kafka::HandlePtr consumer_handle(const config::Config& cfg, const std::string& group) {
  std::map<std::string, std::string> props{{"enable.auto.commit", "false"}};
  for (const auto& [k, v] : cfg.kafka.properties) props[k] = v;
  for (const auto& [k, v] : cfg.kafka.consumer_properties) props[k] = v;
  props["bootstrap.servers"] = cfg.kafka.bootstrap_servers;
  props["group.id"] = group;
  props["enable.auto.commit"] = "false";
  props["enable.partition.eof"] = "true";  // a partition whose committed offset follows a transaction marker ends there
  rd_kafka_conf_t* conf = kafka::make_conf(props);
  kafka::route_librdkafka_logs(conf);
  kafka::oauth::prepare(conf, cfg.kafka);
  char err[512];
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  if (!rk) {
    rd_kafka_conf_destroy(conf);
    throw kafka::KafkaError(std::string("offline consumer: ") + err);
  }
  kafka::HandlePtr handle(rk);
  kafka::oauth::attach(rk, cfg.kafka);
  return handle;
}

int partition_count(rd_kafka_t* rk, const std::string& topic) {
  const rd_kafka_metadata_t* md = nullptr;
  rd_kafka_topic_t* t = rd_kafka_topic_new(rk, topic.c_str(), nullptr);
  auto err = rd_kafka_metadata(rk, 0, t, &md, 10000);
  rd_kafka_topic_destroy(t);
  if (err) throw kafka::KafkaError("metadata of " + topic + ": " + rd_kafka_err2str(err));
  int n = md->topic_cnt == 1 && !md->topics[0].err ? md->topics[0].partition_cnt : 0;
  rd_kafka_metadata_destroy(md);
  return n;
}

}  // namespace idemsink::offline
