#include "core/claim/claim_store.h"

#include <errmsg.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <ctime>
#include <tuple>
#include <map>
#include <set>
#include <stdexcept>

#include "core/common/fault.h"
#include "core/common/util.h"

namespace idemsink::claim {
namespace {

using db::Connection;

// The rules of idemsink_claim's lease, each written once.
// A pending row with no live owner: free to take over.
const std::string kPendingUnowned = sql_status_is(Status::Pending) + " AND (owner IS NULL OR lease_until < NOW(3))";
// An unknown row that no re-drive holds.
const std::string kUnknownUnleased =
    sql_status_is(Status::Unknown) + " AND (lease_until IS NULL OR lease_until < NOW(3))";
// A pending row this host's claims own (with owner = ours).
const std::string kPending = sql_status_is(Status::Pending);

// Column list of every read; keep in sync with parse_existing().
constexpr std::string_view kReadColumns =
    "namespace, biz_key, bucket, status, attempt, idem_token, owner, "
    "(lease_until IS NULL OR lease_until < NOW(3)), payload_hash, receipt, takeovers, uncertain_calls, "
    "call_started IS NOT NULL";

std::string date_literal(const std::string& bucket) { return "DATE'" + bucket + "'"; }

// Fault point for tests: the connection is lost right after a claim write
// committed, so the pool re-runs the job (claim_store.h: ClaimJobMemory).
void lose_connection_on_fault() {
  if (fault::once("lost_connection_after_claim_write"))
    throw db::DbError(CR_SERVER_LOST,
                      "fault lost_connection_after_claim_write: the write committed, its answer is lost");
}

// Column sizes of idemsink_claim (schema.cc). Values are made to fit, never
// refused: a statement failing on one row's data would stop the whole batch.
constexpr size_t kReceiptBytes = 1024;
constexpr size_t kErrorBytes = 1024;

// A receipt longer than its column is stored cut, and says so; the whole
// receipt goes to the debug log.
std::string fit_receipt(std::string_view receipt) {
  if (receipt.size() <= kReceiptBytes) return std::string(receipt);
  spdlog::debug("receipt of {} bytes cut to {}: {}", receipt.size(), kReceiptBytes, printable(receipt, receipt.size()));
  const std::string marker = "...[receipt cut: " + std::to_string(receipt.size()) + " bytes]";
  return std::string(receipt.substr(0, kReceiptBytes - marker.size())) + marker;
}

// "(namespace = X'..' AND biz_key IN (X'..', ...)) OR (...)": one IN list per
// namespace, which the optimizer turns into primary-key range lookups.
template <class Range, class KeyOf>
std::string where_keys(const Range& items, KeyOf key_of) {
  std::map<std::string, std::vector<std::string>> by_ns;
  for (const auto& it : items) {
    const RowKey& k = key_of(it);
    by_ns[k.ns].push_back(Connection::hex(k.biz_key));
  }
  std::string out;
  for (const auto& [ns, keys] : by_ns) {
    if (!out.empty()) out += " OR ";
    out += "(namespace = " + Connection::hex(ns) + " AND biz_key IN (";
    for (size_t i = 0; i < keys.size(); ++i) out += (i ? ", " : "") + keys[i];
    out += "))";
  }
  return out;
}

// "(namespace = .. AND biz_key = .. AND bucket = ..) OR ...": exact rows.
std::string where_rows(std::span<const Outcome> rows) {
  std::string out;
  for (const auto& o : rows) {
    if (!out.empty()) out += " OR ";
    out += "(namespace = " + Connection::hex(o.row.ns) + " AND biz_key = " + Connection::hex(o.row.biz_key) +
           " AND bucket = " + date_literal(o.row.bucket) + ")";
  }
  return out;
}

// "(namespace = .. AND biz_key = .. AND bucket = .. AND attempt = ..) OR ...":
// exact row and claim epoch, the fencing condition of every transition.
std::string where_epochs(std::span<const Outcome> outcomes) {
  std::string out;
  for (const auto& o : outcomes) {
    if (!out.empty()) out += " OR ";
    out += "(namespace = " + Connection::hex(o.row.ns) + " AND biz_key = " + Connection::hex(o.row.biz_key) +
           " AND bucket = " + date_literal(o.row.bucket) + " AND attempt = " + std::to_string(o.attempt) + ")";
  }
  return out;
}

}  // namespace

struct ClaimStore::Existing {
  RowKey row;
  Status status;
  uint32_t attempt;
  std::string idem_token;
  std::optional<std::string> owner;
  bool lease_expired;
  std::string payload_hash;
  std::string receipt;
  uint32_t takeovers;
  uint32_t uncertain_calls;
  bool maybe_called;
};

const char* to_string(Status s) {
  switch (s) {
    case Status::Pending: return "pending";
    case Status::Done: return "done";
    case Status::Failed: return "failed";
    case Status::Unknown: return "unknown";
  }
  return "?";
}

std::string sql_status_is(Status s, std::string_view alias) {
  return std::string(alias) + "status = " + std::to_string(static_cast<int>(s));
}

std::string sql_claim_is_unknown(std::string_view token_column) {
  return "EXISTS (SELECT 1 FROM idemsink_claim c WHERE c.idem_token = " + std::string(token_column) + " AND " +
         sql_status_is(Status::Unknown, "c.") + ")";
}

const char* to_string(Verdict v) {
  switch (v) {
    case Verdict::Owned: return "owned";
    case Verdict::Done: return "done";
    case Verdict::Terminal: return "terminal";
    case Verdict::Conflict: return "conflict";
    case Verdict::Busy: return "busy";
    case Verdict::NoPartition: return "no_partition";
  }
  return "?";
}

std::string bucket_of(int64_t timestamp_ms) {
  std::time_t secs = static_cast<std::time_t>(timestamp_ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04d-%02d-01", tm.tm_year + 1900, tm.tm_mon + 1);
  return buf;
}

ClaimStore::ClaimStore(std::string host_id, std::string owner, std::chrono::milliseconds lease)
    : host_id_(std::move(host_id)), owner_(std::move(owner)), lease_(lease) {}

std::string ClaimStore::new_token(const std::string& ns, const std::string& biz_key) const {
  if (token_namespace_.empty()) return random_uuid();
  return name_uuid(token_namespace_, ns + '\0' + biz_key);
}

std::string ClaimStore::lease_expr() const {
  return "NOW(3) + INTERVAL " + std::to_string(lease_.count() * 1000) + " MICROSECOND";
}

std::vector<ClaimStore::Existing> ClaimStore::fetch(Connection& c, std::span<const ClaimRequest> reqs) const {
  std::vector<Existing> out;
  if (reqs.empty()) return out;
  const std::string sql = "SELECT " + std::string(kReadColumns) + " FROM idemsink_claim WHERE " +
                          where_keys(reqs, [](const ClaimRequest& r) -> const RowKey& { return r.key; }) +
                          " ORDER BY bucket";
  for (auto& r : c.query(sql)) {
    Existing e;
    e.row = RowKey{*r[0], *r[1], *r[2]};
    e.status = static_cast<Status>(std::stoi(*r[3]));
    e.attempt = static_cast<uint32_t>(std::stoul(*r[4]));
    e.idem_token = *r[5];
    e.owner = r[6];
    e.lease_expired = *r[7] == "1";
    e.payload_hash = r[8].value_or("");
    e.receipt = r[9].value_or("");
    e.takeovers = static_cast<uint32_t>(std::stoul(*r[10]));
    e.uncertain_calls = static_cast<uint32_t>(std::stoul(*r[11]));
    e.maybe_called = *r[12] == "1";
    out.push_back(std::move(e));
  }
  return out;
}

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
    insert_new_keys();
    read_lost_races();
    classify_existing();
    take_over();
    return std::move(results_);
  }

