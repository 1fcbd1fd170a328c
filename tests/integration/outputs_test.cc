// Outcome events ([route.output]): an event exists if and only if its
// record's outcome does, and is published exactly once in effect (a repeat
// after a crash carries the same idemsink.event_id). Each case counts both
// halves: every done record has its event, no record that is not done has a
// done event, and after dropping repeats by id each event is seen once.
#define BOOST_TEST_MODULE outputs
#include <boost/test/unit_test.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/common/util.h"
#include "core/dlq/outbox.h"
#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace std::chrono_literals;
using claim::Status;

namespace {

const std::string kOutput = "[route.output]\ntopic = \"orders.events\"\n";

// The events of `topic` by event id (repeats counted apart), checked to be
// well formed: the header id, the envelope's id and outcome agree.
struct Events {
  std::map<std::string, nlohmann::json> by_id;  // first publication of each id
  size_t repeats = 0;                           // publications of an id seen before
  std::map<std::string, std::string> outcome_by_key;
  /// The event of a key's outcome ("done", "failed", "unknown").
  const nlohmann::json& of(const std::string& key, const std::string& outcome) const {
    for (const auto& [id, j] : by_id)
      if (j.at("biz_key") == key && j.at("outcome") == outcome) return j;
    throw std::out_of_range("no " + outcome + " event of " + key);
  }
};
Events read_events(Scenario& s, const std::string& topic, int partitions) {
  Events out;
  for (const auto& m : s.kafka.read_all(topic, partitions)) {
    const std::string id = m.headers.at("idemsink.event_id");
    auto j = nlohmann::json::parse(m.value.value_or("null"));
    BOOST_TEST(j.at("event_id").get<std::string>() == id);
    BOOST_TEST(j.at("outcome").get<std::string>() == m.headers.at("idemsink.outcome"));
    BOOST_TEST(*m.key == j.at("biz_key").get<std::string>(), "events are keyed by the biz_key");
    // An event is not a dead letter: none of a letter's headers.
    BOOST_TEST(m.headers.count("idemsink.reason") == 0u);
    BOOST_TEST(m.headers.count("idemsink.source.topic") == 0u);
    BOOST_TEST(m.headers.count("idemsink.outbox_id") == 1u);
    if (!out.by_id.emplace(id, j).second) {
      ++out.repeats;
      continue;
    }
    out.outcome_by_key[j.at("biz_key").get<std::string>()] = j.at("outcome").get<std::string>();
  }
  return out;
}

// Waits until the outbox holds no unpublished event of the scenario's routes.
void wait_events_published(Scenario& s) {
  for (int i = 0; i < 600; ++i) {
    if (s.scalar("SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE published_at IS NULL AND " + dlq::sql_is_event()) == 0)
      return;
    std::this_thread::sleep_for(100ms);
  }
  BOOST_FAIL("outcome events were not all published within 60 s");
}

// The keys whose claims are in `status`.
std::set<std::string> keys_in(Scenario& s, Status status) {
  std::set<std::string> out;
  auto c = s.connect();
  for (auto& r : c->query("SELECT biz_key FROM idemsink_claim WHERE " + sql_status_is(status))) out.insert(*r[0]);
  return out;
}

// Both halves: every done key has exactly one done event, nothing else has one.
void expect_one_done_event_per_done_claim(Scenario& s, const Events& events) {
  const std::set<std::string> done = keys_in(s, Status::Done);
  size_t done_events = 0;
  for (const auto& [key, outcome] : events.outcome_by_key)
    if (outcome == "done") {
      ++done_events;
      BOOST_TEST(done.count(key) == 1u, key << " has a done event but its claim is not done");
    }
  for (const auto& key : done) BOOST_TEST(events.outcome_by_key.count(key) == 1u, key << " is done without an event");
  BOOST_TEST(done_events == done.size());
}

}  // namespace

