// The claim state machine against a real MariaDB: every transition, the
// fencing of zombies, binary keys, statements per batch, races between
// hosts, partition maintenance, and surviving a database restart.
#define BOOST_TEST_MODULE claim_store
#include <boost/test/unit_test.hpp>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "core/claim/claim_store.h"
#include "core/dlq/outbox.h"
#include "core/claim/schema.h"
#include "core/common/fault.h"
#include "core/db/pool.h"
#include "devkit/mariadb_server.h"

using namespace idemsink;
using claim::ClaimRequest;
using claim::ClaimStore;
using claim::Status;
using claim::Verdict;
using namespace std::chrono_literals;

namespace {

constexpr int64_t kNov2026 = 1794000000000LL;  // 2026-11-06

struct Db {
  config::DatabaseConfig cfg;
  std::unique_ptr<db::Connection> conn;
  explicit Db(const std::string& name) : cfg(devkit::MariaDbServer::shared().fresh_database(name)) {
    conn = std::make_unique<db::Connection>(cfg);
    claim::apply_schema(*conn, std::chrono::system_clock::now(), {});
    conn->execute(dlq::Outbox::schema());
  }
  int64_t scalar(const std::string& sql) { return std::stoll(*conn->query(sql).at(0).at(0)); }
  /// A counter of this connection's session (e.g. 'QUESTIONS', 'Com_update').
  int64_t session_status(const std::string& variable) {
    return scalar("SELECT VARIABLE_VALUE FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME = '" + variable +
                  "'");
  }
  /// The leases of the claims `where` selects (all without it) ran out a
  /// second ago: their owners stalled or vanished.
  void expire_leases(const std::string& where = "") {
    conn->execute("UPDATE idemsink_claim SET lease_until = NOW(3) - INTERVAL 1 SECOND" +
                  (where.empty() ? "" : " WHERE " + where));
  }
};

ClaimRequest req(const std::string& key, const std::string& payload = "p", int64_t ts = kNov2026,
                 const std::string& ns = "waybill") {
  ClaimRequest r;
  r.key = claim::RowKey{ns, key, claim::bucket_of(ts)};
  r.payload_hash = payload_hash(payload);
  r.src_topic = "orders";
  r.src_partition = 3;
  r.src_offset = 42;
  return r;
}

claim::Outcome outcome(const claim::ClaimResult& r, std::string receipt = "R") {
  return claim::Outcome{r.row, r.attempt, 1, 0, std::move(receipt), "boom"};
}

// A waybill record of "orders" at `src_offset` that host-a sets aside for the
// DLQ as `reason`, having failed in November 2026.
dlq::Letter letter(const std::string& reason, int64_t src_offset) {
  dlq::Letter d;
  d.route = "waybill";
  d.topic = "orders.dlq";
  d.reason = reason;
  d.src_topic = "orders";
  d.src_offset = src_offset;
  d.first_failure_ms = d.last_failure_ms = kNov2026;
  d.host = "host-a";
  return d;
}

}  // namespace

BOOST_AUTO_TEST_CASE(fresh_keys_are_claimed_with_a_committed_token) {
  Db db("claim_fresh");
  ClaimStore a("host-a", "host-a#1", 30s);
  std::vector<ClaimRequest> reqs{req("k1"), req("k2"), req("k3")};
  auto res = a.claim(*db.conn, reqs);
  std::set<std::string> tokens;
  for (const auto& r : res) {
    BOOST_TEST((r.verdict == Verdict::Owned));
    BOOST_TEST(r.attempt == 1u);
    BOOST_TEST(r.idem_token.size() == 36u);
    BOOST_TEST(!r.taken_over);
    tokens.insert(r.idem_token);
  }
  BOOST_TEST(tokens.size() == 3u);
  // The token is durable before any handler call: a fresh connection sees it.
  db::Connection other(db.cfg);
  auto rows = other.query("SELECT idem_token, status, owner FROM idemsink_claim WHERE biz_key = X'6B31'");
  BOOST_REQUIRE(rows.size() == 1u);
  BOOST_TEST(*rows[0][0] == res[0].idem_token);
  BOOST_TEST(*rows[0][1] == "1");
  BOOST_TEST(*rows[0][2] == "host-a#1");
}

BOOST_AUTO_TEST_CASE(done_is_terminal_and_a_redelivery_is_a_duplicate_with_its_receipt) {
  Db db("claim_done");
  ClaimStore a("host-a", "host-a#1", 30s);
  auto res = a.claim(*db.conn, std::vector{req("k")});
  auto ok = a.mark_done(*db.conn, std::vector{outcome(res[0], "WB-1")});
  BOOST_TEST(ok[0]);
  auto again = a.claim(*db.conn, std::vector{req("k")});
  BOOST_TEST((again[0].verdict == Verdict::Done));
  BOOST_TEST(again[0].receipt == "WB-1");
  BOOST_TEST(again[0].idem_token == res[0].idem_token);
  // Terminal rows never change: not to failed, not to done again.
  BOOST_TEST(!a.mark_terminal(*db.conn, Status::Failed, std::vector{outcome(res[0])})[0]);
  BOOST_TEST(db.scalar("SELECT status FROM idemsink_claim") == 2);
}

