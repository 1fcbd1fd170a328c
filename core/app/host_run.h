// Private to app/: one run of the host, shared by host.cc (start-up, the
// slices, shutdown) and host_reload.cc (a reload while it runs).
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/admin/admin_server.h"
#include "core/common/asio.h"
#include "core/common/log_settings.h"
#include "core/common/periodic.h"
#include "core/common/util.h"
#include "core/config/config.h"
#include "core/config/reload.h"
#include "core/format/registry.h"
#include "core/kafka/consumer.h"
#include "core/metrics/metrics.h"
#include "core/operate/actions.h"
#include "core/operate/operator_log.h"
#include "core/pipeline/engine.h"
#include "core/plugin/retirer.h"
#include "core/reconcile/reconciler.h"

namespace idemsink::app::detail {

// The part of the host serving the routes of one database: its pool, engine,
// consumer (a member of the same group, subscribed to those routes' topics)
// and reconciler. A database that is down stalls only its slice, at start-up
// too: the slice starts once its database answers.
struct Slice {
  config::Config cfg;  // [database] is the slice's, routes only its own, as the host started
  /// Its routes as the last reload left them (the reloader's thread; the
  /// admin port and the reconciler get copies).
  std::shared_ptr<const config::Config> routes;
  std::vector<std::shared_ptr<plugin::Library>> libs;
  std::unique_ptr<db::Pool> pool;
  std::unique_ptr<pipeline::Engine> engine;
  std::map<std::string, const format::RecordDecoder*> decoders;  // the engine's routes', by name (the reloader's)
  /// One per group of its routes; added and removed on the engine thread
  /// before shutdown begins, read by the shutdown after.
  std::vector<std::unique_ptr<kafka::Consumer>> consumers;
  /// Closed by a reload that removed their routes: kept, as records past the
  /// close's grace may hold their messages, until the records are dropped.
  std::vector<std::unique_ptr<kafka::Consumer>> closed_consumers;
  std::unique_ptr<reconcile::Reconciler> reconciler;
  bool started = false;  // engine thread only
};

class SliceStarter;  // host.cc

// One run of the host, from its first log line to its exit code: a slice per
// database wired to the shared engine thread, each started once its database
// answers, all drained on a signal or a configuration error. Members are
// declared in the order they must be built: the slices' timers and the
// signal sets go before the io_context they run on.
class HostRun {
 public:
  explicit HostRun(const config::Config& cfg);
  ~HostRun();

  int run();

 private:
  // Start-up, the slices and shutdown (host.cc).
  void log_start();
  void raise_open_files_limit();
  std::unique_ptr<pipeline::Route> make_route(const config::RouteConfig& rc,
                                              const std::shared_ptr<plugin::Library>& lib, const std::string& database);
  void wire_slice(Slice& s, size_t index);
  void start_slice(Slice& s);
  void begin_shutdown(const std::string& why);
  void wait_for_hangup();
  std::string read_config_text() const;
  static std::string config_hash(const std::string& text);
  Slice* slice_of(const std::string& route);
  std::vector<admin::SliceView> slice_views();
  int finish();

  // A reload while it runs (host_reload.cc).
  struct Draft;
  struct Change;
  struct Addition;
  operate::Done reload(const operate::Actor& who, bool force, const std::string& note);
  operate::Done try_reload(bool force);
  Draft read_draft() const;
  std::vector<Change> prepare_changes(const Draft& draft, bool force, nlohmann::json& routes);
  std::vector<Addition> prepare_additions(const config::Config& next,
                                          const std::vector<std::shared_ptr<plugin::Library>>& libs,
                                          const std::vector<std::string>& names);
  std::string apply_changes(std::vector<Change> changes, std::optional<LogLevel> log_level, size_t routes);
  std::set<std::string> add_groups(std::vector<Addition>& additions, std::string& failures);
  void add_group(Addition& a);
  void remove_group(Slice& s, const std::string& group);
  void run_from_now(config::Config next, std::string text);
  std::map<const Slice*, std::shared_ptr<const config::Config>> views_of(const config::Config& next) const;
  template <class Fn>
  std::invoke_result_t<Fn> on_engine(Fn fn);

  static constexpr std::chrono::seconds kApplyWait{60};

  const config::Config& cfg_;
  // The config as last applied, and its file's text (reload_mu_).
  std::mutex reload_mu_;
  config::Config running_ = cfg_;
  std::string running_text_;
  std::atomic<bool> draining_ = false;
  // Declared before the slices: the instances their routes hold are
  // destroyed on its thread, which stops once they are.
  plugin::Retirer retirer_;
  std::map<std::string, std::shared_ptr<plugin::Library>> lib_of_;  // by route name
  // Claims are owned per run; a later run of the same host id takes over its
  // predecessor's claims at once (the predecessor is dead: ids are unique).
  const std::string owner_ = cfg_.host.id + "#" + random_uuid().substr(0, 8);
  metrics::Metrics metrics_;
  boost::asio::io_context io_;
  boost::asio::signal_set signals_{io_, SIGINT, SIGTERM};
  boost::asio::signal_set hangups_{io_, SIGHUP};
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_ = boost::asio::make_work_guard(io_);
  Periodic heartbeat_{io_};
  std::vector<Slice> slices_;
  // Declared after the slices: its threads stop before the engines their
  // answers are posted to go away.
  format::Registries registries_;
  admin::SliceViews views_{{}};
  std::unique_ptr<admin::AdminServer> admin_;
  int exit_code_ = 0;
  bool stopping_ = false;  // engine thread only: no slice starts once shutdown began
  std::thread shutdown_;
  std::vector<std::unique_ptr<SliceStarter>> starters_;
  // Declared last: a reload running on it finishes before the slices go.
  boost::asio::thread_pool reloader_{1};
};

}  // namespace idemsink::app::detail
