// The batch partial-failure policy and DLQ routing, end to end: one bad
// record neither stalls nor replays the others, every outcome is durable
// before its offset is committed, and the DLQ loses nothing even while it
// refuses writes.
#define BOOST_TEST_MODULE failure_policy
#include <boost/test/unit_test.hpp>
#include <map>
#include <set>

#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace std::chrono_literals;

namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string order_json(const std::string& id, int amount = 1) {
  return "{\"order\":{\"id\":\"" + id + "\",\"amount\":" + std::to_string(amount) + "}}";
}

const std::string kJsonKey = "key = { from = \"json\", json = \"order.id\" }";
const std::string kFastRetry = "[route.retry]\nmax_attempts = 5\nbackoff_initial = \"10ms\"\nbackoff_max = \"50ms\"\n";

// `route` with its biz_key read from the value: the order's id.
RouteSpec json_keyed(RouteSpec route) {
  route.key_toml = kJsonKey;
  return route;
}

}  // namespace

BOOST_AUTO_TEST_CASE(one_bad_record_of_200_neither_stalls_nor_replays_the_other_199) {
  Scenario s("policy_batch");
  s.topic("orders", 1).topic("orders.dlq", 1).topic("sms", 1).topic("sms.dlq", 1);

  // One poll's worth on orders: 196 good, one permanent rejection, one that
  // fails three times then succeeds, one poison (not JSON), one whose key
  // field is missing. Every record carries a trace header.
  std::vector<TestMessage> batch;
  for (int i = 0; i < 200; ++i) {
    std::string value = order_json("o-" + std::to_string(i));
    if (i == 37) value = order_json("perm-37");
    if (i == 80) value = order_json("retry3-80");
    if (i == 120) value = "{not json at all";
    if (i == 150) value = "{\"order\":{\"amount\":5}}";
    batch.push_back({"k" + std::to_string(i), value, {{"trace-id", "t-" + std::to_string(i)}}});
  }
  s.kafka.produce("orders", batch);
  std::vector<TestMessage> sms;
  for (int i = 0; i < 20; ++i) sms.push_back({i == 7 ? "uncertain-7" : "sms-" + std::to_string(i), "hello"});
  s.kafka.produce("sms", sms);

  auto& host = s.host("host-a", {json_keyed(s.scripted("waybill", "orders", kFastRetry)),
                                 s.scripted("sms", "sms", kFastRetry, "scripted_at_most_once.so")});
  s.wait_committed(host, {"orders"});
  s.wait_committed(host, {"sms"});
  BOOST_TEST(s.kafka.committed("g", "orders", 1)[0] == 200);
  BOOST_TEST(s.kafka.committed("g", "sms", 1)[0] == 20);

  // No replay: every good record was called exactly once.
  auto calls_of = s.calls_by_key();
  for (int i = 0; i < 200; ++i) {
    if (i == 37 || i == 80 || i == 120 || i == 150) continue;
    BOOST_TEST(calls_of["o-" + std::to_string(i)].size() == 1u, "o-" << i);
  }
  BOOST_TEST(calls_of["perm-37"].size() == 1u);  // permanent: never retried
  const auto& retried = calls_of["retry3-80"];
  BOOST_REQUIRE(retried.size() == 4u);                              // three failures, then success
  for (const auto& c : retried) BOOST_TEST(c[2] == retried[0][2]);  // one token throughout
  BOOST_TEST(retried.back()[4] == "ok");
  BOOST_TEST(calls_of["uncertain-7"].size() == 1u);  // at most once: never called again

  // The database says the same.
  auto conn = s.connect();
  auto count = [&](const std::string& where) {
    return std::stoi(*conn->query("SELECT COUNT(*) FROM idemsink_claim WHERE " + where)[0][0]);
  };
  auto count_unpublished = [&] {
    return std::stoi(*conn->query("SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE published_at IS NULL")[0][0]);
  };
  BOOST_TEST(count("namespace = 'waybill' AND " + sql_status_is(claim::Status::Done)) == 197);
  BOOST_TEST(count("namespace = 'waybill' AND " + sql_status_is(claim::Status::Failed)) == 1);
  BOOST_TEST(count("namespace = 'sms' AND " + sql_status_is(claim::Status::Done)) == 19);
  BOOST_TEST(count("namespace = 'sms' AND " + sql_status_is(claim::Status::Unknown)) == 1);
  BOOST_TEST(*conn->query("SELECT calls FROM idemsink_claim WHERE biz_key = 'retry3-80'")[0][0] == "4");

  // DLQ: the rejection, the poison and the missing key, with their headers.
  auto dlq = s.wait_records("orders.dlq", 3);
  BOOST_REQUIRE(dlq.size() == 3u);
  std::map<std::string, ConsumedMessage> by_reason;
  for (auto& m : dlq) by_reason[m.headers["idemsink.reason"]] = m;
  BOOST_REQUIRE(by_reason.count("permanent"));
  BOOST_REQUIRE(by_reason.count("undecodable_value"));
  BOOST_REQUIRE(by_reason.count("missing_key"));
  const auto& perm = by_reason["permanent"];
  BOOST_TEST(*perm.key == "k37");
  BOOST_TEST(*perm.value == order_json("perm-37"));
  BOOST_TEST(perm.headers.at("trace-id") == "t-37");  // original headers kept
  BOOST_TEST(perm.headers.at("idemsink.source.topic") == "orders");
  BOOST_TEST(perm.headers.at("idemsink.source.partition") == "0");
  BOOST_TEST(perm.headers.at("idemsink.source.offset") == "37");
  BOOST_TEST(perm.headers.at("idemsink.route") == "waybill");
  BOOST_TEST(perm.headers.at("idemsink.attempt") == "1");
  BOOST_TEST(perm.headers.at("idemsink.error") == "scripted outcome");
  BOOST_TEST(perm.headers.at("idemsink.idem_token").size() == 36u);
  BOOST_TEST(perm.headers.at("idemsink.host") == "host-a");
  BOOST_TEST(std::stoll(perm.headers.at("idemsink.first_failure_ms")) > 0);
  BOOST_TEST(std::stoll(perm.headers.at("idemsink.last_failure_ms")) >=
             std::stoll(perm.headers.at("idemsink.first_failure_ms")));
  BOOST_TEST(by_reason["undecodable_value"].headers.at("idemsink.source.offset") == "120");
  BOOST_TEST(by_reason["undecodable_value"].headers.count("idemsink.idem_token") == 0u);  // never claimed
  BOOST_TEST(*by_reason["undecodable_value"].value == "{not json at all");

  auto sms_dlq = s.wait_records("sms.dlq", 1);
  BOOST_REQUIRE(sms_dlq.size() == 1u);
  BOOST_TEST(sms_dlq[0].headers.at("idemsink.reason") == "uncertain");
  BOOST_TEST(*sms_dlq[0].key == "uncertain-7");

  // Every outbox row was published, exactly once.
  wait_until([&] { return count_unpublished() == 0; }, 30s, "the outbox to drain");
  BOOST_TEST(host.stop() == 0);
}

