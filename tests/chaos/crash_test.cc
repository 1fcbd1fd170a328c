// Crash windows: the host SIGKILLs itself at the seed's cut points
// (IDEMSINK_FAULT), is restarted, and must still apply every effect exactly
// once and commit every offset.
//
//   after_claim_commit  claim committed, handler not called   (A -> B)
//   after_handler_ok    handler applied, claim not marked done (B -> C)
//   after_mark_done     claim done, offset not committed       (C -> commit)
//   in_local_tx         local_tx write done, transaction open
#define BOOST_TEST_MODULE crash
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

using Topics = std::vector<std::pair<std::string, int>>;

// `n` records; every `duplicate_every`-th re-publishes the order of three
// records earlier (same payload), so 1 in `duplicate_every` is a duplicate.
std::vector<TestMessage> orders(int n, int duplicate_every, const std::string& prefix, std::set<std::string>& keys) {
  std::vector<TestMessage> msgs;
  for (int i = 0; i < n; ++i) {
    const int order = (duplicate_every > 0 && i % duplicate_every == duplicate_every - 1) ? i - 3 : i;
    const std::string key = prefix + std::to_string(order);
    keys.insert(key);
    msgs.push_back({key, "{\"amount\":" + std::to_string(order % 97) + "}"});
  }
  return msgs;
}

// Every key invoked with exactly one idem_token: the remote applied it once.
void check_remote_exactly_once(const std::filesystem::path& calls, const std::set<std::string>& keys,
                               size_t* reinvoked = nullptr) {
  std::map<std::string, std::set<std::string>> tokens;
  std::map<std::string, int> invocations;
  for (const auto& cols : read_call_log(calls)) {
    tokens[cols.at(1)].insert(cols.at(2));
    ++invocations[cols.at(1)];
  }
  BOOST_TEST(tokens.size() == keys.size());
  size_t again = 0;
  for (const auto& k : keys) {
    BOOST_TEST(tokens[to_hex(k)].size() == 1u, k << " was called with " << tokens[to_hex(k)].size() << " tokens");
    if (invocations[to_hex(k)] > 1) ++again;
  }
  if (reinvoked) *reinvoked = again;
}

void check_claims_all_done(const std::string& database, size_t expected) {
  auto conn = MariaDbServer::shared().connect(database);
  auto rows = conn->query("SELECT status, COUNT(*) FROM idemsink_claim GROUP BY status");
  BOOST_REQUIRE(rows.size() == 1u);
  BOOST_TEST(*rows[0][0] == "2");
  BOOST_TEST(std::stoul(*rows[0][1]) == expected);
}

// Runs the host with a fault armed until it kills itself, then again
// without, until everything is committed.
void crash_and_recover(TestKafka& kafka, const ScratchDir& dir, const std::string& config, const std::string& fault,
                       const std::string& group, const Topics& topics) {
  {
    HostProcess crashing(dir, "crashing-" + fault.substr(0, fault.find(':')), config, {{"IDEMSINK_FAULT", fault}});
    auto rc = crashing.proc().wait(120s);
    BOOST_REQUIRE_MESSAGE(rc.has_value(), "the fault " << fault << " never fired");
    BOOST_REQUIRE_MESSAGE(*rc == -9, "expected SIGKILL, got " << *rc << "\n" << crashing.log());
    BOOST_TEST(crashing.log().find("fault point") != std::string::npos);
  }
  HostProcess recovering(dir, "recovering", config);
  wait_committed(kafka, group, topics, recovering);
  BOOST_TEST(recovering.stop() == 0);
}

void remote_crash_case(const std::string& point) {
  const std::string dbname = "crash_remote_" + point;
  auto db = MariaDbServer::shared().fresh_database(dbname);
  TestKafka kafka;
  kafka.create_topic("orders", 4);
  ScratchDir dir("crash");
  std::set<std::string> keys;
  kafka.produce("orders", orders(2000, 5, "o-", keys));
  const auto calls = dir / "calls.log";
  const std::string config = base_config(kafka, db, "host-a", "g") +
                             route_config({"waybill",
                                           "orders",
                                           "scripted_idempotent.so",
                                           "",
                                           {{"log", "\"" + calls.string() + "\""}, {"delay", "\"2ms\""}}});
  crash_and_recover(kafka, dir, config, point + ":3", "g", {{"orders", 4}});
  size_t reinvoked = 0;
  check_remote_exactly_once(calls, keys, &reinvoked);
  check_claims_all_done(dbname, keys.size());
  BOOST_TEST_MESSAGE(point << ": " << reinvoked << " keys were called again after the crash, all with their token");
}

}  // namespace

