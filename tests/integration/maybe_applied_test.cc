// An effect that may have happened is never dead-lettered as "failed".
//
// The waybill API applies a share of calls and then answers too late (the
// plugin times out: uncertain), and refuses others with 503 before doing
// anything. A record whose attempts run out after such an uncertain call
// ends unknown and the reconcile hook asks the API: every order must end
// done exactly when the API applied it, failed exactly when it did not.
#define BOOST_TEST_MODULE maybe_applied
#include <boost/test/unit_test.hpp>
#include <map>
#include <set>

#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace std::chrono_literals;

namespace {

// Unknowns are dead-lettered at once (no hold for reconciliation), so the
// DLQ copies of settled records can be checked for their headers.
const std::string kReconcileEverySecond =
    "reconcile_interval = \"1s\"\nreconcile_after = \"1s\"\nunknown_dlq_after = \"0s\"\n";

struct Tally {
  size_t orders = 0, applied = 0, done = 0, dead = 0, settled_done = 0, settled_failed = 0, applied_but_dead = 0,
         done_not_applied = 0;
};

// `retry` is the route's [route.retry] table body.
Tally run_scenario(const std::string& name, const std::string& retry, const std::string& seed, int orders) {
  FakeServices services(fake_services_binary(),
                        {"--seed", seed, "--hold", "1200", "--faults",
                         "waybill:latency_mean_ms=3,latency_p99_ms=30,timeout_after_apply=0.2,error_5xx=0.35"});
  Scenario s(name);
  for (const std::string t : {"orders", "orders.dlq", "orders.retry.1", "orders.retry.2"}) s.topic(t, 2);
  s.kafka.produce("orders", order_messages(0, orders));
  auto& host = s.host(
      "host-a",
      {shipped_route("waybill", "orders", services.url(), "300ms", "call_timeout = \"5s\"\n[route.retry]\n" + retry)},
      {.host_lines = "max_in_flight = 200\n", .claim_lines = kReconcileEverySecond});
  s.wait_committed(host, {"orders"}, 180s);
  auto conn = s.connect();
  // Every unknown settled by the reconcile hook.
  wait_until(
      [&] {
        return scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE " +
                                 status_in(claim::Status::Pending, claim::Status::Unknown)) == 0;
      },
      120s, "every claim done or failed");
  BOOST_TEST(host.stop() == 0);

  const auto stats = services.stats()["waybill"];
  BOOST_TEST(stats["double_applied"].get<int>() == 0);
  const std::set<std::string> applied = services.applied("waybill");
  Tally t;
  t.orders = static_cast<size_t>(orders);
  t.applied = applied.size();
  for (const auto& r : conn->query("SELECT biz_key, status, IFNULL(last_error, '') FROM idemsink_claim")) {
    const bool was_applied = applied.count(*r[0]) != 0;
    const bool reconciled = r[2]->rfind("reconciled:", 0) == 0;
    if (*r[1] == "2") {
      ++t.done;
      if (reconciled) ++t.settled_done;
      if (!was_applied) ++t.done_not_applied;
    } else {
      ++t.dead;
      if (reconciled) ++t.settled_failed;
      if (was_applied) ++t.applied_but_dead;
    }
  }
  BOOST_TEST_MESSAGE(name << " seed " << seed << ": " << t.orders << " orders, " << t.applied << " applied by the API, "
                          << t.done << " done, " << t.dead << " dead, " << t.settled_done
                          << " unknown then settled done, " << t.settled_failed << " unknown then settled failed, "
                          << t.applied_but_dead << " applied but dead");
  BOOST_TEST(t.done + t.dead == t.orders);
  BOOST_TEST(t.applied_but_dead == 0u);
  BOOST_TEST(t.done_not_applied == 0u);
  BOOST_TEST(t.done == t.applied);
  BOOST_TEST(t.settled_done > 0u, "the scenario never produced an applied call that later ran out of attempts");
  // The DLQ entries of settled records say how many calls were uncertain.
  auto dlq = s.kafka.read_all("orders.dlq", 2);
  size_t with_uncertain = 0;
  for (const auto& m : dlq)
    if (m.headers.count("idemsink.uncertain_calls") && m.headers.at("idemsink.reason") == "maybe_applied")
      ++with_uncertain;
  BOOST_TEST(with_uncertain > 0u);
  return t;
}

}  // namespace

BOOST_AUTO_TEST_CASE(retry_topics_never_dead_letter_an_applied_order_as_failed) {
  for (const std::string seed : {"7", "8"})
    run_scenario("maybe_applied_topics_" + seed, "topics = [\"200ms\", \"400ms\"]\n", seed, 800);
}

BOOST_AUTO_TEST_CASE(in_place_retries_never_dead_letter_an_applied_order_as_failed) {
  run_scenario("maybe_applied_in_place", "max_attempts = 3\nbackoff_initial = \"10ms\"\nbackoff_max = \"50ms\"\n", "9",
               800);
}

// A record that keeps killing its host after the API applied it hits the
// crash-loop guard: it ends unknown and the reconcile hook finds the waybill.
BOOST_AUTO_TEST_CASE(a_crash_loop_record_whose_call_went_out_is_reconciled_not_failed) {
  FakeServices services(fake_services_binary());
  Scenario s("maybe_applied_crash_loop");
  s.topic("orders", 1).topic("orders.dlq", 1);
  s.kafka.produce("orders", {{"K1", "{\"order_id\":\"K1\"}"}});
  const auto route = shipped_route("waybill", "orders", services.url(), "2s");
  const std::string claim_lines = "max_takeovers = 2\n" + kReconcileEverySecond;
  // The host dies right after the API applied the order, twice.
  for (int run = 0; run < 2; ++run) {
    auto& crashing =
        s.host("host-a", {route}, {.claim_lines = claim_lines, .env = {{"IDEMSINK_FAULT", "after_handler_ok:1"}}});
    auto rc = crashing.proc().wait(60s);
    BOOST_REQUIRE_MESSAGE(rc && *rc == -9, "expected a SIGKILL\n" << crashing.log());
  }
  auto& host = s.host("host-a", {route}, {.claim_lines = claim_lines});
  s.wait_committed(host);
  auto conn = s.connect();
  wait_until(
      [&] {
        return scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Done)) == 1;
      },
      60s, "the crash-loop record reconciled done");
  BOOST_TEST(host.stop() == 0);
  BOOST_TEST(host.log().find("crash_loop") != std::string::npos);
  const auto row = conn->query("SELECT receipt, last_error, takeovers FROM idemsink_claim")[0];
  const auto stats = services.stats()["waybill"];
  BOOST_TEST(stats["applied"].get<int>() == 1);
  BOOST_TEST(row[0]->rfind("WB", 0) == 0, *row[0]);
  BOOST_TEST(*row[1] == "reconciled: the effect happened");
  BOOST_TEST(*row[2] == "2");
}
