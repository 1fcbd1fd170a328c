// DDL of the claim table and its monthly partition maintenance.
//
// Retention is DROP PARTITION, never DELETE (seed 000: seconds instead of
// hours on a 700-million-row table, no undo). Partitions are created ahead of
// time; a partition is dropped only when its whole month is older than the
// retention, and the pipeline refuses records whose claim could already be
// gone (claim.horizon_margin_days).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "core/db/connection.h"

namespace idemsink::claim {

struct SchemaOptions {
  int retention_days = 90;
  int months_ahead = 3;
};

/// CREATE TABLE of the claim table, with partitions for the months from
/// (now - retention) to (now + months_ahead).
std::string claim_table(std::chrono::system_clock::time_point now, const SchemaOptions& opt);

/// What maintain_partitions did.
struct PartitionReport {
  std::vector<std::string> added;
  std::vector<std::string> dropped;
};

/// Creates the claim table if missing, adds partitions up to now +
/// months_ahead and drops partitions whose month ended more than
/// retention_days ago.
PartitionReport apply_schema(db::Connection& c, std::chrono::system_clock::time_point now, const SchemaOptions& opt);

/// First day of the month `months` away from the month of `t`, "YYYY-MM-01".
std::string month_start(std::chrono::system_clock::time_point t, int months);

}  // namespace idemsink::claim
