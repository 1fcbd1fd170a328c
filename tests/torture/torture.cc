// idemsink-torture: a randomized fault checker. From a seed it draws a
// workload (every kind of route at once, duplicates, poison, values the
// database refuses, records the remote refuses for themselves, timestamps on
// both sides of a month end and beyond the replay horizon) and a schedule of
// overlapping faults (hosts killed, stopped, joining and leaving; MariaDB
// killed; brokers down; request errors; remote outages, brownouts and
// answers lost after applying; the DLQ unavailable; operator pauses and
// replays), runs them on real servers (MariaDB, the mock or a real Kafka,
// the fake services, `idemsink run` hosts), lets the system settle, and
// checks by counting what every user relies on:
//
//   progress   everything committed and every claim settled within a bound
//              after the last fault (else a wedge, with what did not move)
//   once       no effect twice: each remote's own counter per order, ledger
//              entries per order, SMS sent at most once
//   accounted  every produced record accounted for (`idemsink audit`), and in
//              its expected class: done, or dead with the expected reason
//   letters    every dead letter published (repeats only after a SIGKILL)
//   events     every outcome's event published ([route.output] on every
//              route), none for an outcome that is not (repeats only after
//              a SIGKILL)
//   clean      no crash, abort, sanitizer report or "bug:" line (a record
//              stepping outside its life, pipeline/stage.cc) in a log;
//              SIGTERM exits 0
//
// A violation prints the seed and the one command that replays it; exit 1.
// scripts/torture runs many seeds.
#include <signal.h>

#include <atomic>
#include <boost/program_options.hpp>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "core/dlq/outbox.h"
#include "core/db/connection.h"
#include "devkit/mariadb_server.h"
#include "devkit/process.h"
#include "devkit/services.h"
#include "tests/support/host_fixture.h"
#include "tests/support/test_kafka.h"

namespace po = boost::program_options;
using namespace idemsink;
using namespace idemsink::devkit;
using namespace idemsink::test;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// ---------------------------------------------------------------- the plan

struct Options {
  uint64_t seed = 1;
  std::chrono::seconds duration{60};
  int hosts = 2;
  std::string kafka = "mock";
  bool keep = false;
};

// One route of the workload, and what its records should end as.
struct RouteDef {
  std::string name;
  std::string plugin;         // shipped plugin
  bool remote = true;         // talks to the fake services
  bool retry_topics = false;  // forwards through two retry topics
  bool second_db = false;     // claims in the second database
};

const std::vector<RouteDef> kRoutes = {
    {"waybill", "waybill"},
    {"inventory", "inventory", true, true},
    {"sms", "sms"},
    {"ledger", "ledger", false, false, true},
};

// What a produced record should end as.
enum class Expect {
  Done,      // its order's effect applied once (SMS: at most once, done iff sent)
  Dead,      // dead-lettered with `reason`, no effect
  Duplicate  // an earlier record of its order decides
};

struct Record {
  std::string route;
  std::string order;  // biz_key
  std::string key;    // Kafka key
  std::string value;
  int32_t partition;
  int64_t timestamp_ms = 0;  // 0: now
  Expect expect;
  std::string reason;  // Dead: the expected idemsink.reason (one of several for a remote refusal)
};

enum class Fault {
  HostKill,       // SIGKILL a host, start it again after `duration`
  HostStop,       // SIGTERM a host (must exit 0), start it again after `duration`
  HostJoin,       // one more host joins for `duration`, then leaves with SIGTERM
  DatabaseKill,   // SIGKILL MariaDB, restart after `duration`
  BrokerDown,     // a broker goes down for `duration`
  RequestErrors,  // injected request errors (mock only)
  RemoteOutage,   // a remote answers 503 to everything
  Brownout,       // a remote answers slower than the host's call timeout
  LostAnswers,    // a remote applies, then answers too late (timeouts after applying)
  DlqDown,        // a DLQ partition without a leader (mock only)
  Pause,          // an operator pauses a route, resumes after `duration`
  Replay,         // an operator replays a route's permanently failed records
};

const char* fault_name(Fault f) {
  switch (f) {
    case Fault::HostKill: return "host kill -9";
    case Fault::HostStop: return "host SIGTERM";
    case Fault::HostJoin: return "host joins";
    case Fault::DatabaseKill: return "MariaDB kill -9";
    case Fault::BrokerDown: return "broker down";
    case Fault::RequestErrors: return "request errors";
    case Fault::RemoteOutage: return "remote outage";
    case Fault::Brownout: return "remote brownout";
    case Fault::LostAnswers: return "answers lost after applying";
    case Fault::DlqDown: return "DLQ partition leaderless";
    case Fault::Pause: return "operator pause";
    case Fault::Replay: return "operator replay";
  }
  return "?";
}

struct FaultEvent {
  double at_s;
  double duration_s;
  Fault kind;
  int target = 0;      // host index, broker id
  std::string detail;  // service, route, API
};

struct Plan {
  Options opt;
  int partitions = 3;
  std::vector<Record> records;
  std::vector<FaultEvent> faults;
};

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The first millisecond of the current UTC month.
int64_t month_start_ms() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  tm.tm_mday = 1;
  tm.tm_hour = tm.tm_min = tm.tm_sec = 0;
  return static_cast<int64_t>(timegm(&tm)) * 1000;
}

std::string order_value(const std::string& order, const std::string& account, std::mt19937_64& rng) {
  return nlohmann::json{{"order_id", order},
                        {"account", account},
                        {"amount", 10 + static_cast<double>(rng() % 9000) / 100},
                        {"phone", "+86138" + std::to_string(10000000 + rng() % 89999999)},
                        {"sku", "SKU-" + std::to_string(rng() % 300)},
                        {"qty", 1 + static_cast<int>(rng() % 3)}}
      .dump();
}

