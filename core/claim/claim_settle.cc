// The exits from unknown and from a stuck pending row (claim_store.h):
// the reconciler's list, its resolutions and re-drives, the operator's.
#include <stdexcept>

#include "core/claim/claim_sql.h"
#include "core/claim/claim_store.h"

namespace idemsink::claim {
namespace {

using db::Connection;
using namespace sql;

// What unsettled() reads, column by column.
enum UnsettledColumn : size_t {
  kNs,
  kBizKey,
  kBucket,
  kStatus,
  kAttempt,
  kCalls,
  kToken,
  kSrcTopic,
  kSrcPartition,
  kSrcOffset,
  kLastError,
  kUpdatedAt,
  kColumns
};
constexpr std::array<std::string_view, kColumns> kUnsettledSelect = {"namespace",
                                                                     "biz_key",
                                                                     "bucket",
                                                                     "status",
                                                                     "attempt",
                                                                     "calls",
                                                                     "idem_token",
                                                                     "src_topic",
                                                                     "src_partition",
                                                                     "src_offset",
                                                                     "IFNULL(last_error, '')",
                                                                     "updated_at"};

}  // namespace

std::vector<ClaimStore::Unsettled> ClaimStore::unsettled(Connection& c, std::span<const Namespace> namespaces,
                                                         std::chrono::milliseconds stuck_after, size_t limit,
                                                         bool include_leased) const {
  // Unknown rows of one route: no re-drive holding them, and (for the
  // reconciler) their newest call began long enough ago to have landed.
  auto unknown = [&](std::chrono::milliseconds reconcile_after) {
    std::string w = include_leased ? sql_status_is(Status::Unknown) : unknown_unleased();
    if (reconcile_after.count() > 0) w += " AND " + older_than("IFNULL(call_started, updated_at)", reconcile_after);
    return "(" + w + ")";
  };
  const std::string stuck = "(" + pending_unowned() + " AND " + older_than("updated_at", stuck_after) + ")";
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
  for (auto& r : c.query("SELECT " + select_list(kUnsettledSelect) + " FROM idemsink_claim WHERE " + where +
                         " ORDER BY updated_at LIMIT " + std::to_string(limit))) {
    Unsettled u;
    u.row = RowKey{*r[kNs], *r[kBizKey], *r[kBucket]};
    u.status = static_cast<Status>(std::stoi(*r[kStatus]));
    u.attempt = static_cast<uint32_t>(std::stoul(*r[kAttempt]));
    u.calls = static_cast<uint32_t>(std::stoul(*r[kCalls]));
    u.idem_token = *r[kToken];
    u.src_topic = *r[kSrcTopic];
    u.src_partition = std::stoi(*r[kSrcPartition]);
    u.src_offset = std::stoll(*r[kSrcOffset]);
    u.last_error = *r[kLastError];
    u.updated_at = *r[kUpdatedAt];
    out.push_back(std::move(u));
  }
  return out;
}

bool ClaimStore::resolve_applied(Connection& c, const RowKey& row, uint32_t attempt, std::string_view receipt) const {
  return c.execute("UPDATE idemsink_claim SET " + sql_status_is(Status::Done) +
                   ", receipt = " + Connection::hex(fit_receipt(receipt)) +
                   ", last_error = 'reconciled: the effect happened', lease_until = NULL, updated_at = NOW(3) WHERE " +
                   where_row(row) + " AND attempt = " + std::to_string(attempt) + " AND " + let_go()) == 1;
}

bool ClaimStore::resolve_not_applied(Connection& c, const RowKey& row, uint32_t attempt, std::string_view why) const {
  return c.execute("UPDATE idemsink_claim SET " + sql_status_is(Status::Failed) + ", last_error = " +
                   c.quote(fit_error("reconciled: the effect never happened: " + std::string(why))) +
                   ", lease_until = NULL, updated_at = NOW(3) WHERE " + where_row(row) +
                   " AND attempt = " + std::to_string(attempt) + " AND " + unknown_unleased()) == 1;
}

void ClaimStore::note_undecided(Connection& c, std::span<const Outcome> rows) const {
  if (rows.empty()) return;
  c.execute("UPDATE idemsink_claim SET updated_at = NOW(3) WHERE " + unknown_unleased() + " AND (" +
            where_epochs(rows) + ")");
}

bool ClaimStore::take_for_redrive(Connection& c, const RowKey& row, uint32_t attempt,
                                  std::chrono::milliseconds hold) const {
  return c.execute("UPDATE idemsink_claim SET attempt = attempt + 1, call_started = NOW(3), owner = " +
                   c.quote(owner_) + ", lease_until = NOW(3) + INTERVAL " + std::to_string(hold.count() * 1000) +
                   " MICROSECOND, updated_at = NOW(3) WHERE " + where_row(row) +
                   " AND attempt = " + std::to_string(attempt) + " AND " + unknown_unleased()) == 1;
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
      set = sql_status_is(Status::Failed) +
            ", last_error = " + c.quote(fit_error("re-driven after reconcile: " + std::string(detail)));
      break;
    case RedriveResult::Undecided:
      set = "last_error = " + c.quote(fit_error("re-driven after reconcile, uncertain again: " + std::string(detail)));
      break;
  }
  return c.execute("UPDATE idemsink_claim SET " + set + ", calls = " + std::to_string(calls) +
                   ", lease_until = NULL, updated_at = NOW(3) WHERE " + where_row(row) + " AND " +
                   sql_status_is(Status::Unknown) + " AND owner = " + c.quote(owner_) +
                   " AND attempt = " + std::to_string(taken_attempt)) == 1;
}

