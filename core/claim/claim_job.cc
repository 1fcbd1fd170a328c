// One claim job (ClaimStore::claim) in its steps. See claim_store.h for the
// rules; the SQL pieces are in claim_sql.h.
#include <errmsg.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "core/claim/claim_sql.h"
#include "core/claim/claim_store.h"
#include "core/claim/order_hold.h"
#include "core/common/fault.h"

namespace idemsink::claim {
namespace {

using db::Connection;
using namespace sql;

// Fault point for tests: the connection is lost right after a claim write
// committed, so the pool re-runs the job (claim_store.h: ClaimJobMemory).
void lose_connection_on_fault() {
  if (fault::once("lost_connection_after_claim_write"))
    throw db::DbError(CR_SERVER_LOST,
                      "fault lost_connection_after_claim_write: the write committed, its answer is lost");
}

}  // namespace

// One claim job (ClaimStore::claim), as its steps: read what exists, insert
// the keys never seen, read again the keys another host inserted meanwhile,
// classify the rows that exist, take over the pending rows we may.
class ClaimStore::Job {
 public:
  Job(const ClaimStore& store, Connection& c, std::span<const ClaimRequest> reqs, ClaimJobMemory& memory)
      : store_(store), c_(c), reqs_(reqs), memory_(memory), results_(reqs.size()) {}

  std::vector<ClaimResult> run() {
    if (reqs_.empty()) return std::move(results_);
    read_existing();
    hold_back_ordered();
    insert_new_keys();
    read_lost_races();
    classify_existing();
    take_over();
    return std::move(results_);
  }

 private:
  struct Takeover {
    size_t index;
    const ClaimRow* e;
  };
  static std::string index(const std::string& ns, const std::string& k) { return ns + '\0' + k; }
  std::string index(size_t i) const { return index(reqs_[i].key.ns, reqs_[i].key.biz_key); }
  std::vector<ClaimRow> read_rows_of(std::span<const ClaimRequest> reqs) {
    std::vector<RowKey> keys;
    keys.reserve(reqs.size());
    for (const auto& r : reqs) keys.push_back(r.key);
    return read_claim_rows(c_, store_.claim_read(), keys);
  }

  // 1. What exists already, in any bucket: the row the key directory names
  //    (or, all months read, the oldest row, which governs).
  void read_existing() {
    for (auto& e : read_rows_of(reqs_)) existing_.try_emplace(index(e.row.ns, e.row.biz_key), std::move(e));
    fault::sync_point("claim_store.after_read");
  }

  // 1b. A record of an ordered route whose entity has an earlier record
  //     unfinished (order_hold.h) is left alone: nothing is written for it,
  //     and it asks again later. Records already done or dead need no turn.
  void hold_back_ordered() {
    std::vector<size_t> asking;
    std::vector<OrderAsk> asks;
    for (size_t i = 0; i < reqs_.size(); ++i) {
      const ClaimRequest& r = reqs_[i];
      if (!r.order_key) continue;
      auto it = existing_.find(index(i));
      if (it != existing_.end() && it->second.status != Status::Pending) continue;
      asking.push_back(i);
      asks.push_back(OrderAsk{r.key.ns, *r.order_key, r.key.biz_key, r.hold_on_dead});
    }
    if (asks.empty()) return;
    const std::vector<bool> blocked = OrderHolds::blocked(c_, asks);
    for (size_t n = 0; n < asking.size(); ++n)
      if (blocked[n]) results_[asking[n]].verdict = Verdict::Held;
  }
  bool held(size_t i) const { return results_[i].verdict == Verdict::Held; }

