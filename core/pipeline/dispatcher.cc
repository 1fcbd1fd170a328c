#include "core/pipeline/dispatcher.h"

#include "core/pipeline/engine_doors.h"

#include "core/common/log.h"
#include "core/common/util.h"
#include "core/plugin/calls.h"

namespace idemsink::pipeline {

namespace asio = boost::asio;

namespace {
constexpr int kMaxConfirmJobs = 2;
constexpr size_t kConfirmBatch = 500;
}  // namespace

Dispatcher::Dispatcher(asio::io_context& io, db::Pool& pool, const claim::ClaimStore& store, int max_in_flight,
                       std::chrono::milliseconds lease, EngineDoors& doors, LocalTxRunner& local_tx)
    : io_(io),
      pool_(pool),
      store_(store),
      max_in_flight_(max_in_flight),
      lease_(lease),
      doors_(doors),
      local_tx_(local_tx),
      confirmations_(kMaxConfirmJobs),
      confirm_retry_(io) {}

void Dispatcher::make_ready(Record& r) {
  r.move_to(Stage::Ready);
  lanes_[r.route].ready.push_back(r.id);
}

void Dispatcher::choose_probe(Route& route, Lane& lane) {
  // Once per probe round: the scan is over the route's held records. The
  // probe is the record probed the fewest times since the circuit opened
  // (its uncounted calls), then tried the fewest times at all.
  auto best = lane.ready.end();
  std::pair<uint32_t, uint32_t> best_rank{};
  for (auto it = lane.ready.begin(); it != lane.ready.end(); ++it) {
    const Record* r = doors_.at(*it, Stage::Ready);
    if (r == nullptr) continue;
    const std::pair<uint32_t, uint32_t> rank{r->uncounted_calls, r->calls};
    if (best == lane.ready.end() || rank < best_rank) {
      best = it;
      best_rank = rank;
      if (rank == std::pair<uint32_t, uint32_t>{0, 0}) break;
    }
  }
  if (best != lane.ready.end() && best != lane.ready.begin()) {
    const uint64_t id = *best;
    lane.ready.erase(best);
    lane.ready.push_front(id);
  }
  // Every held record was a probe already: it may be these records, not the
  // remote. Probe with one of them now, and fetch another for the next round.
  if (best == lane.ready.end() || best_rank.first > 0) doors_.on_probe_wanted(route);
}

void Dispatcher::pump() {
  const auto now = std::chrono::steady_clock::now();
  for (auto& [route, lane] : lanes_) {
    route->metrics->held.store(route->limiter.held(now) ? 1 : 0, std::memory_order_relaxed);
    route->metrics->rate_limit.store(route->limiter.rate_per_second(), std::memory_order_relaxed);
  }
  for (auto& [route, lane] : lanes_)
    if (route->circuit.probe_wanted() && lane.probe_chosen_in != route->circuit.probe_round()) {
      lane.probe_chosen_in = route->circuit.probe_round();
      choose_probe(*route, lane);
    }
  bool progressed = true;
  while (progressed && in_flight_ < max_in_flight_) {
    progressed = false;
    for (auto& [route, lane] : lanes_) {  // one per route per round: fair between routes
      if (route->held_for_reload) continue;
      const int cap = route->cfg.concurrency;
      while (!lane.ready.empty() && in_flight_ < max_in_flight_ && (cap == 0 || lane.in_flight < cap)) {
        const uint64_t id = lane.ready.front();
        Record* r = doors_.at(id, Stage::Ready);
        if (r == nullptr) {
          lane.ready.pop_front();
          continue;
        }
        // The route's budget (rate limit, Retry-After hold) before the
        // circuit, which would take this record for its probe.
        const auto at = std::chrono::steady_clock::now();
        if (!route->limiter.try_call(at)) {
          wake_at(*route, lane, route->limiter.next_call(at));
          break;
        }
        if (!route->circuit.admit(id)) {  // the remote is down: the record waits for the circuit
          route->limiter.give_back();
          break;
        }
        lane.ready.pop_front();
        take_slot(*r);
        if (needs_confirmation(*r)) {
          r->move_to(Stage::Confirming);
          confirmations_.push(id);
        } else {
          dispatch(*r);
        }
        progressed = true;
        break;
      }
    }
  }
  flush_confirmations();
}

void Dispatcher::wake_at(Route& route, Lane& lane, std::chrono::steady_clock::time_point at) {
  if (!lane.wake) lane.wake = std::make_unique<asio::steady_timer>(io_);
  if (lane.wake_armed && lane.wake->expiry() <= at) return;  // an earlier wake-up pumps anyway
  route.metrics->rate_limit_waits.fetch_add(1, std::memory_order_relaxed);
  lane.wake_armed = true;
  lane.wake->expires_at(at);
  lane.wake->async_wait([this, &lane](boost::system::error_code ec) {
    if (ec) return;
    lane.wake_armed = false;
    pump();
  });
}

bool Dispatcher::needs_confirmation(const Record& r) const {
  const idemsink_kind kind = r.route->handler->kind();
  if (kind == IDEMSINK_KIND_LOCAL_TX) return false;  // its transaction locks the claim row
  if (kind == IDEMSINK_KIND_REMOTE_AT_MOST_ONCE) return true;
  // A quarter of the lease to spare: renewals run every third of it.
  return std::chrono::steady_clock::now() + lease_ / 4 >= r.lease_from + lease_;
}

void Dispatcher::take_slot(Record& r) {
  ++lanes_[r.route].in_flight;
  ++in_flight_;
  r.route->metrics->in_flight.fetch_add(1, std::memory_order_relaxed);
}

void Dispatcher::flush_confirmations() {
  for (auto ids = confirmations_.take(kConfirmBatch); !ids.empty(); ids = confirmations_.take(kConfirmBatch)) {
    std::vector<claim::Outcome> mark, confirm;
    std::vector<uint64_t> mark_ids, confirm_ids;
    for (uint64_t id : ids) {
      Record* r = doors_.at(id, Stage::Confirming);
      if (r == nullptr) continue;
      const bool at_most_once = r->route->handler->kind() == IDEMSINK_KIND_REMOTE_AT_MOST_ONCE;
      (at_most_once ? mark : confirm).push_back(r->outcome());
      (at_most_once ? mark_ids : confirm_ids).push_back(id);
    }
    const auto sent = std::chrono::steady_clock::now();
    pool_.submit(
        "confirm claims before calls",
        [this, mark = std::move(mark), confirm = std::move(confirm), mark_ids = std::move(mark_ids),
         confirm_ids = std::move(confirm_ids), sent](db::Connection& c) {
          // The mark commits before any of these calls starts: a crash from
          // here on leaves "may have been sent", never "certainly not".
          std::vector<bool> ours = store_.confirm_calls(c, mark, true);
          const std::vector<bool> confirmed_too = store_.confirm_calls(c, confirm, false);
          ours.insert(ours.end(), confirmed_too.begin(), confirmed_too.end());
          std::vector<uint64_t> ids = mark_ids;
          ids.insert(ids.end(), confirm_ids.begin(), confirm_ids.end());
          asio::post(io_, [this, ids = std::move(ids), ours = std::move(ours), sent] {
            confirmations_.job_done();
            confirmed(ids, ours, sent);
          });
        },
        [this, ids](const db::DbError& e) {
          // Not confirmed, not called: the records wait for their call slot again.
          spdlog::error("confirming {} claim(s) before their calls gave up ({}); trying again shortly", ids.size(),
                        e.what());
          asio::post(io_, [this, ids] {
            confirmations_.job_done();
            for (uint64_t id : ids)
              if (Record* r = doors_.at(id, Stage::Confirming)) {
                end_call(*r, false);
                make_ready(*r);
              }
            confirm_retry_.expires_after(std::chrono::seconds(1));
            confirm_retry_.async_wait([this](boost::system::error_code ec) {
              if (!ec) pump();
            });
          });
        });
  }
}

void Dispatcher::confirmed(const std::vector<uint64_t>& ids, const std::vector<bool>& ours,
                           std::chrono::steady_clock::time_point sent) {
  const auto now = std::chrono::steady_clock::now();
  for (size_t i = 0; i < ids.size(); ++i) {
    Record* r = doors_.at(ids[i], Stage::Confirming);
    if (r == nullptr) continue;
    if (!ours[i]) {
      const LogScope log_scope(log_fields_of(*r));
      spdlog::warn("route {}: claim on key {} was taken over before its call; not calling it", r->route->cfg.name,
                   printable(r->biz_key));
      end_call(*r, false);
      doors_.on_fenced(*r);
      continue;
    }
    r->lease_from = sent;
    r->lease_known = now;
    dispatch(*r);
  }
  pump();
}

void Dispatcher::end_call(Record& r, bool observe_latency) {
  // Only a call that went out (and so has a latency) can answer a probe.
  if (!observe_latency) r.route->circuit.call_abandoned(r.id);
  --lanes_[r.route].in_flight;
  --in_flight_;
  r.route->metrics->in_flight.fetch_sub(1, std::memory_order_relaxed);
  if (observe_latency)
    r.route->metrics->handler_latency.observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - r.call_started).count());
  r.call_id = 0;
}

