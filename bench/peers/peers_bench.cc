// peers_bench: idemsink side by side with what users would pick instead
// (bench/peers/README.md), in one run, on one machine, one Kafka cluster, one
// MariaDB and one fake inventory API:
//
//   inventory workload (seed 002: 16 partitions, polls of 200, 10% of the
//   orders sent again, some under another key; the RPC at mean 60 ms, P99
//   350 ms, 1% answered after 2 s)
//     idemsink                 the inventory plugin, remote_idempotent
//     spring-select-insert     @KafkaListener, seed 002's SELECT-then-INSERT
//     spring-claim             @KafkaListener, seed 003's claim row
//     parallel-consumer        Confluent Parallel Consumer, KEY order
//   ledger workload (a credit per order in MariaDB)
//     idemsink-ledger          the ledger plugin, local_tx
//     connect-jdbc             Kafka Connect with Debezium's JDBC sink (upsert)
//
// For each: records/s over the same records (from the first effect to the
// last commit), the end-to-end P99 from production to effect at a steady
// rate, and after kill -9 of its process at random moments (restarted each
// time): effects applied twice, orders committed without an effect or a dead
// letter, outcomes left unknown; MariaDB statements and CPU per record, the
// process's CPU per record and peak memory. `--smoke` runs a few hundred
// records per system (the harness's test in ctest).
#include <signal.h>

#include <boost/program_options.hpp>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "bench/bench_kafka.h"
#include "core/claim/claim_store.h"
#include "devkit/kafka_cluster.h"
#include "devkit/mariadb_server.h"
#include "devkit/services.h"
#include "bench/proc_stats.h"

using namespace idemsink;
using namespace idemsink::devkit;
using namespace std::chrono_literals;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace po = boost::program_options;

