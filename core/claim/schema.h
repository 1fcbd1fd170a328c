// DDL of the claim table and its monthly partition maintenance.
//
// Retention is DROP PARTITION, never DELETE (seed 000: seconds instead of
// hours on a 700-million-row table, no undo). Partitions are created ahead of
// time; a partition is dropped only when its whole month is older than the
// retention, and the pipeline refuses records whose claim could already be
// gone (claim.horizon_margin_days).
#pragma once

#include <chrono>
#include <functional>
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
/// Reads nothing from the claim, key directory and offsets tables, so that
/// one missing (claim.apply_schema off, the schema never applied) fails now
/// with the server's error naming it.
void check_tables(db::Connection& c);
/// CREATE TABLE of idemsink_meta: settings made once per deployment.
const char* meta_table();
/// The deployment's namespace of derived idem_tokens (a UUID), created on
/// first use when `create`; "" when it does not exist.
std::string token_namespace(db::Connection& c, bool create);

/// The lock every change of the claim table's partitions is made under
/// (a MariaDB named lock): hosts starting together, their running peers'
/// maintenance and `idemsink schema migrate` change them one at a time.
/// Held from construction (if taken within `wait_s` seconds) until
/// release() or destruction, which never throws: an exception leaving the
/// scope releases it.
class PartitionLock {
 public:
  PartitionLock(db::Connection& c, int wait_s);
  ~PartitionLock();
  PartitionLock(const PartitionLock&) = delete;
  PartitionLock& operator=(const PartitionLock&) = delete;

  bool held() const { return held_; }
  void release();

 private:
  db::Connection& c_;
  bool held_ = false;
};

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

/// Whether every claim row has its key directory row (idemsink_meta
/// 'key_directory'): then a claim read looks a key up in the directory and
/// reads the one row it names (two dives), instead of the key in every
/// month's partition (one dive per month kept). True for a claim table made
/// by this version; for an older one once `migrate_claim_schema` has filled
/// the directory in. Never goes back to false.
bool key_directory_complete(db::Connection& c);

struct MigrationReport {
  bool index_added = false;
  bool indexes_dropped = false;
  uint64_t directory_rows_added = 0;
  bool directory_completed = false;  // by this run
};
/// Brings a claim table made by an earlier version to the current layout
/// while hosts run on it (`idemsink schema migrate`): the one status index
/// added online and the two it replaces dropped; the key directory filled in
/// for claim rows that have none (written by versions before it), in
/// batches of `batch` keys, then marked complete. Resumable: each step is
/// skipped once done, and the fill is INSERT IGNORE. Every host must run a
/// version that writes directory rows before it starts (any version since
/// the key directory; an older one's new keys would have none).
MigrationReport migrate_claim_schema(db::Connection& c, const std::function<void(const std::string&)>& progress,
                                     size_t batch = 10000);

/// Partitions beyond the current month (-1: not partitioned).
int months_ahead(db::Connection& c, std::chrono::system_clock::time_point now);

/// First day of the month `months` away from the month of `t`, "YYYY-MM-01".
std::string month_start(std::chrono::system_clock::time_point t, int months);

}  // namespace idemsink::claim
