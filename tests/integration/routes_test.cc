// Several routes on one topic, each in a consumer group of its own (one
// record, several effects), and routes that take only their records
// ([route.when]). Each case counts both halves of the contract per route:
// no effect twice (the fake services' own counters, the call log) and every
// record accounted for (claimed, dead-lettered or skipped; the audit, route
// by route).
#define BOOST_TEST_MODULE routes
#include <boost/test/unit_test.hpp>
#include <regex>
#include <set>
#include <thread>

#include "devkit/services.h"
#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace idemsink::devkit;
using namespace std::chrono_literals;

namespace {

std::string group_line(const std::string& group) { return "group_id = \"" + group + "\"\n"; }

// An order as the three effects read it.
std::string order_value(int i) {
  return "{\"order_id\":\"K" + std::to_string(i) + "\",\"phone\":\"+86-138-" + std::to_string(i) + "\"}";
}
std::vector<TestMessage> orders(int from, int to) {
  std::vector<TestMessage> out;
  for (int i = from; i < to; ++i) out.push_back({"K" + std::to_string(i), order_value(i)});
  return out;
}

// waybill, inventory and sms from one orders topic: the waybill route keeps
// the host's group, the others have groups of their own.
std::vector<RouteSpec> fan_out(const FakeServices& services, const std::string& extra = "",
                               const std::string& sms_timeout = "300ms") {
  return {shipped_route("waybill", "orders", services.url(), "2s", extra),
          shipped_route("inventory", "orders", services.url(), "2s", group_line("g.inventory") + extra),
          shipped_route("sms", "orders", services.url(), sms_timeout,
                        group_line("g.sms") + "call_timeout = \"5s\"\n" + extra)};
}
const std::vector<std::string> kGroups = {"g", "g.inventory", "g.sms"};

int64_t claims(Scenario& s, const std::string& route, const std::string& where = "TRUE") {
  return s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE namespace = '" + route + "' AND " + where);
}
int64_t done(Scenario& s, const std::string& route) {
  try {
    return claims(s, route, sql_status_is(claim::Status::Done));
  } catch (const db::DbError&) {
    return 0;  // no table yet
  }
}
int64_t letters_of(Scenario& s, const std::string& route) {
  return s.scalar("SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE route = '" + route + "'");
}

void wait_all_committed(Scenario& s, HostProcess& host, const std::vector<std::string>& groups,
                        std::chrono::seconds timeout = 180s) {
  for (const auto& g : groups) s.wait_committed(host, timeout, {"orders"}, g);
}

// Per route, the audit's records and skips summed over its partitions.
struct RouteAudit {
  int64_t records = 0, by_claim = 0, by_outbox = 0, skipped = 0;
};
std::map<std::string, RouteAudit> audit_by_route(const std::string& out) {
  static const std::regex line(
      R"(^(\S+): (\S+)\[\d+\] offsets \d+\.\.\d+: (\d+) records, (\d+) by claim, (\d+) by DLQ outbox(, (\d+) skipped)?)");
  std::map<std::string, RouteAudit> by;
  std::istringstream in(out);
  std::string l;
  std::smatch m;
  while (std::getline(in, l))
    if (std::regex_search(l, m, line)) {
      RouteAudit& a = by[m[1].str()];
      a.records += std::stoll(m[3].str());
      a.by_claim += std::stoll(m[4].str());
      a.by_outbox += std::stoll(m[5].str());
      if (m[7].matched) a.skipped += std::stoll(m[7].str());
    }
  return by;
}

}  // namespace

