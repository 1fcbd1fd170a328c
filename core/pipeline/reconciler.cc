#include "core/pipeline/reconciler.h"

#include "core/dlq/outcome_event.h"

#include <memory>

#include "core/common/log.h"
#include "core/common/util.h"
#include "core/dlq/outbox.h"
#include "core/dlq/reason.h"
#include "core/pipeline/plugin_call.h"

namespace idemsink::pipeline {

namespace asio = boost::asio;
using db::Connection;

struct Reconciler::Candidate {
  claim::RowKey row;
  claim::Status status;
  uint32_t attempt = 0;
  uint32_t calls = 0;
  std::string token;
  std::string src_topic;
  int32_t src_partition = 0;
  int64_t src_offset = 0;
  std::optional<std::string> key, value;  // from the DLQ outbox, when the record went there
  std::string reason;                     // of its newest outbox row
  int64_t timestamp_ms = 0;
  // filled in by the rounds
  idemsink_outcome answer = IDEMSINK_OUTCOME_RETRYABLE;
  std::string detail;
};

namespace {

// The record handed to reconcile/invoke: what the claim row and the outbox
// still know about it.
template <class C>
idemsink_record record_of(const C& c, const std::string& route, uint32_t attempt) {
  idemsink_record r{};
  r.struct_size = sizeof r;
  r.route = route.c_str();
  r.topic = c.src_topic.c_str();
  r.partition = c.src_partition;
  r.offset = c.src_offset;
  r.timestamp_ms = c.timestamp_ms;
  if (c.key) r.key = {c.key->data(), c.key->size()};
  if (c.value) r.value = {c.value->data(), c.value->size()};
  r.biz_key = {c.row.biz_key.data(), c.row.biz_key.size()};
  r.idem_token = c.token.c_str();
  r.attempt = attempt;
  return r;
}

}  // namespace

Reconciler::Reconciler(asio::io_context& io, db::Pool& pool, const config::Config& cfg,
                       std::map<std::string, plugin::Instance*> handlers, metrics::SliceMetrics* metrics,
                       std::string owner)
    : io_(io),
      pool_(pool),
      cfg_(cfg),
      metrics_(metrics),
      store_(cfg.host.id, owner, cfg.claim.lease),
      outbox_(std::move(owner), cfg.claim.lease),
      timer_(io) {
  for (auto& [route, h] : handlers)
    if (h->can_reconcile()) handlers_.emplace(route, h);
}

void Reconciler::start(std::chrono::milliseconds first_delay) {
  const auto period = cfg_.claim.reconcile_interval;
  if (handlers_.empty() || period.count() == 0) return;
  timer_.expires_after(first_delay);
  timer_.async_wait([this, period](boost::system::error_code ec) {
    if (ec || stopped_) return;
    run_once(
        [this, period](ReconcileSummary s) {
          if (s.examined)
            spdlog::info(
                "reconcile: {} examined, {} applied -> done, {} re-driven -> done, {} failed, {} undecided, {} "
                "stuck left for an operator",
                s.examined, s.applied, s.redriven_done, s.failed, s.undecided, s.left_stuck);
          // A full round that settled some means more are waiting: go again
          // at once. A round of rows nobody can tell about waits its period.
          const bool progress = s.applied + s.redriven_done + s.failed > 0;
          start(s.examined == kRoundLimit && progress && !stopped_ ? std::chrono::milliseconds(1) : period);
        },
        kRoundLimit);
  });
}

void Reconciler::stop() {
  stopped_ = true;
  timer_.cancel();
}

// One reconcile round in its steps, each run once the one before has
// answered; the callbacks it hands out keep it alive:
//   scan ─▶ ask every plugin ─▶ sort the answers ─▶ settle them (one
//   transaction), take the rows to re-drive ─▶ re-drive each once ─▶ record
//   the results ─▶ finish
// Steps on the engine thread and on a database worker alternate, never
// overlap. A database step may be re-run by the pool after a failure: it
// works on locals and touches the round only once its transaction commits.
class Reconciler::Round : public std::enable_shared_from_this<Round> {
 public:
  Round(Reconciler& reconciler, std::function<void(ReconcileSummary)> done) : r_(reconciler), done_(std::move(done)) {}

