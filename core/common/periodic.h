// A timer that runs a function on its io_context every period, until
// stopped. Stopping cancels the wait; a run already started finishes.
#pragma once

#include "core/common/asio.h"
#include <chrono>
#include <functional>

namespace idemsink {

class Periodic {
 public:
  explicit Periodic(boost::asio::io_context& io) : timer_(io) {}

  void start(std::chrono::milliseconds period, std::function<void()> fn) {
    period_ = period;
    fn_ = std::move(fn);
    arm();
  }
  void stop() {
    stopped_ = true;
    timer_.cancel();
  }

 private:
  void arm() {
    timer_.expires_after(period_);
    timer_.async_wait([this](boost::system::error_code ec) {
      if (ec || stopped_) return;
      fn_();
      if (!stopped_) arm();
    });
  }

  boost::asio::steady_timer timer_;
  std::chrono::milliseconds period_{0};
  std::function<void()> fn_;
  bool stopped_ = false;
};

}  // namespace idemsink
