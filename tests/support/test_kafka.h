// The Kafka side of integration tests, on one of two backends chosen by
// IDEMSINK_TEST_KAFKA: `mock` (the default: `idemsink dev-kafka`, librdkafka's
// mock cluster in its own process, with request-level fault injection) or
// `real` (Apache Kafka brokers in KRaft mode, devkit/kafka_cluster.h: three
// nodes, replication 3, min.insync.replicas 2, unless
// IDEMSINK_TEST_KAFKA_NODES says otherwise). Both are reached over TCP with
// the real protocol; the producer and readers here are ordinary librdkafka
// clients. A test that injects faults only the mock has (`command`) states it
// with `mock_only` (a precondition): on the real backend it is skipped, not failed.
#pragma once

#include <librdkafka/rdkafka.h>

#include <boost/test/unit_test.hpp>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "devkit/kafka_cluster.h"
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

class TestKafka {
 public:
  enum class Backend { Mock, Real };
  /// IDEMSINK_TEST_KAFKA: "mock" (or unset) or "real".
  static Backend backend_from_env();

  /// `brokers` is the mock cluster's size; a real cluster has
  /// IDEMSINK_TEST_KAFKA_NODES nodes (3 when unset), at least `brokers`.
  explicit TestKafka(int brokers = 1);
  /// A real cluster the test made itself (other listeners, another Kafka
  /// version), shared with other scenarios; its PLAINTEXT listener serves
  /// the producer and readers here.
  explicit TestKafka(std::shared_ptr<devkit::KafkaCluster> cluster);
  ~TestKafka();

  Backend backend() const { return real_ ? Backend::Real : Backend::Mock; }
  bool mock() const { return !real_; }
  const std::string& bootstrap() const { return real_ ? real_->bootstrap() : mock_->bootstrap(); }
  /// On the mock: why its process ended (the end of its log), if it did.
  std::optional<std::string> mock_died();
  /// The real cluster (kill and restart nodes), or nullptr on the mock.
  devkit::KafkaCluster* real() { return real_.get(); }

  /// Sends one control command to the mock cluster; throws if the answer is
  /// not "ok", or on the real backend (guard the test case with mock_only).
  void command(const std::string& line);
  /// Creates a topic (on the real cluster: replicated, min.insync.replicas
  /// set, `configs` added) and waits until every partition has a leader.
  void create_topic(const std::string& name, int partitions, const std::map<std::string, std::string>& configs = {});
  /// Broker `id` (1-based) goes down / comes back: the mock's broker_down and
  /// broker_up, or SIGKILL and restart of a real node.
  void broker_down(int id);
  void broker_up(int id);

  /// Produces and waits until every message is acknowledged.
  void produce(const std::string& topic, const std::vector<TestMessage>& msgs);
  /// Produces in one transaction of a transactional producer (librdkafka's
  /// own), then commits or aborts it: aborted records must never be
  /// processed under read_committed, and both leave a control record.
  void produce_transaction(const std::string& topic, const std::vector<TestMessage>& msgs, bool commit);
  /// The leader broker of each partition of `topic` (-1: none).
  std::map<int32_t, int32_t> leaders(const std::string& topic);
  /// The oldest offset Kafka still has of a partition.
  int64_t low_watermark(const std::string& topic, int32_t partition);
  /// Replaces a real topic's dynamic configuration (AlterConfigs: settings
  /// not named go back to the broker's defaults).
  void set_topic_configs(const std::string& topic, const std::map<std::string, std::string>& configs);

  /// Reads a topic from the beginning up to its high watermarks.
  std::vector<ConsumedMessage> read_all(const std::string& topic, int partitions, int timeout_ms = 10000);
  /// The same, for some partitions only.
  std::vector<ConsumedMessage> read_partitions(const std::string& topic, const std::vector<int32_t>& partitions,
                                               int timeout_ms = 10000);

  /// Commits offsets for a group, as one of its members would have.
  void commit(const std::string& group, const std::string& topic, const std::map<int32_t, int64_t>& offsets);
  /// The group's committed offsets (-1001 when none).
  std::map<int32_t, int64_t> committed(const std::string& group, const std::string& topic, int partitions);
  std::map<int32_t, int64_t> high_watermarks(const std::string& topic, int partitions);
  std::map<int32_t, int64_t> high_watermarks(const std::string& topic, const std::vector<int32_t>& partitions);

 private:
  void make_producer();
  std::unique_ptr<DevKafka> mock_;
  std::shared_ptr<devkit::KafkaCluster> real_;
  rd_kafka_t* producer_ = nullptr;
};

/// A precondition for test cases that need a fault only the mock cluster can
/// inject: `BOOST_AUTO_TEST_CASE(name, *boost::unit_test::precondition(mock_only))`
/// skips them on the real backend.
boost::test_tools::assertion_result mock_only(boost::unit_test::test_unit_id);
/// The other way round: cases about what only a real cluster does.
boost::test_tools::assertion_result real_only(boost::unit_test::test_unit_id);

/// Path of the idemsink binary under test.
std::string idemsink_binary();
/// Directory holding the test plugins.
std::string test_plugin_dir();
/// Path of a shipped plugin (waybill, inventory, sms, ledger).
std::string shipped_plugin(const std::string& name);
/// Path of the fake services binary.
std::string fake_services_binary();

}  // namespace idemsink::test
