#include "core/kafka/client.h"

#include "core/common/util.h"

namespace idemsink::kafka {

rd_kafka_conf_t* make_conf(const std::map<std::string, std::string>& props) {
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  char err[512];
  for (const auto& [k, v] : props) {
    if (rd_kafka_conf_set(conf, k.c_str(), v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) {
      rd_kafka_conf_destroy(conf);
      if (!looks_secret(k)) throw KafkaError("kafka property " + k + "=" + v + ": " + err);
      // librdkafka may quote the rejected value in its reason.
      static constexpr std::string_view kHidden = "(value hidden)";
      std::string reason = err;
      if (!v.empty())
        for (size_t at = reason.find(v); at != std::string::npos; at = reason.find(v, at + kHidden.size()))
          reason.replace(at, v.size(), kHidden);
      throw KafkaError("kafka property " + k + " (value hidden): " + reason);
    }
  }
  return conf;
}

PartitionListPtr to_list(const std::vector<TopicPartition>& tps) {
  PartitionListPtr l(rd_kafka_topic_partition_list_new(static_cast<int>(tps.size())));
  for (const auto& tp : tps) rd_kafka_topic_partition_list_add(l.get(), tp.topic.c_str(), tp.partition);
  return l;
}

PartitionListPtr to_list(const std::vector<TopicPartitionOffset>& tpos) {
  PartitionListPtr l(rd_kafka_topic_partition_list_new(static_cast<int>(tpos.size())));
  for (const auto& t : tpos)
    rd_kafka_topic_partition_list_add(l.get(), t.tp.topic.c_str(), t.tp.partition)->offset = t.offset;
  return l;
}

std::vector<TopicPartition> from_list(const rd_kafka_topic_partition_list_t* l) {
  std::vector<TopicPartition> out;
  if (l == nullptr) return out;
  for (int i = 0; i < l->cnt; ++i) out.push_back({l->elems[i].topic, l->elems[i].partition});
  return out;
}

std::string describe(const std::vector<TopicPartition>& tps) {
  std::string s;
  for (const auto& tp : tps) s += (s.empty() ? "" : ", ") + tp.topic + "[" + std::to_string(tp.partition) + "]";
  return s.empty() ? "(none)" : s;
}

}  // namespace idemsink::kafka
