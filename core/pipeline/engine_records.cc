// The engine's half that follows one record from its claim to its end: the
// claim's verdict, the call's result, the outcome written (or refused), and
// the one way out, end_record() (engine_ingest.cc). The stages these move a
// record through, and which moves are allowed, are in stage.h; engine_ingest.cc
// takes the records in.
#include "core/pipeline/engine.h"

#include "core/dlq/outcome_event.h"

#include "core/common/fault.h"
#include "core/common/log.h"
#include "core/common/util.h"
#include "core/pipeline/failure_policy.h"
#include "core/plugin/call_deadline.h"

namespace idemsink::pipeline {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using claim::Status;
using claim::Verdict;

// ---------------------------------------------------------------- claims

void Engine::on_claimed(const Claimer::Claimed& claimed) {
  const auto& [ids, results, refused, sent] = claimed;
  std::vector<claim::Outcome> to_release;
  std::vector<uint64_t> no_partition;
  for (size_t i = 0; i < ids.size(); ++i) {
    const claim::ClaimResult& res = results[i];
    Record* r = find(ids[i]);
    const bool held = refused.find(ids[i]) == refused.end() && res.verdict == Verdict::Held;
    if (r != nullptr) set_entity_on_hold(*r, held);
    if (auto it = refused.find(ids[i]); it != refused.end()) {
      if (r == nullptr) continue;
      r->db_error = sanitize_utf8(it->second, 512);
      r->route->metrics->db_rejected.fetch_add(1, std::memory_order_relaxed);
      refuse(*r, dlq::Reason::DbRejected, "the database refused its claim: " + r->db_error);
      continue;
    }
    if (r == nullptr || r->part->revoked) {
      // The partition went away while we claimed: hand the claim back so the
      // next owner does not wait for our lease.
      if (res.verdict == Verdict::Owned)
        to_release.push_back(claim::Outcome{res.row, res.attempt, 0, res.uncertain_calls, {}, {}});
      if (r) end_record(*r, false);
      continue;
    }
    metrics::RouteMetrics& m = *r->route->metrics;
    switch (res.verdict) {
      case Verdict::Owned: on_owned(*r, res, sent); break;
      case Verdict::Done:
      case Verdict::Terminal:
        m.duplicates.fetch_add(1, std::memory_order_relaxed);
        ++hits_since_summary_;
        spdlog::debug("route {}: idempotent hit for key {} ({}), offset {}", r->route->cfg.name, printable(r->biz_key),
                      claim::to_string(res.status), r->offset);
        end_record(*r, true);
        break;
      case Verdict::Conflict:
        refuse(*r, dlq::Reason::PayloadConflict,
               "biz_key already claimed (" + std::string(claim::to_string(res.status)) + ", token " + res.idem_token +
                   ") with a different payload");
        break;
      case Verdict::NoPartition: no_partition.push_back(r->id); break;
      case Verdict::Busy:
        m.busy_waits.fetch_add(1, std::memory_order_relaxed);
        claimer_.claim_later(*r);
        break;
      case Verdict::Held:
        // Its entity's earlier record is unfinished (in a retry topic, or
        // dead on a route that holds): it waits, its offset uncommitted.
        m.order_waits.fetch_add(1, std::memory_order_relaxed);
        claimer_.claim_later(*r);
        break;
    }
  }
  release_claims(std::move(to_release));
  if (!no_partition.empty()) claim_without_partition(std::move(no_partition));
  dispatcher_.pump();
}

void Engine::set_entity_on_hold(Record& r, bool held) {
  if (r.on_hold == held) return;
  // The record, and every record waiting in its entity's line behind it.
  const auto set = [&](Record& w) { held ? health_.put_on_hold(w) : health_.take_off_hold(w); };
  set(r);
  if (r.entity_id.empty()) return;
  for (uint64_t id : entities_.line(r.entity_id))
    if (Record* w = find(id)) set(*w);
}

void Engine::on_owned(Record& r, const claim::ClaimResult& res, std::chrono::steady_clock::time_point sent) {
  metrics::RouteMetrics& m = *r.route->metrics;
  r.row = res.row;
  r.attempt = res.attempt;
  r.token = res.idem_token;
  r.lease_from = sent;
  r.lease_known = std::chrono::steady_clock::now();
  r.uncertain_calls = std::max(r.uncertain_calls, res.uncertain_calls);
  // An owner that died holding the claim may have called; for an
  // at-most-once route the call mark says whether one did. A local_tx
  // write commits with its done mark: a claim still pending was not applied.
  const idemsink_kind kind = r.route->handler->kind();
  r.owner_died = kind == IDEMSINK_KIND_REMOTE_AT_MOST_ONCE ? res.maybe_called
                                                           : kind != IDEMSINK_KIND_LOCAL_TX && res.takeovers > 0;
  m.claimed.fetch_add(1, std::memory_order_relaxed);
  if (res.taken_over) m.takeovers.fetch_add(1, std::memory_order_relaxed);
  const Decision d = decide_on_claim(r.route->handler->kind(), res, cfg_.claim.max_takeovers);
  if (d.action == Decision::Action::End) {
    end(r, d.status, d.reason, d.error);
  } else if (r.route->handler->kind() == IDEMSINK_KIND_REMOTE_AT_MOST_ONCE &&
             (r.offset < r.part->lost_window_end || r.calls > 0)) {
    // A record the database lost outcomes of: its claim (new now) or only
    // its call mark (a claim taken over without one) may be gone, and it may
    // have been sent. So may a record this host called whose claim was then
    // lost under it. Asked before any call.
    look_up_before_call(r);
  } else {
    dispatcher_.make_ready(r);
  }
}

void Engine::look_up_before_call(Record& r) {
  const LogScope log_scope(log_fields_of(r));
  if (!r.route->handler->can_reconcile()) {
    end(r, Status::Unknown, dlq::Reason::MaybeApplied,
        "in the offsets the database lost (it went back in time), and its plugin cannot be asked whether it was sent");
    return;
  }
  spdlog::info(
      "route {}: key {} may have been sent before the database lost its outcomes; asking the remote before calling",
      r.route->cfg.name, printable(r.biz_key));
  r.move_to(Stage::LookingUp);
  r.timer.reset();  // no wait of an earlier stage outlives it
  const uint64_t call_id = plugin::call_with_deadline(
      io_, r.route->cfg.call_timeout, "look-up route " + r.route->cfg.name,
      {IDEMSINK_OUTCOME_UNCERTAIN, "no answer within call_timeout"},
      [this, id = r.id](idemsink_outcome o, std::string detail) { looked_up(id, o, std::move(detail)); });
  std::vector<idemsink_header> headers;
  r.handler = r.route->handler;
  r.handler->reconcile(abi_record(r, headers), call_id);
}

void Engine::looked_up(uint64_t id, idemsink_outcome outcome, std::string detail) {
  Record* r = at(id, Stage::LookingUp);
  if (r == nullptr) return;
  const LogScope log_scope(log_fields_of(*r));
  if (r->part->revoked) {
    release_claims({r->outcome()});
    end_record(*r, false);
    return;
  }
  switch (outcome) {
    case IDEMSINK_OUTCOME_OK:  // sent before the database lost it: done, without a second send
      r->receipt = std::move(detail);
      writer_.done(*r);
      break;
    case IDEMSINK_OUTCOME_PERMANENT:  // certainly never sent
      dispatcher_.make_ready(*r);
      dispatcher_.pump();
      break;
    default:
      end(*r, Status::Unknown, dlq::Reason::MaybeApplied,
          "in the offsets the database lost, and the remote cannot tell whether it was sent: " + printable(detail));
      break;
  }
}

void Engine::claim_without_partition(std::vector<uint64_t> ids) {
  // The calendar ran past the newest claim partition. With schema changes
  // allowed the partition is created now and the records claimed again;
  // otherwise (a DBA manages the schema) they are refused, loudly.
  if (!cfg_.claim.apply_schema) {
    for (uint64_t id : ids)
      if (Record* r = find(id)) {
        spdlog::error(
            "route {}: no claim partition for {} (claim.apply_schema is off): `idemsink schema apply` must "
            "add partitions; refusing {}[{}]@{}",
            r->route->cfg.name, claim::bucket_of(r->timestamp_ms), r->part->tp.topic, r->part->tp.partition, r->offset);
        refuse(
            *r, dlq::Reason::NoClaimPartition,
            "no claim partition for the month " + claim::bucket_of(r->timestamp_ms) + " and claim.apply_schema is off");
      }
    return;
  }
  for (uint64_t id : ids)
    if (Record* r = find(id)) r->move_to(Stage::Busy);  // not claimable until the partition exists
  spdlog::warn("{} record(s) have no claim partition for their month; creating the partitions now", ids.size());
  housekeeping_.ensure_partitions([this, ids = std::move(ids)](bool ok) {
    if (!ok) spdlog::error("claim partitions could not be created; the records are claimed again after a wait");
    for (uint64_t id : ids)
      if (Record* r = at(id, Stage::Busy)) {
        if (ok) {
          claimer_.claim(*r);
        } else {
          claimer_.claim_later(*r);
        }
      }
  });
}

void Engine::refuse(Record& r, dlq::Reason reason, std::string detail) {
  const LogScope log_scope(log_fields_of(r));
  spdlog::warn("route {}: refusing {}[{}]@{}: {} ({})", r.route->cfg.name, r.part->tp.topic, r.part->tp.partition,
               r.offset, dlq::to_string(reason), detail);
  r.note_failure(detail);
  r.refuse_reason = reason;
  writer_.dead_letter(r);
}

void Engine::release_claims(std::vector<claim::Outcome> outcomes) {
  if (outcomes.empty()) return;
  pool_.submit("release claims",
               [this, outcomes = std::move(outcomes)](db::Connection& c) { store_.release(c, outcomes); });
}

// ---------------------------------------------------------------- after a call, after a write

void Engine::on_fenced(Record& r) {
  r.route->metrics->fenced.fetch_add(1, std::memory_order_relaxed);
  claimer_.claim(r);
}

void Engine::on_probe_wanted(Route& route) { health_.want_fresh_probe(route); }

void Engine::on_calls_may_start() { dispatcher_.pump(); }

void Engine::on_call_result(Record& r, idemsink_outcome outcome, std::string detail) {
  const LogScope log_scope(log_fields_of(r));
  if (outcome == IDEMSINK_OUTCOME_OK) fault::hit("after_handler_ok");
  const idemsink_kind kind = r.route->handler->kind();
  // A pause the remote asked for holds the route, uncounted, a record's
  // first max_attempts times: one the remote refuses for itself forever
  // still reaches its end. (Open or half-open, the circuit decides.)
  if (outcome == IDEMSINK_OUTCOME_RETRYABLE && r.route->circuit.closed() &&
      r.held_calls < static_cast<uint32_t>(r.route->cfg.retry.max_attempts)) {
    if (const int64_t ms = retry_after_ms(detail); ms >= kMinHoldMs) return hold(r, ms, std::move(detail));
  }
  // A rolled-back local_tx write certainly did not happen; a remote call may have.
  if (outcome == IDEMSINK_OUTCOME_UNCERTAIN && kind != IDEMSINK_KIND_LOCAL_TX) ++r.uncertain_calls;
  if (health_.after_call(r, outcome, detail)) {
    // The remote is down: the call does not count toward max_attempts and
    // the record waits for the circuit to close (with the same idem_token).
    ++r.uncounted_calls;
    r.note_failure(std::move(detail));
    if (!hand_back_if_revoked(r)) dispatcher_.make_ready(r);
    dispatcher_.pump();
    return;
  }
  const Decision d =
      decide_after_call(kind, outcome, r.calls - r.uncounted_calls, r.tier, r.route->cfg.retry, r.maybe_applied());
  switch (d.action) {
    case Decision::Action::Proceed: break;  // not an outcome of a call
    case Decision::Action::Done:
      if (detail.size() > 1024)
        spdlog::debug("route {}: key {}: receipt of {} bytes (stored cut): {}", r.route->cfg.name, printable(r.biz_key),
                      detail.size(), printable(detail, detail.size()));
      r.receipt = std::move(detail);
      writer_.done(r);
      break;
    case Decision::Action::End:
      r.note_failure(detail);
      end(r, d.status, d.reason, std::move(detail));
      break;
    case Decision::Action::Retry:
    case Decision::Action::Forward:
      r.note_failure(std::move(detail));
      if (hand_back_if_revoked(r)) break;
      r.route->metrics->retries.fetch_add(1, std::memory_order_relaxed);
      if (d.action == Decision::Action::Forward) {
        // Non-blocking retry: the record moves to the next retry topic
        // (through the outbox, so it is durable before the offset moves on)
        // and the claim is released for whoever consumes it there.
        writer_.forward(r);
      } else {
        retry_later(r);
      }
      break;
  }
  dispatcher_.pump();
}

bool Engine::hand_back_if_revoked(Record& r) {
  if (!r.part->revoked) return false;
  // Not ours to call again any more: hand the claim to the partition's new owner.
  release_claims({r.outcome()});
  end_record(r, false);
  return true;
}

void Engine::hold(Record& r, int64_t ms, std::string detail) {
  // The remote said "not now, try again in N" (429/503 with Retry-After): it
  // did not process the call. The call does not count toward max_attempts
  // and is not a sample of the remote's health (it answered, and asked for
  // the pause). A record's first such answer holds the whole route, as the
  // remote asked; its later ones wait out the pause alone: a record the
  // remote refuses for itself must not keep the route still (as for the
  // circuit, only a record's first failure speaks for the remote).
  Route& route = *r.route;
  const auto pause = std::chrono::milliseconds(ms);
  const bool route_wide = r.held_calls == 0;
  ++r.held_calls;
  ++r.uncounted_calls;
  r.note_failure(std::move(detail));
  if (route_wide) health_.hold_route(route, pause, "key " + printable(r.biz_key) + ": " + r.last_error);
  if (!hand_back_if_revoked(r)) {
    if (route_wide)
      dispatcher_.make_ready(r);
    else
      retry_later(r, std::min(pause, route.cfg.rate_limit.max_hold));
  }
  dispatcher_.pump();
}

void Engine::retry_later(Record& r, std::optional<std::chrono::milliseconds> after) {
  const LogScope log_scope(log_fields_of(r));
  // Backoff by the calls that counted: paused and circuit-held calls did not.
  const auto wait = after ? *after : backoff(r.route->cfg.retry, r.calls - r.uncounted_calls, rng_);
  spdlog::debug("route {}: key {} call {} failed ({}); retrying in {}ms", r.route->cfg.name, printable(r.biz_key),
                r.calls, r.last_error, wait.count());
  r.move_to(Stage::Backoff);
  r.timer = std::make_unique<asio::steady_timer>(io_, wait);
  r.timer->async_wait([this, id = r.id](boost::system::error_code ec) {
    if (ec) return;
    Record* rec = at(id, Stage::Backoff);
    if (rec == nullptr) return;
    dispatcher_.make_ready(*rec);
    dispatcher_.pump();
  });
}

void Engine::on_local_tx_results(std::vector<LocalTxRunner::Result> results) {
  for (auto& res : results) {
    Record* r = find(res.id);
    if (r == nullptr) continue;
    if (res.fenced) {
      // Done by an earlier run of this job whose reply was lost, or taken
      // over: claim again to learn which.
      dispatcher_.end_call(*r, false);
      on_fenced(*r);
      continue;
    }
    if (res.gave_up) {
      dispatcher_.end_call(*r, false);
      let_go(*r, OutcomeWriter::Kind::Ended, res.detail);
      continue;
    }
    dispatcher_.end_call(*r);
    if (!res.db_refused.empty()) {
      // Its write can never succeed as it stands: nothing was applied (rolled
      // back to its savepoint), and the rest of its batch went on.
      r->write_refused = sanitize_utf8(res.db_refused, 512);
      r->route->metrics->db_rejected.fetch_add(1, std::memory_order_relaxed);
      r->note_failure(res.detail);
      end(*r, Status::Failed, dlq::Reason::DbRejected, "the database refused its write: " + r->write_refused);
      continue;
    }
    if (res.outcome == IDEMSINK_OUTCOME_OK) {
      health_.healthy(*r->route, r->id);
      // Applied and marked done in the same transaction.
      r->receipt = std::move(res.detail);
      r->route->metrics->done.fetch_add(1, std::memory_order_relaxed);
      if (dlq::publishes_event(r->route->cfg.output, Status::Done)) {
        r->route->metrics->events_written.fetch_add(1, std::memory_order_relaxed);
        relay_.kick();
      }
      end_record(*r, true);
    } else {
      on_call_result(*r, res.outcome, std::move(res.detail));
    }
  }
  dispatcher_.pump();
}

void Engine::end(Record& r, Status status, dlq::Reason reason, std::string error) {
  const LogScope log_scope(log_fields_of(r));
  if (r.first_failure_ms == 0) {
    r.note_failure(error);
  } else {
    r.last_error = sanitize_utf8(error, 1024);
  }
  if (status == Status::Unknown)
    spdlog::warn("route {}: key {} is unknown ({}): {}; parked for reconciliation, token {}", r.route->cfg.name,
                 printable(r.biz_key), dlq::to_string(reason), r.last_error, r.token);
  else
    spdlog::warn("route {}: key {} failed ({}): {}", r.route->cfg.name, printable(r.biz_key), dlq::to_string(reason),
                 r.last_error);
  writer_.end(r, status, reason);
}

void Engine::on_written(const std::vector<OutcomeWriter::Written>& written) {
  using Kind = OutcomeWriter::Kind;
  using Result = OutcomeWriter::Result;
  bool new_letters = false;
  for (const auto& w : written) {
    Record* r = find(w.id);
    if (r == nullptr) continue;
    metrics::RouteMetrics& m = *r->route->metrics;
    switch (w.result) {
      case Result::Written: break;
      case Result::Fenced:
        // Our claim was taken over (our lease ran out or our host id
        // restarted elsewhere). Claim again: the new owner's result decides.
        spdlog::warn("route {}: claim on key {} was taken over before its outcome was recorded; re-checking",
                     r->route->cfg.name, printable(r->biz_key));
        on_fenced(*r);
        continue;
      case Result::Rejected: written_rejected(*r, w.kind, w.error); continue;
      case Result::GaveUp: let_go(*r, w.kind, w.error); continue;
    }
    if ((w.kind == Kind::Done || w.kind == Kind::Ended) && dlq::publishes_event(r->route->cfg.output, w.status)) {
      m.events_written.fetch_add(1, std::memory_order_relaxed);
      new_letters = true;
    }
    switch (w.kind) {
      case Kind::Done: m.done.fetch_add(1, std::memory_order_relaxed); break;
      case Kind::Ended:
        (w.status == Status::Unknown ? m.unknown : m.dead).fetch_add(1, std::memory_order_relaxed);
        new_letters = true;
        break;
      case Kind::DeadLettered:
        m.dead.fetch_add(1, std::memory_order_relaxed);
        new_letters = true;
        break;
      case Kind::Forwarded: new_letters = true; break;
    }
    end_record(*r, true);
  }
  if (new_letters) relay_.kick();
}

void Engine::written_rejected(Record& r, OutcomeWriter::Kind kind, const std::string& error) {
  const LogScope log_scope(log_fields_of(r));
  using Kind = OutcomeWriter::Kind;
  r.route->metrics->db_rejected.fetch_add(1, std::memory_order_relaxed);
  if (!r.db_error.empty()) {
    // Even the stripped write was refused: nothing more can be tried here.
    let_go(r, kind, error);
    return;
  }
  r.db_error = sanitize_utf8(error, 512);
  switch (kind) {
    case Kind::Done:
      // The effect happened, but its done mark was refused: park it for
      // reconciliation, with what can be written.
      r.receipt.clear();
      end(r, Status::Unknown, dlq::Reason::DbRejected, "the database refused its done mark: " + r.db_error);
      break;
    case Kind::Ended:
    case Kind::Forwarded:
      end(r, r.maybe_applied() ? Status::Unknown : Status::Failed, dlq::Reason::DbRejected,
          "the database refused its row: " + r.db_error);
      break;
    case Kind::DeadLettered: refuse(r, dlq::Reason::DbRejected, "the database refused its row: " + r.db_error); break;
  }
}

void Engine::let_go(Record& r, OutcomeWriter::Kind kind, const std::string& error) {
  const LogScope log_scope(log_fields_of(r));
  // Not durable: the offset is not committed, and the record is read again
  // after a restart or a rebalance. Its claim is handed back (a done one as
  // maybe applied), so no lease holds it meanwhile.
  spdlog::error(
      "route {}: {}[{}]@{} (key {}) could not be recorded ({}); letting it go uncommitted: it is read again "
      "after a restart or a rebalance",
      r.route->cfg.name, r.part->tp.topic, r.part->tp.partition, r.offset, printable(r.biz_key), error);
  r.route->metrics->let_go.fetch_add(1, std::memory_order_relaxed);
  if (kind != OutcomeWriter::Kind::DeadLettered && !r.token.empty()) {
    claim::Outcome o = r.outcome();
    if (kind == OutcomeWriter::Kind::Done) ++o.uncertain_calls;
    release_claims({o});
  }
  end_record(r, false);
}

}  // namespace idemsink::pipeline
