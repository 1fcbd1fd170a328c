#include "core/plugin/plugin.h"

#include <charconv>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>

#include "core/common/log.h"
#include "core/common/util.h"
#include "core/plugin/calls.h"
#include "core/plugin/tx.h"

namespace idemsink::plugin {
namespace {

// The v1.0 descriptor ends with `reconcile`; a plugin built against 1.0
// reports at least this size.
constexpr size_t kMinDescriptorSize = offsetof(idemsink_plugin, reconcile) + sizeof(idemsink_plugin::reconcile);

[[noreturn]] void refuse(const std::filesystem::path& path, const std::string& why) {
  throw LoadError("plugin " + path.string() + ": " + why);
}

const char* option_type_name(idemsink_option_type t) {
  switch (t) {
    case IDEMSINK_OPTION_STRING: return "string";
    case IDEMSINK_OPTION_INT: return "integer";
    case IDEMSINK_OPTION_FLOAT: return "float";
    case IDEMSINK_OPTION_BOOL: return "boolean";
    case IDEMSINK_OPTION_DURATION: return "duration";
  }
  return nullptr;
}

// The text a plugin receives for a value of `type` written as `text` (a
// duration in milliseconds, everything else as written), or nullopt if the
// text is not of that type.
std::optional<std::string> canonical(idemsink_option_type type, const std::string& text) {
  switch (type) {
    case IDEMSINK_OPTION_STRING: return text;
    case IDEMSINK_OPTION_INT: {
      int64_t v = 0;
      auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (ec != std::errc() || p != text.data() + text.size()) return std::nullopt;
      return text;
    }
    case IDEMSINK_OPTION_FLOAT: {
      char* end = nullptr;
      std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size()) return std::nullopt;
      return text;
    }
    case IDEMSINK_OPTION_BOOL:
      if (text != "true" && text != "false") return std::nullopt;
      return text;
    case IDEMSINK_OPTION_DURATION: {
      auto ms = parse_duration(text);
      if (!ms) return std::nullopt;
      return std::to_string(ms->count());
    }
  }
  return std::nullopt;
}

void plugin_log(void* host_ctx, idemsink_log_level level, const char* msg, size_t len) {
  const auto* prefix = static_cast<const std::string*>(host_ctx);
  std::string_view text(msg ? msg : "", msg ? len : 0);
  switch (level) {
    case IDEMSINK_LOG_DEBUG: spdlog::debug("{} {}", *prefix, text); break;
    case IDEMSINK_LOG_INFO: spdlog::info("{} {}", *prefix, text); break;
    case IDEMSINK_LOG_WARN: spdlog::warn("{} {}", *prefix, text); break;
    default: spdlog::error("{} {}", *prefix, text); break;
  }
}

}  // namespace

const char* kind_name(idemsink_kind kind) {
  switch (kind) {
    case IDEMSINK_KIND_REMOTE_IDEMPOTENT: return "remote_idempotent";
    case IDEMSINK_KIND_REMOTE_AT_MOST_ONCE: return "remote_at_most_once";
    case IDEMSINK_KIND_LOCAL_TX: return "local_tx";
  }
  return "invalid";
}

const char* outcome_name(idemsink_outcome outcome) {
  switch (outcome) {
    case IDEMSINK_OUTCOME_OK: return "ok";
    case IDEMSINK_OUTCOME_RETRYABLE: return "retryable";
    case IDEMSINK_OUTCOME_UNCERTAIN: return "uncertain";
    case IDEMSINK_OUTCOME_PERMANENT: return "permanent";
  }
  return "invalid";
}

