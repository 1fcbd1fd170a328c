#include "core/pipeline/reconciler.h"

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
                       std::map<std::string, plugin::Instance*> handlers, SliceMetrics* metrics, std::string owner)
    : io_(io),
      pool_(pool),
      cfg_(cfg),
      metrics_(metrics),
      store_(cfg.host.id, std::move(owner), cfg.claim.lease),
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

void Reconciler::run_once(std::function<void(ReconcileSummary)> done, size_t limit) {
  if (handlers_.empty() || running_) {
    asio::post(io_, [done] { done({}); });
    return;
  }
  running_ = true;
  pool_.submit("reconcile scan", [this, done, limit](Connection& c) {
    // An unknown is asked about only once its newest call is old enough to
    // have landed: a call still on its way must not look like "never sent".
    std::vector<claim::ClaimStore::Namespace> routes;
    for (const auto& [name, h] : handlers_) routes.push_back({name, cfg_.reconcile_after(*cfg_.route_by_name(name))});
    auto cands = std::make_shared<std::vector<Candidate>>();
    for (auto& u : store_.unsettled(c, routes, cfg_.claim.stuck_after, limit, false)) {
      Candidate cand;
      cand.row = std::move(u.row);
      cand.status = u.status;
      cand.attempt = u.attempt;
      cand.calls = u.calls;
      cand.token = std::move(u.idem_token);
      cand.src_topic = std::move(u.src_topic);
      cand.src_partition = u.src_partition;
      cand.src_offset = u.src_offset;
      cands->push_back(std::move(cand));
    }
    if (!cands->empty()) {
      std::string tokens;
      for (const auto& cand : *cands) tokens += (tokens.empty() ? "'" : ", '") + cand.token + "'";
      std::map<std::string, size_t> by_token;
      for (size_t i = 0; i < cands->size(); ++i) by_token[(*cands)[i].token] = i;
      // The newest outbox row of each token carries the record's payload.
      for (auto& r :
           c.query("SELECT idem_token, msg_key, msg_value, msg_timestamp, reason FROM idemsink_dlq_outbox WHERE "
                   "idem_token IN (" +
                   tokens + ") ORDER BY id")) {
        Candidate& cand = (*cands)[by_token[*r[0]]];
        cand.key = r[1];
        cand.value = r[2];
        cand.timestamp_ms = std::stoll(*r[3]);
        cand.reason = *r[4];
      }
    }
    asio::post(io_, [this, cands, done] { handle(cands, done); });
  });
}

