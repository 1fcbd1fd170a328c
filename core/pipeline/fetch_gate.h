// Which assigned partitions fetch, and the one place that pauses and resumes
// them. A partition stops fetching while
//   - the operator paused the host (all partitions),
//   - too many records are buffered: consumed, not yet durable, counted from
//     the moment the consumer hands them over (all partitions but those of
//     the topics exempt: the retry topics of ordered routes, whose records
//     release the records waiting for them; resumes at half the limit), or
//   - it is a retry-topic partition held until its next record is due, or
//   - it was just assigned and its start is being read from the database, or
//   - its next record needs a schema the registry has not given yet, or
//   - its route's circuit is open (the remote is down), or
//   - an operator paused its route (persisted; every host obeys), or
//   - its route holds route.order_by.max_waiting records waiting for
//     entities' holds (counted apart from the buffer, so that a held entity
//     never pauses another route).
// The host stays in its group throughout: the consumer keeps polling.
//
// Thread-safe: the consumer's poll thread reports new records (so a pause
// never waits for the engine thread to catch up), the engine thread
// everything else. Pause and resume reach the consumer in the order the
// state changed.
#pragma once

#include <atomic>
#include <cstddef>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/kafka/client.h"

namespace idemsink::kafka {
class Consumer;
}

namespace idemsink::pipeline {

class FetchGate {
 public:
  explicit FetchGate(size_t max_buffered) : max_buffered_(max_buffered) {}

  void attach(kafka::Consumer* consumer);

  /// Records entering (positive) or leaving (negative) the buffer.
  void buffered_delta(int64_t delta);
  size_t buffered() const { return static_cast<size_t>(buffered_.load(std::memory_order_relaxed)); }

  void set_operator_pause(bool paused);
  bool operator_paused() const;
  /// True while fetching is paused for all partitions (operator or backpressure).
  bool paused_all() const;

  void assigned(const std::vector<kafka::TopicPartition>& tps);
  void revoked(const std::vector<kafka::TopicPartition>& tps);
  /// Why one partition stops fetching; each reason is set and cleared on its own.
  enum class Hold : unsigned {
    NotDue = 1,  ///< a retry-topic partition waits for its next record to be due
    Start = 2,   ///< newly assigned: its start is being read from the database
    Schema = 4,  ///< its next record needs a schema the registry has not given yet
  };
  void hold(const kafka::TopicPartition& tp, Hold reason);
  void release(const kafka::TopicPartition& tp, Hold reason);
  /// Why a route's topics stop fetching; each reason is set and cleared on its own.
  enum class TopicPause : unsigned { Circuit = 1, Operator = 2, Holds = 4 };
  /// The partitions of these topics stop (or resume, once no reason is left) fetching.
  void set_topics_paused(const std::vector<std::string>& topics, TopicPause reason, bool paused);
  /// Whether the partition should be receiving records now.
  bool fetching(const kafka::TopicPartition& tp) const;
  /// Topics that keep fetching under backpressure: the records buffered may
  /// be waiting for theirs (an ordered route's retry topics).
  void exempt_from_backpressure(std::set<std::string> topics);

 private:
  void apply_locked();
  bool wanted_paused_locked(const kafka::TopicPartition& tp) const;

  const size_t max_buffered_;
  kafka::Consumer* consumer_ = nullptr;
  std::atomic<int64_t> buffered_{0};
  mutable std::mutex mu_;
  bool operator_paused_ = false;
  bool backpressure_ = false;
  std::set<kafka::TopicPartition> assigned_;
  std::map<kafka::TopicPartition, unsigned> held_;  // partition -> Hold bits
  std::map<std::string, unsigned> paused_topics_;   // topic -> TopicPause bits
  std::set<std::string> backpressure_exempt_;
  std::set<kafka::TopicPartition> paused_;  // what the consumer was told
};

}  // namespace idemsink::pipeline