Plan draw(const Options& opt) {
  Plan plan;
  plan.opt = opt;
  std::mt19937_64 rng(opt.seed);
  auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  plan.partitions = 2 + static_cast<int>(rng() % 3);
  const int orders =
      150 + static_cast<int>(rng() % 150) * static_cast<int>(std::max<int64_t>(1, opt.duration.count() / 60));
  const std::string tag = "S" + std::to_string(opt.seed);
  for (const auto& r : kRoutes) {
    std::vector<Record> firsts;
    for (int i = 0; i < orders; ++i) {
      std::string order = tag + "-" + r.name + "-" + std::to_string(i);
      Record rec{r.name, order, "", "", static_cast<int32_t>(rng() % plan.partitions), 0, Expect::Done, ""};
      std::string account = "acct-" + std::to_string(rng() % 97);
      const double kind = std::uniform_real_distribution<double>(0, 1)(rng);
      if (kind < 0.03 && r.remote) {
        rec.order = "REJECT-" + order;  // the remote refuses it for itself, every time
        rec.expect = Expect::Dead;
        rec.reason = "permanent";
      } else if (kind < 0.05 && r.remote) {
        rec.order = "DOWN-" + order;  // 503 forever: attempts run out
        rec.expect = Expect::Dead;
        rec.reason = "retries_exhausted";
      } else if (kind < 0.07 && r.name == "ledger") {
        account = std::string(70, 'x');  // longer than the ledger's account column
        rec.expect = Expect::Dead;
        rec.reason = "db_rejected";
      } else if (kind < 0.09) {
        // Either side of the month end: each record meets its own claim row.
        rec.timestamp_ms = month_start_ms() + (chance(0.5) ? -1 - static_cast<int64_t>(rng() % 60000)
                                                           : static_cast<int64_t>(rng() % 60000));
      } else if (kind < 0.10) {
        rec.timestamp_ms = now_ms() - int64_t{100} * 86'400'000;  // older than retention minus the margin
        rec.expect = Expect::Dead;
        rec.reason = "beyond_replay_horizon";
      }
      rec.key = rec.order;
      rec.value = order_value(rec.order, account, rng);
      plan.records.push_back(rec);
      firsts.push_back(rec);
    }
    // Duplicates: the same order again, later, on the same or another partition
    // (under another Kafka key: the biz_key is the order id in the value).
    for (int i = 0; i < orders / 8; ++i) {
      Record dup = firsts[rng() % firsts.size()];
      dup.expect = Expect::Duplicate;
      if (chance(0.5)) {
        dup.key = "resent-" + dup.key;
        dup.partition = static_cast<int32_t>(rng() % plan.partitions);
      }
      plan.records.insert(plan.records.begin() + static_cast<long>(rng() % plan.records.size()), dup);
    }
    // Poison: the DLQ, never a crash or a stall.
    const std::vector<std::pair<std::string, std::string>> poison = {
        {"\xff\xfe not json at all", "undecodable_value"},
        {"{\"note\":\"no order id\"}", "missing_key"},
        {"{\"order_id\":\"" + tag + "-big\",\"pad\":\"" + std::string(6000, 'p') + "\"}", "record_too_large"},
        {std::string(300, '[') + std::string(300, ']'), "undecodable_value"},
    };
    for (const auto& [value, reason] : poison)
      if (chance(0.8))
        plan.records.push_back(
            {r.name, "", "poison", value, static_cast<int32_t>(rng() % plan.partitions), 0, Expect::Dead, reason});
  }

  // Faults: overlapping, over the first 80% of the run.
  const double span = static_cast<double>(opt.duration.count()) * 0.8;
  std::vector<Fault> kinds = {Fault::HostKill,   Fault::HostStop,     Fault::HostJoin, Fault::DatabaseKill,
                              Fault::BrokerDown, Fault::RemoteOutage, Fault::Brownout, Fault::LostAnswers,
                              Fault::Pause,      Fault::Replay};
  if (opt.kafka == "mock") {
    kinds.push_back(Fault::RequestErrors);
    kinds.push_back(Fault::DlqDown);
  }
  const int n = 4 + static_cast<int>(rng() % 6) + static_cast<int>(opt.duration.count() / 30);
  const std::vector<std::string> services = {"waybill", "inventory", "sms"};
  const std::vector<std::string> apis = {"OffsetFetch", "OffsetCommit", "Fetch", "Produce", "JoinGroup"};
  for (int i = 0; i < n; ++i) {
    FaultEvent f{std::uniform_real_distribution<double>(2, span)(rng), 2 + static_cast<double>(rng() % 12),
                 kinds[rng() % kinds.size()]};
    f.target = static_cast<int>(rng() % static_cast<uint64_t>(opt.hosts));
    switch (f.kind) {
      case Fault::BrokerDown: f.target = 1 + static_cast<int>(rng() % 3); break;
      case Fault::RemoteOutage:
      case Fault::Brownout:
      case Fault::LostAnswers: f.detail = services[rng() % services.size()]; break;
      case Fault::RequestErrors: f.detail = apis[rng() % apis.size()]; break;
      case Fault::Pause: f.detail = kRoutes[rng() % kRoutes.size()].name; break;
      case Fault::Replay: f.detail = services[rng() % 2]; break;  // waybill or inventory: their rejections
      case Fault::DlqDown: f.detail = kRoutes[rng() % kRoutes.size()].name; break;
      default: break;
    }
    plan.faults.push_back(f);
  }
  std::sort(plan.faults.begin(), plan.faults.end(), [](const auto& a, const auto& b) { return a.at_s < b.at_s; });
  return plan;
}

