// Order per entity ([route.order_by]): records of one entity are called one at
// a time in offset order, and a record waiting (in a retry topic, or dead on a
// route that holds) keeps its entity's later records waiting, durably: across
// kills, rebalances and hosts. Each case counts both halves of the contract
// too: every record's key done, each called with one token.
#define BOOST_TEST_MODULE ordering
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "core/common/util.h"
#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace std::chrono_literals;
using claim::Status;

namespace {

const std::string kById = "key = { from = \"json\", json = \"id\" }";
const std::string kOrderByKey = "[route.order_by]\nfrom = \"key\"\n";

// `entities` × `per_entity` events, keyed by the entity (so one entity's
// events share a partition), each with its own id; an id starting "retry1-"
// fails its first call (the scripted plugin), one in `fail_every`.
std::vector<TestMessage> entity_events(int entities, int per_entity, int fail_every) {
  std::vector<TestMessage> out;
  int n = 0;
  for (int seq = 0; seq < per_entity; ++seq)
    for (int e = 0; e < entities; ++e) {
      const std::string entity = "E" + std::to_string(e);
      const std::string id =
          (fail_every > 0 && ++n % fail_every == 0 ? "retry1-" : "") + entity + "#" + std::to_string(seq);
      out.push_back({entity, "{\"id\":\"" + id + "\",\"seq\":" + std::to_string(seq) + "}"});
    }
  return out;
}

// "retry1-E12#3" -> {"E12", 3}
std::pair<std::string, int> entity_and_seq(std::string id) {
  if (id.starts_with("retry1-")) id = id.substr(7);
  const size_t hash = id.find('#');
  return {id.substr(0, hash), std::stoi(id.substr(hash + 1))};
}

struct OrderReport {
  size_t calls = 0;
  size_t violations = 0;                                // a call of an entity's event after a call of a later one
  std::map<std::string, std::set<std::string>> tokens;  // per id
};
// Reads the call log in the order calls were made (one file, appended by
// every host): per entity, the events called must never go back.
OrderReport check_order(const std::filesystem::path& log) {
  OrderReport r;
  std::map<std::string, int> last_seq;
  for (const auto& cols : read_call_log(log)) {
    ++r.calls;
    const std::string id = unhex(cols.at(1));
    r.tokens[id].insert(cols.at(2));
    const auto [entity, seq] = entity_and_seq(id);
    auto [it, fresh] = last_seq.emplace(entity, seq);
    if (!fresh && seq < it->second) {
      if (++r.violations <= 5) BOOST_TEST_MESSAGE("order violation: " << id << " called after seq " << it->second);
    } else {
      it->second = seq;
    }
  }
  return r;
}

// Waits until `n` claims (of `route`, or all) are done; fails after `timeout`.
void wait_done(Scenario& s, int64_t n, const std::string& route = "", std::chrono::seconds timeout = 180s) {
  const std::string sql = "SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(Status::Done) +
                          (route.empty() ? "" : " AND namespace = '" + route + "'");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto done = [&]() -> int64_t {
    try {
      return s.scalar(sql);
    } catch (const db::DbError&) {
      return 0;  // the host has not made its tables yet
    }
  };
  while (done() < n) {
    BOOST_REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, "fewer than " << n << " claims done");
    std::this_thread::sleep_for(20ms);
  }
}

// Waits until the first claim of `route` exists.
void wait_claimed(Scenario& s, const std::string& route) {
  for (;;) {
    try {
      if (s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE namespace = '" + route + "'") > 0) return;
    } catch (const db::DbError&) {
      // the host has not made its tables yet
    }
    std::this_thread::sleep_for(5ms);
  }
}

}  // namespace