void Dispatcher::dispatch(Record& r) {
  Route& route = *r.route;
  r.move_to(Stage::Calling);
  ++r.calls;
  r.call_started = std::chrono::steady_clock::now();
  r.handler = route.handler;
  if (route.handler->kind() == IDEMSINK_KIND_LOCAL_TX) {
    local_tx_.add(r);
    return;
  }
  const uint64_t id = r.id;
  // The completion may arrive on any thread, before invoke returns, twice, or
  // never: the registry hands it over at most once, and only here.
  const uint64_t call_id = plugin::CallRegistry::instance().add(
      [this, id](uint64_t call_id, idemsink_outcome outcome, std::string detail) {
        hand_over(Report{id, call_id, outcome, std::move(detail)});
      },
      route.cfg.name);
  r.call_id = call_id;
  Lane& lane = lanes_[&route];
  lane.deadlines.push_back(Deadline{r.call_started + route.cfg.call_timeout, id, call_id});
  arm_deadlines(lane, lane.deadlines.front().at);
  std::vector<idemsink_header> headers;
  idemsink_record rec = abi_record(r, headers);
  r.handler->invoke(rec, call_id);
}

void Dispatcher::hand_over(Report report) {
  {
    std::lock_guard lock(reports_mu_);
    reports_.push_back(std::move(report));
    if (reports_posted_) return;
    reports_posted_ = true;
  }
  asio::post(io_, [this] {
    std::vector<Report> reports;
    {
      std::lock_guard lock(reports_mu_);
      reports.swap(reports_);
      reports_posted_ = false;
    }
    for (auto& rep : reports) on_call_done(rep.id, rep.call_id, rep.outcome, std::move(rep.detail));
  });
}