std::string describe(const Plan& p) {
  std::ostringstream os;
  std::map<std::string, int> by_class;
  for (const auto& r : p.records)
    ++by_class[r.expect == Expect::Done ? "good" : r.expect == Expect::Duplicate ? "duplicate" : "dead:" + r.reason];
  os << "seed " << p.opt.seed << ", " << p.opt.duration.count() << "s, " << p.opt.hosts << " host(s), kafka "
     << p.opt.kafka << ", " << p.partitions << " partitions per topic, " << p.records.size() << " records:";
  for (const auto& [c, n] : by_class) os << " " << c << " " << n;
  std::map<std::string, int> drawn;
  for (const auto& f : p.faults) {
    std::string name = fault_name(f.kind);
    std::replace(name.begin(), name.end(), ' ', '_');
    ++drawn[name];
  }
  os << "\ndrawn:";
  for (const auto& [name, n] : drawn) os << " " << name << "=" << n;
  os << "\nschedule:\n";
  for (const auto& f : p.faults)
    os << "  " << std::fixed << std::setprecision(1) << std::setw(6) << f.at_s << "s +" << f.duration_s << "s  "
       << fault_name(f.kind) << (f.detail.empty() ? "" : " " + f.detail)
       << (f.kind == Fault::HostKill || f.kind == Fault::HostStop ? " host-" + std::to_string(f.target) : "")
       << (f.kind == Fault::BrokerDown ? " broker " + std::to_string(f.target) : "") << "\n";
  return os.str();
}

// ---------------------------------------------------------------- the world

std::string topic_of(const std::string& route) { return "t." + route; }

class World {
 public:
  World(const Plan& plan, ScratchDir& dir)
      : plan_(plan),
        dir_(dir),
        second_(std::make_unique<MariaDbServer>()),
        services_(fake_services_binary(), {"--hold", "2500", "--faults", faults("waybill"), "--faults",
                                           faults("inventory"), "--faults", faults("sms")}),
        kafka_(3) {
    db_ = MariaDbServer::shared().fresh_database("torture_" + std::to_string(plan.opt.seed));
    db2_ = second_->fresh_database("torture2_" + std::to_string(plan.opt.seed));
    for (const auto& r : kRoutes) {
      kafka_.create_topic(topic_of(r.name), plan.partitions);
      kafka_.create_topic(topic_of(r.name) + ".dlq", 2);
      kafka_.create_topic(topic_of(r.name) + ".events", 2);
      topics_.push_back(topic_of(r.name));
      if (r.retry_topics)
        for (int tier = 1; tier <= 2; ++tier) {
          kafka_.create_topic(topic_of(r.name) + ".retry." + std::to_string(tier), plan.partitions);
          topics_.push_back(topic_of(r.name) + ".retry." + std::to_string(tier));
        }
    }
    for (int i = 0; i < plan.opt.hosts; ++i) start_host(i);
  }

  std::string faults(const std::string& svc) const { return svc + ":latency_mean_ms=8,latency_p99_ms=60"; }

  std::string config(int index) const {
    std::string cfg = base_config(kafka_, db_, "host-" + std::to_string(index), group_,
                                  "admin_listen = \"127.0.0.1:" + std::to_string(admin_port(index)) + "\"\n");
    cfg.replace(cfg.find("[claim]\n"), 8,
                "[claim]\nreconcile_interval = \"2s\"\nreconcile_after = \"3s\"\nunknown_dlq_after = \"1h\"\n");
    if (plan_.opt.kafka == "mock")
      // The mock cluster checks an idempotent producer's sequence numbers
      // only in transactions: a Produce that met an injected error while a
      // later one was in flight is acknowledged by the later one's success
      // and its letters are gone (a real broker refuses the later one as out
      // of order, and both are sent again). One request in flight keeps the
      // injected Produce errors meaningful on the mock (torture seed 23).
      cfg.replace(cfg.find("\n[database]\n"), 12,
                  "[kafka.producer]\n\"max.in.flight.requests.per.connection\" = \"1\"\n\n[database]\n");
    for (const auto& r : kRoutes) {
      std::string extra =
          "call_timeout = \"5s\"\nmax_record_bytes = 4096\n[route.retry]\nmax_attempts = 4\n"
          "backoff_initial = \"100ms\"\nbackoff_max = \"1s\"\n";
      if (r.retry_topics) extra += "topics = [\"1s\", \"2s\"]\n";
      // The progress bound (180 s) must cover a record that fails alone
      // under an open circuit: its wait, then its attempts at probe_max.
      extra += "[route.circuit]\nmax_wait = \"20s\"\n";
      // Every outcome publishes its event (docs/outputs.md): checked by `events`.
      extra += "[route.output]\ntopic = \"" + topic_of(r.name) +
               ".events\"\ninclude_failed = true\ninclude_unknown = true\n";
      if (r.second_db)
        extra += "[route.database]\nport = " + std::to_string(db2_.port) + "\ndatabase = \"" + db2_.database + "\"\n";
      RouteSpec spec{
          r.name, topic_of(r.name), shipped_plugin(r.plugin), "key = { from = \"json\", json = \"order_id\" }", {},
          extra};
      if (r.remote) spec.options = {{"endpoint", "\"" + services_.url() + "\""}, {"timeout", "\"1s\""}};
      cfg += route_config(spec);
    }
    return cfg;
  }

