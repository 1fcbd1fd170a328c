// Route health: what a route's circuit and its remote's pauses do to the
// route. The breaker (circuit_breaker.h) is pure state; this module makes
// its decisions happen: the probe timer, the log lines, the route's
// fetching and its place in the backpressure count, the wait of the
// records it holds, and the route-wide hold a Retry-After answer asks for.
//
// The engine tells it what happened (a call ended, a record arrived or
// left); it never reaches into the engine. What it decides for a record is
// returned (held by the circuit or not); the engine acts on it.
//
// Delivery semantics: nothing here ends a record. A record held by the
// circuit keeps its claim and idem_token and is called again; its held
// calls do not count toward retry.max_attempts for route.circuit.max_wait.
#pragma once

#include "core/common/asio.h"
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "core/pipeline/fetch_gate.h"
#include "core/pipeline/record.h"

namespace idemsink::pipeline {

class EngineDoors;

class RouteHealth {
 public:
  /// A probe falling due is reported through `doors.on_calls_may_start`.
  RouteHealth(boost::asio::io_context& io, EngineDoors& doors);

  /// A call of `r` ended with `outcome` (not a Retry-After pause): feeds the
  /// route's circuit (it may open or close) and says whether the record now
  /// waits for it, its call uncounted: true when the call failed while the
  /// circuit is not closed, unless the record has waited past max_wait or
  /// its at-most-once call may have been sent.
  bool after_call(Record& r, idemsink_outcome outcome, const std::string& detail);
  /// A record of the route was applied without a call (a local_tx write).
  void healthy(Route& route, uint64_t record_id);

  /// The remote asked for a pause of `pause` (Retry-After) on a call
  /// (`what`: whose, and its answer, for the log): the route's calls are held
  /// until then.
  void hold_route(Route& route, std::chrono::milliseconds pause, std::string_view what);

  /// A record of the route entered the pipeline: it is a candidate probe.
  /// Whether it counts toward the host's backpressure (not while the
  /// circuit holds the route's records).
  bool record_arrived(Route& route);
  /// A record of the route left the pipeline; its backpressure count goes
  /// (or its place among those waiting for holds).
  void record_left(Route& route, bool on_hold);

  /// `r` waits for an entity's hold, which may take until a person acts:
  /// it leaves the host's backpressure count (a held entity must not pause
  /// every route) and counts against its route's order_by.max_waiting,
  /// at which the route's own topic stops fetching (until half as many
  /// wait). Its retry topics keep fetching: their records release holds.
  void put_on_hold(Record& r);
  /// `r` no longer waits for a hold: back in the backpressure count.
  void take_off_hold(Record& r);
  /// Every record the route holds has been a probe since the circuit opened
  /// (the dispatcher found no fresh one): fetch until one arrives.
  void want_fresh_probe(Route& route);

  /// The route's fetching and backpressure accounting, as its circuit's
  /// state wants them.
  void follow(Route& route);
  /// The route's fetching as its records waiting for holds want it.
  void follow_holds(Route& route);
  /// Stops the route's probe timer (the engine is stopping).
  void stop(Route& route);

  /// A call's result fed to the route's circuit (it may open or close), by
  /// the call's id: a record's, or a reconcile call's that was the probe.
  void note(Route& route, uint64_t record_id, bool failed, const std::string& detail);

 private:
  bool wait_over(Record& r);
  void arm_probe(Route& route);

  boost::asio::io_context& io_;
  EngineDoors& doors_;
};

}  // namespace idemsink::pipeline