namespace {

// No entry point of this host's ABI: an entry point of another ABI says
// which the plugin was built for.
[[noreturn]] void refuse_without_entry(const std::filesystem::path& path, const boost::dll::shared_library& lib) {
  for (int v = 0; v <= 16; ++v) {
    if (v == IDEMSINK_ABI_MAJOR) continue;
    if (lib.has("idemsink_plugin_entry_v" + std::to_string(v)))
      refuse(path, "built for plugin ABI v" + std::to_string(v) + ", this host supports v" +
                       std::to_string(IDEMSINK_ABI_MAJOR));
  }
  refuse(path, std::string("not an idemsink plugin: it does not export ") + IDEMSINK_ENTRY_SYMBOL);
}

// Checked before the descriptor is copied: its size bounds what is read.
void check_descriptor_abi(const std::filesystem::path& path, const idemsink_plugin& d) {
  if (d.struct_size < kMinDescriptorSize)
    refuse(path, "descriptor too small: struct_size " + std::to_string(d.struct_size) + ", ABI v1.0 needs at least " +
                     std::to_string(kMinDescriptorSize));
  if (d.abi_major != IDEMSINK_ABI_MAJOR)
    refuse(path, "descriptor says ABI v" + std::to_string(d.abi_major) + ", this host supports v" +
                     std::to_string(IDEMSINK_ABI_MAJOR));
  if (d.abi_minor > IDEMSINK_ABI_MINOR)
    refuse(path, "built for ABI v1." + std::to_string(d.abi_minor) + ", newer than this host's v1." +
                     std::to_string(IDEMSINK_ABI_MINOR) + ": upgrade the host");
}

// Each option declared once, with a name, a valid type and a default of
// that type.
void check_options(const std::filesystem::path& path, const idemsink_plugin& desc) {
  if (desc.option_count > 0 && desc.options == nullptr) refuse(path, "option_count > 0 but options is NULL");
  std::set<std::string> seen;
  for (size_t i = 0; i < desc.option_count; ++i) {
    const auto& o = desc.options[i];
    if (o.name == nullptr || *o.name == '\0') refuse(path, "option " + std::to_string(i) + " has no name");
    if (option_type_name(o.type) == nullptr) refuse(path, std::string("option ") + o.name + " has an invalid type");
    if (!seen.insert(o.name).second) refuse(path, std::string("option ") + o.name + " is declared twice");
    if (o.default_value && !canonical(o.type, o.default_value))
      refuse(path, std::string("option ") + o.name + " has default \"" + o.default_value + "\", which is not a " +
                       option_type_name(o.type));
  }
}

}  // namespace

std::shared_ptr<Library> Library::load(const std::filesystem::path& path) {
  std::error_code fs_ec;
  if (!std::filesystem::exists(path, fs_ec)) refuse(path, "file not found");
  if (!std::filesystem::is_regular_file(path, fs_ec)) refuse(path, "not a regular file");

  std::shared_ptr<Library> lib(new Library);
  lib->path_ = path;
  std::error_code ec;
  // RTLD_LOCAL: two plugins may bundle different versions of a library.
  lib->lib_.load(path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, ec);
  if (ec) refuse(path, "not a loadable shared library (" + ec.message() + ")");

  if (!lib->lib_.has(IDEMSINK_ENTRY_SYMBOL)) refuse_without_entry(path, lib->lib_);
  auto entry = lib->lib_.get<const idemsink_plugin*()>(IDEMSINK_ENTRY_SYMBOL);
  const idemsink_plugin* d = entry();
  if (d == nullptr) refuse(path, std::string(IDEMSINK_ENTRY_SYMBOL) + " returned NULL");
  check_descriptor_abi(path, *d);
  std::memcpy(&lib->desc_, d, std::min<size_t>(d->struct_size, sizeof(idemsink_plugin)));
  const idemsink_plugin& desc = lib->desc_;

  if (desc.name == nullptr || *desc.name == '\0') refuse(path, "descriptor has no name");
  if (desc.version == nullptr) refuse(path, "descriptor has no version");
  if (desc.description == nullptr) lib->desc_.description = "";
  if (desc.kind != IDEMSINK_KIND_REMOTE_IDEMPOTENT && desc.kind != IDEMSINK_KIND_REMOTE_AT_MOST_ONCE &&
      desc.kind != IDEMSINK_KIND_LOCAL_TX)
    refuse(path, "descriptor has invalid kind " + std::to_string(desc.kind));
  if (desc.create == nullptr) refuse(path, "descriptor has no create callback");
  if (desc.destroy == nullptr) refuse(path, "descriptor has no destroy callback");
  if (lib->kind() == IDEMSINK_KIND_LOCAL_TX) {
    if (desc.apply == nullptr) refuse(path, "kind local_tx requires an apply callback");
  } else if (desc.invoke == nullptr) {
    refuse(path, std::string("kind ") + kind_name(lib->kind()) + " requires an invoke callback");
  }
  check_options(path, desc);
  if (desc.schema_count > 0 && desc.schema == nullptr) refuse(path, "schema_count > 0 but schema is NULL");
  if (desc.check_count > 0 && desc.checks == nullptr) refuse(path, "check_count > 0 but checks is NULL");
  for (size_t i = 0; i < desc.check_count; ++i)
    if (desc.checks[i].name == nullptr || desc.checks[i].sql == nullptr)
      refuse(path, "check " + std::to_string(i) + " has no name or no sql");
  return lib;
}

