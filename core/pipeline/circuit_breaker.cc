#include "core/pipeline/circuit_breaker.h"

#include <algorithm>

namespace idemsink::pipeline {

CircuitBreaker::Change CircuitBreaker::on_result(uint64_t record_id, bool failed) {
  if (!cfg_.enabled) return Change::None;
  switch (state_) {
    case State::Closed: {
      const size_t size = static_cast<size_t>(cfg_.window);
      if (window_.size() < size) {
        window_.push_back(failed);
      } else {
        failures_ -= window_[next_] ? 1 : 0;
        window_[next_] = failed;
        next_ = (next_ + 1) % size;
      }
      failures_ += failed ? 1 : 0;
      const int calls = static_cast<int>(window_.size());
      if (calls >= cfg_.min_calls && failures_ * 100 >= cfg_.failure_percent * calls) {
        state_ = State::Open;
        probe_wait_ = cfg_.probe_initial;
        return Change::Opened;
      }
      return Change::None;
    }
    case State::Open:
    case State::HalfOpen:
      if (record_id != probe_record_) return Change::None;  // began before the circuit opened
      probe_record_ = 0;
      if (!failed) {
        state_ = State::Closed;
        reset_window();
        return Change::Closed;
      }
      state_ = State::Open;
      probe_wait_ = std::min(cfg_.probe_max, probe_wait_ * 2);
      return Change::ProbeFailed;
  }
  return Change::None;
}

void CircuitBreaker::probe_due() {
  if (state_ == State::Open) state_ = State::HalfOpen;
  ++probe_round_;
}

bool CircuitBreaker::admit(uint64_t record_id) {
  switch (state_) {
    case State::Closed: return true;
    case State::Open: return false;
    case State::HalfOpen:
      if (probe_record_ != 0) return probe_record_ == record_id;
      probe_record_ = record_id;
      return true;
  }
  return false;
}

void CircuitBreaker::call_abandoned(uint64_t record_id) {
  if (probe_record_ != 0 && probe_record_ == record_id) {
    probe_record_ = 0;
    ++probe_round_;
  }
}

void CircuitBreaker::reset_window() {
  window_.clear();
  next_ = 0;
  failures_ = 0;
}

bool CircuitWait::over(uint64_t period, Clock::duration max_wait, Clock::time_point now) {
  if (period != period_) {
    since_ = now;
    period_ = period;
  }
  return now - since_ >= max_wait;
}

}  // namespace idemsink::pipeline
