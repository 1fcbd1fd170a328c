// A claim table made by an earlier version (two status indexes; claim rows
// written before the key directory existed, so without directory rows)
// brought to the current layout by `idemsink schema migrate` while claims
// run on it: no key claimed twice before, during or after, and the claim
// read through the directory alone only once the directory is complete.
#define BOOST_TEST_MODULE schema_migration
#include <boost/test/unit_test.hpp>

#include <time.h>

#include <atomic>
#include <set>
#include <thread>

#include "core/claim/claim_store.h"
#include "core/claim/schema.h"
#include "core/common/util.h"
#include "devkit/mariadb_server.h"
#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using claim::ClaimRead;
using claim::ClaimRequest;
using claim::ClaimStore;
using claim::Status;
using claim::Verdict;
using namespace std::chrono_literals;

namespace {

const auto kNow = std::chrono::system_clock::now();
// The month before this one: where the older version's claims are.
const std::string kLastMonth = claim::month_start(kNow, -1);

// The claim table as the version before this layout made it: the two status
// indexes this one merged, and the key directory (empty) and meta tables.
void create_older_claim_table(db::Connection& c) {
  std::string ddl = claim::claim_table(kNow, {90, 3});
  const std::string merged = "  KEY idx_status_owner (status, owner, updated_at),\n";
  const size_t at = ddl.find(merged);
  BOOST_REQUIRE(at != std::string::npos);
  ddl.replace(at, merged.size(),
              "  KEY idx_owner_status (owner, status),\n  KEY idx_status_updated (status, updated_at),\n");
  c.execute(ddl);
  c.execute(claim::key_directory_table());
  c.execute(claim::meta_table());
}

// Done claims of keys <prefix>0 .. <prefix>n-1 in `month`'s partition (last
// month's by default), as a version before the key directory wrote them: no
// directory rows.
void insert_claims_without_directory(db::Connection& c, const std::string& ns, const std::string& prefix, int n,
                                     const std::string& value, const std::string& month = kLastMonth) {
  std::string sql =
      "INSERT INTO idemsink_claim (namespace, biz_key, bucket, status, attempt, idem_token, owner, payload_hash, "
      "receipt, calls, src_topic, src_partition, src_offset, created_at, updated_at) VALUES ";
  for (int i = 0; i < n; ++i)
    sql += std::string(i ? ", (" : "(") + c.quote(ns) + ", " + c.quote(prefix + std::to_string(i)) + ", '" + month +
           "', " + std::to_string(static_cast<int>(Status::Done)) + ", 1, UUID(), 'old-host#1', " +
           db::Connection::hex(payload_hash(value)) + ", 'OLD-RECEIPT', 1, 'old-topic', 0, " + std::to_string(i) +
           ", NOW(3), NOW(3))";
  c.execute(sql);
}

std::set<std::string> claim_indexes(db::Connection& c) {
  std::set<std::string> out;
  for (auto& r : c.query("SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = "
                         "DATABASE() AND TABLE_NAME = 'idemsink_claim'"))
    out.insert(*r[0]);
  return out;
}

int64_t count(db::Connection& c, const std::string& sql) { return std::stoll(*c.query(sql).at(0).at(0)); }

// Keys with claim rows and no directory row.
int64_t keys_without_directory_row(db::Connection& c) {
  return count(c,
               "SELECT COUNT(*) FROM idemsink_claim c LEFT JOIN idemsink_claim_key k ON k.namespace = c.namespace AND "
               "k.biz_key = c.biz_key WHERE k.namespace IS NULL");
}

// Days of retention that keep last month's partition and drop the one before.
int retention_keeping_last_month() {
  std::tm tm{};
  strptime(kLastMonth.c_str(), "%Y-%m-%d", &tm);
  const auto first_of_last_month = std::chrono::system_clock::from_time_t(timegm(&tm));
  return static_cast<int>(std::chrono::duration_cast<std::chrono::hours>(kNow - first_of_last_month).count() / 24) - 1;
}

ClaimRequest request(const std::string& key) {
  ClaimRequest r;
  r.key = claim::RowKey{"waybill", key, claim::month_start(kNow, 0)};  // this month: not the old row's
  r.payload_hash = payload_hash("{}");
  r.src_topic = "orders";
  return r;
}

std::vector<ClaimRequest> requests(const std::string& prefix, int from, int to) {
  std::vector<ClaimRequest> out;
  for (int i = from; i < to; ++i) out.push_back(request(prefix + std::to_string(i)));
  return out;
}

}  // namespace

