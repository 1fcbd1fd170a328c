// Routing plugin completions back to the host.
//
// A plugin reports through a C function pointer with one `void* call_ctx`.
// The host never passes a pointer there: it passes a call id, and the id is
// looked up here. A completion for an id that is gone (reported twice, or
// after the host's deadline gave up on the call) finds nothing, is logged and
// ignored: a misbehaving plugin cannot make the host touch freed memory or
// finish a record twice.
#pragma once

#include <idemsink/plugin_abi.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>

namespace idemsink::plugin {

class CallRegistry {
 public:
  /// Gets the call's id, so that one handler object need not be made per call.
  using Handler = std::function<void(uint64_t call_id, idemsink_outcome, std::string detail)>;

  static CallRegistry& instance();

  /// Registers a call; `on_done` runs on the reporting thread, once.
  uint64_t add(Handler on_done, std::string what);

  /// Forgets a call (deadline passed); returns false if it already completed.
  bool cancel(uint64_t id);

  /// The C completion function handed to plugins.
  static void complete(void* call_ctx, idemsink_outcome outcome, const char* detail, size_t len);

  static void* ctx_of(uint64_t id) { return reinterpret_cast<void*>(static_cast<uintptr_t>(id)); }

  uint64_t stray_completions() const;

 private:
  struct Entry {
    Handler on_done;
    std::string what;
  };
  mutable std::mutex mu_;
  uint64_t next_id_ = 1;
  uint64_t stray_ = 0;
  std::unordered_map<uint64_t, Entry> calls_;
};

}  // namespace idemsink::plugin
