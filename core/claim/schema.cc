#include "core/claim/schema.h"

#include "core/claim/offset_moves.h"
#include "core/claim/offsets.h"
#include "core/claim/order_hold.h"
#include "core/common/util.h"

#include <ctime>
#include <optional>
#include <set>
#include <utility>

namespace idemsink::claim {
namespace {

struct YearMonth {
  int year;
  int month;  // 1..12
  YearMonth plus(int months) const {
    int idx = year * 12 + (month - 1) + months;
    return {idx / 12, idx % 12 + 1};
  }
  std::string start() const {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%04d-%02d-01", year, month);
    return buf;
  }
  std::string partition_name() const {
    char buf[32];
    std::snprintf(buf, sizeof buf, "p%04d%02d", year, month);
    return buf;
  }
  bool operator<(const YearMonth& o) const { return year * 12 + month < o.year * 12 + o.month; }
};

YearMonth year_month(std::chrono::system_clock::time_point t) {
  std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  return {tm.tm_year + 1900, tm.tm_mon + 1};
}

// Months from `from` to the month of partition `name` ("pYYYYMM").
int months_between(const YearMonth& from, const std::string& name) {
  const int year = std::stoi(name.substr(1, 4)), month = std::stoi(name.substr(5, 2));
  return (year * 12 + month) - (from.year * 12 + from.month);
}

// A DDL statement waits at most this long for the table's metadata lock. A
// waiting ALTER queues every later statement on the table behind it (claims
// included), so behind a long transaction (a mysqldump
// --single-transaction) it gives up soon and is tried at the next
// maintenance round instead.
constexpr int kDdlLockWaitSeconds = 5;

void run_ddl(db::Connection& c, const std::string& ddl) {
  c.execute("SET STATEMENT lock_wait_timeout = " + std::to_string(kDdlLockWaitSeconds) + " FOR " + ddl);
}

std::string partition_def(const YearMonth& ym) {
  return "PARTITION " + ym.partition_name() + " VALUES LESS THAN ('" + ym.plus(1).start() + "')";
}

// The oldest month whose partition must still exist: its end is within retention.
YearMonth oldest_kept(std::chrono::system_clock::time_point now, int retention_days) {
  return year_month(now - std::chrono::hours(24) * retention_days);
}

// One status index serves the lease sweeps (status, owner), the renewal
// (owner's pending rows), reconciliation and the stuck count (status,
// updated_at): the done mark rewrites one secondary entry, not two (the
// layout before had (owner, status) and (status, updated_at); `idemsink
// schema migrate` brings such a table here while hosts run).
constexpr const char* kClaimTable = R"(CREATE TABLE IF NOT EXISTS idemsink_claim (
  namespace     VARBINARY(64)   NOT NULL COMMENT 'route name',
  biz_key       VARBINARY(255)  NOT NULL COMMENT 'business key, exact bytes',
  bucket        DATE            NOT NULL COMMENT 'first day of the month of the record timestamp; partition key',
  status        TINYINT         NOT NULL COMMENT '1 pending, 2 done, 3 failed, 4 unknown',
  attempt       INT UNSIGNED    NOT NULL COMMENT 'claim epoch, +1 on every takeover; fences a zombie owner',
  idem_token    CHAR(36) CHARACTER SET ascii NOT NULL COMMENT 'sent to the remote as its idempotency key; never changes',
  owner         VARCHAR(128)    NULL COMMENT 'host id # run id; NULL when released',
  lease_until   DATETIME(3)     NULL COMMENT 'others may take a pending row over after this',
  payload_hash  BINARY(16)      NOT NULL COMMENT 'XXH3-128 of the record value',
  receipt       VARBINARY(1024) NULL COMMENT 'what the handler returned on success',
  last_error    VARCHAR(1024)   NULL,
  calls         INT UNSIGNED    NOT NULL DEFAULT 0 COMMENT 'handler calls made, recorded on the final transition',
  takeovers     INT UNSIGNED    NOT NULL DEFAULT 0 COMMENT 'times taken from an owner that had not released it (crash-loop guard)',
  uncertain_calls INT UNSIGNED  NOT NULL DEFAULT 0 COMMENT 'calls with an uncertain outcome: the effect may have happened',
  call_started  DATETIME(3)     NULL COMMENT 'at-most-once: a call may have started (written before it goes out); kept until its outcome is known',
  src_topic     VARCHAR(249)    NOT NULL,
  src_partition INT             NOT NULL,
  src_offset    BIGINT          NOT NULL,
  created_at    DATETIME(3)     NOT NULL,
  updated_at    DATETIME(3)     NOT NULL,
  PRIMARY KEY (namespace, biz_key, bucket),
  KEY idx_status_owner (status, owner, updated_at),
  KEY idx_token (idem_token)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4
PARTITION BY RANGE COLUMNS (bucket) ()";

// The key directory: one row per (namespace, biz_key), naming the month
// whose claim row governs the key. The claim statement inserts here first, so
// two records of one key dated in different months (claimed at the same
// instant by two hosts) cannot both insert a claim row: the primary key here
// is month-independent, which the partitioned table's cannot be. Rows of a
// month past retention are deleted (in batches) before its partition is
// dropped.
constexpr const char* kKeyDirectory = R"(CREATE TABLE IF NOT EXISTS idemsink_claim_key (
  namespace     VARBINARY(64)   NOT NULL,
  biz_key       VARBINARY(255)  NOT NULL,
  bucket        DATE            NOT NULL COMMENT 'the month of the claim row that governs the key',
  PRIMARY KEY (namespace, biz_key),
  KEY idx_bucket (bucket)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4)";

constexpr size_t kDirectoryDeleteBatch = 10000;

// idemsink_meta's row saying every claim row has its key directory row.
constexpr const char* kDirectoryComplete = "key_directory";

bool table_exists(db::Connection& c, const std::string& table) {
  return !c.query("SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = " +
                  c.quote(table))
              .empty();
}

bool claim_index_exists(db::Connection& c, const std::string& index) {
  return !c.query(
               "SELECT 1 FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = "
               "'idemsink_claim' AND INDEX_NAME = " +
               c.quote(index) + " LIMIT 1")
              .empty();
}

void mark_directory_complete(db::Connection& c) {
  c.execute(std::string("INSERT IGNORE INTO idemsink_meta (name, value, created_at) VALUES ('") + kDirectoryComplete +
            "', 'complete', NOW(3))");
}

// One batch of the key directory's fill: directory rows for the keys after
// `after` whose claim rows have none. Rows are read in primary-key order
// (each month's index merged in order: no sort, nothing read twice); a key's
// rows are adjacent, so the last key of a full batch, whose rows may go on,
// waits for the next batch. A key with rows in several months (two records
// claimed at once by a version before the directory) gets the newest: its
// directory row then lives as long as any of its rows, since retention drops
// the oldest month first and deletes the directory rows of the month it
// drops. Returns the last key done, or nothing at the end of the table.
using Key = std::pair<std::string, std::string>;
std::optional<Key> backfill_batch(db::Connection& c, const std::optional<Key>& after, size_t batch, uint64_t& added) {
  std::string where;
  if (after)
    where = " WHERE namespace > " + db::Connection::hex(after->first) +
            " OR (namespace = " + db::Connection::hex(after->first) + " AND biz_key > " +
            db::Connection::hex(after->second) + ")";
  const auto rows = c.query("SELECT namespace, biz_key, bucket FROM idemsink_claim" + where +
                            " ORDER BY namespace, biz_key, bucket LIMIT " + std::to_string(batch));
  if (rows.empty()) return std::nullopt;
  struct Newest {
    Key key;
    std::string bucket;
  };
  std::vector<Newest> keys;
  for (const auto& r : rows) {
    if (keys.empty() || keys.back().key.first != *r[0] || keys.back().key.second != *r[1]) {
      keys.push_back(Newest{{*r[0], *r[1]}, *r[2]});
    } else {
      keys.back().bucket = *r[2];  // rows come oldest month first
    }
  }
  if (rows.size() == batch && keys.size() > 1) keys.pop_back();
  std::string insert = "INSERT IGNORE INTO idemsink_claim_key (namespace, biz_key, bucket) VALUES ";
  for (size_t i = 0; i < keys.size(); ++i)
    insert += (i ? ", (" : "(") + db::Connection::hex(keys[i].key.first) + ", " +
              db::Connection::hex(keys[i].key.second) + ", DATE'" + keys[i].bucket + "')";
  added += c.execute(insert);
  return keys.back().key;
}

}  // namespace

