// One database per route: a host serving a route that claims in one
// MariaDB and a local_tx route whose writes must commit in another keeps
// each route's claims and business rows in its own database, and one
// database going down stalls only the route that uses it.
#define BOOST_TEST_MODULE databases
#include <boost/test/unit_test.hpp>

#include "devkit/mariadb_server.h"
#include "devkit/services.h"
#include "tests/support/host_fixture.h"
#include "tests/support/test_kafka.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace idemsink::devkit;
using namespace std::chrono_literals;

namespace {

std::vector<TestMessage> orders(int from, int to) {
  std::vector<TestMessage> out;
  for (int i = from; i < to; ++i) {
    const std::string id = "ord-" + std::to_string(i);
    out.push_back({id, "{\"order_id\":\"" + id + "\",\"account\":\"acct-" + std::to_string(i % 7) +
                           "\",\"amount\":" + std::to_string(i % 50 + 1) + ".50}"});
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(each_route_in_its_own_database_and_one_down_stalls_only_its_route) {
  auto logistics = MariaDbServer::shared().fresh_database("logistics");
  MariaDbServer finance_server;
  auto finance = finance_server.fresh_database("finance");
  TestKafka kafka;
  for (const std::string t : {"orders", "orders.dlq", "payments", "payments.dlq"}) kafka.create_topic(t, 2);
  ScratchDir dir("databases");
  const int admin = free_port();
  const auto calls = dir / "calls.log";
  const std::string cfg =
      base_config(kafka, logistics, "host-a", "g", "admin_listen = \"127.0.0.1:" + std::to_string(admin) + "\"\n") +
      route_config({"waybill", "orders", "scripted_idempotent.so", "", {{"log", "\"" + calls.string() + "\""}}}) +
      route_config({"ledger",
                    "payments",
                    shipped_plugin("ledger"),
                    "",
                    {},
                    "[route.database]\nport = " + std::to_string(finance.port) + "\ndatabase = \"finance\"\n"});
  HostProcess host(dir, "host", cfg);
  kafka.produce("orders", orders(0, 300));
  kafka.produce("payments", orders(0, 300));
  wait_committed(kafka, "g", {{"orders", 2}, {"payments", 2}}, host);

  // Each route's claims, and the ledger's rows, in its own database.
  auto in_logistics = MariaDbServer::shared().connect("logistics");
  auto in_finance = finance_server.connect("finance");
  BOOST_TEST(scalar(*in_logistics, "SELECT COUNT(*) FROM idemsink_claim WHERE namespace = 'waybill' AND " +
                                       sql_status_is(claim::Status::Done)) == 300);
  BOOST_TEST(scalar(*in_logistics, "SELECT COUNT(*) FROM idemsink_claim WHERE namespace = 'ledger'") == 0);
  BOOST_TEST(scalar(*in_finance, "SELECT COUNT(*) FROM idemsink_claim WHERE namespace = 'ledger' AND " +
                                     sql_status_is(claim::Status::Done)) == 300);
  BOOST_TEST(scalar(*in_finance, "SELECT COUNT(*) FROM idemsink_claim WHERE namespace = 'waybill'") == 0);
  BOOST_TEST(scalar(*in_finance, "SELECT COUNT(*) FROM ledger_entries") == 300);
  BOOST_TEST(scalar(*in_logistics,
                    "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = 'logistics' AND "
                    "table_name = 'ledger_entries'") == 0);
  // Metrics and health name each database.
  const std::string metrics = http_request(admin, "GET", "/metrics").second;
  BOOST_TEST(metrics.find("idemsink_db_healthy{database=\"finance@127.0.0.1:" + std::to_string(finance.port) +
                          "\"} 1") != std::string::npos,
             metrics);

  // The finance database goes down: payments stall, orders go on.
  in_finance.reset();
  finance_server.kill();
  kafka.produce("orders", orders(300, 600));
  kafka.produce("payments", orders(300, 600));
  wait_committed(kafka, "g", {{"orders", 2}}, host);
  wait_until([&] { return http_request(admin, "GET", "/healthz").first == 503; }, 30s, "/healthz to report it");
  const auto health = http_request(admin, "GET", "/healthz");
  BOOST_TEST(health.second.find("database finance@") != std::string::npos, health.second);
  const auto payments = kafka.committed("g", "payments", 2);
  BOOST_TEST(payments.at(0) + payments.at(1) == 300);  // nothing of payments past what finance recorded
  BOOST_TEST(scalar(*in_logistics, "SELECT COUNT(*) FROM idemsink_claim WHERE namespace = 'waybill' AND " +
                                       sql_status_is(claim::Status::Done)) == 600);

  // Back up: payments catch up, each credited once.
  finance_server.restart();
  wait_committed(kafka, "g", {{"orders", 2}, {"payments", 2}}, host, 180s);
  in_finance = finance_server.connect("finance");
  BOOST_TEST(scalar(*in_finance, "SELECT COUNT(*) FROM ledger_entries") == 600);
  BOOST_TEST(scalar(*in_finance, "SELECT COUNT(DISTINCT biz_key) FROM ledger_entries") == 600);
  BOOST_TEST(read_call_log(calls).size() == 600u);  // no waybill call twice
  wait_until([&] { return http_request(admin, "GET", "/healthz").first == 200; }, 30s, "/healthz to recover");
  BOOST_TEST(host.stop() == 0);

  // The audit and the replay command work per route's database.
  auto [rc_audit, out_audit] = audit(dir, host);
  BOOST_TEST(rc_audit == 0, out_audit);
  BOOST_TEST(out_audit.find("database finance@") != std::string::npos, out_audit);
  // Outbox ids are per database: with two, --retry must say which.
  auto [rc_dlq, out_dlq] = run_cli(dir, "dlq-retry", {"dlq", "--config", host.config_path().string(), "--retry", "1"});
  BOOST_TEST(rc_dlq == 2);
  BOOST_TEST(out_dlq.find("name one with --database: logistics@") != std::string::npos, out_dlq);
  auto [rc_replay, out_replay] =
      run_cli(dir, "replay", {"replay", "--config", host.config_path().string(), "--route", "ledger"});
  BOOST_TEST(rc_replay == 0, out_replay);
  BOOST_TEST(out_replay.find("0 failed claim(s) matched") != std::string::npos, out_replay);
}
