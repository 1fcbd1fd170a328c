// A host that runs for months: no bad row, no calendar, no database error
// wedges it. Each case asserts that offsets reach the end and that
// `idemsink audit` accounts for every record.
#define BOOST_TEST_MODULE longevity
#include <boost/test/unit_test.hpp>
#include <ctime>
#include <map>
#include <set>

#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace std::chrono_literals;

namespace {

std::string partition_of_month(int months_from_now) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  int idx = (tm.tm_year + 1900) * 12 + tm.tm_mon + months_from_now;
  char buf[16];
  std::snprintf(buf, sizeof buf, "p%04d%02d", idx / 12, idx % 12 + 1);
  return buf;
}

// Drops the partitions of this month and the three after it, as if the
// host had run past them (the newest partition is behind the calendar).
void drop_current_and_later_partitions(db::Connection& c) {
  std::string list;
  for (int m = 0; m <= 3; ++m) list += (m ? "," : "") + partition_of_month(m);
  c.execute("ALTER TABLE idemsink_claim DROP PARTITION " + list);
}

std::vector<TestMessage> keyed(const std::string& prefix, int n, int64_t timestamp_ms = 0) {
  std::vector<TestMessage> msgs;
  for (int i = 0; i < n; ++i)
    msgs.push_back({prefix + std::to_string(i), "{\"n\":" + std::to_string(i) + "}", {}, -1, timestamp_ms});
  return msgs;
}

}  // namespace

BOOST_AUTO_TEST_CASE(receipts_and_error_texts_are_made_to_fit_their_columns) {
  Scenario s("longevity_columns");
  s.topic("orders", 2).topic("orders.dlq", 1);
  auto msgs = keyed("o-", 40);
  for (auto& m : keyed("bigreceipt-", 5)) msgs.push_back(m);
  for (auto& m : keyed("badtext-", 5)) msgs.push_back(m);
  s.kafka.produce("orders", msgs);
  auto& host = s.host("host-a", {s.scripted("waybill", "orders")});
  s.wait_committed(host);
  auto conn = s.connect();
  BOOST_TEST(scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Done)) == 45);
  // A 5,000-byte receipt is stored cut, and says so.
  for (const auto& r : conn->query("SELECT receipt FROM idemsink_claim WHERE biz_key LIKE 'bigreceipt-%'")) {
    BOOST_TEST(r[0]->size() == 1024u);
    BOOST_TEST(r[0]->find("[receipt cut: 5000 bytes]") != std::string::npos);
  }
  // Error texts utf8mb4 refuses are stored with the bad bytes replaced.
  for (const auto& r : conn->query("SELECT status, last_error FROM idemsink_claim WHERE biz_key LIKE 'badtext-%'")) {
    BOOST_TEST(*r[0] == "3");
    BOOST_TEST(*r[1] == "bad ?? byte ???? and ??? end");
  }
  auto dlq = s.wait_records("orders.dlq", 5);
  BOOST_TEST(dlq.size() == 5u);
  for (const auto& m : dlq) BOOST_TEST(m.headers.at("idemsink.error") == "bad ?? byte ???? and ??? end");
  const std::string log = host.log();
  BOOST_TEST(log.find("will re-run it") == std::string::npos);
  BOOST_TEST(log.find("\xC0") == std::string::npos);  // no raw invalid bytes in the log
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}

