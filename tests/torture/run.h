// idemsink-torture's run: the world (MariaDB, a second database, the fake
// services, the Kafka cluster and the group's hosts) and what happens to it:
// the feed of the plan's records, the schedule of faults, and the settling
// once the faults stop.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "devkit/mariadb_server.h"
#include "devkit/process.h"
#include "devkit/services.h"
#include "tests/support/host_fixture.h"
#include "tests/support/test_kafka.h"
#include "tests/torture/faults.h"

namespace idemsink::torture {

using namespace idemsink::devkit;
using namespace idemsink::test;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

/// The topic a route reads.
std::string topic_of(const std::string& route);

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

/// Produces the plan's records, in plan order, spread over `over`.
void feed(World& w, const Plan& plan, std::chrono::seconds over);
/// The fault's beginning (`begin`) or its end.
void apply_fault(World& w, const FaultEvent& f, bool begin);
/// The faults stop: every part up, every route resumed, every host running.
void settle(World& w, const Plan& plan);
/// Applies the plan's faults, each at its time from `start`, and ends them.
void run_schedule(World& w, const Plan& plan, Clock::time_point start);

}  // namespace idemsink::torture
