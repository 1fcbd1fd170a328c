// librdkafka handles shared by the consumer, the DLQ producer and tests.
#pragma once

#include <librdkafka/rdkafka.h>

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace idemsink::kafka {

class KafkaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct MessageDeleter {
  void operator()(rd_kafka_message_t* m) const { rd_kafka_message_destroy(m); }
};
using MessagePtr = std::unique_ptr<rd_kafka_message_t, MessageDeleter>;

struct HandleDeleter {
  void operator()(rd_kafka_t* rk) const { rd_kafka_destroy(rk); }
};
using HandlePtr = std::unique_ptr<rd_kafka_t, HandleDeleter>;

struct PartitionListDeleter {
  void operator()(rd_kafka_topic_partition_list_t* l) const { rd_kafka_topic_partition_list_destroy(l); }
};
using PartitionListPtr = std::unique_ptr<rd_kafka_topic_partition_list_t, PartitionListDeleter>;

struct TopicPartition {
  std::string topic;
  int32_t partition = 0;
  auto operator<=>(const TopicPartition&) const = default;
};

struct TopicPartitionOffset {
  TopicPartition tp;
  int64_t offset = 0;  // next offset to consume
};

/// Builds an rd_kafka_conf_t from properties; throws KafkaError naming the
/// property that librdkafka rejected.
rd_kafka_conf_t* make_conf(const std::map<std::string, std::string>& props);

PartitionListPtr to_list(const std::vector<TopicPartition>& tps);
PartitionListPtr to_list(const std::vector<TopicPartitionOffset>& tpos);
std::vector<TopicPartition> from_list(const rd_kafka_topic_partition_list_t* l);

std::string describe(const std::vector<TopicPartition>& tps);

}  // namespace idemsink::kafka
