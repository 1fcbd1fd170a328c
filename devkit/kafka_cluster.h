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
#include <optional>
#include <string>
#include <vector>

#include "devkit/process.h"

namespace idemsink::devkit {

class KafkaCluster {
 public:
  /// Listeners with security on, beside PLAINTEXT (which stays the
  /// inter-broker listener and the one the harness's own clients use):
  ///   Ssl      TLS, the broker's certificate checked by the client
  ///   Mtls     TLS, and a client certificate the broker checks (required)
  ///   SaslSsl  SASL over TLS: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 and
  ///            OAUTHBEARER (Kafka's unsecured validator: "alg":"none"
  ///            tokens with sub, exp and, if set, the scope)
  struct Security {
    std::filesystem::path keystore;    ///< PEM: the broker's unencrypted PKCS#8 key, its certificate, the chain
    std::filesystem::path truststore;  ///< PEM: the CAs client certificates must chain to (Mtls)
    std::map<std::string, std::string> plain_users;  ///< SASL/PLAIN name -> password
    std::map<std::string, std::string> scram_users;  ///< SCRAM-SHA-256 and -512 users, made at format time
    std::string oauth_scope;                         ///< the scope an OAUTHBEARER token must carry ("" none)
  };
  enum class Listener { Plaintext, Ssl, Mtls, SaslSsl };

  struct Options {
    int nodes = 3;
    int heap_mb = 320;
    /// Broker settings added to every node's server.properties.
    std::map<std::string, std::string> broker_properties;
    /// The jars to run: another Kafka version's (libs_dir("3.9")); empty: libs_dir().
    std::filesystem::path libs;
    std::optional<Security> security;
  };

  /// Formats and starts the nodes; returns once every broker answers and a
  /// controller is elected. Throws std::runtime_error with the nodes' logs.
  explicit KafkaCluster(Options opt);
  ~KafkaCluster();
  KafkaCluster(const KafkaCluster&) = delete;
  KafkaCluster& operator=(const KafkaCluster&) = delete;

  /// "127.0.0.1:p1,127.0.0.1:p2,..." (the PLAINTEXT client listeners).
  const std::string& bootstrap() const { return bootstrap_; }
  /// The same for one listener (Options::security names the others).
  std::string bootstrap(Listener listener) const;
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
  /// Another Kafka line's jars, e.g. "3.9" (scripts/fetch-kafka --version
  /// 3.9.1 puts them in build/kafka-3.9/libs), or $IDEMSINK_KAFKA_LIBS_<3_9>.
  static std::filesystem::path libs_dir(const std::string& line);

 private:
  struct Node {
    int id;
    int client_port;
    int controller_port;
    std::filesystem::path dir;
    std::unique_ptr<Process> proc;
    std::map<Listener, int> secure_ports;  // with Options::security
  };
  /// The listener settings of one node (every listener, the security ones too).
  std::map<std::string, std::string> listener_properties(const Node& n) const;
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
