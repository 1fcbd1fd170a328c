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
  int months_ahead = 0;  // partitions beyond the current month, after the maintenance
};

/// CREATE TABLE of the key directory (one row per key, any month).
const char* key_directory_table();
/// CREATE TABLE of idemsink_meta: settings made once per deployment.
const char* meta_table();
/// The deployment's namespace of derived idem_tokens (a UUID), created on
/// first use when `create`; "" when it does not exist.
std::string token_namespace(db::Connection& c, bool create);

/// Creates the claim table if missing (or brings an older one up to date),
/// then maintains its partitions.
PartitionReport apply_schema(db::Connection& c, std::chrono::system_clock::time_point now, const SchemaOptions& opt);

/// Adds partitions up to now + months_ahead and drops partitions whose month
/// ended more than retention_days ago. Each ALTER waits at most a few seconds
/// for the table's metadata lock (behind a long transaction it throws
/// ER_LOCK_WAIT_TIMEOUT rather than queue every claim statement behind it).
/// A RANGE table takes rows of a dropped
/// middle month into the next partition, so only the end can run out: rows
/// of a month after the newest partition are refused, and this appends.
PartitionReport maintain_partitions(db::Connection& c, std::chrono::system_clock::time_point now,
                                    const SchemaOptions& opt);

/// Partitions beyond the current month (-1: not partitioned).
int months_ahead(db::Connection& c, std::chrono::system_clock::time_point now);

/// First day of the month `months` away from the month of `t`, "YYYY-MM-01".
std::string month_start(std::chrono::system_clock::time_point t, int months);

}  // namespace idemsink::claim
