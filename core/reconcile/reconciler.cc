#include "core/reconcile/reconciler.h"
#include "core/reconcile/candidate.h"

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

Reconciler::Reconciler(asio::io_context& io, db::Pool& pool, const config::Config& cfg,
                       std::map<std::string, std::shared_ptr<plugin::Instance>> handlers, RemoteGate& gate,
                       metrics::SliceMetrics* metrics, std::string owner)
    : io_(io),
      pool_(pool),
      cfg_(cfg),
      routes_(std::make_shared<const config::Config>(cfg)),
      gate_(gate),
      metrics_(metrics),
      store_(cfg.host.id, owner, cfg.claim.lease),
      outbox_(std::move(owner), cfg.claim.lease),
      timer_(io) {
  for (auto& [route, h] : handlers)
    if (h->can_reconcile()) handlers_.emplace(route, h);
}

void Reconciler::start(std::chrono::milliseconds first_delay) {
  const auto period = cfg_.claim.reconcile_interval;
  if (period.count() == 0) return;  // a round with no route to ask ends at once
  timer_.expires_after(first_delay);
  timer_.async_wait([this, period](boost::system::error_code ec) {
    if (ec || stopped_) return;
    run_once(
        [this, period](ReconcileSummary s) {
          if (s.examined)
            spdlog::info(
                "reconcile: {} examined, {} applied -> done, {} re-driven -> done, {} failed, {} undecided, {} "
                "stuck left for an operator, {} deferred (circuit open or no budget)",
                s.examined, s.applied, s.redriven_done, s.failed, s.undecided, s.left_stuck, s.deferred);
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

void Reconciler::set_routes(std::shared_ptr<const config::Config> routes,
                            const std::map<std::string, std::shared_ptr<plugin::Instance>>& handlers) {
  std::map<std::string, std::shared_ptr<plugin::Instance>> next;
  for (const auto& [route, h] : handlers)
    if (h->can_reconcile()) next.emplace(route, h);
  std::lock_guard lk(hook_mu_);
  routes_ = std::move(routes);
  handlers_ = std::move(next);
}

bool Reconciler::ask_hook(const claim::ClaimStore::Settled& claim, std::optional<std::string> key,
                          std::optional<std::string> value, int64_t timestamp_ms,
                          std::function<void(idemsink_outcome, std::string)> answered) {
  {
    std::lock_guard lk(hook_mu_);  // an API thread; a reload changes the map on the engine thread
    if (!handlers_.contains(claim.row.ns)) return false;
  }
  auto cand = std::make_shared<Candidate>();
  cand->facts() = claim.facts();
  cand->key = std::move(key);
  cand->value = std::move(value);
  cand->timestamp_ms = timestamp_ms;
  // The instance is read on the engine thread, where a reload replaces it,
  // or removes the route meanwhile.
  asio::post(io_, [this, cand, answered = std::move(answered)]() mutable {
    const auto handler = handlers_.find(cand->row.ns);
    const config::RouteConfig* rc = routes_->route_by_name(cand->row.ns);
    if (handler == handlers_.end() || rc == nullptr)
      return answered(IDEMSINK_OUTCOME_RETRYABLE, "the route was removed by a reload");
    cand->handler = handler->second;
    const config::RouteConfig& route = *rc;
    const uint64_t call_id =
        plugin::call_with_deadline(io_, route.call_timeout, "reconcile " + route.name,
                                   {IDEMSINK_OUTCOME_RETRYABLE, "reconcile got no answer within call_timeout"},
                                   [cand, answered = std::move(answered)](idemsink_outcome o, std::string detail) {
                                     answered(o, std::move(detail));
                                   });
    cand->handler->reconcile(record_of(*cand, route, cand->calls), call_id);
  });
  return true;
}

std::string describe(const ReconcileSummary& s) {
  return std::to_string(s.examined) + " examined, " + std::to_string(s.applied + s.redriven_done) + " done, " +
         std::to_string(s.failed) + " failed, " + std::to_string(s.undecided) + " undecided, " +
         std::to_string(s.left_stuck) + " stuck left, " + std::to_string(s.deferred) + " deferred";
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
  begin_round(std::move(done), limit);
}

}  // namespace idemsink::reconcile