// The migration runs in small batches on one connection while a claimer on
// another claims old keys (each must be found done in last month, never
// claimed again in this one) and new keys, and marks the new ones done.
BOOST_AUTO_TEST_CASE(an_older_claim_table_is_migrated_while_claims_run) {
  const auto cfg = devkit::MariaDbServer::shared().fresh_database("migrate_online");
  db::Connection c(cfg);
  create_older_claim_table(c);
  insert_claims_without_directory(c, "waybill", "OLD-", 3000, "{}");

  // This version's schema step on the older table: columns and partitions
  // only; the directory is not known complete, so claims read every month.
  claim::apply_schema(c, kNow, {});
  BOOST_TEST(!claim::key_directory_complete(c));
  BOOST_TEST(claim_indexes(c).count("idx_owner_status") == 1u);

  ClaimStore store("host-a", "host-a#1", 30s);
  store.set_claim_read(ClaimRead::AllMonths);
  db::Connection claims(cfg);
  std::atomic<bool> migrating{true};
  std::atomic<int> old_found_done{0}, new_owned{0}, wrong{0};
  std::thread claimer([&] {
    for (int round = 0; migrating.load() || round < 3; ++round) {
      // Old keys, 100 a round, over and over.
      for (const auto& r : store.claim(claims, requests("OLD-", (round * 100) % 3000, (round * 100) % 3000 + 100))) {
        if (r.verdict == Verdict::Done && r.row.bucket == kLastMonth) {
          ++old_found_done;
        } else {
          ++wrong;
        }
      }
      // New keys, claimed and done.
      std::vector<claim::Outcome> done;
      for (const auto& r : store.claim(claims, requests("NEW-", round * 50, round * 50 + 50))) {
        if (r.verdict != Verdict::Owned) {
          ++wrong;
          continue;
        }
        ++new_owned;
        done.push_back(claim::Outcome{r.row, r.attempt, 1, 0, "R", ""});
      }
      for (bool ok : store.mark_done(claims, done))
        if (!ok) ++wrong;
    }
  });
  std::vector<std::string> steps;
  const auto report = claim::migrate_claim_schema(
      c, [&](const std::string& step) { steps.push_back(step); }, /*batch=*/100);
  migrating = false;
  claimer.join();

  BOOST_TEST(wrong.load() == 0);
  BOOST_TEST(old_found_done.load() > 0);
  BOOST_TEST(new_owned.load() > 0);
  BOOST_TEST(report.index_added);
  BOOST_TEST(report.indexes_dropped);
  BOOST_TEST(report.directory_completed);
  BOOST_TEST(report.directory_rows_added == 3000u);  // the old claims'; the new ones wrote their own
  BOOST_TEST((claim_indexes(c) == std::set<std::string>{"PRIMARY", "idx_status_owner", "idx_token"}));
  BOOST_TEST(claim::key_directory_complete(c));
  BOOST_TEST(keys_without_directory_row(c) == 0);
  BOOST_TEST(count(c, "SELECT COUNT(*) FROM idemsink_claim_key WHERE biz_key LIKE 'OLD-%' AND bucket = '" + kLastMonth +
                          "'") == 3000);

  // Through the directory alone now: every old key is found done where it
  // was, every new key done, and nothing new was written.
  const int64_t rows_before = count(c, "SELECT COUNT(*) FROM idemsink_claim");
  store.set_claim_read(ClaimRead::KeyDirectory);
  for (const auto& r : store.claim(claims, requests("OLD-", 0, 3000))) {
    BOOST_TEST((r.verdict == Verdict::Done));
    BOOST_TEST(r.row.bucket == kLastMonth);
    BOOST_TEST(r.receipt == "OLD-RECEIPT");
  }
  for (const auto& r : store.claim(claims, requests("NEW-", 0, new_owned.load())))
    BOOST_TEST((r.verdict == Verdict::Done));
  BOOST_TEST(count(c, "SELECT COUNT(*) FROM idemsink_claim") == rows_before);

  // Run again: nothing left to do.
  const auto again = claim::migrate_claim_schema(c, [](const std::string&) {});
  BOOST_TEST(!again.index_added);
  BOOST_TEST(!again.indexes_dropped);
  BOOST_TEST(!again.directory_completed);
}