void Reconciler::handle(std::shared_ptr<std::vector<Candidate>> cands, std::function<void(ReconcileSummary)> done) {
  auto finish = [this, done](ReconcileSummary s) {
    running_ = false;
    if (metrics_) {
      metrics_->reconciled_done.fetch_add(s.applied + s.redriven_done, std::memory_order_relaxed);
      metrics_->reconcile_undecided.store(static_cast<int64_t>(s.undecided + s.left_stuck), std::memory_order_relaxed);
    }
    done(s);
  };
  if (cands->empty()) {
    finish({});
    return;
  }
  // Once every plugin answered (or its deadline passed), act on the answers.
  auto pending = std::make_shared<size_t>(cands->size());
  auto decide = std::make_shared<std::function<void()>>();
  *decide = [this, cands, finish] {
    auto summary = std::make_shared<ReconcileSummary>();
    summary->examined = cands->size();
    std::vector<size_t> resolve, redrive, not_applied;
    std::vector<claim::Outcome> undecided;
    for (size_t i = 0; i < cands->size(); ++i) {
      const Candidate& c = (*cands)[i];
      // Unknown because its attempts ran out (or it kept killing hosts)
      // after a call that may have applied it, or its re-drives have used up
      // the route's attempts (a remote that refuses it every time): the
      // record has had its chances, so "never happened" settles it as failed.
      const config::RouteConfig* rc = cfg_.route_by_name(c.row.ns);
      const bool spent = c.reason == dlq::to_string(dlq::Reason::MaybeApplied) ||
                         c.reason == dlq::to_string(dlq::Reason::CrashLoop) ||
                         (rc != nullptr && c.calls >= static_cast<uint32_t>(rc->retry.max_attempts));
      if (c.answer == IDEMSINK_OUTCOME_OK) {
        resolve.push_back(i);
      } else if (c.answer == IDEMSINK_OUTCOME_PERMANENT && c.status == claim::Status::Unknown && spent) {
        not_applied.push_back(i);
      } else if (c.answer == IDEMSINK_OUTCOME_PERMANENT && c.status == claim::Status::Unknown && c.value) {
        redrive.push_back(i);
      } else if (c.answer == IDEMSINK_OUTCOME_PERMANENT) {
        ++summary->left_stuck;
        spdlog::warn(
            "reconcile: route {} key {} (token {}) is {} and its effect did not happen; it waits for its "
            "record or `idemsink reconcile --resolve`",
            c.row.ns, printable(c.row.biz_key), c.token, claim::to_string(c.status));
      } else {
        ++summary->undecided;
        if (c.status == claim::Status::Unknown) undecided.push_back(claim::Outcome{c.row, c.attempt, 0, 0, {}, {}});
      }
    }
    // 1. Applied: done, with the receipt the remote returned.
    pool_.submit("reconcile resolve", [this, cands, resolve, redrive, not_applied, undecided, summary,
                                       finish](Connection& c) {
      // One transaction: a resolution and the stamp of its held DLQ row
      // commit together (a host killed in between would leave the row
      // unstamped). Counted once committed, so a re-run counts once.
      std::vector<std::string> settled;  // their held DLQ rows are never sent
      size_t applied = 0, failed = 0;
      c.begin();
      for (size_t i : resolve) {
        const Candidate& cand = (*cands)[i];
        if (store_.resolve_applied(c, cand.row, cand.attempt, cand.detail)) {
          ++applied;
          settled.push_back(cand.token);
        }
      }
      for (size_t i : not_applied) {
        const Candidate& cand = (*cands)[i];
        if (store_.resolve_not_applied(c, cand.row, cand.attempt, cand.detail)) {
          ++failed;
          settled.push_back(cand.token);
        }
      }
      dlq::Outbox::settle_held(c, settled);
      store_.note_undecided(c, undecided);
      c.commit();
      summary->applied += applied;
      summary->failed += failed;
      // 2. Not applied: take the unknown row (CAS on attempt, plus a lease so
      //    no other host re-drives it meanwhile) and run it once more. The row
      //    stays `unknown` until the re-drive reports: a host that dies on the
      //    way leaves it unknown, to be reconciled again, never half-done.
      std::vector<size_t> owned;
      const auto lease = std::max<std::chrono::milliseconds>(cfg_.claim.lease, std::chrono::seconds(10));
      for (size_t i : redrive) {
        const Candidate& cand = (*cands)[i];
        if (store_.take_for_redrive(c, cand.row, cand.attempt, lease + cfg_.route_by_name(cand.row.ns)->call_timeout))
          owned.push_back(i);
      }
      asio::post(io_, [this, cands, owned, summary, finish] {
        if (owned.empty()) {
          finish(*summary);
          return;
        }
        auto left = std::make_shared<size_t>(owned.size());
        auto outcomes = std::make_shared<std::vector<std::pair<size_t, std::pair<idemsink_outcome, std::string>>>>();
        for (size_t i : owned) {
          Candidate& cand = (*cands)[i];
          const std::string route = cand.row.ns;
          spdlog::info("reconcile: route {} key {} was not applied; re-driving it once with token {}", route,
                       printable(cand.row.biz_key), cand.token);
          const uint64_t call_id = call_with_deadline(
              io_, cfg_.route_by_name(route)->call_timeout, "re-drive " + route,
              {IDEMSINK_OUTCOME_UNCERTAIN, "no result within call_timeout"},
              [this, cands, i, left, outcomes, summary, finish](idemsink_outcome o, std::string detail) {
                outcomes->push_back({i, {o, std::move(detail)}});
                if (--*left > 0) return;
                // 3. Record the re-drives' results under the epoch we took.
                pool_.submit("reconcile re-drive results", [this, cands, outcomes, summary, finish](Connection& c) {
                  std::vector<std::string> settled;
                  ReconcileSummary counted;
                  c.begin();  // results and their held rows' stamps commit together
                  for (const auto& [idx, res] : *outcomes) {
                    const Candidate& cand = (*cands)[idx];
                    using Result = claim::ClaimStore::RedriveResult;
                    const Result result = res.first == IDEMSINK_OUTCOME_OK          ? Result::Applied
                                          : res.first == IDEMSINK_OUTCOME_PERMANENT ? Result::Rejected
                                                                                    : Result::Undecided;
                    // False: our lease ran out and another host took it; its result counts.
                    if (!store_.record_redrive(c, cand.row, cand.attempt + 1, cand.calls + 1, result, res.second))
                      continue;
                    if (result == Result::Applied)
                      ++counted.redriven_done;
                    else if (result == Result::Rejected)
                      ++counted.failed;
                    else
                      ++counted.undecided;
                    if (result != Result::Undecided) settled.push_back(cand.token);
                  }
                  dlq::Outbox::settle_held(c, settled);
                  c.commit();
                  summary->redriven_done += counted.redriven_done;
                  summary->failed += counted.failed;
                  summary->undecided += counted.undecided;
                  asio::post(io_, [summary, finish] { finish(*summary); });
                });
              });
          const idemsink_record rec = record_of(cand, route, cand.calls + 1);
          handlers_.at(route)->invoke(rec, call_id);
        }
      });
    });
  };
  // Ask every plugin about its rows, each with the route's call deadline.
  for (size_t i = 0; i < cands->size(); ++i) {
    Candidate& c = (*cands)[i];
    const std::string route = c.row.ns;
    plugin::Instance* h = handlers_.at(route);
    const uint64_t call_id = call_with_deadline(
        io_, cfg_.route_by_name(route)->call_timeout, "reconcile " + route,
        {IDEMSINK_OUTCOME_RETRYABLE, "reconcile got no answer within call_timeout"},
        [cands, i, pending, decide](idemsink_outcome o, std::string detail) {
          (*cands)[i].answer = o;
          (*cands)[i].detail = std::move(detail);
          if (--*pending == 0) (*decide)();
        });
    const idemsink_record rec = record_of(c, route, c.calls);
    h->reconcile(rec, call_id);
  }
}

}  // namespace idemsink::pipeline
