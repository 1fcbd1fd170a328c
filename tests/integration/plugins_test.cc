// The shipped plugins against the fake external services with faults on:
// 10% timeouts after applying, 5% 5xx before applying, 1% business
// rejections, a few thousand records per route with duplicates. The services'
// own counters must show every waybill and reservation applied once, every
// SMS at most once, every ledger credit once; the audit must account for
// every committed offset.
#define BOOST_TEST_MODULE plugins
#include <boost/test/unit_test.hpp>
#include <map>
#include <set>

#include "tests/support/certificates.h"
#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(shipped_plugins_apply_each_effect_once_under_faults) {
  const std::string faults =
      "latency_mean_ms=4,latency_p99_ms=40,timeout_after_apply=0.1,error_5xx=0.05,reject_4xx=0.01";
  FakeServices services(fake_services_binary(), {"--hold", "1500", "--faults", "waybill:" + faults, "--faults",
                                                 "inventory:" + faults, "--faults", "sms:" + faults});
  Scenario s("plugins_faults");
  const std::vector<std::string> topics{"waybill", "inventory", "sms", "ledger"};
  for (const auto& t : topics) s.topic(t, 4).topic(t + ".dlq", 1);
  // 2500 records per topic; one in five re-publishes an earlier order.
  std::set<std::string> orders;
  for (const auto& t : topics) {
    std::vector<TestMessage> msgs;
    for (int i = 0; i < 2500; ++i) {
      const int n = i % 5 == 4 ? i - 3 : i;
      const std::string id = "ord-" + std::to_string(n);
      orders.insert(id);
      msgs.push_back({id, "{\"order_id\":\"" + id + "\",\"account\":\"acct-" + std::to_string(n % 40) +
                              "\",\"amount\":" + std::to_string(n % 90 + 10) + ".25,\"phone\":\"+8613800000000\"}"});
    }
    s.kafka.produce(t, msgs);
  }
  const std::string retry =
      "call_timeout = \"5s\"\n[route.retry]\nmax_attempts = 12\n"
      "backoff_initial = \"20ms\"\nbackoff_max = \"200ms\"\n";
  std::vector<RouteSpec> routes;
  for (const auto& t : topics)
    routes.push_back(t == "ledger" ? RouteSpec{t, t, shipped_plugin(t), "", {}, retry}
                                   : shipped_route(t, t, services.url(), "300ms", retry));
  // The reconcile hook settles unknown SMS every second.
  auto& host = s.host("host-a", routes,
                      {.host_lines = "max_in_flight = 400\n",
                       .claim_lines = "reconcile_interval = \"1s\"\nreconcile_after = \"1s\"\n"});

  s.wait_committed(host, 180s);
  auto conn = s.connect();
  // The unknown SMS (timeouts after sending) get settled by the reconcile hook.
  wait_until(
      [&] {
        return scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Unknown)) == 0;
      },
      60s, "unknown SMS claims to be reconciled");

  auto stats = services.stats();
  BOOST_TEST_MESSAGE("fake services: " << stats["waybill"].dump().substr(0, 300));
  for (const char* svc : {"waybill", "inventory"}) {
    BOOST_TEST_CONTEXT(svc) {
      const auto& counters = stats[svc];
      BOOST_TEST(counters["double_applied"].get<int>() == 0);
      BOOST_TEST(counters["timeouts_after_apply"].get<int>() > 0);  // the faults really happened
      BOOST_TEST(counters["errors_5xx"].get<int>() > 0);
      const int done =
          static_cast<int>(scalar(*conn, std::string("SELECT COUNT(*) FROM idemsink_claim WHERE namespace = '") + svc +
                                             "' AND " + sql_status_is(claim::Status::Done)));
      const int failed =
          static_cast<int>(scalar(*conn, std::string("SELECT COUNT(*) FROM idemsink_claim WHERE namespace = '") + svc +
                                             "' AND " + sql_status_is(claim::Status::Failed)));
      BOOST_TEST(done + failed == static_cast<int>(orders.size()));
      BOOST_TEST(counters["orders"].get<int>() == done);          // one effect per done order, none for rejected ones
      BOOST_TEST(failed == counters["rejected_4xx"].get<int>());  // a rejection is final: one call per rejected order
      BOOST_TEST(failed > 0);
      for (const auto& [order, n] : counters["per_order"].items()) BOOST_TEST(n.get<int>() == 1, order);
      // Rejected orders are dead-lettered once each.
      BOOST_TEST(static_cast<int>(s.kafka.read_all(std::string(svc) + ".dlq", 1).size()) == failed);
    }
  }
  {
    const auto& counters = stats["sms"];
    BOOST_TEST(counters["double_applied"].get<int>() == 0);  // at most once, even with timeouts after sending
    BOOST_TEST(counters["timeouts_after_apply"].get<int>() > 0);
    const int done = static_cast<int>(scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE namespace = 'sms' AND " +
                                                        sql_status_is(claim::Status::Done)));
    BOOST_TEST(counters["orders"].get<int>() == done);  // every SMS counted done was really sent, once
    BOOST_TEST(scalar(*conn,
                      "SELECT COUNT(*) FROM idemsink_claim WHERE namespace = 'sms' AND " +
                          sql_status_is(claim::Status::Done) +
                          " AND "
                          "last_error LIKE 'reconciled%'") > 0);  // some were settled by the reconcile hook
  }
  // Ledger: each order credited once; the shipped duplicate check agrees.
  BOOST_TEST(scalar(*conn, "SELECT COUNT(*) FROM ledger_entries") == static_cast<int64_t>(orders.size()));
  BOOST_TEST(host.stop() == 0);
  auto check = run_cli(s.dir, "check", {"reconcile", "--check", "--config", host.config_path().string()});
  BOOST_TEST(check.first == 0, check.second);
  BOOST_TEST(check.second.find("ledger/duplicate_credits: 0 problem(s)") != std::string::npos, check.second);
  s.audit_clean(host);

  // A double credit slipped in behind idemsink's back is what the check is for.
  conn->execute(
      "INSERT INTO ledger_entries (biz_key, entry_type, account, amount_cents, idem_token) "
      "SELECT biz_key, entry_type, account, amount_cents, idem_token FROM ledger_entries LIMIT 1");
  check = run_cli(s.dir, "check2", {"reconcile", "--check", "--config", host.config_path().string()});
  BOOST_TEST(check.first == 1, check.second);
  BOOST_TEST(check.second.find("1 problem(s)") != std::string::npos, check.second);
}