// 3,000 orders, each a waybill, a reservation and a text, on two hosts; one
// host is killed (SIGKILL) twice mid-run and a third joins: every group
// rebalances on its own. The waybill and inventory APIs apply each order
// once; the gateway sends each text at most once, and a text in flight at a
// kill that was never sent is failed and dead-lettered, never sent twice.
BOOST_AUTO_TEST_CASE(three_routes_on_one_topic_through_kills_and_a_rebalance) {
  FakeServices services(
      fake_services_binary(),
      {"--seed", "44", "--hold", "1500", "--faults", "waybill:latency_mean_ms=5,latency_p99_ms=40", "--faults",
       "inventory:latency_mean_ms=5,latency_p99_ms=40", "--faults", "sms:latency_mean_ms=5,latency_p99_ms=40"});
  Scenario s("routes_fan_out");
  s.topic("orders", 6).topic("orders.dlq", 1);
  constexpr int kOrders = 3000;
  s.kafka.produce("orders", orders(0, kOrders));
  const auto routes = fan_out(services);
  const Scenario::HostOptions opt{.host_lines = "max_in_flight = 150\n",
                                  .claim_lines = "reconcile_interval = \"1s\"\nreconcile_after = \"2s\"\n"};
  std::map<std::string, HostProcess*> hosts;
  auto start = [&](const std::string& id) { hosts[id] = &s.host(id, routes, opt); };
  start("host-a");
  start("host-b");
  for (int kill = 1; kill <= 2; ++kill) {
    wait_until([&] { return done(s, "waybill") + done(s, "inventory") + done(s, "sms") >= 2000 * kill; }, 120s,
               "progress before kill " + std::to_string(kill));
    hosts["host-a"]->kill();
    start("host-a");  // the same host id takes its own claims over at once
  }
  start("host-c");  // every group rebalances again
  wait_all_committed(s, *hosts["host-a"], kGroups);
  wait_until([&] { return claims(s, "sms", status_in(claim::Status::Pending, claim::Status::Unknown)) == 0; }, 120s,
             "every unknown text settled by reconciliation");
  for (auto& [id, h] : hosts) BOOST_TEST(h->stop() == 0);

  const auto stats = services.stats();
  for (const std::string effect : {"waybill", "inventory"}) {
    BOOST_TEST_CONTEXT(effect) {
      BOOST_TEST(stats[effect]["double_applied"].get<int>() == 0);
      BOOST_TEST(services.applied(effect).size() == static_cast<size_t>(kOrders));
      BOOST_TEST(claims(s, effect, sql_status_is(claim::Status::Done)) == kOrders);
      BOOST_TEST(letters_of(s, effect) == 0);
    }
  }
  // Texts: sent at most once; done exactly when sent, failed exactly when not.
  BOOST_TEST(stats["sms"]["double_applied"].get<int>() == 0);
  const std::set<std::string> sent = services.applied("sms");
  BOOST_TEST(claims(s, "sms") == kOrders);
  BOOST_TEST(claims(s, "sms", sql_status_is(claim::Status::Done)) == static_cast<int64_t>(sent.size()));
  BOOST_TEST(claims(s, "sms", sql_status_is(claim::Status::Failed)) == kOrders - static_cast<int64_t>(sent.size()));
  BOOST_TEST(letters_of(s, "sms") >= kOrders - static_cast<int64_t>(sent.size()));  // each failed text has its letter

  const auto [rc, out] = s.audit(*hosts["host-a"]);
  BOOST_TEST(rc == 0, out);
  BOOST_TEST(out.find("audit ok") != std::string::npos, out);
  const auto by_route = audit_by_route(out);
  for (const std::string route : {"waybill", "inventory", "sms"}) {
    BOOST_TEST_CONTEXT(route) {
      BOOST_REQUIRE(by_route.count(route));
      const RouteAudit& a = by_route.at(route);
      BOOST_TEST(a.records == kOrders);
      BOOST_TEST(a.by_claim + a.by_outbox == kOrders);
      BOOST_TEST_MESSAGE(route << ": " << a.records << " records, " << a.by_claim << " by claim, " << a.by_outbox
                               << " by DLQ outbox");
    }
  }
  BOOST_TEST_MESSAGE("texts: " << sent.size() << " sent once, " << kOrders - static_cast<int64_t>(sent.size())
                               << " not sent (in flight at a kill) and dead-lettered");
}

