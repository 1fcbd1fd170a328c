// An operator's rewind and skip of a route's offsets (`idemsink route
// rewind|skip`, claim/offset_moves.h): a rewind of done records reads them
// again and every one meets its claim (idempotent hits, no call); a skip
// passes over records and the audit accounts them as skipped by an
// operator; a move past what can be read is refused, changing nothing.
#define BOOST_TEST_MODULE offset_moves
#include <boost/test/unit_test.hpp>
#include <cstdlib>

#include "devkit/services.h"
#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace std::chrono_literals;

namespace {

size_t calls_of(const Scenario& s) {
  size_t n = 0;
  for (const auto& [k, c] : s.calls_per_key()) n += static_cast<size_t>(c);
  return n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_rewind_meets_its_claims_and_a_skip_is_accounted_by_the_audit) {
  Scenario s("offset_moves");
  s.topic("orders", 2);
  auto& host = s.host("host-a", {s.scripted("a", "orders")}, {.admin = true});
  const int port = s.admin_port(host);
  const auto config = host.config_path().string();
  constexpr int kDone = 10000;
  s.kafka.produce("orders", keyed_messages("k", 0, kDone));
  s.wait_committed(host);
  BOOST_TEST(calls_of(s) == size_t{kDone});
  const std::string hits = "idemsink_idempotent_hits_total{route=\"a\"}";
  wait_until([&] { return admin_metric(port, hits) >= 0; }, 30s, "the metrics");
  const int64_t hits_before = admin_metric(port, hits);

  // Rewind an hour: every record read again meets its done claim. (The
  // mock cluster answers every time with the log's end: docs/librdkafka.md;
  // on it, the rewind names the offsets an hour ago had.)
  const bool real =
      std::getenv("IDEMSINK_TEST_KAFKA") != nullptr && std::string(std::getenv("IDEMSINK_TEST_KAFKA")) == "real";
  std::vector<std::string> rewind{"route", "rewind", "a", "--config", config, "--note", "downstream lost"};
  for (const auto& to : real ? std::vector<std::string>{"--to-time", "1h"}
                             : std::vector<std::string>{"--to-offset", "orders:0:0", "--to-offset", "orders:1:0"})
    rewind.push_back(to);
  auto [rc, out] = run_cli(s.dir, "rewind", rewind);
  BOOST_TEST_REQUIRE(rc == 0, out);
  BOOST_TEST(out.find("orders[0] #") != std::string::npos, out);
  BOOST_TEST(out.find("applied by host-a#") != std::string::npos, out);
  wait_until([&] { return admin_metric(port, hits) - hits_before >= kDone; }, 120s, "10,000 idempotent hits");
  s.wait_committed(host);
  BOOST_TEST(admin_metric(port, hits) - hits_before == kDone);
  BOOST_TEST(calls_of(s) == size_t{kDone});  // no call
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_operator_log WHERE action = 'route.rewind' AND note = "
                      "'downstream lost'") == 1);

  // The same through the API (the console's): ten records of one partition.
  const int64_t end1 = s.kafka.high_watermarks("orders", 2).at(1);
  const auto post = [&](const std::string& path, const std::string& body) {
    return http_request(port, "POST", "/api/v1/routes/a/" + path, body, {{"Content-Type", "application/json"}});
  };
  auto [status, answer] = post(
      "rewind", R"({"note": "api", "to_offsets": [{"partition": 1, "offset": )" + std::to_string(end1 - 10) + "}]}");
  BOOST_TEST_REQUIRE(status == 200, answer);
  wait_until([&] { return admin_metric(port, hits) - hits_before == kDone + 10; }, 60s, "ten more hits");
  std::tie(status, answer) = post("rewind", R"({"note": "api", "to_offsets": [{"partition": 1, "offset": 99999999}]})");
  BOOST_TEST(status == 409, answer);
  std::tie(status, answer) = post("rewind", R"({"note": "api"})");
  BOOST_TEST(status == 400, answer);
  std::tie(status, answer) = post("skip", R"({"note": "api", "to_time": "1h"})");
  BOOST_TEST(status == 400, answer);
  s.wait_committed(host);
  BOOST_TEST(calls_of(s) == size_t{kDone});

  // Past the end: refused, nothing stored.
  std::tie(rc, out) =
      run_cli(s.dir, "skip-refused",
              {"route", "skip", "a", "--config", config, "--to-offset", "orders:0:99999999", "--note", "too far"});
  BOOST_TEST(rc == 1, out);
  BOOST_TEST(out.find("orders[0]: 99999999 is beyond the partition's end") != std::string::npos, out);
  std::tie(rc, out) =
      run_cli(s.dir, "skip-no-note", {"route", "skip", "a", "--config", config, "--to-offset", "orders:0:1"});
  BOOST_TEST(rc == 2, out);
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_offset_moves WHERE kind = 'skip'") == 0);

  // Paused, 1,000 more arrive; skipped over, then resumed: never called,
  // and the audit names the skip.
  BOOST_TEST(run_cli(s.dir, "pause", {"route", "pause", "a", "--config", config}).first == 0);
  wait_until([&] { return host.log().find("route a: paused") != std::string::npos; }, 30s, "the pause");
  s.kafka.produce("orders", keyed_messages("late", 0, 1000));
  const auto ends = s.kafka.high_watermarks("orders", 2);
  std::tie(rc, out) =
      run_cli(s.dir, "skip",
              {"route", "skip", "a", "--config", config, "--to-offset", "orders:0:" + std::to_string(ends.at(0)),
               "--to-offset", "orders:1:" + std::to_string(ends.at(1)), "--note", "bad batch from upstream"});
  BOOST_TEST_REQUIRE(rc == 0, out);
  BOOST_TEST(out.find("applied by host-a#") != std::string::npos, out);
  // Read again, the records skipped over would run: a rewind into them is refused.
  std::tie(rc, out) =
      run_cli(s.dir, "rewind-into-skip", {"route", "rewind", "a", "--config", config, "--to-offset", "orders:0:0"});
  BOOST_TEST(rc == 1, out);
  BOOST_TEST(out.find("is before the end of skip #") != std::string::npos, out);
  BOOST_TEST(run_cli(s.dir, "resume", {"route", "resume", "a", "--config", config}).first == 0);
  s.wait_committed(host);
  for (const auto& [key, n] : s.calls_per_key()) BOOST_TEST(key.rfind("late", 0) != 0, key << " was called");
  BOOST_TEST(calls_of(s) == size_t{kDone});
  const auto [audit_rc, audit_out] = s.audit(host);
  BOOST_TEST(audit_rc == 0, audit_out);
  BOOST_TEST(audit_out.find("audit ok: 11000 committed records, 0 unaccounted") != std::string::npos, audit_out);
  size_t skipped = 0;
  for (size_t at = audit_out.find(" skipped by an operator"); at != std::string::npos;
       at = audit_out.find(" skipped by an operator", at + 1)) {
    const size_t start = audit_out.rfind(", ", at) + 2;
    skipped += std::stoul(audit_out.substr(start, at - start));
  }
  BOOST_TEST(skipped == 1000u, audit_out);
  BOOST_TEST(audit_out.find("passed over by skip #") != std::string::npos, audit_out);
  BOOST_TEST(audit_out.find("bad batch from upstream") != std::string::npos, audit_out);
  BOOST_TEST(host.stop() == 0);
}
