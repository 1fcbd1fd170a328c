#include "core/app/host.h"

#include <mysqld_error.h>
#include <signal.h>
#include <sys/resource.h>

#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <future>
#include <fstream>
#include <sstream>

#include "core/app/build_info.h"
#include "core/app/host_run.h"
#include "core/claim/offsets.h"
#include "core/claim/offset_moves.h"
#include "core/claim/order_hold.h"
#include "core/claim/schema.h"
#include "core/common/fault.h"
#include "core/common/log.h"
#include "core/db/pool.h"
#include "core/dlq/outbox.h"
#include "core/kafka/login.h"
#include "core/kafka/producer.h"

namespace idemsink::app {

namespace asio = boost::asio;
using json = nlohmann::json;
using detail::Slice;
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

void mask_stop_signals(int how) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(how, &stop, nullptr);
}

}  // namespace

void block_stop_signals() { mask_stop_signals(SIG_BLOCK); }

namespace detail {

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

HostRun::HostRun(const config::Config& cfg) : cfg_(cfg) {}

// Out of line: SliceStarter is complete only here.
HostRun::~HostRun() = default;

int HostRun::run() {
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

void HostRun::log_start() {
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
void HostRun::raise_open_files_limit() {
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

// A route as the engine runs it, with its handler instance (which may
// refuse its options: a plugin::LoadError or ConfigError).
std::unique_ptr<Route> HostRun::make_route(const config::RouteConfig& rc, const std::shared_ptr<plugin::Library>& lib,
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

// The slice's routes, pool, engine, consumers (one per group its routes
// use, each member `index` of its group) and reconciler; nothing runs until
// start_slice().
void HostRun::wire_slice(Slice& s, size_t index) {
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
  s.reconciler = std::make_unique<Reconciler>(io_, *s.pool, s.cfg, engine.handlers(), engine, &engine.slice(), owner_);
}

// On the engine thread, once the slice's database answered.
void HostRun::start_slice(Slice& s) {
  if (stopping_) return;
  std::vector<kafka::Consumer*> consumers;
  for (auto& c : s.consumers) consumers.push_back(c.get());
  s.engine->start(consumers);
  for (auto& c : s.consumers) c->start();
  s.reconciler->start(cfg_.claim.reconcile_interval);
  s.started = true;
}

void HostRun::begin_shutdown(const std::string& why) {
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
void HostRun::wait_for_hangup() {
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

std::string HostRun::read_config_text() const {
  std::ifstream in(cfg_.file);
  if (!in) throw config::ConfigError(cfg_.file.string() + ": cannot read config file");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string HostRun::config_hash(const std::string& text) { return to_hex(payload_hash(text).substr(0, 8)); }

Slice* HostRun::slice_of(const std::string& route) {
  for (auto& s : slices_)
    if (s.routes->route_by_name(route)) return &s;
  throw std::logic_error("no slice runs route " + route);
}

// The admin port's view of the slices, as their routes are now (reload_mu_, or before it opens).
std::vector<admin::SliceView> HostRun::slice_views() {
  std::vector<admin::SliceView> views;
  for (auto& s : slices_) views.push_back({s.routes, s.engine.get(), s.reconciler.get(), s.decoders});
  return views;
}

// After the engine thread stopped: the exit code.
int HostRun::finish() {
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

}  // namespace detail

int run_host(const config::Config& cfg) { return detail::HostRun(cfg).run(); }

}  // namespace idemsink::app
