#include "core/pipeline/remote_gate.h"

namespace idemsink::pipeline {

LimitsGate::LimitsGate(const config::Config& cfg) {
  for (const auto& route : cfg.routes) limiters_.emplace(route.name, RateLimiter(route.rate_limit));
}

RemoteGate::Answer LimitsGate::try_call(const std::string& route) {
  auto it = limiters_.find(route);
  if (it == limiters_.end()) return {};
  const auto now = std::chrono::steady_clock::now();
  if (!it->second.try_call(now)) return {Pass::Wait, it->second.next_call(now)};
  return {};
}

void LimitsGate::hold(const std::string& route, std::chrono::milliseconds pause) {
  if (auto it = limiters_.find(route); it != limiters_.end()) {
    const auto now = std::chrono::steady_clock::now();
    it->second.hold(now + pause, now);
  }
}

}  // namespace idemsink::pipeline