BOOST_AUTO_TEST_CASE(each_outcome_publishes_its_event_once) {
  Scenario s("outputs_basic");
  s.topic("orders", 2).topic("orders.dlq", 1).topic("orders.events", 2);
  std::vector<TestMessage> msgs;
  for (int i = 0; i < 40; ++i) msgs.push_back({"o-" + std::to_string(i), "{}"});
  msgs.push_back({"o-3", "{}"});           // a duplicate: no second event
  msgs.push_back({"perm-1", "{}"});        // rejected: a failed event (include_failed)
  msgs.push_back({"retry2-1", "{}"});      // done after retries: one event
  msgs.push_back({"bigreceipt-1", "{}"});  // a receipt longer than its claim column, whole in the event
  msgs[5].headers = {{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}};
  s.kafka.produce("orders", msgs);
  auto& host =
      s.host("h1", {s.scripted("waybill", "orders",
                               kOutput + "include_failed = true\n[route.retry]\nbackoff_initial = \"10ms\"\n")});
  s.wait_committed(host, {"orders"});
  wait_events_published(s);
  const Events events = read_events(s, "orders.events", 2);
  BOOST_TEST(events.repeats == 0u);
  expect_one_done_event_per_done_claim(s, events);
  BOOST_TEST(events.by_id.size() == 43u);  // 42 done + 1 failed
  BOOST_TEST(events.outcome_by_key.at("perm-1") == "failed");
  // The envelope: the claim's token, the source position, the receipt.
  auto c = s.connect();
  const std::string token = *c->query("SELECT idem_token FROM idemsink_claim WHERE biz_key = 'o-7'")[0][0];
  const auto& e = events.of("o-7", "done");
  BOOST_TEST(e.at("idem_token").get<std::string>() == token);
  BOOST_TEST(e.at("route").get<std::string>() == "waybill");
  BOOST_TEST(e.at("receipt").get<std::string>() == "r-" + token);
  BOOST_TEST(e.at("source").at("topic").get<std::string>() == "orders");
  BOOST_TEST(events.of("bigreceipt-1", "done").at("receipt").get<std::string>().size() == 5000u);
  const auto failed = events.of("perm-1", "failed");
  // The id: the token, the claim's epoch, the outcome.
  BOOST_TEST(failed.at("event_id").get<std::string>().ends_with("/failed"));
  BOOST_TEST(failed.at("event_id").get<std::string>().starts_with(failed.at("idem_token").get<std::string>() + "/"));
  BOOST_TEST(failed.at("reason").get<std::string>() == "permanent");
  // The source record's trace context travels with its event.
  bool traced = false;
  for (const auto& m : s.kafka.read_all("orders.events", 2))
    if (m.key == "o-5") traced = m.headers.count("traceparent") && m.headers.at("traceparent").starts_with("00-4bf92f");
  BOOST_TEST(traced);
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}

// Killed between the done commit and the publish, and between the broker's
// ack of events and their stamps: after a restart every done record has its
// event; repeats carry the id already seen.
BOOST_AUTO_TEST_CASE(kills_around_the_publish_lose_no_event) {
  Scenario s("outputs_kills");
  s.topic("orders", 4).topic("orders.dlq", 1).topic("orders.events", 2);
  s.kafka.produce("orders", keyed_messages("o-", 0, 1500));
  const auto route = with_delay(s.scripted("waybill", "orders", kOutput), "1ms");
  for (const std::string fault : {"after_mark_done:2", "before_outbox_stamp:3"}) {
    // One host id throughout (a restarted host): it takes its dead run's rows at once.
    auto& crashing = s.host("h1", {route}, Scenario::HostOptions{.env = {{"IDEMSINK_FAULT", fault}}});
    const auto rc = crashing.proc().wait(120s);
    BOOST_REQUIRE_MESSAGE(rc && *rc == -9, "the fault " << fault << " did not kill the host");
  }
  auto& host = s.host("h1", {route});
  s.wait_committed(host, {"orders"});
  wait_events_published(s);
  const Events events = read_events(s, "orders.events", 2);
  expect_one_done_event_per_done_claim(s, events);
  BOOST_TEST(keys_in(s, Status::Done).size() == 1500u);
  BOOST_TEST_MESSAGE("events: " << events.by_id.size() << " distinct, " << events.repeats
                                << " repeats (dropped by idemsink.event_id)");
  BOOST_TEST(events.repeats > 0u, "the kill before the stamps should have left rows to publish again");
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}

// local_tx: the credit and its event commit together or not at all, also
// when the host dies inside the transaction. Among the 1,200 credits, eight
// records write their row and then report a permanent failure, four through
// a statement of their own and four through a queued row (test_local_tx):
// their batches are run again with a savepoint per record, and neither their
// rows nor their events survive.
BOOST_AUTO_TEST_CASE(ledger_event_and_credit_together_or_neither) {
  Scenario s("outputs_ledger");
  s.topic("ledger", 4).topic("ledger.dlq", 1).topic("ledger.events", 2);
  auto msgs = keyed_messages("pay-", 0, 1200);
  for (int i = 0; i < 8; ++i) msgs.insert(msgs.begin() + 150 * i, {"perm-" + std::to_string(i), "{}"});
  s.kafka.produce("ledger", msgs);
  const RouteSpec route{"ledger", "ledger", "test_local_tx.so", "", {}, "[route.output]\ntopic = \"ledger.events\"\n"};
  auto& crashing = s.host("h1", {route}, Scenario::HostOptions{.env = {{"IDEMSINK_FAULT", "in_local_tx:3"}}});
  const auto rc = crashing.proc().wait(120s);
  BOOST_REQUIRE_MESSAGE(rc && *rc == -9, "the fault in_local_tx did not kill the host");
  // Killed inside the transaction: no event without its credit, nor the reverse.
  BOOST_TEST(
      s.scalar("SELECT COUNT(*) FROM test_effects") ==
      s.scalar("SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE " + dlq::sql_purpose_is(dlq::Purpose::EventDone)));
  auto& host = s.host("h1", {route});
  s.wait_committed(host, {"ledger"});
  wait_events_published(s);
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM test_effects") == 1200);
  BOOST_TEST(s.scalar("SELECT COUNT(DISTINCT biz_key) FROM test_effects") == 1200);
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM test_effects WHERE biz_key LIKE 'perm-%'") == 0);
  // Failed, never unknown: a claim taken over from the killed host was
  // pending, so its local_tx write had not committed.
  BOOST_TEST(keys_in(s, Status::Failed).size() == 8u);
  std::set<std::string> dead;
  wait_until(
      [&] {
        for (const auto& m : s.kafka.read_all("ledger.dlq", 1))
          if (m.key) dead.insert(*m.key);
        return dead.size() >= 8;
      },
      30s, "eight dead letters");
  BOOST_TEST(dead.size() == 8u);
  const Events events = read_events(s, "ledger.events", 2);
  expect_one_done_event_per_done_claim(s, events);
  BOOST_TEST(events.by_id.size() == 1200u);
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}