  // 2. Insert rows for keys never seen. The key directory (one row per key,
  //    whatever the month) is the arbiter: its INSERT IGNORE ... RETURNING
  //    says which keys this job won, even against a host inserting the same
  //    key into another month's partition at the same instant; the claim rows
  //    of the keys won go in in the same transaction, so a key's directory row
  //    is never seen without its claim row. Keys in byte order: two hosts
  //    inserting overlapping batches take the row locks in one order.
  void insert_new_keys() {
    std::vector<size_t> to_insert;
    for (size_t i = 0; i < reqs_.size(); ++i)
      if (!existing_.count(index(i)) && !held(i)) to_insert.push_back(i);
    if (to_insert.empty()) return;
    std::sort(to_insert.begin(), to_insert.end(), [&](size_t a, size_t b) {
      return std::tie(reqs_[a].key.ns, reqs_[a].key.biz_key) < std::tie(reqs_[b].key.ns, reqs_[b].key.biz_key);
    });
    c_.begin();
    const std::set<std::string> won = insert_directory_rows(to_insert);
    const std::map<std::string, RowKey> inserted = insert_claim_rows(to_insert, won);
    const std::vector<size_t> no_partition = sort_out_skipped(to_insert, won, inserted);
    c_.commit();
    lose_connection_on_fault();
    for (size_t i : to_insert) {
      auto it = inserted.find(index(i));
      if (it == inserted.end()) continue;
      ClaimResult& res = results_[i];
      res.verdict = Verdict::Owned;
      res.row = it->second;
      res.status = Status::Pending;
      res.attempt = 1;
      res.idem_token = memory_.tokens[index(i)];
    }
    for (size_t i : no_partition) results_[i].verdict = Verdict::NoPartition;
  }

  /// The keys of `to_insert` this job won in the key directory.
  std::set<std::string> insert_directory_rows(const std::vector<size_t>& to_insert) {
    std::string sql = "INSERT IGNORE INTO idemsink_claim_key (namespace, biz_key, bucket) VALUES ";
    for (size_t n = 0; n < to_insert.size(); ++n) {
      const ClaimRequest& r = reqs_[to_insert[n]];
      sql += (n ? ", (" : "(") + Connection::hex(r.key.ns) + ", " + Connection::hex(r.key.biz_key) + ", " +
             date_literal(r.key.bucket) + ")";
    }
    sql += " RETURNING namespace, biz_key";
    std::set<std::string> won;
    for (auto& row : c_.query(sql)) won.insert(index(*row[0], *row[1]));
    for (size_t i : to_insert)
      if (!won.count(index(i))) lost_race_.push_back(i);
    return won;
  }

  /// Claim rows, pending and ours, for the keys won; the rows inserted.
  std::map<std::string, RowKey> insert_claim_rows(const std::vector<size_t>& to_insert,
                                                  const std::set<std::string>& won) {
    std::string sql =
        "INSERT IGNORE INTO idemsink_claim (namespace, biz_key, bucket, status, attempt, idem_token, owner, "
        "lease_until, payload_hash, src_topic, src_partition, src_offset, created_at, updated_at) VALUES ";
    const std::string owner = c_.quote(store_.owner_), lease = store_.lease_expr();
    const std::string pending = std::to_string(static_cast<int>(Status::Pending));
    size_t rows = 0;
    for (size_t i : to_insert) {
      if (!won.count(index(i))) continue;
      const ClaimRequest& r = reqs_[i];
      // Generated once per job: a re-run inserts (and recognises) the same token.
      auto [tok, fresh] = memory_.tokens.try_emplace(index(i));
      if (fresh) tok->second = store_.new_token(r.key.ns, r.key.biz_key);
      sql += (rows++ ? ", (" : "(") + Connection::hex(r.key.ns) + ", " + Connection::hex(r.key.biz_key) + ", " +
             date_literal(r.key.bucket) + ", " + pending + ", 1, '" + tok->second + "', " + owner + ", " + lease +
             ", " + Connection::hex(r.payload_hash) + ", " + c_.quote(r.src_topic) + ", " +
             std::to_string(r.src_partition) + ", " + std::to_string(r.src_offset) + ", NOW(3), NOW(3))";
    }
    std::map<std::string, RowKey> inserted;
    if (rows == 0) return inserted;
    sql += " RETURNING namespace, biz_key, bucket";
    for (auto& row : c_.query(sql)) inserted.emplace(index(*row[0], *row[1]), RowKey{*row[0], *row[1], *row[2]});
    return inserted;
  }