namespace {

constexpr int kPartitions = 16;
constexpr int kWarmUp = 1000000;  // the order of the record that warms a system up

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Options {
  int records = 20000;
  int kills = 5;
  int paced_rate = 100;  // records/s of the latency phase
  int paced_seconds = 20;
  std::set<std::string> systems;
  std::filesystem::path peers;  // bench/peers, with the peers built
};

// What a system is run with for one phase.
struct Run {
  std::string name;  // system-phase: topic, group and database
  std::string topic;
  config::DatabaseConfig db;
  const KafkaCluster& kafka;
  FakeServices& services;
  const ScratchDir& dir;
};

// One record of a workload: order i, 10% of them sent again (every tenth
// repeats the order of five records earlier, byte for byte, as a producer's
// re-send does; every other repeat under a key of its own, so it lands on
// another partition). Records are made in order of i: a repeat's original
// was made just before.
std::pair<std::string, std::string> record(const std::string& workload, int i, bool connect_envelope) {
  static std::map<int, int64_t> first_produced;  // order -> its production time
  const bool again = i % 10 == 9;
  const int order = again ? i - 5 : i;
  if (!again) first_produced[order] = now_ms();
  const std::string id = (workload == "ledger" ? "L-" : "O-") + std::to_string(order);
  const std::string key = again && (i / 10) % 2 ? "resent-" + std::to_string(i) : id;
  json v = workload == "ledger"
               ? json{{"order_id", id}, {"account", "A" + std::to_string(order % 97)}, {"amount", 12.34}}
               : json{{"order_id", id}, {"sku", "SKU-" + std::to_string(order % 50)}, {"qty", 1}};
  v["produced_ms"] = first_produced[order];
  if (!connect_envelope) return {key, v.dump()};
  // Kafka Connect's JSON converter with schemas: the sink needs the fields' types.
  const json schema = {{"type", "struct"},
                       {"optional", false},
                       {"fields",
                        {{{"field", "order_id"}, {"type", "string"}, {"optional", false}},
                         {{"field", "account"}, {"type", "string"}, {"optional", false}},
                         {{"field", "amount"}, {"type", "double"}, {"optional", false}},
                         {{"field", "produced_ms"}, {"type", "int64"}, {"optional", false}}}}};
  return {key, json{{"schema", schema}, {"payload", v}}.dump()};
}

struct System {
  std::string name;
  std::string workload;  // inventory or ledger
  std::string dlq;       // suffix of its dead-letter topic, "" without one
  std::function<std::unique_ptr<Process>(const Run&, int attempt)> start;
};

// ------------------------------------------------------------------ systems

std::unique_ptr<Process> java(const Run& r, int attempt, std::vector<std::string> args) {
  const char* home = std::getenv("JAVA_HOME");
  const std::string java = home && *home ? std::string(home) + "/bin/java" : "/usr/bin/java";
  args.insert(args.begin(), {java, "-Xmx512m", "-XX:+UseSerialGC"});
  return std::make_unique<Process>(args, r.dir / (r.name + "-" + std::to_string(attempt) + ".out"),
                                   r.dir / (r.name + "-" + std::to_string(attempt) + ".log"));
}

std::string jdbc_url(const config::DatabaseConfig& db) {
  return "jdbc:mariadb://127.0.0.1:" + std::to_string(db.port) + "/" + db.database;
}

std::unique_ptr<Process> idemsink_host(const Run& r, int attempt, const std::string& route) {
  const std::string plugin = std::string(IDEMSINK_PLUGIN_DIR) + "/libidemsink_" +
                             (route == "ledger" ? std::string("ledger") : std::string("inventory")) + ".so";
  std::string cfg = "[host]\nid = \"" + r.name + "\"\nmax_in_flight = 2000\n[kafka]\nbootstrap_servers = \"" +
                    r.kafka.bootstrap() + "\"\ngroup_id = \"" + r.name +
                    "\"\nmax_poll_records = 200\n[kafka.consumer]\n\"session.timeout.ms\" = \"6000\"\n"
                    "\"auto.offset.reset\" = \"earliest\"\n[kafka.properties]\n\"log_level\" = \"3\"\n"
                    "[database]\nsocket = \"" +
                    MariaDbServer::shared().socket() + "\"\ndatabase = \"" + r.db.database +
                    "\"\n[[route]]\nname = \"" + route + "\"\ntopic = \"" + r.topic + "\"\nplugin = \"" + plugin +
                    "\"\nkey = { from = \"json\", json = \"order_id\" }\n[route.dlq]\ntopic = \"" + r.topic +
                    ".dlq\"\n";
  if (route != "ledger")
    cfg += "[route.options]\nendpoint = \"" + r.services.url() + "\"\ntimeout = \"2s\"\nmax_connections = 1000\n";
  write_file(r.dir / (r.name + ".toml"), cfg);
  return std::make_unique<Process>(
      std::vector<std::string>{IDEMSINK_BINARY, "run", "--config", (r.dir / (r.name + ".toml")).string()},
      r.dir / (r.name + "-" + std::to_string(attempt) + ".out"),
      r.dir / (r.name + "-" + std::to_string(attempt) + ".log"));
}

std::unique_ptr<Process> spring(const Run& r, int attempt, const std::filesystem::path& peers,
                                const std::string& mode) {
  return java(
      r, attempt,
      {"-jar", (peers / "spring/target/spring-peer.jar").string(), "--peer.topic=" + r.topic, "--peer.mode=" + mode,
       "--peer.inventory=" + r.services.url(), "--spring.kafka.bootstrap-servers=" + r.kafka.bootstrap(),
       "--spring.kafka.consumer.group-id=" + r.name, "--spring.datasource.url=" + jdbc_url(r.db)});
}

std::unique_ptr<Process> parallel(const Run& r, int attempt, const std::filesystem::path& peers) {
  // Little's law at this machine's scale: ~8,000 records/s x 60 ms mean.
  return java(
      r, attempt,
      {"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-jar", (peers / "parallel/target/parallel-peer.jar").string(),
       r.kafka.bootstrap(), r.name, r.topic, jdbc_url(r.db), r.services.url(), "480"});
}

std::unique_ptr<Process> connect(const Run& r, int attempt, const std::filesystem::path& peers) {
  const auto dir = r.dir / ("connect-" + r.name);
  std::filesystem::create_directories(dir);
  write_file(dir / "worker.properties",
             "bootstrap.servers=" + r.kafka.bootstrap() +
                 "\nkey.converter=org.apache.kafka.connect.storage.StringConverter"
                 "\nvalue.converter=org.apache.kafka.connect.json.JsonConverter\nvalue.converter.schemas.enable=true"
                 "\noffset.storage.file.filename=" +
                 (dir / "offsets").string() + "\nplugin.path=" + (peers / "connect/target/plugins").string() +
                 "\nlisteners=http://127.0.0.1:" + std::to_string(free_port()) +
                 "\noffset.flush.interval.ms=1000\nconsumer.max.poll.records=200\nconsumer.session.timeout.ms="
                 "6000\nconsumer.auto.offset.reset=earliest"
                 "\nconsumer.group.id=" +
                 r.name + "\n");
  write_file(dir / "sink.properties",
             "name=" + r.name + "\nconnector.class=io.debezium.connector.jdbc.JdbcSinkConnector\ntasks.max=1\ntopics=" +
                 r.topic + "\nconnection.url=" + jdbc_url(r.db) +
                 "\nconnection.username=root\nconnection.password=\ninsert.mode=upsert\nprimary.key.mode=record_value"
                 "\nprimary.key.fields=order_id\nschema.evolution=none\ncollection.name.format=ledger_upserts"
                 "\nerrors.tolerance=all\nerrors.deadletterqueue.topic.name=" +
                 r.topic + ".dlq\nerrors.deadletterqueue.topic.replication.factor=3\n");
  std::string cp;
  for (const auto& f : std::filesystem::directory_iterator(peers / "connect/target/worker"))
    cp += (cp.empty() ? "" : ":") + f.path().string();
  return java(r, attempt,
              {"-cp", cp, "org.apache.kafka.connect.cli.ConnectStandalone", (dir / "worker.properties").string(),
               (dir / "sink.properties").string()});
}

// ------------------------------------------------------------------ what happened

// Distinct orders whose effect happened, and orders applied twice.
std::pair<std::set<std::string>, int> effects(const System& s, const Run& r) {
  std::set<std::string> applied;
  int twice = 0;
  if (s.workload == "inventory") {
    const json per_order = r.services.stats()["inventory"].value("per_order", json::object());
    for (const auto& [order, n] : per_order.items()) {
      applied.insert(order);
      twice += n.get<int>() > 1;
    }
    return {applied, twice};
  }
  db::Connection c(r.db);
  const std::string table = s.name == "connect-jdbc" ? "ledger_upserts" : "ledger_entries";
  const std::string key = s.name == "connect-jdbc" ? "order_id" : "biz_key";
  try {
    for (auto& row : c.query("SELECT " + key + ", COUNT(*) FROM " + table + " GROUP BY " + key)) {
      applied.insert(*row[0]);
      twice += std::stoi(*row[1]) > 1;
    }
  } catch (const db::DbError&) {
    // not made yet
  }
  return {applied, twice};
}

int64_t questions() {
  auto c = MariaDbServer::shared().connect("mysql");
  return std::stoll(*c->query("SHOW GLOBAL STATUS LIKE 'Questions'")[0][1]);
}

bool wait_committed(const Run& r, int records, std::chrono::seconds timeout, Process* p = nullptr) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (bench::committed_total(r.kafka.bootstrap(), r.name, r.topic, kPartitions) >= records) return true;
    if (p && !p->running()) return false;
    std::this_thread::sleep_for(200ms);
  }
  return false;
}