// The gateway answers 503 to every text for 30 s: the sms route's circuit
// opens and its group stops fetching, while waybills and reservations go on
// at their own pace (each route's group fetches for itself). Then the
// gateway recovers and the texts catch up, each sent once.
BOOST_AUTO_TEST_CASE(one_route_down_for_30s_holds_the_others_back_in_nothing) {
  FakeServices services(
      fake_services_binary(),
      {"--seed", "45", "--faults", "waybill:latency_mean_ms=25,latency_p99_ms=60", "--faults",
       "inventory:latency_mean_ms=25,latency_p99_ms=60", "--faults", "sms:latency_mean_ms=25,latency_p99_ms=60"});
  Scenario s("routes_one_down");
  s.topic("orders", 4).topic("orders.dlq", 1);
  constexpr int kOrders = 16000;
  s.kafka.produce("orders", orders(0, kOrders));
  // Each route's calls bounded (8 at a time, 25 ms each: about 300/s), so
  // the rates compare routes, not how busy the machine is.
  // The texts' timeout far above their latency: a text that timed out on a
  // busy machine would end unknown, and this case counts every one sent.
  auto& host = s.host("host-a", fan_out(services, "concurrency = 8\n", "2s"), {.admin = true});
  const int admin = s.admin_port(host);
  using Clock = std::chrono::steady_clock;
  auto rate = [&](const std::string& route, Clock::duration window) {
    const int64_t from = done(s, route);
    const auto t0 = Clock::now();
    std::this_thread::sleep_for(window);  // the window is the measurement
    return static_cast<double>(done(s, route) - from) / std::chrono::duration<double>(Clock::now() - t0).count();
  };
  wait_until([&] { return done(s, "waybill") >= 500 && done(s, "inventory") >= 500; }, 60s, "a steady flow");
  // Both measured over one window each, side by side: what the machine does
  // to one it does to the other.
  double base_waybill = 0, base_inventory = 0;
  {
    std::thread t([&] { base_inventory = rate("inventory", 8s); });
    base_waybill = rate("waybill", 8s);
    t.join();
  }
  const auto [status, body] = http_request(services.port(), "POST", "/admin/faults/sms", R"({"error_5xx": 1.0})");
  BOOST_REQUIRE(status == 200);
  const auto outage_began = Clock::now();
  wait_until([&] { return admin_metric(admin, "idemsink_route_circuit_open{route=\"sms\"}") == 1; }, 30s,
             "the sms circuit to open");
  double down_waybill = 0, down_inventory = 0;
  {
    std::thread t([&] { down_inventory = rate("inventory", 16s); });
    down_waybill = rate("waybill", 16s);
    t.join();
  }
  const int64_t sms_during = done(s, "sms");
  std::this_thread::sleep_until(outage_began + 30s);  // the outage's length is the scenario
  BOOST_TEST(admin_metric(admin, "idemsink_route_circuit_open{route=\"sms\"}") == 1);
  BOOST_TEST(done(s, "waybill") < kOrders, "the backlog ran out: the rates measured nothing");
  http_request(services.port(), "POST", "/admin/faults/sms", R"({"error_5xx": 0.0})");

  wait_all_committed(s, host, kGroups, 300s);
  BOOST_TEST(host.stop() == 0);
  BOOST_TEST_MESSAGE("waybill " << base_waybill << "/s before, " << down_waybill << "/s while sms was down; inventory "
                                << base_inventory << "/s before, " << down_inventory << "/s; sms " << sms_during
                                << " done when its gateway went down, all " << done(s, "sms") << " after");
  // A route held back by another's outage stalls (its partitions paused
  // behind the other's records): its rate falls toward nothing, not by a
  // fifth. Half its rate before leaves the machine's noise out of it.
  BOOST_TEST(down_waybill >= 0.5 * base_waybill);
  BOOST_TEST(down_inventory >= 0.5 * base_inventory);
  const auto stats = services.stats();
  for (const std::string effect : {"waybill", "inventory", "sms"}) {
    BOOST_TEST_CONTEXT(effect) {
      BOOST_TEST(stats[effect]["double_applied"].get<int>() == 0);
      BOOST_TEST(services.applied(effect).size() == static_cast<size_t>(kOrders));
      BOOST_TEST(done(s, effect) == kOrders);
      BOOST_TEST(letters_of(s, effect) == 0);  // nothing dead-lettered, the slow route's records neither
    }
  }
  s.audit_clean(host);
}

