// What operators' tools expect of a long-running host: /readyz in its states,
// a route paused for the whole group and across restarts, JSON log lines
// that parse, a log file that SIGHUP reopens, and /metrics that promtool
// accepts.
#define BOOST_TEST_MODULE operations
#include <boost/test/unit_test.hpp>
#include <sys/wait.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "devkit/mariadb_server.h"
#include "devkit/services.h"
#include "tests/support/host_fixture.h"
#include "tests/support/test_kafka.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace idemsink::devkit;
using namespace std::chrono_literals;

namespace {

std::vector<TestMessage> orders(const std::string& prefix, int from, int to) {
  std::vector<TestMessage> out;
  for (int i = from; i < to; ++i) out.push_back({prefix + std::to_string(i), "{}"});
  return out;
}

std::string admin_lines(int port) { return "admin_listen = \"127.0.0.1:" + std::to_string(port) + "\"\n"; }

// GET, or {0, ""} while the port is not listening yet.
std::pair<int, std::string> get(int port, const std::string& target) {
  try {
    return http_request(port, "GET", target);
  } catch (const std::exception&) {
    return {0, ""};
  }
}

int status_of(int port, const std::string& target) { return get(port, target).first; }

// Keys called, with how many times each.
std::map<std::string, int> calls_by_key(const std::filesystem::path& log) {
  std::map<std::string, int> out;
  for (const auto& cols : read_call_log(log)) ++out[cols.at(1)];
  return out;
}

// `promtool check metrics` (Debian's prometheus package; scripts/install-deps
// installs it) on a scrape: {exit code, what it said}.
std::pair<int, std::string> promtool_check_metrics(const ScratchDir& dir, const std::string& scrape) {
  const auto file = dir / "scrape.txt";
  std::ofstream(file) << scrape;
  const std::string cmd = "promtool check metrics < '" + file.string() + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  BOOST_REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// A series' value in a scrape (-1 when absent).
double series_value(const std::string& scrape, const std::string& series) {
  const size_t at = scrape.find("\n" + series + " ");
  return at == std::string::npos ? -1 : std::stod(scrape.substr(at + series.size() + 2));
}

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

// Ready: 200. Kafka unreachable: 503 naming Kafka. A member the group gave
// no partition: 503 saying so, while its peer is ready.
BOOST_AUTO_TEST_CASE(readyz_in_its_states) {
  TestKafka kafka;
  kafka.create_topic("orders", 1);
  auto db = MariaDbServer::shared().fresh_database("ops_ready");
  ScratchDir dir("ops_ready");
  const RouteSpec route{
      "r", "orders", "scripted_idempotent.so", "", {{"log", "\"" + (dir / "calls.log").string() + "\""}}};
  const std::string fast_stats = "\"statistics.interval.ms\" = \"500\"\n";

  const int port_a = free_port();
  HostProcess a(dir, "a", base_config(kafka, db, "host-a", "g", admin_lines(port_a), fast_stats) + route_config(route));
  wait_until([&] { return status_of(port_a, "/readyz") == 200; }, 60s, "host a ready");
  BOOST_TEST(http_request(port_a, "GET", "/healthz").first == 200);  // the alias
  BOOST_TEST(http_request(port_a, "GET", "/metrics").second.find("\nidemsink_ready 1\n") != std::string::npos);

  // A second member of the same group: one partition, two hosts.
  const int port_b = free_port();
  HostProcess b(dir, "b", base_config(kafka, db, "host-b", "g", admin_lines(port_b), fast_stats) + route_config(route));
  // Seen together: one member ready, the other settled without partitions.
  auto one_ready_one_idle = [&] {
    const auto ra = get(port_a, "/readyz"), rb = get(port_b, "/readyz");
    auto idle = [](const std::pair<int, std::string>& r) {
      return r.first == 503 && r.second.find("assigned no partitions") != std::string::npos;
    };
    return (ra.first == 200 && idle(rb)) || (rb.first == 200 && idle(ra));
  };
  wait_until(one_ready_one_idle, 90s, "one member ready, the other without partitions");
  BOOST_TEST(one_ready_one_idle());  // a settled state, not a moment of a rebalance
  BOOST_TEST(b.stop() == 0);
  BOOST_TEST(a.stop() == 0);

  // No broker at that address.
  const int port_c = free_port();
  const int nowhere = free_port();
  std::string cfg = base_config(kafka, db, "host-c", "g", admin_lines(port_c), fast_stats) + route_config(route);
  const std::string real = "bootstrap_servers = \"" + kafka.bootstrap() + "\"";
  cfg.replace(cfg.find(real), real.size(), "bootstrap_servers = \"127.0.0.1:" + std::to_string(nowhere) + "\"");
  HostProcess c(dir, "c", cfg);
  std::string why;
  wait_until(
      [&] {
        const auto r = get(port_c, "/readyz");
        why = r.second;
        return r.first == 503 &&
               (r.second.find("_ALL_BROKERS_DOWN") != std::string::npos ||
                r.second.find("no broker is up") != std::string::npos) &&
               status_of(port_c, "/livez") == 200;
      },
      60s, "host c not ready for Kafka");
  BOOST_TEST_MESSAGE("unreachable Kafka: " << why);
  BOOST_TEST(http_request(port_c, "GET", "/metrics").second.find("\nidemsink_ready 0\n") != std::string::npos);
  BOOST_TEST(c.stop() == 0);
}

// A Kafka login the cluster refuses is an error in the log, and shows in /readyz.
BOOST_AUTO_TEST_CASE(a_refused_kafka_login_is_an_error_and_not_ready) {
  TestKafka kafka;
  kafka.create_topic("orders", 1);
  auto db = MariaDbServer::shared().fresh_database("ops_auth");
  ScratchDir dir("ops_auth");
  const int port = free_port();
  // The embedded cluster speaks no SASL: the handshake fails as a refused login does.
  HostProcess h(
      dir, "h",
      base_config(kafka, db, "host-a", "g", admin_lines(port),
                  "\"statistics.interval.ms\" = \"500\"\n\"security.protocol\" = \"SASL_PLAINTEXT\"\n"
                  "\"sasl.mechanism\" = \"PLAIN\"\n\"sasl.username\" = \"u\"\n\"sasl.password\" = \"p\"\n") +
          route_config(
              {"r", "orders", "scripted_idempotent.so", "", {{"log", "\"" + (dir / "calls.log").string() + "\""}}}));
  std::string why;
  wait_until(
      [&] {
        const auto r = get(port, "/readyz");
        why = r.second;
        return r.first == 503 && r.second.find("_AUTHENTICATION") != std::string::npos;
      },
      60s, "not ready for the refused login");
  BOOST_TEST(why.find("_AUTHENTICATION") != std::string::npos, why);
  BOOST_TEST(why.find("127.0.0.1:") != std::string::npos, why);  // the broker
  wait_until([&] { return h.log().find("kafka: the cluster refused this client") != std::string::npos; }, 60s,
             "the authentication error in the log");
  BOOST_TEST(h.stop() == 0);
}

// An operator pauses a route through one host's admin port: the other host
// obeys, a restart keeps it paused, the CLI resumes it; the other route runs
// throughout, and every record is applied once in the end.
BOOST_AUTO_TEST_CASE(a_paused_route_stays_paused_on_every_host_and_after_a_restart) {
  TestKafka kafka;
  kafka.create_topic("orders", 2);
  kafka.create_topic("payments", 2);
  auto db = MariaDbServer::shared().fresh_database("ops_pause");
  ScratchDir dir("ops_pause");
  const auto order_calls = dir / "orders.log";
  const auto payment_calls = dir / "payments.log";
  const std::string routes =
      route_config({"ship", "orders", "scripted_idempotent.so", "", {{"log", "\"" + order_calls.string() + "\""}}}) +
      route_config({"pay", "payments", "scripted_idempotent.so", "", {{"log", "\"" + payment_calls.string() + "\""}}});
  const int port_a = free_port(), port_b = free_port();
  const std::string fast_stats = "\"statistics.interval.ms\" = \"500\"\n";
  auto a = std::make_unique<HostProcess>(
      dir, "a", base_config(kafka, db, "host-a", "g", admin_lines(port_a), fast_stats) + routes);
  auto b = std::make_unique<HostProcess>(
      dir, "b", base_config(kafka, db, "host-b", "g", admin_lines(port_b), fast_stats) + routes);
  kafka.produce("orders", orders("O", 0, 100));
  kafka.produce("payments", orders("P", 0, 100));
  wait_committed(kafka, "g", {{"orders", 2}, {"payments", 2}}, *a);
  const auto orders_before = kafka.committed("g", "orders", 2);

  // Paused through host a; host b learns it from the database.
  auto [code, body] = http_request(port_a, "POST", "/routes/ship/pause");
  BOOST_TEST(code == 200, body);
  BOOST_TEST(http_request(port_a, "POST", "/routes/nosuch/pause").first == 404);
  wait_until(
      [&] {
        const auto [code_b, body_b] = get(port_b, "/routes");
        if (code_b != 200) return false;  // host b's admin port not up yet
        for (const auto& r : nlohmann::json::parse(body_b))
          if (r["route"] == "ship") return r["paused"].get<bool>();
        return false;
      },
      30s, "host b to see route ship paused");
  std::string metrics_b;
  wait_until(
      [&] {
        metrics_b = get(port_b, "/metrics").second;
        return metrics_b.find("idemsink_kafka_broker_up{broker=") != std::string::npos;
      },
      30s, "librdkafka statistics in host b's metrics");
  BOOST_TEST(metrics_b.find("idemsink_route_paused{route=\"ship\"} 1") != std::string::npos);
  BOOST_TEST(metrics_b.find("idemsink_route_paused{route=\"pay\"} 0") != std::string::npos);
  // Commits carry their route: the group committed payments through one host or both.
  const std::string metrics_a = http_request(port_a, "GET", "/metrics").second;
  BOOST_TEST(series_value(metrics_a, "idemsink_offset_commits_total{route=\"pay\"}") +
                 series_value(metrics_b, "idemsink_offset_commits_total{route=\"pay\"}") >
             0);

  const auto [promtool_rc, promtool_out] = promtool_check_metrics(dir, metrics_b);
  BOOST_TEST(promtool_rc == 0, "promtool check metrics: " << promtool_out);

  kafka.produce("orders", orders("O", 100, 200));
  kafka.produce("payments", orders("P", 100, 200));
  wait_committed(kafka, "g", {{"payments", 2}}, *a);  // the other route runs on both hosts
  BOOST_TEST(kafka.committed("g", "orders", 2) == orders_before);
  BOOST_TEST(calls_by_key(order_calls).size() == 100u);

  // Both hosts restart: the pause holds.
  BOOST_TEST(a->stop() == 0);
  BOOST_TEST(b->stop() == 0);
  a = std::make_unique<HostProcess>(dir, "a2", base_config(kafka, db, "host-a", "g", admin_lines(port_a)) + routes);
  kafka.produce("payments", orders("P", 200, 300));
  wait_committed(kafka, "g", {{"payments", 2}}, *a);
  BOOST_TEST(kafka.committed("g", "orders", 2) == orders_before);
  BOOST_TEST(calls_by_key(order_calls).size() == 100u);
  BOOST_TEST(a->log().find("route ship: paused by admin port of host-a") != std::string::npos);

  // Resumed from the command line, without the admin port.
  auto [rc_list, out_list] = run_cli(dir, "list", {"route", "list", "--config", a->config_path().string()});
  BOOST_TEST(rc_list == 0);
  BOOST_TEST(out_list.find("ship (orders): paused since") != std::string::npos, out_list);
  auto [rc, out] = run_cli(dir, "resume", {"route", "resume", "ship", "--config", a->config_path().string()});
  BOOST_TEST(rc == 0, out);
  wait_committed(kafka, "g", {{"orders", 2}, {"payments", 2}}, *a);
  BOOST_TEST(a->stop() == 0);

  // Every record accounted for: each key called once, none left out.
  const auto shipped = calls_by_key(order_calls);
  const auto paid = calls_by_key(payment_calls);
  BOOST_TEST(shipped.size() == 200u);
  BOOST_TEST(paid.size() == 300u);
  for (const auto* calls : {&shipped, &paid})
    for (const auto& [key, n] : *calls) BOOST_TEST(n == 1, key);
  auto [rc_bad, out_bad] = run_cli(dir, "bad", {"route", "pause", "nosuch", "--config", a->config_path().string()});
  BOOST_TEST(rc_bad == 2);
  BOOST_TEST(out_bad.find("no route named nosuch") != std::string::npos, out_bad);
}

// JSON logs parse line by line and carry the record's fields; the log file
// is reopened on SIGHUP after logrotate moved it, and the host runs on.
BOOST_AUTO_TEST_CASE(json_log_lines_parse_and_sighup_reopens_the_log_file) {
  TestKafka kafka;
  kafka.create_topic("orders", 1);
  auto db = MariaDbServer::shared().fresh_database("ops_logs");
  ScratchDir dir("ops_logs");
  const auto log_file = dir / "idemsink.log";
  HostProcess h(
      dir, "h",
      base_config(kafka, db, "host-a", "g", "log_format = \"json\"\nlog_file = \"" + log_file.string() + "\"\n") +
          route_config(
              {"r", "orders", "scripted_idempotent.so", "", {{"log", "\"" + (dir / "calls.log").string() + "\""}}}));
  // A record without a key is refused: its warning is about that record.
  std::vector<TestMessage> msgs = orders("K", 0, 20);
  msgs.push_back({std::nullopt, "{}"});
  kafka.produce("orders", msgs);
  wait_committed(kafka, "g", {{"orders", 1}}, h);

  std::vector<nlohmann::json> lines;
  {
    std::ifstream in(log_file);
    for (std::string line; std::getline(in, line);) {
      BOOST_TEST_INFO("line: " << line);
      BOOST_REQUIRE_NO_THROW(lines.push_back(nlohmann::json::parse(line)));
    }
  }
  BOOST_REQUIRE(lines.size() > 5u);
  bool refusal = false;
  for (const auto& j : lines) {
    BOOST_TEST(j.contains("time"));
    BOOST_TEST(j.contains("level"));
    BOOST_TEST(j.contains("message"));
    if (j["message"].get<std::string>().find("refusing") != std::string::npos) {
      refusal = true;
      BOOST_TEST(j["route"] == "r");
      BOOST_TEST(j["topic"] == "orders");
      BOOST_TEST(j["partition"] == 0);
      BOOST_TEST(j["offset"] == 20);
      BOOST_TEST(j["level"] == "warning");
    }
  }
  BOOST_TEST(refusal);

  // logrotate: move the file away, SIGHUP, the next lines go to a new file.
  const auto rotated = dir / "idemsink.log.1";
  std::filesystem::rename(log_file, rotated);
  h.proc().signal(SIGHUP);
  wait_until([&] { return read_text(log_file).find("log file") != std::string::npos; }, 30s, "a new log file");
  BOOST_TEST(read_text(log_file).find("reopened") != std::string::npos);
  kafka.produce("orders", orders("K", 20, 40));
  wait_committed(kafka, "g", {{"orders", 1}}, h);
  BOOST_TEST(h.running());

  // A file that cannot be opened again (here a directory took its name):
  // an error line in the file in use, and the host runs on.
  const auto rotated2 = dir / "idemsink.log.2";
  std::filesystem::rename(log_file, rotated2);
  std::filesystem::create_directory(log_file);
  h.proc().signal(SIGHUP);
  wait_until([&] { return read_text(rotated2).find("could not be reopened") != std::string::npos; }, 30s,
             "the reopen error in the log");
  kafka.produce("orders", orders("K", 40, 60));
  wait_committed(kafka, "g", {{"orders", 1}}, h);
  BOOST_TEST(h.running());
  BOOST_TEST(h.stop() == 0);
  BOOST_TEST(read_text(rotated2).find("stopped") != std::string::npos);
  BOOST_TEST(read_text(rotated).find("stopped") == std::string::npos);
}

// A plugin that crashes the host (SIGSEGV in its invoke): the host dies of
// that signal, as a supervisor expects, and leaves the signal and the stack
// through the plugin in both its stderr and its log file. The record's claim
// stays for the next owner (its call may have run: it is not marked done).
BOOST_AUTO_TEST_CASE(a_host_killed_by_a_fatal_signal_leaves_its_stack_in_the_log) {
  TestKafka kafka;
  kafka.create_topic("orders", 1);
  auto db = MariaDbServer::shared().fresh_database("ops_crash");
  ScratchDir dir("ops_crash");
  const auto log_file = dir / "idemsink.log";
  HostProcess h(
      dir, "h",
      base_config(kafka, db, "host-a", "g", "log_file = \"" + log_file.string() + "\"\n") +
          route_config(
              {"r", "orders", "scripted_idempotent.so", "", {{"log", "\"" + (dir / "calls.log").string() + "\""}}}));
  kafka.produce("orders", {{"K1", "{}"}, {"crash-1", "{}"}});
  const auto status = h.proc().wait(120s);
  BOOST_REQUIRE_MESSAGE(status.has_value(), "the host did not die: " << read_text(log_file));
  BOOST_TEST(*status == -SIGSEGV);
  for (const std::string& text : {h.log(), read_text(log_file)}) {
    BOOST_TEST_INFO("report: " << text);
    BOOST_TEST(text.find("idemsink: fatal signal 11 (SEGV)") != std::string::npos);
    BOOST_TEST(text.find("scripted_idempotent.so") != std::string::npos);  // a frame in the plugin
  }
  BOOST_TEST(calls_by_key(dir / "calls.log")["63726173682d31"] == 1);  // hex("crash-1"): the call that crashed
}
