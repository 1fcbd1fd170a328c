// idemsink-demo: the main job, end to end on one machine.
//
// Starts a scratch MariaDB, the embedded Kafka (`idemsink dev-kafka`; with
// `--kafka real`, three Apache Kafka brokers in KRaft mode) and
// the fake external services with the seed's latencies and faults, runs the
// host on conf/demo.toml, and feeds it an order stream: every order's events
// (order.created, then order.paid) on one topic, which three routes read,
// each in a group of its own, taking order.paid only: a waybill, an
// inventory reservation and an SMS per paid order. A ledger credit per order
// comes on a topic of its own. With upstream duplicates and a few poison
// records. Halfway through, the host is
// SIGKILLed, as a real outage would, and started again. At the end the
// external services' own counters, the database and `idemsink audit` must
// agree: every effect applied once (SMS at most once), nothing lost.
// With `--format avro` the values are Avro in the schema registry's wire
// format (Confluent's own serializer, a registry of the demo's own) and every
// route reads them as Avro.
// Exits 1 if any invariant fails.
#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <boost/program_options.hpp>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include <toml++/toml.h>

#include "core/db/connection.h"
#include "devkit/mariadb_server.h"
#include "devkit/kafka_cluster.h"
#include "devkit/schema_registry.h"
#include "devkit/services.h"

namespace po = boost::program_options;
using namespace idemsink;
using namespace idemsink::devkit;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

struct Topic {
  std::string name;
  int partitions;
};
const std::vector<Topic> kTopics{{"orders", 16}, {"payments.credit", 8}};

struct Route {
  std::string name;
  std::string topic;
  int partitions;
  std::string group;  // conf/demo.toml's group_id
};
const std::vector<Route> kRoutes{{"waybill", "orders", 16, "idemsink-demo"},
                                 {"inventory", "orders", 16, "idemsink-demo.inventory"},
                                 {"sms", "orders", 16, "idemsink-demo.sms"},
                                 {"ledger", "payments.credit", 8, "idemsink-demo"}};

std::string thousands(int64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > (n < 0 ? 1 : 0); i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

double secs_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

class Producer {
 public:
  explicit Producer(const std::string& bootstrap) {
    char err[512];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap.c_str(), err, sizeof err);
    rd_kafka_conf_set(conf, "enable.idempotence", "true", err, sizeof err);
    rd_kafka_conf_set(conf, "linger.ms", "5", err, sizeof err);
    rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
    rk_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!rk_) throw std::runtime_error(std::string("demo producer: ") + err);
  }
  ~Producer() {
    rd_kafka_flush(rk_, 30000);
    rd_kafka_destroy(rk_);
  }
  void send(const std::string& topic, const std::string& key, const std::string& value) {
    for (;;) {
      auto err = rd_kafka_producev(rk_, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_KEY(key.data(), key.size()),
                                   RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()),
                                   RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
      if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
        if (err) throw std::runtime_error(std::string("produce: ") + rd_kafka_err2str(err));
        break;
      }
      rd_kafka_poll(rk_, 10);
    }
    rd_kafka_poll(rk_, 0);
  }
  void flush() { rd_kafka_flush(rk_, 60000); }
  rd_kafka_t* handle() { return rk_; }

 private:
  rd_kafka_t* rk_ = nullptr;
};

// Each route's progress: its group's committed offsets against the high
// watermarks.
class Offsets {
 public:
  Offsets(const std::string& bootstrap, rd_kafka_t* watermarks) : wm_(watermarks) {
    for (const auto& r : kRoutes) {
      if (groups_.count(r.group)) continue;
      char err[512];
      rd_kafka_conf_t* conf = rd_kafka_conf_new();
      rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap.c_str(), err, sizeof err);
      rd_kafka_conf_set(conf, "group.id", r.group.c_str(), err, sizeof err);
      rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
      groups_[r.group] = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    }
  }
  ~Offsets() {
    for (auto& [group, rk] : groups_) rd_kafka_destroy(rk);
  }
  // Records not yet committed, over all routes.
  int64_t behind() {
    int64_t total = 0;
    for (const auto& r : kRoutes) {
      rd_kafka_topic_partition_list_t* l = rd_kafka_topic_partition_list_new(r.partitions);
      for (int p = 0; p < r.partitions; ++p) rd_kafka_topic_partition_list_add(l, r.topic.c_str(), p);
      rd_kafka_committed(groups_.at(r.group), l, 10000);
      for (int i = 0; i < l->cnt; ++i) {
        int64_t lo = 0, hi = 0;
        rd_kafka_query_watermark_offsets(wm_, r.topic.c_str(), l->elems[i].partition, &lo, &hi, 10000);
        total += hi - std::max<int64_t>(lo, l->elems[i].offset);
      }
      rd_kafka_topic_partition_list_destroy(l);
    }
    return total;
  }

 private:
  std::map<std::string, rd_kafka_t*> groups_;
  rd_kafka_t* wm_;
};

