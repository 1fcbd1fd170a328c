// What only a real Apache Kafka cluster does (IDEMSINK_TEST_KAFKA=real; the
// cases are skipped on the mock): brokers killed with SIGKILL while they lead
// partitions or the KRaft quorum, transactions under read_committed, the log
// cleaner compacting a topic, retention deleting what a lagging group never
// read, acks=all with a replica down. Each case counts both halves of the
// contract: no effect twice (the fake services' own counters, the call log)
// and every record accounted for (the audit).
#define BOOST_TEST_MODULE real_kafka
#include <boost/test/unit_test.hpp>
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
namespace utf = boost::unit_test;

namespace {

// The broker leading most partitions of `topic`.
int busiest_leader(TestKafka& kafka, const std::string& topic) {
  std::map<int32_t, int> led;
  for (const auto& [p, leader] : kafka.leaders(topic)) ++led[leader];
  int best = -1, most = -1;
  for (const auto& [broker, n] : led)
    if (broker >= 0 && n > most) std::tie(best, most) = std::pair{broker, n};
  return best;
}

std::string waybill_route(const FakeServices& services) {
  return route_config({"waybill",
                       "orders",
                       shipped_plugin("waybill"),
                       "",
                       {{"endpoint", "\"" + services.url() + "\""}, {"timeout", "\"2s\""}}});
}

// 6,000 orders through the waybill API while `fault` brings a broker down
// once 1,500 are applied and back up 10 s later: each order applied once,
// every record accounted for.
void broker_killed_mid_run(const std::string& name, const std::function<int(TestKafka&)>& pick) {
  FakeServices services(fake_services_binary(), {"--faults", "waybill:latency_mean_ms=5,latency_p99_ms=40"});
  auto db = MariaDbServer::shared().fresh_database(name);
  TestKafka kafka;
  kafka.create_topic("orders", 6);
  kafka.create_topic("orders.dlq", 3);
  ScratchDir dir("real");
  HostProcess host(dir, "host",
                   base_config(kafka, db, "host-a", "g", "max_in_flight = 400\n") + waybill_route(services));
  kafka.produce("orders", order_messages(0, 3000));
  wait_until([&] { return services.stats()["waybill"]["applied"].get<int>() >= 1500; }, 120s, "1,500 applied");
  const int victim = pick(kafka);
  BOOST_TEST_MESSAGE(name << ": killing broker " << victim
                          << " (active controller: " << kafka.real()->active_controller() << ")");
  kafka.broker_down(victim);
  kafka.produce("orders", order_messages(3000, 6000));  // acks=all: two replicas of three are enough
  wait_until([&] { return services.stats()["waybill"]["applied"].get<int>() >= 4500; }, 180s,
             "progress with a broker down");
  kafka.broker_up(victim);
  wait_committed(kafka, "g", {{"orders", 6}}, host, 240s);
  const auto stats = services.stats()["waybill"];
  BOOST_TEST(stats["applied"].get<int>() == 6000);
  BOOST_TEST(stats["double_applied"].get<int>() == 0);
  auto conn = MariaDbServer::shared().connect(name);
  BOOST_TEST(scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Done)) == 6000);
  BOOST_TEST(scalar(*conn, "SELECT COUNT(*) FROM idemsink_dlq_outbox") == 0);
  BOOST_TEST(host.stop() == 0);
  audit_clean(dir, host);
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_broker_leading_most_partitions_killed_mid_run, *utf::precondition(real_only)) {
  broker_killed_mid_run("real_leader_killed", [](TestKafka& k) { return busiest_leader(k, "orders"); });
}

BOOST_AUTO_TEST_CASE(the_active_controller_killed_mid_run, *utf::precondition(real_only)) {
  broker_killed_mid_run("real_controller_killed", [](TestKafka& k) { return k.real()->active_controller(); });
}

