// Outages of the remote: a route's circuit opens when its calls fail, no
// attempt is spent while it is open, and the host keeps its assignment. An
// outage of any length dead-letters nothing the remote accepts afterwards;
// ordinary latency and the odd timeout never open the circuit.
#define BOOST_TEST_MODULE outage
#include <boost/test/unit_test.hpp>
#include <regex>
#include <set>

#include "devkit/services.h"
#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace std::chrono_literals;

namespace {

void set_waybill_faults(FakeServices& services, const std::string& json) {
  const auto [status, body] = http_request(services.port(), "POST", "/admin/faults/waybill", json);
  if (status != 200) throw std::runtime_error("fake services refused faults " + json + ": " + body);
}

void set_sms_faults(FakeServices& services, const std::string& json) {
  const auto [status, body] = http_request(services.port(), "POST", "/admin/faults/sms", json);
  if (status != 200) throw std::runtime_error("fake services refused faults " + json + ": " + body);
}

size_t count_lines(const std::string& log, const std::string& needle) {
  size_t n = 0;
  for (size_t at = log.find(needle); at != std::string::npos; at = log.find(needle, at + 1)) ++n;
  return n;
}

// The longest "circuit closed after N.Ns open" in the log: how long fetching paused.
double longest_open_seconds(const std::string& log) {
  static const std::regex re("circuit closed after ([0-9.]+)s open");
  double longest = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator(); ++it)
    longest = std::max(longest, std::stod((*it)[1].str()));
  return longest;
}

// 1,000 orders flow, then the waybill API answers 503 to every call for
// `outage` while 3,000 more arrive; then it recovers.
void outage_scenario(const std::string& name, std::chrono::seconds outage) {
  FakeServices services(fake_services_binary(), {"--faults", "waybill:latency_mean_ms=5,latency_p99_ms=40"});
  Scenario s(name);
  s.topic("orders", 4).topic("orders.dlq", 1);
  auto& host = s.host("host-a", {shipped_route("waybill", "orders", services.url(), "2s")},
                      {.admin = true, .host_lines = "max_in_flight = 500\n"});
  const int admin = s.admin_port(host);
  s.kafka.produce("orders", order_messages(0, 1000));
  s.wait_committed(host);

  set_waybill_faults(services, R"({"error_5xx": 1.0})");
  const auto outage_began = std::chrono::steady_clock::now();
  s.kafka.produce("orders", order_messages(1000, 4000));
  wait_until([&] { return admin_metric(admin, "idemsink_route_circuit_open{route=\"waybill\"}") == 1; }, 30s,
             "the circuit to open");
  std::this_thread::sleep_until(outage_began + outage);  // the outage's length is the scenario
  BOOST_TEST(admin_metric(admin, "idemsink_route_circuit_open{route=\"waybill\"}") == 1);
  BOOST_TEST(admin_metric(admin, "idemsink_records_dead_total{route=\"waybill\"}") == 0);
  set_waybill_faults(services, R"({"error_5xx": 0.0})");

  s.wait_committed(host, 180s);
  BOOST_TEST(admin_metric(admin, "idemsink_route_circuit_open{route=\"waybill\"}") == 0);
  const std::string log = host.log();
  BOOST_TEST(host.stop() == 0);

  // Both halves, by counting: every order applied once, none dead.
  const auto stats = services.stats()["waybill"];
  BOOST_TEST(stats["double_applied"].get<int>() == 0);
  const std::set<std::string> applied = services.applied("waybill");
  BOOST_TEST(applied.size() == 4000u);
  auto conn = s.connect();
  BOOST_TEST(scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Done)) == 4000);
  BOOST_TEST(scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim") == 4000);
  BOOST_TEST(scalar(*conn, "SELECT COUNT(*) FROM idemsink_dlq_outbox") == 0);
  BOOST_TEST(s.kafka.read_all("orders.dlq", 1).empty());
  // The host kept its partitions throughout: one assignment, no rebalance.
  const size_t assignments = count_lines(log, "kafka: assigned");
  const size_t revocations = count_lines(log, "kafka: revoking") + count_lines(log, "kafka: lost");
  BOOST_TEST(assignments == 1u);
  BOOST_TEST(revocations == 0u);
  BOOST_TEST(count_lines(log, "circuit opened") >= 1u);
  BOOST_TEST_MESSAGE(name << ": " << outage.count() << "s outage: " << applied.size() << " of 4000 applied, "
                          << scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE " +
                                               status_in(claim::Status::Failed, claim::Status::Unknown))
                          << " dead-lettered, longest fetch pause " << longest_open_seconds(log) << "s, "
                          << assignments - 1 + revocations << " rebalances, " << stats["requests"].get<int>() - 4000
                          << " calls refused");
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_20s_outage_dead_letters_nothing_and_keeps_the_assignment) { outage_scenario("outage_20s", 20s); }

BOOST_AUTO_TEST_CASE(a_120s_outage_dead_letters_nothing_and_keeps_the_assignment) {
  outage_scenario("outage_120s", 120s);
}

