// Apache Kafka for tests, benchmarks and the demo: brokers in KRaft combined
// mode (every node a broker and a controller), run from the jars that
// `scripts/fetch-kafka` (called by scripts/install-deps) put in
// build/kafka/libs, each in a scratch directory on loopback ports, stopped
// with their parent process.
//
// Sized for a 2-core machine: a small heap, 1 MiB segments (retention and
// compaction act within seconds where a test asks for it), no fsync beyond
// the OS's. Three nodes give seed 002's shape: every topic replicated three
// times with min.insync.replicas 2, so one node may die without refusing
// acks=all writes; one node is the fast mode. A node can be SIGKILLed and
// started again in place, with its data.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "devkit/process.h"

namespace idemsink::devkit {

class KafkaCluster {
 public:
  struct Options {
    int nodes = 3;
    int heap_mb = 320;
    /// Broker settings added to every node's server.properties.
    std::map<std::string, std::string> broker_properties;
  };

  /// Formats and starts the nodes; returns once every broker answers and a
  /// controller is elected. Throws std::runtime_error with the nodes' logs.
  explicit KafkaCluster(Options opt);
  ~KafkaCluster();
  KafkaCluster(const KafkaCluster&) = delete;
  KafkaCluster& operator=(const KafkaCluster&) = delete;

  /// "127.0.0.1:p1,127.0.0.1:p2,..." (the client listeners).
  const std::string& bootstrap() const { return bootstrap_; }
  int nodes() const { return static_cast<int>(nodes_.size()); }
  /// The replication factor and min.insync.replicas topics get here.
  int replication() const { return nodes() >= 3 ? 3 : nodes(); }
  int min_insync() const { return nodes() >= 3 ? 2 : 1; }

  /// Creates a topic replicated replication() times with min.insync.replicas
  /// min_insync() (and `configs`), and waits until every partition has a leader.
  void create_topic(const std::string& name, int partitions, const std::map<std::string, std::string>& configs = {});

  /// SIGKILL node `id` (1-based); its data stays.
  void kill(int id);
  /// Starts a killed or stopped node again on its ports and data; returns
  /// once its client port accepts connections.
  void restart(int id);
  /// Starts it again and returns at once. A KRaft node opens its client port
  /// only after it has caught up with a quorum of controllers: with two of
  /// three nodes down, the first one back waits for the second, so bringing
  /// several back must not wait on each in turn.
  void start_again(int id);
  /// Returns once every node's client port accepts connections. A node that
  /// exited meanwhile is started again, as a service manager would: a node
  /// that finds no quorum within initial.broker.registration.timeout.ms
  /// (60 s) exits. Throws std::runtime_error with every node's state after
  /// `timeout`.
  void wait_all_up(std::chrono::seconds timeout);
  bool running(int id);
  /// The node the KRaft quorum last named its leader (the active
  /// controller), read from the nodes' logs; 0 if none has been named yet.
  int active_controller() const;
  /// The last lines of node `id`'s log, for failure messages.
  std::string log_tail(int id, size_t bytes = 4000) const;

  /// Where the Kafka jars are: $IDEMSINK_KAFKA_LIBS, or build/kafka/libs
  /// beside the binaries (the path given at configure time).
  static std::filesystem::path libs_dir();

 private:
  struct Node {
    int id;
    int client_port;
    int controller_port;
    std::filesystem::path dir;
    std::unique_ptr<Process> proc;
  };
  /// Picks the ports, formats and starts the nodes, waits until every broker
  /// is registered; throws std::runtime_error with nodes_report().
  void form();
  /// Every node's ports, whether it runs, and the end of its log.
  std::string nodes_report() const;
  void start(Node& n);
  void wait_listening(Node& n);
  std::vector<std::string> java(const std::string& main_class, std::vector<std::string> args, int heap_mb) const;

  Options opt_;
  struct AdminClient;
  std::unique_ptr<AdminClient> admin_;  // for create_topic, made on first use
  ScratchDir dir_;
  std::string classpath_;
  std::string bootstrap_;
  std::vector<Node> nodes_;
};

}  // namespace idemsink::devkit
