// A reload while the host runs (config/reload.h): one route's options and
// retries change under load while the other route never notices, what needs
// a restart or changes a route's identity is refused and changes nothing, a
// file that does not load changes nothing, and the host killed afterwards
// restarts on the new file with no record run twice or lost.
#define BOOST_TEST_MODULE reload
#include <boost/test/unit_test.hpp>
#include <csignal>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "devkit/services.h"
#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace std::chrono_literals;

namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write(const std::filesystem::path& p, const std::string& text) { std::ofstream(p) << text; }

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  BOOST_REQUIRE_MESSAGE(at != std::string::npos, "the config holds " + from);
  return text.replace(at, from.size(), to);
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::pair<int, std::string> reload(int port, const std::string& body = R"({"note":"test"})") {
  return http_request(port, "POST", "/api/v1/host/reload", body, {{"Content-Type", "application/json"}});
}

std::string status_hash(int port) {
  return nlohmann::json::parse(http_request(port, "GET", "/status").second)["config"]["hash"].get<std::string>();
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_reload_changes_one_route_while_both_run_and_refuses_what_needs_a_restart) {
  Scenario s("reload_routes");
  s.topic("orders", 2).topic("texts", 2);
  const auto log_b = s.dir / "calls_b.log";
  const auto log_a2 = s.dir / "calls_a_after.log";
  RouteSpec a = with_delay(s.scripted("a", "orders"), "5ms");
  RouteSpec b = with_delay(s.scripted("b", "texts"), "5ms");
  b.options["log"] = "\"" + log_b.string() + "\"";
  auto& host = s.host("host-a", {a, b}, {.admin = true});
  const int port = s.admin_port(host);
  wait_until([&] { return http_status(port, "/livez") == 200; }, 60s, "the admin port");
  const auto file = host.config_path();
  const std::string before_text = slurp(file);
  const std::string hash_before = status_hash(port);

  // Load on both routes, then the reload in the middle of it.
  constexpr int kBatch = 1000;
  s.kafka.produce("orders", keyed_messages("o", 0, kBatch));
  s.kafka.produce("texts", keyed_messages("t", 0, kBatch));
  wait_until([&] { return Scenario::calls_per_key(log_b).size() >= 200; }, 60s, "route b under way");
  const size_t revokes_before = count_of(host.log(), "revok");
  // Route a (written first): its calls log elsewhere, and its concurrency changes.
  write(file, replaced(replaced(before_text, "\"" + s.calls_log().string() + "\"", "\"" + log_a2.string() + "\""),
                       "[route.options]", "concurrency = 7\n[route.options]"));
  const auto [status, answer] = reload(port);
  BOOST_TEST_REQUIRE(status == 200, answer);
  BOOST_TEST(answer.find("route a: route.options.log, route.concurrency") != std::string::npos, answer);
  BOOST_TEST(answer.find("route b") == std::string::npos, answer);
  const std::string hash_after = status_hash(port);
  BOOST_TEST(hash_after != hash_before);
  s.kafka.produce("orders", keyed_messages("o", kBatch, 2 * kBatch));
  s.kafka.produce("texts", keyed_messages("t", kBatch, 2 * kBatch));
  s.wait_committed(host);

  // Every record once: route a's before the reload in the old log, after it in the new one.
  auto calls_a = Scenario::calls_per_key(s.calls_log());
  const auto calls_a2 = Scenario::calls_per_key(log_a2);
  BOOST_TEST(!calls_a2.empty());
  for (const auto& [k, n] : calls_a2) calls_a[k] += n;
  const auto calls_b = Scenario::calls_per_key(log_b);
  BOOST_TEST(calls_a.size() == size_t{2 * kBatch});
  BOOST_TEST(calls_b.size() == size_t{2 * kBatch});
  for (const auto& [k, n] : calls_a) BOOST_TEST(n == 1, "route a called " << k << " " << n << " times");
  for (const auto& [k, n] : calls_b) BOOST_TEST(n == 1, "route b called " << k << " " << n << " times");
  for (int i = kBatch; i < 2 * kBatch; ++i) BOOST_TEST(calls_a2.contains("o" + std::to_string(i)));
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Done)) == 4 * kBatch);
  // The reload revoked nothing and paused nothing.
  BOOST_TEST(count_of(host.log(), "revok") == revokes_before);
  BOOST_TEST(host.log().find("reload by ") != std::string::npos);

  // What needs a restart, and an identity change, are refused and change nothing.
  const std::string applied_text = slurp(file);
  write(file, replaced(applied_text, "group_id = \"", "group_id = \"other-"));
  auto [restart_status, restart_answer] = reload(port);
  BOOST_TEST(restart_status == 409, restart_answer);
  BOOST_TEST(restart_answer.find("needs a restart (kafka.group_id)") != std::string::npos, restart_answer);
  write(file, replaced(applied_text, "[[route]]\nname = \"b\"",
                       "[[route]]\nname = \"b\"\nkey = { from = \"json\", json = \"id\" }"));
  auto [identity_status, identity_answer] = reload(port);
  BOOST_TEST(identity_status == 409, identity_answer);
  BOOST_TEST(identity_answer.find("route b: its identity changes (route.key") != std::string::npos, identity_answer);
  BOOST_TEST(identity_answer.find("refused unless forced") != std::string::npos, identity_answer);
  write(file, replaced(applied_text, "[route.options]", "[route.retry]\ntopics = [\"10s\"]\n[route.options]"));
  auto [retry_status, retry_answer] = reload(port);
  BOOST_TEST(retry_status == 409, retry_answer);
  BOOST_TEST(retry_answer.find("route a needs a restart (route.retry.topics)") != std::string::npos, retry_answer);
  // A file that does not load: its error, and nothing changes.
  write(file, applied_text + "\n[[route]]\nname = \"c\"\n");
  auto [broken_status, broken_answer] = reload(port);
  BOOST_TEST(broken_status == 409, broken_answer);
  write(file, replaced(applied_text, "delay = \"5ms\"", "delay = \"soon\""));
  auto [option_status, option_answer] = reload(port);
  BOOST_TEST(option_status == 409, option_answer);
  BOOST_TEST(option_answer.find("delay") != std::string::npos, option_answer);
  BOOST_TEST(status_hash(port) == hash_after);
  const std::string metrics = http_request(port, "GET", "/metrics").second;
  BOOST_TEST(metrics.find("idemsink_config_reloads_total{result=\"applied\"} 1") != std::string::npos, metrics);
  BOOST_TEST(metrics.find("idemsink_config_reloads_total{result=\"refused\"} 5") != std::string::npos, metrics);
  BOOST_TEST(metrics.find("hash=\"" + hash_after + "\"") != std::string::npos);

  // The file put back as applied: SIGHUP and `idemsink reload` find nothing to change.
  write(file, applied_text);
  host.proc().signal(SIGHUP);
  wait_until([&] { return host.log().find("reload by signal:SIGHUP: no setting changed") != std::string::npos; }, 30s,
             "the SIGHUP reload");
  const auto [cli_rc, cli_out] = run_cli(s.dir, "reload", {"reload", "--config", file.string(), "--note", "cli"});
  BOOST_TEST(cli_rc == 0, cli_out);
  BOOST_TEST(cli_out.find("no setting changed") != std::string::npos, cli_out);
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_operator_log WHERE action = 'host.reload'") == 8);

  // Killed after the reload, the host comes back on the new file: the rest
  // of the records once each, nothing lost.
  s.kafka.produce("orders", keyed_messages("o", 2 * kBatch, 3 * kBatch));
  wait_until([&] { return Scenario::calls_per_key(log_a2).size() >= size_t{kBatch} + 100; }, 60s, "more calls");
  host.kill();
  auto& again = s.host("host-a2", {a, b}, {.edit = [&](std::string& text) { text = applied_text; }});
  s.wait_committed(again);
  // Each record done once; a record called again after the kill (its call
  // was out, its outcome not yet written) was called with its one token.
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Done)) == 5 * kBatch);
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE NOT " + sql_status_is(claim::Status::Done)) == 0);
  std::map<std::string, std::set<std::string>> tokens;
  for (const auto& log : {s.calls_log(), log_a2})
    for (const auto& cols : read_call_log(log)) tokens[unhex(cols.at(1))].insert(cols.at(2));
  BOOST_TEST(tokens.size() == size_t{3 * kBatch});
  for (const auto& [key, t] : tokens)
    BOOST_TEST(t.size() == 1u, "key " << key << " called with " << t.size() << " tokens");
  BOOST_TEST(again.stop() == 0);
  s.audit_clean(again);
}

