#include "core/app/host.h"

#include <utility>  // before Boost.Asio 1.74: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
#include <cstdlib>
#include <map>
#include <thread>

#include "core/admin/admin_server.h"
#include "core/claim/schema.h"
#include "core/common/log.h"
#include "core/common/util.h"
#include "core/db/pool.h"
#include "core/dlq/outbox.h"
#include "core/kafka/consumer.h"
#include "core/kafka/producer.h"
#include "core/pipeline/engine.h"
#include "core/pipeline/reconciler.h"

namespace idemsink::app {

namespace asio = boost::asio;
using pipeline::Engine;
using pipeline::KeyExtractor;
using pipeline::Metrics;
using pipeline::Reconciler;
using pipeline::Route;

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
                                 dlq::Outbox::schema()};
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
    auto report = claim::apply_schema(c, std::chrono::system_clock::now(), {cfg.claim.retention_days, 3});
    c.execute(dlq::Outbox::schema());
    dlq::Outbox::migrate(c);
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

int run_host(const config::Config& cfg) {
  auto libs = load_route_plugins(cfg);
  if (cfg.claim.apply_schema) apply_schema(cfg, libs);

  // Claims are owned per run; a later run of the same host id takes over its
  // predecessor's claims at once (the predecessor is dead: ids are unique).
  const std::string owner = cfg.host.id + "#" + random_uuid().substr(0, 8);
  spdlog::info("idemsink host {} starting: {} route(s), group {}, owner {}", cfg.host.id, cfg.routes.size(),
               cfg.kafka.group_id, owner);
  spdlog::info("{}", kafka::library_workarounds(cfg.kafka));

  Metrics metrics;
  std::vector<std::unique_ptr<Route>> routes;
  std::vector<std::string> topics;
  for (size_t i = 0; i < cfg.routes.size(); ++i) {
    const auto& rc = cfg.routes[i];
    auto route = std::make_unique<Route>(
        Route{rc, std::make_unique<plugin::Instance>(libs[i], rc), KeyExtractor(rc), &metrics.route(rc.name)});
    spdlog::info("route {}: topic {} -> plugin {} {} ({}), DLQ {}", rc.name, rc.topic, libs[i]->name(),
                 libs[i]->descriptor().version, plugin::kind_name(libs[i]->kind()),
                 rc.dlq.enabled ? rc.dlq.topic : "disabled");
    topics.push_back(rc.topic);
    for (size_t tier = 1; tier <= rc.retry.topics.size(); ++tier) topics.push_back(rc.retry.topic_name(rc.topic, tier));
    routes.push_back(std::move(route));
  }

  asio::io_context io;
  auto work = asio::make_work_guard(io);
  db::Pool pool(cfg.database, cfg.database.pool_size);
  Engine engine(io, pool, cfg, std::move(routes), metrics, owner);
  engine.relay().set_producer_factory([&cfg, &engine] {
    return std::make_unique<kafka::Producer>(
        cfg.kafka, [&engine](uint64_t id, rd_kafka_resp_err_t err) { engine.relay().on_delivery(id, err); });
  });
  kafka::Consumer consumer(cfg.kafka, topics, engine);

  Reconciler reconciler(io, pool, cfg, engine.handlers(), &metrics, owner);
  std::unique_ptr<admin::AdminServer> admin;
  if (!cfg.host.admin_listen.empty())
    admin =
        std::make_unique<admin::AdminServer>(cfg.host.admin_listen, cfg.host.admin_token, metrics, engine, cfg.host.id);

  engine.start(&consumer);
  consumer.start();
  reconciler.start(cfg.claim.reconcile_interval);

  std::thread shutdown;
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](boost::system::error_code ec, int sig) {
    if (ec) return;
    spdlog::info("signal {}: draining (grace {}ms)", sig, cfg.host.shutdown_grace.count());
    // Draining blocks on the engine thread's progress, so it runs elsewhere.
    shutdown = std::thread([&] {
      const auto deadline = std::chrono::steady_clock::now() + cfg.host.shutdown_grace + std::chrono::seconds(5);
      asio::post(io, [&] { reconciler.stop(); });
      consumer.close(deadline);  // revokes and drains every partition, commits
      engine.quiesce(deadline);
      if (admin) admin->stop();
      work.reset();
      io.stop();
    });
  });
  io.run();
  if (shutdown.joinable()) shutdown.join();
  pool.stop(std::chrono::steady_clock::now() + std::chrono::seconds(5));
  spdlog::info("idemsink host {} stopped", cfg.host.id);
  if (consumer.abandoned()) {
    // librdkafka's threads still run (docs/librdkafka.md): no destructor may
    // race them. Everything durable is written; the logs are flushed.
    spdlog::default_logger()->flush();
    std::_Exit(0);
  }
  return 0;
}

}  // namespace idemsink::app
