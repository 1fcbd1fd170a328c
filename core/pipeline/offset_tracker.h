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

}  // namespace idemsink::pipeline