  /// Each running host's /status, kept beside the logs; returns its partitions
  /// that are behind, with whether they fetch and what they hold in memory.
  std::string dump_status() {
    std::string out;
    for (int i : host_indexes()) {
      try {
        const auto [code, body] = http_request(admin_port(i), "GET", "/status");
        write_file(dir_ / ("status-host-" + std::to_string(i) + ".json"), body);
        const auto j = nlohmann::json::parse(body, nullptr, false);
        if (!j.is_object() || !j.contains("partitions")) continue;
        for (const auto& p : j["partitions"])
          if (p.value("committed", int64_t{-1}) < p.value("high_watermark", int64_t{0}))
            out += " host-" + std::to_string(i) + ": " + p.value("topic", std::string()) + "[" +
                   std::to_string(p.value("partition", 0)) +
                   "] fetching=" + (p.value("fetching", false) ? "yes" : "no") +
                   " in_pipeline=" + std::to_string(p.value("in_pipeline", int64_t{0}));
      } catch (const std::exception& e) {
        out += " host-" + std::to_string(i) + ": /status: " + e.what();
      }
    }
    return out;
  }

  int admin_port(int index) const {
    auto it = admin_ports_.find(index);
    return it == admin_ports_.end() ? 0 : it->second;
  }

  void start_host(int index) {
    std::lock_guard lk(mu_);
    if (!admin_ports_.count(index)) admin_ports_[index] = free_port();
    hosts_[index] = std::make_unique<HostProcess>(
        dir_, "host-" + std::to_string(index) + "-run" + std::to_string(++runs_[index]), config(index));
    logs_.push_back(hosts_[index]->proc().err_path());
  }
  void kill_host(int index) {
    std::lock_guard lk(mu_);
    if (hosts_.count(index) && hosts_[index]) hosts_[index]->kill();
    ++kills_;
  }
  // SIGTERM: a clean exit 0 is part of the contract.
  void stop_host(int index) {
    std::unique_ptr<HostProcess> h;
    {
      std::lock_guard lk(mu_);
      if (!hosts_.count(index) || !hosts_[index]) return;
      h = std::move(hosts_[index]);
    }
    if (!h->running()) return;
    int rc = -1;
    try {
      rc = h->stop(60s);
    } catch (const std::exception& e) {
      note("SIGTERM of host-" + std::to_string(index) + ": " + e.what());
      return;
    }
    // A SIGTERM that comes before main() blocks it (the process was just
    // exec'd: it logged nothing, claimed nothing) ends it by the default
    // action, as it would any program; from main() on it must drain and exit 0.
    if (rc == -SIGTERM && h->log().empty()) return;
    if (rc != 0) note("host-" + std::to_string(index) + " exited " + std::to_string(rc) + " on SIGTERM");
  }

  void cli(const std::vector<std::string>& args) {
    std::lock_guard lk(mu_);
    if (!hosts_.count(0) || !hosts_[0]) return;
    std::vector<std::string> full = args;
    full.insert(full.end(), {"--config", hosts_[0]->config_path().string()});
    try {
      run_cli(dir_, "cli-" + std::to_string(++cli_runs_), full);
    } catch (const std::exception& e) {
      note(std::string("cli: ") + e.what());
    }
  }

  std::vector<int> host_indexes() {
    std::lock_guard lk(mu_);
    std::vector<int> out;
    for (const auto& [i, h] : hosts_)
      if (h) out.push_back(i);
    return out;
  }
  bool host_running(int index) {
    std::lock_guard lk(mu_);
    return hosts_.count(index) && hosts_[index] && hosts_[index]->running();
  }
  /// A config of the group (any host's: they differ only in [host]).
  std::filesystem::path config_file() {
    std::lock_guard lk(mu_);
    for (const auto& [i, h] : hosts_)
      if (h) return h->config_path();
    return dir_ / "host-0-run1.toml";
  }

  void set_faults(const std::string& svc, const std::string& json) {
    http_request(services_.port(), "POST", "/admin/faults/" + svc, json);
  }

  void note(const std::string& problem) {
    std::lock_guard lk(mu_);
    problems_.push_back(problem);
  }

  const Plan& plan_;
  // Seeds run side by side on one machine: a cluster's port, free again
  // after it died, may be taken by another seed's cluster while this seed's
  // hosts still dial it. A group of its own keeps them out of the other's
  // group (they could only be seen, as letters or topics that should not be
  // there, never hide a loss).
  const std::string group_ = "torture-" + std::to_string(plan_.opt.seed) + "-" + std::to_string(::getpid());
  ScratchDir& dir_;
  std::unique_ptr<MariaDbServer> second_;
  FakeServices services_;
  TestKafka kafka_;
  config::DatabaseConfig db_, db2_;
  std::vector<std::string> topics_;
  std::mutex mu_;
  std::map<int, std::unique_ptr<HostProcess>> hosts_;
  std::map<int, int> admin_ports_;
  std::map<int, int> runs_;
  std::vector<std::filesystem::path> logs_;
  int cli_runs_ = 0;
  int kills_ = 0;
  std::vector<std::string> problems_;
  // When each remote failed every call or answered past the call timeout
  // (wall clock ms; end 0 while it lasts): service -> {begin, end}.
  std::multimap<std::string, std::pair<int64_t, int64_t>> remote_faults_;
};

// ---------------------------------------------------------------- the run