BOOST_AUTO_TEST_CASE(dlq_outage_blocks_nothing_and_loses_nothing, *boost::unit_test::precondition(mock_only)) {
  Scenario s("policy_dlq_outage");
  s.topic("orders", 2).topic("orders.dlq", 1);
  std::vector<TestMessage> msgs;
  for (int i = 0; i < 400; ++i)
    msgs.push_back(
        {"k" + std::to_string(i), order_json(i % 20 == 0 ? "perm-" + std::to_string(i) : "o-" + std::to_string(i))});
  s.kafka.produce("orders", msgs);
  // The DLQ refuses every produce request for a while.
  std::string errors = "push_errors Produce";
  for (int i = 0; i < 60; ++i) errors += " NOT_ENOUGH_REPLICAS";
  s.kafka.command(errors);

  auto& host = s.host("host-a", {json_keyed(s.scripted("waybill", "orders", kFastRetry))},
                      {.producer_lines = "\"retry.backoff.ms\" = \"250\"\n"});
  // The source partitions move to the end although the DLQ is down: the
  // dead records are durable in the outbox, not yet published.
  s.wait_committed(host);
  auto conn = s.connect();
  BOOST_TEST(std::stoi(*conn->query("SELECT COUNT(*) FROM idemsink_dlq_outbox")[0][0]) == 20);
  BOOST_TEST(std::stoi(*conn->query("SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE published_at IS NULL")[0][0]) > 0,
             "the DLQ took the records before the source partitions were committed: the outage was not tested");
  // When the DLQ takes writes again, the relay publishes each row once.
  auto dlq = s.wait_records("orders.dlq", 20, 120s);
  wait_until(
      [&] { return conn->query("SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE published_at IS NULL")[0][0] == "0"; },
      60s, "the outbox to drain");
  dlq = s.kafka.read_all("orders.dlq", 1);
  std::map<std::string, int> seen;
  for (const auto& m : dlq)
    ++seen[m.headers.at("idemsink.source.offset") + "/" + m.headers.at("idemsink.source.partition")];
  BOOST_TEST(dlq.size() == 20u);
  BOOST_TEST(seen.size() == 20u);  // none twice
  BOOST_TEST(host.stop() == 0);
}

