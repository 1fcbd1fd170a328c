// The Kafka side of integration tests: `idemsink dev-kafka` (librdkafka's
// mock cluster) in its own process, reached over TCP, plus a producer and
// readers talking the real protocol to it.
#pragma once

#include <librdkafka/rdkafka.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "devkit/services.h"

namespace idemsink::test {

using namespace idemsink::devkit;

struct TestMessage {
  std::optional<std::string> key;
  std::optional<std::string> value;
  std::vector<std::pair<std::string, std::optional<std::string>>> headers;
  int32_t partition = -1;    // -1: by key hash
  int64_t timestamp_ms = 0;  // 0: now
};

struct ConsumedMessage {
  int32_t partition;
  int64_t offset;
  std::optional<std::string> key;
  std::optional<std::string> value;
  std::map<std::string, std::string> headers;  // last value wins
  std::vector<std::pair<std::string, std::string>> all_headers;
  int64_t timestamp_ms;
};

/// Orders K<from>..K<to - 1>, keyed by their id, value {"order_id":"K<i>"}.
std::vector<TestMessage> order_messages(int from, int to);

class MockKafka {
 public:
  explicit MockKafka(int brokers = 1);
  ~MockKafka();

  const std::string& bootstrap() const { return cluster_.bootstrap(); }
  /// Sends one control command; throws if the answer is not "ok".
  void command(const std::string& line) { cluster_.command(line); }
  void create_topic(const std::string& name, int partitions);

  /// Produces and waits until every message is acknowledged.
  void produce(const std::string& topic, const std::vector<TestMessage>& msgs);

  /// Reads a topic from the beginning up to its high watermarks.
  std::vector<ConsumedMessage> read_all(const std::string& topic, int partitions, int timeout_ms = 10000);

  /// Commits offsets for a group, as one of its members would have.
  void commit(const std::string& group, const std::string& topic, const std::map<int32_t, int64_t>& offsets);
  /// The group's committed offsets (-1001 when none).
  std::map<int32_t, int64_t> committed(const std::string& group, const std::string& topic, int partitions);
  std::map<int32_t, int64_t> high_watermarks(const std::string& topic, int partitions);

 private:
  DevKafka cluster_;
  rd_kafka_t* producer_ = nullptr;
};

/// Path of the idemsink binary under test.
std::string idemsink_binary();
/// Directory holding the test plugins.
std::string test_plugin_dir();
/// Path of a shipped plugin (waybill, inventory, sms, ledger).
std::string shipped_plugin(const std::string& name);
/// Path of the fake services binary.
std::string fake_services_binary();

}  // namespace idemsink::test
