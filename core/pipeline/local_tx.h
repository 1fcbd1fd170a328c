// local_tx: the plugin's business write and the claim's `done` commit in one
// database transaction, so the effect happens exactly once by construction.
//
// Records are applied in batches of up to 100 per route, one transaction per
// batch: run each record's apply, write the rows the records that reported
// ok queued (tx_write_row: one multi-row statement per table and shape),
// then one done-UPDATE, the records' outcome events if the route publishes
// them, and COMMIT. The done-UPDATE is the fence: it changes only claims
// still pending, ours and at our epoch, and a claim it cannot change (taken
// over since) rolls the whole transaction back. So does a record that must
// be undone alone: one that did not report ok after running a statement of
// its own, or whose queued row the database refuses. The batch then runs
// again carefully: the claims still ours locked first (SELECT ... FOR
// UPDATE), a savepoint per record (its queued rows written inside it), so
// that record's writes roll back to it and the others commit. Most batches
// pay for neither the lock nor savepoints. A deadlock or a lost connection inside a statement breaks the
// transaction and the whole job is re-run. A statement the database refuses
// for its data (a value too long for its column) ends its record
// db_rejected and the batch goes on. A job failing for any other reason is
// given up after database.job_give_up_after: its records are let go
// uncommitted, never re-run forever.
#pragma once

#include "core/common/asio.h"
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/claim/claim_store.h"
#include "core/db/pool.h"
#include "core/dlq/outbox.h"
#include "core/pipeline/record.h"

namespace idemsink::plugin {
class DeferredRows;
}

namespace idemsink::pipeline {

class EngineDoors;

class LocalTxRunner {
 public:
  struct Result {
    uint64_t id = 0;
    idemsink_outcome outcome = IDEMSINK_OUTCOME_RETRYABLE;  // OK: committed and marked done
    std::string detail;
    /// The claim was no longer ours (taken over, or an earlier run of this
    /// job whose reply was lost committed it): nothing was applied here.
    bool fenced = false;
    /// The database refused the record's write for its data (MariaDB's
    /// error): rolled back to the record's savepoint, nothing applied; the
    /// other records of the batch went on.
    std::string db_refused;
    /// The job kept failing for another reason than the connection for
    /// database.job_give_up_after (`detail` says why): nothing applied.
    bool gave_up = false;
  };
  /// `outbox` and `host`: the outcome events ([route.output]) written in
  /// the records' transaction. Each apply job's results go to
  /// `doors.on_local_tx_results`.
  LocalTxRunner(boost::asio::io_context& io, db::Pool& pool, const claim::ClaimStore& store, const dlq::Outbox& outbox,
                std::string host, int max_jobs, EngineDoors& doors);

  /// Queues a record (stage Calling) for its route's next apply job.
  void add(Record& r);
  /// Whether records of the route are queued or in an apply job (whose
  /// database worker reads the route's settings).
  bool busy(Route& route) const;

 private:
  struct Lane {
    std::vector<uint64_t> waiting;
    int jobs = 0;
    bool scheduled = false;
  };
  void flush(Route& route);
  std::vector<Result> apply(db::Connection& c, Route& route, const std::vector<uint64_t>& ids,
                            const std::vector<const Record*>& recs, const std::vector<claim::Outcome>& outcomes);
  /// Fenced by the done mark alone, or claims locked first and a savepoint
  /// per record: see the top of this file.
  enum class Pass { Optimistic, Careful };
  /// One transaction over the records; false when the optimistic pass was
  /// rolled back for the careful one.
  bool apply_in_one_transaction(db::Connection& c, Route& route, std::span<const uint64_t> ids,
                                std::span<const Record* const> recs, std::span<const claim::Outcome> outcomes,
                                std::span<Result> results, Pass pass);
  /// The plugin's apply of one record, writing through `tx`: what it
  /// reported (retryable when it reported nothing).
  Result call_apply(idemsink_tx& tx, Route& route, const Record& rec);
  /// Careful pass: the record's queued rows written under its savepoint; a
  /// row refused ends only this record (`applied`, `res` say so).
  void write_own_rows(db::Connection& c, idemsink_tx& tx, Result& applied, Result& res);
  /// After the last apply: the queued rows, the claims marked done, the
  /// outcome events, then the commit; false when rolled back for the careful pass.
  bool finish_transaction(db::Connection& c, bool per_record, plugin::DeferredRows& rows,
                          const std::vector<claim::Outcome>& ok, const std::vector<dlq::Letter>& events);

  boost::asio::io_context& io_;
  db::Pool& pool_;
  const claim::ClaimStore& store_;
  const dlq::Outbox& outbox_;
  const std::string host_;
  const int max_jobs_;
  EngineDoors& doors_;
  std::map<Route*, Lane> lanes_;
};

}  // namespace idemsink::pipeline