// Twenty refused records of 900 KB in one poll: their DLQ copies are 36 MB
// of SQL as hex, more than the server's 16 MiB packet. Statements are sized
// by bytes, so they are written, published and committed.
BOOST_AUTO_TEST_CASE(large_refused_records_fit_statements_and_reach_the_dlq) {
  Scenario s("longevity_large");
  // Eight partitions: the embedded Kafka keeps only ~5 MB per partition.
  s.topic("orders", 8).topic("orders.dlq", 8);
  std::vector<TestMessage> msgs;
  for (int i = 0; i < 20; ++i)
    msgs.push_back({std::nullopt, std::string(900'000, static_cast<char>('a' + i)), {}, i % 8});
  s.kafka.produce("orders", msgs);
  auto& host =
      s.host("host-a", {s.scripted("waybill", "orders")}, {.producer_lines = "\"message.max.bytes\" = \"2000000\"\n"});
  s.wait_committed(host);
  // All twenty published (the embedded Kafka may drop the oldest of them
  // from a partition past ~5 MB: their acknowledgements are counted).
  wait_until(
      [&] {
        int64_t published = 0;
        for (const auto& [p, hi] : s.kafka.high_watermarks("orders.dlq", 8)) published += hi;
        return published == 20;
      },
      120s, "20 large records in the DLQ");
  auto conn = s.connect();
  wait_until(
      [&] {
        return scalar(*conn,
                      "SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE published_at IS NOT NULL AND "
                      "LENGTH(msg_value) = 900000") == 20;
      },
      60s, "20 outbox rows with their whole payload, stamped published");
  const auto dlq = s.kafka.read_all("orders.dlq", 8, 60000);
  BOOST_TEST(!dlq.empty());
  for (const auto& m : dlq) {
    BOOST_TEST(m.value->size() == 900'000u);
    BOOST_TEST(m.headers.at("idemsink.reason") == "missing_key");
  }
  BOOST_TEST(host.log().find("will re-run it") == std::string::npos);
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}

BOOST_AUTO_TEST_CASE(claim_partitions_running_out_are_created_on_the_spot) {
  Scenario s("longevity_partitions_on");
  s.topic("orders", 2);
  // Records of two months ago: their claims are in a partition the calendar
  // keeps, so the audit still finds them after the current ones are gone.
  const int64_t two_months_ago =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count() -
      int64_t{62} * 86'400'000;
  s.kafka.produce("orders", keyed("before-", 20, two_months_ago));
  auto& host = s.host("host-a", {s.scripted("waybill", "orders")});
  s.wait_committed(host);
  auto conn = s.connect();
  drop_current_and_later_partitions(*conn);
  s.kafka.produce("orders", keyed("after-", 20));
  s.wait_committed(host);
  BOOST_TEST(scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE biz_key LIKE 'after-%' AND " +
                               sql_status_is(claim::Status::Done)) == 20);
  BOOST_TEST(host.log().find("creating the partitions now") != std::string::npos);
  BOOST_TEST(host.log().find("claim partitions: added " + partition_of_month(0)) != std::string::npos);
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}

BOOST_AUTO_TEST_CASE(without_schema_changes_a_record_with_no_claim_partition_is_refused_loudly) {
  Scenario s("longevity_partitions_off");
  s.topic("orders", 1).topic("orders.dlq", 1);
  const std::vector<RouteSpec> routes{s.scripted("waybill", "orders")};
  const Scenario::HostOptions no_schema{.claim_lines = "apply_schema = false\n"};
  write_file(s.dir / "schema.toml", s.config("host-a", routes, no_schema));
  auto [rc, out] = run_cli(s.dir, "schema", {"schema", "apply", "--config", (s.dir / "schema.toml").string()});
  BOOST_REQUIRE_MESSAGE(rc == 0, out);
  drop_current_and_later_partitions(*s.connect());
  s.kafka.produce("orders", keyed("o-", 5));
  auto& host = s.host("host-a", routes, no_schema);
  s.wait_committed(host);
  auto dlq = s.wait_records("orders.dlq", 5);
  BOOST_TEST(dlq.size() == 5u);
  for (const auto& m : dlq) BOOST_TEST(m.headers.at("idemsink.reason") == "no_claim_partition");
  BOOST_TEST(host.log().find("no claim partition for") != std::string::npos);
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}

// 600 DLQ rows Kafka refuses for good (the DLQ topic is not authorised) are
// set aside; a dead record of another route is published within seconds.
BOOST_AUTO_TEST_CASE(unpublishable_dlq_rows_are_set_aside_and_later_rows_flow,
                     *boost::unit_test::precondition(mock_only)) {
  Scenario s("longevity_unpublishable");
  for (const std::string t : {"bad", "bad.dlq", "good", "good.dlq"}) s.topic(t, 1);
  s.kafka.command("topic_error bad.dlq TOPIC_AUTHORIZATION_FAILED");
  std::vector<TestMessage> poison(600, TestMessage{std::nullopt, "no key"});
  s.kafka.produce("bad", poison);
  auto& host = s.host("host-a", {s.scripted("bad", "bad"), s.scripted("good", "good")});
  s.wait_committed(host, {"bad"});
  auto conn = s.connect();
  wait_until(
      [&] {
        return scalar(*conn, "SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE unpublishable_at IS NOT NULL") == 600;
      },
      120s, "600 rows set aside");
  const auto t0 = std::chrono::steady_clock::now();
  s.kafka.produce("good", {{std::nullopt, "no key either"}});
  wait_until([&] { return s.kafka.read_all("good.dlq", 1).size() == 1; }, 30s,
             "the good route's dead record published");
  BOOST_TEST_MESSAGE(
      "published "
      << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count()
      << "ms after it was produced, behind 600 unpublishable rows");
  BOOST_TEST(host.log().find("can never be published") != std::string::npos);

  auto [rc, listing] = run_cli(s.dir, "dlq-list", {"dlq", "--config", host.config_path().string()});
  BOOST_TEST(rc == 1);
  BOOST_TEST(listing.find("600 outbox row(s) Kafka refused for good") != std::string::npos, listing);
  // The operator fixes the topic's permissions, retries one row and discards another.
  s.kafka.command("topic_error bad.dlq NO_ERROR");
  const auto ids =
      conn->query("SELECT id FROM idemsink_dlq_outbox WHERE unpublishable_at IS NOT NULL ORDER BY id LIMIT 2");
  BOOST_TEST(
      run_cli(s.dir, "dlq-retry", {"dlq", "--config", host.config_path().string(), "--retry", *ids[0][0]}).first == 0);
  BOOST_TEST(run_cli(s.dir, "dlq-discard",
                     {"dlq", "--config", host.config_path().string(), "--discard", *ids[1][0], "--note", "test"})
                 .first == 0);
  wait_until([&] { return s.kafka.read_all("bad.dlq", 1).size() == 1; }, 30s, "the retried row published");
  BOOST_TEST(scalar(*conn,
                    "SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE unpublishable_at IS NOT NULL AND "
                    "published_at IS NULL") == 598);
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}

// The connection drops right after a claim INSERT committed: the job is
// re-run and must recognise its own rows: no takeover, no unknown.
BOOST_AUTO_TEST_CASE(a_claim_job_rerun_after_a_lost_connection_recognises_its_own_rows) {
  Scenario s("longevity_rerun");
  s.topic("sms", 2);
  s.kafka.produce("sms", keyed("s-", 300));
  auto& host = s.host("host-a", {s.scripted("sms", "sms", "", "scripted_at_most_once.so")},
                      {.env = {{"IDEMSINK_FAULT", "lost_connection_after_claim_write:1"}}});
  s.wait_committed(host);
  BOOST_TEST(host.log().find("fault lost_connection_after_claim_write") != std::string::npos);
  auto conn = s.connect();
  BOOST_TEST(scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Done)) == 300);
  BOOST_TEST(scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Unknown)) == 0);
  BOOST_TEST(scalar(*conn, "SELECT SUM(takeovers) FROM idemsink_claim") == 0);
  const auto sent = s.calls_per_key();
  BOOST_TEST(sent.size() == 300u);
  for (const auto& [key, n] : sent) BOOST_TEST(n == 1, key);
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}

