// The SQL of idemsink_claim and its key directory, shared by the claim job
// (claim_job.cc), the pipeline's transitions (claim_store.cc) and the exits
// from unknown (claim_settle.cc): the lease rules, the row conditions and the
// column lists, each written once. Internal to the claim module.
#pragma once

#include <array>
#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/claim/claim_store.h"
#include "core/db/connection.h"

namespace idemsink::claim::sql {

// The rules of idemsink_claim's lease.
/// A pending row with no live owner: free to take over.
std::string pending_unowned();
/// An unknown row that no re-drive holds.
std::string unknown_unleased();
/// A row the pipeline let go of: unknown with no re-drive holding it, or
/// pending with nobody's lease (stuck, once old enough).
std::string let_go();
/// "<column> < NOW(3) - INTERVAL <age>".
std::string older_than(std::string_view column, std::chrono::milliseconds age);

/// "DATE'YYYY-MM-01'".
std::string date_literal(const std::string& bucket);

/// "(namespace = X'..' AND biz_key IN (X'..', ...)) OR (...)": one IN list per
/// namespace, which the optimizer turns into primary-key range lookups;
/// `alias` ("k.") qualifies the columns. The keys' buckets play no part.
std::string where_keys(std::span<const RowKey> keys, std::string_view alias = "");
/// "namespace = .. AND biz_key = .. AND bucket = ..": one exact row.
std::string where_row(const RowKey& k);
/// "(<row>) OR ...": exact rows.
std::string where_rows(std::span<const Outcome> rows);
/// "(<row> AND attempt = ..) OR ...": exact row and claim epoch, the fencing
/// condition of every transition.
std::string where_epochs(std::span<const Outcome> outcomes);

// Column sizes of idemsink_claim (schema.cc). Values are made to fit, never
// refused: a statement failing on one row's data would stop the whole batch.
constexpr size_t kReceiptBytes = 1024;
constexpr size_t kErrorBytes = 1024;
/// A receipt longer than its column, cut and saying so; the whole receipt
/// goes to the debug log.
std::string fit_receipt(std::string_view receipt);
/// An error or note as stored in last_error: valid UTF-8, cut to its column.
std::string fit_error(std::string_view error);

/// A SELECT's column list, from the declared columns of one read.
template <size_t N>
std::string select_list(const std::array<std::string_view, N>& columns) {
  std::string out;
  for (const auto c : columns) {
    if (!out.empty()) out += ", ";
    out += c;
  }
  return out;
}

/// A claim row as the claim job and ClaimStore::read() see it.
struct ClaimRow {
  RowKey row;
  Status status = Status::Pending;
  uint32_t attempt = 0;
  std::string idem_token;
  std::optional<std::string> owner;
  bool lease_expired = false;
  std::string payload_hash;
  std::string receipt;
  uint32_t takeovers = 0;
  uint32_t uncertain_calls = 0;
  bool maybe_called = false;  // a call began and was not known to have ended
};
/// The claim rows that govern `keys` (whatever their bucket says), found as
/// `how` says: the row the key directory names, or, in every month, the
/// oldest row of each key first.
std::vector<ClaimRow> read_claim_rows(db::Connection& c, ClaimRead how, std::span<const RowKey> keys);

}  // namespace idemsink::claim::sql