// The records that used to kill the host (issue: a 400 KB value nested
// 200,000 deep, a key that is not UTF-8) are refused before sending, with a
// reason; a binary value is carried as base64. The host runs on.
BOOST_AUTO_TEST_CASE(hostile_records_are_refused_before_sending_and_never_crash_the_host) {
  FakeServices services(fake_services_binary());
  Scenario s("plugins_hostile");
  for (const std::string t : {"orders", "orders.dlq", "sms", "sms.dlq"}) s.topic(t, 1);
  s.kafka.produce("orders", {{"deep", std::string(200000, '[') + std::string(200000, ']')},
                             {"binary", std::string("\xFF\x00\x80 raw", 7)},
                             {"plain", "{\"order_id\":\"plain\"}"}});
  s.kafka.produce("sms", {{std::string("S\xC0\xAF"), "{\"phone\":\"1\"}"}, {"S2", "{\"phone\":\"2\"}"}});
  auto& host = s.host(
      "host-a", {shipped_route("waybill", "orders", services.url()), shipped_route("sms", "sms", services.url())});
  s.wait_committed(host);
  auto conn = s.connect();
  std::map<std::string, std::string> status;
  for (const auto& r : conn->query("SELECT biz_key, status FROM idemsink_claim")) status[*r[0]] = *r[1];
  BOOST_TEST(status["deep"] == "3");  // failed: refused, never sent
  BOOST_TEST(status["binary"] == "2");
  BOOST_TEST(status["plain"] == "2");
  BOOST_TEST(status[std::string("S\xC0\xAF")] == "3");  // failed, not unknown: certainly not sent
  BOOST_TEST(status["S2"] == "2");
  const auto stats = services.stats();
  BOOST_TEST(stats["waybill"]["applied"].get<int>() == 2);
  BOOST_TEST(stats["sms"]["requests"].get<int>() == 1);
  auto dlq = s.kafka.read_all("orders.dlq", 1);
  BOOST_REQUIRE(dlq.size() == 1u);
  BOOST_TEST(dlq[0].headers["idemsink.reason"] == "permanent");
  BOOST_TEST(dlq[0].headers["idemsink.error"].find("200000 levels deep") != std::string::npos,
             dlq[0].headers["idemsink.error"]);
  BOOST_TEST(host.running());
  BOOST_TEST(host.stop() == 0);
}