std::string Library::info() const {
  std::ostringstream os;
  os << "file:        " << path_.string() << "\n"
     << "name:        " << desc_.name << "\n"
     << "version:     " << desc_.version << "\n"
     << "description: " << desc_.description << "\n"
     << "kind:        " << kind_name(kind()) << "\n"
     << "abi:         v" << desc_.abi_major << "." << desc_.abi_minor << " (host v" << IDEMSINK_ABI_MAJOR << "."
     << IDEMSINK_ABI_MINOR << ")\n"
     << "reconcile:   " << (desc_.reconcile ? "yes" : "no") << "\n"
     << "options:\n";
  if (desc_.option_count == 0) os << "  (none)\n";
  for (const auto& o : options()) {
    os << "  " << o.name << " (" << option_type_name(o.type) << ", "
       << (o.default_value ? std::string("default ") + o.default_value : std::string("required")) << ")"
       << (o.doc ? std::string(": ") + o.doc : "") << "\n";
  }
  if (desc_.check_count) {
    os << "checks:\n";
    for (const auto& c : checks()) os << "  " << c.name << ": " << (c.doc ? c.doc : "") << "\n";
  }
  if (desc_.schema_count) {
    os << "schema:\n";
    for (const char* stmt : schema()) os << stmt << ";\n";
  }
  return os.str();
}

std::vector<std::pair<std::string, std::string>> resolve_options(const Library& lib, const config::RouteConfig& route) {
  using TomlType = config::OptionValue::TomlType;
  std::map<std::string, const idemsink_option_decl*> decls;
  for (const auto& d : lib.options()) decls[d.name] = &d;
  for (const auto& [name, v] : route.options) {
    if (!decls.count(name)) {
      std::string known;
      for (const auto& [n, d] : decls) known += (known.empty() ? "" : ", ") + n;
      throw config::ConfigError(v.pos.where() + ": route.options." + name + ": unknown option for plugin " +
                                lib.name() + " (known: " + (known.empty() ? "none" : known) + ")");
    }
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& d : lib.options()) {
    auto it = route.options.find(d.name);
    if (it == route.options.end()) {
      if (d.default_value == nullptr)
        throw config::ConfigError(route.pos.where() + ": route.options." + d.name + ": required by plugin " +
                                  lib.name() + " but not set for route " + route.name);
      out.emplace_back(d.name, *canonical(d.type, d.default_value));  // checked at load
      continue;
    }
    const auto& v = it->second;
    auto bad = [&](const std::string& expected) -> config::ConfigError {
      return config::ConfigError(v.pos.where() + ": route.options." + d.name + ": expected " + expected + ", got \"" +
                                 v.text + "\"");
    };
    std::string text = v.text;
    switch (d.type) {
      case IDEMSINK_OPTION_STRING:
        if (v.toml_type != TomlType::String) throw bad("a string");
        break;
      case IDEMSINK_OPTION_INT:
        if (v.toml_type != TomlType::Integer) throw bad("an integer");
        break;
      case IDEMSINK_OPTION_FLOAT:
        if (v.toml_type != TomlType::Float && v.toml_type != TomlType::Integer) throw bad("a number");
        break;
      case IDEMSINK_OPTION_BOOL:
        if (v.toml_type != TomlType::Boolean) throw bad("true or false");
        break;
      case IDEMSINK_OPTION_DURATION: {
        auto ms = v.toml_type == TomlType::String ? canonical(d.type, v.text) : std::nullopt;
        if (!ms) throw bad("a duration such as \"250ms\" or \"2s\"");
        text = *ms;
        break;
      }
    }
    out.emplace_back(d.name, text);
  }
  return out;
}