void Dispatcher::arm_deadlines(Lane& lane, std::chrono::steady_clock::time_point not_before) {
  if (lane.deadline_armed || lane.deadlines.empty()) return;
  if (!lane.deadline_timer) lane.deadline_timer = std::make_unique<asio::steady_timer>(io_);
  lane.deadline_armed = true;
  lane.deadline_timer->expires_at(std::max(lane.deadlines.front().at, not_before));
  lane.deadline_timer->async_wait([this, &lane](boost::system::error_code ec) {
    if (!ec) check_deadlines(lane);  // still armed meanwhile: a call it ends and retries does not re-arm
  });
}

void Dispatcher::stop() {
  for (auto& [route, lane] : lanes_) {
    if (lane.deadline_timer) lane.deadline_timer->cancel();
    if (lane.wake) lane.wake->cancel();
  }
}

void Dispatcher::check_deadlines(Lane& lane) {
  // At most 10 rounds a second per route: a deadline is met within 100 ms.
  constexpr auto kRoundEvery = std::chrono::milliseconds(100);
  const auto now = std::chrono::steady_clock::now();
  while (!lane.deadlines.empty() && lane.deadlines.front().at <= now) {
    const Deadline d = lane.deadlines.front();
    lane.deadlines.pop_front();
    Record* rec = doors_.at(d.id, Stage::Calling);
    if (rec == nullptr || rec->call_id != d.call_id) continue;          // it ended
    if (!plugin::CallRegistry::instance().cancel(d.call_id)) continue;  // its report is on its way
    const LogScope log_scope(log_fields_of(*rec));
    spdlog::warn("route {}: handler did not report within call_timeout for key {}; treating the call as uncertain",
                 rec->route->cfg.name, printable(rec->biz_key));
    end_call(*rec);
    doors_.on_call_result(
        *rec, IDEMSINK_OUTCOME_UNCERTAIN,
        "no result within call_timeout " + std::to_string(rec->route->cfg.call_timeout.count()) + "ms");
  }
  lane.deadline_armed = false;
  arm_deadlines(lane, now + kRoundEvery);
}

void Dispatcher::on_call_done(uint64_t id, uint64_t call_id, idemsink_outcome outcome, std::string detail) {
  Record* r = doors_.at(id, Stage::Calling);
  if (r == nullptr || r->call_id != call_id || call_id == 0) return;
  end_call(*r);
  doors_.on_call_result(*r, outcome, std::move(detail));
}

}  // namespace idemsink::pipeline