  /// Database worker: the candidates, and the payload the outbox kept of each.
  void scan(Connection& c, size_t limit) {
    // An unknown is asked about only once its newest call is old enough to
    // have landed: a call still on its way must not look like "never sent".
    std::vector<claim::ClaimStore::Namespace> routes;
    for (const auto& [name, h] : r_.handlers_)
      if (r_.only_route_.empty() || name == r_.only_route_)
        routes.push_back({name, r_.cfg_.reconcile_after(*r_.cfg_.route_by_name(name))});
    std::vector<Candidate> found;
    for (auto& u : r_.store_.unsettled(c, routes, r_.cfg_.claim.stuck_after, limit, false)) {
      Candidate cand;
      cand.row = std::move(u.row);
      cand.status = u.status;
      cand.attempt = u.attempt;
      cand.calls = u.calls;
      cand.token = std::move(u.idem_token);
      cand.src_topic = std::move(u.src_topic);
      cand.src_partition = u.src_partition;
      cand.src_offset = u.src_offset;
      found.push_back(std::move(cand));
    }
    if (!found.empty()) {
      std::string tokens;
      for (const auto& cand : found) tokens += (tokens.empty() ? "'" : ", '") + cand.token + "'";
      std::map<std::string, size_t> by_token;
      for (size_t i = 0; i < found.size(); ++i) by_token[found[i].token] = i;
      // The newest outbox row of each token carries the record's payload.
      for (auto& r :
           c.query("SELECT idem_token, msg_key, msg_value, msg_timestamp, reason FROM idemsink_dlq_outbox WHERE "
                   "idem_token IN (" +
                   tokens + ") ORDER BY id")) {
        Candidate& cand = found[by_token[*r[0]]];
        cand.key = r[1];
        cand.value = r[2];
        cand.timestamp_ms = std::stoll(*r[3]);
        cand.reason = *r[4];
      }
    }
    cands_ = std::move(found);
    asio::post(r_.io_, [self = shared_from_this()] { self->ask(); });
  }

 private:
  /// Engine thread: every plugin asked about its rows, each with the route's
  /// call deadline.
  void ask() {
    if (cands_.empty()) return finish();
    unanswered_ = cands_.size();
    for (size_t i = 0; i < cands_.size(); ++i) {
      Candidate& c = cands_[i];
      const std::string route = c.row.ns;
      const uint64_t call_id =
          call_with_deadline(r_.io_, r_.cfg_.route_by_name(route)->call_timeout, "reconcile " + route,
                             {IDEMSINK_OUTCOME_RETRYABLE, "reconcile got no answer within call_timeout"},
                             [self = shared_from_this(), i](idemsink_outcome o, std::string detail) {
                               self->cands_[i].answer = o;
                               self->cands_[i].detail = std::move(detail);
                               if (--self->unanswered_ == 0) self->sort_answers();
                             });
      const idemsink_record rec = record_of(c, route, c.calls);
      r_.handlers_.at(route)->reconcile(rec, call_id);
    }
  }

  /// Engine thread, once every plugin answered (or its deadline passed).
  void sort_answers() {
    summary_.examined = cands_.size();
    for (size_t i = 0; i < cands_.size(); ++i) {
      const Candidate& c = cands_[i];
      // Unknown because its attempts ran out (or it kept killing hosts)
      // after a call that may have applied it, or its re-drives have used up
      // the route's attempts (a remote that refuses it every time): the
      // record has had its chances, so "never happened" settles it as failed.
      const config::RouteConfig* rc = r_.cfg_.route_by_name(c.row.ns);
      const bool spent = c.reason == dlq::to_string(dlq::Reason::MaybeApplied) ||
                         c.reason == dlq::to_string(dlq::Reason::CrashLoop) ||
                         (rc != nullptr && c.calls >= static_cast<uint32_t>(rc->retry.max_attempts));
      if (c.answer == IDEMSINK_OUTCOME_OK) {
        resolve_.push_back(i);
      } else if (c.answer == IDEMSINK_OUTCOME_PERMANENT && c.status == claim::Status::Unknown && spent) {
        not_applied_.push_back(i);
      } else if (c.answer == IDEMSINK_OUTCOME_PERMANENT && c.status == claim::Status::Unknown && c.value) {
        redrive_.push_back(i);
      } else if (c.answer == IDEMSINK_OUTCOME_PERMANENT) {
        ++summary_.left_stuck;
        spdlog::warn(
            "reconcile: route {} key {} (token {}) is {} and its effect did not happen; it waits for its "
            "record or `idemsink reconcile --resolve`",
            c.row.ns, printable(c.row.biz_key), c.token, claim::to_string(c.status));
      } else {
        ++summary_.undecided;
        if (c.status == claim::Status::Unknown) undecided_.push_back(claim::Outcome{c.row, c.attempt, 0, 0, {}, {}});
      }
    }
    r_.pool_.submit("reconcile resolve", [self = shared_from_this()](Connection& c) { self->settle(c); });
  }

