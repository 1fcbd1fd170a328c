// Route health: a circuit breaker per route, so that an outage of the remote
// spends neither records nor their attempts.
//
// The rule: of the route's last `window` calls that ended (at least
// `min_calls` of them), if `failure_percent` or more failed retryable or
// uncertain, the circuit opens. Successes and permanent answers are healthy:
// a remote that says "no" to one order is up. While open
//   - no call of the route starts, except the probe;
//   - the route's partitions stop fetching (the host stays in its group);
//   - a call that fails does not count toward retry.max_attempts: the record
//     waits for the circuit instead of moving toward the DLQ (an at-most-once
//     record whose call was uncertain still ends unknown: it may have been
//     sent, so it is never called again).
// After probe_initial one call goes out as the probe (half-open); a healthy
// answer closes the circuit, a failure re-opens it with the wait doubled, up
// to probe_max. Calls that were in flight when it opened do not decide
// anything: only the probe does.
//
// Records that fail on their own must not look like an outage: a record's
// failure enters the window only on its first counted call (its retries
// failing again say nothing new about the remote), and the probe is the held
// record tried the fewest times, a fresh one when there is one (the
// dispatcher picks it; the engine fetches one when every held record has
// been tried), so a handful of records that always fail can neither open the
// circuit nor keep it open. When no fresh record comes (a quiet topic) a
// record refusing for itself is every probe: the engine bounds any record's
// uncounted wait (route.circuit.max_wait), after which its failures count.
//
// Pure state; the engine owns the timer, the log lines and the fetch pause.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "core/config/config.h"

namespace idemsink::pipeline {

class CircuitBreaker {
 public:
  enum class State {
    Closed,
    Open,      ///< waiting for the next probe to be due
    HalfOpen,  ///< a probe may go out, or is out
  };
  /// What a result changed.
  enum class Change { None, Opened, Closed, ProbeFailed };

  explicit CircuitBreaker(const config::CircuitConfig& cfg) : cfg_(cfg) {}

  /// A reload's settings: the thresholds apply from the next result on (a
  /// window of another size starts empty); the state, and an open
  /// circuit's probing, go on.
  void set_config(const config::CircuitConfig& cfg) {
    if (cfg.window != cfg_.window) reset_window();
    cfg_ = cfg;
  }

  State state() const { return state_; }
  bool closed() const { return state_ == State::Closed; }

  /// A call of record `record_id` ended; `failed`: retryable or uncertain.
  Change on_result(uint64_t record_id, bool failed);
  /// The wait before the next probe (after Opened or ProbeFailed).
  std::chrono::milliseconds probe_wait() const { return probe_wait_; }
  /// The probe timer fired: one call may go out.
  void probe_due();
  /// Half-open with no probe out: the next call admitted is the probe.
  bool probe_wanted() const { return state_ == State::HalfOpen && probe_record_ == 0; }
  /// Counts the chances to probe (probe due, or an abandoned probe): the
  /// dispatcher picks a probe once per chance.
  uint64_t probe_round() const { return probe_round_; }
  /// Whether a call of `record_id` may start now; in half-open state the
  /// first one asked becomes the probe.
  bool admit(uint64_t record_id);
  /// The probe's call never went out (its claim was taken over, or could not
  /// be confirmed): the next call may probe instead.
  void call_abandoned(uint64_t record_id);

  /// Failures and calls in the window (for the log line when it opens).
  int window_failures() const { return failures_; }
  int window_calls() const { return static_cast<int>(window_.size()); }

 private:
  void reset_window();

  config::CircuitConfig cfg_;  // a copy: routes are moved into place
  State state_ = State::Closed;
  std::vector<bool> window_;  // ring of the last results: true = failed
  size_t next_ = 0;
  int failures_ = 0;
  std::chrono::milliseconds probe_wait_{0};
  uint64_t probe_record_ = 0;  // 0: no probe out
  uint64_t probe_round_ = 0;
};

/// How long one record's failed calls have been held by its route's open
/// circuit, counted per open period: held again in a later period (the
/// circuit closed and opened since), it starts from zero, so the outages of
/// a flapping remote never add up to route.circuit.max_wait; only one
/// outage, or a record refused for itself while it alone probes, reaches it.
class CircuitWait {
 public:
  using Clock = std::chrono::steady_clock;
  /// A failed call is held at `now` in the route's open period `period`
  /// (they count from 1): true once held for `max_wait` in that period.
  bool over(uint64_t period, Clock::duration max_wait, Clock::time_point now);
  Clock::duration held_for(Clock::time_point now) const { return now - since_; }

 private:
  Clock::time_point since_;
  uint64_t period_ = 0;  // 0: never held
};

}  // namespace idemsink::pipeline