  /// A key won whose claim row INSERT IGNORE skipped: its month has no
  /// partition (its directory row goes too: nothing claims the key), or a
  /// host of an earlier version, which writes no directory row, inserted the
  /// same row meanwhile (the directory row stays: it names that row). Returns
  /// the keys without a partition; the others join the lost races.
  std::vector<size_t> sort_out_skipped(const std::vector<size_t>& to_insert, const std::set<std::string>& won,
                                       const std::map<std::string, RowKey>& inserted) {
    std::vector<size_t> skipped, no_partition;
    for (size_t i : to_insert)
      if (won.count(index(i)) && !inserted.count(index(i))) skipped.push_back(i);
    if (skipped.empty()) return no_partition;
    std::vector<Outcome> rows;
    for (size_t i : skipped) rows.push_back(Outcome{reqs_[i].key, 0, 0, 0, {}, {}});
    std::set<std::string> present;
    for (auto& row : c_.query("SELECT namespace, biz_key FROM idemsink_claim WHERE " + where_rows(rows)))
      present.insert(index(*row[0], *row[1]));
    std::vector<RowKey> gone;
    for (size_t i : skipped) {
      if (present.count(index(i))) {
        lost_race_.push_back(i);
      } else {
        no_partition.push_back(i);
        gone.push_back(reqs_[i].key);
      }
    }
    if (!gone.empty()) c_.execute("DELETE FROM idemsink_claim_key WHERE " + where_keys(gone));
    return no_partition;
  }

  // Keys another host inserted between our read and our insert.
  void read_lost_races() {
    if (lost_race_.empty()) return;
    std::vector<ClaimRequest> again;
    for (size_t i : lost_race_) again.push_back(reqs_[i]);
    for (auto& e : read_rows_of(again)) existing_.try_emplace(index(e.row.ns, e.row.biz_key), std::move(e));
    // A directory row without its claim row: the claim's month was dropped
    // (at retention, or by hand) after the directory was written. Such a row
    // guards nothing any more: it goes, and the record claims again shortly.
    std::vector<RowKey> stale;
    for (size_t i : lost_race_)
      if (!existing_.count(index(i))) {
        stale.push_back(reqs_[i].key);
        results_[i].verdict = Verdict::Busy;
      }
    if (!stale.empty())
      c_.execute("DELETE k FROM idemsink_claim_key k WHERE (" + where_keys(stale) +
                 ") AND NOT EXISTS (SELECT 1 FROM idemsink_claim c WHERE c.namespace = k.namespace AND c.biz_key = "
                 "k.biz_key AND c.bucket = k.bucket)");
  }

  // 3. Classify existing rows; collect pending rows we may take over.
  void classify_existing() {
    for (size_t i = 0; i < reqs_.size(); ++i) {
      if (results_[i].verdict == Verdict::Owned || results_[i].verdict == Verdict::NoPartition || held(i)) continue;
      auto it = existing_.find(index(i));
      if (it == existing_.end()) continue;  // a stale directory row was cleared: Busy, claimed again shortly
      const ClaimRow& e = it->second;
      ClaimResult& res = results_[i];
      res.row = e.row;
      res.status = e.status;
      res.attempt = e.attempt;
      res.idem_token = e.idem_token;
      res.receipt = e.receipt;
      res.takeovers = e.takeovers;
      res.uncertain_calls = e.uncertain_calls;
      res.maybe_called = e.maybe_called;
      if (reqs_[i].check_payload && e.payload_hash != reqs_[i].payload_hash) {
        res.verdict = Verdict::Conflict;
        continue;
      }
      switch (e.status) {
        case Status::Done: res.verdict = Verdict::Done; break;
        case Status::Failed:
        case Status::Unknown: res.verdict = Verdict::Terminal; break;
        case Status::Pending: classify_pending(i, e); break;
      }
    }
  }