BOOST_AUTO_TEST_CASE(crash_after_claim_commit_remote_idempotent) { remote_crash_case("after_claim_commit"); }
BOOST_AUTO_TEST_CASE(crash_after_handler_ok_remote_idempotent) { remote_crash_case("after_handler_ok"); }
BOOST_AUTO_TEST_CASE(crash_after_mark_done_remote_idempotent) { remote_crash_case("after_mark_done"); }

BOOST_AUTO_TEST_CASE(crash_windows_local_tx) {
  for (const std::string point : {"in_local_tx", "after_mark_done", "after_claim_commit"}) {
    BOOST_TEST_CONTEXT("fault " << point) {
      const std::string dbname = "crash_local_" + point;
      auto db = MariaDbServer::shared().fresh_database(dbname);
      TestKafka kafka;
      kafka.create_topic("ledger", 4);
      ScratchDir dir("crash");
      std::set<std::string> keys;
      kafka.produce("ledger", orders(2000, 5, "pay-", keys));
      const std::string config =
          base_config(kafka, db, "host-a", "g") + route_config({"ledger", "ledger", "test_local_tx.so", "", {}});
      crash_and_recover(kafka, dir, config, point + ":3", "g", {{"ledger", 4}});
      auto conn = MariaDbServer::shared().connect(dbname);
      BOOST_TEST(std::stoul(*conn->query("SELECT COUNT(*) FROM test_effects")[0][0]) == keys.size());
      BOOST_TEST(conn->query("SELECT biz_key FROM test_effects GROUP BY biz_key HAVING COUNT(*) > 1").empty());
      check_claims_all_done(dbname, keys.size());
    }
  }
}

BOOST_AUTO_TEST_CASE(ten_thousand_records_two_kills_every_key_exactly_once) {
  // The acceptance run: 10,000 records over 8 partitions, 20%
  // duplicate biz_keys, the host SIGKILLed twice mid-run at different cut
  // points and restarted; a remote idempotent route and a local_tx route.
  const std::string dbname = "crash_10k";
  auto db = MariaDbServer::shared().fresh_database(dbname);
  TestKafka kafka;
  kafka.create_topic("orders", 8);
  kafka.create_topic("ledger", 8);
  ScratchDir dir("crash10k");
  std::set<std::string> order_keys, pay_keys;
  kafka.produce("orders", orders(10000, 5, "o-", order_keys));
  kafka.produce("ledger", orders(10000, 5, "pay-", pay_keys));
  const auto calls = dir / "calls.log";
  const std::string config = base_config(kafka, db, "host-a", "g") +
                             route_config({"waybill",
                                           "orders",
                                           "scripted_idempotent.so",
                                           "",
                                           {{"log", "\"" + calls.string() + "\""}, {"delay", "\"1ms\""}}}) +
                             route_config({"ledger", "ledger", "test_local_tx.so", "", {}});
  const Topics topics{{"orders", 8}, {"ledger", 8}};
  // The first run dies inside its 20th local_tx transaction: the ledger's
  // 8,000 keys take at least 80 of them (100 records at most each), so that
  // point is always reached. Only then the waybill cut: ledger transactions
  // outrun 1 ms remote calls many times over, so the first run leaves far
  // more than 2,000 waybill keys; the other way round, a first run could
  // finish the whole ledger before its 2,000th call and leave the second
  // nothing to die in.
  for (const std::string fault : {"in_local_tx:20", "after_handler_ok:2000"}) {
    HostProcess crashing(dir, "crashing", config, {{"IDEMSINK_FAULT", fault}});
    auto rc = crashing.proc().wait(180s);
    BOOST_REQUIRE_MESSAGE(rc.has_value() && *rc == -9, "fault " << fault << " did not kill the host; its log (tail):\n"
                                                                << crashing.log_tail());
  }
  HostProcess recovering(dir, "recovering", config);
  wait_committed(kafka, "g", topics, recovering, 180s);
  BOOST_TEST(recovering.stop() == 0);

  size_t reinvoked = 0;
  check_remote_exactly_once(calls, order_keys, &reinvoked);
  auto conn = MariaDbServer::shared().connect(dbname);
  BOOST_TEST(std::stoul(*conn->query("SELECT COUNT(*) FROM test_effects")[0][0]) == pay_keys.size());
  BOOST_TEST(conn->query("SELECT biz_key FROM test_effects GROUP BY biz_key HAVING COUNT(*) > 1").empty());
  check_claims_all_done(dbname, order_keys.size() + pay_keys.size());
  BOOST_TEST_MESSAGE("10k run: " << order_keys.size() << " + " << pay_keys.size() << " keys, " << reinvoked
                                 << " waybill keys re-invoked after the kills (same token each time)");
}

