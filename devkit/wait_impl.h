#pragma once

#include <stdexcept>
#include <thread>

namespace idemsink::devkit {

template <class Pred>
void wait_until(Pred pred, std::chrono::milliseconds timeout, const std::string& what,
                std::chrono::milliseconds interval) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (pred()) return;
    if (std::chrono::steady_clock::now() >= deadline)
      throw std::runtime_error("timed out after " + std::to_string(timeout.count()) + "ms waiting for " + what);
    std::this_thread::sleep_for(interval);
  }
}

}  // namespace idemsink::devkit