const char* key_directory_table() { return kKeyDirectory; }

void check_tables(db::Connection& c) {
  for (const char* table : {"idemsink_claim", "idemsink_claim_key", "idemsink_offsets"})
    c.query(std::string("SELECT 1 FROM ") + table + " LIMIT 0");
}

const char* meta_table() {
  return R"(CREATE TABLE IF NOT EXISTS idemsink_meta (
  name          VARCHAR(64)     NOT NULL,
  value         VARCHAR(255)    NOT NULL,
  created_at    DATETIME(3)     NOT NULL,
  PRIMARY KEY (name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4)";
}

std::string token_namespace(db::Connection& c, bool create) {
  // Created once per deployment, by the first host to apply the schema; the
  // same row on every replica, so a failover keeps the tokens.
  if (create)
    c.execute("INSERT IGNORE INTO idemsink_meta (name, value, created_at) VALUES ('token_namespace', " +
              c.quote(random_uuid()) + ", NOW(3))");
  auto rows = c.query("SELECT value FROM idemsink_meta WHERE name = 'token_namespace'");
  return rows.empty() ? "" : rows[0][0].value_or("");
}

std::string month_start(std::chrono::system_clock::time_point t, int months) {
  return year_month(t).plus(months).start();
}

std::string claim_table(std::chrono::system_clock::time_point now, const SchemaOptions& opt) {
  std::string claim = kClaimTable;
  const YearMonth first = oldest_kept(now, opt.retention_days), last = year_month(now).plus(opt.months_ahead);
  for (YearMonth ym = first; !(last < ym); ym = ym.plus(1)) {
    if (ym.year != first.year || ym.month != first.month) claim += ",";
    claim += "\n  " + partition_def(ym);
  }
  claim += "\n)";
  return claim;
}

