// `idemsink replay`: dead records of a route go back through it once the
// remote is fixed, each applied once with the idem_token of its first
// attempt, even when two replays run at once against a running host.
#define BOOST_TEST_MODULE replay
#include <boost/test/unit_test.hpp>
#include <map>
#include <regex>

#include "core/dlq/outbox.h"
#include "devkit/services.h"
#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace std::chrono_literals;

namespace {

int count_in(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// "N re-opened" from a replay's summary line.
int replayed_count(const std::string& out) {
  static const std::regex re("matched, ([0-9]+) re-opened");
  std::smatch m;
  if (!std::regex_search(out, m, re)) throw std::runtime_error("no summary line in: " + out);
  return std::stoi(m[1].str());
}

}  // namespace

BOOST_AUTO_TEST_CASE(replayed_dead_records_are_applied_once_with_their_first_token) {
  // The waybill API rejects a fixed share of orders as a business error (4xx):
  // they end failed, permanent, and are dead-lettered.
  FakeServices services(fake_services_binary(), {"--faults", "waybill:reject_4xx=0.25"});
  Scenario s("replay");
  s.topic("orders", 2).topic("orders.dlq", 1);
  const int kOrders = 200;
  s.kafka.produce("orders", order_messages(0, kOrders));
  auto& host = s.host("host-a", {shipped_route("waybill", "orders", services.url(), "2s")});
  s.wait_committed(host);
  auto conn = s.connect();
  wait_until([&] { return s.kafka.read_all("orders.dlq", 1).size() == services.stats()["waybill"]["rejected_4xx"]; },
             60s, "every rejection on the DLQ");

  // The dead ones, with the tokens their first attempts carried.
  std::map<std::string, std::string> first_token;  // biz_key -> idem_token
  for (const auto& r :
       conn->query("SELECT biz_key, idem_token FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Failed)))
    first_token[*r[0]] = *r[1];
  const int dead = static_cast<int>(first_token.size());
  BOOST_TEST_MESSAGE(dead << " of " << kOrders << " orders dead-lettered by a permanent error");
  BOOST_TEST(dead >= 20);
  BOOST_TEST(scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Done)) ==
             kOrders - dead);
  const std::string cfg = host.config_path().string();

  // One replay while the remote still rejects: back to the DLQ, marked replayed.
  const std::string again = first_token.begin()->first;
  auto [rc_one, out_one] =
      run_cli(s.dir, "replay-one", {"replay", "--config", cfg, "--route", "waybill", "--key", again});
  BOOST_TEST(rc_one == 0, out_one);
  BOOST_TEST(out_one.find("1 failed claim(s) matched, 1 re-opened") != std::string::npos, out_one);
  auto dlq = s.kafka.read_all("orders.dlq", 1);
  wait_until(
      [&] {
        dlq = s.kafka.read_all("orders.dlq", 1);
        return static_cast<int>(dlq.size()) == dead + 1;
      },
      60s, "the replayed record dead again");
  const auto& second = dlq.back();
  BOOST_TEST(second.headers.at("idemsink.replayed") == "1");
  BOOST_TEST(second.headers.at("idemsink.idem_token") == first_token[again]);
  BOOST_TEST(second.headers.at("idemsink.reason") == "permanent");

  // The remote is fixed.
  const auto [fix_status, fix_body] =
      http_request(services.port(), "POST", "/admin/faults/waybill", R"({"reject_4xx": 0.0})");
  BOOST_TEST(fix_status == 200, fix_body);

  // A dry run changes nothing.
  auto [rc_dry, out_dry] =
      run_cli(s.dir, "replay-dry", {"replay", "--config", cfg, "--route", "waybill", "--dry-run", "--since", "1h"});
  BOOST_TEST(rc_dry == 0, out_dry);
  BOOST_TEST(count_in(out_dry, "would replay: key ") == dead, out_dry);
  BOOST_TEST(scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Failed)) ==
             dead);

  // Two replays at once, while the host runs.
  const std::vector<std::string> args{idemsink_binary(), "replay",  "--config", cfg,
                                      "--route",         "waybill", "--reason", "permanent"};
  Process a(args, s.dir / "replay-a.out", s.dir / "replay-a.err");
  Process b(args, s.dir / "replay-b.out", s.dir / "replay-b.err");
  BOOST_TEST(a.wait(120s).value_or(-1) == 0, a.out() + a.err());
  BOOST_TEST(b.wait(120s).value_or(-1) == 0, b.out() + b.err());
  // Between them, each dead record re-opened once.
  BOOST_TEST(replayed_count(a.out()) + replayed_count(b.out()) == dead, a.out() + b.out());
  wait_until(
      [&] {
        return scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Done)) ==
               kOrders;
      },
      120s, "every order done");
  s.wait_committed(host);

  // Each order applied once; each dead one under the token of its first attempt.
  const auto stats = services.stats()["waybill"];
  BOOST_TEST(stats["double_applied"].get<int>() == 0);
  BOOST_TEST(stats["applied"].get<int>() == kOrders);
  for (const auto& [key, token] : first_token) {
    BOOST_TEST(http_request(services.port(), "GET", "/waybills/by-key/" + token).first == 200, key);
    BOOST_TEST(scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE idem_token = '" + token + "'") == 1);
  }
  // One replay row per replayed record, two for the one replayed twice.
  BOOST_TEST(scalar(*conn, "SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE " +
                               dlq::sql_purpose_is(dlq::Purpose::Replay)) == dead + 1);
  BOOST_TEST(s.kafka.read_all("orders.dlq", 1).size() == static_cast<size_t>(dead + 1));  // no new dead letters
  // A second replay finds nothing; the audit is clean.
  auto [rc_none, out_none] = run_cli(s.dir, "replay-none", {"replay", "--config", cfg, "--route", "waybill"});
  BOOST_TEST(out_none.find("0 failed claim(s) matched") != std::string::npos, out_none);
  auto [rc_audit, out_audit] = s.audit(host);
  BOOST_TEST(rc_audit == 0, out_audit);
  BOOST_TEST(host.stop() == 0);
}

