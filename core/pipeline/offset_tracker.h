// Per-partition commit point: the highest offset below which every offset is
// either a durable record (done, duplicate, or dead with its DLQ entry
// stored) or a verified hole (an offset a re-read confirmed absent: a
// transaction marker, a compacted record).
//
// Records complete out of order (different keys run in parallel); the commit
// point only moves past a contiguous durable prefix, so one slow or retrying
// record holds back the commit of its partition, never the processing of
// the records after it. An offset the consumer jumped over is never
// committed on trust: add() refuses it as a gap until skip_to() says a
// re-read confirmed the hole.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>

namespace idemsink::pipeline {

class OffsetTracker {
 public:
  enum class Admit {
    Next,     ///< the next offset: registered
    Refetch,  ///< below the next expected offset (seen already): ignored
    Gap,      ///< above the next expected offset: not registered; the offsets between are unexplained
  };

  /// Where the partition starts: the group's committed offset, when it has one.
  void start_at(int64_t offset);
  /// What add() would do with this offset.
  Admit check(int64_t offset) const;
  /// Registers a consumed offset. Without a starting point the first offset
  /// sets it.
  Admit add(int64_t offset);
  /// A re-read confirmed that no record exists below `offset` from the next
  /// expected one on: the commit point may pass them.
  void skip_to(int64_t offset);
  /// Marks a registered offset durable. Returns false if unknown.
  bool complete(int64_t offset);
  /// The offset to commit (next one to consume): the first non-durable
  /// offset, or the next expected one; nullopt while nothing is known.
  std::optional<int64_t> commit_point() const;
  /// The offset the next record must have.
  std::optional<int64_t> next_expected() const { return next_; }
  /// Registered offsets not yet durable.
  size_t outstanding() const { return outstanding_; }

 private:
  struct Entry {
    int64_t offset;
    bool durable;
  };
  std::deque<Entry> window_;  // from the first non-durable offset on
  std::optional<int64_t> next_;
  size_t outstanding_ = 0;
};

/// A partition's commit point as sent to Kafka and as Kafka confirmed it.
/// Kafka keeps the last commit it applied, not the highest: a commit the
/// client retried (its coordinator moved) can land after a later one and
/// take the group's offset back. So the latest confirmation is what Kafka
/// holds, even below an earlier one, and a commit point above it is sent
/// again until a confirmation reaches it.
struct KafkaCommit {
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::seconds kUnconfirmedAfter{5};

  int64_t sent = -1;   // commit point last sent
  int64_t acked = -1;  // what Kafka holds, by its latest confirmation
  Clock::time_point sent_at;

  /// Kafka holds `held` (-1: nothing), nothing is on its way.
  void reset(int64_t held) { sent = acked = held; }
  /// Whether `point` must be sent: it moved past what was sent, or what
  /// was sent has not been confirmed in time (the answer never came, or a
  /// late commit took the offset back).
  bool due(int64_t point, Clock::time_point now) const {
    return point > sent || (point > acked && now - sent_at > kUnconfirmedAfter);
  }
  void sending(int64_t point, Clock::time_point now) {
    sent = point;
    sent_at = now;
  }
  /// Kafka confirmed `offset`. Returns the earlier confirmation when this
  /// one is below it (Kafka's offset went back), else -1.
  int64_t confirmed(int64_t offset) {
    const int64_t before = acked;
    acked = offset;
    return offset < before ? before : -1;
  }
  /// The commit of `offset` failed: send again with the next round.
  void failed(int64_t offset) {
    if (sent == offset) sent = -1;
  }
};

}  // namespace idemsink::pipeline