// A transactional producer commits some transactions and aborts others.
// Under read_committed the host never sees an aborted record; the control
// records are verified holes the commit passes; every committed record is
// claimed once.
BOOST_AUTO_TEST_CASE(aborted_transactions_are_never_processed, *utf::precondition(real_only)) {
  auto db = MariaDbServer::shared().fresh_database("real_transactions");
  TestKafka kafka;
  kafka.create_topic("orders", 2);
  ScratchDir dir("real");
  const auto calls = dir / "calls.log";
  HostProcess host(
      dir, "host",
      base_config(kafka, db, "host-a", "g") +
          route_config({"waybill", "orders", "scripted_idempotent.so", "", {{"log", "\"" + calls.string() + "\""}}}));
  std::set<std::string> committed, aborted;
  for (int tx = 0; tx < 10; ++tx) {
    std::vector<TestMessage> msgs;
    for (int i = 0; i < 50; ++i) {
      const std::string id = "tx" + std::to_string(tx) + "-" + std::to_string(i);
      msgs.push_back({id, "{}", {}, i % 2});
      (tx % 3 == 2 ? aborted : committed).insert(id);
    }
    kafka.produce_transaction("orders", msgs, tx % 3 != 2);
  }
  wait_committed(kafka, "g", {{"orders", 2}}, host, 120s);
  auto per_key = calls_per_hex_key(calls);
  auto hex = [](const std::string& s) {
    static const char* d = "0123456789abcdef";
    std::string out;
    for (unsigned char c : s) out += {d[c >> 4], d[c & 15]};
    return out;
  };
  for (const auto& id : committed) BOOST_TEST(per_key[hex(id)] == 1, id);
  for (const auto& id : aborted) BOOST_TEST(per_key.count(hex(id)) == 0u, id);
  BOOST_TEST(per_key.size() == committed.size());
  BOOST_TEST(host.stop() == 0);
  audit_clean(dir, host);
}

// The log cleaner compacts the topic while the host reads it: whatever
// survives is claimed once (the biz_key is the order id in the value, the
// Kafka key the account, so compaction keeps the last order per account);
// the offsets the cleaner removed are holes the commit passes.
BOOST_AUTO_TEST_CASE(a_topic_compacted_while_it_is_read, *utf::precondition(real_only)) {
  auto db = MariaDbServer::shared().fresh_database("real_compacted");
  TestKafka kafka;
  kafka.create_topic("accounts", 1,
                     {{"cleanup.policy", "compact"},
                      {"segment.ms", "500"},
                      {"segment.bytes", "1048576"},
                      {"min.cleanable.dirty.ratio", "0.01"},
                      {"delete.retention.ms", "100"},
                      {"min.compaction.lag.ms", "0"}});
  auto batch = [](int from, int to) {
    std::vector<TestMessage> msgs;
    for (int i = from; i < to; ++i)
      msgs.push_back({"acct-" + std::to_string(i % 50),
                      "{\"order_id\":\"o-" + std::to_string(i) + "\",\"pad\":\"" + std::string(1000, 'x') + "\"}"});
    return msgs;
  };
  kafka.commit("g", "accounts", {{0, 0}});  // the group lags: it reads through what the cleaner removed
  kafka.produce("accounts", batch(0, 3000));
  // The cleaner has run once offsets are gone from the log.
  wait_until([&] { return kafka.read_all("accounts", 1).size() < 3000; }, 120s, "the cleaner to compact");
  ScratchDir dir("real");
  const auto calls = dir / "calls.log";
  HostProcess host(dir, "host",
                   base_config(kafka, db, "host-a", "g") +
                       route_config({"ledger",
                                     "accounts",
                                     "scripted_idempotent.so",
                                     "key = { from = \"json\", json = \"order_id\" }",
                                     {{"log", "\"" + calls.string() + "\""}, {"delay", "\"2ms\""}}}));
  kafka.produce("accounts", batch(3000, 6000));  // and it compacts on while the host reads
  wait_committed(kafka, "g", {{"accounts", 1}}, host, 180s);
  const auto per_key = calls_per_hex_key(calls);
  for (const auto& [key, n] : per_key) BOOST_TEST(n == 1, key);
  BOOST_TEST_MESSAGE("compacted: " << per_key.size() << " of 6000 orders survived to be claimed");
  BOOST_TEST(per_key.size() < 6000u);
  BOOST_TEST(per_key.size() >= 50u);  // at least the last order of every account
  // The removed offsets were holes the commit passed, not losses.
  BOOST_TEST(host.log().find("hold no records") != std::string::npos);
  BOOST_TEST(host.log().find("deleted by retention") == std::string::npos);
  BOOST_TEST(host.stop() == 0);
  audit_clean(dir, host);
}