BOOST_AUTO_TEST_CASE(at_most_once_never_calls_twice_across_a_crash) {
  const std::string dbname = "crash_at_most_once";
  auto db = MariaDbServer::shared().fresh_database(dbname);
  TestKafka kafka;
  kafka.create_topic("sms", 4);
  kafka.create_topic("sms.dlq", 1);
  ScratchDir dir("crash");
  std::set<std::string> keys;
  kafka.produce("sms", orders(1000, 0, "sms-", keys));
  const auto calls = dir / "calls.log";
  const std::string config = base_config(kafka, db, "host-a", "g") +
                             route_config({"sms",
                                           "sms",
                                           "scripted_at_most_once.so",
                                           "",
                                           {{"log", "\"" + calls.string() + "\""}, {"delay", "\"20ms\""}}});
  crash_and_recover(kafka, dir, config, "after_handler_ok:100", "g", {{"sms", 4}});

  std::map<std::string, int> invocations;
  for (const auto& cols : read_call_log(calls)) ++invocations[cols.at(1)];
  for (const auto& [k, n] : invocations) BOOST_TEST(n == 1, k << " sent " << n << " times");
  auto conn = MariaDbServer::shared().connect(dbname);
  const auto unknown = std::stoul(
      *conn->query("SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Unknown))[0][0]);
  const auto done =
      std::stoul(*conn->query("SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Done))[0][0]);
  BOOST_TEST(unknown > 0u);  // in flight at the kill: maybe sent, so never sent again
  BOOST_TEST(done + unknown == keys.size());
  auto dlq = kafka.read_all("sms.dlq", 1);
  BOOST_TEST(dlq.size() == unknown);  // each unknown is also copied to the DLQ
  for (const auto& m : dlq) BOOST_TEST(m.headers.at("idemsink.reason") == "owner_vanished");
}

BOOST_AUTO_TEST_CASE(database_going_away_mid_run_is_survived) {
  const std::string dbname = "crash_db_gone";
  auto& server = MariaDbServer::shared();
  auto db = server.fresh_database(dbname);
  TestKafka kafka;
  kafka.create_topic("orders", 4);
  ScratchDir dir("crash");
  std::set<std::string> keys;
  kafka.produce("orders", orders(3000, 5, "o-", keys));
  const auto calls = dir / "calls.log";
  HostProcess host(dir, "host",
                   base_config(kafka, db, "host-a", "g") +
                       route_config({"waybill",
                                     "orders",
                                     "scripted_idempotent.so",
                                     "",
                                     {{"log", "\"" + calls.string() + "\""}, {"delay", "\"5ms\""}}}));
  wait_until([&] { return read_call_log(calls).size() >= 500; }, 60s, "progress before the outage");
  server.kill();  // the business database disappears under load
  wait_until([&] { return host.log().find("cannot reach the database") != std::string::npos; }, 30s,
             "the host to notice the outage");
  BOOST_TEST(host.running());
  server.restart();
  wait_committed(kafka, "g", {{"orders", 4}}, host);
  BOOST_TEST(host.stop() == 0);
  check_remote_exactly_once(calls, keys);
  check_claims_all_done(dbname, keys.size());
}