BOOST_AUTO_TEST_CASE(poison_input_goes_to_the_dlq_with_a_reason) {
  Scenario s("policy_poison");
  s.topic("orders", 1).topic("orders.dlq", 1);
  const int64_t day = 86'400'000;
  std::vector<TestMessage> msgs{
      {"a", order_json("good-1")},
      {"b", "\xff\xfe not json"},                                                        // undecodable_value
      {"c", "{\"order\":{}}"},                                                           // missing_key
      {"d", "{\"order\":{\"id\":\"big\",\"pad\":\"" + std::string(3000, 'x') + "\"}}"},  // record_too_large
      {"e", order_json(std::string(300, 'k'))},                                          // biz_key_too_long
      {"f", order_json("good-2", 10)},
      {"g", order_json("good-2", 99)},                            // payload_conflict with f
      {"h", order_json("old-1"), {}, -1, now_ms() - 100 * day},   // beyond_replay_horizon
      {"i", order_json("future-1"), {}, -1, now_ms() + 2 * day},  // timestamp_in_future
      {"j", order_json("good-3")},
  };
  s.kafka.produce("orders", msgs);
  auto& host = s.host("host-a", {json_keyed(s.scripted("waybill", "orders", "max_record_bytes = 2000\n"))});
  s.wait_committed(host);
  auto dlq = s.wait_records("orders.dlq", 7);
  std::map<std::string, std::string> reason_by_key;
  for (const auto& m : dlq) reason_by_key[*m.key] = m.headers.at("idemsink.reason");
  BOOST_TEST(reason_by_key["b"] == "undecodable_value");
  BOOST_TEST(reason_by_key["c"] == "missing_key");
  BOOST_TEST(reason_by_key["d"] == "record_too_large");
  BOOST_TEST(reason_by_key["e"] == "biz_key_too_long");
  BOOST_TEST(reason_by_key["g"] == "payload_conflict");
  BOOST_TEST(reason_by_key["h"] == "beyond_replay_horizon");
  BOOST_TEST(reason_by_key["i"] == "timestamp_in_future");
  BOOST_TEST(dlq.size() == 7u);
  auto calls_of = s.calls_by_key();
  BOOST_TEST(calls_of.size() == 3u);  // good-1, good-2 (once), good-3
  BOOST_TEST(host.running());
  BOOST_TEST(host.stop() == 0);
}

BOOST_AUTO_TEST_CASE(misbehaving_plugins_are_contained) {
  Scenario s("policy_plugins");
  s.topic("orders", 1).topic("orders.dlq", 1).topic("twice", 1).topic("twice.dlq", 1);
  s.kafka.produce("orders", {{"throw-1", "x"}, {"hang-1", "x"}, {"fine-1", "x"}});
  s.kafka.produce("twice", {{"t-1", "x"}, {"t-2", "x"}, {"bad-1", "x"}});
  const std::string retry =
      "call_timeout = \"300ms\"\n[route.retry]\nmax_attempts = 3\nbackoff_initial = \"10ms\"\n"
      "backoff_max = \"20ms\"\n";
  auto& host = s.host(
      "host-a", {s.scripted("waybill", "orders", retry), {"twice", "twice", "double_complete.so", "", {}, retry}});
  s.wait_committed(host, {"orders"});
  s.wait_committed(host, {"twice"});
  auto conn = s.connect();
  auto status = [&](const std::string& key) {
    return *conn->query("SELECT status FROM idemsink_claim WHERE biz_key = '" + key + "'")[0][0];
  };
  // A throwing plugin and a plugin that never answers exhaust their retries
  // (same token) and are dead-lettered; the host stays up. Their calls may
  // have applied the effect (a throw or a silence says nothing about it), so
  // they end unknown (maybe_applied), never failed.
  BOOST_TEST(status("throw-1") == "4");
  BOOST_TEST(status("hang-1") == "4");
  BOOST_TEST(status("fine-1") == "2");
  BOOST_TEST(s.calls_by_key()["hang-1"].size() == 3u);
  // A plugin that reports twice counts once; an invalid outcome is not success.
  BOOST_TEST(status("t-1") == "2");
  BOOST_TEST(status("t-2") == "2");
  BOOST_TEST(status("bad-1") == "4");  // an invalid outcome is uncertain
  const std::string log = host.log();
  BOOST_TEST(log.find("handler threw: scripted failure") != std::string::npos);
  BOOST_TEST(log.find("did not report within call_timeout") != std::string::npos);
  BOOST_TEST(log.find("it was already reported, or came after its deadline") != std::string::npos);
  BOOST_TEST(log.find("invalid outcome 42") != std::string::npos);
  BOOST_TEST(host.stop() == 0);
}