namespace {
constexpr const char* kPartitionLock = "'idemsink_claim_partitions'";
}  // namespace

PartitionLock::PartitionLock(db::Connection& c, int wait_s) : c_(c) {
  held_ = c.query(std::string("SELECT GET_LOCK(") + kPartitionLock + ", " + std::to_string(wait_s) + ")").at(0).at(0) ==
          "1";
}

PartitionLock::~PartitionLock() {
  try {
    release();
  } catch (...) {
    // A connection gone takes its named locks with it.
  }
}

void PartitionLock::release() {
  if (!held_) return;
  held_ = false;
  c_.query(std::string("SELECT RELEASE_LOCK(") + kPartitionLock + ")");
}

PartitionReport apply_schema(db::Connection& c, std::chrono::system_clock::time_point now, const SchemaOptions& opt) {
  c.execute(meta_table());
  const bool claims_existed = table_exists(c, "idemsink_claim");
  c.execute(claim_table(now, opt));
  c.execute(kKeyDirectory);
  // A claim table made here has no row without its directory row: the claim
  // read may use the directory alone from the first record.
  if (!claims_existed) mark_directory_complete(c);
  c.execute(OffsetStore::schema());
  c.execute(OrderHolds::schema());
  c.execute(OffsetMoves::schema());
  // Columns added since the first release; instant on InnoDB.
  run_ddl(c,
          "ALTER TABLE idemsink_claim ADD COLUMN IF NOT EXISTS uncertain_calls INT UNSIGNED NOT NULL DEFAULT 0 COMMENT "
          "'calls with an uncertain outcome: the effect may have happened' AFTER takeovers");
  run_ddl(c,
          "ALTER TABLE idemsink_claim ADD COLUMN IF NOT EXISTS call_started DATETIME(3) NULL COMMENT 'at-most-once: a "
          "call may have started (written before it goes out); kept until its outcome is known' AFTER uncertain_calls");

  // Tables made before routes could begin at "latest" by time.
  run_ddl(c,
          "ALTER TABLE idemsink_offsets ADD COLUMN IF NOT EXISTS first_offset BIGINT NULL COMMENT 'where the group "
          "began the partition (start_at latest, no commit anywhere); the audit reads from here' AFTER next_offset");
  run_ddl(c,
          "ALTER TABLE idemsink_offsets ADD COLUMN IF NOT EXISTS began_at DATETIME(3) NULL COMMENT 'start_at latest: "
          "when the group began the topic; a partition it never committed begins at the first record stamped then or "
          "later' AFTER first_offset");

  return maintain_partitions(c, now, opt);
}