BOOST_AUTO_TEST_CASE(another_live_owner_makes_the_key_busy) {
  Db db("claim_busy");
  ClaimStore a("host-a", "host-a#1", 30s), b("host-b", "host-b#1", 30s);
  a.claim(*db.conn, std::vector{req("k")});
  auto res = b.claim(*db.conn, std::vector{req("k")});
  BOOST_TEST((res[0].verdict == Verdict::Busy));  // waited for, never skipped
}

BOOST_AUTO_TEST_CASE(expired_lease_is_taken_over_with_the_same_token_and_the_zombie_is_fenced) {
  Db db("claim_takeover");
  ClaimStore a("host-a", "host-a#1", 30s), b("host-b", "host-b#1", 30s);
  auto first = a.claim(*db.conn, std::vector{req("k")});
  db.expire_leases();  // A stalls past its lease
  auto second = b.claim(*db.conn, std::vector{req("k")});
  BOOST_TEST((second[0].verdict == Verdict::Owned));
  BOOST_TEST(second[0].taken_over);
  BOOST_TEST(second[0].previous_owner_vanished);
  BOOST_TEST(second[0].attempt == 2u);
  BOOST_TEST(second[0].idem_token == first[0].idem_token);  // the remote de-duplicates the retry
  BOOST_TEST(second[0].takeovers == 1u);
  // The zombie wakes up and tries to finish with its old epoch: refused.
  BOOST_TEST(!a.mark_done(*db.conn, std::vector{outcome(first[0], "zombie")})[0]);
  BOOST_TEST(b.mark_done(*db.conn, std::vector{outcome(second[0], "WB-2")})[0]);
  BOOST_TEST(*db.conn->query("SELECT receipt FROM idemsink_claim")[0][0] == "WB-2");
}

