// The reconciler's round, one run_once() in its steps.
#include "core/reconcile/candidate.h"
#include "core/reconcile/reconciler.h"

#include "core/dlq/outcome_event.h"

#include <memory>

#include "core/common/log.h"
#include "core/common/util.h"
#include "core/dlq/letters.h"
#include "core/dlq/outbox.h"
#include "core/dlq/reason.h"
#include "core/plugin/call_deadline.h"
#include "core/pipeline/rate_limiter.h"

namespace idemsink::reconcile {

using pipeline::RemoteGate;
using pipeline::retry_after_ms;

namespace asio = boost::asio;
using db::Connection;

namespace {

// The longest a round waits for a route's budget before it leaves a row to
// a later round (a host that owns none of the route's partitions has no
// share of a group-wide limit, and would wait for ever).
constexpr auto kLongestGateWait = std::chrono::seconds(30);

// A retryable answer asking for a pause (Retry-After): the remote is busy,
// which says nothing of this record.
bool throttled(idemsink_outcome o, const std::string& detail) {
  return o == IDEMSINK_OUTCOME_RETRYABLE && retry_after_ms(detail) > 0;
}

}  // namespace

// One reconcile round in its steps, each run once the one before has
// answered; the callbacks it hands out keep it alive:
//   scan ─▶ ask every plugin ─▶ sort the answers ─▶ settle them (one
//   transaction) ─▶ re-drive each row once (taken, then called) ─▶ record
//   the results ─▶ finish
// Steps on the engine thread and on a database worker alternate, never
// overlap. A database step may be re-run by the pool after a failure: it
// works on locals and touches the round only once its transaction commits.
// Every call (look-up or re-drive) first passes the route's gate; the
// routes' lines of calls run side by side, each in its own order.
class Reconciler::Round : public std::enable_shared_from_this<Round> {
 public:
  // On the engine thread: the routes as they are now, kept for the round
  // (a reload adding, changing or removing one meanwhile leaves it as is).
  Round(Reconciler& reconciler, std::function<void(ReconcileSummary)> done)
      : r_(reconciler), routes_(reconciler.routes_), handlers_(reconciler.handlers_), done_(std::move(done)) {
    for (const auto& [name, h] : handlers_)
      if (const config::RouteConfig* rc = routes_->route_by_name(name);  // none: a reload is removing it
          rc != nullptr && (r_.only_route_.empty() || name == r_.only_route_))
        namespaces_.push_back({name, r_.cfg_.reconcile_after(*rc)});
  }

  /// Database worker: the candidates, and the payload the outbox kept of each.
  void scan(Connection& c, size_t limit) {
    // An unknown is asked about only once its newest call is old enough to
    // have landed: a call still on its way must not look like "never sent".
    std::vector<Candidate> found;
    // No route to ask (the one asked about was removed, or has no hook): an
    // empty list would read every route's rows.
    std::vector<claim::ClaimStore::Unsettled> rows;
    if (!namespaces_.empty()) rows = r_.store_.unsettled(c, namespaces_, r_.cfg_.claim.stuck_after, limit, false);
    for (auto& u : rows) {
      Candidate cand;
      cand.facts() = std::move(u.facts());
      found.push_back(std::move(cand));
    }
    // The record's newest dead letter carries its payload.
    std::vector<std::string> tokens;
    for (const auto& cand : found) tokens.push_back(cand.idem_token);
    const auto letters = dlq::dead_letter_messages(c, tokens);
    for (Candidate& cand : found)
      if (auto it = letters.find(cand.idem_token); it != letters.end()) {
        cand.key = it->second.key;
        cand.value = it->second.value;
        cand.timestamp_ms = it->second.timestamp_ms;
        cand.reason = it->second.reason;
      }
    cands_ = std::move(found);
    asio::post(r_.io_, [self = shared_from_this()] { self->ask(); });
  }

 private:
  using Clock = std::chrono::steady_clock;
  using Line = std::shared_ptr<std::vector<size_t>>;  // one route's candidates, in order