// Two records of one key claimed at the same instant by a version before the
// directory left a row in each of two months. The directory names the
// newest: when retention drops the older month (deleting that month's
// directory rows first), the key still has its directory row and its newer
// row, so a later record of it is a duplicate, not a second effect.
BOOST_AUTO_TEST_CASE(a_key_with_rows_in_two_months_stays_guarded_when_the_older_month_goes) {
  const auto cfg = devkit::MariaDbServer::shared().fresh_database("migrate_two_months");
  db::Connection c(cfg);
  create_older_claim_table(c);
  const std::string two_months_ago = claim::month_start(kNow, -2);
  insert_claims_without_directory(c, "waybill", "TWO-", 20, "{}", two_months_ago);
  insert_claims_without_directory(c, "waybill", "TWO-", 20, "{}", kLastMonth);
  insert_claims_without_directory(c, "waybill", "GONE-", 20, "{}", two_months_ago);
  claim::apply_schema(c, kNow, {});
  claim::migrate_claim_schema(
      c, [](const std::string&) {}, /*batch=*/7);  // batches end inside a key's rows
  BOOST_TEST(count(c, "SELECT COUNT(*) FROM idemsink_claim_key WHERE biz_key LIKE 'TWO-%' AND bucket = '" + kLastMonth +
                          "'") == 20);
  BOOST_TEST(keys_without_directory_row(c) == 0);

  // Retention drops two months ago (its directory rows first), keeps last month.
  const auto report = claim::maintain_partitions(c, kNow, {retention_keeping_last_month(), 3});
  BOOST_TEST(report.dropped.size() >= 1u);
  BOOST_TEST(count(c, "SELECT COUNT(*) FROM idemsink_claim WHERE bucket = '" + two_months_ago + "'") == 0);

  ClaimStore store("host-a", "host-a#1", 30s);
  for (const auto& r : store.claim(c, requests("TWO-", 0, 20))) {
    BOOST_TEST((r.verdict == Verdict::Done));
    BOOST_TEST(r.row.bucket == kLastMonth);
  }
  // A key whose only row went with the month is claimed afresh: past
  // retention is past de-duplication, as always.
  for (const auto& r : store.claim(c, requests("GONE-", 0, 20))) BOOST_TEST((r.verdict == Verdict::Owned));
}

// A table this version makes is complete from the start, with the merged
// index; a directory-only read of a key whose row has no directory row
// would miss it, which is why an older table waits for the migration.
BOOST_AUTO_TEST_CASE(a_new_claim_table_reads_through_the_directory_from_the_first_record) {
  const auto cfg = devkit::MariaDbServer::shared().fresh_database("migrate_fresh");
  db::Connection c(cfg);
  claim::apply_schema(c, kNow, {});
  BOOST_TEST(claim::key_directory_complete(c));
  BOOST_TEST((claim_indexes(c) == std::set<std::string>{"PRIMARY", "idx_status_owner", "idx_token"}));
  claim::apply_schema(c, kNow, {});  // a second host starting: still complete
  BOOST_TEST(claim::key_directory_complete(c));
  const auto report = claim::migrate_claim_schema(c, [](const std::string&) {});
  BOOST_TEST(!report.index_added);
  BOOST_TEST(!report.directory_completed);
}

// End to end: a host on an older claim table, records duplicating the old
// claims (dated this month, the old claims last month), `idemsink schema
// migrate` run beside it, the host switching to the directory read on its
// own, the same records again and new ones. No old key is ever called, every
// new key once, every record accounted for.
BOOST_AUTO_TEST_CASE(a_running_host_is_migrated_under_it_and_claims_nothing_twice) {
  Scenario s("migrate_host");
  s.topic("orders", 4);
  {
    auto c = s.connect();
    create_older_claim_table(*c);
    insert_claims_without_directory(*c, "waybill", "OLD-", 500, "{}");
  }
  auto& host = s.host("m1", {s.scripted("waybill", "orders")});
  s.kafka.produce("orders", keyed_messages("OLD-", 0, 500));
  s.kafka.produce("orders", keyed_messages("NEW-", 0, 500));
  s.wait_committed(host);
  BOOST_TEST(host.log().find("made by an earlier version") != std::string::npos);

  const auto [rc, out] =
      run_cli(s.dir, "migrate", {"schema", "migrate", "--config", host.config_path().string()}, 300s);
  BOOST_TEST_REQUIRE(rc == 0, out);
  BOOST_TEST(out.find("key directory: complete, 500 rows added") != std::string::npos, out);
  wait_until([&] { return host.log().find("claim reads now look keys up there alone") != std::string::npos; }, 60s,
             "the host to switch to the directory read");

  s.kafka.produce("orders", keyed_messages("OLD-", 0, 500));
  s.kafka.produce("orders", keyed_messages("NEW-", 0, 500));
  s.kafka.produce("orders", keyed_messages("LATER-", 0, 500));
  s.wait_committed(host);

  const auto calls = s.calls_per_key();
  for (const auto& [key, n] : calls) BOOST_TEST(key.rfind("OLD-", 0) != 0, key << " called " << n << " time(s)");
  expect_each_key_called_once(calls, 1000);  // NEW- and LATER-, each once
  auto c = s.connect();
  BOOST_TEST(keys_without_directory_row(*c) == 0);
  BOOST_TEST(count(*c, "SELECT COUNT(*) FROM idemsink_claim") == 1500);
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}