// The fence of a local_tx batch that did not lock its claims first: all
// still ours and pending, or nothing. A claim taken over since, or one an
// earlier run of the same job already marked done (its reply lost), makes
// it refuse, where mark_done reports the latter as ours.
BOOST_AUTO_TEST_CASE(mark_all_done_changes_every_claim_or_reports_that_it_cannot) {
  Db db("claim_mark_all");
  ClaimStore a("host-a", "host-a#1", 30s), b("host-b", "host-b#1", 30s);
  auto mine = a.claim(*db.conn, std::vector{req("k1"), req("k2"), req("k3")});
  std::vector<claim::Outcome> first{outcome(mine[0]), outcome(mine[1])};
  BOOST_TEST(a.mark_all_done(*db.conn, first));
  BOOST_TEST(db.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE " + claim::sql_status_is(Status::Done)) == 2);
  // Run again (a job whose commit's reply was lost): done already, refused.
  BOOST_TEST(!a.mark_all_done(*db.conn, first));
  BOOST_TEST(a.mark_done(*db.conn, first)[0]);
  // k3 taken over by B while A was applying: A's batch with it is refused.
  db.expire_leases("biz_key = 'k3'");
  auto theirs = b.claim(*db.conn, std::vector{req("k3")});
  BOOST_TEST((theirs[0].verdict == Verdict::Owned));
  BOOST_TEST(!a.mark_all_done(*db.conn, std::vector{outcome(mine[2])}));
  BOOST_TEST(b.mark_all_done(*db.conn, std::vector{outcome(theirs[0])}));
  BOOST_TEST(a.mark_all_done(*db.conn, std::vector<claim::Outcome>{}));
}

BOOST_AUTO_TEST_CASE(a_restarted_host_takes_over_its_own_claims_at_once) {
  Db db("claim_restart");
  ClaimStore run1("host-a", "host-a#run1", 30s), run2("host-a", "host-a#run2", 30s), other("host-b", "host-b#1", 30s);
  auto first = run1.claim(*db.conn, std::vector{req("k")});
  BOOST_TEST((other.claim(*db.conn, std::vector{req("k")})[0].verdict == Verdict::Busy));
  auto res = run2.claim(*db.conn, std::vector{req("k")});  // lease still valid, but it is our own dead run
  BOOST_TEST((res[0].verdict == Verdict::Owned));
  BOOST_TEST(res[0].attempt == 2u);
  BOOST_TEST(res[0].idem_token == first[0].idem_token);
}

BOOST_AUTO_TEST_CASE(released_claims_pass_on_without_counting_as_a_vanished_owner) {
  Db db("claim_release");
  ClaimStore a("host-a", "host-a#1", 30s), b("host-b", "host-b#1", 30s);
  auto first = a.claim(*db.conn, std::vector{req("k")});
  a.release(*db.conn, std::vector{outcome(first[0])});
  auto res = b.claim(*db.conn, std::vector{req("k")});
  BOOST_TEST((res[0].verdict == Verdict::Owned));
  BOOST_TEST(!res[0].previous_owner_vanished);  // safe even for an at-most-once handler
  BOOST_TEST(res[0].takeovers == 0u);
}

BOOST_AUTO_TEST_CASE(the_call_mark_confirms_the_claim_and_outlives_a_release) {
  Db db("claim_call_mark");
  ClaimStore a("host-a", "host-a#1", 30s), b("host-b", "host-b#1", 30s);
  auto first = a.claim(*db.conn, std::vector{req("sent"), req("retried"), req("never")});
  // One statement for the wave; each claim confirmed before its call.
  const auto before = db.session_status("Com_update");
  auto marked = a.confirm_calls(*db.conn, std::vector{outcome(first[0]), outcome(first[1])}, true);
  BOOST_TEST((marked == std::vector<bool>{true, true}));
  BOOST_TEST(db.session_status("Com_update") == before + 1);
  BOOST_TEST(db.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE call_started IS NOT NULL") == 2);

  // "sent" is released while its call may be out (a revocation during the
  // takeover that followed a crash): no certain calls, so the mark stays.
  a.release(*db.conn, std::vector{claim::Outcome{first[0].row, first[0].attempt, 0, 0, {}, {}}});
  // "retried" is released after a call that certainly did not apply.
  a.release(*db.conn, std::vector{claim::Outcome{first[1].row, first[1].attempt, 1, 0, {}, {}}});
  // "never" was claimed and never called; its owner vanishes.
  db.expire_leases("owner IS NOT NULL");

  auto second = b.claim(*db.conn, std::vector{req("sent"), req("retried"), req("never")});
  for (const auto& r : second) BOOST_TEST((r.verdict == Verdict::Owned));
  BOOST_TEST(second[0].maybe_called);  // never called again by anyone
  BOOST_TEST(!second[0].previous_owner_vanished);
  BOOST_TEST(!second[1].maybe_called);
  BOOST_TEST(!second[2].maybe_called);  // certainly never sent: may be called
  BOOST_TEST(second[2].previous_owner_vanished);

  // The old owner cannot confirm (nor call) any more; the new one can.
  BOOST_TEST((a.confirm_calls(*db.conn, std::vector{outcome(first[2])}, true) == std::vector<bool>{false}));
  BOOST_TEST((b.confirm_calls(*db.conn, std::vector{outcome(second[2]), outcome(first[2])}, false) ==
              std::vector<bool>{true, false}));
  BOOST_TEST(db.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE biz_key = 'never' AND call_started IS NULL") == 1);
}

BOOST_AUTO_TEST_CASE(unknown_claims_are_reconciled_only_once_their_call_is_old_enough) {
  Db db("claim_reconcile_after");
  ClaimStore a("host-a", "host-a#1", 30s);
  auto first = a.claim(*db.conn, std::vector{req("k")});
  a.confirm_calls(*db.conn, std::vector{outcome(first[0])}, true);
  a.mark_terminal(*db.conn, Status::Unknown, std::vector{outcome(first[0])});
  const std::vector<ClaimStore::Namespace> waybill{{"waybill", 60s}};
  auto listed = [&] { return a.unsettled(*db.conn, waybill, 10min, 10, false).size(); };
  BOOST_TEST(listed() == 0u);                                           // the call began just now: it may still land
  BOOST_TEST(a.unsettled(*db.conn, {}, 10min, 10, true).size() == 1u);  // the operator's list shows it at once
  db.conn->execute("UPDATE idemsink_claim SET call_started = NOW(3) - INTERVAL 61 SECOND");
  BOOST_TEST(listed() == 1u);

  // A re-drive is a new call: the row waits again, whatever it answers.
  BOOST_TEST(a.take_for_redrive(*db.conn, first[0].row, first[0].attempt, 30s));
  BOOST_TEST(listed() == 0u);
  BOOST_TEST(a.record_redrive(*db.conn, first[0].row, first[0].attempt + 1, 2, ClaimStore::RedriveResult::Undecided,
                              "timeout"));
  BOOST_TEST(listed() == 0u);
  db.conn->execute("UPDATE idemsink_claim SET call_started = NOW(3) - INTERVAL 61 SECOND");
  BOOST_TEST(listed() == 1u);
}

BOOST_AUTO_TEST_CASE(same_key_with_another_payload_is_a_conflict_not_a_hit) {
  Db db("claim_conflict");
  ClaimStore a("host-a", "host-a#1", 30s);
  auto res = a.claim(*db.conn, std::vector{req("k", "amount=10")});
  a.mark_done(*db.conn, std::vector{outcome(res[0])});
  BOOST_TEST((a.claim(*db.conn, std::vector{req("k", "amount=99")})[0].verdict == Verdict::Conflict));
  auto unchecked = req("k", "amount=99");
  unchecked.check_payload = false;
  BOOST_TEST((a.claim(*db.conn, std::vector{unchecked})[0].verdict == Verdict::Done));
}

BOOST_AUTO_TEST_CASE(failed_and_unknown_are_terminal_and_fenced) {
  Db db("claim_terminal");
  ClaimStore a("host-a", "host-a#1", 30s);
  auto res = a.claim(*db.conn, std::vector{req("f"), req("u")});
  BOOST_TEST(a.mark_terminal(*db.conn, Status::Failed, std::vector{outcome(res[0])})[0]);
  BOOST_TEST(a.mark_terminal(*db.conn, Status::Unknown, std::vector{outcome(res[1])})[0]);
  auto again = a.claim(*db.conn, std::vector{req("f"), req("u")});
  BOOST_TEST((again[0].verdict == Verdict::Terminal));
  BOOST_TEST((again[1].verdict == Verdict::Terminal));
  BOOST_TEST((again[1].status == Status::Unknown));
  BOOST_TEST(*db.conn->query("SELECT last_error FROM idemsink_claim WHERE biz_key = X'66'")[0][0] == "boom");
}

BOOST_AUTO_TEST_CASE(binary_and_multibyte_keys_round_trip_exactly) {
  Db db("claim_binary");
  ClaimStore a("host-a", "host-a#1", 30s);
  const std::vector<std::string> keys{"it's",
                                      "back\\slash",
                                      std::string("nul\0byte", 8),
                                      "订单-20261129-007",
                                      "\"; DROP TABLE idemsink_claim; --",
                                      std::string(255, '\xff'),
                                      "trailing space ",
                                      "emoji-🚚"};
  std::vector<ClaimRequest> reqs;
  for (const auto& k : keys) reqs.push_back(req(k));
  auto res = a.claim(*db.conn, reqs);
  for (const auto& r : res) BOOST_TEST((r.verdict == Verdict::Owned));
  for (size_t i = 0; i < keys.size(); ++i) BOOST_TEST(res[i].row.biz_key == keys[i]);
  // Read back the raw bytes, and claim again: every key meets its own row.
  std::set<std::string> stored;
  for (auto& row : db.conn->query("SELECT biz_key FROM idemsink_claim")) stored.insert(*row[0]);
  BOOST_TEST(stored == std::set<std::string>(keys.begin(), keys.end()));
  std::vector<claim::Outcome> outs;
  for (const auto& r : res) outs.push_back(outcome(r));
  a.mark_done(*db.conn, outs);
  for (const auto& r : a.claim(*db.conn, reqs)) BOOST_TEST((r.verdict == Verdict::Done));
  BOOST_TEST(db.scalar("SELECT COUNT(*) FROM idemsink_claim") == static_cast<int64_t>(keys.size()));
}

BOOST_AUTO_TEST_CASE(a_200_record_batch_takes_a_handful_of_statements) {
  Db db("claim_statements");
  ClaimStore a("host-a", "host-a#1", 30s);
  std::vector<ClaimRequest> reqs;
  for (int i = 0; i < 200; ++i) reqs.push_back(req("order-" + std::to_string(i)));
  auto questions = [&] { return db.session_status("QUESTIONS"); };
  int64_t q0 = questions();
  uint64_t sent = db.conn->statements_sent();
  // read, then in one transaction the key directory's insert and the claim rows' insert
  auto res = a.claim(*db.conn, reqs);
  BOOST_TEST(db.conn->statements_sent() - sent == 5u);
  int64_t q1 = questions();
  BOOST_TEST(q1 - q0 - 1 == 5);  // the server agrees (minus the SELECT of the counter itself)
  std::vector<claim::Outcome> outs;
  for (const auto& r : res) outs.push_back(outcome(r));
  sent = db.conn->statements_sent();
  a.mark_done(*db.conn, outs);
  BOOST_TEST(db.conn->statements_sent() - sent == 1u);
  sent = db.conn->statements_sent();
  for (const auto& r : a.claim(*db.conn, reqs)) BOOST_TEST((r.verdict == Verdict::Done));  // a redelivered batch
  BOOST_TEST(db.conn->statements_sent() - sent == 1u);
  // A whole redelivered batch after a crash: read + one takeover UPDATE + one re-read.
  ClaimStore restarted("host-a", "host-a#2", 30s);
  std::vector<ClaimRequest> fresh;
  for (int i = 0; i < 200; ++i) fresh.push_back(req("crash-" + std::to_string(i)));
  a.claim(*db.conn, fresh);
  sent = db.conn->statements_sent();
  for (const auto& r : restarted.claim(*db.conn, fresh)) BOOST_TEST((r.verdict == Verdict::Owned));
  BOOST_TEST(db.conn->statements_sent() - sent == 3u);
}

BOOST_AUTO_TEST_CASE(racing_hosts_never_both_own_a_key) {
  Db db("claim_race");
  std::vector<ClaimRequest> reqs;
  for (int i = 0; i < 300; ++i) reqs.push_back(req("race-" + std::to_string(i)));
  std::vector<claim::ClaimResult> ra, rb;
  std::atomic<int> ready{0};
  auto run = [&](const std::string& host, std::vector<claim::ClaimResult>& out) {
    db::Connection c(db.cfg);
    ClaimStore s(host, host + "#1", 30s);
    ready.fetch_add(1);
    while (ready.load() < 2) {
    }
    out = s.claim(c, reqs);
  };
  std::thread ta(run, "host-a", std::ref(ra)), tb(run, "host-b", std::ref(rb));
  ta.join();
  tb.join();
  int owned = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const bool a_owns = ra[i].verdict == Verdict::Owned, b_owns = rb[i].verdict == Verdict::Owned;
    BOOST_TEST(!(a_owns && b_owns), "both hosts own " << i);
    BOOST_TEST((a_owns || b_owns), "nobody owns " << i);
    owned += a_owns + b_owns;
  }
  BOOST_TEST(owned == 300);
  BOOST_TEST(db.scalar("SELECT COUNT(*) FROM idemsink_claim") == 300);
}

BOOST_AUTO_TEST_CASE(a_redelivery_meets_its_row_across_a_month_end) {
  Db db("claim_buckets");
  ClaimStore a("host-a", "host-a#1", 30s);
  const int64_t nov30 = 1796083199000LL, dec1 = 1796083260000LL;
  auto res = a.claim(*db.conn, std::vector{req("k", "p", nov30)});
  a.mark_done(*db.conn, std::vector{outcome(res[0])});
  // Same record redelivered: same timestamp, same bucket.
  BOOST_TEST((a.claim(*db.conn, std::vector{req("k", "p", nov30)})[0].verdict == Verdict::Done));
  // A second publication of the same business event in December: the November row governs.
  auto dec = a.claim(*db.conn, std::vector{req("k", "p", dec1)});
  BOOST_TEST((dec[0].verdict == Verdict::Done));
  BOOST_TEST(dec[0].row.bucket == "2026-11-01");
  BOOST_TEST(db.scalar("SELECT COUNT(*) FROM idemsink_claim") == 1);
}

// Two records of one biz_key dated on either side of a month end (a re-send
// under another Kafka key), claimed at the same instant by two hosts: both
// read nothing, both insert, each into its own month's partition. The key
// directory lets only one of them win.
BOOST_AUTO_TEST_CASE(two_hosts_never_both_claim_a_key_across_a_month_end) {
  Db db("claim_month_race");
  const int64_t nov30 = 1796083199000LL, dec1 = 1796083260000LL;
  std::mutex mu;
  std::condition_variable cv;
  int read_done = 0;
  // Each claim waits, after its read found nothing, until the other's read
  // is done too: the race, every time.
  fault::set_sync_point("claim_store.after_read", [&] {
    std::unique_lock lk(mu);
    ++read_done;
    cv.notify_all();
    cv.wait_for(lk, 5s, [&] { return read_done >= 2; });
  });
  std::vector<claim::ClaimResult> ra, rb;
  auto run = [&](const std::string& host, int64_t ts, std::vector<claim::ClaimResult>& out) {
    db::Connection c(db.cfg);
    ClaimStore s(host, host + "#1", 30s);
    out = s.claim(c, std::vector{req("order-7", "p", ts)});
  };
  std::thread ta(run, "host-a", nov30, std::ref(ra)), tb(run, "host-b", dec1, std::ref(rb));
  ta.join();
  tb.join();
  fault::set_sync_point("claim_store.after_read", nullptr);
  BOOST_REQUIRE(read_done == 2);
  const bool a_owns = ra[0].verdict == Verdict::Owned, b_owns = rb[0].verdict == Verdict::Owned;
  BOOST_TEST(a_owns != b_owns, "owned by a: " << a_owns << ", by b: " << b_owns);
  BOOST_TEST(db.scalar("SELECT COUNT(*) FROM idemsink_claim") == 1);
  BOOST_TEST(db.scalar("SELECT COUNT(*) FROM idemsink_claim_key") == 1);
  // The loser waits for the winner (busy), and later meets its row: one token.
  BOOST_TEST(((a_owns ? rb[0] : ra[0]).verdict == Verdict::Busy));
  const auto& winner = a_owns ? ra[0] : rb[0];
  ClaimStore restarted(a_owns ? "host-a" : "host-b", a_owns ? "host-a#2" : "host-b#2", 30s);
  const auto again = restarted.claim(*db.conn, std::vector{req("order-7", "p", a_owns ? dec1 : nov30)});
  BOOST_TEST((again[0].verdict == Verdict::Owned));
  BOOST_TEST(again[0].idem_token == winner.idem_token);
  BOOST_TEST(again[0].row.bucket == winner.row.bucket);
}

// A month dropped by hand (or by an older version) leaves directory rows
// without their claims: they guard nothing and must not make the key busy
// for ever.
BOOST_AUTO_TEST_CASE(a_directory_row_whose_month_is_gone_gives_way) {
  Db db("claim_stale_directory");
  ClaimStore a("host-a", "host-a#1", 30s);
  db.conn->execute("INSERT INTO idemsink_claim_key VALUES ('waybill', 'gone', DATE'2020-01-01')");
  BOOST_TEST((a.claim(*db.conn, std::vector{req("gone")})[0].verdict == Verdict::Busy));
  BOOST_TEST(db.scalar("SELECT COUNT(*) FROM idemsink_claim_key WHERE biz_key = 'gone'") == 0);
  BOOST_TEST((a.claim(*db.conn, std::vector{req("gone")})[0].verdict == Verdict::Owned));
  BOOST_TEST(db.scalar("SELECT COUNT(*) FROM idemsink_claim_key WHERE biz_key = 'gone' AND bucket = '2026-11-01'") ==
             1);
}

// unknown -> reconciliation (or an operator) says it was never sent ->
// failed -> replay: the re-opened claim must be called, not parked again as
// "may have been sent" by the uncertain calls of its first life.
BOOST_AUTO_TEST_CASE(a_replayed_claim_settled_failed_from_unknown_is_called_again) {
  Db db("claim_replay_unknown");
  ClaimStore a("host-a", "host-a#1", 30s);
  auto first = a.claim(*db.conn, std::vector{req("sms-1")});
  a.confirm_calls(*db.conn, std::vector{outcome(first[0])}, true);  // the call mark, then a timeout
  BOOST_TEST(a.mark_terminal(*db.conn, Status::Unknown,
                             std::vector{claim::Outcome{first[0].row, first[0].attempt, 1, 1, {}, "timeout"}})[0]);
  BOOST_TEST(a.resolve_by_operator(*db.conn, first[0].idem_token, Status::Failed, "gateway: never sent").resolved);
  BOOST_TEST(a.reopen_failed(*db.conn, first[0].row, first[0].idem_token, "replayed"));
  ClaimStore b("host-b", "host-b#1", 30s);
  auto again = b.claim(*db.conn, std::vector{req("sms-1")});
  BOOST_TEST((again[0].verdict == Verdict::Owned));
  BOOST_TEST(again[0].idem_token == first[0].idem_token);
  BOOST_TEST(again[0].uncertain_calls == 0u);
  BOOST_TEST(!again[0].maybe_called);
}

// An operator's resolve must not race the reconciler's re-drive: resolving
// "failed" while the re-drive is sending would record an applied effect as
// never having happened (a replay then sends it again), "done" while it is
// rejected the mirror. The re-drive's lease refuses it, naming the re-drive.
BOOST_AUTO_TEST_CASE(an_operator_cannot_resolve_a_claim_being_re_driven) {
  Db db("claim_resolve_redrive");
  ClaimStore a("host-a", "host-a#1", 30s);
  auto first = a.claim(*db.conn, std::vector{req("sms-2")});
  BOOST_TEST(a.mark_terminal(*db.conn, Status::Unknown,
                             std::vector{claim::Outcome{first[0].row, first[0].attempt, 1, 1, {}, "timeout"}})[0]);
  ClaimStore reconciler("host-b", "host-b#1", 30s);
  BOOST_TEST(reconciler.take_for_redrive(*db.conn, first[0].row, first[0].attempt, 30s));
  ClaimStore operator_store("host-c", "host-c#operator", 30s);
  for (const Status as : {Status::Failed, Status::Done}) {
    const auto refused = operator_store.resolve_by_operator(*db.conn, first[0].idem_token, as, "looked it up");
    BOOST_TEST(!refused.resolved);
    BOOST_TEST(refused.redrive.value_or("").find("host-b#1") != std::string::npos, refused.redrive.value_or(""));
  }
  BOOST_TEST(db.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE " + claim::sql_status_is(Status::Unknown)) == 1);
  // The re-drive reports: its result is the row's.
  BOOST_TEST(reconciler.record_redrive(*db.conn, first[0].row, first[0].attempt + 1, 2,
                                       ClaimStore::RedriveResult::Applied, "SMS-1"));
  const auto late = operator_store.resolve_by_operator(*db.conn, first[0].idem_token, Status::Failed, "too late");
  BOOST_TEST(!late.resolved);
  BOOST_TEST(!late.redrive.has_value());
  BOOST_TEST(db.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE " + claim::sql_status_is(Status::Done)) == 1);
}

// Partition maintenance behind a long transaction (a mysqldump
// --single-transaction): its ALTER must give way within seconds, not queue
// every claim statement behind its pending metadata lock.
BOOST_AUTO_TEST_CASE(partition_maintenance_gives_way_to_a_long_transaction) {
  Db db("claim_ddl_lock_wait");
  db::Connection dump(db.cfg);
  dump.begin();
  dump.query("SELECT COUNT(*) FROM idemsink_claim");  // holds the table's metadata lock until it ends
  std::atomic<bool> returned{false};
  std::string error;
  std::thread maintenance([&] {
    db::Connection c(db.cfg);
    try {
      // Four months further ahead than the table has: ALTER ... ADD PARTITION.
      claim::maintain_partitions(c, std::chrono::system_clock::now() + std::chrono::hours(24 * 31 * 4), {});
    } catch (const db::DbError& e) {
      error = e.what();
    }
    returned = true;
  });
  const auto began = std::chrono::steady_clock::now();
  while (!returned && std::chrono::steady_clock::now() - began < 30s) std::this_thread::sleep_for(50ms);
  const bool gave_way = returned.load();
  dump.rollback_quietly();  // lets a maintenance that did not give way finish, so the thread ends
  maintenance.join();
  BOOST_TEST(gave_way, "maintenance still waiting for the lock after 30s");
  BOOST_TEST(error.find("1205") != std::string::npos, error);
  // Claims flow once it gave way.
  ClaimStore a("host-a", "host-a#1", 30s);
  BOOST_TEST((a.claim(*db.conn, std::vector{req("after")})[0].verdict == Verdict::Owned));
}

BOOST_AUTO_TEST_CASE(lease_renewal_touches_only_our_pending_rows) {
  Db db("claim_renew");
  ClaimStore a("host-a", "host-a#1", 30s), b("host-b", "host-b#1", 30s);
  auto ra = a.claim(*db.conn, std::vector{req("a1"), req("a2")});
  b.claim(*db.conn, std::vector{req("b1")});
  a.mark_done(*db.conn, std::vector{outcome(ra[1])});
  BOOST_TEST(a.renew(*db.conn) == 1u);
}

BOOST_AUTO_TEST_CASE(partitions_are_created_ahead_and_dropped_past_retention) {
  Db db("claim_partitions");
  auto parts = [&] {
    std::vector<std::string> out;
    for (auto& r : db.conn->query("SELECT PARTITION_NAME FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = "
                                  "DATABASE() AND TABLE_NAME = 'idemsink_claim' ORDER BY PARTITION_NAME"))
      out.push_back(*r[0]);
    return out;
  };
  const auto now = std::chrono::system_clock::now();
  auto before = parts();
  BOOST_TEST(before.back() == "p" + claim::month_start(now, 3).substr(0, 4) + claim::month_start(now, 3).substr(5, 2));
  // Half a year later: new months appended, months past the 90-day retention
  // dropped. 183 days span 6 or 7 calendar months depending on today.
  const auto later = now + std::chrono::hours(24 * 183);
  auto month_index = [](const std::string& ym) { return std::stoi(ym.substr(0, 4)) * 12 + std::stoi(ym.substr(5, 2)); };
  const size_t months =
      static_cast<size_t>(month_index(claim::month_start(later, 0)) - month_index(claim::month_start(now, 0)));
  auto report = claim::apply_schema(*db.conn, later, {});
  BOOST_TEST(report.added.size() == months);
  BOOST_TEST(!report.dropped.empty());
  auto after = parts();
  BOOST_TEST(after.front() > before.front());
  // Re-applying is a no-op.
  auto again = claim::apply_schema(*db.conn, later, {});
  BOOST_TEST(again.added.empty());
  BOOST_TEST(again.dropped.empty(), "dropped again: " << (again.dropped.empty() ? "" : again.dropped.front())
                                                      << " before " << before.front() << ".." << before.back()
                                                      << " after " << after.front() << ".." << after.back());
}

BOOST_AUTO_TEST_CASE(outbox_rows_are_unique_per_source_record_and_handed_out_once) {
  Db db("claim_outbox");
  dlq::Outbox mine("host-a#1", 60s), theirs("host-b#1", 60s);
  dlq::Letter d = letter("permanent", 7);
  d.error = "rejected: 地址无效";
  d.src_partition = 1;
  d.value = std::string("v\0v", 3);
  d.headers = {{"trace", std::string("abc")}, {"empty", std::nullopt}};
  mine.insert(*db.conn, std::vector{d});
  mine.insert(*db.conn, std::vector{d});  // a re-run job or a redelivery adds nothing
  BOOST_TEST(mine.pending(*db.conn) == 1u);
  BOOST_TEST(theirs.take(*db.conn, 10, 1 << 20).empty());  // ours while our lease holds
  auto taken = mine.take(*db.conn, 10, 1 << 20);
  BOOST_REQUIRE(taken.size() == 1u);
  BOOST_TEST(*taken[0].value == std::string("v\0v", 3));
  BOOST_TEST(taken[0].headers.size() == 2u);
  BOOST_TEST(!taken[0].headers[1].value.has_value());
  BOOST_TEST(taken[0].error == "rejected: 地址无效");
  BOOST_TEST(taken[0].first_failure_ms == kNov2026);
  mine.mark_published(*db.conn, std::vector<uint64_t>{taken[0].id});
  BOOST_TEST(mine.pending(*db.conn) == 0u);
  BOOST_TEST(mine.take(*db.conn, 10, 1 << 20).empty());
}

// An unknown left to reconciliation is held back from the DLQ; once its hold
// is over it goes out only if its claim is still unknown.
BOOST_AUTO_TEST_CASE(held_dead_letters_go_out_only_while_their_claim_is_still_unknown) {
  Db db("claim_outbox_held");
  ClaimStore a("host-a", "host-a#1", 30s);
  dlq::Outbox outbox("host-a#1", 60s);
  auto claims = a.claim(*db.conn, std::vector{req("settled"), req("undecided")});
  a.mark_terminal(*db.conn, Status::Unknown, std::vector{outcome(claims[0]), outcome(claims[1])});
  std::vector<dlq::Letter> letters;
  for (int i = 0; i < 2; ++i) {
    dlq::Letter& d = letters.emplace_back(letter("uncertain", i));
    d.idem_token = claims[i].idem_token;
    d.hold = 1h;
  }
  outbox.insert(*db.conn, letters);
  BOOST_TEST(outbox.take(*db.conn, 10, 1 << 20).empty());  // held: reconciliation may settle them
  BOOST_TEST(outbox.pending(*db.conn) == 0u);

  db.conn->execute("UPDATE idemsink_dlq_outbox SET held_until = NOW(3) - INTERVAL 1 SECOND");  // an hour later
  BOOST_TEST(a.resolve_applied(*db.conn, claims[0].row, claims[0].attempt, "R"));
  BOOST_TEST(outbox.pending(*db.conn) == 1u);
  auto taken = outbox.take(*db.conn, 10, 1 << 20);
  BOOST_REQUIRE(taken.size() == 1u);
  BOOST_TEST(taken[0].idem_token == claims[1].idem_token);  // still undecided: a person looks at it
  const std::vector<std::string> settled{claims[0].idem_token};
  BOOST_TEST(dlq::Outbox::settle_held(*db.conn, settled) == 1u);
  BOOST_TEST(db.scalar("SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE published_at IS NOT NULL AND publish_error "
                       "LIKE 'settled by reconciliation%'") == 1);
}

// A record forwarded to a retry topic and dead-lettered later from the same
// source position keeps both rows; so do two routes reading one topic.
BOOST_AUTO_TEST_CASE(outbox_rows_are_unique_per_route_purpose_and_position) {
  Db db("claim_outbox_keys");
  dlq::Outbox box("host-a#1", 60s);
  dlq::Letter forward = letter("retry", 5);
  forward.purpose = dlq::Purpose::Forward;
  forward.topic = "orders.retry.1";
  dlq::Letter dead = forward;
  dead.purpose = dlq::Purpose::DeadLetter;
  dead.topic = "orders.dlq";
  dead.reason = "permanent";
  dlq::Letter other_route = dead;
  other_route.route = "sms";
  box.insert(*db.conn, std::vector{forward});
  box.insert(*db.conn, std::vector{dead, other_route});
  box.insert(*db.conn, std::vector{forward, dead});  // re-runs add nothing
  BOOST_TEST(db.scalar("SELECT COUNT(*) FROM idemsink_dlq_outbox") == 3);
  auto taken = box.take(*db.conn, 10, 1 << 20);
  BOOST_REQUIRE(taken.size() == 3u);
  BOOST_TEST((taken[0].purpose == dlq::Purpose::Forward));
  BOOST_TEST((taken[1].purpose == dlq::Purpose::DeadLetter));
}

// Published rows (with their payloads) are deleted after the retention, in
// batches; unpublished and unpublishable rows are kept.
BOOST_AUTO_TEST_CASE(published_outbox_rows_are_purged_after_the_retention) {
  Db db("claim_outbox_purge");
  dlq::Outbox box("host-a#1", 60s);
  std::vector<dlq::Letter> letters;
  for (int i = 0; i < 25; ++i) {
    dlq::Letter d = letter("permanent", i);
    d.value = std::string(1000, 'v');
    letters.push_back(d);
  }
  box.insert(*db.conn, letters);
  std::vector<uint64_t> ids;
  for (const auto& d : box.take(*db.conn, 100, 1 << 20)) ids.push_back(d.id);
  BOOST_REQUIRE(ids.size() == 25u);
  box.mark_published(*db.conn, std::vector<uint64_t>(ids.begin(), ids.begin() + 20));  // 5 stay unpublished
  box.mark_unpublishable(*db.conn, ids[24], "MSG_SIZE_TOO_LARGE");
  db.conn->execute("UPDATE idemsink_dlq_outbox SET published_at = NOW(3) - INTERVAL 8 DAY WHERE src_offset < 15");
  BOOST_TEST(box.purge_published(*db.conn, std::chrono::hours(24 * 7), 10) == 10u);
  BOOST_TEST(box.purge_published(*db.conn, std::chrono::hours(24 * 7), 10) == 5u);
  BOOST_TEST(box.purge_published(*db.conn, std::chrono::hours(24 * 7), 10) == 0u);
  BOOST_TEST(db.scalar("SELECT COUNT(*) FROM idemsink_dlq_outbox") == 10);  // 5 recent, 5 unpublished
  BOOST_TEST(box.unpublishable(*db.conn) == 1u);
  BOOST_TEST(box.pending(*db.conn) == 4u);
}

BOOST_AUTO_TEST_CASE(pool_survives_the_database_going_away_mid_job) {
  auto& server = devkit::MariaDbServer::shared();
  Db db("claim_db_gone");
  db::Pool pool(db.cfg, 2);
  ClaimStore a("host-a", "host-a#1", 30s);
  std::vector<ClaimRequest> reqs;
  for (int i = 0; i < 50; ++i) reqs.push_back(req("gone-" + std::to_string(i)));
  std::atomic<int> runs{0};
  std::atomic<bool> finished{false};
  std::vector<claim::ClaimResult> results;
  pool.submit("claim", [&](db::Connection& c) {
    if (runs.fetch_add(1) == 0) {
      server.kill();  // the database goes away under the first run
      c.execute("SELECT 1");
    }
    results = a.claim(c, reqs);
    finished.store(true);
  });
  devkit::wait_until([&] { return runs.load() >= 2 || !pool.healthy(); }, 30s, "the pool to notice");
  server.restart();
  devkit::wait_until([&] { return finished.load(); }, 60s, "the job to be re-run after the restart");
  BOOST_TEST(runs.load() >= 2);
  BOOST_TEST(pool.reconnects() >= 1u);
  for (const auto& r : results) BOOST_TEST((r.verdict == Verdict::Owned));
  pool.stop(std::chrono::steady_clock::now() + 5s);
  db.conn = std::make_unique<db::Connection>(db.cfg);
  BOOST_TEST(db.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE biz_key LIKE 'gone-%'") == 50);
}
