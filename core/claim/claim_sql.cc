#include "core/claim/claim_sql.h"

#include <spdlog/spdlog.h>

#include <map>

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
constexpr std::array<std::string_view, kColumns> kClaimSelect = {"c.namespace",
                                                                 "c.biz_key",
                                                                 "c.bucket",
                                                                 "c.status",
                                                                 "c.attempt",
                                                                 "c.idem_token",
                                                                 "c.owner",
                                                                 "(c.lease_until IS NULL OR c.lease_until < NOW(3))",
                                                                 "c.payload_hash",
                                                                 "c.receipt",
                                                                 "c.takeovers",
                                                                 "c.uncertain_calls",
                                                                 "c.call_started IS NOT NULL"};

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

std::string where_keys(std::span<const RowKey> keys, std::string_view alias) {
  std::map<std::string, std::vector<std::string>> by_ns;
  for (const auto& k : keys) by_ns[k.ns].push_back(Connection::hex(k.biz_key));
  std::string out;
  for (const auto& [ns, hex_keys] : by_ns) {
    if (!out.empty()) out += " OR ";
    out +=
        "(" + std::string(alias) + "namespace = " + Connection::hex(ns) + " AND " + std::string(alias) + "biz_key IN (";
    for (size_t i = 0; i < hex_keys.size(); ++i) out += (i ? ", " : "") + hex_keys[i];
    out += "))";
  }
  return out;
}

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

std::vector<ClaimRow> read_claim_rows(Connection& c, ClaimRead how, std::span<const RowKey> keys) {
  std::vector<ClaimRow> out;
  if (keys.empty()) return out;
  // Through the directory: a primary-key dive per key there, then an eq_ref
  // on the claim's full primary key, which reads the one month's partition
  // it names. In every month: one dive per partition per key.
  const std::string sql =
      how == ClaimRead::KeyDirectory
          ? "SELECT " + select_list(kClaimSelect) +
                " FROM idemsink_claim_key k JOIN idemsink_claim c ON c.namespace = k.namespace AND c.biz_key = "
                "k.biz_key AND c.bucket = k.bucket WHERE " +
                where_keys(keys, "k.")
          : "SELECT " + select_list(kClaimSelect) + " FROM idemsink_claim c WHERE " + where_keys(keys, "c.") +
                " ORDER BY c.bucket";
  for (auto& r : c.query(sql)) {
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
