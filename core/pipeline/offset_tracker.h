// Per-partition commit point: the highest offset below which every consumed
// record is durable (done, duplicate, or dead with its DLQ entry stored).
//
// Records complete out of order (different keys run in parallel); the commit
// point only moves past a contiguous durable prefix, so one slow or retrying
// record holds back the commit of its partition, never the processing of
// the records after it.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>

namespace idemsink::pipeline {

class OffsetTracker {
 public:
  /// Registers a consumed offset. Offsets must increase; returns false (and
  /// ignores it) for an offset not above the last one added.
  bool add(int64_t offset);
  /// Marks a registered offset durable. Returns false if unknown.
  bool complete(int64_t offset);
  /// The offset to commit (next one to consume), or nullopt if nothing was
  /// ever added. Equals the first non-durable offset, or last added + 1.
  std::optional<int64_t> commit_point() const;
  /// Registered offsets not yet durable.
  size_t outstanding() const { return outstanding_; }
  std::optional<int64_t> last_added() const { return last_added_; }

 private:
  struct Entry {
    int64_t offset;
    bool durable;
  };
  std::deque<Entry> window_;  // from the first non-durable offset on
  std::optional<int64_t> last_added_;
  size_t outstanding_ = 0;
};

}  // namespace idemsink::pipeline