void feed(World& w, const Plan& plan, std::chrono::seconds over) {
  // Every record over the first half of the run, in plan order.
  const auto start = Clock::now();
  const size_t total = plan.records.size();
  std::map<std::string, std::vector<TestMessage>> batch;
  for (size_t i = 0; i < total; ++i) {
    const Record& r = plan.records[i];
    batch[topic_of(r.route)].push_back({r.key, r.value, {}, r.partition, r.timestamp_ms});
    if (i % 50 == 49 || i + 1 == total) {
      for (auto& [topic, msgs] : batch) {
        for (;;) {
          try {
            w.kafka_.produce(topic, msgs);
            break;
          } catch (const std::exception&) {
            // A dead mock cluster never comes back: the run ends as BACKEND DIED.
            if (w.kafka_.mock_died()) return;
            std::this_thread::sleep_for(500ms);  // a broker down: the feed waits, like an upstream would
          }
        }
      }
      batch.clear();
      std::this_thread::sleep_until(start + over * (static_cast<double>(i + 1) / static_cast<double>(total)));
    }
  }
}

void apply_fault(World& w, const FaultEvent& f, bool begin) {
  if (f.kind == Fault::RemoteOutage || f.kind == Fault::Brownout) {
    if (begin) {
      w.remote_faults_.emplace(f.detail, std::pair<int64_t, int64_t>{now_ms(), 0});
    } else {
      for (auto [it, end] = w.remote_faults_.equal_range(f.detail); it != end; ++it)
        if (it->second.second == 0) it->second.second = now_ms();
    }
  }
  switch (f.kind) {
    case Fault::HostKill:
      if (begin) {
        w.kill_host(f.target);
      } else {
        w.start_host(f.target);
      }
      break;
    case Fault::HostStop:
      if (begin) {
        w.stop_host(f.target);
      } else {
        w.start_host(f.target);
      }
      break;
    case Fault::HostJoin:
      if (begin) {
        w.start_host(100 + f.target);
      } else {
        w.stop_host(100 + f.target);
      }
      break;
    case Fault::DatabaseKill:
      if (begin) {
        MariaDbServer::shared().kill();
      } else {
        MariaDbServer::shared().restart();
      }
      break;
    case Fault::BrokerDown:
      if (begin) {
        w.kafka_.broker_down(f.target);
      } else if (auto* real = w.kafka_.real()) {
        // Not waiting for it to listen: with the others of its quorum down it
        // cannot, until they are back too (settle() waits for all).
        real->start_again(f.target);
      } else {
        w.kafka_.broker_up(f.target);
      }
      break;
    case Fault::RequestErrors:
      if (begin) {
        // What a broker failover answers each API with, a few times over.
        const std::map<std::string, std::pair<const char*, int>> kErrors = {
            {"OffsetFetch", {"COORDINATOR_LOAD_IN_PROGRESS", 30}},
            {"OffsetCommit", {"NOT_COORDINATOR", 8}},
            {"Fetch", {"NOT_LEADER_FOR_PARTITION", 6}},
            {"Produce", {"NOT_ENOUGH_REPLICAS", 8}},
            {"JoinGroup", {"COORDINATOR_NOT_AVAILABLE", 6}}};
        const auto& [err, n] = kErrors.at(f.detail);
        std::string line = "push_errors " + f.detail;
        for (int i = 0; i < n; ++i) line += std::string(" ") + err;
        w.kafka_.command(line);
      }
      break;
    case Fault::RemoteOutage: w.set_faults(f.detail, begin ? R"({"error_5xx": 1.0})" : R"({"error_5xx": 0.0})"); break;
    case Fault::Brownout:
      w.set_faults(f.detail, begin ? R"({"latency_mean_ms": 1500, "latency_p99_ms": 4000})"
                                   : R"({"latency_mean_ms": 8, "latency_p99_ms": 60})");
      break;
    case Fault::LostAnswers:
      w.set_faults(f.detail, begin ? R"({"timeout_after_apply": 0.3})" : R"({"timeout_after_apply": 0.0})");
      break;
    case Fault::DlqDown:
      w.kafka_.command("partition_leader " + topic_of(f.detail) + ".dlq 0 " + (begin ? "-1" : "1"));
      break;
    case Fault::Pause: w.cli({"route", begin ? "pause" : "resume", f.detail}); break;
    case Fault::Replay:
      if (begin) w.cli({"replay", "--route", f.detail, "--reason", "permanent"});
      break;
  }
}

// The faults stop: every part up, every route resumed, every host of the
// group running (the schedule restored most of it; a kill or a join the run
// ended in the middle of is undone here).
void settle(World& w, const Plan& plan) {
  const std::string healthy =
      R"({"error_5xx": 0, "timeout_after_apply": 0, "latency_mean_ms": 8, "latency_p99_ms": 60})";
  if (auto* real = w.kafka_.real()) real->wait_all_up(180s);
  for (const char* svc : {"waybill", "inventory", "sms"}) w.set_faults(svc, healthy);
  for (const auto& r : kRoutes) w.cli({"route", "resume", r.name});
  for (int i = 0; i < plan.opt.hosts; ++i)
    if (!w.host_running(i)) w.start_host(i);
}

void run_schedule(World& w, const Plan& plan, Clock::time_point start) {
  struct Step {
    double at_s;
    const FaultEvent* f;
    bool begin;
  };
  std::vector<Step> steps;
  for (const auto& f : plan.faults) {
    steps.push_back({f.at_s, &f, true});
    steps.push_back({f.at_s + f.duration_s, &f, false});
  }
  std::stable_sort(steps.begin(), steps.end(), [](const Step& a, const Step& b) { return a.at_s < b.at_s; });
  for (const auto& s : steps) {
    std::this_thread::sleep_until(start + std::chrono::milliseconds(static_cast<int64_t>(s.at_s * 1000)));
    try {
      apply_fault(w, *s.f, s.begin);
    } catch (const std::exception& e) {
      w.note(std::string("applying ") + fault_name(s.f->kind) + ": " + e.what());
    }
  }
}

// ---------------------------------------------------------------- the checks

