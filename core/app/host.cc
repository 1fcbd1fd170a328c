#include "core/app/host.h"

#include <mysqld_error.h>
#include <signal.h>
#include <sys/resource.h>

#include "core/common/asio.h"
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <future>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "core/admin/admin_server.h"
#include "core/app/build_info.h"
#include "core/claim/offsets.h"
#include "core/claim/offset_moves.h"
#include "core/claim/order_hold.h"
#include "core/operate/operator_log.h"
#include "core/claim/schema.h"
#include "core/config/reload.h"
#include "core/common/fault.h"
#include "core/common/log.h"
#include "core/common/util.h"
#include "core/db/pool.h"
#include "core/dlq/outbox.h"
#include "core/format/registry.h"
#include "core/kafka/consumer.h"
#include "core/kafka/login.h"
#include "core/kafka/producer.h"
#include "core/pipeline/engine.h"
#include "core/common/periodic.h"
#include "core/reconcile/reconciler.h"
#include "core/plugin/retirer.h"

namespace idemsink::app {

namespace asio = boost::asio;
using json = nlohmann::json;
using metrics::Metrics;
using pipeline::Engine;
using pipeline::KeyExtractor;
using pipeline::Route;
using reconcile::Reconciler;

std::vector<std::shared_ptr<plugin::Library>> load_route_plugins(const config::Config& cfg) {
  std::map<std::string, std::shared_ptr<plugin::Library>> by_path;
  std::vector<std::shared_ptr<plugin::Library>> out;
  for (const auto& route : cfg.routes) {
    auto& lib = by_path[route.plugin.string()];
    if (!lib) {
      try {
        lib = plugin::Library::load(route.plugin);
      } catch (const plugin::LoadError& e) {
        throw plugin::LoadError(route.plugin_pos.where() + ": route " + route.name + ": " + e.what());
      }
    }
    plugin::resolve_options(*lib, route);  // throws ConfigError with the option's line
    out.push_back(lib);
  }
  return out;
}

std::vector<std::string> schema_statements(const config::Config& cfg,
                                           const std::vector<std::shared_ptr<plugin::Library>>& libs) {
  std::vector<std::string> stmts{claim::claim_table(std::chrono::system_clock::now(), {cfg.claim.retention_days, 3}),
                                 claim::key_directory_table(),
                                 claim::meta_table(),
                                 claim::OffsetStore::schema(),
                                 claim::OrderHolds::schema(),
                                 claim::OffsetMoves::schema(),
                                 dlq::Outbox::schema(),
                                 pipeline::RouteControl::schema(),
                                 operate::OperatorLog::schema()};
  std::map<std::string, bool> seen;
  for (const auto& lib : libs) {
    if (seen[lib->path().string()]) continue;
    seen[lib->path().string()] = true;
    for (const char* s : lib->schema()) stmts.emplace_back(s);
  }
  return stmts;
}

void apply_schema(const config::Config& cfg, const std::vector<std::shared_ptr<plugin::Library>>& libs) {
  db::Pool::run_once(cfg.database, [&](db::Connection& c) {
    // Hosts starting together, and their running peers' maintenance, change
    // the claim partitions one at a time (the lock housekeeping takes too).
    // Not taken within a minute (a peer stuck in its maintenance), the
    // schema is applied anyway rather than the start waiting longer.
    claim::PartitionLock lock(c, 60);
    const claim::PartitionReport report =
        claim::apply_schema(c, std::chrono::system_clock::now(), {cfg.claim.retention_days, 3});
    lock.release();
    claim::token_namespace(c, true);  // made once per deployment; kept by every replica
    c.execute(dlq::Outbox::schema());
    dlq::Outbox::migrate(c);
    c.execute(pipeline::RouteControl::schema());
    c.execute(operate::OperatorLog::schema());
    for (const auto& p : report.added) spdlog::info("schema: added claim partition {}", p);
    for (const auto& p : report.dropped) spdlog::info("schema: dropped claim partition {} (past retention)", p);
    std::map<std::string, bool> seen;
    for (const auto& lib : libs) {
      if (seen[lib->path().string()]) continue;
      seen[lib->path().string()] = true;
      for (const char* s : lib->schema()) c.execute(s);
    }
  });
}

namespace {

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
  std::unique_ptr<Engine> engine;
  std::map<std::string, const format::RecordDecoder*> decoders;  // the engine's routes', by name (the reloader's)
  /// One per group of its routes; added and removed on the engine thread
  /// before shutdown begins, read by the shutdown after.
  std::vector<std::unique_ptr<kafka::Consumer>> consumers;
  /// Closed by a reload that removed their routes: kept, as records past the
  /// close's grace may hold their messages, until the records are dropped.
  std::vector<std::unique_ptr<kafka::Consumer>> closed_consumers;
  std::unique_ptr<Reconciler> reconciler;
  bool started = false;  // engine thread only
};

// Closes the running slices' consumers at once: each revokes and drains its
// partitions and commits. A close still running past the deadline is named
// in the log every 10 s, since a hang there logs nothing else.
void close_consumers(const std::vector<Slice*>& running, std::chrono::steady_clock::time_point deadline) {
  struct Closing {
    const Slice* slice;
    const kafka::Consumer* consumer;
    std::future<void> closed;
  };
  std::vector<Closing> closing;
  for (Slice* s : running)
    for (auto& c : s->consumers)
      closing.push_back({s, c.get(), std::async(std::launch::async, [c = c.get(), deadline] { c->close(deadline); })});
  for (auto& c : closing) {
    const auto& db = c.slice->cfg.database;
    for (auto late = std::chrono::seconds(5); c.closed.wait_until(deadline + late) == std::future_status::timeout;
         late += std::chrono::seconds(10))
      spdlog::warn(
          "shutdown: the Kafka consumer (group {}) of database {}@{}:{} has not closed {}s past the shutdown "
          "deadline (host.shutdown_grace + 5s); still waiting for it to revoke, commit and leave the group",
          c.consumer->group(), db.database, db.host, db.port, late.count());
    c.closed.get();
  }
}

// A database error that waiting cannot cure: the configuration is wrong.
bool configuration_error(const db::DbError& e) {
  switch (e.code()) {
    case ER_ACCESS_DENIED_ERROR:       // bad user or password
    case ER_DBACCESS_DENIED_ERROR:     // no rights on the database
    case ER_BAD_DB_ERROR:              // no such database
    case ER_TABLEACCESS_DENIED_ERROR:  // may not create or use a table
    case ER_COLUMNACCESS_DENIED_ERROR:
    case ER_SPECIFIC_ACCESS_DENIED_ERROR:
    case ER_NO_SUCH_TABLE:  // claim.apply_schema off and the schema missing
    case 0:                 // a table idemsink cannot use (schema.cc: not partitioned by month)
      return true;
    default: return false;
  }
}

// What a slice needs of its database before it may take a record: the
// schema (applied, or checked when a DBA manages it) and the routes' pauses.
void prepare_database(Slice& s) {
  if (s.cfg.claim.apply_schema) {
    apply_schema(s.cfg, s.libs);
  } else {
    db::Pool::run_once(s.cfg.database, [](db::Connection& c) {
      claim::check_tables(c);
      dlq::Outbox::check_table(c);
      pipeline::RouteControl::check_table(c);
    });
  }
  if (s.cfg.claim.derived_tokens) {
    std::string ns;  // made by apply_schema, or by `idemsink schema apply`
    db::Pool::run_once(s.cfg.database, [&](db::Connection& c) { ns = claim::token_namespace(c, false); });
    if (ns.empty())
      throw db::DbError(0,
                        "claim.derived_tokens needs the deployment's token namespace in idemsink_meta, and "
                        "claim.apply_schema is off: run `idemsink schema apply` once");
    s.engine->set_token_namespace(ns);
  }
  db::Pool::run_once(s.cfg.database, [&](db::Connection& c) {
    if (!claim::key_directory_complete(c)) {
      s.engine->set_claim_read(claim::ClaimRead::AllMonths);
      spdlog::warn(
          "database {}: idemsink_claim was made by an earlier version; each claim read looks a key up in every "
          "month's partition until `idemsink schema migrate` has filled the key directory in (online, "
          "docs/deploying.md)",
          s.cfg.database.label());
    }
  });
  s.engine->route_control().load_at_start();
}

// Waits, on a thread of its own, until a slice's database answers, then hands
// the slice to `ready` (on the engine thread). One log line per attempt;
// /readyz names the database meanwhile. A configuration error goes to
// `fatal` instead.
class SliceStarter {
 public:
  SliceStarter(asio::io_context& io, Slice& slice, metrics::SliceMetrics& metrics, std::function<void(Slice&)> ready,
               std::function<void(std::string)> fatal)
      : thread_([this, &io, &slice, &metrics, ready = std::move(ready), fatal = std::move(fatal)] {
          const auto backoff_max =
              std::max<std::chrono::milliseconds>(slice.cfg.database.reconnect_backoff_max, std::chrono::seconds(1));
          auto wait = std::chrono::milliseconds(250);
          for (int attempt = 1;; ++attempt) {
            try {
              prepare_database(slice);
              if (attempt > 1) spdlog::info("database {} answers now; starting its routes", slice.cfg.database.label());
              metrics.set_start_problem("");
              asio::post(io, [&slice, ready] { ready(slice); });
              return;
            } catch (const db::DbError& e) {
              if (configuration_error(e)) {
                asio::post(io,
                           [fatal, msg = "database " + slice.cfg.database.label() + ": " + e.what()] { fatal(msg); });
                return;
              }
              metrics.set_start_problem(e.what());
              metrics.db_healthy.store(0);
              spdlog::warn("database {} unreachable at start-up ({}); its routes wait; retrying in {}ms (attempt {})",
                           slice.cfg.database.label(), e.what(), wait.count(), attempt);
            } catch (const std::exception& e) {
              asio::post(io, [fatal, msg = "database " + slice.cfg.database.label() + ": " + e.what()] { fatal(msg); });
              return;
            }
            std::unique_lock lk(mu_);
            if (cv_.wait_for(lk, wait, [this] { return stop_; })) return;
            wait = std::min(backoff_max, wait * 2);
          }
        }) {}
  /// Stops waiting (an attempt under way finishes first); does not block.
  void request_stop() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
  }
  ~SliceStarter() {
    request_stop();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;   // under mu_
  std::thread thread_;  // last: starts once the rest is in place
};

void mask_stop_signals(int how) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(how, &stop, nullptr);
}

}  // namespace

