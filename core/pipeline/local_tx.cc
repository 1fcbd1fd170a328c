#include "core/pipeline/local_tx.h"

#include "core/pipeline/engine_doors.h"

#include <mysqld_error.h>

#include <algorithm>
#include <memory>

#include "core/common/fault.h"
#include "core/db/isolate.h"
#include "core/pipeline/record_outputs.h"
#include "core/plugin/calls.h"
#include "core/plugin/tx.h"

namespace idemsink::pipeline {

namespace asio = boost::asio;

namespace {

constexpr size_t kBatch = 100;

// A queued row's write failed but the transaction stands (anything but a
// lost connection or a deadlock).
bool row_write_failed(const db::DbError& e) {
  const auto cls = e.error_class();
  return cls != db::ErrorClass::ConnectionLost && cls != db::ErrorClass::Transient;
}

// Refused as written: its data, or a key or reference it breaks, would be
// refused again; the record ends (db_rejected). Anything else, the record
// is tried again later.
bool refused_as_written(const db::DbError& e) {
  switch (e.code()) {
    case ER_DUP_ENTRY:
    case ER_DUP_ENTRY_WITH_KEY_NAME:
    case ER_NO_REFERENCED_ROW_2:
    case ER_NO_DEFAULT_FOR_FIELD: return true;
    default: return e.error_class() == db::ErrorClass::Data;
  }
}

}  // namespace

LocalTxRunner::LocalTxRunner(asio::io_context& io, db::Pool& pool, const claim::ClaimStore& store,
                             const dlq::Outbox& outbox, std::string host, int max_jobs, EngineDoors& doors)
    : io_(io),
      pool_(pool),
      store_(store),
      outbox_(outbox),
      host_(std::move(host)),
      max_jobs_(std::max(1, max_jobs)),
      doors_(doors) {}

void LocalTxRunner::add(Record& r) {
  Route& route = *r.route;
  Lane& lane = lanes_[&route];
  lane.waiting.push_back(r.id);
  if (lane.scheduled) return;
  lane.scheduled = true;
  asio::post(io_, [this, &route] {
    lanes_[&route].scheduled = false;
    flush(route);
  });
}

bool LocalTxRunner::busy(Route& route) const {
  const auto it = lanes_.find(&route);
  return it != lanes_.end() && (it->second.jobs > 0 || it->second.scheduled || !it->second.waiting.empty());
}

void LocalTxRunner::flush(Route& route) {
  Lane& lane = lanes_[&route];
  while (!lane.waiting.empty() && lane.jobs < max_jobs_) {
    const size_t n = std::min(lane.waiting.size(), kBatch);
    std::vector<uint64_t> ids(lane.waiting.begin(), lane.waiting.begin() + static_cast<long>(n));
    lane.waiting.erase(lane.waiting.begin(), lane.waiting.begin() + static_cast<long>(n));
    // The job reads the records' immutable message data from the database
    // thread. Records in stage Calling are never dropped or retired until the
    // job's result is back on this thread, so the pointers stay valid.
    std::vector<const Record*> recs;
    std::vector<claim::Outcome> outcomes;
    for (uint64_t id : ids) {
      const Record* r = doors_.find(id);
      recs.push_back(r);
      outcomes.push_back(r->outcome());
    }
    ++lane.jobs;
    auto report = [this, &route](std::vector<Result> results) {
      asio::post(io_, [this, &route, results = std::move(results)]() mutable {
        --lanes_[&route].jobs;
        doors_.on_local_tx_results(std::move(results));
        flush(route);
      });
    };
    pool_.submit(
        "local_tx apply",
        [this, &route, ids, recs, outcomes, report](db::Connection& c) {
          report(apply(c, route, ids, recs, outcomes));
        },
        [ids, report](const db::DbError& e) {
          std::vector<Result> results(ids.size());
          for (size_t i = 0; i < ids.size(); ++i) {
            results[i].id = ids[i];
            results[i].gave_up = true;
            results[i].detail = e.what();
          }
          report(std::move(results));
        });
  }
}

std::vector<LocalTxRunner::Result> LocalTxRunner::apply(db::Connection& c, Route& route,
                                                        const std::vector<uint64_t>& ids,
                                                        const std::vector<const Record*>& recs,
                                                        const std::vector<claim::Outcome>& outcomes) {
  std::vector<Result> results(ids.size());
  // One transaction for the batch; should the database refuse a statement of
  // ours for its data (not a plugin's: those are handled per record), the
  // batch is split until that record is alone and the others commit.
  auto rejected = db::write_isolating(c, ids.size(), [&](size_t first, size_t n) {
    const auto part_ids = std::span(ids).subspan(first, n);
    const auto part_recs = std::span(recs).subspan(first, n);
    const auto part_outcomes = std::span(outcomes).subspan(first, n);
    const auto part_results = std::span(results).subspan(first, n);
    if (!apply_in_one_transaction(c, route, part_ids, part_recs, part_outcomes, part_results, Pass::Optimistic))
      apply_in_one_transaction(c, route, part_ids, part_recs, part_outcomes, part_results, Pass::Careful);
  });
  for (const auto& r : rejected) {
    results[r.index] = Result{ids[r.index], IDEMSINK_OUTCOME_PERMANENT, r.error.what()};
    results[r.index].db_refused = r.error.what();
  }
  return results;
}

bool LocalTxRunner::apply_in_one_transaction(db::Connection& c, Route& route, std::span<const uint64_t> ids,
                                             std::span<const Record* const> recs,
                                             std::span<const claim::Outcome> outcomes, std::span<Result> results,
                                             Pass pass) {
  const bool per_record = pass == Pass::Careful;
  c.begin();
  const std::vector<bool> owned =
      per_record ? store_.lock_owned(c, outcomes) : std::vector<bool>(outcomes.size(), true);
  std::vector<claim::Outcome> ok;
  std::vector<dlq::Letter> events;  // of the records applied: they commit with the write
  plugin::DeferredRows rows;        // of the records applied, written after the last apply
  for (size_t i = 0; i < ids.size(); ++i) {
    Result& res = results[i];
    res = Result{ids[i]};
    if (!owned[i]) {
      res.fenced = true;
      continue;
    }
    if (per_record) c.execute("SAVEPOINT idemsink_record");
    idemsink_tx tx{&c};
    Result applied = call_apply(tx, route, *recs[i]);
    if (tx.broken_code != 0) throw db::DbError(tx.broken_code, "local_tx apply: " + tx.broken_message);
    if (!per_record && applied.outcome != IDEMSINK_OUTCOME_OK && (tx.statements > 0 || tx.refused_code != 0)) {
      c.rollback_quietly();  // its statements need undoing, and only a savepoint undoes them alone
      return false;
    }
    if (per_record && applied.outcome == IDEMSINK_OUTCOME_OK && !tx.rows.empty()) write_own_rows(c, tx, applied, res);
    if (tx.refused_code != 0 && applied.outcome != IDEMSINK_OUTCOME_OK) {
      // Re-running would be refused again: this record ends, the batch goes on.
      if (res.db_refused.empty()) res.db_refused = tx.refused_message;
      applied.outcome = IDEMSINK_OUTCOME_PERMANENT;
    }
    if (applied.outcome == IDEMSINK_OUTCOME_OK) {
      claim::Outcome o = outcomes[i];
      o.receipt = applied.detail;
      ok.push_back(std::move(o));
      if (auto event = event_of(*recs[i], claim::Status::Done, applied.detail, "", host_))
        events.push_back(std::move(*event));
      if (!per_record) rows.take(std::move(tx.rows));
    } else if (per_record) {
      c.execute("ROLLBACK TO SAVEPOINT idemsink_record");
    }
    res.outcome = applied.outcome;
    res.detail = std::move(applied.detail);
  }
  return finish_transaction(c, per_record, rows, ok, events);
}

LocalTxRunner::Result LocalTxRunner::call_apply(idemsink_tx& tx, Route& route, const Record& rec) {
  auto slot = std::make_shared<Result>();
  auto reported = std::make_shared<bool>(false);
  const uint64_t call_id = plugin::CallRegistry::instance().add(
      [slot, reported](uint64_t, idemsink_outcome o, std::string d) {
        slot->outcome = o;
        slot->detail = std::move(d);
        *reported = true;
      },
      "route " + route.cfg.name + " apply");
  std::vector<idemsink_header> headers;
  idemsink_record abi = abi_record(rec, headers);
  rec.handler->apply(abi, &tx, call_id);
  if (!*reported) {
    plugin::CallRegistry::instance().cancel(call_id);
    slot->outcome = IDEMSINK_OUTCOME_RETRYABLE;
    slot->detail = "apply returned without reporting a result";
  }
  return *slot;
}

void LocalTxRunner::write_own_rows(db::Connection& c, idemsink_tx& tx, Result& applied, Result& res) {
  try {
    tx.rows.write(c);
  } catch (const db::DbError& e) {
    if (!row_write_failed(e)) throw;
    const bool refused = refused_as_written(e);
    applied.outcome = refused ? IDEMSINK_OUTCOME_PERMANENT : IDEMSINK_OUTCOME_RETRYABLE;
    applied.detail = std::string("writing its queued rows: ") + e.what();
    if (refused) res.db_refused = e.what();
  }
}

bool LocalTxRunner::finish_transaction(db::Connection& c, bool per_record, plugin::DeferredRows& rows,
                                       const std::vector<claim::Outcome>& ok, const std::vector<dlq::Letter>& events) {
  if (!rows.empty()) {
    try {
      rows.write(c);
    } catch (const db::DbError& e) {
      if (!row_write_failed(e)) throw;
      c.rollback_quietly();  // which record's row it was, the run with a savepoint per record finds
      return false;
    }
  }
  if (per_record) {
    const std::vector<bool> marked = store_.mark_done(c, ok);
    if (std::find(marked.begin(), marked.end(), false) != marked.end())
      throw db::DbError(0, "claim rows locked by this transaction could not be marked done");
  } else if (!store_.mark_all_done(c, ok)) {
    // A claim no longer ours, or done by an earlier run of this job whose
    // reply was lost: none of this may commit. The careful pass locks the
    // claims still ours and applies only those.
    c.rollback_quietly();
    return false;
  }
  outbox_.insert(c, events);
  fault::hit("in_local_tx");
  c.commit();
  fault::hit("after_mark_done");
  return true;
}

}  // namespace idemsink::pipeline