  void classify_pending(size_t i, const ClaimRow& e) {
    ClaimResult& res = results_[i];
    // Written by an earlier run of this very job, whose connection was lost
    // after the write committed: ours as it stands.
    const std::string key = index(i);
    const bool this_run = e.owner && *e.owner == store_.owner_;
    auto token = memory_.tokens.find(key);
    auto took = memory_.takeovers.find(key);
    if (this_run && token != memory_.tokens.end() && token->second == e.idem_token && e.attempt == 1) {
      res.verdict = Verdict::Owned;
      return;
    }
    if (this_run && took != memory_.takeovers.end() && e.attempt == took->second.from_attempt + 1) {
      res.verdict = Verdict::Owned;
      res.taken_over = true;
      res.previous_owner_vanished = took->second.owner_was_set;
      return;
    }
    const bool ours = e.owner && e.owner->substr(0, e.owner->find('#')) == store_.host_id_;
    if (!e.owner || e.lease_expired || ours) {
      candidates_.push_back({i, &e});
    } else {
      res.verdict = Verdict::Busy;
    }
  }

  // 4. Take over with one conditional UPDATE; the attempt in the condition
  //    makes it a CAS per row. Then read back which ones we now hold.
  void take_over() {
    if (candidates_.empty()) return;
    std::vector<Outcome> epochs;
    for (const auto& t : candidates_) {
      epochs.push_back(Outcome{t.e->row, t.e->attempt, 0, 0, {}, {}});
      memory_.takeovers[index(t.e->row.ns, t.e->row.biz_key)] = {t.e->attempt, t.e->owner.has_value()};
    }
    const std::string sql =
        "UPDATE idemsink_claim SET attempt = attempt + 1, takeovers = takeovers + (owner IS NOT NULL), owner = " +
        c_.quote(store_.owner_) + ", lease_until = " + store_.lease_expr() + ", updated_at = NOW(3) WHERE " +
        sql_status_is(Status::Pending) + " AND (owner IS NULL OR lease_until < NOW(3) OR " +
        "SUBSTRING_INDEX(owner, '#', 1) = " + c_.quote(store_.host_id_) + ") AND (" + where_epochs(epochs) + ")";
    c_.execute(sql);
    lose_connection_on_fault();
    std::vector<RowKey> keys;
    for (const auto& t : candidates_) keys.push_back(t.e->row);
    std::map<std::string, ClaimResult> now;
    for (auto& r : store_.read(c_, keys)) now.emplace(index(r.row.ns, r.row.biz_key), std::move(r));
    for (const auto& t : candidates_) {
      ClaimResult& res = results_[t.index];
      auto it = now.find(index(t.e->row.ns, t.e->row.biz_key));
      if (it == now.end()) throw db::DbError(0, "claim row vanished during takeover");
      const ClaimResult& cur = it->second;
      res.status = cur.status;
      res.attempt = cur.attempt;
      res.receipt = cur.receipt;
      res.takeovers = cur.takeovers;
      res.uncertain_calls = cur.uncertain_calls;
      res.maybe_called = cur.maybe_called;
      if (cur.status == Status::Pending && cur.attempt == t.e->attempt + 1 && cur.verdict == Verdict::Owned) {
        res.verdict = Verdict::Owned;
        res.taken_over = true;
        res.previous_owner_vanished = t.e->owner.has_value();
      } else {
        res.verdict = cur.verdict == Verdict::Owned ? Verdict::Busy : cur.verdict;
      }
    }
  }

  const ClaimStore& store_;
  Connection& c_;
  const std::span<const ClaimRequest> reqs_;
  ClaimJobMemory& memory_;
  std::vector<ClaimResult> results_;
  std::map<std::string, ClaimRow> existing_;  // by index(ns, biz_key)
  std::vector<size_t> lost_race_;             // keys another host inserted first
  std::vector<Takeover> candidates_;          // pending rows we may take over
};

std::vector<ClaimResult> ClaimStore::claim(Connection& c, std::span<const ClaimRequest> reqs,
                                           ClaimJobMemory& memory) const {
  return Job(*this, c, reqs, memory).run();
}

}  // namespace idemsink::claim
