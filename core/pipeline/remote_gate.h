// What reconciliation (and anything else calling a route's remote outside
// the dispatcher) asks first, so that its calls keep to what the route's own
// calls keep to: the rate limit, a pause the remote asked for, the circuit.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include "core/config/config.h"
#include "core/pipeline/rate_limiter.h"

namespace idemsink::pipeline {

/// What reconciliation asks before calling a route's remote, so that its
/// look-ups and re-drives keep to what the route's own calls keep to. The
/// engine that owns the routes answers, on its thread.
class RemoteGate {
 public:
  virtual ~RemoteGate() = default;
  enum class Pass {
    Go,      ///< a call may start now (its token is taken)
    Wait,    ///< not before `until`: the rate limit, or a pause the remote asked for
    Closed,  ///< the route's circuit is open: the remote is down
  };
  struct Answer {
    Pass pass = Pass::Go;
    std::chrono::steady_clock::time_point until{};
    /// Not 0: this call is the open circuit's probe (a route whose records
    /// all ended unknown has none of its own to probe with); its answer must
    /// be told, or that it never went out.
    uint64_t probe = 0;
  };
  virtual Answer try_call(const std::string& route) = 0;
  /// The remote answered asking for a pause (a retry-after detail).
  virtual void hold(const std::string& route, std::chrono::milliseconds pause) = 0;
  /// The probe's answer: `healthy` when the remote answered for itself
  /// (applied, rejected, paused), not when it failed to answer.
  virtual void probe_answered(const std::string& route, uint64_t probe, bool healthy) = 0;
  /// The probe's call never went out.
  virtual void probe_abandoned(const std::string& route, uint64_t probe) = 0;
};

/// The gate of a process that runs no routes (`idemsink reconcile --ask`):
/// each route's own rate limit, whole (this process's share of a group's
/// limit is unknown; a manual round is short), and the pauses its remote
/// asks for. It knows no circuit.
class LimitsGate : public RemoteGate {
 public:
  explicit LimitsGate(const config::Config& cfg);
  Answer try_call(const std::string& route) override;
  void hold(const std::string& route, std::chrono::milliseconds pause) override;
  void probe_answered(const std::string&, uint64_t, bool) override {}  // no circuit: never a probe
  void probe_abandoned(const std::string&, uint64_t) override {}

 private:
  std::map<std::string, RateLimiter> limiters_;
};

}  // namespace idemsink::pipeline
