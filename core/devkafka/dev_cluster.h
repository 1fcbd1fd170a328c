// `idemsink dev-kafka`: librdkafka's mock cluster as a process of its own.
//
// It speaks the real Kafka protocol on loopback (consumer groups, offset
// commits, idempotent produce), so the host and the tests reach it over TCP
// exactly as they would reach a real cluster, and killing the host loses no
// topic data. A line-based control channel on another loopback port creates
// topics and injects faults:
//
//   create_topic NAME PARTITIONS     broker_down ID       broker_up ID
//   rtt ID MS                        push_errors APIKEY ERR [ERR...]
//   clear_errors APIKEY              topic_error NAME ERR
//   partition_leader TOPIC P BROKER  (BROKER -1: the partition has no leader)
//   control_records TOPIC P COUNT    ping      shutdown
//
// ERR is a librdkafka error name (e.g. NOT_LEADER_FOR_PARTITION, _TRANSPORT)
// or number; APIKEY is a protocol request number (0 = Produce, 8 =
// OffsetCommit) or name (Produce, Fetch, OffsetCommit, JoinGroup, ...).
// Each command is answered by one line: "ok" or "error <reason>".
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace idemsink::devkafka {

struct DevClusterOptions {
  int brokers = 1;
  std::vector<std::pair<std::string, int>> topics;  // name, partitions
  int control_port = 0;                             // 0 = any free port
};

/// Runs until SIGINT/SIGTERM or the `shutdown` command. Prints one line,
/// "bootstrap=HOST:PORT,... control=127.0.0.1:PORT", to stdout once ready.
int run_dev_cluster(const DevClusterOptions& opt);

}  // namespace idemsink::devkafka
