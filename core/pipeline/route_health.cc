#include "core/pipeline/route_health.h"

#include "core/pipeline/engine_doors.h"

#include <spdlog/spdlog.h>

#include "core/common/log.h"

namespace idemsink::pipeline {

namespace asio = boost::asio;

RouteHealth::RouteHealth(asio::io_context& io, EngineDoors& doors) : io_(io), doors_(doors) {}

bool RouteHealth::after_call(Record& r, idemsink_outcome outcome, const std::string& detail) {
  Route& route = *r.route;
  const idemsink_kind kind = route.handler->kind();
  const bool failed = outcome == IDEMSINK_OUTCOME_RETRYABLE || outcome == IDEMSINK_OUTCOME_UNCERTAIN;
  // A record that already failed a counted call here and fails again says
  // nothing new about the remote: while the circuit is closed only its first
  // failure is a sample. (Open or half-open, only the probe's result counts,
  // and it always does.)
  const bool failed_before = r.calls - r.calls_on_arrival - 1 > r.uncounted_calls;
  if (!(failed && failed_before && route.circuit.closed())) note(route, r.id, failed, detail);
  // An at-most-once call that may have been sent is never made again: the
  // circuit cannot hold it (it ends unknown, as the failure policy says).
  return failed && !route.circuit.closed() &&
         !(outcome == IDEMSINK_OUTCOME_UNCERTAIN && kind == IDEMSINK_KIND_REMOTE_AT_MOST_ONCE) && !wait_over(r);
}

void RouteHealth::healthy(Route& route, uint64_t record_id) { note(route, record_id, false, ""); }

bool RouteHealth::wait_over(Record& r) {
  // The circuit cannot tell a remote that is down from a record it refuses
  // for itself when that record is the only one left to probe with: bound
  // how long any record's failures go uncounted, then let them count (it
  // goes on toward retry topics or the DLQ, the circuit stays open).
  const auto max_wait = r.route->cfg.circuit.max_wait;
  if (max_wait.count() == 0) return false;
  const auto now = std::chrono::steady_clock::now();
  if (!r.circuit_wait.over(r.route->health.open_periods, max_wait, now)) return false;
  spdlog::warn(
      "route {}: key {} has waited {}s for the open circuit (route.circuit.max_wait); its failed call {} "
      "counts toward retry.max_attempts",
      r.route->cfg.name, printable(r.biz_key),
      std::chrono::duration_cast<std::chrono::seconds>(r.circuit_wait.held_for(now)).count(), r.calls);
  return true;
}

void RouteHealth::hold_route(Route& route, std::chrono::milliseconds pause, std::string_view what) {
  const auto now = std::chrono::steady_clock::now();
  if (!route.limiter.held(now)) {
    route.metrics->holds.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("route {}: the remote asked for a pause of {}ms ({}); holding the route's calls until then",
                 route.cfg.name, pause.count(), what);
  }
  route.limiter.hold(now + pause, now);
  route.metrics->held.store(1, std::memory_order_relaxed);
}

bool RouteHealth::record_arrived(Route& route) {
  ++route.live;
  const bool counted = !route.health.buffer_exempt;
  // A record to probe with has arrived: one fetch per probe round at most.
  route.health.fetch_for_probe = false;
  if (!route.circuit.closed()) follow(route);
  return counted;
}

void RouteHealth::record_left(Route& route, bool on_hold) {
  --route.live;
  if (on_hold) {
    --route.waiting_on_hold;
    follow_holds(route);
  } else if (!route.health.buffer_exempt) {
    route.gate->buffered_delta(-1);
  }
  if (!route.circuit.closed()) follow(route);
}

void RouteHealth::put_on_hold(Record& r) {
  if (r.on_hold) return;
  r.on_hold = true;
  Route& route = *r.route;
  ++route.waiting_on_hold;
  if (!route.health.buffer_exempt) route.gate->buffered_delta(-1);
  follow_holds(route);
}

void RouteHealth::take_off_hold(Record& r) {
  if (!r.on_hold) return;
  r.on_hold = false;
  Route& route = *r.route;
  --route.waiting_on_hold;
  if (!route.health.buffer_exempt) route.gate->buffered_delta(1);
  follow_holds(route);
}

void RouteHealth::follow_holds(Route& route) {
  const int64_t bound = route.cfg.order_by.max_waiting;
  const bool pause = route.paused_for_holds ? route.waiting_on_hold > bound / 2 : route.waiting_on_hold >= bound;
  if (pause == route.paused_for_holds) return;
  route.paused_for_holds = pause;
  if (pause)
    spdlog::warn(
        "route {}: {} records wait for entities' holds (route.order_by.max_waiting {}); its topic stops "
        "fetching until half as many wait (other routes go on). A replay of a held record comes through this "
        "topic and waits too: release the hold (`idemsink order-holds release`) or raise max_waiting",
        route.cfg.name, route.waiting_on_hold, bound);
  else
    spdlog::info("route {}: {} records wait for holds; its topic fetches again", route.cfg.name, route.waiting_on_hold);
  route.gate->set_topics_paused({route.cfg.topic}, FetchGate::TopicPause::Holds, pause);
}

void RouteHealth::want_fresh_probe(Route& route) {
  if (route.health.fetch_for_probe) return;
  route.health.fetch_for_probe = true;
  follow(route);
}

void RouteHealth::note(Route& route, uint64_t record_id, bool failed, const std::string& detail) {
  const LogScope log_scope(LogFields{route.cfg.name});
  CircuitBreaker& circuit = route.circuit;
  Route::Health& health = route.health;
  const auto change = circuit.on_result(record_id, failed);
  if (change == CircuitBreaker::Change::None) return;
  const std::string& name = route.cfg.name;
  if (change == CircuitBreaker::Change::Closed) {
    const double open_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - health.opened_at).count();
    spdlog::info("route {}: circuit closed after {:.1f}s open: the probe succeeded; calls and fetching resume", name,
                 open_s);
    health.probe_timer.reset();
    health.fetch_for_probe = false;
    route.metrics->circuit_open.store(0, std::memory_order_relaxed);
    follow(route);
    return;  // the caller pumps
  }
  if (change == CircuitBreaker::Change::Opened) {
    health.opened_at = std::chrono::steady_clock::now();
    ++health.open_periods;
    route.metrics->circuit_opens.fetch_add(1, std::memory_order_relaxed);
    route.metrics->circuit_open.store(1, std::memory_order_relaxed);
    spdlog::error(
        "route {}: circuit opened: {} of its last {} calls failed (last: {}); no calls and no fetching for its "
        "partitions until a probe succeeds (first in {}ms); failed calls do not count toward max_attempts meanwhile",
        name, circuit.window_failures(), circuit.window_calls(), printable(detail), circuit.probe_wait().count());
  } else {
    spdlog::warn("route {}: circuit stays open: the probe failed ({}); next probe in {}ms", name, printable(detail),
                 circuit.probe_wait().count());
  }
  follow(route);
  arm_probe(route);
}