struct Verdict {
  std::vector<std::pair<std::string, std::string>> failed;  // invariant, what
  // The mock cluster's own process ended (librdkafka's mock aborts on an
  // assertion of its group coordinator under some rejoins): the run says
  // nothing about idemsink and ends there.
  std::optional<std::string> backend_died;
  std::map<std::string, std::string> figures;
  void fail(const std::string& inv, const std::string& what) { failed.emplace_back(inv, what); }
};

// Waits for progress: every topic committed to its end, no claim pending,
// the outbox drained.
void check_progress(World& w, Verdict& v, std::chrono::seconds bound) {
  std::string behind;
  const auto deadline = Clock::now() + bound;
  for (;;) {
    behind.clear();
    if ((v.backend_died = w.kafka_.mock_died())) return;
    try {
      for (const auto& t : w.topics_) {
        const auto hi = w.kafka_.high_watermarks(t, w.plan_.partitions);
        const auto c = w.kafka_.committed(w.group_, t, w.plan_.partitions);
        for (const auto& [p, h] : hi)
          if (h > 0 && c.at(p) < h)
            behind += " " + t + "[" + std::to_string(p) + "] " + std::to_string(c.at(p)) + "/" + std::to_string(h);
      }
      for (const auto* cfg : {&w.db_, &w.db2_}) {
        db::Connection c(*cfg);
        const int64_t pending = scalar(c, "SELECT COUNT(*) FROM idemsink_claim WHERE " +
                                              status_in(claim::Status::Pending, claim::Status::Unknown));
        if (pending > 0) behind += " " + std::to_string(pending) + " claim(s) pending or unknown in " + cfg->database;
        // A letter is progress too: the relay retries a leaderless DLQ
        // partition with a backoff of up to 30 s after the fault has ended.
        const int64_t unpublished =
            scalar(c, "SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE dlq_topic <> '' AND published_at IS NULL");
        if (unpublished > 0)
          behind += " " + std::to_string(unpublished) + " outbox row(s) unpublished in " + cfg->database;
      }
    } catch (const std::exception& e) {
      behind = std::string(" (") + e.what() + ")";
    }
    if (behind.empty() || Clock::now() > deadline) break;
    std::this_thread::sleep_for(1s);
  }
  if (!behind.empty())
    v.fail("progress",
           "a wedge " + std::to_string(bound.count()) + "s after the last fault:" + behind + ";" + w.dump_status());
}

void check_once(World& w, Verdict& v) {
  const auto stats = w.services_.stats();
  for (const char* svc : {"waybill", "inventory"}) {
    const int doubled = stats[svc]["double_applied"].get<int>();
    v.figures[std::string(svc) + " applied"] = std::to_string(stats[svc]["applied"].get<int>());
    if (doubled != 0) v.fail("once", std::string(svc) + ": " + std::to_string(doubled) + " order(s) applied twice");
  }
  for (const auto& [order, n] : stats["sms"]["per_order"].items())
    if (n.get<int>() > 1) v.fail("once", "sms: order " + order + " sent " + std::to_string(n.get<int>()) + " times");
  db::Connection c2(w.db2_);
  const int64_t twice =
      scalar(c2, "SELECT COUNT(*) FROM (SELECT biz_key FROM ledger_entries GROUP BY biz_key HAVING COUNT(*) > 1) d");
  if (twice != 0) v.fail("once", "ledger: " + std::to_string(twice) + " order(s) credited twice");
  v.figures["ledger credits"] = std::to_string(scalar(c2, "SELECT COUNT(*) FROM ledger_entries"));
}