// A local_tx route's apply jobs read its settings on database workers: the
// reload waits for them, then the new instance writes; every payment is
// credited once, the ones after the reload with the new entry type.
BOOST_AUTO_TEST_CASE(a_reload_of_a_local_tx_route_under_load_credits_each_payment_once) {
  Scenario s("reload_ledger");
  s.topic("payments", 2).topic("payments.dlq", 1);
  RouteSpec ledger{"ledger", "payments", shipped_plugin("ledger")};
  ledger.options["entry_type"] = "\"PAY_CREDIT\"";
  auto& host = s.host("lp", {ledger}, {.admin = true});
  const int port = s.admin_port(host);
  wait_until([&] { return http_status(port, "/livez") == 200; }, 60s, "the admin port");
  auto payments = [](int from, int to) {
    std::vector<TestMessage> out;
    for (int i = from; i < to; ++i) {
      const std::string id = "pay-" + std::to_string(i);
      out.push_back(
          {id, nlohmann::json{{"account", "acct-" + std::to_string(i % 7)}, {"amount", 1.25}}.dump(), {}, i % 2});
    }
    return out;
  };
  constexpr int kBatch = 3000;
  s.kafka.produce("payments", payments(0, kBatch));
  wait_until([&] { return s.scalar("SELECT COUNT(*) FROM ledger_entries") >= 300; }, 60s, "credits under way");
  const auto file = host.config_path();
  write(file, replaced(replaced(slurp(file), "\"PAY_CREDIT\"", "\"PAY_CREDIT_V2\""), "[route.options]",
                       "concurrency = 9\n[route.options]"));
  const auto [status, answer] = reload(port);
  BOOST_TEST_REQUIRE(status == 200, answer);
  BOOST_TEST(answer.find("route ledger: route.options.entry_type, route.concurrency") != std::string::npos, answer);
  s.kafka.produce("payments", payments(kBatch, 2 * kBatch));
  s.wait_committed(host);

  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM ledger_entries") == 2 * kBatch);
  BOOST_TEST(s.scalar("SELECT COUNT(DISTINCT biz_key) FROM ledger_entries") == 2 * kBatch);
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM ledger_entries WHERE entry_type = 'PAY_CREDIT_V2'") >= kBatch);
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM ledger_entries WHERE entry_type = 'PAY_CREDIT_V2' AND CAST(SUBSTRING("
                      "biz_key, 5) AS UNSIGNED) >= " +
                      std::to_string(kBatch)) == kBatch);
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM ledger_balances b WHERE balance_cents <> (SELECT SUM(amount_cents) "
                      "FROM ledger_entries e WHERE e.account = b.account)") == 0);
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}