 private:
  struct Takeover {
    size_t index;
    const Existing* e;
  };
  static std::string index(const std::string& ns, const std::string& k) { return ns + '\0' + k; }
  std::string index(size_t i) const { return index(reqs_[i].key.ns, reqs_[i].key.biz_key); }

  // 1. What exists already, in any bucket (oldest first: the oldest governs).
  void read_existing() {
    for (auto& e : store_.fetch(c_, reqs_)) existing_.try_emplace(index(e.row.ns, e.row.biz_key), std::move(e));
    fault::sync_point("claim_store.after_read");
  }

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
      if (!existing_.count(index(i))) to_insert.push_back(i);
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
    if (!gone.empty())
      c_.execute("DELETE FROM idemsink_claim_key WHERE " +
                 where_keys(gone, [](const RowKey& k) -> const RowKey& { return k; }));
    return no_partition;
  }

  // Keys another host inserted between our read and our insert.
  void read_lost_races() {
    if (lost_race_.empty()) return;
    std::vector<ClaimRequest> again;
    for (size_t i : lost_race_) again.push_back(reqs_[i]);
    for (auto& e : store_.fetch(c_, again)) existing_.try_emplace(index(e.row.ns, e.row.biz_key), std::move(e));
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
      c_.execute("DELETE k FROM idemsink_claim_key k WHERE (" +
                 where_keys(stale, [](const RowKey& key) -> const RowKey& { return key; }) +
                 ") AND NOT EXISTS (SELECT 1 FROM idemsink_claim c WHERE c.namespace = k.namespace AND c.biz_key = "
                 "k.biz_key AND c.bucket = k.bucket)");
  }

  // 3. Classify existing rows; collect pending rows we may take over.
  void classify_existing() {
    for (size_t i = 0; i < reqs_.size(); ++i) {
      if (results_[i].verdict == Verdict::Owned || results_[i].verdict == Verdict::NoPartition) continue;
      auto it = existing_.find(index(i));
      if (it == existing_.end()) continue;  // a stale directory row was cleared: Busy, claimed again shortly
      const Existing& e = it->second;
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

  void classify_pending(size_t i, const Existing& e) {
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
        c_.quote(store_.owner_) + ", lease_until = " + store_.lease_expr() + ", updated_at = NOW(3) WHERE " + kPending +
        " AND (owner IS NULL OR lease_until < NOW(3) OR " +
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
  std::map<std::string, Existing> existing_;  // by index(ns, biz_key)
  std::vector<size_t> lost_race_;             // keys another host inserted first
  std::vector<Takeover> candidates_;          // pending rows we may take over
};

std::vector<ClaimResult> ClaimStore::claim(Connection& c, std::span<const ClaimRequest> reqs,
                                           ClaimJobMemory& memory) const {
  return Job(*this, c, reqs, memory).run();
}

std::vector<ClaimResult> ClaimStore::read(Connection& c, std::span<const RowKey> keys) const {
  std::vector<ClaimResult> out;
  if (keys.empty()) return out;
  const std::string sql =
      "SELECT namespace, biz_key, bucket, status, attempt, idem_token, owner, receipt, takeovers, uncertain_calls, "
      "call_started IS NOT NULL FROM idemsink_claim WHERE " +
      where_keys(keys, [](const RowKey& k) -> const RowKey& { return k; }) + " ORDER BY bucket";
  for (auto& r : c.query(sql)) {
    ClaimResult res;
    res.row = RowKey{*r[0], *r[1], *r[2]};
    res.status = static_cast<Status>(std::stoi(*r[3]));
    res.attempt = static_cast<uint32_t>(std::stoul(*r[4]));
    res.idem_token = *r[5];
    res.receipt = r[7].value_or("");
    res.takeovers = static_cast<uint32_t>(std::stoul(*r[8]));
    res.uncertain_calls = static_cast<uint32_t>(std::stoul(*r[9]));
    res.maybe_called = *r[10] == "1";
    switch (res.status) {
      case Status::Done: res.verdict = Verdict::Done; break;
      case Status::Failed:
      case Status::Unknown: res.verdict = Verdict::Terminal; break;
      case Status::Pending: res.verdict = r[6] && *r[6] == owner_ ? Verdict::Owned : Verdict::Busy; break;
    }
    out.push_back(std::move(res));
  }
  return out;
}

std::vector<bool> ClaimStore::finish(Connection& c, Status status, std::span<const Outcome> outcomes) const {
  std::vector<bool> ok(outcomes.size(), false);
  if (outcomes.empty()) return ok;
  // One UPDATE joined to a table value constructor of (row, epoch, result)
  // tuples: each row one primary-key lookup (eq_ref). A VALUES list costs
  // the server ~20% less than the same rows as SELECT ... UNION ALL SELECT
  // (bench/README.md).
  const bool done = status == Status::Done;
  std::string values;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const Outcome& o = outcomes[i];
    values += (i ? ", (" : "(") + Connection::hex(o.row.ns) + ", " + Connection::hex(o.row.biz_key) + ", " +
              date_literal(o.row.bucket) + ", " + std::to_string(o.attempt) + ", " + std::to_string(o.calls) + ", " +
              std::to_string(o.uncertain_calls) + ", " +
              (done ? Connection::hex(fit_receipt(o.receipt)) : c.quote(sanitize_utf8(o.error, kErrorBytes))) + ")";
  }
  const std::string sql =
      "UPDATE idemsink_claim c JOIN (WITH t (ns, k, b, att, calls, unc, detail) AS (VALUES " + values +
      ") SELECT * FROM t) v ON c.namespace = v.ns AND c.biz_key = v.k AND c.bucket = v.b SET " +
      sql_status_is(status, "c.") + ", " + (done ? "c.receipt = v.detail" : "c.last_error = v.detail") +
      ", c.calls = v.calls, c.uncertain_calls = v.unc, c.lease_until = NULL, c.updated_at = NOW(3) "
      "WHERE " +
      sql_status_is(Status::Pending, "c.") + " AND c.owner = " + c.quote(owner_) + " AND c.attempt = v.att";
  const uint64_t affected = c.execute(sql);
  if (affected == outcomes.size()) {
    ok.assign(outcomes.size(), true);
    return ok;
  }
  // Some rows were fenced, or an earlier run of this job already finished
  // them (lost connection after commit): look at each.
  std::vector<RowKey> keys;
  for (const auto& o : outcomes) keys.push_back(o.row);
  std::map<std::string, std::pair<Status, uint32_t>> now;
  for (auto& r : c.query("SELECT namespace, biz_key, bucket, status, attempt, owner FROM idemsink_claim WHERE " +
                         where_keys(keys, [](const RowKey& k) -> const RowKey& { return k; }))) {
    if (r[5] && *r[5] == owner_)
      now[*r[0] + '\0' + *r[1] + '\0' + *r[2]] = {static_cast<Status>(std::stoi(*r[3])),
                                                  static_cast<uint32_t>(std::stoul(*r[4]))};
  }
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const Outcome& o = outcomes[i];
    auto it = now.find(o.row.ns + '\0' + o.row.biz_key + '\0' + o.row.bucket);
    ok[i] = it != now.end() && it->second.first == status && it->second.second == o.attempt;
  }
  return ok;
}