// One topic, five event types keyed by order, three routes: waybills for
// paid orders (a JSON field), reservations for created and cancelled ones
// (one of), texts for shipments (a header, so a value that is not JSON is
// no obstacle). Refunds are nobody's. Every handler sees its types only;
// every other record is skipped and committed; a value that is not JSON is
// dead-lettered by each route whose condition needed it, never skipped.
BOOST_AUTO_TEST_CASE(a_mixed_topic_feeds_each_route_its_own_types) {
  Scenario s("routes_mixed");
  s.topic("orders", 4).topic("orders.dlq", 1);
  const std::vector<std::string> types = {"order.created", "order.paid", "order.shipped", "order.cancelled",
                                          "order.refunded"};
  std::map<std::string, std::set<std::string>> events_of;  // type -> event ids
  std::vector<TestMessage> msgs;
  for (int order = 0; order < 400; ++order)
    for (const auto& type : types) {
      const std::string event = "E" + std::to_string(order) + "-" + type;
      events_of[type].insert(event);
      msgs.push_back(
          {"K" + std::to_string(order),
           "{\"event_id\":\"" + event + "\",\"type\":\"" + type + "\",\"order_id\":\"K" + std::to_string(order) + "\"}",
           {{"event-type", type}}});
    }
  constexpr int kNotJson = 10;
  for (int i = 0; i < kNotJson; ++i)
    msgs.push_back({"bad-" + std::to_string(i), "order paid, not JSON", {{"event-type", "order.refunded"}}});
  s.kafka.produce("orders", msgs);

  const std::string by_event = "key = { from = \"json\", json = \"event_id\" }";
  auto waybill = s.scripted("waybill", "orders", "[route.when]\njson = \"type\"\nequals = \"order.paid\"\n");
  waybill.key_toml = by_event;
  auto inventory = s.scripted(
      "inventory", "orders",
      group_line("g.inventory") + "[route.when]\njson = \"type\"\none_of = [\"order.created\", \"order.cancelled\"]\n");
  inventory.key_toml = by_event;
  auto sms = s.scripted("sms", "orders",
                        group_line("g.sms") + "[route.when]\nheader = \"event-type\"\nstarts_with = \"order.ship\"\n");
  auto& host = s.host("host-a", {waybill, inventory, sms}, {.admin = true});
  const int admin = s.admin_port(host);
  wait_all_committed(s, host, kGroups);

  // Each handler called for its types only, each event once.
  std::map<std::string, std::set<std::string>> called;  // route -> biz_keys
  for (const auto& [key, calls] : s.calls_by_key())
    for (const auto& cols : calls)
      BOOST_TEST(called[cols.at(0)].insert(key).second, cols.at(0) << " called twice for " << key);
  BOOST_TEST(called["waybill"] == events_of["order.paid"]);
  std::set<std::string> stock = events_of["order.created"];
  stock.insert(events_of["order.cancelled"].begin(), events_of["order.cancelled"].end());
  BOOST_TEST(called["inventory"] == stock);
  std::set<std::string> shipped_orders;
  for (int order = 0; order < 400; ++order) shipped_orders.insert("K" + std::to_string(order));
  BOOST_TEST(called["sms"] == shipped_orders);  // keyed by the Kafka key: one shipment per order

  // The rest skipped, and counted so.
  const int64_t total = static_cast<int64_t>(msgs.size());
  const std::map<std::string, int64_t> expected_skips = {
      {"waybill", total - 400 - kNotJson}, {"inventory", total - 800 - kNotJson}, {"sms", total - 400}};
  for (const auto& [route, skips] : expected_skips)
    BOOST_TEST(admin_metric(admin, "idemsink_records_skipped_total{route=\"" + route + "\"}") == skips, route);
  // What a JSON test could not read: dead-lettered once per route that needed it.
  for (const std::string route : {"waybill", "inventory"})
    BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE route = '" + route +
                        "' AND reason = 'undecodable_value'") == kNotJson,
               route);
  BOOST_TEST(letters_of(s, "sms") == 0);
  BOOST_TEST(claims(s, "waybill") == 400);
  BOOST_TEST(claims(s, "inventory") == 800);
  BOOST_TEST(claims(s, "sms") == 400);
  BOOST_TEST(host.stop() == 0);

  const auto [rc, out] = s.audit(host);
  BOOST_TEST(rc == 0, out);
  BOOST_TEST(out.find("audit ok") != std::string::npos, out);
  const auto by_route = audit_by_route(out);
  for (const auto& [route, skips] : expected_skips) {
    BOOST_TEST_CONTEXT(route) {
      BOOST_REQUIRE(by_route.count(route));
      BOOST_TEST(by_route.at(route).records == total);
      BOOST_TEST(by_route.at(route).skipped == skips);
      BOOST_TEST(by_route.at(route).by_claim + by_route.at(route).by_outbox + skips == total);
    }
  }
}

