#include "core/pipeline/rate_limiter.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace idemsink::pipeline {

RateLimiter::RateLimiter(const config::RateLimitConfig& cfg, Clock::time_point now)
    : cfg_(cfg), tokens_(capacity()), refilled_(now) {}

double RateLimiter::rate_per_second() const {
  if (!limited()) return 0;
  return static_cast<double>(cfg_.rate) * share_ * 1000.0 / static_cast<double>(cfg_.per.count());
}

// At least one token deep: a host with a small share still calls, in turn;
// one without partitions of the route does not call at all.
double RateLimiter::capacity() const {
  if (share_ <= 0) return 0;
  const double burst = static_cast<double>(cfg_.burst > 0 ? cfg_.burst : cfg_.rate);
  return std::max(1.0, burst * share_);
}

void RateLimiter::set_config(const config::RateLimitConfig& cfg, Clock::time_point now) {
  const bool was_limited = limited();
  refill(now);  // the time until now at the old rate
  cfg_ = cfg;
  if (cfg_.scope == config::RateScope::Host) share_ = 1.0;
  // A limit newly set starts with a full bucket, as one set at start does;
  // a changed one keeps what it holds, up to its new depth.
  tokens_ = was_limited ? std::min(tokens_, capacity()) : capacity();
}

void RateLimiter::set_share(double share, Clock::time_point now) {
  if (cfg_.scope == config::RateScope::Host) return;
  refill(now);
  share_ = std::clamp(share, 0.0, 1.0);
  tokens_ = std::min(tokens_, capacity());
}

void RateLimiter::refill(Clock::time_point now) {
  if (now <= refilled_) return;
  const double elapsed_s = std::chrono::duration<double>(now - refilled_).count();
  tokens_ = std::min(capacity(), tokens_ + elapsed_s * rate_per_second());
  refilled_ = now;
}

bool RateLimiter::try_call(Clock::time_point now) {
  if (held(now)) return false;
  if (!limited()) return true;
  refill(now);
  if (tokens_ < 1.0) return false;
  tokens_ -= 1.0;
  return true;
}

void RateLimiter::give_back() {
  if (limited()) tokens_ = std::min(capacity(), tokens_ + 1.0);
}

RateLimiter::Clock::time_point RateLimiter::next_call(Clock::time_point now) {
  if (held(now)) return held_until_;
  if (!limited()) return now;
  refill(now);
  if (tokens_ >= 1.0) return now;
  const double rate = rate_per_second();
  if (rate <= 0) return now + std::chrono::seconds(1);  // no share now: look again when the assignment may have moved
  const auto wait = std::chrono::duration<double>((1.0 - tokens_) / rate);
  return now + std::chrono::ceil<std::chrono::microseconds>(wait);
}

void RateLimiter::hold(Clock::time_point until, Clock::time_point now) {
  held_until_ = std::max(held_until_, std::min(until, now + cfg_.max_hold));
}

double RateLimiter::tokens(Clock::time_point now) {
  refill(now);
  return limited() ? tokens_ : 0;
}

int64_t retry_after_ms(std::string_view detail) {
  constexpr std::string_view prefix = "retry-after=";
  if (detail.substr(0, prefix.size()) != prefix) return 0;
  int64_t ms = 0;
  const char* begin = detail.data() + prefix.size();
  const char* end = detail.data() + detail.size();
  auto [p, ec] = std::from_chars(begin, end, ms);
  if (ec != std::errc() || ms < 0 || std::string_view(p, static_cast<size_t>(end - p)).substr(0, 2) != "ms") return 0;
  return ms;
}

}  // namespace idemsink::pipeline