void stop(std::unique_ptr<Process>& p) {
  if (!p || !p->running()) return;
  p->signal(SIGTERM);
  if (!p->wait(30s)) p->kill_now();
}

struct Figures {
  double rate = 0, p99_ms = -1, stmts = 0, db_cpu_us = 0, cpu_us = 0, peak_mib = 0;
  int twice = -1, lost = -1, unknown = -1, dead = -1;
  std::string note;
  std::string latency;  // the latency run's distribution: samples, p50, p99, max
};

// "N orders: p50 A ms, p99 B ms, max C ms" of production-to-effect times.
std::string distribution(int64_t count, int64_t p50, int64_t p99, int64_t max) {
  if (count == 0) return "no samples";
  return std::to_string(count) + " orders: p50 " + std::to_string(p50) + " ms, p99 " + std::to_string(p99) +
         " ms, max " + std::to_string(max) + " ms";
}
std::string distribution(const std::vector<int64_t>& sorted) {
  if (sorted.empty()) return distribution(0, 0, 0, 0);
  auto at = [&](size_t permille) { return sorted[std::min(sorted.size() - 1, sorted.size() * permille / 1000)]; };
  return distribution(static_cast<int64_t>(sorted.size()), at(500), at(990), sorted.back());
}

// A system that exited on its own: the note, and its last words on stderr.
void note_exit(const System& s, Process& p, Figures& f) {
  if (p.running()) return;
  f.note += "the process exited; ";
  const auto tail = [](const std::string& text) { return text.substr(text.size() > 3000 ? text.size() - 3000 : 0); };
  std::cerr << "peers_bench: " << s.name << " exited; its output ends:\n" << tail(p.out()) << tail(p.err()) << "\n";
}