std::vector<bool> ClaimStore::mark_done(Connection& c, std::span<const Outcome> outcomes) const {
  return finish(c, Status::Done, outcomes);
}

std::vector<bool> ClaimStore::mark_terminal(Connection& c, Status status, std::span<const Outcome> outcomes) const {
  if (status != Status::Failed && status != Status::Unknown)
    throw std::invalid_argument("mark_terminal takes failed or unknown");
  return finish(c, status, outcomes);
}

std::vector<bool> ClaimStore::lock_owned(Connection& c, std::span<const Outcome> outcomes) const {
  std::vector<bool> owned(outcomes.size(), false);
  if (outcomes.empty()) return owned;
  std::map<std::string, bool> locked;
  for (auto& r : c.query("SELECT namespace, biz_key, bucket FROM idemsink_claim WHERE " + kPending +
                         " AND owner = " + c.quote(owner_) + " AND (" + where_epochs(outcomes) + ") FOR UPDATE"))
    locked[*r[0] + '\0' + *r[1] + '\0' + *r[2]] = true;
  for (size_t i = 0; i < outcomes.size(); ++i)
    owned[i] = locked.count(outcomes[i].row.ns + '\0' + outcomes[i].row.biz_key + '\0' + outcomes[i].row.bucket) != 0;
  return owned;
}

