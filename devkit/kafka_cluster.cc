#include "devkit/kafka_cluster.h"

#include <librdkafka/rdkafka.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <random>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace idemsink::devkit {
namespace {

std::string random_base64_id() {
  static const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::random_device rd;
  unsigned char bytes[16];
  for (auto& b : bytes) b = static_cast<unsigned char>(rd() & 0xFF);
  std::string out;
  int bits = 0, value = 0;
  for (unsigned char b : bytes) {
    value = (value << 8) | b;
    bits += 8;
    while (bits >= 6) {
      out.push_back(alphabet[(value >> (bits - 6)) & 63]);
      bits -= 6;
    }
  }
  if (bits > 0) out.push_back(alphabet[(value << (6 - bits)) & 63]);
  return out;  // 22 characters
}

// A KRaft cluster id: 16 random bytes in URL-safe base64 without padding,
// never starting with '-' (kafka-storage would read it as an option: 1 run
// in 64 failed to format).
std::string random_cluster_id() {
  for (;;)
    if (auto id = random_base64_id(); id.front() != '-') return id;
}

bool port_accepts(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

constexpr const char* kLog4j =
    "status = warn\n"
    "appender.out.type = Console\n"
    "appender.out.name = out\n"
    "appender.out.layout.type = PatternLayout\n"
    "appender.out.layout.pattern = [%d{yyyy-MM-dd HH:mm:ss,SSS}] %p %m (%c)%n\n"
    "rootLogger.level = info\n"
    "rootLogger.appenderRef.out.ref = out\n"
    "logger.state.name = state.change.logger\n"
    "logger.state.level = warn\n"
    "logger.request.name = kafka.request.logger\n"
    "logger.request.level = warn\n";

}  // namespace

std::filesystem::path KafkaCluster::libs_dir() {
  if (const char* env = std::getenv("IDEMSINK_KAFKA_LIBS"); env && *env) return env;
#ifdef IDEMSINK_KAFKA_LIBS_DIR
  return IDEMSINK_KAFKA_LIBS_DIR;
#else
  return "build/kafka/libs";
#endif
}

std::filesystem::path KafkaCluster::libs_dir(const std::string& line) {
  std::string var = "IDEMSINK_KAFKA_LIBS_" + line;
  std::replace(var.begin(), var.end(), '.', '_');
  if (const char* env = std::getenv(var.c_str()); env && *env) return env;
  // build/kafka/libs -> build/kafka-3.9/libs
  return libs_dir().parent_path().parent_path() / ("kafka-" + line) / "libs";
}

std::string KafkaCluster::bootstrap(Listener listener) const {
  if (listener == Listener::Plaintext) return bootstrap_;
  std::string out;
  for (const auto& n : nodes_) {
    auto it = n.secure_ports.find(listener);
    if (it == n.secure_ports.end())
      throw std::invalid_argument("this cluster has no such listener (Options::security)");
    out += (out.empty() ? "" : ",") + std::string("127.0.0.1:") + std::to_string(it->second);
  }
  return out;
}

std::map<std::string, std::string> KafkaCluster::listener_properties(const Node& n) const {
  const std::string plain = "PLAINTEXT://127.0.0.1:" + std::to_string(n.client_port);
  const std::string controller = "CONTROLLER://127.0.0.1:" + std::to_string(n.controller_port);
  std::map<std::string, std::string> props{
      {"listeners", plain + "," + controller},
      {"advertised.listeners", plain},
      {"controller.listener.names", "CONTROLLER"},
      {"inter.broker.listener.name", "PLAINTEXT"},
      {"listener.security.protocol.map", "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"},
  };
  if (!opt_.security) return props;
  const Security& sec = *opt_.security;
  // Every node has the same listener names: a client is told the brokers'
  // endpoints of the listener it connected on.
  std::string secure;
  for (const auto& [name, listener] :
       {std::pair{"SSL", Listener::Ssl}, {"MTLS", Listener::Mtls}, {"SASL_SSL", Listener::SaslSsl}})
    secure += std::string(",") + name + "://127.0.0.1:" + std::to_string(n.secure_ports.at(listener));
  props["listeners"] += secure;
  props["advertised.listeners"] += secure;
  props["listener.security.protocol.map"] += ",SSL:SSL,MTLS:SSL,SASL_SSL:SASL_SSL";
  // PEM files by path: the key unencrypted PKCS#8 (no password may be set
  // for a PEM store); the truststore is what client certificates chain to.
  props["ssl.keystore.type"] = "PEM";
  props["ssl.keystore.location"] = sec.keystore.string();
  props["ssl.truststore.type"] = "PEM";
  props["ssl.truststore.location"] = sec.truststore.string();
  // Only the MTLS listener asks for a client certificate.
  props["listener.name.mtls.ssl.client.auth"] = "required";
  // One JAAS entry per enabled mechanism, or the broker does not start
  // (sasl.enabled.mechanisms would default to GSSAPI).
  props["sasl.enabled.mechanisms"] = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER";
  std::string plain_users;
  for (const auto& [name, password] : sec.plain_users) plain_users += " user_" + name + "=\"" + password + "\"";
  props["listener.name.sasl_ssl.plain.sasl.jaas.config"] =
      "org.apache.kafka.common.security.plain.PlainLoginModule required" + plain_users + ";";
  for (const char* mech : {"scram-sha-256", "scram-sha-512"})
    props[std::string("listener.name.sasl_ssl.") + mech + ".sasl.jaas.config"] =
        "org.apache.kafka.common.security.scram.ScramLoginModule required;";
  props["listener.name.sasl_ssl.oauthbearer.sasl.jaas.config"] =
      "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
      "unsecuredLoginStringClaim_sub=\"broker\"" +
      (sec.oauth_scope.empty() ? std::string() : " unsecuredValidatorRequiredScope=\"" + sec.oauth_scope + "\"") + ";";
  props["listener.name.sasl_ssl.oauthbearer.sasl.server.callback.handler.class"] =
      "org.apache.kafka.common.security.oauthbearer.internals.unsecured.OAuthBearerUnsecuredValidatorCallbackHandler";
  return props;
}

std::vector<std::string> KafkaCluster::java(const std::string& main_class, std::vector<std::string> args,
                                            int heap_mb) const {
  std::vector<std::string> argv{
      java_binary(), "-Xms" + std::to_string(heap_mb) + "m", "-Xmx" + std::to_string(heap_mb) + "m",
      // Two cores for everything: a small collector and a JIT that starts fast.
      "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData", "-Djava.awt.headless=true",
      "-Dlog4j2.configurationFile=" + (dir_ / "log4j2.properties").string(), "-cp", classpath_, main_class};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

KafkaCluster::KafkaCluster(Options opt) : opt_(std::move(opt)), dir_("kafka-cluster") {
  const auto libs = opt_.libs.empty() ? libs_dir() : opt_.libs;
  if (!std::filesystem::is_directory(libs) || std::filesystem::is_empty(libs))
    throw std::runtime_error("Kafka jars not found in " + libs.string() +
                             ": run scripts/fetch-kafka (scripts/install-deps does), or set IDEMSINK_KAFKA_LIBS");
  classpath_ = (libs / "*").string();
  write_file(dir_ / "log4j2.properties", kLog4j);
  if (opt_.nodes < 1) throw std::invalid_argument("a Kafka cluster needs at least one node");
  // A cluster that does not come up on its first ports (one taken by another
  // process between free_port() and the broker's bind, a node stalled on a
  // loaded machine) is formed once more on fresh ports before a test fails.
  for (int attempt = 1;; ++attempt) {
    try {
      form();
      return;
    } catch (const std::runtime_error& e) {
      if (attempt == 2) throw;
      std::cerr << "Kafka cluster did not come up, forming it again on fresh ports: " << e.what() << "\n";
      for (auto& n : nodes_)
        if (n.proc) n.proc->kill_now();
      nodes_.clear();
      admin_.reset();
    }
  }
}

void KafkaCluster::form() {
  for (int id = 1; id <= opt_.nodes; ++id) {
    nodes_.push_back(Node{id, free_port(), free_port(), dir_ / ("node" + std::to_string(id)), nullptr, {}});
    if (opt_.security)
      for (const auto l : {Listener::Ssl, Listener::Mtls, Listener::SaslSsl})
        nodes_.back().secure_ports[l] = free_port();
  }
  std::string voters, bootstrap;
  for (const auto& n : nodes_) {
    voters += (voters.empty() ? "" : ",") + std::to_string(n.id) + "@127.0.0.1:" + std::to_string(n.controller_port);
    bootstrap += (bootstrap.empty() ? "" : ",") + std::string("127.0.0.1:") + std::to_string(n.client_port);
  }
  bootstrap_ = bootstrap;
  const std::string cluster_id = random_cluster_id();
  const int rf = replication(), isr = min_insync();
  for (auto& n : nodes_) {
    std::filesystem::remove_all(n.dir);
    std::filesystem::create_directories(n.dir);
    std::map<std::string, std::string> props{
        {"process.roles", "broker,controller"},
        {"node.id", std::to_string(n.id)},
        {"controller.quorum.voters", voters},
        {"log.dirs", (n.dir / "data").string()},
        {"num.partitions", "1"},
        {"default.replication.factor", std::to_string(rf)},
        {"min.insync.replicas", std::to_string(isr)},
        {"offsets.topic.replication.factor", std::to_string(rf)},
        {"offsets.topic.num.partitions", "4"},
        {"transaction.state.log.replication.factor", std::to_string(rf)},
        {"transaction.state.log.min.isr", std::to_string(isr)},
        {"transaction.state.log.num.partitions", "4"},
        {"group.initial.rebalance.delay.ms", "0"},
        {"auto.create.topics.enable", "false"},
        {"unclean.leader.election.enable", "false"},
        // Kafka 4 refuses records dated more than an hour ahead at produce,
        // and retention deletes records dated before it at once: the tests
        // produce both to see the host refuse them. A topic of a test about
        // retention sets its own.
        {"log.message.timestamp.after.max.ms", "9223372036854775807"},
        {"log.retention.ms", "-1"},
        // Small segments and quick checks: retention and compaction act within seconds.
        {"log.segment.bytes", "1048576"},
        {"log.retention.check.interval.ms", "2000"},
        {"log.cleaner.backoff.ms", "1000"},
        {"log.initial.task.delay.ms", "1000"},
        // Threads and memory for two shared cores.
        {"num.network.threads", "2"},
        {"num.io.threads", "2"},
        {"background.threads", "2"},
        {"num.replica.fetchers", "1"},
        {"num.recovery.threads.per.data.dir", "1"},
        {"log.cleaner.threads", "1"},
        {"log.cleaner.dedupe.buffer.size", "8388608"},
        {"replica.lag.time.max.ms", "10000"},
        {"controller.quorum.election.timeout.ms", "1000"},
        {"controller.quorum.fetch.timeout.ms", "2000"},
        {"broker.heartbeat.interval.ms", "500"},
        {"broker.session.timeout.ms", "6000"},
    };
    for (const auto& [k, v] : listener_properties(n)) props[k] = v;
    for (const auto& [k, v] : opt_.broker_properties) props[k] = v;
    std::ostringstream os;
    for (const auto& [k, v] : props) os << k << "=" << v << "\n";
    write_file(n.dir / "server.properties", os.str());
    std::vector<std::string> format_args{"format", "-t", cluster_id, "-c", (n.dir / "server.properties").string()};
    // SCRAM users are made with the cluster's metadata (KIP-900), the same on
    // every node; each value is one argument (passwords without commas).
    if (opt_.security)
      for (const auto& [name, password] : opt_.security->scram_users)
        for (const char* mech : {"SCRAM-SHA-256", "SCRAM-SHA-512"})
          format_args.insert(format_args.end(),
                             {"--add-scram", std::string(mech) + "=[name=" + name + ",password=" + password + "]"});
    Process format(java("kafka.tools.StorageTool", format_args, 128), n.dir / "format.out", n.dir / "format.err");
    const auto rc = format.wait(std::chrono::seconds(120));
    if (!rc || *rc != 0)
      throw std::runtime_error("formatting Kafka node " + std::to_string(n.id) +
                               " failed: " + read_file(n.dir / "format.out") + read_file(n.dir / "format.err"));
  }
  for (auto& n : nodes_) start(n);
  for (auto& n : nodes_) wait_listening(n);
  // Every broker registered with the quorum: the cluster's metadata lists them all.
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap_.c_str(), err, sizeof err);
  rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (rk == nullptr) throw std::runtime_error(std::string("kafka cluster probe: ") + err);
  int brokers = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (std::chrono::steady_clock::now() < deadline) {
    const rd_kafka_metadata_t* md = nullptr;
    if (rd_kafka_metadata(rk, 1, nullptr, &md, 2000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
      brokers = md->broker_cnt;
      rd_kafka_metadata_destroy(md);
      if (brokers == nodes() && active_controller() != 0) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  rd_kafka_destroy(rk);
  if (brokers != nodes())
    throw std::runtime_error("Kafka cluster: " + std::to_string(brokers) + " of " + std::to_string(nodes()) +
                             " brokers registered within 90s\n" + nodes_report());
}

struct KafkaCluster::AdminClient {
  rd_kafka_t* rk = nullptr;
  ~AdminClient() {
    if (rk) rd_kafka_destroy(rk);
  }
};

void KafkaCluster::create_topic(const std::string& name, int partitions,
                                const std::map<std::string, std::string>& configs) {
  if (!admin_) {
    admin_ = std::make_unique<AdminClient>();
    char err[512];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap_.c_str(), err, sizeof err);
    rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
    admin_->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (admin_->rk == nullptr) throw std::runtime_error(std::string("kafka admin client: ") + err);
  }
  rd_kafka_t* rk = admin_->rk;
  rd_kafka_NewTopic_t* topic = rd_kafka_NewTopic_new(name.c_str(), partitions, replication(), nullptr, 0);
  std::map<std::string, std::string> all{{"min.insync.replicas", std::to_string(min_insync())}};
  for (const auto& [k, v] : configs) all[k] = v;
  for (const auto& [k, v] : all) rd_kafka_NewTopic_set_config(topic, k.c_str(), v.c_str());
  rd_kafka_queue_t* q = rd_kafka_queue_new(rk);
  rd_kafka_CreateTopics(rk, &topic, 1, nullptr, q);
  rd_kafka_event_t* ev = rd_kafka_queue_poll(q, 60000);
  std::string problem = ev == nullptr ? "no answer within 60s" : "";
  if (ev != nullptr) {
    if (rd_kafka_event_error(ev)) {
      problem = rd_kafka_event_error_string(ev);
    } else if (const rd_kafka_CreateTopics_result_t* res = rd_kafka_event_CreateTopics_result(ev)) {
      size_t n = 0;
      const rd_kafka_topic_result_t** results = rd_kafka_CreateTopics_result_topics(res, &n);
      for (size_t i = 0; i < n; ++i)
        if (rd_kafka_topic_result_error(results[i]))
          problem =
              rd_kafka_topic_result_error_string(results[i]) ? rd_kafka_topic_result_error_string(results[i]) : "error";
    }
    rd_kafka_event_destroy(ev);
  }
  rd_kafka_queue_destroy(q);
  rd_kafka_NewTopic_destroy(topic);
  if (!problem.empty()) throw std::runtime_error("create_topic " + name + ": " + problem);
  // Created is not yet served: wait until every partition has a leader.
  rd_kafka_topic_t* rkt = rd_kafka_topic_new(rk, name.c_str(), nullptr);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    const rd_kafka_metadata_t* md = nullptr;
    bool ready = false;
    if (rd_kafka_metadata(rk, 0, rkt, &md, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
      ready = md->topic_cnt == 1 && md->topics[0].err == 0 && md->topics[0].partition_cnt == partitions;
      for (int p = 0; ready && p < md->topics[0].partition_cnt; ++p)
        ready = md->topics[0].partitions[p].leader >= 0 && md->topics[0].partitions[p].err == 0;
      rd_kafka_metadata_destroy(md);
    }
    if (ready) break;
    if (std::chrono::steady_clock::now() > deadline) {
      rd_kafka_topic_destroy(rkt);
      throw std::runtime_error("create_topic " + name + ": partitions without a leader after 60s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  rd_kafka_topic_destroy(rkt);
}

KafkaCluster::~KafkaCluster() {
  admin_.reset();
  // No clean shutdown is owed to scratch data: SIGKILL, at once.
  for (auto& n : nodes_)
    if (n.proc) n.proc->kill_now();
}

void KafkaCluster::start(Node& n) {
  n.proc = std::make_unique<Process>(java("kafka.Kafka", {(n.dir / "server.properties").string()}, opt_.heap_mb),
                                     n.dir / "server.log", n.dir / "server.err");
}

void KafkaCluster::wait_listening(Node& n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (!port_accepts(n.client_port)) {
    if (!n.proc->running())
      throw std::runtime_error("Kafka node " + std::to_string(n.id) + " exited during start-up:\n" + log_tail(n.id) +
                               read_file(n.dir / "server.err"));
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("Kafka node " + std::to_string(n.id) + " did not listen within 90s:\n" + log_tail(n.id));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void KafkaCluster::kill(int id) { nodes_.at(static_cast<size_t>(id - 1)).proc->kill_now(); }

void KafkaCluster::restart(int id) {
  start_again(id);
  wait_listening(nodes_.at(static_cast<size_t>(id - 1)));
}

void KafkaCluster::start_again(int id) {
  Node& n = nodes_.at(static_cast<size_t>(id - 1));
  if (n.proc && n.proc->running()) n.proc->kill_now();
  start(n);
}

void KafkaCluster::wait_all_up(std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    bool all_up = true;
    for (auto& n : nodes_) {
      if (!n.proc || !n.proc->running()) {
        std::cerr << "Kafka node " << n.id << " is not running (its log: " << (n.dir / "server.log").string()
                  << "); starting it again\n";
        start(n);
      }
      all_up = all_up && port_accepts(n.client_port);
    }
    if (all_up) return;
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("Kafka nodes not all up within " + std::to_string(timeout.count()) + "s\n" +
                               nodes_report());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

bool KafkaCluster::running(int id) { return nodes_.at(static_cast<size_t>(id - 1)).proc->running(); }

int KafkaCluster::active_controller() const {
  // "[2026-12-01 17:20:05,123] INFO [RaftManager id=2] Completed transition to Leader(localVoterNode=..."
  static const std::regex leader(
      R"(^\[([0-9-]+ [0-9:,]+)\] INFO \[RaftManager id=([0-9]+)\] Completed transition to Leader\()");
  std::string latest;
  int id = 0;
  for (const auto& n : nodes_) {
    std::istringstream in(read_file(n.dir / "server.log"));
    std::string line;
    std::smatch m;
    while (std::getline(in, line))
      if (line.find("Completed transition to Leader(") != std::string::npos && std::regex_search(line, m, leader) &&
          m[1].str() >= latest) {
        latest = m[1].str();
        id = std::stoi(m[2].str());
      }
  }
  return id;
}

std::string KafkaCluster::nodes_report() const {
  std::string report;
  for (const auto& n : nodes_) {
    report += "node " + std::to_string(n.id) + " (client port " + std::to_string(n.client_port) + ", controller port " +
              std::to_string(n.controller_port) + ", " + (n.proc && n.proc->running() ? "running" : "not running") +
              "), its log:\n" + log_tail(n.id, 1500) + read_file(n.dir / "server.err") + "\n";
  }
  return report;
}

std::string KafkaCluster::log_tail(int id, size_t bytes) const {
  const std::string log = read_file(nodes_.at(static_cast<size_t>(id - 1)).dir / "server.log");
  return log.size() > bytes ? "...\n" + log.substr(log.size() - bytes) : log;
}

}  // namespace idemsink::devkit