void block_stop_signals() { mask_stop_signals(SIG_BLOCK); }

namespace {

// One run of the host, from its first log line to its exit code: a slice per
// database wired to the shared engine thread, each started once its database
// answers, all drained on a signal or a configuration error. Members are
// declared in the order they must be built: the slices' timers and the
// signal sets go before the io_context they run on.
class HostRun {
 public:
  explicit HostRun(const config::Config& cfg) : cfg_(cfg) {}

  int run() {
    if (fault::once("slow_start")) std::this_thread::sleep_for(std::chrono::seconds(2));
    running_text_ = read_config_text();
    metrics_.set_config(cfg_.file.string(), config_hash(running_text_));
    const auto libs = load_route_plugins(cfg_);
    for (size_t i = 0; i < cfg_.routes.size(); ++i) lib_of_[cfg_.routes[i].name] = libs[i];
    const std::vector<config::Config> slice_cfgs = config::split_by_database(cfg_);
    log_start();
    raise_open_files_limit();
    // Blocked since main(): one that came meanwhile is delivered now, to
    // this thread, and caught from here on (queued until waited for below):
    // a SIGTERM while the host starts drains it instead of killing it, and a
    // SIGHUP never kills it.
    mask_stop_signals(SIG_UNBLOCK);
    // /livez: the engine thread runs (every slice's engine shares it).
    heartbeat_.start(std::chrono::seconds(1), [this] {
      if (fault::once("engine_stall")) std::this_thread::sleep_for(std::chrono::seconds(15));
      metrics_.heartbeat();
    });
    slices_.reserve(slice_cfgs.size());
    for (size_t index = 0; index < slice_cfgs.size(); ++index)
      wire_slice(slices_.emplace_back(Slice{slice_cfgs[index]}), index);
    for (const format::Registry* r : registries_.all())
      metrics_.watch_registry(
          r->config().url, [r] { return r->problem(); }, [r] { return r->waiting(); });
    if (slices_.size() > 1)
      spdlog::info("{} databases: one consumer per database in group {}, so one database down stalls only its routes",
                   slices_.size(), cfg_.kafka.group_id);
    if (!cfg_.host.admin_listen.empty()) {
      views_.set(slice_views());
      admin_ = std::make_unique<admin::AdminServer>(
          cfg_, metrics_, views_,
          [this](const operate::Actor& who, bool force, const std::string& note) { return reload(who, force, note); });
    }
    for (auto& s : slices_)
      starters_.push_back(std::make_unique<SliceStarter>(
          io_, s, s.engine->slice(), [this](Slice& ready) { start_slice(ready); },
          [this](const std::string& why) {
            spdlog::error("{}: a configuration error; stopping", why);
            exit_code_ = 2;
            begin_shutdown("configuration error");
          }));
    signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (!ec) begin_shutdown("signal " + std::to_string(sig));
    });
    wait_for_hangup();
    io_.run();
    return finish();
  }

 private:
  void log_start() {
    spdlog::info("idemsink host {} starting: {} route(s), group {}, owner {}", cfg_.host.id, cfg_.routes.size(),
                 cfg_.kafka.group_id, owner_);
    spdlog::info("{}", kafka::library_workarounds(cfg_.kafka));
    if (const auto caveat = kafka::login_caveat(kafka::LoginSettings::of(cfg_.kafka.properties)))
      spdlog::warn("kafka: {}", *caveat);
    const auto build = build_info();
    spdlog::info("build: idemsink {} (commit {}), librdkafka {}, Connector/C {}, plugin ABI {}", build.at("version"),
                 build.at("commit"), build.at("librdkafka"), build.at("connector_c"), build.at("plugin_abi"));
    metrics_.set_build_info(build);
  }

  // Every call in flight holds a connection of its plugin (a file
  // descriptor each), besides Kafka's and the databases' sockets: a host
  // with max_in_flight in the thousands outgrows the common soft limit of
  // 1024 open files, and its calls would fail to connect (EMFILE). The soft
  // limit goes up to the hard one, as servers do.
  void raise_open_files_limit() {
    rlimit lim{};
    if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
    const rlim_t before = lim.rlim_cur;
    if (lim.rlim_cur < lim.rlim_max) {
      rlimit raised = lim;
      raised.rlim_cur = lim.rlim_max;
      if (setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
    }
    if (lim.rlim_cur != before) spdlog::info("open files: soft limit raised from {} to {}", before, lim.rlim_cur);
    constexpr rlim_t kOwnSockets = 256;  // Kafka, databases, admin, logs
    if (lim.rlim_cur < static_cast<rlim_t>(cfg_.host.max_in_flight) + kOwnSockets)
      spdlog::warn(
          "open files: the limit is {}, below host.max_in_flight ({}) plus the host's own sockets: calls may fail "
          "to connect; raise it (systemd: LimitNOFILE=, the shipped unit sets 65536)",
          lim.rlim_cur, cfg_.host.max_in_flight);
  }

  // The slice's routes, pool, engine, consumers (one per group its routes
  // use, each member `index` of its group) and reconciler; nothing runs until
  // start_slice().
  // A route as the engine runs it, with its handler instance (which may
  // refuse its options: a plugin::LoadError or ConfigError).
  std::unique_ptr<Route> make_route(const config::RouteConfig& rc, const std::shared_ptr<plugin::Library>& lib,
                                    const std::string& database) {
    auto route = std::make_unique<Route>(Route{rc, retirer_.adopt(std::make_unique<plugin::Instance>(lib, rc)),
                                               KeyExtractor(rc), &metrics_.route(rc.name)});
    if (rc.order_by.enabled())
      route->order_extractor.emplace(rc.order_by.source, rc.order_by.header, rc.order_by.json_path);
    if (rc.when) route->filter.emplace(*rc.when);
    if (format::RecordDecoder::needed(rc)) route->decoder.emplace(rc, registries_.for_route(rc));
    spdlog::info("route {}: topic {} (group {}{}) -> plugin {} {} ({}), DLQ {}, database {}", rc.name, rc.topic,
                 rc.group_id, rc.when ? ", when " + rc.when->describe() : "", lib->name(), lib->descriptor().version,
                 plugin::kind_name(lib->kind()), rc.dlq.enabled ? rc.dlq.topic : "disabled", database);
    return route;
  }

  void wire_slice(Slice& s, size_t index) {
    s.routes = std::make_shared<const config::Config>(s.cfg);
    std::vector<std::unique_ptr<Route>> routes;
    for (const auto& rc : s.cfg.routes) {
      const auto& lib = lib_of_[rc.name];
      s.libs.push_back(lib);
      routes.push_back(make_route(rc, lib, s.cfg.database.label()));
    }
    for (const auto& r : routes)
      if (r->decoder) s.decoders[r->cfg.name] = &*r->decoder;
    s.pool = std::make_unique<db::Pool>(s.cfg.database, s.cfg.database.pool_size);
    s.engine = std::make_unique<Engine>(io_, *s.pool, s.cfg, std::move(routes), metrics_, owner_);
    Engine& engine = *s.engine;
    engine.relay().set_producer_factory([&kafka = cfg_.kafka, &engine] {
      return std::make_unique<kafka::Producer>(
          kafka, [&engine](uint64_t id, rd_kafka_resp_err_t err) { engine.relay().on_delivery(id, err); });
    });
    // A consumer per group the slice's routes use (its engine's feeds).
    for (auto& feed : engine.feeds()) {
      config::KafkaConfig kafka = kafka::slice_consumer_config(s.cfg.kafka, index);
      kafka.group_id = feed.group;
      s.consumers.push_back(std::make_unique<kafka::Consumer>(kafka, feed.topics, *feed.listener));
      engine.slice().add_consumer(feed.group, &s.consumers.back()->health());
    }
    s.reconciler =
        std::make_unique<Reconciler>(io_, *s.pool, s.cfg, engine.handlers(), engine, &engine.slice(), owner_);
    engines_.push_back(&engine);
  }

  // On the engine thread, once the slice's database answered.
  void start_slice(Slice& s) {
    if (stopping_) return;
    std::vector<kafka::Consumer*> consumers;
    for (auto& c : s.consumers) consumers.push_back(c.get());
    s.engine->start(consumers);
    for (auto& c : s.consumers) c->start();
    s.reconciler->start(cfg_.claim.reconcile_interval);
    s.started = true;
  }

  void begin_shutdown(const std::string& why) {
    if (stopping_) return;
    stopping_ = true;
    draining_ = true;
    spdlog::info("{}: draining (grace {}ms)", why, cfg_.host.shutdown_grace.count());
    std::vector<Slice*> running;
    for (auto& s : slices_)
      if (s.started) running.push_back(&s);
    // Slices still waiting for their database stop waiting; they are joined
    // once the running ones have drained.
    for (auto& starter : starters_) starter->request_stop();
    // Draining blocks on the engine thread's progress, so it runs elsewhere.
    shutdown_ = std::thread([this, running] {
      {
        // A reload under way ends first (it sees draining_): its consumers
        // are started or closed, never half. Released before the admin
        // port stops: a reload asked meanwhile waits here, then is refused.
        std::lock_guard reload(reload_mu_);
        const auto deadline = std::chrono::steady_clock::now() + cfg_.host.shutdown_grace + std::chrono::seconds(5);
        asio::post(io_, [running] {
          for (Slice* s : running) s->reconciler->stop();
        });
        close_consumers(running, deadline);
        for (Slice* s : running) s->engine->quiesce(deadline);
      }
      if (admin_) admin_->stop();
      work_.reset();
      io_.stop();
    });
  }

  // SIGHUP reopens the log file (logrotate) and reloads the config file;
  // it never stops the host.
  void wait_for_hangup() {
    hangups_.async_wait([this](boost::system::error_code ec, int) {
      if (ec) return;
      if (!cfg_.host.log_file.empty()) {
        if (const std::string why = reopen_log_file(); why.empty())
          spdlog::info("SIGHUP: log file {} reopened", cfg_.host.log_file);
        else
          spdlog::error("SIGHUP: log file {} could not be reopened ({}); logging on to the old one", cfg_.host.log_file,
                        why);
      }
      // The reload blocks (plugins load, the engine applies): on its own thread.
      asio::post(reloader_, [this] { reload({"signal:SIGHUP", "admin"}, false, "SIGHUP"); });
      wait_for_hangup();
    });
  }

  std::string read_config_text() const {
    std::ifstream in(cfg_.file);
    if (!in) throw config::ConfigError(cfg_.file.string() + ": cannot read config file");
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  static std::string config_hash(const std::string& text) { return to_hex(payload_hash(text).substr(0, 8)); }

  // A reload (config/reload.h), from SIGHUP, the admin API or `idemsink
  // reload`: the file read and checked as at start-up (plugins loaded,
  // options checked, new handler instances created) before anything
  // changes, then each changed route reconfigured on the engine thread.
  // One at a time; logged, counted and in the operator log whatever came of it.
  operate::Done reload(const operate::Actor& who, bool force, const std::string& note) {
    if (draining_) return {false, "refused, nothing changed: the host is stopping", {{"result", "refused"}}};
    std::lock_guard lock(reload_mu_);
    operate::Done done;
    try {
      done = try_reload(force);
    } catch (const std::exception& e) {  // a bug: said, never the end of the host
      done = {false,
              std::string("the reload failed part way: ") + e.what() + " (restart to be sure what runs)",
              {{"result", "refused"}}};
    }
    const std::string result = done.detail.value("result", "refused");
    metrics_.count_reload(result, done.message);
    if (done.ok)
      spdlog::info("reload by {}: {}", who.name, done.message);
    else
      spdlog::error("reload by {}: {}", who.name, done.message);
    std::set<std::string> logged;  // one entry per database
    for (auto& s : slices_) {
      if (!logged.insert(s.cfg.database.label()).second) continue;
      try {
        db::Connection c(s.cfg.database);
        c.begin();
        operate::OperatorLog::append(c, {who.name, who.role},
                                     {"host.reload", "", done.detail.value("routes", json::array()), note,
                                      "host " + cfg_.host.id + ": " + result + ": " + done.message});
        c.commit();
      } catch (const db::DbError& e) {
        spdlog::warn("reload by {}: the operator log of {} did not take it: {}", who.name, s.cfg.database.label(),
                     e.what());
      }
    }
    return done;
  }

  operate::Done try_reload(bool force) {
    auto refused = [&](std::string why) {
      return operate::Done{false, "refused, nothing changed: " + why, {{"result", "refused"}}};
    };
    if (draining_) return refused("the host is stopping");
    std::string text;
    std::optional<config::Config> next;
    std::vector<std::shared_ptr<plugin::Library>> libs;
    config::ReloadPlan plan;
    try {
      text = read_config_text();
      next = config::load_text(text, cfg_.file);
      libs = load_route_plugins(*next);
      plan = config::plan_reload(running_, running_text_, *next, text);
    } catch (const std::exception& e) {  // ConfigError, LoadError: the file does not pass
      return refused(e.what());
    }
    const std::string hash = config_hash(text);
    if (!plan.changes_anything()) {
      running_text_ = text;  // comments or layout only
      metrics_.set_config(cfg_.file.string(), hash);
      return {true, "no setting changed (config " + hash + ")", {{"result", "unchanged"}, {"hash", hash}}};
    }
    if (const std::string why = plan.refusal(force); !why.empty()) return refused(why);
    // Every new instance is created before anything changes: a plugin that
    // refuses its options leaves the running config as it is.
    struct Change {
      Slice* slice;
      config::RouteConfig route;
      std::shared_ptr<plugin::Instance> handler;  // null: its options are the same
    };
    std::vector<Change> changes;
    json routes = json::array();
    for (const auto& name : plan.routes_to_apply(force)) {
      const auto& rc = *next->route_by_name(name);
      const size_t index = static_cast<size_t>(&rc - next->routes.data());
      Change c{slice_of(name), rc, nullptr};
      const auto& keys =
          std::find_if(plan.routes.begin(), plan.routes.end(), [&](const auto& r) { return r.route == name; })->keys;
      if (std::any_of(keys.begin(), keys.end(), [](const std::string& k) { return k.starts_with("route.options."); })) {
        try {
          c.handler = retirer_.adopt(std::make_unique<plugin::Instance>(libs[index], rc));
        } catch (const std::exception& e) {
          return refused("route " + name + ": " + e.what());
        }
      }
      routes.push_back({{"route", name}, {"changed", keys}, {"new_instance", c.handler != nullptr}});
      changes.push_back(std::move(c));
    }
    std::vector<Addition> additions;
    try {
      additions = prepare_additions(*next, libs, plan.routes_of(config::RouteChange::Kind::Added));
    } catch (const std::exception& e) {
      return refused(e.what());
    }
    for (const auto& name : plan.routes_of(config::RouteChange::Kind::Added))
      routes.push_back({{"route", name}, {"added", true}});
    for (const auto& name : plan.routes_of(config::RouteChange::Kind::Removed))
      routes.push_back({{"route", name}, {"removed", true}});
    // Applied on the engine thread, each route on its own (a local_tx route
    // once its apply jobs ended); the others never notice.
    struct Pending {
      std::mutex mu;
      std::condition_variable cv;
      size_t left;
    };
    auto pending = std::make_shared<Pending>();
    pending->left = changes.size();
    auto one_done = [pending] {
      std::lock_guard lk(pending->mu);
      if (--pending->left == 0) pending->cv.notify_all();
    };
    const std::string level = plan.log_level_changed ? next->host.log_level : "";
    asio::post(io_, [changes = std::move(changes), one_done, level]() mutable {
      if (!level.empty()) spdlog::set_level(spdlog::level::from_str(level));
      for (auto& c : changes) {
        Slice* s = c.slice;
        // The reconciler reads the routes as the engine runs them now (a
        // local_tx route's change may land after a later reload's).
        s->engine->reconfigure(std::move(c.route), std::move(c.handler), [s, one_done] {
          s->reconciler->set_routes(s->engine->routes_config(), s->engine->handlers());
          one_done();
        });
      }
    });
    {
      // A local_tx route waits for its apply jobs, which wait for the
      // database: not for ever here. A route not changed yet changes once
      // they end; the next reload compares with the file as it ran before.
      const auto deadline = std::chrono::steady_clock::now() + kApplyWait;
      std::unique_lock lk(pending->mu);
      while (pending->left > 0) {
        pending->cv.wait_for(lk, std::chrono::milliseconds(200));
        if (pending->left > 0 && (draining_ || std::chrono::steady_clock::now() >= deadline))
          return {false,
                  std::string(draining_ ? "the host began stopping" : "a local_tx route's apply jobs did not end") +
                      " while the reload applied: " + std::to_string(pending->left) + " of " +
                      std::to_string(routes.size()) + " route(s) not changed yet (each changes once its jobs end)",
                  {{"result", "refused"}, {"routes", routes}}};
      }
    }
    // Routes added, then removed: a consumer of their own starts or closes;
    // no other group rebalances.
    std::set<std::string> not_added;
    std::string failures;
    for (auto& a : additions) {
      std::set<std::string> names;
      for (const auto& r : a.routes) names.insert(r->cfg.name);
      try {
        add_group(a);
      } catch (const std::exception& e) {
        not_added.merge(names);
        failures +=
            "; group " + a.group + ": its consumer could not start (" + e.what() + "), its routes were not added";
      }
    }
    std::set<std::pair<Slice*, std::string>> removals;
    for (const auto& name : plan.routes_of(config::RouteChange::Kind::Removed))
      removals.insert({slice_of(name), running_.route_by_name(name)->group_id});
    for (const auto& [slice, group] : removals) remove_group(*slice, group);
    if (!not_added.empty()) {
      // What runs is the file but for those routes: the next reload compares with that.
      std::erase_if(next->routes, [&](const config::RouteConfig& r) { return not_added.contains(r.name); });
      text = config::without_routes(text, not_added);
    }
    // The admin port's view of the routes, as they now run.
    const auto views = views_of(*next);
    for (auto& s : slices_) s.routes = views.at(&s);
    views_.set(slice_views());
    running_ = std::move(*next);
    running_text_ = text;
    metrics_.set_config(cfg_.file.string(), config_hash(text));
    if (!not_added.empty())
      return {false,
              plan.describe() + ", but" + failures.substr(1) + " (restart, or reload to try again)",
              {{"result", "refused"}, {"routes", routes}}};
    return {
        true, plan.describe() + " (config " + hash + ")", {{"result", "applied"}, {"hash", hash}, {"routes", routes}}};
  }

  // The slices' routes as `next` has them: the admin port's and the reconcilers' view.
  std::map<const Slice*, std::shared_ptr<const config::Config>> views_of(const config::Config& next) const {
    std::map<const Slice*, std::shared_ptr<const config::Config>> views;
    for (const auto& s : slices_) {
      config::Config view = s.cfg;
      view.routes.clear();
      for (const auto& rc : next.routes)
        if (next.database_of(rc).label() == s.cfg.database.label()) view.routes.push_back(rc);
      views[&s] = std::make_shared<const config::Config>(std::move(view));
    }
    return views;
  }

  // Runs `fn` on the engine thread and waits for its result (the reloader's
  // thread; the engine thread runs until the shutdown, which waits for a
  // reload under way).
  template <class Fn>
  std::invoke_result_t<Fn> on_engine(Fn fn) {
    std::packaged_task<std::invoke_result_t<Fn>()> task(std::move(fn));
    auto result = task.get_future();
    asio::post(io_, [&task] { task(); });
    return result.get();
  }

  // The routes a reload adds, made before anything changes (an instance may
  // refuse its options), one entry per slice and group.
  struct Addition {
    Slice* slice;
    std::string group;
    std::vector<std::unique_ptr<Route>> routes;
  };
  std::vector<Addition> prepare_additions(const config::Config& next,
                                          const std::vector<std::shared_ptr<plugin::Library>>& libs,
                                          const std::vector<std::string>& names) {
    std::vector<Addition> out;
    const size_t registries = registries_.all().size();
    for (const auto& name : names) {
      const config::RouteConfig& rc = *next.route_by_name(name);
      const auto& lib = libs[static_cast<size_t>(&rc - next.routes.data())];
      const std::string database = next.database_of(rc).label();
      auto s = std::find_if(slices_.begin(), slices_.end(),
                            [&](const Slice& s) { return s.cfg.database.label() == database; });
      if (s == slices_.end() || !on_engine([&s] { return s->started; }))
        throw std::runtime_error(
            "route " + name + ": database " + database +
            " has not started its routes (it did not answer yet): restart, or reload once it runs");
      // A plugin file new to the database brings its tables.
      if (s->cfg.claim.apply_schema &&
          std::none_of(s->libs.begin(), s->libs.end(), [&](const auto& l) { return l->path() == lib->path(); })) {
        try {
          db::Pool::run_once(s->cfg.database, [&](db::Connection& c) {
            for (const char* stmt : lib->schema()) c.execute(stmt);
          });
        } catch (const db::DbError& e) {
          throw std::runtime_error("route " + name + ": the tables of plugin " + lib->path().string() + ": " +
                                   e.what());
        }
      }
      std::unique_ptr<Route> route;
      try {
        route = make_route(rc, lib, database);
      } catch (const std::exception& e) {
        throw std::runtime_error("route " + name + ": " + e.what());
      }
      auto a = std::find_if(out.begin(), out.end(),
                            [&](const Addition& a) { return a.slice == &*s && a.group == rc.group_id; });
      if (a == out.end()) a = out.insert(out.end(), Addition{&*s, rc.group_id, {}});
      a->routes.push_back(std::move(route));
      s->libs.push_back(lib);
      lib_of_[name] = lib;
    }
    const auto all = registries_.all();
    for (size_t i = registries; i < all.size(); ++i)
      metrics_.watch_registry(
          all[i]->config().url, [r = all[i]] { return r->problem(); }, [r = all[i]] { return r->waiting(); });
    return out;
  }

  // Added routes of one group: the engine's feed for them, then its
  // consumer, started like the others. A consumer that cannot start takes
  // its routes out again (throws).
  void add_group(Addition& a) {
    Slice& s = *a.slice;
    std::map<std::string, const format::RecordDecoder*> decoders;
    for (const auto& r : a.routes)
      if (r->decoder) decoders[r->cfg.name] = &*r->decoder;
    const Engine::FeedPlan plan = on_engine([&] { return s.engine->add_routes(std::move(a.routes)); });
    config::KafkaConfig kafka = kafka::slice_consumer_config(s.cfg.kafka, static_cast<size_t>(&s - slices_.data()));
    kafka.group_id = a.group;
    std::unique_ptr<kafka::Consumer> consumer;
    std::string failed;
    try {
      consumer = std::make_unique<kafka::Consumer>(kafka, plan.topics, *plan.listener);
    } catch (const std::exception& e) {
      failed = e.what();
    }
    on_engine([&] {
      if (consumer) {
        s.engine->attach_feed(a.group, consumer.get());
        try {
          consumer->start();
          s.engine->slice().add_consumer(a.group, &consumer->health());
          s.consumers.push_back(std::move(consumer));
          s.reconciler->set_routes(s.engine->routes_config(), s.engine->handlers());
          return;
        } catch (const std::exception& e) {
          failed = e.what();
        }
      }
      s.engine->remove_feed(a.group);
    });
    if (!failed.empty()) throw std::runtime_error(failed);
    s.decoders.merge(decoders);
    std::string topics;
    for (const auto& t : plan.topics) topics += (topics.empty() ? "" : ", ") + t;
    spdlog::info("reload: group {} started, reading {}", a.group, topics);
  }

  // Removed routes' group: its consumer closes as at shutdown (partitions
  // revoked, drained up to the grace, committed; it leaves the group), then
  // its routes leave the engine. The consumer goes once no record holds a
  // message of it (librdkafka waits for those).
  void remove_group(Slice& s, const std::string& group) {
    bool removed = false;  // at once: the slice had not started
    std::unique_ptr<kafka::Consumer> consumer = on_engine([&] {
      std::unique_ptr<kafka::Consumer> out;
      auto it =
          std::find_if(s.consumers.begin(), s.consumers.end(), [&](const auto& c) { return c->group() == group; });
      if (it == s.consumers.end()) throw std::logic_error("remove_group: no consumer of group " + group);
      out = std::move(*it);
      s.consumers.erase(it);
      s.engine->slice().remove_consumer(&out->health());
      // A slice still waiting for its database never started its consumers:
      // its feed goes at once, before the slice can start.
      if (!s.started) {
        s.engine->remove_feed(group);
        removed = true;
      }
      return out;
    });
    consumer->close(std::chrono::steady_clock::now() + cfg_.host.shutdown_grace + std::chrono::seconds(5));
    const bool kept = on_engine([&] {
      if (!removed) s.engine->remove_feed(group);
      s.reconciler->set_routes(s.engine->routes_config(), s.engine->handlers());
      // One librdkafka abandoned (docs/librdkafka.md) must never be
      // destroyed, nor one whose messages a record still holds; one never
      // started may still be read by a metrics scrape that listed it.
      if (!removed && !consumer->abandoned() && !s.engine->holds_records_of(group)) return false;
      s.closed_consumers.push_back(std::move(consumer));
      return true;
    });
    consumer.reset();  // here, not on the engine thread: it joins librdkafka's threads
    spdlog::info("reload: group {} closed{}; its routes are removed", group,
                 kept ? " (its client is kept until the host stops)" : "");
  }

  static constexpr std::chrono::seconds kApplyWait{60};

  Slice* slice_of(const std::string& route) {
    for (auto& s : slices_)
      if (s.routes->route_by_name(route)) return &s;
    throw std::logic_error("no slice runs route " + route);
  }

  // The admin port's view of the slices, as their routes are now (reload_mu_, or before it opens).
  std::vector<admin::SliceView> slice_views() {
    std::vector<admin::SliceView> views;
    for (auto& s : slices_) views.push_back({s.routes, s.engine.get(), s.reconciler.get(), s.decoders});
    return views;
  }

  // After the engine thread stopped: the exit code.
  int finish() {
    if (shutdown_.joinable()) shutdown_.join();
    starters_.clear();
    for (auto& s : slices_) s.pool->stop(std::chrono::steady_clock::now() + std::chrono::seconds(5));
    // Calls still out after the grace are abandoned (their claims fence any
    // late completion): their records go before the consumers they came from.
    for (auto& s : slices_) s.engine->drop_records();
    spdlog::info("idemsink host {} stopped", cfg_.host.id);
    bool abandoned = false;
    for (const auto& s : slices_) {
      for (const auto& c : s.consumers) abandoned = abandoned || c->abandoned();
      for (const auto& c : s.closed_consumers) abandoned = abandoned || c->abandoned();
    }
    if (abandoned) {
      // librdkafka's threads still run (docs/librdkafka.md): no destructor may
      // race them. Everything durable is written; the logs are flushed.
      spdlog::default_logger()->flush();
      std::_Exit(exit_code_);
    }
    return exit_code_;
  }

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
  Metrics metrics_;
  asio::io_context io_;
  asio::signal_set signals_{io_, SIGINT, SIGTERM};
  asio::signal_set hangups_{io_, SIGHUP};
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  Periodic heartbeat_{io_};
  std::vector<Slice> slices_;
  std::vector<Engine*> engines_;
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
  asio::thread_pool reloader_{1};
};

}  // namespace

int run_host(const config::Config& cfg) { return HostRun(cfg).run(); }

}  // namespace idemsink::app
