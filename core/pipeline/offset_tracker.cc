#include "core/pipeline/offset_tracker.h"

#include <algorithm>

namespace idemsink::pipeline {

bool OffsetTracker::add(int64_t offset) {
  if (last_added_ && offset <= *last_added_) return false;
  last_added_ = offset;
  window_.push_back({offset, false});
  ++outstanding_;
  return true;
}

bool OffsetTracker::complete(int64_t offset) {
  auto it = std::lower_bound(window_.begin(), window_.end(), offset,
                             [](const Entry& e, int64_t o) { return e.offset < o; });
  if (it == window_.end() || it->offset != offset || it->durable) return false;
  it->durable = true;
  --outstanding_;
  while (!window_.empty() && window_.front().durable) window_.pop_front();
  return true;
}

std::optional<int64_t> OffsetTracker::commit_point() const {
  if (!last_added_) return std::nullopt;
  return window_.empty() ? *last_added_ + 1 : window_.front().offset;
}

}  // namespace idemsink::pipeline