BOOST_AUTO_TEST_CASE(replay_refuses_bad_input_with_a_clear_error) {
  Scenario s("replay_usage");
  s.topic("orders", 1);
  const auto file = s.dir / "host.toml";
  write_file(file, s.config("host-a", {shipped_route("waybill", "orders", "http://127.0.0.1:1")}));
  auto [rc_route, out_route] = run_cli(s.dir, "no-route", {"replay", "--config", file.string(), "--route", "nope"});
  BOOST_TEST(rc_route == 2);
  BOOST_TEST(out_route.find("--route nope: no such route") != std::string::npos, out_route);
  auto [rc_since, out_since] =
      run_cli(s.dir, "bad-since", {"replay", "--config", file.string(), "--route", "waybill", "--since", "yesterday"});
  BOOST_TEST(rc_since == 2);
  BOOST_TEST(out_since.find("--since \"yesterday\"") != std::string::npos, out_since);
}

// An at-most-once route: the failed texts' call marks (written before each
// call) must not make the replay think they may have been sent.
BOOST_AUTO_TEST_CASE(replayed_at_most_once_records_are_sent_once) {
  FakeServices services(fake_services_binary(), {"--faults", "sms:reject_4xx=1.0"});
  Scenario s("replay_sms");
  s.topic("texts", 1).topic("texts.dlq", 1);
  std::vector<TestMessage> msgs;
  for (int i = 0; i < 10; ++i)
    msgs.push_back(
        {"S" + std::to_string(i), "{\"order_id\":\"S" + std::to_string(i) + "\",\"phone\":\"+8613800000000\"}"});
  s.kafka.produce("texts", msgs);
  auto& host = s.host("host-a", {shipped_route("sms", "texts", services.url(), "2s")});
  s.wait_committed(host);
  auto conn = s.connect();
  BOOST_TEST(scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Failed)) == 10);
  BOOST_TEST(http_request(services.port(), "POST", "/admin/faults/sms", R"({"reject_4xx": 0.0})").first == 200);
  auto [rc, out] = run_cli(s.dir, "replay", {"replay", "--config", host.config_path().string(), "--route", "sms"});
  BOOST_TEST(rc == 0, out);
  wait_until(
      [&] {
        return scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Done)) == 10;
      },
      60s, "every text sent");
  BOOST_TEST(host.stop() == 0);
  const auto stats = services.stats()["sms"];
  BOOST_TEST(stats["applied"].get<int>() == 10);
  BOOST_TEST(stats["double_applied"].get<int>() == 0);
}