  /// Database worker. 1. Applied: done, with the receipt the remote
  /// returned; never applied and spent: failed. 2. Not applied: the unknown
  /// row taken (CAS on attempt, plus a lease so no other host re-drives it
  /// meanwhile) to run it once more. The row stays `unknown` until the
  /// re-drive reports: a host that dies on the way leaves it unknown, to be
  /// reconciled again, never half-done.
  void settle(Connection& c) {
    // One transaction: a resolution and the stamp of its held DLQ row commit
    // together (a host killed in between would leave the row unstamped).
    // Counted once committed, so a re-run counts once.
    std::vector<std::string> settled;  // their held DLQ rows are never sent
    size_t applied = 0, failed = 0;
    c.begin();
    for (size_t i : resolve_) {
      const Candidate& cand = cands_[i];
      if (r_.store_.resolve_applied(c, cand.row, cand.attempt, cand.detail)) {
        ++applied;
        settled.push_back(cand.token);
      }
    }
    for (size_t i : not_applied_) {
      const Candidate& cand = cands_[i];
      if (r_.store_.resolve_not_applied(c, cand.row, cand.attempt, cand.detail)) {
        ++failed;
        settled.push_back(cand.token);
      }
    }
    dlq::write_settlement_events(c, r_.cfg_, r_.store_, r_.outbox_, settled);
    dlq::Outbox::settle_held(c, settled);
    r_.store_.note_undecided(c, undecided_);
    c.commit();
    summary_.applied += applied;
    summary_.failed += failed;
    std::vector<size_t> owned;
    const auto lease = std::max<std::chrono::milliseconds>(r_.cfg_.claim.lease, std::chrono::seconds(10));
    for (size_t i : redrive_) {
      const Candidate& cand = cands_[i];
      if (r_.store_.take_for_redrive(c, cand.row, cand.attempt,
                                     lease + r_.cfg_.route_by_name(cand.row.ns)->call_timeout))
        owned.push_back(i);
    }
    owned_ = std::move(owned);
    asio::post(r_.io_, [self = shared_from_this()] { self->redrive_owned(); });
  }

  /// Engine thread: each row taken run once more, same token.
  void redrive_owned() {
    if (owned_.empty()) return finish();
    redrives_left_ = owned_.size();
    for (size_t i : owned_) {
      Candidate& cand = cands_[i];
      const std::string route = cand.row.ns;
      spdlog::info("reconcile: route {} key {} was not applied; re-driving it once with token {}", route,
                   printable(cand.row.biz_key), cand.token);
      const uint64_t call_id = call_with_deadline(
          r_.io_, r_.cfg_.route_by_name(route)->call_timeout, "re-drive " + route,
          {IDEMSINK_OUTCOME_UNCERTAIN, "no result within call_timeout"},
          [self = shared_from_this(), i](idemsink_outcome o, std::string detail) {
            self->redriven_.push_back({i, o, std::move(detail)});
            if (--self->redrives_left_ > 0) return;
            self->r_.pool_.submit("reconcile re-drive results", [self](Connection& c) { self->record_redrives(c); });
          });
      const idemsink_record rec = record_of(cand, route, cand.calls + 1);
      r_.handlers_.at(route)->invoke(rec, call_id);
    }
  }