void check_classes(World& w, const Plan& plan, Verdict& v) {
  const auto stats = w.services_.stats();
  // The expected outcome per (route, order): the first record of an order decides.
  std::map<std::pair<std::string, std::string>, const Record*> first;
  for (const auto& r : plan.records)
    if (!r.order.empty() && r.expect != Expect::Duplicate) first.emplace(std::pair{r.route, r.order}, &r);
  std::map<std::pair<std::string, std::string>, int> status;
  for (const auto* cfg : {&w.db_, &w.db2_}) {
    db::Connection c(*cfg);
    for (auto& row : c.query("SELECT namespace, biz_key, status FROM idemsink_claim"))
      status[{*row[0], *row[1]}] = std::stoi(*row[2]);
  }
  std::map<std::string, int> letters;  // reason -> count, all DLQ topics
  std::set<std::pair<std::string, std::string>> dead_orders;
  // Orders whose attempts all failed inside one of their remote's outages or
  // brownouts: the circuit opens only when enough different records fail
  // (records failing alone must not open it), so a thin stream's records
  // may spend their attempts on an outage and become dead letters. That is
  // the configured retry policy at work, not a loss: replayable, no effect.
  // Whatever the path: spent at once (retries_exhausted), or timed out,
  // parked unknown and settled failed by reconciliation (not_applied).
  std::set<std::pair<std::string, std::string>> spent_on_outage;
  auto in_remote_fault = [&](const std::string& service, int64_t first_ms, int64_t last_ms) {
    for (auto [it, end] = w.remote_faults_.equal_range(service); it != end; ++it) {
      const auto [begin_ms, end_ms] = it->second;
      // Calls already out when it ended answer late: a second of slack.
      if (first_ms >= begin_ms && last_ms <= (end_ms == 0 ? now_ms() : end_ms + 1000)) return true;
    }
    return false;
  };
  for (const auto& r : kRoutes)
    for (const auto& m : w.kafka_.read_all(topic_of(r.name) + ".dlq", 2, 30000)) {
      ++letters[m.headers.count("idemsink.reason") ? m.headers.at("idemsink.reason") : "?"];
      // The order: its biz_key header, or (refused before a key was read) the value's order id.
      std::string order = m.headers.count("idemsink.biz_key") ? m.headers.at("idemsink.biz_key") : "";
      if (order.empty() && m.value) {
        const auto j = nlohmann::json::parse(*m.value, nullptr, false);
        if (j.is_object() && j.contains("order_id") && j["order_id"].is_string()) order = j["order_id"];
      }
      if (!order.empty()) dead_orders.insert({r.name, order});
      const auto failure_ms = [&](const char* header) {
        return m.headers.count(header) ? std::stoll(m.headers.at(header)) : int64_t{0};
      };
      const std::string reason = m.headers.count("idemsink.reason") ? m.headers.at("idemsink.reason") : "";
      if (!order.empty() && (reason == "retries_exhausted" || reason == "not_applied") &&
          in_remote_fault(r.name, failure_ms("idemsink.first_failure_ms"), failure_ms("idemsink.last_failure_ms")))
        spent_on_outage.insert({r.name, order});
    }
  int wrong = 0;
  int outage_letters = 0;
  for (const auto& [key, rec] : first) {
    const auto& [route, order] = key;
    auto it = status.find(key);
    const int st = it == status.end() ? 0 : it->second;
    std::string problem;
    if (rec->expect == Expect::Done) {
      if (route == "sms") {
        const int sent = stats["sms"]["per_order"].value(order, 0);
        if (!((st == 2 && sent == 1) || (st == 3 && sent == 0)))
          problem = "status " + std::to_string(st) + " with " + std::to_string(sent) + " send(s)";
      } else if (st == 3 && spent_on_outage.count(key)) {
        ++outage_letters;
      } else if (st != 2) {
        problem = "status " + std::to_string(st) + ", expected done";
      }
    } else if (rec->reason == "beyond_replay_horizon") {
      if (st != 0) problem = "claimed although beyond the replay horizon";
      if (!dead_orders.count(key)) problem += " no dead letter";
    } else {
      if (st != 3) problem = "status " + std::to_string(st) + ", expected failed";
      // Every failed record is published, a settlement's too (nothing ends failed unpublished).
      if (!dead_orders.count(key)) problem += " no dead letter";
      if (route == "sms" && stats["sms"]["per_order"].value(order, 0) != 0) problem += " sent";
    }
    if (!problem.empty() && ++wrong <= 10) v.fail("accounted", route + "/" + order + ": " + problem);
  }
  if (wrong > 10) v.fail("accounted", std::to_string(wrong - 10) + " more");
  int poison = 0;
  for (const auto& r : plan.records) poison += r.order.empty();
  int poison_letters = letters["undecodable_value"] + letters["missing_key"] + letters["record_too_large"];
  if (poison_letters < poison)
    v.fail("accounted", std::to_string(poison) + " poison records, " + std::to_string(poison_letters) + " letters");
  std::ostringstream os;
  for (const auto& [reason, n] : letters) os << reason << " " << n << " ";
  v.figures["dead letters"] = os.str();
  v.figures["good orders dead-lettered by an outage (attempts spent)"] = std::to_string(outage_letters);
}

void check_letters(World& w, Verdict& v) {
  for (const auto* cfg : {&w.db_, &w.db2_}) {
    db::Connection c(*cfg);
    const int64_t unpublished =
        scalar(c, "SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE " + dlq::sql_purpose_is(dlq::Purpose::DeadLetter) +
                      " AND dlq_topic <> '' AND published_at IS NULL");
    if (unpublished > 0)
      v.fail("letters", std::to_string(unpublished) + " dead letter(s) never published in " + cfg->database);
  }
  std::map<std::string, int> seen;
  for (const auto& r : kRoutes)
    for (const auto& m : w.kafka_.read_all(topic_of(r.name) + ".dlq", 2, 30000))
      ++seen[r.name + "/" + (m.headers.count("idemsink.outbox_id") ? m.headers.at("idemsink.outbox_id") : "?")];
  int repeats = 0;
  for (const auto& [id, n] : seen) repeats += n - 1;
  v.figures["letter repeats"] = std::to_string(repeats);
  if (repeats > 0 && w.kills_ == 0)
    v.fail("letters", std::to_string(repeats) + " letter(s) published twice with no host killed");
}

// Every claim's outcome has its event, and every event an outcome: a done
// claim its done event, a failed or unknown one its event; a done event only
// for a claim that is done (done never changes). Repeats (the same event id
// twice) only after a SIGKILL, as for letters.
void check_events(World& w, Verdict& v) {
  std::map<std::string, std::set<std::string>> outcomes_of;  // token -> outcomes with an event
  std::map<std::string, int> publications;                   // event id -> times published
  for (const auto& r : kRoutes)
    for (const auto& m : w.kafka_.read_all(topic_of(r.name) + ".events", 2, 30000)) {
      const auto j = nlohmann::json::parse(m.value.value_or(""), nullptr, false);
      if (!j.is_object() || !m.headers.count("idemsink.event_id")) {
        v.fail("events", r.name + ": an event that is not one (offset " + std::to_string(m.offset) + ")");
        continue;
      }
      ++publications[m.headers.at("idemsink.event_id")];
      outcomes_of[j.value("idem_token", std::string())].insert(j.value("outcome", std::string()));
    }
  int wrong = 0;
  for (const auto* cfg : {&w.db_, &w.db2_}) {
    db::Connection c(*cfg);
    for (auto& row : c.query("SELECT namespace, biz_key, status, idem_token FROM idemsink_claim")) {
      const std::string status = claim::to_string(static_cast<claim::Status>(std::stoi(*row[2])));
      const auto& seen = outcomes_of[*row[3]];
      std::string problem;
      if (status != "pending" && !seen.count(status)) problem = status + " without its event";
      if (status != "done" && seen.count("done")) problem += " a done event, yet " + status;
      if (!problem.empty() && ++wrong <= 10) v.fail("events", *row[0] + "/" + *row[1] + ": " + problem);
    }
  }
  if (wrong > 10) v.fail("events", std::to_string(wrong - 10) + " more");
  int repeats = 0;
  for (const auto& [id, n] : publications) repeats += n - 1;
  v.figures["events"] = std::to_string(publications.size()) + " (" + std::to_string(repeats) + " repeats)";
  if (repeats > 0 && w.kills_ == 0)
    v.fail("events", std::to_string(repeats) + " event(s) published twice with no host killed");
}