void ClaimStore::release(Connection& c, std::span<const Outcome> outcomes) const {
  // One statement per distinct (uncertain calls, mark cleared) (almost always
  // one: none, cleared).
  std::map<std::pair<uint32_t, bool>, std::vector<Outcome>> groups;
  for (const auto& o : outcomes) groups[{o.uncertain_calls, o.calls > 0 && o.uncertain_calls == 0}].push_back(o);
  for (const auto& [what, group] : groups) {
    const auto [uncertain, calls_all_certain] = what;
    std::string set = "owner = NULL, lease_until = NULL";
    if (uncertain > 0) set += ", uncertain_calls = GREATEST(uncertain_calls, " + std::to_string(uncertain) + ")";
    if (calls_all_certain) set += ", call_started = NULL";
    c.execute("UPDATE idemsink_claim SET " + set + ", updated_at = NOW(3) WHERE " + kPending +
              " AND owner = " + c.quote(owner_) + " AND (" + where_epochs(group) + ")");
  }
}

std::vector<bool> ClaimStore::confirm_calls(Connection& c, std::span<const Outcome> outcomes, bool mark_calling) const {
  std::vector<bool> ours(outcomes.size(), false);
  if (outcomes.empty()) return ours;
  const std::string where =
      " WHERE " + kPending + " AND owner = " + c.quote(owner_) + " AND (" + where_epochs(outcomes) + ")";
  const uint64_t affected = c.execute("UPDATE idemsink_claim SET lease_until = " + lease_expr() +
                                      (mark_calling ? ", call_started = NOW(3)" : "") + where);
  if (affected == outcomes.size()) {
    ours.assign(outcomes.size(), true);
    return ours;
  }
  // Some were taken over (or the statement changed nothing on a re-run in
  // the same millisecond): the rows still ours at their epoch say which.
  auto epoch = [](const std::string& ns, const std::string& k, const std::string& b, const std::string& attempt) {
    return ns + '\0' + k + '\0' + b + '\0' + attempt;
  };
  std::set<std::string> held;
  for (auto& r : c.query("SELECT namespace, biz_key, bucket, attempt FROM idemsink_claim" + where))
    held.insert(epoch(*r[0], *r[1], *r[2], *r[3]));
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const auto& o = outcomes[i];
    ours[i] = held.count(epoch(o.row.ns, o.row.biz_key, o.row.bucket, std::to_string(o.attempt))) != 0;
  }
  return ours;
}