// A route added and one removed by a reload, each in a group of its own
// (config/reload.h): the added one's consumer starts, the removed one's
// closes after draining, and the route that stays is never revoked. The
// removed route added back goes on from its commits; killed under load on
// all three, the host restarts with every record done once.
BOOST_AUTO_TEST_CASE(a_reload_adds_and_removes_routes_of_their_own_groups_while_the_other_runs) {
  Scenario s("reload_add_remove");
  s.topic("orders", 2).topic("texts", 2).topic("parcels", 2);
  const auto log_b = s.dir / "calls_b.log";
  const auto log_c = s.dir / "calls_c.log";
  RouteSpec a = with_delay(s.scripted("a", "orders"), "5ms");
  // b's calls are slow, so that it has calls out when it is removed.
  RouteSpec b = with_delay(s.scripted("b", "texts", "group_id = \"g.b\""), "100ms");
  b.options["log"] = "\"" + log_b.string() + "\"";
  RouteSpec c = with_delay(s.scripted("c", "parcels", "group_id = \"g.c\""), "5ms");
  c.options["log"] = "\"" + log_c.string() + "\"";
  auto& host = s.host("host-a", {a, b}, {.admin = true});
  const int port = s.admin_port(host);
  wait_until([&] { return http_status(port, "/livez") == 200; }, 60s, "the admin port");
  const auto file = host.config_path();
  const std::string with_b = slurp(file);
  const size_t b_at = with_b.find("[[route]]\nname = \"b\"");
  BOOST_TEST_REQUIRE(b_at != std::string::npos);
  const std::string without_b =
      with_b.substr(0, b_at) + with_b.substr(with_b.find("[[route]]", b_at + 1) == std::string::npos
                                                 ? with_b.size()
                                                 : with_b.find("[[route]]", b_at + 1));
  const std::string b_table = with_b.substr(b_at, with_b.size() - without_b.size());

  constexpr int kBatch = 1000;
  s.kafka.produce("orders", keyed_messages("o", 0, kBatch));
  s.kafka.produce("texts", keyed_messages("t", 0, kBatch));
  wait_until([&] { return Scenario::calls_per_key(log_b).size() >= 200; }, 60s, "route b under way");
  wait_until([&] { return Scenario::calls_per_key(s.calls_log()).size() >= 200; }, 60s, "route a under way");

  // b removed and c added, while a and b have records in flight.
  write(file, without_b + route_config(c));
  const auto [status, answer] = reload(port);
  BOOST_TEST_REQUIRE(status == 200, answer);
  BOOST_TEST(answer.find("route c added") != std::string::npos, answer);
  BOOST_TEST(answer.find("route b removed") != std::string::npos, answer);
  const size_t b_called_at_removal = Scenario::calls_per_key(log_b).size();
  s.kafka.produce("parcels", keyed_messages("p", 0, kBatch));
  s.kafka.produce("orders", keyed_messages("o", kBatch, 2 * kBatch));
  s.kafka.produce("texts", keyed_messages("t", kBatch, 2 * kBatch));
  s.wait_committed(host, {"orders"});
  s.wait_committed(host, 120s, {"parcels"}, "g.c");
  BOOST_TEST(Scenario::calls_per_key(s.calls_log()).size() == size_t{2 * kBatch});
  BOOST_TEST(Scenario::calls_per_key(log_c).size() == size_t{kBatch});
  // Route b is not read any more; its claims left held by nobody.
  BOOST_TEST(Scenario::calls_per_key(log_b).size() == b_called_at_removal);
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE namespace = 'b' AND owner IS NOT NULL AND NOT " +
                      sql_status_is(claim::Status::Done)) == 0);
  // The route that stayed was never revoked; the admin port lists the routes as they are now.
  BOOST_TEST(count_of(host.log(), "revoking orders") == 0u, host.log());
  std::set<std::string> listed;
  for (const auto& r : nlohmann::json::parse(http_request(port, "GET", "/api/v1/routes").second))
    listed.insert(r["name"].get<std::string>());
  BOOST_TEST((listed == std::set<std::string>{"a", "c"}));

  // b back: it goes on from its commits; then all three under load, the host killed.
  write(file, without_b + route_config(c) + b_table);
  const auto [back_status, back_answer] = reload(port);
  BOOST_TEST_REQUIRE(back_status == 200, back_answer);
  s.kafka.produce("orders", keyed_messages("o", 2 * kBatch, 3 * kBatch));
  s.kafka.produce("parcels", keyed_messages("p", kBatch, 2 * kBatch));
  s.kafka.produce("texts", keyed_messages("t", 2 * kBatch, 3 * kBatch));
  wait_until([&] { return Scenario::calls_per_key(log_b).size() >= size_t{kBatch} + 200; }, 60s, "route b back");
  // Back from its commits: nothing it had done is read again (no duplicates), nothing called twice.
  for (const auto& r : nlohmann::json::parse(http_request(port, "GET", "/api/v1/routes").second))
    if (r["name"] == "b") BOOST_TEST(r["counters"]["duplicates"].get<int64_t>() == 0, r.dump());
  for (const auto& [k, n] : Scenario::calls_per_key(log_b)) BOOST_TEST(n == 1, "route b called " << k << " " << n);
  BOOST_TEST(count_of(host.log(), "revoking orders") == 0u);
  BOOST_TEST(count_of(host.log(), "lost orders") == 0u);
  host.kill();
  const std::string final_text = slurp(file);
  auto& again = s.host("host-a2", {a, c}, {.edit = [&](std::string& text) { text = final_text; }});
  s.wait_committed(again, {"orders"});
  s.wait_committed(again, 120s, {"parcels"}, "g.c");
  s.wait_committed(again, 120s, {"texts"}, "g.b");

  // Every record of every route done once, each key called with one token.
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Done)) ==
             3 * kBatch + 3 * kBatch + 2 * kBatch);
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE NOT " + sql_status_is(claim::Status::Done)) == 0);
  for (const auto& [log, n] : std::vector<std::pair<std::filesystem::path, int>>{
           {s.calls_log(), 3 * kBatch}, {log_b, 3 * kBatch}, {log_c, 2 * kBatch}}) {
    std::map<std::string, std::set<std::string>> tokens;
    for (const auto& cols : read_call_log(log)) tokens[unhex(cols.at(1))].insert(cols.at(2));
    BOOST_TEST(tokens.size() == size_t(n), log);
    for (const auto& [key, t] : tokens)
      BOOST_TEST(t.size() == 1u, log << ": key " << key << " called with " << t.size() << " tokens");
  }
  BOOST_TEST(again.stop() == 0);
  s.audit_clean(again);
}