void RouteHealth::arm_probe(Route& route) {
  route.health.probe_timer = std::make_unique<asio::steady_timer>(io_, route.circuit.probe_wait());
  route.health.probe_timer->async_wait([this, &route](boost::system::error_code ec) {
    if (ec) return;
    route.circuit.probe_due();
    follow(route);
    doors_.on_calls_may_start();
  });
}

void RouteHealth::follow(Route& route) {
  Route::Health& health = route.health;
  const auto state = route.circuit.state();
  // Held records leave the backpressure count while the circuit is not
  // closed, and come back to it when it closes.
  const bool exempt = state != CircuitBreaker::State::Closed;
  if (exempt != health.buffer_exempt) {
    // Records waiting for holds are out of the count either way.
    const int64_t counted = route.live - route.waiting_on_hold;
    route.gate->buffered_delta(exempt ? -counted : counted);
    health.buffer_exempt = exempt;
  }
  // Not closed: no fetching, but for a record to probe with: when the route
  // has none left (a rebalance took them, or an at-most-once route's records
  // all ended unknown), or every record it holds has failed since (they may
  // be failing on their own: a fresh one tells whether the remote is up).
  const bool pause = state != CircuitBreaker::State::Closed && !health.fetch_for_probe &&
                     !(state == CircuitBreaker::State::HalfOpen && route.live == 0);
  if (pause != health.topics_paused) {
    route.gate->set_topics_paused(route.topics(), FetchGate::TopicPause::Circuit, pause);
    health.topics_paused = pause;
  }
}

void RouteHealth::stop(Route& route) {
  if (route.health.probe_timer) route.health.probe_timer->cancel();
}

}  // namespace idemsink::pipeline
