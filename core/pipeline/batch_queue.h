// Work waiting to be written to the database in batches, with a bounded
// number of jobs in flight and at most one flush scheduled at a time: the
// shape every batched writer of the pipeline shares (claims, done marks,
// terminal marks, dead letters, forwards).
#pragma once

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <utility>
#include <vector>

namespace idemsink::pipeline {

template <class T>
class BatchQueue {
 public:
  explicit BatchQueue(int max_jobs) : max_jobs_(max_jobs) {}

  void push(T item) { items_.push_back(std::move(item)); }
  bool empty() const { return items_.empty(); }
  size_t size() const { return items_.size(); }
  int jobs() const { return jobs_; }
  bool idle() const { return items_.empty() && jobs_ == 0; }

  /// Up to `max` items for a new job, or nothing while every job slot is
  /// taken or nothing waits. The caller runs the job and calls job_done().
  std::vector<T> take(size_t max) {
    if (items_.empty() || jobs_ >= max_jobs_) return {};
    const size_t n = std::min(items_.size(), max);
    std::vector<T> out(std::make_move_iterator(items_.begin()), std::make_move_iterator(items_.begin() + n));
    items_.erase(items_.begin(), items_.begin() + n);
    ++jobs_;
    return out;
  }
  void job_done() { --jobs_; }

  /// True if the caller should schedule a flush (none is scheduled yet).
  bool schedule() { return !std::exchange(scheduled_, true); }
  /// The scheduled flush runs now.
  void flushing() { scheduled_ = false; }

 private:
  const int max_jobs_;
  std::vector<T> items_;
  int jobs_ = 0;
  bool scheduled_ = false;
};

}  // namespace idemsink::pipeline