Instance::Instance(std::shared_ptr<Library> lib, const config::RouteConfig& route)
    : lib_(std::move(lib)), route_(route.name), log_prefix_("[" + route.name + "/" + lib_->name() + "]") {
  auto opts = resolve_options(*lib_, route);
  std::vector<idemsink_option> raw;
  raw.reserve(opts.size());
  for (const auto& [k, v] : opts) raw.push_back({k.c_str(), v.c_str()});
  api_.struct_size = sizeof(api_);
  api_.host_ctx = &log_prefix_;
  api_.log = &plugin_log;
  install_tx_api(api_);
  char err[1024] = {};
  if (lib_->descriptor().create(&api_, raw.data(), raw.size(), &instance_, err, sizeof err) != 0) {
    err[sizeof err - 1] = '\0';
    // A plugin that names the option it refuses ("NAME: why") gets that
    // option's file and line, like the host's own checks.
    const std::string_view text(err);
    if (const auto colon = text.find(": "); colon != std::string_view::npos) {
      const auto it = route.options.find(std::string(text.substr(0, colon)));
      if (it != route.options.end())
        throw config::ConfigError(it->second.pos.where() + ": route.options." + std::string(text) + " (plugin " +
                                  lib_->name() + ", route " + route.name + ")");
    }
    throw LoadError("plugin " + lib_->path().string() + " (route " + route.name +
                    "): create failed: " + (err[0] ? std::string(err) : std::string("no message")));
  }
}

Instance::~Instance() {
  if (instance_) lib_->descriptor().destroy(instance_);
}

namespace {

// A plugin not built on the SDK may let an exception out of a callback; it
// must not end the host. The call ends uncertain (whatever it did before
// throwing may have reached the remote) unless it reported already, in
// which case the registry ignores this second report.
template <class Fn>
void guard_plugin_call(const char* what, const Library& lib, const idemsink_record& rec, uint64_t call_id, Fn fn) {
  std::string error;
  try {
    fn();
    return;
  } catch (const std::exception& e) {
    error = std::string("plugin threw from ") + what + ": " + e.what();
  } catch (...) {
    error = std::string("plugin threw a non-standard exception from ") + what;
  }
  spdlog::error("plugin {} ({}), route {} key {}: {}", lib.name(), lib.path().string(), rec.route ? rec.route : "?",
                printable(std::string_view(rec.biz_key.data ? rec.biz_key.data : "", rec.biz_key.len)), error);
  CallRegistry::complete(CallRegistry::ctx_of(call_id), IDEMSINK_OUTCOME_UNCERTAIN, error.data(), error.size());
}

}  // namespace

void Instance::invoke(const idemsink_record& rec, uint64_t call_id) {
  guard_plugin_call("invoke", *lib_, rec, call_id, [&] {
    lib_->descriptor().invoke(instance_, &rec, &CallRegistry::complete, CallRegistry::ctx_of(call_id));
  });
}

void Instance::apply(const idemsink_record& rec, idemsink_tx* tx, uint64_t call_id) {
  guard_plugin_call("apply", *lib_, rec, call_id, [&] {
    lib_->descriptor().apply(instance_, &rec, tx, &CallRegistry::complete, CallRegistry::ctx_of(call_id));
  });
}

void Instance::reconcile(const idemsink_record& rec, uint64_t call_id) {
  guard_plugin_call("reconcile", *lib_, rec, call_id, [&] {
    lib_->descriptor().reconcile(instance_, &rec, &CallRegistry::complete, CallRegistry::ctx_of(call_id));
  });
}

}  // namespace idemsink::plugin