// The `headers` option carries an API token from the environment on every
// request; a route without it is refused by the service (401: permanent).
BOOST_AUTO_TEST_CASE(extra_headers_carry_an_api_token_from_the_environment) {
  FakeServices services(fake_services_binary(), {"--require-token", "t0ken-from-env"});
  Scenario s("plugins_headers");
  for (const std::string t : {"orders", "orders.dlq", "stock", "stock.dlq"}) s.topic(t, 1);
  const auto msgs = keyed_messages("H", 0, 10);
  s.kafka.produce("orders", msgs);
  s.kafka.produce("stock", msgs);
  auto waybill = shipped_route("waybill", "orders", services.url());
  waybill.options["headers"] = "\"Authorization: Bearer ${API_TOKEN}\"";
  auto& host = s.host("host-a", {waybill, shipped_route("inventory", "stock", services.url())},
                      {.env = {{"API_TOKEN", "t0ken-from-env"}}});
  s.wait_committed(host);
  BOOST_TEST(host.stop() == 0);
  BOOST_TEST(services.stats()["waybill"]["applied"].get<int>() == 10);
  BOOST_TEST(services.stats()["inventory"]["applied"].get<int>() == 0);
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE namespace = 'waybill' AND " +
                      sql_status_is(claim::Status::Done)) == 10);
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE namespace = 'inventory' AND " +
                      sql_status_is(claim::Status::Failed)) == 10);
  BOOST_TEST(host.log().find("t0ken-from-env") == std::string::npos);
}

// https:// endpoints: the service's certificate is checked against tls_ca
// (chain and host name) with SNI; a service whose certificate another CA
// signed is never sent anything (a retryable failure before sending).
BOOST_AUTO_TEST_CASE(https_endpoints_verify_the_service_certificate) {
  TestCertificates certs;
  FakeServices services(fake_services_binary(),
                        {"--tls-cert", certs.path("server.pem"), "--tls-key", certs.path("server.key")});
  Scenario s("plugins_https");
  for (const std::string t : {"orders", "orders.dlq", "stock", "stock.dlq"}) s.topic(t, 1);
  const auto msgs = keyed_messages("T", 0, 10);
  s.kafka.produce("orders", msgs);
  s.kafka.produce("stock", msgs);
  const std::string give_up_fast = "[route.retry]\nmax_attempts = 2\nbackoff_initial = \"10ms\"\n";
  auto waybill = shipped_route("waybill", "orders", services.tls_url(), "", give_up_fast);
  waybill.options["tls_ca"] = "\"" + certs.path("ca.pem") + "\"";
  // Every call failing would open the route's circuit and hold the records
  // for the certificate to be fixed; off, they reach the DLQ with the error
  // this test reads.
  auto inventory =
      shipped_route("inventory", "stock", services.tls_url(), "", give_up_fast + "[route.circuit]\nenabled = false\n");
  inventory.options["tls_ca"] = "\"" + certs.path("other-ca.pem") + "\"";
  auto& host = s.host("host-a", {waybill, inventory});
  s.wait_committed(host);
  BOOST_TEST(host.stop() == 0);
  const auto stats = services.stats();
  BOOST_TEST(stats["waybill"]["applied"].get<int>() == 10);
  BOOST_TEST(stats["inventory"]["requests"].get<int>() == 0);  // nothing reached the impostor
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE namespace = 'waybill' AND " +
                      sql_status_is(claim::Status::Done)) == 10);
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE namespace = 'inventory' AND " +
                      sql_status_is(claim::Status::Failed) +
                      " AND "
                      "last_error LIKE '%certificate verify failed%'") == 10);
}