namespace {

// "namespace = .. AND biz_key = .. AND bucket = ..": one exact row.
std::string where_row(const RowKey& k) {
  return "namespace = " + Connection::hex(k.ns) + " AND biz_key = " + Connection::hex(k.biz_key) +
         " AND bucket = " + date_literal(k.bucket);
}

// Rows the pipeline let go of: unknown with no re-drive holding it, or
// pending with nobody's lease (stuck, once old enough).
const std::string kLetGo = "((" + kUnknownUnleased + ") OR (" + kPendingUnowned + "))";

}  // namespace

std::vector<ClaimStore::Unsettled> ClaimStore::unsettled(Connection& c, std::span<const Namespace> namespaces,
                                                         std::chrono::milliseconds stuck_after, size_t limit,
                                                         bool include_leased) const {
  auto older_than = [](std::string_view column, std::chrono::milliseconds age) {
    return std::string(column) + " < NOW(3) - INTERVAL " + std::to_string(age.count() * 1000) + " MICROSECOND";
  };
  // Unknown rows of one route: no re-drive holding them, and (for the
  // reconciler) their newest call began long enough ago to have landed.
  auto unknown = [&](std::chrono::milliseconds reconcile_after) {
    std::string w = include_leased ? sql_status_is(Status::Unknown) : kUnknownUnleased;
    if (reconcile_after.count() > 0) w += " AND " + older_than("IFNULL(call_started, updated_at)", reconcile_after);
    return "(" + w + ")";
  };
  const std::string stuck = "(" + kPendingUnowned + " AND " + older_than("updated_at", stuck_after) + ")";
  std::string where;
  if (namespaces.empty()) {
    where = "(" + unknown(std::chrono::milliseconds(0)) + " OR " + stuck + ")";
  } else {
    for (const auto& n : namespaces)
      where += (where.empty() ? "(" : " OR ") + ("(namespace = " + Connection::hex(n.ns) + " AND (" +
                                                 unknown(n.reconcile_after) + " OR " + stuck + "))");
    where += ")";
  }
  std::vector<Unsettled> out;
  for (auto& r : c.query("SELECT namespace, biz_key, bucket, status, attempt, calls, idem_token, src_topic, "
                         "src_partition, src_offset, IFNULL(last_error, ''), updated_at FROM idemsink_claim WHERE " +
                         where + " ORDER BY updated_at LIMIT " + std::to_string(limit))) {
    Unsettled u;
    u.row = RowKey{*r[0], *r[1], *r[2]};
    u.status = static_cast<Status>(std::stoi(*r[3]));
    u.attempt = static_cast<uint32_t>(std::stoul(*r[4]));
    u.calls = static_cast<uint32_t>(std::stoul(*r[5]));
    u.idem_token = *r[6];
    u.src_topic = *r[7];
    u.src_partition = std::stoi(*r[8]);
    u.src_offset = std::stoll(*r[9]);
    u.last_error = *r[10];
    u.updated_at = *r[11];
    out.push_back(std::move(u));
  }
  return out;
}