  /// Engine thread: `then(answer)` once a call to `route` may start (Go,
  /// maybe as its circuit's probe), or when its circuit is open or the wait
  /// would pass `until` (Closed).
  using Passed = std::function<void(const RemoteGate::Answer&)>;
  void through_gate(const std::string& route, Clock::time_point until, Passed then) {
    const RemoteGate::Answer a = r_.gate_.try_call(route);
    if (a.pass == RemoteGate::Pass::Go || a.pass == RemoteGate::Pass::Closed) return then(a);
    if (a.until > until) return then({RemoteGate::Pass::Closed});
    auto timer = std::make_shared<asio::steady_timer>(r_.io_, a.until);
    timer->async_wait(
        [self = shared_from_this(), timer, route, until, then = std::move(then)](boost::system::error_code ec) mutable {
          if (ec) return then({RemoteGate::Pass::Closed});
          self->through_gate(route, until, std::move(then));
        });
  }

  /// A call that was its route's probe tells the circuit how the remote
  /// answered: for itself (done, refused, paused), or not at all.
  void tell_probe(const std::string& route, uint64_t probe, idemsink_outcome o, const std::string& detail) {
    if (probe == 0) return;
    const bool healthy = o == IDEMSINK_OUTCOME_OK || o == IDEMSINK_OUTCOME_PERMANENT || throttled(o, detail);
    r_.gate_.probe_answered(route, probe, healthy);
  }

  /// The candidates `pick` selects, one line per route.
  template <class Pick>
  std::vector<Line> lines_of(const std::vector<size_t>& indexes, Pick pick) const {
    std::map<std::string, Line> by_route;
    for (size_t i : indexes) {
      if (!pick(cands_[i])) continue;
      Line& line = by_route[cands_[i].row.ns];
      if (!line) line = std::make_shared<std::vector<size_t>>();
      line->push_back(i);
    }
    std::vector<Line> out;
    for (auto& [route, line] : by_route) out.push_back(std::move(line));
    return out;
  }

  const config::RouteConfig& route_of(const Candidate& c) const { return *routes_->route_by_name(c.row.ns); }
  idemsink_kind kind_of(const Candidate& c) const { return handlers_.at(c.row.ns)->kind(); }

  /// The calls a record may have had when "never applied" settles it failed:
  /// the route's attempts; twice as many on an idempotent route, whose
  /// remote de-duplicates the token, so a re-drive is never an effect twice.
  uint32_t calls_allowed(const Candidate& c) const {
    const auto n = static_cast<uint32_t>(route_of(c).retry.max_attempts);
    return kind_of(c) == IDEMSINK_KIND_REMOTE_IDEMPOTENT ? 2 * n : n;
  }
  /// Whether a row never applied may be called once more.
  bool may_redrive(const Candidate& c) const {
    // One that kept killing its hosts may be what kills them.
    if (c.reason == dlq::to_string(dlq::Reason::CrashLoop)) return false;
    // An at-most-once record out of attempts had its chances.
    if (kind_of(c) == IDEMSINK_KIND_REMOTE_AT_MOST_ONCE && c.reason == dlq::to_string(dlq::Reason::MaybeApplied))
      return false;
    return c.calls < calls_allowed(c);
  }