// Attempts, backoff, the output and a longer call_timeout change in place
// (config/reload.h): records failing before the reload are dead letters
// after two calls, those after it are done on their fourth, and their
// outcome events appear from the reload on; the reconciler's view of the
// route changes with the engine's.
BOOST_AUTO_TEST_CASE(a_reload_changes_attempts_and_the_output_of_a_running_route) {
  Scenario s("reload_retries");
  s.topic("orders", 2).topic("orders.dlq", 1).topic("orders.out", 1);
  RouteSpec a = s.scripted("a", "orders",
                           "call_timeout = \"20s\"\ncircuit = { enabled = false }\n[route.retry]\nmax_attempts = 2\n"
                           "backoff_initial = \"10ms\"\n"
                           "backoff_max = \"20ms\"");
  auto& host = s.host("host-a", {a}, {.admin = true});
  const int port = s.admin_port(host);
  wait_until([&] { return http_status(port, "/livez") == 200; }, 60s, "the admin port");
  const auto file = host.config_path();

  // Before: a record that succeeds on its fourth call is dead after its second.
  constexpr int kBatch = 50;
  s.kafka.produce("orders", keyed_messages("retry3-b", 0, kBatch));
  s.wait_committed(host, {"orders"});
  BOOST_TEST(s.wait_records("orders.dlq", kBatch).size() == size_t{kBatch});

  write(file, replaced(replaced(slurp(file), "max_attempts = 2", "max_attempts = 5"), "call_timeout = \"20s\"",
                       "call_timeout = \"40s\"\noutput = { topic = \"orders.out\" }"));
  const auto [status, answer] = reload(port);
  BOOST_TEST_REQUIRE(status == 200, answer);
  BOOST_TEST(answer.find("route.retry.max_attempts") != std::string::npos, answer);
  s.kafka.produce("orders", keyed_messages("retry3-a", 0, kBatch));
  s.wait_committed(host, {"orders"});

  // Calls per key: two before, four after; every record after the reload done, with its event.
  std::map<std::string, int> calls;
  for (const auto& cols : read_call_log(s.calls_log())) ++calls[unhex(cols.at(1))];
  BOOST_TEST(calls.size() == size_t{2 * kBatch});
  for (const auto& [key, n] : calls)
    BOOST_TEST(n == (key.starts_with("retry3-b") ? 2 : 4), key << " called " << n << " times");
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Done)) == kBatch);
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Failed)) == kBatch);
  const auto events = s.wait_records("orders.out", kBatch);
  BOOST_TEST(events.size() == size_t{kBatch});
  BOOST_TEST(s.wait_records("orders.dlq", kBatch).size() == size_t{kBatch});
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}

