#include "core/claim/claim_sql.h"

#include <spdlog/spdlog.h>

#include "core/common/util.h"

namespace idemsink::claim::sql {
namespace {

using db::Connection;

// What read_claim_rows() reads, column by column: a row is read by these
// names, never by a position written out.
enum ClaimColumn : size_t {
  kNs,
  kBizKey,
  kBucket,
  kStatus,
  kAttempt,
  kToken,
  kOwner,
  kLeaseExpired,
  kPayloadHash,
  kReceipt,
  kTakeovers,
  kUncertainCalls,
  kMaybeCalled,
  kColumns
};
constexpr std::array<std::string_view, kColumns> kClaimSelect = {"namespace",
                                                                 "biz_key",
                                                                 "bucket",
                                                                 "status",
                                                                 "attempt",
                                                                 "idem_token",
                                                                 "owner",
                                                                 "(lease_until IS NULL OR lease_until < NOW(3))",
                                                                 "payload_hash",
                                                                 "receipt",
                                                                 "takeovers",
                                                                 "uncertain_calls",
                                                                 "call_started IS NOT NULL"};

}  // namespace

std::string pending_unowned() {
  return sql_status_is(Status::Pending) + " AND (owner IS NULL OR lease_until < NOW(3))";
}

std::string unknown_unleased() {
  return sql_status_is(Status::Unknown) + " AND (lease_until IS NULL OR lease_until < NOW(3))";
}

std::string let_go() { return "((" + unknown_unleased() + ") OR (" + pending_unowned() + "))"; }

std::string older_than(std::string_view column, std::chrono::milliseconds age) {
  return std::string(column) + " < NOW(3) - INTERVAL " + std::to_string(age.count() * 1000) + " MICROSECOND";
}

std::string date_literal(const std::string& bucket) { return "DATE'" + bucket + "'"; }

std::string where_row(const RowKey& k) {
  return "namespace = " + Connection::hex(k.ns) + " AND biz_key = " + Connection::hex(k.biz_key) +
         " AND bucket = " + date_literal(k.bucket);
}

std::string where_rows(std::span<const Outcome> rows) {
  std::string out;
  for (const auto& o : rows) {
    if (!out.empty()) out += " OR ";
    out += "(" + where_row(o.row) + ")";
  }
  return out;
}

std::string where_epochs(std::span<const Outcome> outcomes) {
  std::string out;
  for (const auto& o : outcomes) {
    if (!out.empty()) out += " OR ";
    out += "(" + where_row(o.row) + " AND attempt = " + std::to_string(o.attempt) + ")";
  }
  return out;
}

std::string fit_receipt(std::string_view receipt) {
  if (receipt.size() <= kReceiptBytes) return std::string(receipt);
  spdlog::debug("receipt of {} bytes cut to {}: {}", receipt.size(), kReceiptBytes, printable(receipt, receipt.size()));
  const std::string marker = "...[receipt cut: " + std::to_string(receipt.size()) + " bytes]";
  return std::string(receipt.substr(0, kReceiptBytes - marker.size())) + marker;
}

std::string fit_error(std::string_view error) { return sanitize_utf8(error, kErrorBytes); }

std::vector<ClaimRow> read_claim_rows(Connection& c, const std::string& where) {
  std::vector<ClaimRow> out;
  for (auto& r :
       c.query("SELECT " + select_list(kClaimSelect) + " FROM idemsink_claim WHERE " + where + " ORDER BY bucket")) {
    ClaimRow e;
    e.row = RowKey{*r[kNs], *r[kBizKey], *r[kBucket]};
    e.status = static_cast<Status>(std::stoi(*r[kStatus]));
    e.attempt = static_cast<uint32_t>(std::stoul(*r[kAttempt]));
    e.idem_token = *r[kToken];
    e.owner = r[kOwner];
    e.lease_expired = *r[kLeaseExpired] == "1";
    e.payload_hash = r[kPayloadHash].value_or("");
    e.receipt = r[kReceipt].value_or("");
    e.takeovers = static_cast<uint32_t>(std::stoul(*r[kTakeovers]));
    e.uncertain_calls = static_cast<uint32_t>(std::stoul(*r[kUncertainCalls]));
    e.maybe_called = *r[kMaybeCalled] == "1";
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace idemsink::claim::sql
