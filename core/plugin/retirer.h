// Handler instances shared by the route that calls them and the calls still
// out on them, destroyed once the last holder lets go.
//
// A reload that changes a route's options gives the route a new instance;
// the calls in flight finish on the old one (the ABI: destroy comes only
// after every invoke reported or passed its deadline). The last holder is
// often the engine thread or a plugin's own thread inside its report, and
// destroy may block (a plugin joins its threads), so the instance is
// destroyed on the retirer's thread, at least kSettle after it was let go: a
// plugin thread that has just reported may still be returning from the
// report into the plugin's code.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "core/plugin/plugin.h"

namespace idemsink::plugin {

class Retirer {
 public:
  static constexpr std::chrono::milliseconds kSettle{1000};

  Retirer();
  /// Destroys what is queued (without waiting out its settle time: the host
  /// drained its calls before), then stops; an instance let go later is
  /// destroyed by its last holder, at once.
  ~Retirer();
  Retirer(const Retirer&) = delete;
  Retirer& operator=(const Retirer&) = delete;

  /// Shares `instance`; its destroy runs on the retirer's thread.
  std::shared_ptr<Instance> adopt(std::unique_ptr<Instance> instance);

  /// Instances destroyed so far (tests, logs).
  uint64_t destroyed() const;

 private:
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    struct Entry {
      Instance* instance;
      std::chrono::steady_clock::time_point due;
    };
    std::deque<Entry> entries;
    bool stopping = false;
    uint64_t destroyed = 0;
  };
  void run();

  std::shared_ptr<Queue> queue_ = std::make_shared<Queue>();
  std::thread thread_;
};

}  // namespace idemsink::plugin