BOOST_AUTO_TEST_CASE(delayed_retry_topics_move_failures_aside) {
  Scenario s("policy_retry_topics");
  for (const char* t : {"orders", "orders.retry.1", "orders.retry.2", "orders.dlq"}) s.topic(t, 1);
  std::vector<TestMessage> msgs;
  for (int i = 0; i < 50; ++i) msgs.push_back({"o-" + std::to_string(i), "v"});
  msgs[10] = {"retry1-a", "v", {{"trace-id", "t-a"}}};  // fails once: succeeds from retry topic 1
  msgs[20] = {"retry2-b", "v"};                         // fails twice: succeeds from retry topic 2
  msgs[30] = {"retry9-c", "v"};                         // keeps failing: dead-lettered after the last tier
  s.kafka.produce("orders", msgs);
  auto& host = s.host("host-a", {s.scripted("waybill", "orders", "[route.retry]\ntopics = [\"1500ms\", \"3s\"]\n")});
  // The source partition does not wait for the retries.
  s.wait_committed(host, {"orders"});
  auto early = s.calls_by_key();
  BOOST_TEST(early["retry2-b"].size() < 3u, "the source commit waited for the second retry");
  s.wait_committed(host, {"orders.retry.1"});
  s.wait_committed(host, {"orders.retry.2"});
  auto dlq = s.wait_records("orders.dlq", 1);
  BOOST_REQUIRE(dlq.size() == 1u);
  BOOST_TEST(*dlq[0].key == "retry9-c");
  BOOST_TEST(dlq[0].headers.at("idemsink.reason") == "retries_exhausted");
  BOOST_TEST(dlq[0].headers.at("idemsink.origin.topic") == "orders");  // where it first came from
  BOOST_TEST(dlq[0].headers.at("idemsink.origin.offset") == "30");
  BOOST_TEST(dlq[0].headers.at("idemsink.source.topic") == "orders.retry.2");
  // One line per header name: repeated passes replaced, not piled up.
  std::map<std::string, int> names;
  for (const auto& [k, v] : dlq[0].all_headers) ++names[k];
  for (const auto& [k, n] : names) BOOST_TEST(n == 1, k << " appears " << n << " times");

  auto by_key = s.calls_by_key();
  const auto& a = by_key["retry1-a"];
  const auto& b = by_key["retry2-b"];
  BOOST_REQUIRE(a.size() == 2u);
  BOOST_REQUIRE(b.size() == 3u);
  BOOST_TEST(a[0][2] == a[1][2]);  // the same idem_token on every tier
  BOOST_TEST(b[0][2] == b[2][2]);
  BOOST_TEST(a[1][4] == "ok");
  BOOST_TEST(b[2][4] == "ok");
  // Each tier waited its delay.
  BOOST_TEST(std::stoll(a[1][5]) - std::stoll(a[0][5]) >= 1500);
  BOOST_TEST(std::stoll(b[2][5]) - std::stoll(b[1][5]) >= 3000);
  BOOST_TEST(by_key["retry9-c"].size() == 3u);  // source + two tiers
  auto conn = s.connect();
  BOOST_TEST(*conn->query("SELECT status FROM idemsink_claim WHERE biz_key = 'retry2-b'")[0][0] == "2");
  BOOST_TEST(*conn->query("SELECT status FROM idemsink_claim WHERE biz_key = 'retry9-c'")[0][0] == "3");
  BOOST_TEST(host.stop() == 0);
}