// The issue's acceptance run: 2,000 entities × 5 events, 20% failing once
// (forwarded to a retry topic and back), two hosts, a kill -9 and the
// rebalances of a host joining, dying and coming back.
BOOST_AUTO_TEST_CASE(entities_keep_their_order_through_retry_topics_kills_and_rebalances) {
  Scenario s("ordering_acceptance");
  s.topic("events", 8).topic("events.retry.1", 4).topic("events.dlq", 1);
  const auto msgs = entity_events(2000, 5, 5);
  s.kafka.produce("events", msgs);
  // The scripted failures are the records' own (each fails its first call),
  // and late in the run they are most of the calls: to the circuit that
  // looks like an outage. No circuit here: this case is about order.
  RouteSpec route = s.scripted("fulfil", "events",
                               kOrderByKey + "[route.retry]\ntopics = [\"1s\"]\n[route.circuit]\nenabled = false\n");
  route.key_toml = kById;
  auto& h1 = s.host("h1", {route});
  // Let h1 get going, then h2 joins (a rebalance), h1 dies (another), and
  // comes back (a third).
  wait_done(s, 1500);
  auto& h2 = s.host("h2", {route});
  wait_done(s, 4000);
  h1.kill();
  wait_done(s, 6000);
  auto& h1_again = s.host("h1", {route});
  // Every claim done first: a forward still in the outbox is not in its retry topic yet.
  wait_done(s, 10000, "", 300s);
  s.wait_committed(h2, 180s, {"events", "events.retry.1"});
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(Status::Done)) == 10000);
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_claim") == 10000);
  const OrderReport report = check_order(s.calls_log());
  BOOST_TEST(report.violations == 0u);
  BOOST_TEST(report.tokens.size() == 10000u);
  for (const auto& [id, tokens] : report.tokens)
    BOOST_TEST(tokens.size() == 1u, id << " had " << tokens.size() << " tokens");
  BOOST_TEST_MESSAGE("10,000 events of 2,000 entities: "
                     << report.calls << " calls, " << report.violations << " order violations, "
                     << s.scalar("SELECT COUNT(*) FROM idemsink_order_hold") << " holds left");
  BOOST_TEST(h1_again.stop() == 0);
  BOOST_TEST(h2.stop() == 0);
  s.audit_clean(h2);
}

// Records waiting for their entity count as buffered, and a full buffer
// pauses fetching; the retry topic whose records release them must not
// pause with it, or the host waits for itself.
BOOST_AUTO_TEST_CASE(a_full_buffer_of_waiting_entities_still_fetches_what_releases_them) {
  Scenario s("ordering_backpressure");
  s.topic("events", 2).topic("events.retry.1", 1).topic("events.dlq", 1);
  s.kafka.produce("events", entity_events(300, 5, 2));  // half the events fail their first call
  RouteSpec route = s.scripted("fulfil", "events",
                               kOrderByKey + "[route.retry]\ntopics = [\"500ms\"]\n[route.circuit]\nenabled = false\n");
  route.key_toml = kById;
  auto& host = s.host("h1", {route}, Scenario::HostOptions{.host_lines = "max_buffered_records = 100\n"});
  wait_done(s, 1500, "", 120s);
  s.wait_committed(host, {"events", "events.retry.1"});
  const OrderReport report = check_order(s.calls_log());
  BOOST_TEST(report.violations == 0u);
  BOOST_TEST(report.tokens.size() == 1500u);
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}

// A duplicate of a record that is in a retry topic waits behind its entity's
// next record, which waits for that retry: the retry copy must not queue
// behind the duplicate (a circle nothing would break).
BOOST_AUTO_TEST_CASE(a_duplicate_behind_its_entity_never_blocks_its_own_retry) {
  Scenario s("ordering_duplicate");
  s.topic("events", 1).topic("events.retry.1", 1).topic("events.dlq", 1);
  const std::string first = "{\"id\":\"retry1-X#1\"}";
  s.kafka.produce("events", {{"X", first}, {"X", "{\"id\":\"X#2\"}"}, {"X", first}, {"Y", "{\"id\":\"Y#1\"}"}});
  RouteSpec route = s.scripted("fulfil", "events", kOrderByKey + "[route.retry]\ntopics = [\"300ms\"]\n");
  route.key_toml = kById;
  auto& host = s.host("h1", {route});
  wait_done(s, 3, "", 60s);
  s.wait_committed(host, {"events", "events.retry.1"});
  const auto calls = s.calls_by_key();
  BOOST_TEST(calls.at("retry1-X#1").size() == 2u);  // failed once, then done from the retry topic
  BOOST_TEST(calls.at("X#2").size() == 1u);
  BOOST_TEST(check_order(s.calls_log()).violations == 0u);
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}