// The database refuses one row of a batch (a trigger stands in for a column
// that cannot take the value): the batch is split until that row is alone,
// the others are marked done, and the one ends dead with reason db_rejected.
BOOST_AUTO_TEST_CASE(a_row_the_database_refuses_is_isolated_and_dead_lettered) {
  Scenario s("longevity_rejected");
  s.topic("orders", 1).topic("orders.dlq", 1);
  auto& host = s.host("host-a", {with_delay(s.scripted("waybill", "orders"), "20ms")});
  auto conn = s.connect();
  wait_until([&] { return !conn->query("SHOW TABLES LIKE 'idemsink_claim'").empty(); }, 60s, "the schema");
  conn->execute(
      "CREATE TRIGGER refuse_poison BEFORE UPDATE ON idemsink_claim FOR EACH ROW BEGIN IF NEW.biz_key = 'poison' AND " +
      sql_status_is(claim::Status::Done, "NEW.") +
      " THEN SIGNAL SQLSTATE '22001' SET MYSQL_ERRNO = 1406, MESSAGE_TEXT = 'Data too long for column "
      "receipt'; END IF; END");
  auto msgs = keyed("o-", 30);
  msgs.insert(msgs.begin() + 15, TestMessage{"poison", "{}"});
  s.kafka.produce("orders", msgs);
  s.wait_committed(host);
  BOOST_TEST(scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Done)) == 30);
  // The effect happened but could not be recorded done: unknown, for reconciliation.
  BOOST_TEST(*conn->query("SELECT status FROM idemsink_claim WHERE biz_key = 'poison'")[0][0] == "4");
  auto dlq = s.wait_records("orders.dlq", 1);
  BOOST_REQUIRE(dlq.size() == 1u);
  BOOST_TEST(dlq[0].headers.at("idemsink.reason") == "db_rejected");
  BOOST_TEST(dlq[0].headers.at("idemsink.db_error").find("1406") != std::string::npos);
  BOOST_TEST(host.log().find("will re-run it") == std::string::npos);
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}
