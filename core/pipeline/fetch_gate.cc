#include "core/pipeline/fetch_gate.h"

#include "core/common/log.h"
#include "core/kafka/consumer.h"

namespace idemsink::pipeline {

void FetchGate::attach(kafka::Consumer* consumer) {
  std::lock_guard lk(mu_);
  consumer_ = consumer;
}

void FetchGate::buffered_delta(int64_t delta) {
  const int64_t now = buffered_.fetch_add(delta, std::memory_order_relaxed) + delta;
  const bool over = now >= static_cast<int64_t>(max_buffered_);
  const bool drained = now <= static_cast<int64_t>(max_buffered_ / 2);
  std::lock_guard lk(mu_);
  if (!backpressure_ && over) {
    backpressure_ = true;
    spdlog::info("fetching paused ({} records buffered, host.max_buffered_records {})", now, max_buffered_);
    apply_locked();
  } else if (backpressure_ && drained) {
    backpressure_ = false;
    spdlog::info("fetching resumed ({} records buffered)", now);
    apply_locked();
  }
}

void FetchGate::set_operator_pause(bool paused) {
  std::lock_guard lk(mu_);
  if (operator_paused_ == paused) return;
  operator_paused_ = paused;
  spdlog::info("fetching {} by the operator", paused ? "paused" : "resumed");
  apply_locked();
}

bool FetchGate::operator_paused() const {
  std::lock_guard lk(mu_);
  return operator_paused_;
}

bool FetchGate::paused_all() const {
  std::lock_guard lk(mu_);
  return operator_paused_ || backpressure_;
}

void FetchGate::assigned(const std::vector<kafka::TopicPartition>& tps) {
  // librdkafka keeps a partition's pause across revoke and re-assignment:
  // tell it explicitly what a newly assigned partition should do.
  std::lock_guard lk(mu_);
  std::vector<kafka::TopicPartition> pause, resume;
  for (const auto& tp : tps) {
    assigned_.insert(tp);
    held_.erase(tp);
    if (wanted_paused_locked(tp)) {
      paused_.insert(tp);
      pause.push_back(tp);
    } else {
      paused_.erase(tp);
      resume.push_back(tp);
    }
  }
  if (consumer_ == nullptr) return;
  consumer_->pause(pause);
  consumer_->resume(resume);
}

void FetchGate::revoked(const std::vector<kafka::TopicPartition>& tps) {
  std::lock_guard lk(mu_);
  for (const auto& tp : tps) {
    assigned_.erase(tp);
    held_.erase(tp);
    paused_.erase(tp);
  }
}

void FetchGate::hold(const kafka::TopicPartition& tp, Hold reason) {
  std::lock_guard lk(mu_);
  if (!assigned_.count(tp)) return;
  held_[tp] |= static_cast<unsigned>(reason);
  apply_locked();
}

void FetchGate::release(const kafka::TopicPartition& tp, Hold reason) {
  std::lock_guard lk(mu_);
  auto it = held_.find(tp);
  if (it == held_.end()) return;
  it->second &= ~static_cast<unsigned>(reason);
  if (it->second == 0) held_.erase(it);
  apply_locked();
}

void FetchGate::set_topics_paused(const std::vector<std::string>& topics, TopicPause reason, bool paused) {
  const auto bit = static_cast<unsigned>(reason);
  std::lock_guard lk(mu_);
  for (const auto& t : topics) {
    if (paused) {
      paused_topics_[t] |= bit;
    } else if (auto it = paused_topics_.find(t); it != paused_topics_.end() && (it->second &= ~bit) == 0) {
      paused_topics_.erase(it);
    }
  }
  apply_locked();
}

bool FetchGate::fetching(const kafka::TopicPartition& tp) const {
  std::lock_guard lk(mu_);
  return assigned_.count(tp) && !paused_.count(tp);
}

void FetchGate::exempt_from_backpressure(std::set<std::string> topics) {
  std::lock_guard lk(mu_);
  backpressure_exempt_ = std::move(topics);
  apply_locked();
}

bool FetchGate::wanted_paused_locked(const kafka::TopicPartition& tp) const {
  return operator_paused_ || (backpressure_ && !backpressure_exempt_.count(tp.topic)) || held_.count(tp) ||
         paused_topics_.count(tp.topic);
}

void FetchGate::apply_locked() {
  std::vector<kafka::TopicPartition> pause, resume;
  for (const auto& tp : assigned_) {
    const bool want = wanted_paused_locked(tp);
    const bool is = paused_.count(tp) != 0;
    if (want && !is) {
      pause.push_back(tp);
      paused_.insert(tp);
    } else if (!want && is) {
      resume.push_back(tp);
      paused_.erase(tp);
    }
  }
  if (consumer_ == nullptr) return;
  consumer_->pause(pause);
  consumer_->resume(resume);
}

}  // namespace idemsink::pipeline