// A topic with one route runs; after a restart two more routes read it:
// one from the beginning (start_at earliest), one only what arrives from
// then on (start_at latest). Neither disturbs the first route's claims, and
// the audit of the late one starts where its group began.
BOOST_AUTO_TEST_CASE(routes_added_to_a_topic_start_where_their_config_says) {
  Scenario s("routes_added");
  s.topic("orders", 3);
  s.kafka.produce("orders", orders(0, 300));
  auto waybill = s.scripted("waybill", "orders");
  {
    auto& first = s.host("host-a", {waybill});
    s.wait_committed(first);
    BOOST_TEST(first.stop() == 0);
  }
  auto tokens_of_waybill = [&] {
    std::map<std::string, std::string> out;
    for (const auto& r : s.connect()->query("SELECT biz_key, idem_token, updated_at FROM idemsink_claim WHERE "
                                            "namespace = 'waybill'"))
      out[*r[0]] = *r[1] + " " + *r[2];
    return out;
  };
  const auto before = tokens_of_waybill();
  BOOST_REQUIRE(before.size() == 300u);

  s.kafka.produce("orders", orders(300, 500));  // while no host runs
  auto inventory = s.scripted("inventory", "orders", group_line("g.inventory") + "start_at = \"earliest\"\n");
  auto sms = s.scripted("sms", "orders", group_line("g.sms") + "start_at = \"latest\"\n");
  auto& host = s.host("host-a", {waybill, inventory, sms});
  // The late route's group begins every partition at its end, stored first.
  wait_until(
      [&] {
        return s.scalar(
                   "SELECT COUNT(*) FROM idemsink_offsets WHERE group_id = 'g.sms' AND first_offset "
                   "IS NOT NULL") == 3;
      },
      60s, "the sms group to begin its partitions");
  s.kafka.produce("orders", orders(500, 600));
  wait_all_committed(s, host, kGroups);
  BOOST_TEST(host.stop() == 0);

  std::map<std::string, std::map<std::string, int>> calls;  // route -> key -> calls
  for (const auto& [key, list] : s.calls_by_key())
    for (const auto& cols : list) ++calls[cols.at(0)][key];
  auto keys = [](int from, int to) {
    std::map<std::string, int> out;
    for (int i = from; i < to; ++i) out["K" + std::to_string(i)] = 1;
    return out;
  };
  BOOST_TEST((calls["waybill"] == keys(0, 600)));    // each once: the first 300 before the restart only
  BOOST_TEST((calls["inventory"] == keys(0, 600)));  // from the beginning
  BOOST_TEST((calls["sms"] == keys(500, 600)));      // what arrived once it began
  BOOST_TEST(claims(s, "sms") == 100);
  // The first route's claims untouched: the same rows, tokens and times.
  auto after = tokens_of_waybill();
  for (const auto& [key, row] : before) BOOST_TEST(after[key] == row, key);
  s.audit_clean(host);
  const auto by_route = audit_by_route(s.audit(host).second);
  BOOST_TEST(by_route.at("sms").records == 100);
  BOOST_TEST(by_route.at("inventory").records == 600);
}

