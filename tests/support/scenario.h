// One test's world, so that a test reads as its scenario: a fresh database
// on the shared MariaDB, the Kafka backend IDEMSINK_TEST_KAFKA names (the mock
// cluster, or real brokers), a scratch directory, the topics made for it and
// the hosts it runs, plus the waits and counts every test repeats.
//
//   Scenario s("wedge_ledger");
//   s.topic("payments", 2).topic("payments.dlq", 1);
//   auto& host = s.host("lp1", {{"ledger", "payments", shipped_plugin("ledger")}});
//   s.kafka.produce("payments", msgs);
//   s.wait_committed(host);
//   BOOST_TEST(s.scalar("SELECT COUNT(*) FROM ledger_entries") == 297);
//   BOOST_TEST(host.stop() == 0);
//   s.audit_clean(host);
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/config/config.h"
#include "core/db/connection.h"
#include "devkit/mariadb_server.h"
#include "devkit/process.h"
#include "tests/support/host_fixture.h"
#include "tests/support/test_kafka.h"

namespace idemsink::test {

class Scenario {
 public:
  /// `name` names the database (dropped and made afresh) and the scratch
  /// directory; `brokers` sizes the mock cluster (see TestKafka).
  explicit Scenario(const std::string& name, int brokers = 1);
  /// The same on a MariaDB server of the test's own (one it kills, or one
  /// with grant tables); it must outlive the scenario.
  Scenario(const std::string& name, devkit::MariaDbServer& server, int brokers = 1);
  /// The same on a real cluster the test made itself (shared by scenarios).
  Scenario(const std::string& name, std::shared_ptr<devkit::KafkaCluster> cluster);

  /// Creates a topic (waits until it is served) and remembers it: the waits
  /// below cover every topic the scenario made.
  Scenario& topic(const std::string& name, int partitions, const std::map<std::string, std::string>& configs = {});

  /// The call log the scripted plugins of scripted() write to.
  std::filesystem::path calls_log() const { return dir / "calls.log"; }
  /// A route through a scripted test plugin (tests/plugins/scripted_remote.cc:
  /// behaviour by the biz_key's prefix) that logs every call to calls_log().
  RouteSpec scripted(const std::string& route, const std::string& topic, const std::string& extra = "",
                     const std::string& plugin = "scripted_idempotent.so") const;

  struct HostOptions {
    std::string group = "g";
    bool admin = false;          ///< open an admin port (admin_port() tells which)
    std::string host_lines;      ///< more lines for [host]
    std::string consumer_lines;  ///< more lines for [kafka.consumer]
    std::string kafka_lines;     ///< more lines for [kafka]
    std::string claim_lines;     ///< more lines for [claim]
    std::string producer_lines;  ///< lines for a [kafka.producer] table
    /// Another database than the scenario's (a wrong one, another user);
    /// its password and TLS settings are written too.
    std::optional<config::DatabaseConfig> database;
    /// Another of the cluster's listeners (KafkaCluster::bootstrap(Listener)).
    std::string bootstrap;
    std::string properties_lines;  ///< more lines for [kafka.properties]
    std::string tables;            ///< more tables (e.g. [kafka.oauth]), before the routes
    /// A last change to the generated text, for what no field above says.
    std::function<void(std::string&)> edit;
    std::map<std::string, std::string> env;
  };
  /// The config host() starts `id` with (without the admin port): for the
  /// CLI commands a test runs on a config of its own.
  std::string config(const std::string& id, const std::vector<RouteSpec>& routes, const HostOptions& opt) const;
  std::string config(const std::string& id, const std::vector<RouteSpec>& routes) const {
    return config(id, routes, {});
  }
  /// Starts `idemsink run` as host `id` with these routes. The scenario owns
  /// every host it started, until its end.
  HostProcess& host(const std::string& id, const std::vector<RouteSpec>& routes, HostOptions opt);
  HostProcess& host(const std::string& id, const std::vector<RouteSpec>& routes) { return host(id, routes, {}); }
  /// The admin port of a host started with `admin`.
  int admin_port(const HostProcess& host) const;

  /// Waits until `group` committed every topic of the scenario (or only
  /// `topics`) to its high watermark; fails early if the host exits. Without
  /// `topics`, the DLQ topics (named *.dlq) are left out: no group reads them.
  void wait_committed(HostProcess& host, std::chrono::milliseconds timeout = std::chrono::seconds(120),
                      const std::vector<std::string>& topics = {}, const std::string& group = "g");
  void wait_committed(HostProcess& host, const std::vector<std::string>& topics,
                      std::chrono::milliseconds timeout = std::chrono::seconds(120)) {
    wait_committed(host, timeout, topics);
  }
  /// Reads `topic` (every partition the scenario made it with) until it holds
  /// at least `n` records; returns them all.
  std::vector<ConsumedMessage> wait_records(const std::string& topic, size_t n,
                                            std::chrono::milliseconds timeout = std::chrono::seconds(60));

  std::unique_ptr<db::Connection> connect() const;
  /// The first column of the first row of `sql` on the scenario's database.
  int64_t scalar(const std::string& sql) const;
  /// Every call in calls_log(), in order, its columns as read_call_log()
  /// gives them; none before the first call made the log.
  std::vector<std::vector<std::string>> calls() const;
  /// Calls per biz_key in calls_log() (keys as they were, not hex), or in
  /// another log a scripted plugin wrote.
  std::map<std::string, int> calls_per_key() const { return calls_per_key(calls_log()); }
  static std::map<std::string, int> calls_per_key(const std::filesystem::path& log);
  /// Every call per biz_key in calls_log(), in order; each call's columns as
  /// read_call_log() gives them: route, biz_key (hex), idem_token, attempt,
  /// outcome, time in ms.
  std::map<std::string, std::vector<std::vector<std::string>>> calls_by_key() const;
  /// `idemsink audit` of the host's config: {exit code, what it printed}.
  std::pair<int, std::string> audit(HostProcess& host) { return test::audit(dir, host); }
  /// Every committed record accounted for: the audit exits 0 saying "audit ok".
  void audit_clean(HostProcess& host) { test::audit_clean(dir, host); }

  const std::string name;
  TestKafka kafka;
  const config::DatabaseConfig db;
  const devkit::ScratchDir dir;

 private:
  std::vector<std::pair<std::string, int>> topics_;
  std::vector<std::unique_ptr<HostProcess>> hosts_;
  std::map<const HostProcess*, int> admin_ports_;
};

using devkit::hex_of;  // the scripted plugins log biz_keys in hex
using devkit::unhex;

/// Records keyed <prefix><from> .. <prefix><to - 1>, each with `value`.
std::vector<TestMessage> keyed_messages(const std::string& prefix, int from, int to, const std::string& value = "{}");

/// `route` (a scripted() one) with every call taking `delay` (e.g. "5ms").
RouteSpec with_delay(RouteSpec route, const std::string& delay);

/// A shipped plugin's route (waybill, inventory, sms) calling `endpoint`
/// (a FakeServices url()), with the plugin's `timeout` when one is given.
RouteSpec shipped_route(const std::string& plugin, const std::string& topic, const std::string& endpoint,
                        const std::string& timeout = "", const std::string& extra = "");

}  // namespace idemsink::test