Run fresh(const std::string& name, const System& s, KafkaCluster& kafka, FakeServices& services,
          const ScratchDir& dir) {
  services.reset();
  Run r{name, name, MariaDbServer::shared().fresh_database(name), kafka, services, dir};
  kafka.create_topic(r.topic, kPartitions);
  if (!s.dlq.empty()) kafka.create_topic(r.topic + s.dlq, 1);
  if (s.name == "connect-jdbc") {
    // The sink's table (schema.evolution = none), with the time each row was written.
    db::Connection c(r.db);
    c.execute(
        "CREATE TABLE ledger_upserts (order_id VARCHAR(64) PRIMARY KEY, account VARCHAR(64) NOT NULL, amount "
        "DECIMAL(12,2) NOT NULL, produced_ms BIGINT NOT NULL, applied_at DATETIME(3) NOT NULL DEFAULT NOW(3) ON UPDATE "
        "NOW(3))");
  }
  return r;
}

// Starts the system on its empty topic and waits until it has committed one
// warm-up record (an order outside the workload): joined, connected, warm.
std::unique_ptr<Process> start_warm(const System& s, const Run& r, Figures& f) {
  auto p = s.start(r, 1);
  {
    bench::Producer warm(r.kafka.bootstrap());
    const auto [k, v] = record(s.workload, kWarmUp, s.name == "connect-jdbc");
    warm.send(r.topic, k, v);
  }
  if (!wait_committed(r, 1, 180s, p.get())) f.note += "did not start; ";
  note_exit(s, *p, f);
  r.services.reset();  // only the workload's records count
  return p;
}

// Records/s from the first record produced to the last committed, with the
// system joined and warm; and the costs per record over that time.
void throughput(const System& s, const Options& o, KafkaCluster& kafka, FakeServices& services, const ScratchDir& dir,
                Figures& f) {
  Run r = fresh(s.name + "_a", s, kafka, services, dir);
  auto p = start_warm(s, r, f);
  const auto t0 = Clock::now();
  const double cpu0 = bench::cpu_micros(p->pid()), db0 = bench::cpu_micros(MariaDbServer::shared().pid());
  const int64_t q0 = questions();
  bench::produce(kafka.bootstrap(), r.topic, o.records,
                 [&](int i) { return record(s.workload, i, s.name == "connect-jdbc"); });
  if (!wait_committed(r, o.records + 1, 600s, p.get())) f.note += "throughput run did not finish; ";
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  f.rate = o.records / seconds;
  note_exit(s, *p, f);
  f.cpu_us = (bench::cpu_micros(p->pid()) - cpu0) / o.records;
  f.db_cpu_us = (bench::cpu_micros(MariaDbServer::shared().pid()) - db0) / o.records;
  f.stmts = static_cast<double>(questions() - q0) / o.records;
  f.peak_mib = bench::peak_rss_mib(p->pid());
  stop(p);
}

