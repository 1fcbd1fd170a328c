// Reading Kafka from the offline commands (audit, offset moves): a consumer
// of the host's cluster settings that assigns partitions itself and never
// joins or commits for its group (it only reads the group's commits).
#pragma once

#include <string>

#include "core/config/config.h"
#include "core/kafka/client.h"

namespace idemsink::offline {

/// A consumer handle for `group`, never subscribed; throws kafka::KafkaError.
kafka::HandlePtr consumer_handle(const config::Config& cfg, const std::string& group);
/// Partitions of `topic` (0 when it does not exist); throws kafka::KafkaError.
int partition_count(rd_kafka_t* rk, const std::string& topic);

}  // namespace idemsink::offline
