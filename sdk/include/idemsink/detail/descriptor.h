// How a handler class becomes the plugin's ABI descriptor: what the
// IDEMSINK_PLUGIN macro expands to, and the guard that makes every call
// report exactly once. Included at the end of <idemsink/sdk.h>; a plugin
// author includes that header and never this one.
#pragma once

#include <idemsink/plugin_abi.h>
#include <idemsink/sdk.h>

#include <exception>
#include <string>
#include <utility>

namespace idemsink::sdk {

namespace detail {

template <class H>
concept Invokes = requires(H& h, const Record& r, Completion c) {
  h.invoke(r, std::move(c));
};
template <class H>
concept Applies = requires(H& h, const Record& r, Tx& tx, Completion c) {
  h.apply(r, tx, std::move(c));
};
template <class H>
concept Reconciles = requires(H& h, const Record& r, Completion c) {
  h.reconcile(r, std::move(c));
};

struct InstanceBase {
  const idemsink_host_api* host;
};
template <class H>
struct Instance : InstanceBase {
  H handler;
  Instance(const idemsink_host_api* api, const Options& o) : InstanceBase{api}, handler(Host(api), o) {}
};

inline std::string describe_current_exception() {
  try {
    throw;
  } catch (const std::exception& e) {
    return std::string("handler threw: ") + e.what();
  } catch (...) {
    return "handler threw a non-standard exception";
  }
}

// Runs `body(completion)` and guarantees exactly one report: whatever the
// body does not report (a throw, a dropped completion) becomes UNCERTAIN.
template <class Body>
void guarded_call(idemsink_complete_fn done, void* ctx, Body&& body) noexcept {
  Completion::Call call(done, ctx);
  std::string failure = "handler returned without reporting and dropped its completion";
  try {
    body(call.handle());
  } catch (...) {
    failure = describe_current_exception();
  }
  call.finish(failure);
}

template <class H>
idemsink_plugin make_descriptor(const PluginInfo& info) {
  idemsink_plugin d{};
  d.struct_size = sizeof(idemsink_plugin);
  d.abi_major = IDEMSINK_ABI_MAJOR;
  d.abi_minor = IDEMSINK_ABI_MINOR;
  d.name = info.name;
  d.version = info.version;
  d.description = info.description;
  d.kind = static_cast<int32_t>(info.kind);
  d.options = info.options.data();
  d.option_count = info.options.size();
  d.schema = info.schema.data();
  d.schema_count = info.schema.size();
  d.checks = info.checks.data();
  d.check_count = info.checks.size();
  d.create = [](const idemsink_host_api* host, const idemsink_option* opts, size_t n, void** instance, char* err,
                size_t cap) -> int {
    try {
      *instance = new Instance<H>(host, Options(opts, n));
      return 0;
    } catch (const std::exception& e) {
      copy_message(err, cap, e.what());
    } catch (...) {
      copy_message(err, cap, "constructor threw a non-standard exception");
    }
    return 1;
  };
  d.destroy = [](void* instance) { delete static_cast<Instance<H>*>(instance); };
  if constexpr (Invokes<H>) {
    d.invoke = [](void* instance, const idemsink_record* rec, idemsink_complete_fn done, void* ctx) {
      auto* self = static_cast<Instance<H>*>(instance);
      guarded_call(done, ctx, [&](Completion c) { self->handler.invoke(Record(rec), std::move(c)); });
    };
  }
  if constexpr (Applies<H>) {
    d.apply = [](void* instance, const idemsink_record* rec, idemsink_tx* tx, idemsink_complete_fn done, void* ctx) {
      auto* self = static_cast<Instance<H>*>(instance);
      Tx t(self->host, tx);
      guarded_call(done, ctx, [&](Completion c) { self->handler.apply(Record(rec), t, std::move(c)); });
    };
  }
  if constexpr (Reconciles<H>) {
    d.reconcile = [](void* instance, const idemsink_record* rec, idemsink_complete_fn done, void* ctx) {
      auto* self = static_cast<Instance<H>*>(instance);
      guarded_call(done, ctx, [&](Completion c) { self->handler.reconcile(Record(rec), std::move(c)); });
    };
  }
  return d;
}

}  // namespace detail
}  // namespace idemsink::sdk

/// Exports the ABI entry for handler class `HandlerType`; the remaining
/// arguments are designated initializers of idemsink::sdk::PluginInfo.
#define IDEMSINK_PLUGIN(HandlerType, ...)                                                                \
  extern "C" IDEMSINK_EXPORT const idemsink_plugin* IDEMSINK_ENTRY_NAME(void) {                          \
    static const idemsink_plugin descriptor =                                                            \
        ::idemsink::sdk::detail::make_descriptor<HandlerType>(::idemsink::sdk::PluginInfo{__VA_ARGS__}); \
    return &descriptor;                                                                                  \
  }