bool ClaimStore::resolve_applied(Connection& c, const RowKey& row, uint32_t attempt, std::string_view receipt) const {
  return c.execute("UPDATE idemsink_claim SET " + sql_status_is(Status::Done) +
                   ", receipt = " + Connection::hex(fit_receipt(receipt)) +
                   ", last_error = 'reconciled: the effect happened', lease_until = NULL, updated_at = NOW(3) WHERE " +
                   where_row(row) + " AND attempt = " + std::to_string(attempt) + " AND " + kLetGo) == 1;
}

bool ClaimStore::resolve_not_applied(Connection& c, const RowKey& row, uint32_t attempt, std::string_view why) const {
  return c.execute("UPDATE idemsink_claim SET " + sql_status_is(Status::Failed) + ", last_error = " +
                   c.quote(sanitize_utf8("reconciled: the effect never happened: " + std::string(why), kErrorBytes)) +
                   ", lease_until = NULL, updated_at = NOW(3) WHERE " + where_row(row) +
                   " AND attempt = " + std::to_string(attempt) + " AND " + kUnknownUnleased) == 1;
}

void ClaimStore::note_undecided(Connection& c, std::span<const Outcome> rows) const {
  if (rows.empty()) return;
  c.execute("UPDATE idemsink_claim SET updated_at = NOW(3) WHERE " + kUnknownUnleased + " AND (" + where_epochs(rows) +
            ")");
}

bool ClaimStore::take_for_redrive(Connection& c, const RowKey& row, uint32_t attempt,
                                  std::chrono::milliseconds hold) const {
  return c.execute("UPDATE idemsink_claim SET attempt = attempt + 1, call_started = NOW(3), owner = " +
                   c.quote(owner_) + ", lease_until = NOW(3) + INTERVAL " + std::to_string(hold.count() * 1000) +
                   " MICROSECOND, updated_at = NOW(3) WHERE " + where_row(row) +
                   " AND attempt = " + std::to_string(attempt) + " AND " + kUnknownUnleased) == 1;
}

