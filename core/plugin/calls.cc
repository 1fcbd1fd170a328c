#include "core/plugin/calls.h"

#include "core/common/log.h"
#include "core/plugin/plugin.h"

namespace idemsink::plugin {

CallRegistry& CallRegistry::instance() {
  static CallRegistry registry;
  return registry;
}

uint64_t CallRegistry::add(Handler on_done, std::string what) {
  std::lock_guard lk(mu_);
  const uint64_t id = next_id_++;
  calls_.emplace(id, Entry{std::move(on_done), std::move(what)});
  return id;
}

bool CallRegistry::cancel(uint64_t id) {
  std::lock_guard lk(mu_);
  return calls_.erase(id) != 0;
}

uint64_t CallRegistry::stray_completions() const {
  std::lock_guard lk(mu_);
  return stray_;
}

void CallRegistry::complete(void* call_ctx, idemsink_outcome outcome, const char* detail, size_t len) {
  auto& self = instance();
  const auto id = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(call_ctx));
  Entry entry;
  {
    std::lock_guard lk(self.mu_);
    auto it = self.calls_.find(id);
    if (it == self.calls_.end()) {
      ++self.stray_;
      spdlog::warn("ignored a completion ({}) for call {}: it was already reported, or came after its deadline",
                   outcome_name(outcome), id);
      return;
    }
    entry = std::move(it->second);
    self.calls_.erase(it);
  }
  if (outcome < IDEMSINK_OUTCOME_OK || outcome > IDEMSINK_OUTCOME_PERMANENT) {
    spdlog::error("{}: plugin reported invalid outcome {} for call {}; treating it as uncertain", entry.what,
                  static_cast<int>(outcome), id);
    outcome = IDEMSINK_OUTCOME_UNCERTAIN;
  }
  entry.on_done(id, outcome, std::string(detail ? detail : "", detail ? len : 0));
}

}  // namespace idemsink::plugin