void check_logs(World& w, Verdict& v) {
  for (const auto& log : w.logs_) {
    const std::string text = read_file(log);
    for (const char* bad : {"AddressSanitizer", "runtime error:", "bug:", "terminate called", "Segmentation fault",
                            "Assertion", "LeakSanitizer", "ThreadSanitizer"})
      if (text.find(bad) != std::string::npos) v.fail("clean", log.filename().string() + " reports \"" + bad + "\"");
  }
  for (const auto& p : w.problems_) v.fail("clean", p);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  po::options_description desc("idemsink-torture options");
  int64_t duration = 60;
  desc.add_options()("help,h", "show this help")("seed", po::value<uint64_t>(&opt.seed)->default_value(1),
                                                 "draws the workload and the faults")(
      "duration", po::value<int64_t>(&duration)->default_value(60), "seconds of faults and load")(
      "hosts", po::value<int>(&opt.hosts)->default_value(2), "hosts in the group")(
      "kafka", po::value<std::string>(&opt.kafka)->default_value("mock"), "mock or real")(
      "keep", "keep the scratch directory (logs, data) even when the run passes");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc;
      return 0;
    }
    po::notify(vm);
    if (opt.kafka != "mock" && opt.kafka != "real") throw po::error("--kafka takes mock or real");
    if (opt.hosts < 1 || duration < 10) throw po::error("--hosts >= 1 and --duration >= 10");
  } catch (const po::error& e) {
    std::cerr << "idemsink-torture: " << e.what() << "\n";
    return 2;
  }
  opt.duration = std::chrono::seconds(duration);
  opt.keep = vm.count("keep") > 0;
  ::setenv("IDEMSINK_TEST_KAFKA", opt.kafka.c_str(), 1);
  const std::string replay = "idemsink-torture --seed " + std::to_string(opt.seed) + " --duration " +
                             std::to_string(duration) + " --hosts " + std::to_string(opt.hosts) + " --kafka " +
                             opt.kafka;

  const Plan plan = draw(opt);
  std::cout << describe(plan) << std::flush;
  Verdict v;
  std::filesystem::path kept;
  try {
    ScratchDir dir("torture-" + std::to_string(opt.seed));
    // A run that throws (a server gone, a query refused) keeps its logs too.
    try {
      World w(plan, dir);
      const auto start = Clock::now();
      std::thread feeder([&] { feed(w, plan, opt.duration / 2); });
      run_schedule(w, plan, start);
      feeder.join();
      std::this_thread::sleep_until(start + opt.duration);
      settle(w, plan);
      check_progress(w, v, 180s);
      if (v.backend_died) throw std::runtime_error("the mock cluster's process ended");
      for (int i : w.host_indexes()) w.stop_host(i);
      auto [rc, out] = run_cli(dir, "audit", {"audit", "--config", w.config_file().string()});
      if (rc != 0) v.fail("accounted", "idemsink audit: " + out.substr(out.size() > 2000 ? out.size() - 2000 : 0));
      check_once(w, v);
      check_classes(w, plan, v);
      check_letters(w, v);
      check_events(w, v);
      check_logs(w, v);
      v.figures["host kills"] = std::to_string(w.kills_);
    } catch (const std::exception& e) {
      if (!v.backend_died) v.fail("run", e.what());
    }
    // The logs outlive the scratch directory when they explain something.
    if (!v.failed.empty() || v.backend_died || opt.keep) {
      kept = std::filesystem::temp_directory_path() /
             ("idemsink-torture-seed" + std::to_string(opt.seed) + "-" + std::to_string(::getpid()));
      std::filesystem::copy(dir.path(), kept, std::filesystem::copy_options::recursive);
    }
  } catch (const std::exception& e) {
    v.fail("run", e.what());
  }
  std::cout << "invariants: progress, once, accounted, letters, events, clean\n";
  for (const auto& [k, f] : v.figures) std::cout << "  " << k << ": " << f << "\n";
  if (v.backend_died && v.failed.empty()) {
    // Exit 2: not a verdict on idemsink; scripts/torture counts these apart.
    std::cout << "verdict: BACKEND DIED (seed " << opt.seed
              << "): the mock Kafka cluster's process ended: " << *v.backend_died << "\n";
    if (!kept.empty()) std::cout << "logs: " << kept.string() << "\n";
    std::cout << "replay: " << replay << "\n";
    return 2;
  }
  if (v.failed.empty()) {
    std::cout << "verdict: PASS (seed " << opt.seed << ")" << (kept.empty() ? "" : ", logs in " + kept.string())
              << "\n";
    return 0;
  }
  std::cout << "verdict: VIOLATION (seed " << opt.seed << ")\n";
  for (const auto& [inv, what] : v.failed) std::cout << "  " << inv << ": " << what << "\n";
  if (!kept.empty()) std::cout << "logs: " << kept.string() << "\n";
  std::cout << "replay: " << replay << "\n";
  return 1;
}