bool ClaimStore::record_redrive(Connection& c, const RowKey& row, uint32_t taken_attempt, uint32_t calls,
                                RedriveResult result, std::string_view detail) const {
  std::string set;
  switch (result) {
    case RedriveResult::Applied:
      set = sql_status_is(Status::Done) + ", receipt = " + Connection::hex(fit_receipt(detail)) +
            ", last_error = " + c.quote("reconciled: not applied, re-driven once");
      break;
    case RedriveResult::Rejected:
      set = sql_status_is(Status::Failed) + ", last_error = " +
            c.quote(sanitize_utf8("re-driven after reconcile: " + std::string(detail), kErrorBytes));
      break;
    case RedriveResult::Undecided:
      set = "last_error = " +
            c.quote(sanitize_utf8("re-driven after reconcile, uncertain again: " + std::string(detail), kErrorBytes));
      break;
  }
  return c.execute("UPDATE idemsink_claim SET " + set + ", calls = " + std::to_string(calls) +
                   ", lease_until = NULL, updated_at = NOW(3) WHERE " + where_row(row) + " AND " +
                   sql_status_is(Status::Unknown) + " AND owner = " + c.quote(owner_) +
                   " AND attempt = " + std::to_string(taken_attempt)) == 1;
}

bool ClaimStore::resolve_by_operator(Connection& c, std::string_view idem_token, Status as,
                                     std::string_view note) const {
  if (as != Status::Done && as != Status::Failed)
    throw std::invalid_argument("resolve_by_operator takes done or failed");
  // Only rows the pipeline has let go of: unknown, or pending with nobody's lease.
  return c.execute("UPDATE idemsink_claim SET " + sql_status_is(as) + ", last_error = " +
                   c.quote(sanitize_utf8("resolved by operator: " + std::string(note), kErrorBytes)) +
                   ", lease_until = NULL, updated_at = NOW(3) WHERE idem_token = " + c.quote(idem_token) + " AND (" +
                   sql_status_is(Status::Unknown) + " OR (" + kPendingUnowned + "))") > 0;
}

bool ClaimStore::reopen_failed(Connection& c, const RowKey& row, std::string_view idem_token,
                               std::string_view note) const {
  return c.execute("UPDATE idemsink_claim SET " + sql_status_is(Status::Pending) +
                   // A failed row's calls certainly did not apply (a row settled
                   // failed from unknown was judged so by reconciliation or an
                   // operator): its call mark and uncertain calls go, or the
                   // replay would end unknown without a call.
                   ", owner = NULL, lease_until = NULL, calls = 0, takeovers = 0, uncertain_calls = 0, "
                   "call_started = NULL, "
                   "last_error = " +
                   c.quote(sanitize_utf8(std::string(note), kErrorBytes)) + ", updated_at = NOW(3) WHERE " +
                   where_row(row) + " AND " + sql_status_is(Status::Failed) +
                   " AND idem_token = " + c.quote(idem_token)) == 1;
}

uint64_t ClaimStore::count_stuck(Connection& c, std::chrono::milliseconds stuck_after) const {
  auto rows =
      c.query("SELECT COUNT(*) FROM idemsink_claim WHERE " + kPendingUnowned + " AND updated_at < NOW(3) - INTERVAL " +
              std::to_string(stuck_after.count() * 1000) + " MICROSECOND");
  return rows.empty() ? 0 : std::stoull(*rows[0][0]);
}

uint64_t ClaimStore::renew(Connection& c) const {
  return c.execute("UPDATE idemsink_claim SET lease_until = " + lease_expr() + " WHERE owner = " + c.quote(owner_) +
                   " AND " + kPending);
}

}  // namespace idemsink::claim
