// Rebalance and shutdown: two hosts in one group, partitions moving while
// calls are in flight. On revoke a host stops taking records of the
// partition, lets in-flight calls finish within the grace period, commits and
// hands back claims it never called; SIGTERM does the same for everything.
#define BOOST_TEST_MODULE rebalance
#include <boost/test/unit_test.hpp>
#include <map>
#include <set>

#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace std::chrono_literals;

namespace {

void two_hosts_share_and_hand_over(const std::string& strategy) {
  const std::string dbname = "rebalance_" + strategy.substr(0, strategy.find('-'));
  Scenario s(dbname);
  s.topic("orders", 8);
  std::vector<TestMessage> msgs;
  std::set<std::string> keys;
  for (int i = 0; i < 3000; ++i) {
    const std::string key = "o-" + std::to_string(i % 5 == 4 ? i - 3 : i);
    keys.insert(key);
    msgs.push_back({key, "v" + key});
  }
  s.kafka.produce("orders", msgs);
  const auto route = with_delay(s.scripted("waybill", "orders"), "40ms");
  const Scenario::HostOptions opt{.host_lines = "max_in_flight = 200\n",
                                  .consumer_lines = "\"partition.assignment.strategy\" = \"" + strategy + "\"\n"};
  auto conn = s.connect();
  auto done_count = [&] {
    try {
      return std::stoi(
          *conn->query("SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Done))[0][0]);
    } catch (const db::DbError&) {
      return 0;  // the host has not created its tables yet
    }
  };

  auto& a = s.host("host-a", {route}, opt);
  wait_until([&] { return done_count() >= 300; }, 60s, "host-a to make progress");
  auto& b = s.host("host-b", {route}, opt);  // partitions move while A has calls in flight
  wait_until([&] { return b.log().find("kafka: assigned") != std::string::npos; }, 60s, "host-b to get partitions");
  wait_until([&] { return done_count() >= 1500; }, 120s, "both hosts to make progress");
  BOOST_TEST(a.stop() == 0);  // A drains and leaves; B takes everything
  s.wait_committed(b);
  BOOST_TEST(b.stop() == 0);

  // Clean hand-overs: no key was ever called twice, by either host.
  auto invocations = s.calls_per_key();
  BOOST_TEST(invocations.size() == keys.size());
  int twice = 0;
  for (const auto& k : keys)
    if (invocations[k] != 1) ++twice;
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
  Scenario s("rebalance_early_stop");
  s.topic("orders", 6);
  std::vector<TestMessage> msgs;
  std::set<std::string> keys;
  for (int i = 0; i < 3000; ++i) {
    keys.insert("o-" + std::to_string(i));
    msgs.push_back({"o-" + std::to_string(i), "v"});
  }
  s.kafka.produce("orders", msgs);
  const auto route = with_delay(s.scripted("waybill", "orders"), "20ms");
  const std::string cooperative = "\"partition.assignment.strategy\" = \"cooperative-sticky\"\n";
  auto& a = s.host("host-a", {route}, {.consumer_lines = cooperative});
  auto& b = s.host("host-b", {route}, {.consumer_lines = cooperative});
  HostProcess* c = &s.host("host-c", {route}, {.consumer_lines = cooperative});
  for (HostProcess* h : {&a, &b, c})
    wait_until([&] { return h->log().find("kafka: assigned") != std::string::npos; }, 60s, "every host assigned");
  c->kill();
  // Slow requests widen the window between the JoinGroup and SyncGroup answers.
  s.kafka.command("rtt 1 800");
  const auto debug_log = [](std::string& cfg) {
    cfg.replace(cfg.find("log_level = \"info\""), 18, "log_level = \"debug\"");
  };
  for (int round = 0; round < 2; ++round) {
    BOOST_TEST_CONTEXT("restart " << round) {
      // The restarted host logs the group protocol, to be stopped right
      // after its JoinGroup answer, before any assignment.
      c = &s.host("host-c", {route}, {.consumer_lines = cooperative + "\"debug\" = \"cgrp\"\n", .edit = debug_log});
      wait_until([&] { return c->log().find("JoinGroup response") != std::string::npos; }, 60s,
                 "host-c's JoinGroup answer");
      const int rc = c->stop();
      BOOST_TEST(rc == 0, "exit " << rc << "\n" << c->log());
      BOOST_TEST(c->log().find("Assertion") == std::string::npos);
      BOOST_TEST(c->log().find("idemsink host host-c stopped") != std::string::npos);
    }
  }
  s.kafka.command("rtt 1 0");
  s.wait_committed(a);
  BOOST_TEST(a.stop() == 0);
  BOOST_TEST(b.stop() == 0);
  // Every key called, each with one token (a call repeated after the kill
  // carries the same token: the remote applies it once).
  std::map<std::string, std::set<std::string>> tokens;
  for (const auto& [key, calls] : s.calls_by_key())
    for (const auto& cols : calls) tokens[key].insert(cols.at(2));
  BOOST_TEST(tokens.size() == keys.size());
  for (const auto& [key, t] : tokens) BOOST_TEST(t.size() == 1u, key);
}