PartitionReport maintain_partitions(db::Connection& c, std::chrono::system_clock::time_point now,
                                    const SchemaOptions& opt) {
  PartitionReport report;
  std::set<std::string> existing;
  for (auto& r : c.query("SELECT PARTITION_NAME FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = DATABASE() "
                         "AND TABLE_NAME = 'idemsink_claim' AND PARTITION_NAME IS NOT NULL"))
    existing.insert(*r[0]);
  if (existing.empty())
    throw db::DbError(0, "idemsink_claim exists but is not partitioned by month; it was not created by idemsink");

  // Add missing months after the newest partition (RANGE partitions can only
  // be appended at the end).
  std::string newest = *existing.rbegin();  // pYYYYMM sorts by time
  const YearMonth last = year_month(now).plus(opt.months_ahead);
  YearMonth ym{std::stoi(newest.substr(1, 4)), std::stoi(newest.substr(5, 2))};
  for (ym = ym.plus(1); !(last < ym); ym = ym.plus(1)) {
    run_ddl(c, "ALTER TABLE idemsink_claim ADD PARTITION (" + partition_def(ym) + ")");
    report.added.push_back(ym.partition_name());
    newest = ym.partition_name();
  }

  // Drop whole months older than the retention; the newest always stays (a
  // RANGE-partitioned table needs at least one partition).
  const std::string keep_from = oldest_kept(now, opt.retention_days).partition_name();
  for (const auto& name : existing) {
    if (name < keep_from && name != newest) {
      // The month's directory rows first: a crash between leaves claim rows
      // without a directory row rather than directory rows without claims.
      // Harmless: those rows are past retention, so their keys' records are
      // refused (beyond the replay horizon) and the month goes at the next
      // round; a key's directory row names its newest row (the fill picks
      // the newest; a claim adds a row only for a key without one), so no
      // row of a newer month loses its directory row here.
      const std::string month = "DATE'" + name.substr(1, 4) + "-" + name.substr(5, 2) + "-01'";
      while (c.execute("DELETE FROM idemsink_claim_key WHERE bucket = " + month + " LIMIT " +
                       std::to_string(kDirectoryDeleteBatch)) == kDirectoryDeleteBatch) {
      }
      run_ddl(c, "ALTER TABLE idemsink_claim DROP PARTITION " + name);
      report.dropped.push_back(name);
    }
  }
  report.months_ahead = months_between(year_month(now), newest);
  return report;
}

bool key_directory_complete(db::Connection& c) {
  // No idemsink_meta (a schema a DBA applied from `schema print`): not known
  // complete, so claims are read in every month (always right, slower).
  if (!table_exists(c, "idemsink_meta")) return false;
  return !c.query(std::string("SELECT 1 FROM idemsink_meta WHERE name = '") + kDirectoryComplete +
                  "' AND value = 'complete'")
              .empty();
}

MigrationReport migrate_claim_schema(db::Connection& c, const std::function<void(const std::string&)>& progress,
                                     size_t batch) {
  MigrationReport report;
  c.execute(meta_table());
  // Online: InnoDB builds the index while claims go on (LOCK=NONE); the
  // metadata lock is taken only at its start and end, and given up after a
  // few seconds behind a long transaction (run the command again).
  if (!claim_index_exists(c, "idx_status_owner")) {
    progress("adding index idx_status_owner (status, owner, updated_at), online");
    run_ddl(c,
            "ALTER TABLE idemsink_claim ADD INDEX idx_status_owner (status, owner, updated_at), ALGORITHM=INPLACE, "
            "LOCK=NONE");
    report.index_added = true;
  }
  if (claim_index_exists(c, "idx_owner_status") || claim_index_exists(c, "idx_status_updated")) {
    progress("dropping indexes idx_owner_status and idx_status_updated");
    run_ddl(c,
            "ALTER TABLE idemsink_claim DROP INDEX IF EXISTS idx_owner_status, DROP INDEX IF EXISTS "
            "idx_status_updated, ALGORITHM=INPLACE, LOCK=NONE");
    report.indexes_dropped = true;
  }
  if (!key_directory_complete(c)) {
    progress("key directory: adding the rows of keys claimed by versions before it");
    // Each batch under the lock partition maintenance takes: a month is not
    // dropped between a batch's read of its rows and its directory rows
    // going in (which would leave directory rows naming a dropped month).
    auto locked_batch = [&](const std::optional<Key>& from) {
      PartitionLock lock(c, 60);
      if (!lock.held())
        throw db::DbError(0,
                          "schema migrate: partition maintenance held its lock for 60 s; the fill stopped where it "
                          "was, run the command again");
      auto next = backfill_batch(c, from, batch, report.directory_rows_added);
      lock.release();
      return next;
    };
    std::optional<Key> after;
    for (uint64_t batches = 1; (after = locked_batch(after)); ++batches)
      if (batches % 100 == 0)
        progress("key directory: " + std::to_string(batches * batch) + " rows read, " +
                 std::to_string(report.directory_rows_added) + " directory rows added");
    mark_directory_complete(c);
    report.directory_completed = true;
    progress("key directory: complete, " + std::to_string(report.directory_rows_added) +
             " rows added; hosts now read claims through it alone");
  }
  return report;
}

int months_ahead(db::Connection& c, std::chrono::system_clock::time_point now) {
  auto rows = c.query(
      "SELECT MAX(PARTITION_NAME) FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = DATABASE() "
      "AND TABLE_NAME = 'idemsink_claim' AND PARTITION_NAME IS NOT NULL");
  if (rows.empty() || !rows[0][0]) return -1;
  return months_between(year_month(now), *rows[0][0]);
}

}  // namespace idemsink::claim
