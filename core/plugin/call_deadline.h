// A call into a plugin (a reconcile look-up, a re-drive) answered on the
// engine's thread exactly once: by the plugin, or, once its deadline has
// passed, with the answer given for lateness. The call registry hands a
// completion over at most once and drops one that comes after the deadline
// forgot the call (plugin/calls.h), so nothing else has to be counted.
#pragma once

#include <idemsink/plugin_abi.h>

#include "core/common/asio.h"
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace idemsink::plugin {

struct LateAnswer {
  idemsink_outcome outcome;
  std::string detail;
};

/// Registers a call (`what` labels it in logs) and returns the id to hand
/// the plugin; `on_answer` runs on `io`'s thread, once.
uint64_t call_with_deadline(boost::asio::io_context& io, std::chrono::milliseconds deadline, std::string what,
                            LateAnswer late, std::function<void(idemsink_outcome, std::string)> on_answer);

}  // namespace idemsink::plugin
