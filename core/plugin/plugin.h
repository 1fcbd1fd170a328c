// Loading handler plugins and calling them across the C ABI.
#pragma once

#include <idemsink/plugin_abi.h>

#include <boost/dll/shared_library.hpp>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/config/config.h"

namespace idemsink::plugin {

/// A plugin file that cannot be used; the message names the file and why.
class LoadError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

const char* kind_name(idemsink_kind kind);
const char* outcome_name(idemsink_outcome outcome);

/// A loaded shared library whose descriptor passed every check.
class Library {
 public:
  /// Loads and validates; throws LoadError for a missing file, a file that is
  /// not a shared library, a library without the v1 entry (naming the ABI
  /// version it has instead, if any), a NULL or too-small descriptor, an
  /// unsupported ABI version, or missing required callbacks.
  static std::shared_ptr<Library> load(const std::filesystem::path& path);

  const idemsink_plugin& descriptor() const { return desc_; }
  const std::filesystem::path& path() const { return path_; }
  std::string name() const { return desc_.name; }
  idemsink_kind kind() const { return static_cast<idemsink_kind>(desc_.kind); }  // validated by load()
  std::span<const idemsink_option_decl> options() const { return {desc_.options, desc_.option_count}; }
  std::span<const char* const> schema() const { return {desc_.schema, desc_.schema_count}; }
  std::span<const idemsink_check> checks() const { return {desc_.checks, desc_.check_count}; }

  /// Human-readable description for `idemsink plugin-info`.
  std::string info() const;

 private:
  Library() = default;
  boost::dll::shared_library lib_;
  std::filesystem::path path_;
  idemsink_plugin desc_{};  // copy; fields past the plugin's struct_size are zero
};

/// Checks a route's [route.options] against the plugin's declarations and
/// returns every declared option in canonical text (defaults filled in).
/// Throws config::ConfigError naming the file, line and option.
std::vector<std::pair<std::string, std::string>> resolve_options(const Library& lib, const config::RouteConfig& route);

/// One handler instance, created for one route.
class Instance {
 public:
  /// Validates options and calls create(); throws config::ConfigError or LoadError.
  Instance(std::shared_ptr<Library> lib, const config::RouteConfig& route);
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  const Library& library() const { return *lib_; }
  idemsink_kind kind() const { return lib_->kind(); }
  const std::string& route() const { return route_; }

  void invoke(const idemsink_record& rec, uint64_t call_id);
  void apply(const idemsink_record& rec, idemsink_tx* tx, uint64_t call_id);
  bool can_reconcile() const { return lib_->descriptor().reconcile != nullptr; }
  void reconcile(const idemsink_record& rec, uint64_t call_id);

 private:
  std::shared_ptr<Library> lib_;
  std::string route_;
  std::string log_prefix_;
  idemsink_host_api api_{};
  void* instance_ = nullptr;
};

}  // namespace idemsink::plugin
