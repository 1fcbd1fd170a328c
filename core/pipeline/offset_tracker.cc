#include "core/pipeline/offset_tracker.h"

#include <algorithm>

namespace idemsink::pipeline {

void OffsetTracker::start_at(int64_t offset) {
  if (!next_) next_ = offset;
}

OffsetTracker::Admit OffsetTracker::check(int64_t offset) const {
  if (next_ && offset < *next_) return Admit::Refetch;
  if (next_ && offset > *next_) return Admit::Gap;
  return Admit::Next;
}

OffsetTracker::Admit OffsetTracker::add(int64_t offset) {
  if (const Admit a = check(offset); a != Admit::Next) return a;
  next_ = offset + 1;
  window_.push_back({offset, false});
  ++outstanding_;
  return Admit::Next;
}

void OffsetTracker::skip_to(int64_t offset) {
  if (!next_ || offset > *next_) next_ = offset;
}

bool OffsetTracker::complete(int64_t offset) {
  auto it =
      std::lower_bound(window_.begin(), window_.end(), offset, [](const Entry& e, int64_t o) { return e.offset < o; });
  if (it == window_.end() || it->offset != offset || it->durable) return false;
  it->durable = true;
  --outstanding_;
  while (!window_.empty() && window_.front().durable) window_.pop_front();
  return true;
}

std::optional<int64_t> OffsetTracker::commit_point() const {
  if (!window_.empty()) return window_.front().offset;
  return next_;
}

}  // namespace idemsink::pipeline