// on_dead = "hold": an entity whose event ended dead waits for a person; its
// other entities go on; a release lets it go on. With the default, it goes on.
BOOST_AUTO_TEST_CASE(a_dead_event_holds_its_entity_until_released) {
  Scenario s("ordering_dead_hold");
  s.topic("events", 1).topic("events.dlq", 1);
  std::vector<TestMessage> msgs;
  for (int seq = 0; seq < 3; ++seq)
    for (const std::string e : {"A", "B"}) {
      const std::string id = (e == "A" && seq == 1 ? "perm-" : "") + e + "#" + std::to_string(seq);
      msgs.push_back({e, "{\"id\":\"" + id + "\"}"});
    }
  s.kafka.produce("events", msgs);
  RouteSpec route = s.scripted("fulfil", "events", kOrderByKey + "on_dead = \"hold\"\n");
  route.key_toml = kById;
  auto& host = s.host("h1", {route});
  // B finishes; A stops behind its dead event A#1: A#2 is never called.
  wait_done(s, 4);                      // A#0 and B's three
  std::this_thread::sleep_for(1500ms);  // several rechecks of A#2
  const auto calls = s.calls_per_key();
  BOOST_TEST(calls.count("A#2") == 0u, "A#2 ran past its entity's dead event");
  BOOST_TEST(calls.at("A#0") == 1);
  BOOST_TEST(calls.at("perm-A#1") == 1);
  const auto [code, listed] = run_cli(s.dir, "holds", {"order-holds", "--config", host.config_path().string()});
  BOOST_TEST(code == 0);
  BOOST_TEST(listed.find("order_key=A held_by=perm-A#1 (failed)") != std::string::npos, listed);
  // The commit waits at A#2, uncommitted: a restart would read it again.
  const auto [rc, out] = run_cli(s.dir, "release",
                                 {"order-holds", "release", "A", "--route", "fulfil", "--config",
                                  host.config_path().string(), "--note", "refunded by hand"});
  BOOST_TEST(rc == 0, out);
  s.wait_committed(host, {"events"});
  BOOST_TEST(s.calls_per_key().at("A#2") == 1);
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}

// A held entity's records wait for a person, maybe for hours: they must not
// fill the host's buffer and pause every route. They count apart, bounded
// per route by order_by.max_waiting (at which only that route's topic stops
// fetching), so another route of the same database goes on meanwhile.
BOOST_AUTO_TEST_CASE(a_held_entity_never_stalls_the_other_routes) {
  Scenario s("ordering_held_apart");
  s.topic("events", 1).topic("events.dlq", 1).topic("plain", 2).topic("plain.dlq", 1);
  std::vector<TestMessage> held;
  for (int seq = 0; seq < 300; ++seq)
    held.push_back({"A", "{\"id\":\"" + std::string(seq == 0 ? "perm-" : "") + "A#" + std::to_string(seq) + "\"}"});
  s.kafka.produce("events", held);
  RouteSpec ordered = s.scripted("fulfil", "events", kOrderByKey + "on_dead = \"hold\"\nmax_waiting = 50\n");
  ordered.key_toml = kById;
  const RouteSpec plain = s.scripted("plain", "plain");
  auto& host = s.host("h1", {ordered, plain}, Scenario::HostOptions{.host_lines = "max_buffered_records = 100\n"});
  wait_claimed(s, "fulfil");
  s.kafka.produce("plain", keyed_messages("p-", 0, 500));
  wait_done(s, 500, "plain", 60s);  // while A waits for a person
  BOOST_TEST(s.calls_per_key().count("A#1") == 0u, "A#1 ran past its entity's dead event");
  BOOST_TEST(host.log().find("wait for entities' holds (route.order_by.max_waiting 50)") != std::string::npos);
  const auto [rc, out] = run_cli(s.dir, "release",
                                 {"order-holds", "release", "A", "--route", "fulfil", "--config",
                                  host.config_path().string(), "--note", "settled by hand"});
  BOOST_TEST(rc == 0, out);
  wait_done(s, 299, "fulfil", 120s);
  s.wait_committed(host, {"events", "plain"});
  int last_seq = -1, out_of_order = 0;
  for (const auto& cols : read_call_log(s.calls_log())) {
    const std::string id = unhex(cols.at(1));
    if (id.find('#') == std::string::npos) continue;  // the plain route's
    const int seq = entity_and_seq(id.starts_with("perm-") ? id.substr(5) : id).second;
    out_of_order += seq < last_seq;
    last_seq = std::max(last_seq, seq);
  }
  BOOST_TEST(out_of_order == 0);
  expect_each_key_called_once(s.calls_per_key(), 800);
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}