// A reload asked while the host drains its calls is refused, and the host
// still stops: the shutdown holds the reload's lock only while it drains.
BOOST_AUTO_TEST_CASE(a_reload_asked_while_the_host_drains_is_refused_and_the_host_stops) {
  Scenario s("reload_draining");
  s.topic("orders", 1);
  auto& host = s.host("host-a", {with_delay(s.scripted("a", "orders"), "3s")}, {.admin = true});
  const int port = s.admin_port(host);
  wait_until([&] { return http_status(port, "/livez") == 200; }, 60s, "the admin port");
  s.kafka.produce("orders", keyed_messages("o", 0, 3));
  wait_until([&] { return admin_metric(port, "idemsink_in_flight{route=\"a\"}") > 0; }, 60s, "calls out");
  host.proc().signal(SIGTERM);
  wait_until([&] { return host.log().find(": draining (grace") != std::string::npos; }, 30s, "the drain");
  const auto [status, answer] = reload(port);
  BOOST_TEST(status == 409, answer);
  BOOST_TEST(answer.find("the host is stopping") != std::string::npos, answer);
  BOOST_TEST(host.stop() == 0);
  BOOST_TEST(Scenario::calls_per_key(s.calls_log()).size() == 3u);
}

// Two hosts of one group, each reloaded: route b removed, route c added in
// a group of its own; route a, in the shared group, is never revoked by the
// reloads. Then one host is killed under load: the other takes its
// partitions of both groups over, and every record of a and c is done once.
BOOST_AUTO_TEST_CASE(two_hosts_reloaded_then_one_killed_do_every_record_once) {
  Scenario s("reload_two_hosts");
  s.topic("orders", 4).topic("texts", 4).topic("parcels", 4);
  const auto log_b = s.dir / "calls_b.log";
  const auto log_c = s.dir / "calls_c.log";
  RouteSpec a = with_delay(s.scripted("a", "orders"), "5ms");
  RouteSpec b = with_delay(s.scripted("b", "texts", "group_id = \"g.b\""), "5ms");
  b.options["log"] = "\"" + log_b.string() + "\"";
  RouteSpec c = with_delay(s.scripted("c", "parcels", "group_id = \"g.c\""), "5ms");
  c.options["log"] = "\"" + log_c.string() + "\"";
  std::vector<HostProcess*> hosts = {&s.host("h1", {a, b}, {.admin = true}), &s.host("h2", {a, b}, {.admin = true})};
  for (auto* h : hosts) wait_until([&] { return http_status(s.admin_port(*h), "/livez") == 200; }, 60s, "admin");

  constexpr int kBatch = 2000;
  s.kafka.produce("orders", keyed_messages("o", 0, kBatch));
  s.kafka.produce("texts", keyed_messages("t", 0, kBatch));
  wait_until([&] { return Scenario::calls_per_key(s.calls_log()).size() >= 300; }, 60s, "route a under way");
  std::vector<size_t> revokes;
  for (auto* h : hosts) {
    revokes.push_back(count_of(h->log(), "revoking orders") + count_of(h->log(), "lost orders"));
    const std::string text = slurp(h->config_path());
    const size_t b_at = text.find("[[route]]\nname = \"b\"");
    BOOST_TEST_REQUIRE(b_at != std::string::npos);
    const size_t b_end = text.find("[[route]]", b_at + 1);
    write(h->config_path(),
          text.substr(0, b_at) + (b_end == std::string::npos ? "" : text.substr(b_end)) + route_config(c));
    const auto [status, answer] = reload(s.admin_port(*h));
    BOOST_TEST_REQUIRE(status == 200, answer);
  }
  s.kafka.produce("parcels", keyed_messages("p", 0, kBatch));
  s.kafka.produce("orders", keyed_messages("o", kBatch, 2 * kBatch));
  wait_until([&] { return Scenario::calls_per_key(log_c).size() >= 500; }, 60s, "route c under way");
  for (size_t i = 0; i < hosts.size(); ++i)
    BOOST_TEST(count_of(hosts[i]->log(), "revoking orders") + count_of(hosts[i]->log(), "lost orders") == revokes[i],
               "host " << i + 1 << " revoked orders after the reload");
  hosts[1]->kill();
  s.wait_committed(*hosts[0], {"orders"});
  s.wait_committed(*hosts[0], 120s, {"parcels"}, "g.c");

  // Every record of a and c done once, each key called with one token; b's
  // records it took before it was removed, once each.
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE namespace IN ('a', 'c') AND " +
                      sql_status_is(claim::Status::Done)) == 3 * kBatch);
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE namespace IN ('a', 'c') AND NOT " +
                      sql_status_is(claim::Status::Done)) == 0);
  for (const auto& [log, n] :
       std::vector<std::pair<std::filesystem::path, int>>{{s.calls_log(), 2 * kBatch}, {log_c, kBatch}}) {
    std::map<std::string, std::set<std::string>> tokens;
    for (const auto& cols : read_call_log(log)) tokens[unhex(cols.at(1))].insert(cols.at(2));
    BOOST_TEST(tokens.size() == size_t(n), log);
    for (const auto& [key, t] : tokens)
      BOOST_TEST(t.size() == 1u, log << ": key " << key << " called with " << t.size() << " tokens");
  }
  for (const auto& [k, n] : Scenario::calls_per_key(log_b)) BOOST_TEST(n == 1, "route b called " << k << " " << n);
  BOOST_TEST(hosts[0]->stop() == 0);
  s.audit_clean(*hosts[0]);
}