// Production to effect at a steady rate, well below every system's capacity.
void latency(const System& s, const Options& o, KafkaCluster& kafka, FakeServices& services, const ScratchDir& dir,
             Figures& f) {
  Run r = fresh(s.name + "_b", s, kafka, services, dir);
  auto p = start_warm(s, r, f);
  const bool envelope = s.name == "connect-jdbc";
  const int n = o.paced_rate * o.paced_seconds;
  const int64_t paced_start_ms = now_ms();
  {
    bench::Producer paced(kafka.bootstrap());
    const auto start = Clock::now();
    for (int i = 0; i < n; ++i) {
      std::this_thread::sleep_until(start + std::chrono::microseconds(1000000LL * i / o.paced_rate));
      const auto [k, v] = record(s.workload, i, envelope);
      paced.send(r.topic, k, v);
    }
  }
  if (!wait_committed(r, n + 1, 300s, p.get())) f.note += "latency run did not finish; ";
  std::this_thread::sleep_for(500ms);
  const std::string warm_key = "L-" + std::to_string(kWarmUp);
  if (s.workload == "inventory") {
    // The fake API notes each order once, when a call first applies it,
    // before the call's own delay (its answer): production to effect.
    const json stats = r.services.stats()["inventory"]["effect_latency_ms"];
    f.p99_ms = stats.value("p99", -1);
    f.latency = distribution(stats.value("count", int64_t{0}), stats.value("p50", int64_t{-1}),
                             stats.value("p99", int64_t{-1}), stats.value("max", int64_t{-1}));
  } else {
    // The ledger's rows: written at (database time) minus produced at.
    db::Connection c(r.db);
    std::vector<int64_t> v;
    std::vector<std::pair<int64_t, int64_t>> slow;  // (produced at, latency) of those over 250 ms
    if (s.name == "connect-jdbc") {
      for (auto& row : c.query("SELECT CAST(UNIX_TIMESTAMP(applied_at) * 1000 AS SIGNED) - produced_ms, produced_ms "
                               "FROM ledger_upserts WHERE order_id <> '" +
                               warm_key + "'")) {
        v.push_back(std::stoll(*row[0]));
        if (v.back() > 250) slow.emplace_back(std::stoll(*row[1]), v.back());
      }
    } else {
      // The credit's row: its write time minus its order's first production (the record's Kafka timestamp).
      std::map<std::string, int64_t> produced;
      for (const auto& m : bench::read_all(kafka.bootstrap(), r.topic, kPartitions)) {
        const auto j = json::parse(m.value, nullptr, false);
        if (!j.is_object() || !j.contains("order_id")) continue;
        auto [it, fresh] = produced.emplace(j["order_id"].get<std::string>(), m.timestamp_ms);
        if (!fresh) it->second = std::min(it->second, m.timestamp_ms);
      }
      for (auto& row : c.query("SELECT biz_key, CAST(UNIX_TIMESTAMP(created_at) * 1000 AS SIGNED) FROM ledger_entries "
                               "WHERE biz_key <> '" +
                               warm_key + "'"))
        if (auto it = produced.find(*row[0]); it != produced.end()) {
          v.push_back(std::stoll(*row[1]) - it->second);
          if (v.back() > 250) slow.emplace_back(it->second, v.back());
        }
    }
    std::sort(v.begin(), v.end());
    if (!v.empty()) f.p99_ms = static_cast<double>(v[std::min(v.size() - 1, v.size() * 99 / 100)]);
    f.latency = distribution(v);
    // One stall shows as a run of late records produced within its length;
    // a slow path as late records spread over the whole run.
    if (!slow.empty()) {
      std::sort(slow.begin(), slow.end());
      f.latency += "; " + std::to_string(slow.size()) + " over 250 ms, produced " +
                   std::to_string((slow.front().first - paced_start_ms) / 1000.0).substr(0, 5) + " to " +
                   std::to_string((slow.back().first - paced_start_ms) / 1000.0).substr(0, 5) + " s into the run";
    }
  }
  note_exit(s, *p, f);
  stop(p);
}