// Per route, the records `idemsink audit` found skipped ([route.when]).
std::map<std::string, int64_t> skipped_by_route(const std::string& audit_out) {
  std::map<std::string, int64_t> out;
  std::istringstream in(audit_out);
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(": ");
    const auto at = line.find(" skipped (not taken by the route)");
    if (colon == std::string::npos || at == std::string::npos) continue;
    const auto from = line.rfind(", ", at);
    out[line.substr(0, colon)] += std::stoll(line.substr(from + 2, at - from - 2));
  }
  return out;
}

struct Status {
  bool up = false;
  int64_t partitions = 0;
  int64_t consumed = 0, done = 0, duplicates = 0, dead = 0, unknown = 0, retries = 0, in_flight = 0;
};

Status host_status(int admin_port) {
  Status s;
  try {
    auto [code, body] = http_request(admin_port, "GET", "/status");
    if (code != 200) return s;
    auto j = nlohmann::json::parse(body);
    s.up = true;
    s.partitions = j["assigned_partitions"].get<int64_t>();
    for (const auto& [name, r] : j["routes"].items()) {
      s.consumed += r["consumed"].get<int64_t>();
      s.done += r["done"].get<int64_t>();
      s.duplicates += r["duplicates"].get<int64_t>();
      s.dead += r["dead"].get<int64_t>();
      s.unknown += r["unknown"].get<int64_t>();
      s.retries += r["retries"].get<int64_t>();
      s.in_flight += r["in_flight"].get<int64_t>();
    }
  } catch (const std::exception&) {
  }
  return s;
}

// An order's records: order.created and order.paid on orders, a credit on
// payments.credit, as JSON.
std::array<std::pair<std::string, std::string>, 3> order_records(int i) {
  char id[32];
  std::snprintf(id, sizeof id, "ORD-20261129-%06d", i);
  nlohmann::json order{{"order_id", id},
                       {"account", "acct-" + std::to_string(i % 500)},
                       {"amount", 10 + (i * 37 % 49000) / 100.0},
                       {"phone", "+86138" + std::to_string(10000000 + i)},
                       {"sku", "SKU-" + std::to_string(i % 300)},
                       {"qty", 1 + i % 3}};
  nlohmann::json created = order, paid = order;
  created["type"] = "order.created";
  paid["type"] = "order.paid";
  return {{{"orders", created.dump()}, {"orders", paid.dump()}, {"payments.credit", order.dump()}}};
}

// --format avro: every order's records encoded up front by Confluent's
// serializer (its schema registered under each topic's subject, as producers
// do), in order_records()'s order.
std::vector<std::array<std::string, 3>> encode_avro(int orders, const std::string& registry,
                                                    const std::filesystem::path& dir) {
  std::vector<std::array<std::string, 3>> out(static_cast<size_t>(orders));
  for (size_t k = 0; k < 3; ++k) {
    const std::string topic = k < 2 ? "orders" : "payments.credit";
    std::string in;
    for (int i = 0; i < orders; ++i) in += order_records(i)[k].second + "\n";
    const auto input = dir / ("avro-" + std::to_string(k) + ".jsonl"),
               output = dir / ("avro-" + std::to_string(k) + ".hex");
    write_file(input, in);
    const std::string cmd = std::string(IDEMSINK_FORMAT_PYTHON) + " " + IDEMSINK_ENCODE_RECORDS + " --registry " +
                            registry + " --topic " + topic + " --format avro --schema " + IDEMSINK_DEMO_AVRO_SCHEMA +
                            " < " + input.string() + " > " + output.string() + " 2> " + output.string() + ".err";
    if (std::system(cmd.c_str()) != 0)
      throw std::runtime_error("encoding the orders as Avro failed (scripts/format-tools installs the encoder): " +
                               read_file(output.string() + ".err"));
    std::istringstream lines(read_file(output));
    size_t i = 0;
    for (std::string line; std::getline(lines, line) && i < out.size(); ++i) out[i][k] = unhex(line);
    if (i != out.size())
      throw std::runtime_error("the Avro encoder wrote " + std::to_string(i) + " of " + std::to_string(out.size()) +
                               " records");
  }
  return out;
}