// An unknown outcome publishes an unknown event (include_unknown); an
// operator's settlement as done publishes the done event, in the same
// transaction as the decision.
BOOST_AUTO_TEST_CASE(a_settlement_publishes_the_done_event) {
  Scenario s("outputs_settled");
  s.topic("sms", 1).topic("sms.dlq", 1).topic("orders.events", 1);
  s.kafka.produce("sms", {{"uncertain-1", "{}"}, {"m-1", "{}"}});
  const auto route = s.scripted("sms", "sms", kOutput + "include_unknown = true\n", "scripted_at_most_once.so");
  auto& host = s.host("h1", {route});
  s.wait_committed(host, {"sms"});
  wait_events_published(s);
  Events events = read_events(s, "orders.events", 1);
  BOOST_TEST(events.outcome_by_key.at("uncertain-1") == "unknown");
  BOOST_TEST(events.outcome_by_key.at("m-1") == "done");
  auto c = s.connect();
  const std::string token = *c->query("SELECT idem_token FROM idemsink_claim WHERE biz_key = 'uncertain-1'")[0][0];
  const auto [code, out] = run_cli(s.dir, "resolve",
                                   {"reconcile", "--config", host.config_path().string(), "--resolve", token, "--as",
                                    "done", "--note", "the gateway's log shows it sent"});
  BOOST_TEST(code == 0, out);
  wait_events_published(s);
  events = read_events(s, "orders.events", 1);
  BOOST_TEST(events.of("uncertain-1", "unknown").at("idem_token").get<std::string>() == token);
  BOOST_TEST(events.of("uncertain-1", "done").at("idem_token").get<std::string>() == token);
  BOOST_TEST(events.by_id.size() == 3u);
  BOOST_TEST(host.stop() == 0);
}

// A settlement's event names the claim's first position: a record settled
// failed, replayed, unknown again and settled failed again has two failed
// events (two epochs of its claim), and both are published. Keyed by
// position alone in the outbox, the second was dropped: downstream's last
// word on the record stayed "unknown".
BOOST_AUTO_TEST_CASE(each_settlement_of_a_replayed_record_publishes_its_event) {
  Scenario s("outputs_settled_twice");
  s.topic("sms", 1).topic("sms.dlq", 1).topic("orders.events", 1);
  s.kafka.produce("sms", {{"uncertain-2", "{}"}});
  const auto route =
      s.scripted("sms", "sms", kOutput + "include_unknown = true\ninclude_failed = true\n", "scripted_at_most_once.so");
  auto& host = s.host("h1", {route});
  s.wait_committed(host, {"sms"});
  auto c = s.connect();
  const std::string token = *c->query("SELECT idem_token FROM idemsink_claim WHERE biz_key = 'uncertain-2'")[0][0];
  const auto resolve_failed = [&](const std::string& note) {
    const auto [code, out] = run_cli(
        s.dir, "resolve-" + note,
        {"reconcile", "--config", host.config_path().string(), "--resolve", token, "--as", "failed", "--note", note});
    BOOST_TEST(code == 0, out);
  };
  resolve_failed("first");
  const auto [code, out] = run_cli(s.dir, "replay",
                                   {"replay", "--config", host.config_path().string(), "--route", "sms", "--key",
                                    "uncertain-2", "--note", "the gateway is fixed"});
  BOOST_TEST(code == 0, out);
  wait_until(
      [&] { return s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(Status::Unknown)) == 1; }, 60s,
      "the replayed record unknown again");
  resolve_failed("second");
  wait_events_published(s);
  const Events events = read_events(s, "orders.events", 1);
  std::map<std::string, int> outcomes;
  int64_t last_at = 0;
  std::string last;
  for (const auto& [id, j] : events.by_id) {
    ++outcomes[j.at("outcome").get<std::string>()];
    if (j.at("at_ms").get<int64_t>() >= last_at) {
      last_at = j.at("at_ms").get<int64_t>();
      last = j.at("outcome").get<std::string>();
    }
  }
  BOOST_TEST(outcomes["unknown"] == 2);
  BOOST_TEST(outcomes["failed"] == 2);
  BOOST_TEST(last == "failed");
  BOOST_TEST(host.stop() == 0);
}