  /// Engine thread: every plugin asked about its rows, each through its
  /// route's gate and with the route's call deadline.
  void ask() {
    if (cands_.empty()) return finish();
    std::vector<size_t> all(cands_.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    unanswered_ = cands_.size();
    const auto until = Clock::now() + kLongestGateWait;
    for (auto& line : lines_of(all, [](const Candidate&) { return true; })) ask_next(line, 0, until);
  }

  void ask_next(const Line& line, size_t at, Clock::time_point until) {
    if (at == line->size()) return;
    const size_t i = (*line)[at];
    through_gate(cands_[i].row.ns, until, [self = shared_from_this(), line, at, until, i](const RemoteGate::Answer& a) {
      Candidate& c = self->cands_[i];
      if (a.pass == RemoteGate::Pass::Go) {
        const config::RouteConfig& route = self->route_of(c);
        const uint64_t call_id = plugin::call_with_deadline(
            self->r_.io_, route.call_timeout, "reconcile " + route.name,
            {IDEMSINK_OUTCOME_RETRYABLE, "reconcile got no answer within call_timeout"},
            [self, i, probe = a.probe](idemsink_outcome o, std::string detail) {
              Candidate& c = self->cands_[i];
              self->tell_probe(c.row.ns, probe, o, detail);
              if (throttled(o, detail))
                self->r_.gate_.hold(c.row.ns, std::chrono::milliseconds(retry_after_ms(detail)));
              c.answer = o;
              c.detail = std::move(detail);
              self->answered();
            });
        c.handler = self->handlers_.at(c.row.ns);
        c.handler->reconcile(record_of(c, route, c.calls), call_id);
      } else {
        c.deferred = true;
        self->answered();
      }
      self->ask_next(line, at + 1, until);
    });
  }

  void answered() {
    if (--unanswered_ == 0) sort_answers();
  }

  /// Engine thread, once every plugin answered (or its deadline passed).
  void sort_answers() {
    summary_.examined = cands_.size();
    for (size_t i = 0; i < cands_.size(); ++i) {
      const Candidate& c = cands_[i];
      const bool unknown = c.status == claim::Status::Unknown;
      if (c.deferred) {
        ++summary_.deferred;
      } else if (c.answer == IDEMSINK_OUTCOME_OK) {
        resolve_.push_back(i);
      } else if (c.answer == IDEMSINK_OUTCOME_PERMANENT && unknown && !may_redrive(c)) {
        not_applied_.push_back(i);
      } else if (c.answer == IDEMSINK_OUTCOME_PERMANENT && unknown && c.value) {
        redrive_.push_back(i);
      } else if (c.answer == IDEMSINK_OUTCOME_PERMANENT) {
        ++summary_.left_stuck;
        spdlog::warn(
            "reconcile: route {} key {} (token {}) is {} and its effect did not happen; it waits for its "
            "record or `idemsink reconcile --resolve`",
            c.row.ns, printable(c.row.biz_key), c.idem_token, claim::to_string(c.status));
      } else {
        ++summary_.undecided;
        if (unknown) undecided_.push_back(claim::Outcome{c.row, c.attempt, 0, 0, {}, {}});
      }
    }
    r_.pool_.submit("reconcile resolve", [self = shared_from_this()](Connection& c) { self->settle(c); });
  }

  /// A re-drive's answer, by its candidate.
  struct Redriven {
    size_t index;
    idemsink_outcome outcome;
    std::string detail;
  };

  /// A failed settlement's dead letter, published (never stamped away).
  struct Failure {
    std::string token;
    dlq::Reason reason;
    std::string error;
  };

  /// In the caller's transaction: the outcome events of the settled claims,
  /// the held letters of those done stamped, of those failed published.
  void write_settled(Connection& c, const std::vector<std::string>& done, const std::vector<Failure>& failed) const {
    std::vector<std::string> settled = done;
    for (const auto& f : failed) settled.push_back(f.token);
    dlq::write_settlement_events(c, *routes_, r_.store_, r_.outbox_, settled);
    dlq::Outbox::settle_held(c, done);
    for (const auto& f : failed) dlq::Outbox::publish_settled_failure(c, f.token, dlq::to_string(f.reason), f.error);
  }

  /// Database worker. Applied: done, with the receipt the remote returned;
  /// never applied and not to be called again: failed, its letter published.
  /// In one transaction: a resolution and its letter's fate commit together
  /// (a host killed in between would leave the letter held). Counted once
  /// committed, so a re-run counts once.
  void settle(Connection& c) {
    std::vector<std::string> done;
    std::vector<Failure> failed;
    c.begin();
    for (size_t i : resolve_) {
      const Candidate& cand = cands_[i];
      if (r_.store_.resolve_applied(c, cand.row, cand.attempt, cand.detail)) done.push_back(cand.idem_token);
    }
    for (size_t i : not_applied_) {
      const Candidate& cand = cands_[i];
      if (r_.store_.resolve_not_applied(c, cand.row, cand.attempt, cand.detail))
        failed.push_back({cand.idem_token, dlq::Reason::NotApplied,
                          "settled by reconciliation: the remote never applied it (" + cand.detail +
                              "), and its attempts are spent (" + std::to_string(cand.calls) + " calls)"});
    }
    write_settled(c, done, failed);
    r_.store_.note_undecided(c, undecided_);
    c.commit();
    summary_.applied += done.size();
    summary_.failed += failed.size();
    asio::post(r_.io_, [self = shared_from_this()] { self->redrive_all(); });
  }

  /// Engine thread: each row never applied, called once more (same token),
  /// a line per route through its gate. A row is taken (attempt+1, leased to
  /// us, call mark written) only once its call may start, so the lease
  /// covers the call and not a wait for the limiter.
  void redrive_all() {
    if (redrive_.empty()) return finish();
    redrives_left_ = redrive_.size();
    const auto until = Clock::now() + kLongestGateWait;
    for (auto& line : lines_of(redrive_, [](const Candidate&) { return true; })) redrive_next(line, 0, until);
  }

  void redrive_next(const Line& line, size_t at, Clock::time_point until) {
    if (at == line->size()) return;
    const size_t i = (*line)[at];
    through_gate(cands_[i].row.ns, until, [self = shared_from_this(), line, at, until, i](const RemoteGate::Answer& a) {
      if (a.pass != RemoteGate::Pass::Go) {
        ++self->summary_.deferred;
        self->redriven({});
      } else {
        self->r_.pool_.submit("reconcile take for re-drive",
                              [self, i, probe = a.probe](Connection& c) { self->take_and_call(c, i, probe); });
      }
      self->redrive_next(line, at + 1, until);
    });
  }

  /// Database worker, then the engine thread: the row taken, then called;
  /// its result recorded as soon as it comes (the lease covers one call,
  /// not the wait for the round's other re-drives).
  void take_and_call(Connection& c, size_t i, uint64_t probe) {
    const Candidate& cand = cands_[i];
    const auto lease = std::max<std::chrono::milliseconds>(r_.cfg_.claim.lease, std::chrono::seconds(10));
    const bool taken = r_.store_.take_for_redrive(c, cand.row, cand.attempt, lease + route_of(cand).call_timeout);
    asio::post(r_.io_, [self = shared_from_this(), i, taken, probe] {
      if (!taken) {  // another host took it, or it moved on
        if (probe != 0) self->r_.gate_.probe_abandoned(self->cands_[i].row.ns, probe);
        return self->redriven({});
      }
      Candidate& cand = self->cands_[i];
      const config::RouteConfig& route = self->route_of(cand);
      spdlog::info("reconcile: route {} key {} was not applied; re-driving it once with token {}", route.name,
                   printable(cand.row.biz_key), cand.idem_token);
      const uint64_t call_id = plugin::call_with_deadline(
          self->r_.io_, route.call_timeout, "re-drive " + route.name,
          {IDEMSINK_OUTCOME_UNCERTAIN, "no result within call_timeout"},
          [self, i, probe](idemsink_outcome o, std::string detail) {
            self->tell_probe(self->cands_[i].row.ns, probe, o, detail);
            // A pause the remote asked for holds the route's other calls
            // now (the engine thread owns its limiter).
            if (throttled(o, detail))
              self->r_.gate_.hold(self->cands_[i].row.ns, std::chrono::milliseconds(retry_after_ms(detail)));
            self->r_.pool_.submit("reconcile re-drive result",
                                  [self, d = Redriven{i, o, std::move(detail)}](Connection& c) {
                                    const ReconcileSummary counted = self->record_redrive(c, d);
                                    asio::post(self->r_.io_, [self, counted] { self->redriven(counted); });
                                  });
          });
      cand.handler = self->handlers_.at(cand.row.ns);
      cand.handler->invoke(record_of(cand, route, cand.calls + 1), call_id);
    });
  }

  /// Engine thread: one re-drive ended (recorded, or its row not taken).
  void redriven(const ReconcileSummary& counted) {
    summary_.redriven_done += counted.redriven_done;
    summary_.failed += counted.failed;
    summary_.undecided += counted.undecided;
    if (--redrives_left_ == 0) finish();
  }

  /// Database worker: a re-drive's result, under the epoch we took.
  ///   ok                 done
  ///   permanent          failed (rejected), its letter published
  ///   retryable          certainly not applied: failed once the record's
  ///                      calls are spent (letter published), else left
  ///                      unknown for the next round
  ///   paused             (a retry-after answer) left unknown, not counted
  ///   uncertain          left unknown
  /// Counted once committed, so a re-run counts once.
  ReconcileSummary record_redrive(Connection& c, const Redriven& d) const {
    using Result = claim::ClaimStore::RedriveResult;
    const Candidate& cand = cands_[d.index];
    const bool paused = throttled(d.outcome, d.detail);
    const uint32_t calls = paused ? cand.calls : cand.calls + 1;
    const bool spent = d.outcome == IDEMSINK_OUTCOME_RETRYABLE && !paused && calls >= calls_allowed(cand);
    const Result result = d.outcome == IDEMSINK_OUTCOME_OK                   ? Result::Applied
                          : d.outcome == IDEMSINK_OUTCOME_PERMANENT || spent ? Result::Rejected
                                                                             : Result::Undecided;
    ReconcileSummary counted;
    c.begin();  // the result and its letter's fate commit together
    // False: our lease ran out and another host took it; its result counts.
    if (r_.store_.record_redrive(c, cand.row, cand.attempt + 1, calls, result, d.detail)) {
      if (result == Result::Applied) {
        counted.redriven_done = 1;
        write_settled(c, {cand.idem_token}, {});
      } else if (result == Result::Rejected) {
        counted.failed = 1;
        write_settled(c, {},
                      {{cand.idem_token, spent ? dlq::Reason::RetriesExhausted : dlq::Reason::Permanent,
                        "re-driven after reconcile: " + d.detail}});
      } else {
        counted.undecided = 1;
      }
    }
    c.commit();
    return counted;
  }

  /// Engine thread.
  void finish() {
    r_.running_ = false;
    if (r_.metrics_) {
      r_.metrics_->reconciled_done.fetch_add(summary_.applied + summary_.redriven_done, std::memory_order_relaxed);
      r_.metrics_->reconcile_undecided.store(static_cast<int64_t>(summary_.undecided + summary_.left_stuck),
                                             std::memory_order_relaxed);
    }
    done_(summary_);
  }

  Reconciler& r_;
  const std::shared_ptr<const config::Config> routes_;
  const std::map<std::string, std::shared_ptr<plugin::Instance>> handlers_;
  std::vector<claim::ClaimStore::Namespace> namespaces_;  // the routes asked about
  const std::function<void(ReconcileSummary)> done_;
  std::vector<Candidate> cands_;
  ReconcileSummary summary_;
  size_t unanswered_ = 0;
  std::vector<size_t> resolve_, not_applied_, redrive_;  // indexes into cands_, by the answer
  std::vector<claim::Outcome> undecided_;
  size_t redrives_left_ = 0;
};

void Reconciler::begin_round(std::function<void(ReconcileSummary)> done, size_t limit) {
  auto round = std::make_shared<Round>(*this, std::move(done));
  pool_.submit("reconcile scan", [round, limit](Connection& c) { round->scan(c, limit); });
}

}  // namespace idemsink::reconcile