// The host config with every route reading Avro values from `registry`.
std::string avro_config(const std::string& config, const std::string& registry) {
  toml::table doc = toml::parse_file(config);
  doc.insert_or_assign("schema_registry", toml::table{{"url", registry}});
  if (auto* routes = doc["route"].as_array())
    for (auto& route : *routes)
      if (auto* t = route.as_table()) t->insert_or_assign("value", toml::table{{"format", "avro"}});
  std::ostringstream out;
  out << "# conf/demo.toml with every route reading Avro values (idemsink-demo --format avro)\n" << doc << "\n";
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description desc("idemsink-demo options");
  desc.add_options()("help,h", "show this help")("orders", po::value<int>()->default_value(20000), "orders to feed")(
      "rate", po::value<int>()->default_value(4000), "records per second fed to Kafka")(
      "duplicates", po::value<double>()->default_value(0.2), "share of records an upstream publishes twice")(
      "poison", po::value<double>()->default_value(0.002), "share of malformed records")(
      "kill-at", po::value<double>()->default_value(0.5), "SIGKILL the host after this share of the feed (0 = never)")(
      "seed", po::value<uint64_t>()->default_value(2026), "random seed")(
      "config", po::value<std::string>()->default_value(IDEMSINK_DEMO_CONFIG), "host config")(
      "kafka", po::value<std::string>()->default_value("mock"),
      "mock: librdkafka's mock cluster (embedded, starts at once); real: Apache Kafka, 3 brokers in KRaft mode "
      "(scripts/fetch-kafka's jars, Java 17)")(
      "format", po::value<std::string>()->default_value("json"),
      "json: the values as JSON; avro: Avro in the schema registry's wire format, read through a schema registry "
      "(Apicurio, scripts/format-tools)")("keep", "keep the scratch directories (logs, data) after the run");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc;
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "idemsink-demo: " << e.what() << "\n";
    return 2;
  }
  if (vm.count("keep")) ::setenv("IDEMSINK_KEEP_SCRATCH", "1", 1);
  const int orders = vm["orders"].as<int>();
  const bool tty = ::isatty(1);
  const auto t0 = Clock::now();
  auto say = [&](const std::string& line) {
    std::cout << (tty ? "\r\033[K" : "") << "[" << std::fixed << std::setprecision(1) << std::setw(5) << secs_since(t0)
              << "s] " << line << std::endl;
  };

  try {
    ScratchDir dir("demo");
    say("starting a scratch MariaDB, the embedded Kafka and the fake services...");
    MariaDbServer& mariadb = MariaDbServer::shared();
    mariadb.fresh_database("idemsink_demo");
    const std::string backend = vm["kafka"].as<std::string>();
    if (backend != "mock" && backend != "real") throw std::invalid_argument("--kafka takes mock or real");
    std::unique_ptr<DevKafka> mock;
    std::unique_ptr<KafkaCluster> real;
    if (backend == "real") {
      say("starting Apache Kafka: 3 brokers in KRaft mode, replication 3, min.insync.replicas 2...");
      real = std::make_unique<KafkaCluster>(KafkaCluster::Options{});
      for (const auto& t : kTopics) {
        real->create_topic(t.name, t.partitions);
        real->create_topic(t.name + ".dlq", 1);
      }
    } else {
      std::vector<std::string> topics_args;
      for (const auto& t : kTopics) {
        topics_args.insert(topics_args.end(), {"--topic", t.name + ":" + std::to_string(t.partitions)});
        topics_args.insert(topics_args.end(), {"--topic", t.name + ".dlq:1"});
      }
      mock = std::make_unique<DevKafka>(IDEMSINK_BINARY, topics_args);
    }
    const std::string bootstrap = real ? real->bootstrap() : mock->bootstrap();
    // Seed 002's remote calls: P99 350 ms, with timeouts after applying,
    // 5xx before applying and business rejections.
    const std::string remote =
        "latency_mean_ms=60,latency_p99_ms=350,timeout_after_apply=0.02,error_5xx=0.02,reject_4xx=0.005";
    FakeServices services(IDEMSINK_FAKE_SERVICES, {"--hold", "2500", "--faults", "waybill:" + remote, "--faults",
                                                   "inventory:" + remote, "--faults", "sms:" + remote});
    say("MariaDB on 127.0.0.1:" + std::to_string(mariadb.port()) + ", Kafka at " + bootstrap + ", services at " +
        services.url());

    const int admin_port = free_port();
    const std::map<std::string, std::string> env{{"IDEMSINK_DEMO_KAFKA", bootstrap},
                                                 {"IDEMSINK_DEMO_DB_SOCKET", mariadb.socket()},
                                                 {"IDEMSINK_DEMO_SERVICES", services.url()},
                                                 {"IDEMSINK_DEMO_ADMIN", "127.0.0.1:" + std::to_string(admin_port)},
                                                 {"IDEMSINK_PLUGIN_DIR", IDEMSINK_PLUGIN_DIR}};
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);  // for `idemsink audit` below
    const std::string format = vm["format"].as<std::string>();
    if (format != "json" && format != "avro") throw std::invalid_argument("--format takes json or avro");
    std::string config = vm["config"].as<std::string>();
    std::unique_ptr<SchemaRegistry> registry;
    std::vector<std::array<std::string, 3>> avro;
    if (format == "avro") {
      say("starting a schema registry (Apicurio) and encoding the orders as Avro with Confluent's serializer...");
      registry = std::make_unique<SchemaRegistry>(dir.path());
      avro = encode_avro(orders, registry->url(), dir.path());
      const auto derived = dir / "demo-avro.toml";
      write_file(derived, avro_config(config, registry->url()));
      config = derived.string();
      say("registry at " + registry->url() + ", host config " + config);
    }
    int run = 0;
    auto start_host = [&] {
      ++run;
      return std::make_unique<Process>(std::vector<std::string>{IDEMSINK_BINARY, "run", "--config", config},
                                       dir / ("host-" + std::to_string(run) + ".out"),
                                       dir / ("host-" + std::to_string(run) + ".log"), env);
    };
    auto host = start_host();
    say("host started (admin on 127.0.0.1:" + std::to_string(admin_port) + ", log " + (dir / "host-1.log").string() +
        ")");

    // The feed runs on its own thread while this one reports progress.
    Producer producer(bootstrap);
    std::atomic<int64_t> produced{0}, poison_sent{0};
    std::atomic<bool> feed_done{false};
    // Per order: order.created and order.paid on orders, a credit on payments.credit.
    const int64_t expected_total = static_cast<int64_t>(orders * 3 * (1 + vm["duplicates"].as<double>()));
    std::thread feed([&] {
      std::mt19937_64 rng(vm["seed"].as<uint64_t>());
      std::uniform_real_distribution<double> u(0, 1);
      std::vector<std::pair<std::string, std::pair<std::string, std::string>>> later;  // upstream re-publishes
      const auto start = Clock::now();
      for (int i = 0; i < orders; ++i) {
        auto records = order_records(i);
        const std::string id = nlohmann::json::parse(records[2].second)["order_id"];
        if (!avro.empty())
          for (size_t k = 0; k < 3; ++k) records[k].second = avro[static_cast<size_t>(i)][k];
        // The order's events keyed by the order: they stay in order.
        for (const auto& [topic, value] : records) {
          producer.send(topic, id, value);
          ++produced;
          if (u(rng) < vm["duplicates"].as<double>()) later.push_back({topic, {id, value}});
          if (u(rng) < vm["poison"].as<double>()) {
            // Not JSON, nor in the registry's wire format (each route whose
            // condition reads the value dead-letters it), or a paid order
            // without its id (no biz_key; in JSON only).
            producer.send(topic, id,
                          u(rng) < 0.5 || !avro.empty() ? "{\"order_id\": \"" + id
                                                        : "{\"type\":\"order.paid\",\"note\":\"no order id\"}");
            ++produced;
            ++poison_sent;
          }
        }
        // Duplicates arrive a little later, out of order, as upstream retries do.
        while (later.size() > 50 || (i == orders - 1 && !later.empty())) {
          const size_t k = std::uniform_int_distribution<size_t>(0, later.size() - 1)(rng);
          producer.send(later[k].first, later[k].second.first, later[k].second.second);
          ++produced;
          later.erase(later.begin() + static_cast<long>(k));
        }
        const double should = static_cast<double>(produced.load()) / vm["rate"].as<int>();
        const double ahead = should - secs_since(start);
        if (ahead > 0) std::this_thread::sleep_for(std::chrono::duration<double>(ahead));
      }
      producer.flush();
      feed_done = true;
    });

    Offsets offsets(bootstrap, producer.handle());
    const double kill_at = vm["kill-at"].as<double>();
    bool killed = false;
    int64_t last_done = 0;
    auto last_t = Clock::now();
    Status carried;  // counters of the killed run, so the progress line keeps counting
    for (;;) {
      std::this_thread::sleep_for(tty ? 500ms : 2s);
      Status s = host_status(admin_port);
      const int64_t done = carried.done + s.done + carried.duplicates + s.duplicates;
      const double rate = (done - last_done) / std::max(1e-3, secs_since(last_t));
      last_done = done;
      last_t = Clock::now();
      std::ostringstream line;
      line << "fed " << thousands(produced) << "/~" << thousands(expected_total) << " | "
           << (!s.up               ? "host starting | "
               : s.partitions == 0 ? "joining the group | "
                                   : "")
           << "done " << thousands(carried.done + s.done) << " | duplicates caught "
           << thousands(carried.duplicates + s.duplicates) << " | retries " << thousands(carried.retries + s.retries)
           << " | DLQ " << thousands(carried.dead + s.dead) << " | unknown " << thousands(carried.unknown + s.unknown)
           << " | in flight " << thousands(s.in_flight) << " | " << thousands(static_cast<int64_t>(rate)) << " rec/s";
      if (tty) {
        std::cout << "\r\033[K[" << std::fixed << std::setprecision(1) << std::setw(5) << secs_since(t0) << "s] "
                  << line.str() << std::flush;
      } else {
        say(line.str());
      }
      if (!killed && kill_at > 0 && produced >= static_cast<int64_t>(kill_at * static_cast<double>(expected_total)) &&
          s.done > 0) {
        carried.done += s.done;
        carried.duplicates += s.duplicates;
        carried.retries += s.retries;
        carried.dead += s.dead;
        carried.unknown += s.unknown;
        host->kill_now();
        killed = true;
        say("SIGKILL: the host dies mid-run with " + thousands(s.in_flight) +
            " calls in flight (a real outage: no drain, no commit)");
        host = start_host();
        say("host restarted with the same host id: it takes over its own claims at once");
      }
      if (!host->running()) throw std::runtime_error("the host exited unexpectedly:\n" + host->err());
      if (feed_done && offsets.behind() == 0) break;
    }
    feed.join();
    say("all " + thousands(produced) + " records committed; letting the reconciler settle unknown SMS...");
    auto conn = std::make_unique<db::Connection>(mariadb.database("idemsink_demo"));
    auto scalar = [&](const std::string& sql) { return std::stoll(*conn->query(sql).at(0).at(0)); };
    const auto settle_deadline = Clock::now() + 60s;
    while (scalar("SELECT COUNT(*) FROM idemsink_claim WHERE status = 4") > 0 && Clock::now() < settle_deadline)
      std::this_thread::sleep_for(500ms);
    host->signal(SIGTERM);
    const auto rc = host->wait(60s);
    say(std::string("host stopped on SIGTERM, exit code ") + (rc ? std::to_string(*rc) : "none (killed)"));

    // The verdict: the services' own counters, the database, the audit.
    auto stats = services.stats();
    bool ok = rc && *rc == 0;
    Process audit({IDEMSINK_BINARY, "audit", "--config", config}, dir / "audit.out", dir / "audit.err", env);
    const auto audit_rc = audit.wait(120s);
    const std::string audit_out = audit.out();
    const auto skipped = skipped_by_route(audit_out);
    std::cout << "\n"
              << std::left << std::setw(10) << "route" << std::right << std::setw(9) << "records" << std::setw(9)
              << "skipped" << std::setw(9) << "orders" << std::setw(9) << "done" << std::setw(12) << "duplicates"
              << std::setw(7) << "DLQ" << std::setw(9) << "unknown" << std::setw(17) << "effects applied"
              << std::setw(16) << "double-applied"
              << "\n";
    int64_t doubled_total = 0;
    for (const auto& r : kRoutes) {
      const std::string ns = "namespace = " + db::Connection::hex(r.name);
      int64_t hi_total = 0;
      for (int p = 0; p < r.partitions; ++p) {
        int64_t lo = 0, hi = 0;
        rd_kafka_query_watermark_offsets(producer.handle(), r.topic.c_str(), p, &lo, &hi, 10000);
        hi_total += hi;
      }
      const int64_t keys = scalar("SELECT COUNT(*) FROM idemsink_claim WHERE " + ns);
      const int64_t done = scalar("SELECT COUNT(*) FROM idemsink_claim WHERE status = 2 AND " + ns);
      const int64_t unknown = scalar("SELECT COUNT(*) FROM idemsink_claim WHERE status = 4 AND " + ns);
      const int64_t dlq = scalar("SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE reason <> 'retry' AND route = " +
                                 db::Connection::hex(r.name));
      const int64_t refused = scalar("SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE idem_token IS NULL AND route = " +
                                     db::Connection::hex(r.name));
      int64_t applied = 0, doubled = 0;
      if (r.name == "ledger") {
        applied = scalar("SELECT COUNT(*) FROM ledger_entries");
        doubled =
            scalar("SELECT COUNT(*) FROM (SELECT biz_key FROM ledger_entries GROUP BY biz_key HAVING COUNT(*) > 1) d");
      } else {
        applied = stats[r.name]["applied"].get<int64_t>();
        doubled = stats[r.name]["double_applied"].get<int64_t>();
      }
      doubled_total += doubled;
      const int64_t not_taken = skipped.count(r.name) ? skipped.at(r.name) : 0;
      const int64_t duplicates = hi_total - not_taken - keys - refused;
      if (applied != done || doubled != 0 || unknown != 0) ok = false;
      std::cout << std::left << std::setw(10) << r.name << std::right << std::setw(9) << thousands(hi_total)
                << std::setw(9) << thousands(not_taken) << std::setw(9) << thousands(keys) << std::setw(9)
                << thousands(done) << std::setw(12) << thousands(duplicates) << std::setw(7) << thousands(dlq)
                << std::setw(9) << thousands(unknown) << std::setw(17) << thousands(applied) << std::setw(16)
                << thousands(doubled) << "\n";
    }
    std::cout << "\n(records: the route's topic, which waybill, inventory and sms share; skipped: events not theirs "
                 "(order.created), per the audit. Effects applied: the fake services' own counters; the ledger's rows "
                 "in ledger_entries. DLQ: business rejections, poison records (per route that read them) and SMS "
                 "parked as unknown before reconciliation.)\n";
    std::cout << "\ndouble-applied effects: " << doubled_total << "\n";
    if (doubled_total != 0) ok = false;

    const auto last = audit_out.rfind("audit ");
    std::cout << (last == std::string::npos ? "audit: no output\n" + audit.err() : audit_out.substr(last));
    if (!audit_rc || *audit_rc != 0) ok = false;
    std::cout << (ok ? "\nall invariants hold" : "\nINVARIANT VIOLATED") << " (" << std::fixed << std::setprecision(0)
              << secs_since(t0) << "s)\n";
    if (!ok) {
      std::cout << "logs: " << dir.path().string() << " (kept)\n";
      ::setenv("IDEMSINK_KEEP_SCRATCH", "1", 1);
    }
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "\nidemsink-demo: " << e.what() << "\n";
    return 1;
  }
}