  /// Database worker. 3. The re-drives' results, under the epoch we took.
  void record_redrives(Connection& c) {
    using Result = claim::ClaimStore::RedriveResult;
    std::vector<std::string> settled;
    ReconcileSummary counted;
    c.begin();  // results and their held rows' stamps commit together
    for (const Redriven& d : redriven_) {
      const Candidate& cand = cands_[d.index];
      const Result result = d.outcome == IDEMSINK_OUTCOME_OK          ? Result::Applied
                            : d.outcome == IDEMSINK_OUTCOME_PERMANENT ? Result::Rejected
                                                                      : Result::Undecided;
      // False: our lease ran out and another host took it; its result counts.
      if (!r_.store_.record_redrive(c, cand.row, cand.attempt + 1, cand.calls + 1, result, d.detail)) continue;
      if (result == Result::Applied)
        ++counted.redriven_done;
      else if (result == Result::Rejected)
        ++counted.failed;
      else
        ++counted.undecided;
      if (result != Result::Undecided) settled.push_back(cand.token);
    }
    dlq::write_settlement_events(c, r_.cfg_, r_.store_, r_.outbox_, settled);
    dlq::Outbox::settle_held(c, settled);
    c.commit();
    summary_.redriven_done += counted.redriven_done;
    summary_.failed += counted.failed;
    summary_.undecided += counted.undecided;
    asio::post(r_.io_, [self = shared_from_this()] { self->finish(); });
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

  struct Redriven {
    size_t index;
    idemsink_outcome outcome;
    std::string detail;
  };

  Reconciler& r_;
  const std::function<void(ReconcileSummary)> done_;
  std::vector<Candidate> cands_;
  ReconcileSummary summary_;
  size_t unanswered_ = 0;
  std::vector<size_t> resolve_, not_applied_, redrive_;  // indexes into cands_, by the answer
  std::vector<claim::Outcome> undecided_;
  std::vector<size_t> owned_;  // of redrive_, the rows taken
  size_t redrives_left_ = 0;
  std::vector<Redriven> redriven_;
};

bool Reconciler::ask_hook(const claim::ClaimStore::Settled& claim, std::optional<std::string> key,
                          std::optional<std::string> value, int64_t timestamp_ms,
                          std::function<void(idemsink_outcome, std::string)> answered) {
  const auto handler = handlers_.find(claim.row.ns);
  if (handler == handlers_.end()) return false;
  auto cand = std::make_shared<Candidate>();
  cand->row = claim.row;
  cand->status = claim.status;
  cand->attempt = claim.attempt;
  cand->calls = claim.calls;
  cand->token = claim.idem_token;
  cand->src_topic = claim.src_topic;
  cand->src_partition = claim.src_partition;
  cand->src_offset = claim.src_offset;
  cand->key = std::move(key);
  cand->value = std::move(value);
  cand->timestamp_ms = timestamp_ms;
  asio::post(io_, [this, cand, plugin = handler->second, answered = std::move(answered)]() mutable {
    const std::string& route = cand->row.ns;
    const uint64_t call_id =
        call_with_deadline(io_, cfg_.route_by_name(route)->call_timeout, "reconcile " + route,
                           {IDEMSINK_OUTCOME_RETRYABLE, "reconcile got no answer within call_timeout"},
                           [cand, answered = std::move(answered)](idemsink_outcome o, std::string detail) {
                             answered(o, std::move(detail));
                           });
    plugin->reconcile(record_of(*cand, route, cand->calls), call_id);
  });
  return true;
}

std::string describe(const ReconcileSummary& s) {
  return std::to_string(s.examined) + " examined, " + std::to_string(s.applied + s.redriven_done) + " done, " +
         std::to_string(s.failed) + " failed, " + std::to_string(s.undecided) + " undecided, " +
         std::to_string(s.left_stuck) + " stuck left";
}

void Reconciler::run_once_on_engine(std::function<void(ReconcileSummary)> done, std::string route) {
  asio::post(io_, [this, done = std::move(done), route = std::move(route)]() mutable {
    if (running_) return done({});
    only_route_ = std::move(route);
    run_once([this, done = std::move(done)](ReconcileSummary s) {
      only_route_.clear();
      done(s);
    });
  });
}

void Reconciler::run_once(std::function<void(ReconcileSummary)> done, size_t limit) {
  if (handlers_.empty() || running_) {
    asio::post(io_, [done] { done({}); });
    return;
  }
  running_ = true;
  auto round = std::make_shared<Round>(*this, std::move(done));
  pool_.submit("reconcile scan", [round, limit](Connection& c) { round->scan(c, limit); });
}

}  // namespace idemsink::pipeline
