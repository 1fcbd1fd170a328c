#include "core/plugin/retirer.h"

namespace idemsink::plugin {

Retirer::Retirer() : thread_([this] { run(); }) {}

Retirer::~Retirer() {
  {
    std::lock_guard lock(queue_->mu);
    queue_->stopping = true;
  }
  queue_->cv.notify_one();  // what is queued is destroyed at once
  thread_.join();
}

std::shared_ptr<Instance> Retirer::adopt(std::unique_ptr<Instance> instance) {
  // The deleter holds the queue, not the retirer: an instance outliving the
  // retirer is destroyed where it is let go.
  return std::shared_ptr<Instance>(instance.release(), [queue = queue_](Instance* p) {
    {
      std::lock_guard lock(queue->mu);
      if (!queue->stopping) {
        queue->entries.push_back({p, std::chrono::steady_clock::now() + kSettle});
        queue->cv.notify_one();
        return;
      }
      ++queue->destroyed;
    }
    delete p;
  });
}

uint64_t Retirer::destroyed() const {
  std::lock_guard lock(queue_->mu);
  return queue_->destroyed;
}

void Retirer::run() {
  std::unique_lock lock(queue_->mu);
  for (;;) {
    if (queue_->entries.empty()) {
      if (queue_->stopping) return;
      queue_->cv.wait(lock);
      continue;
    }
    // Once stopping, the host has drained its calls for the shutdown grace: no settling.
    const auto due = queue_->entries.front().due;
    if (!queue_->stopping && std::chrono::steady_clock::now() < due) {
      queue_->cv.wait_until(lock, due);
      continue;
    }
    Instance* p = queue_->entries.front().instance;
    queue_->entries.pop_front();
    lock.unlock();
    delete p;
    lock.lock();
    ++queue_->destroyed;
  }
}

}  // namespace idemsink::plugin
