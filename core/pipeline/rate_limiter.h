// A route's call budget: a token bucket of `rate` calls per `per`, `burst`
// deep, scaled by this host's share of the group's limit, plus holds asked
// for by the remote (Retry-After). Pure: time is passed in; the dispatcher
// asks before each call and sleeps until next_call() when refused.
//
// Group scope: a host's share is the fraction of the route's partitions
// (source and retry topics) it owns. The shares of the group add up to the
// whole rate under any assignment without the hosts talking to each other or
// to the database, and follow the work: a host with twice the partitions has
// twice the records to call for. While a partition moves nobody owns it, so
// the sum only dips below the limit, never above.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

#include "core/config/config.h"

namespace idemsink::pipeline {

class RateLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  explicit RateLimiter(const config::RateLimitConfig& cfg, Clock::time_point now = Clock::now());

  /// Whether the route has a rate at all (holds apply either way).
  bool limited() const { return cfg_.rate > 0; }
  /// A reload's limit: the time until `now` counts at the old rate, the
  /// hold (Retry-After) stands, the group share is set again by the engine.
  void set_config(const config::RateLimitConfig& cfg, Clock::time_point now);
  /// This host's fraction of the limit (group scope), 0..1.
  void set_share(double share, Clock::time_point now);
  double share() const { return share_; }
  /// Calls per second this host may start now.
  double rate_per_second() const;

  /// Takes one call's token if the route may call now.
  bool try_call(Clock::time_point now);
  /// Returns the token of a call that did not start after all.
  void give_back();
  /// When the next call may start (now or later).
  Clock::time_point next_call(Clock::time_point now);
  /// Holds every call until `until` (a Retry-After), capped at max_hold.
  void hold(Clock::time_point until, Clock::time_point now);
  bool held(Clock::time_point now) const { return now < held_until_; }
  Clock::time_point held_until() const { return held_until_; }
  /// Tokens in the bucket now (for /status and the metrics).
  double tokens(Clock::time_point now);

 private:
  void refill(Clock::time_point now);
  double capacity() const;

  config::RateLimitConfig cfg_;
  double share_ = 1.0;
  double tokens_ = 0;
  Clock::time_point refilled_;
  Clock::time_point held_until_{};
};

/// The hold a retryable call's detail asks for ("retry-after=1500ms: ..."),
/// in milliseconds, or 0. The convention of plugin_abi.h.
int64_t retry_after_ms(std::string_view detail);

}  // namespace idemsink::pipeline