// Dead letters while one of the three brokers is down: the DLQ producer
// writes with acks=all against min.insync.replicas 2 (the two replicas left
// are enough), idempotently across the leader moving: every letter
// published once.
BOOST_AUTO_TEST_CASE(dead_letters_with_a_replica_down_are_published_once, *utf::precondition(real_only)) {
  auto db = MariaDbServer::shared().fresh_database("real_dlq_replica_down");
  TestKafka kafka;
  kafka.create_topic("orders", 3);
  kafka.create_topic("orders.dlq", 3);
  ScratchDir dir("real");
  const auto calls = dir / "calls.log";
  HostProcess host(
      dir, "host",
      base_config(kafka, db, "host-a", "g") +
          route_config({"waybill", "orders", "scripted_idempotent.so", "", {{"log", "\"" + calls.string() + "\""}}}));
  std::vector<TestMessage> rejected;
  for (int i = 0; i < 300; ++i) rejected.push_back({"perm-" + std::to_string(i), "{}"});
  kafka.produce("orders", std::vector<TestMessage>(rejected.begin(), rejected.begin() + 100));
  const int victim = busiest_leader(kafka, "orders.dlq");
  kafka.broker_down(victim);
  kafka.produce("orders", std::vector<TestMessage>(rejected.begin() + 100, rejected.end()));
  std::vector<ConsumedMessage> letters;
  wait_until(
      [&] {
        try {
          letters = kafka.read_all("orders.dlq", 3);
        } catch (const std::runtime_error&) {
          return false;  // a partition still between leaders
        }
        return letters.size() >= 300;
      },
      180s, "300 dead letters with a broker down");
  kafka.broker_up(victim);
  wait_committed(kafka, "g", {{"orders", 3}}, host, 120s);
  letters = kafka.read_all("orders.dlq", 3);
  std::set<std::string> ids;
  for (const auto& m : letters) ids.insert(m.headers.at("idemsink.outbox_id"));
  BOOST_TEST(letters.size() == 300u);
  BOOST_TEST(ids.size() == 300u);
  BOOST_TEST(host.stop() == 0);
  audit_clean(dir, host);
}

// Retention deletes segments a lagging group never read (the host was down
// longer than the topic keeps records). Those records are gone: the host
// must say so, loudly and on record (the log, a counter, the audit), never
// skip them silently; the records Kafka still has are processed once.
BOOST_AUTO_TEST_CASE(records_deleted_before_they_were_read_are_loud_and_on_record, *utf::precondition(real_only)) {
  auto db = MariaDbServer::shared().fresh_database("real_retention");
  TestKafka kafka;
  kafka.create_topic(
      "orders", 1,
      {{"retention.ms", "1000"}, {"segment.bytes", "1048576"}, {"segment.ms", "200"}, {"file.delete.delay.ms", "0"}});
  kafka.commit("g", "orders", {{0, 0}});  // a group that read nothing yet
  kafka.produce("orders", order_messages(0, 2000));
  wait_until([&] { return kafka.low_watermark("orders", 0) > 0; }, 120s, "retention to delete segments");
  kafka.set_topic_configs("orders", {{"retention.ms", "-1"}});  // what is left stays
  const int64_t low = kafka.low_watermark("orders", 0);
  kafka.produce("orders", order_messages(2000, 2100));
  ScratchDir dir("real");
  const auto calls = dir / "calls.log";
  const int admin = free_port();
  HostProcess host(
      dir, "host",
      base_config(kafka, db, "host-a", "g", "admin_listen = \"127.0.0.1:" + std::to_string(admin) + "\"\n") +
          route_config({"waybill", "orders", "scripted_idempotent.so", "", {{"log", "\"" + calls.string() + "\""}}}));
  wait_committed(kafka, "g", {{"orders", 1}}, host, 120s);
  const int64_t lost_from_log_start = kafka.low_watermark("orders", 0);  // retention may have moved on meanwhile
  BOOST_TEST(host.log().find("were deleted by retention before this group read them") != std::string::npos);
  const int64_t counted = admin_metric(
      admin, "idemsink_records_lost_to_retention_total{route=\"waybill\",topic=\"orders\",partition=\"0\"}");
  BOOST_TEST(counted >= low);
  BOOST_TEST(counted <= lost_from_log_start);
  expect_each_key_called_once(calls_per_hex_key(calls), static_cast<size_t>(2100 - counted));
  BOOST_TEST(host.stop() == 0);
  auto [rc, out] = audit(dir, host);
  BOOST_TEST(rc == 1, out);
  BOOST_TEST(out.find("LOST: deleted by retention before the group read them") != std::string::npos, out);
  BOOST_TEST(out.find(std::to_string(counted) + " lost to retention") != std::string::npos, out);
}