ClaimStore::OperatorResolution ClaimStore::resolve_by_operator(Connection& c, std::string_view idem_token, Status as,
                                                               std::string_view note) const {
  if (as != Status::Done && as != Status::Failed)
    throw std::invalid_argument("resolve_by_operator takes done or failed");
  if (!plausible_token(idem_token)) return {};
  // Only rows the pipeline has let go of: unknown with no re-drive holding
  // it, or pending with nobody's lease.
  if (c.execute("UPDATE idemsink_claim SET " + sql_status_is(as) +
                ", last_error = " + c.quote(fit_error("resolved by operator: " + std::string(note))) +
                ", lease_until = NULL, updated_at = NOW(3) WHERE idem_token = " + c.quote(idem_token) + " AND " +
                let_go()) > 0)
    return {true, std::nullopt};
  for (auto& r : c.query("SELECT IFNULL(owner, ''), lease_until FROM idemsink_claim WHERE idem_token = " +
                         c.quote(idem_token) + " AND " + sql_status_is(Status::Unknown) + " AND lease_until >= NOW(3)"))
    return {false, *r[0] + " until " + r[1].value_or("?")};
  return {};
}

std::vector<ClaimStore::Settled> ClaimStore::read_settled(Connection& c, std::span<const std::string> tokens) const {
  std::vector<Settled> out;
  std::string in;
  for (const auto& t : tokens)
    if (plausible_token(t)) in += (in.empty() ? "" : ", ") + c.quote(t);
  if (in.empty()) return out;
  for (auto& row : c.query("SELECT namespace, biz_key, bucket, status, attempt, idem_token, IFNULL(receipt, ''), "
                           "IFNULL(last_error, ''), src_topic, src_partition, src_offset, calls FROM idemsink_claim "
                           "WHERE idem_token IN (" +
                           in + ")")) {
    Settled& s = out.emplace_back();
    s.row = RowKey{*row[0], *row[1], *row[2]};
    s.status = static_cast<Status>(std::stoi(*row[3]));
    s.attempt = static_cast<uint32_t>(std::stoul(*row[4]));
    s.idem_token = *row[5];
    s.receipt = *row[6];
    s.last_error = *row[7];
    s.source() = {*row[8], std::stoi(*row[9]), std::stoll(*row[10])};
    s.calls = static_cast<uint32_t>(std::stoul(*row[11]));
  }
  return out;
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
                   c.quote(fit_error(std::string(note))) + ", updated_at = NOW(3) WHERE " + where_row(row) + " AND " +
                   sql_status_is(Status::Failed) + " AND idem_token = " + c.quote(idem_token)) == 1;
}

uint64_t ClaimStore::count_stuck(Connection& c, std::chrono::milliseconds stuck_after) const {
  auto rows = c.query("SELECT COUNT(*) FROM idemsink_claim WHERE " + pending_unowned() + " AND " +
                      older_than("updated_at", stuck_after));
  return rows.empty() ? 0 : std::stoull(*rows[0][0]);
}

}  // namespace idemsink::claim