// kill -9 at random moments, restarted each time; then every order counted.
void crashes(const System& s, const Options& o, KafkaCluster& kafka, FakeServices& services, const ScratchDir& dir,
             Figures& f) {
  Run r = fresh(s.name + "_c", s, kafka, services, dir);
  bench::produce(kafka.bootstrap(), r.topic, o.records,
                 [&](int i) { return record(s.workload, i, s.name == "connect-jdbc"); });
  std::mt19937 rng(7);
  const size_t orders = static_cast<size_t>(o.records - o.records / 10);  // every tenth repeats one
  auto p = s.start(r, 1);
  for (int k = 0; k < o.kills; ++k) {
    // A random moment once it is at work: after its first effects since
    // (re)starting, unless every order has its effect already.
    const size_t before = effects(s, r).first.size();
    const auto give_up = Clock::now() + 120s;
    for (size_t now = before; now <= before && now < orders && Clock::now() < give_up && p->running();
         now = effects(s, r).first.size())
      std::this_thread::sleep_for(50ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(500, 3000)(rng)));
    p->kill_now();
    p = s.start(r, k + 2);
  }
  if (!wait_committed(r, o.records, 600s, p.get())) f.note += "crash run did not commit everything; ";
  std::this_thread::sleep_for(2s);  // the last effects' answers
  const auto [applied, twice] = effects(s, r);
  f.twice = twice;
  std::set<std::string> dead;
  if (!s.dlq.empty())
    for (const auto& m : bench::read_all(kafka.bootstrap(), r.topic + s.dlq, 1)) {
      const auto j = json::parse(m.value, nullptr, false);
      const json& v = j.is_object() && j.contains("payload") ? j["payload"] : j;
      if (v.is_object() && v.contains("order_id")) dead.insert(v["order_id"].get<std::string>());
    }
  f.dead = static_cast<int>(dead.size());
  f.lost = 0;
  for (int i = 0; i < o.records; ++i) {
    if (i % 10 == 9) continue;
    const std::string id = (s.workload == "ledger" ? "L-" : "O-") + std::to_string(i);
    f.lost += !applied.count(id) && !dead.count(id);
  }
  f.unknown = 0;
  if (s.name.rfind("idemsink", 0) == 0) {
    db::Connection c(r.db);
    f.unknown = std::stoi(
        *c.query("SELECT COUNT(*) FROM idemsink_claim WHERE " + claim::sql_status_is(claim::Status::Unknown))[0][0]);
  }
  stop(p);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  po::options_description desc("peers_bench");
  desc.add_options()("help", "this help")("smoke", "a few hundred records per system: the harness's test")(
      "records", po::value<int>(&o.records), "records per run (20,000)")(
      "kills", po::value<int>(&o.kills), "kill -9 per crash run (5)")("systems", po::value<std::string>(),
                                                                      "comma-separated, default all")(
      "peers", po::value<std::string>()->default_value(IDEMSINK_PEERS_DIR), "bench/peers with the peers built");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  if (vm.count("smoke")) {
    o.records = 600;
    o.kills = 1;
    o.paced_rate = 50;
    o.paced_seconds = 4;
  }
  o.peers = vm["peers"].as<std::string>();
  std::set<std::string> all = {"idemsink",          "spring-select-insert", "spring-claim",
                               "parallel-consumer", "idemsink-ledger",      "connect-jdbc"};
  if (vm.count("systems")) {
    std::stringstream list(vm["systems"].as<std::string>());
    for (std::string s; std::getline(list, s, ',');) o.systems.insert(s);
  } else {
    o.systems = all;
  }
  ScratchDir dir("peers-bench");
  KafkaCluster kafka(KafkaCluster::Options{});
  FakeServices services(
      IDEMSINK_FAKE_SERVICES,
      {"--hold", "2100", "--faults", "inventory:latency_mean_ms=60,latency_p99_ms=350,timeout_after_apply=0.01"});
  const std::vector<System> systems = {
      {"idemsink", "inventory", ".dlq", [](const Run& r, int a) { return idemsink_host(r, a, "inventory"); }},
      {"spring-select-insert", "inventory", ".DLT",
       [&](const Run& r, int a) { return spring(r, a, o.peers, "select-insert"); }},
      {"spring-claim", "inventory", ".DLT", [&](const Run& r, int a) { return spring(r, a, o.peers, "claim"); }},
      {"parallel-consumer", "inventory", "", [&](const Run& r, int a) { return parallel(r, a, o.peers); }},
      {"idemsink-ledger", "ledger", ".dlq", [](const Run& r, int a) { return idemsink_host(r, a, "ledger"); }},
      {"connect-jdbc", "ledger", ".dlq", [&](const Run& r, int a) { return connect(r, a, o.peers); }},
  };
  std::map<std::string, Figures> figures;
  for (const auto& s : systems) {
    if (!o.systems.count(s.name)) continue;
    std::cerr << "peers_bench: " << s.name << "..." << std::endl;
    Figures& f = figures[s.name];
    throughput(s, o, kafka, services, dir, f);
    latency(s, o, kafka, services, dir, f);
    crashes(s, o, kafka, services, dir, f);
  }
  std::cout << "peers_bench: " << o.records << " records per run, " << o.kills
            << " kill -9 per crash run; one machine (" << std::thread::hardware_concurrency()
            << " cores shared by every process: Kafka's three brokers, MariaDB, the fake API and the system)\n";
  std::cout << std::left << std::setw(22) << "system" << std::right << std::setw(9) << "rec/s" << std::setw(8) << "x"
            << std::setw(10) << "P99 ms" << std::setw(8) << "twice" << std::setw(7) << "lost" << std::setw(7) << "dead"
            << std::setw(9) << "unknown" << std::setw(10) << "stmt/rec" << std::setw(11) << "db us/rec" << std::setw(11)
            << "cpu us/rec" << std::setw(9) << "peak MiB"
            << "\n";
  for (const auto& [name, f] : figures) {
    const std::string base =
        name.find("ledger") != std::string::npos || name == "connect-jdbc" ? "idemsink-ledger" : "idemsink";
    const double ratio = figures.count(base) && figures[base].rate > 0 ? f.rate / figures[base].rate : 0;
    std::cout << std::left << std::setw(22) << name << std::right << std::fixed << std::setprecision(0) << std::setw(9)
              << f.rate << std::setprecision(2) << std::setw(8) << ratio << std::setprecision(0) << std::setw(10)
              << f.p99_ms << std::setw(8) << f.twice << std::setw(7) << f.lost << std::setw(7) << f.dead << std::setw(9)
              << f.unknown << std::setprecision(2) << std::setw(10) << f.stmts << std::setprecision(0) << std::setw(11)
              << f.db_cpu_us << std::setw(11) << f.cpu_us << std::setw(9) << f.peak_mib
              << (f.note.empty() ? "" : "  (" + f.note + ")") << "\n";
  }
  std::cout << "production to effect at " << o.paced_rate << " records/s (the latency run):\n";
  for (const auto& [name, f] : figures) std::cout << "  " << std::left << std::setw(22) << name << f.latency << "\n";
  // The harness's verdict (the smoke test's): every system ran every phase
  // to its end, and idemsink kept its contract through the kills. The peers'
  // doubles and losses are findings, not failures.
  int failures = 0;
  for (const auto& [name, f] : figures) {
    if (!f.note.empty()) ++failures;
    // Nothing in these workloads deserves a dead letter.
    if (name.rfind("idemsink", 0) == 0 && (f.twice != 0 || f.lost != 0 || f.unknown != 0 || f.dead != 0)) {
      std::cerr << "peers_bench: " << name << " broke its contract\n";
      ++failures;
    }
  }
  return failures ? 1 : 0;
}
