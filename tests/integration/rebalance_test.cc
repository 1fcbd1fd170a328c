// Rebalance and shutdown: two hosts in one group, partitions moving while
// calls are in flight. On revoke a host stops taking records of the
// partition, lets in-flight calls finish within the grace period, commits and
// hands back claims it never called; SIGTERM does the same for everything.
#define BOOST_TEST_MODULE rebalance
#include <boost/test/unit_test.hpp>
#include <map>
#include <set>

#include "core/common/util.h"
#include "tests/support/host_fixture.h"
#include "devkit/mariadb_server.h"
#include "tests/support/test_kafka.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace idemsink::devkit;
using namespace std::chrono_literals;

namespace {

void two_hosts_share_and_hand_over(const std::string& strategy) {
  const std::string dbname = "rebalance_" + strategy.substr(0, strategy.find('-'));
  auto db = MariaDbServer::shared().fresh_database(dbname);
  TestKafka kafka;
  kafka.create_topic("orders", 8);
  ScratchDir dir("rebalance");
  const auto calls = dir / "calls.log";
  std::vector<TestMessage> msgs;
  std::set<std::string> keys;
  for (int i = 0; i < 3000; ++i) {
    const std::string key = "o-" + std::to_string(i % 5 == 4 ? i - 3 : i);
    keys.insert(key);
    msgs.push_back({key, "v" + key});
  }
  kafka.produce("orders", msgs);
  auto config = [&](const std::string& host) {
    return base_config(kafka, db, host, "g", "max_in_flight = 200\n",
                       "\"partition.assignment.strategy\" = \"" + strategy + "\"\n") +
           route_config({"waybill",
                         "orders",
                         "scripted_idempotent.so",
                         "",
                         {{"log", "\"" + calls.string() + "\""}, {"delay", "\"40ms\""}}});
  };
  auto conn = MariaDbServer::shared().connect(dbname);
  auto done_count = [&] {
    try {
      return std::stoi(*conn->query("SELECT COUNT(*) FROM idemsink_claim WHERE status = 2")[0][0]);
    } catch (const db::DbError&) {
      return 0;  // the host has not created its tables yet
    }
  };

  HostProcess a(dir, "host-a", config("host-a"));
  wait_until([&] { return done_count() >= 300; }, 60s, "host-a to make progress");
  HostProcess b(dir, "host-b", config("host-b"));  // partitions move while A has calls in flight
  wait_until([&] { return b.log().find("kafka: assigned") != std::string::npos; }, 60s, "host-b to get partitions");
  wait_until([&] { return done_count() >= 1500; }, 120s, "both hosts to make progress");
  BOOST_TEST(a.stop() == 0);  // A drains and leaves; B takes everything
  wait_committed(kafka, "g", {{"orders", 8}}, b);
  BOOST_TEST(b.stop() == 0);

  // Clean hand-overs: no key was ever called twice, by either host.
  std::map<std::string, int> invocations;
  for (const auto& cols : read_call_log(calls)) ++invocations[cols.at(1)];
  BOOST_TEST(invocations.size() == keys.size());
  int twice = 0;
  for (const auto& k : keys)
    if (invocations[to_hex(k)] != 1) ++twice;
  BOOST_TEST(twice == 0, twice << " keys called more than once");
  BOOST_TEST(done_count() == static_cast<int>(keys.size()));
  BOOST_TEST(a.log().find("revoking") != std::string::npos);
  BOOST_TEST(b.log().find("assigned") != std::string::npos);
}

}  // namespace

BOOST_AUTO_TEST_CASE(eager_rebalance_hands_over_without_duplicates) { two_hosts_share_and_hand_over("range"); }

BOOST_AUTO_TEST_CASE(cooperative_sticky_rebalance_hands_over_without_duplicates) {
  two_hosts_share_and_hand_over("cooperative-sticky");
}

// librdkafka before 2.3 aborts when a cooperative-sticky consumer is closed
// after its JoinGroup answer but before its SyncGroup answer (its first
// assignment). A host restarted after a crash and stopped at once meets that
// window while the group waits out the dead member: it must drain and exit 0.
BOOST_AUTO_TEST_CASE(cooperative_sticky_host_stopped_before_its_first_assignment_exits_cleanly,
                     *boost::unit_test::precondition(mock_only)) {
  auto db = MariaDbServer::shared().fresh_database("rebalance_early_stop");
  TestKafka kafka;
  kafka.create_topic("orders", 6);
  ScratchDir dir("rebalance");
  const auto calls = dir / "calls.log";
  std::vector<TestMessage> msgs;
  std::set<std::string> keys;
  for (int i = 0; i < 3000; ++i) {
    keys.insert("o-" + std::to_string(i));
    msgs.push_back({"o-" + std::to_string(i), "v"});
  }
  kafka.produce("orders", msgs);
  auto config = [&](const std::string& host, const std::string& extra_consumer = "") {
    return base_config(kafka, db, host, "g", "",
                       "\"partition.assignment.strategy\" = \"cooperative-sticky\"\n" + extra_consumer) +
           route_config({"waybill",
                         "orders",
                         "scripted_idempotent.so",
                         "",
                         {{"log", "\"" + calls.string() + "\""}, {"delay", "\"20ms\""}}});
  };
  HostProcess a(dir, "host-a", config("host-a"));
  HostProcess b(dir, "host-b", config("host-b"));
  auto c = std::make_unique<HostProcess>(dir, "host-c", config("host-c"));
  for (HostProcess* h : {&a, &b, c.get()})
    wait_until([&] { return h->log().find("kafka: assigned") != std::string::npos; }, 60s, "every host assigned");
  c->kill();
  // Slow requests widen the window between the JoinGroup and SyncGroup answers.
  kafka.command("rtt 1 800");
  for (int round = 0; round < 2; ++round) {
    BOOST_TEST_CONTEXT("restart " << round) {
      // The restarted host logs the group protocol, to be stopped right
      // after its JoinGroup answer, before any assignment.
      std::string cfg = config("host-c", "\"debug\" = \"cgrp\"\n");
      cfg.replace(cfg.find("log_level = \"info\""), 18, "log_level = \"debug\"");
      c = std::make_unique<HostProcess>(dir, "host-c-" + std::to_string(round), cfg);
      wait_until([&] { return c->log().find("JoinGroup response") != std::string::npos; }, 60s,
                 "host-c's JoinGroup answer");
      const int rc = c->stop();
      BOOST_TEST(rc == 0, "exit " << rc << "\n" << c->log());
      BOOST_TEST(c->log().find("Assertion") == std::string::npos);
      BOOST_TEST(c->log().find("idemsink host host-c stopped") != std::string::npos);
    }
  }
  kafka.command("rtt 1 0");
  wait_committed(kafka, "g", {{"orders", 6}}, a);
  BOOST_TEST(a.stop() == 0);
  BOOST_TEST(b.stop() == 0);
  // Every key called, each with one token (a call repeated after the kill
  // carries the same token: the remote applies it once).
  std::map<std::string, std::set<std::string>> tokens;
  for (const auto& cols : read_call_log(calls)) tokens[cols.at(1)].insert(cols.at(2));
  BOOST_TEST(tokens.size() == keys.size());
  for (const auto& [key, t] : tokens) BOOST_TEST(t.size() == 1u, key);
}