// seed 002's traffic: mean 60 ms, P99 350 ms, and 1% of calls answered too
// late (applied, then the plugin's 2 s timeout): the circuit never opens.
BOOST_AUTO_TEST_CASE(ordinary_latency_and_timeouts_never_open_the_circuit) {
  FakeServices services(
      fake_services_binary(),
      {"--hold", "2500", "--faults", "waybill:latency_mean_ms=60,latency_p99_ms=350,timeout_after_apply=0.01"});
  Scenario s("outage_none");
  s.topic("orders", 4).topic("orders.dlq", 1);
  s.kafka.produce("orders", order_messages(0, 3000));
  auto& host = s.host("host-a", {shipped_route("waybill", "orders", services.url(), "2s")},
                      {.admin = true, .host_lines = "max_in_flight = 500\n"});
  const int admin = s.admin_port(host);
  s.wait_committed(host, 180s);
  BOOST_TEST(admin_metric(admin, "idemsink_route_circuit_opens_total{route=\"waybill\"}") == 0);
  const std::string log = host.log();
  BOOST_TEST(host.stop() == 0);
  BOOST_TEST(count_lines(log, "circuit opened") == 0u);
  const auto stats = services.stats()["waybill"];
  BOOST_TEST(stats["double_applied"].get<int>() == 0);
  BOOST_TEST(stats["timeouts_after_apply"].get<int>() > 0, "no call timed out: the scenario tested nothing");
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Done)) == 3000);
}

// An at-most-once gateway that times out every call: the records end
// unknown (they may have been sent), so none is left to probe with once the
// circuit opens. The route fetches again to find one, and once the gateway
// recovers the texts that arrived meanwhile go out, each once.
BOOST_AUTO_TEST_CASE(a_circuit_with_no_record_left_fetches_one_to_probe_with) {
  // Answers held 3 s, past the plugin's 1 s timeout. The later texts' calls
  // come nowhere near that timeout even on a busy machine: none fails a
  // probe or ends unknown, to be sent only after its offset is committed.
  FakeServices services(fake_services_binary(), {"--hold", "3000", "--faults", "sms:timeout_after_apply=1.0"});
  Scenario s("outage_probe");
  s.topic("texts", 2).topic("texts.dlq", 1);
  // The circuit opens on the 100th failed call, when every record has had
  // its one: none is left held (with the default 20, a busy machine opened
  // it with a third of them not called yet, fed to probes 10 s apart).
  auto& host =
      s.host("host-a",
             {shipped_route("sms", "texts", services.url(), "1s", "[route.circuit]\nwindow = 100\nmin_calls = 100\n")},
             {.admin = true});
  const int admin = s.admin_port(host);
  std::vector<TestMessage> first, later;
  for (int i = 0; i < 100; ++i)
    first.push_back(
        {"T" + std::to_string(i), "{\"order_id\":\"T" + std::to_string(i) + "\",\"phone\":\"+8613800000000\"}"});
  for (int i = 100; i < 150; ++i)
    later.push_back(
        {"T" + std::to_string(i), "{\"order_id\":\"T" + std::to_string(i) + "\",\"phone\":\"+8613800000000\"}"});
  s.kafka.produce("texts", first);
  s.wait_committed(host);  // all 100 ended unknown
  BOOST_TEST(admin_metric(admin, "idemsink_route_circuit_open{route=\"sms\"}") == 1);

  s.kafka.produce("texts", later);
  set_sms_faults(services, R"({"timeout_after_apply": 0.0})");
  s.wait_committed(host, 120s);
  BOOST_TEST(admin_metric(admin, "idemsink_route_circuit_open{route=\"sms\"}") == 0);
  const std::string log = host.log();
  BOOST_TEST(host.stop() == 0);
  const auto stats = services.stats()["sms"];
  BOOST_TEST(stats["double_applied"].get<int>() == 0);  // no text sent twice
  for (int i = 100; i < 150; ++i) BOOST_TEST(stats["per_order"].value("T" + std::to_string(i), 0) == 1, "T" << i);
  BOOST_TEST(count_lines(log, "circuit closed after") >= 1u);
}

// A route held by its open circuit does not hold the others: its records
// leave the host's backpressure count, so a small buffer full of them does
// not pause the healthy route's partitions.
BOOST_AUTO_TEST_CASE(an_open_circuit_does_not_pause_the_other_routes) {
  FakeServices services(fake_services_binary(), {"--faults", "waybill:error_5xx=1.0"});
  Scenario s("outage_other_routes");
  for (const std::string t : {"orders", "orders.dlq", "stock", "stock.dlq"}) s.topic(t, 2);
  s.kafka.produce("orders", order_messages(0, 1000));
  s.kafka.produce("stock", order_messages(0, 1000));
  auto& host = s.host("host-a",
                      {shipped_route("waybill", "orders", services.url(), "2s"),
                       shipped_route("inventory", "stock", services.url(), "2s")},
                      {.admin = true, .host_lines = "max_buffered_records = 300\n"});
  const int admin = s.admin_port(host);
  // The inventory route finishes while the waybill API is still down.
  s.wait_committed(host, {"stock"}, 120s);
  BOOST_TEST(admin_metric(admin, "idemsink_route_circuit_open{route=\"waybill\"}") == 1);
  BOOST_TEST(admin_metric(admin, "idemsink_records_dead_total{route=\"waybill\"}") == 0);
  set_waybill_faults(services, R"({"error_5xx": 0.0})");
  s.wait_committed(host, {"orders", "stock"}, 120s);
  BOOST_TEST(host.stop() == 0);
  const auto stats = services.stats();
  BOOST_TEST(stats["waybill"]["applied"].get<int>() == 1000);
  BOOST_TEST(stats["inventory"]["applied"].get<int>() == 1000);
  BOOST_TEST(stats["waybill"]["double_applied"].get<int>() == 0);
}