// `idemsink replay` puts a dead record back on its source topic, which other
// routes read too: the copy is its route's alone. The other route, which
// took the record once, skips it; its route takes it even after its
// [route.when] changed to leave such records out.
BOOST_AUTO_TEST_CASE(a_replayed_copy_is_its_routes_alone) {
  Scenario s("routes_replay");
  s.topic("orders", 2).topic("orders.dlq", 1);
  std::vector<TestMessage> msgs = {{"retry3-1", R"({"type":"paid"})"}};
  for (int i = 0; i < 10; ++i) msgs.push_back({"K" + std::to_string(i), R"({"type":"paid"})"});
  s.kafka.produce("orders", msgs);
  const std::string fast_retries = "backoff_initial = \"100ms\"\nbackoff_max = \"200ms\"\n";
  // waybill gives up after two calls, inventory's five are enough.
  auto waybill_with = [&](const std::string& type) {
    return s.scripted("waybill", "orders",
                      "[route.retry]\nmax_attempts = 2\n" + fast_retries +
                          "[route.when]\njson = \"type\"\nequals = \"" + type + "\"\n");
  };
  const auto inventory =
      s.scripted("inventory", "orders", group_line("g.inventory") + "[route.retry]\nmax_attempts = 5\n" + fast_retries);
  auto calls_of = [&](const std::string& route) {
    int n = 0;
    const auto calls = s.calls_by_key();
    if (auto it = calls.find("retry3-1"); it != calls.end())
      for (const auto& cols : it->second) n += cols.at(0) == route;
    return n;
  };
  {
    auto& host = s.host("host-a", {waybill_with("paid"), inventory});
    wait_all_committed(s, host, {"g", "g.inventory"});
    BOOST_TEST(host.stop() == 0);
  }
  BOOST_TEST(claims(s, "waybill", "biz_key = 'retry3-1' AND " + sql_status_is(claim::Status::Failed)) == 1);
  BOOST_TEST(claims(s, "inventory", "biz_key = 'retry3-1' AND " + sql_status_is(claim::Status::Done)) == 1);
  const int waybill_before = calls_of("waybill"), inventory_before = calls_of("inventory");
  BOOST_TEST(waybill_before == 2);
  BOOST_TEST(inventory_before == 4);

  // waybill's condition now leaves "paid" out; its replay is still its own.
  auto& host = s.host("host-a", {waybill_with("refund"), inventory}, {.admin = true});
  const auto [rc, out] = run_cli(
      s.dir, "replay", {"replay", "--config", host.config_path().string(), "--route", "waybill", "--key", "retry3-1"});
  BOOST_TEST(rc == 0, out);
  wait_until([&] { return calls_of("waybill") > waybill_before; }, 60s, "waybill to take its replayed copy");
  wait_until(
      [&] { return claims(s, "waybill", "biz_key = 'retry3-1' AND " + status_is_not(claim::Status::Pending)) == 1; },
      60s, "the replayed copy's outcome");
  wait_all_committed(s, host, {"g", "g.inventory"});
  BOOST_TEST(admin_metric(s.admin_port(host), "idemsink_records_skipped_total{route=\"inventory\"}") == 1);
  BOOST_TEST(calls_of("inventory") == inventory_before);  // never called again
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}
