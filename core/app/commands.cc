#include "core/app/commands.h"

#include "core/common/asio.h"
#include <algorithm>
#include <iostream>
#include <thread>
#include <map>

#include "core/claim/claim_store.h"
#include "core/claim/offset_moves.h"
#include "core/claim/order_hold.h"
#include "core/claim/schema.h"
#include "core/common/http_fetch.h"
#include "core/common/log.h"
#include "core/dlq/outbox.h"
#include "core/dlq/outcome_event.h"
#include "core/operate/actions.h"
#include "core/operate/operator_log.h"
#include "core/common/util.h"
#include "core/db/pool.h"
#include "core/devkafka/dev_cluster.h"
#include "core/kafka/login.h"
#include "core/offline/audit.h"
#include "core/app/host.h"
#include "core/reconcile/reconciler.h"
#include "core/offline/replay.h"
#include "core/pipeline/route_control.h"

namespace idemsink::app {
namespace {

// An operator action's outcome on the terminal: its line, and exit 0 or 1.
int report(const operate::Done& done) {
  (done.ok ? std::cout : std::cerr) << done.message << "\n";
  return done.ok ? 0 : 1;
}

}  // namespace

int run(const config::Config& cfg) { return run_host(cfg); }

int check_config(const config::Config& cfg, bool connect) {
  auto libs = load_route_plugins(cfg);
  // Each plugin checks its own options when an instance is made (templates,
  // pointers, status tables): make one per route and let it go. An option it
  // refuses is a config error (with its line); anything else that stops it
  // here (a service's name that does not resolve on this machine) is this
  // machine's, and only a warning: `run` will say it again where it runs.
  for (size_t i = 0; i < cfg.routes.size(); ++i) {
    try {
      plugin::Instance checked(libs[i], cfg.routes[i]);
    } catch (const plugin::LoadError& e) {
      std::cerr << "warning: " << e.what() << "\n";
    }
  }
  std::cout << cfg.file.string() << ": ok\n";
  for (size_t i = 0; i < cfg.routes.size(); ++i) {
    const auto& r = cfg.routes[i];
    std::cout << "  route " << r.name << ": " << r.topic << " -> " << libs[i]->name() << " "
              << libs[i]->descriptor().version << " (" << plugin::kind_name(libs[i]->kind()) << "), DLQ "
              << (r.dlq.enabled ? r.dlq.topic : "disabled") << "\n";
  }
  if (const auto caveat = kafka::login_caveat(kafka::LoginSettings::of(cfg.kafka.properties)))
    std::cerr << "warning: kafka: " << *caveat << "\n";
  if (!connect) return 0;
  const auto checked = kafka::check_connection(cfg.kafka, std::chrono::seconds(15));
  std::cout << "kafka: " << checked.message << "\n";
  return checked.ok ? 0 : 1;
}

int schema(const config::Config& cfg, const std::string& action) {
  auto libs = load_route_plugins(cfg);
  if (action == "apply") {
    apply_schema(cfg, libs);
    std::cout << "schema applied to " << cfg.database.database << "\n";
    return 0;
  }
  if (action == "migrate") {
    // Tables made by an earlier version brought up to date first (columns,
    // partitions), then the claim table's layout, online.
    if (cfg.claim.apply_schema) apply_schema(cfg, libs);
    claim::MigrationReport report;
    db::Pool::run_once(cfg.database, [&](db::Connection& c) {
      report = claim::migrate_claim_schema(
          c, [&](const std::string& step) { std::cout << cfg.database.database << ": " << step << std::endl; });
    });
    if (!report.index_added && !report.indexes_dropped && !report.directory_completed)
      std::cout << cfg.database.database << ": the claim table is up to date\n";
    return 0;
  }
  for (const auto& stmt : schema_statements(cfg, libs)) std::cout << stmt << ";\n\n";
  return 0;
}

int dev_kafka(int brokers, const std::vector<std::string>& topics, int control_port) {
  devkafka::DevClusterOptions opt;
  opt.brokers = brokers;
  opt.control_port = control_port;
  for (const auto& t : topics) {
    const auto colon = t.rfind(':');
    if (colon == std::string::npos || colon == 0)
      throw std::invalid_argument("--topic wants NAME:PARTITIONS, got " + t);
    opt.topics.emplace_back(t.substr(0, colon), std::stoi(t.substr(colon + 1)));
  }
  return devkafka::run_dev_cluster(opt);
}

}  // namespace idemsink::app

namespace idemsink::app {

int reconcile_list(const config::Config& cfg) {
  db::Connection c(cfg.database);
  const claim::ClaimStore store(cfg.host.id, cfg.host.id + "#cli", cfg.claim.lease);
  const auto rows = store.unsettled(c, {}, cfg.claim.stuck_after, 100000, true);
  std::cout << rows.size() << " claim(s) need reconciliation\n";
  for (const auto& u : rows)
    std::cout << "  " << u.row.ns << " key=" << printable(u.row.biz_key) << " "
              << (u.status == claim::Status::Unknown ? "unknown" : "stuck-pending") << " token=" << u.idem_token
              << " attempt=" << u.attempt << " calls=" << u.calls << " updated=" << u.updated_at
              << " source=" << u.src_topic << "[" << u.src_partition << "]@" << u.src_offset
              << (u.last_error.empty() ? "" : " error=\"" + u.last_error + "\"") << "\n";
  return 0;
}

int reconcile_check(const config::Config& cfg) {
  auto libs = load_route_plugins(cfg);
  db::Connection c(cfg.database);
  size_t problems = 0, checks = 0;
  std::map<std::string, bool> seen;
  for (const auto& lib : libs) {
    if (seen[lib->path().string()]) continue;
    seen[lib->path().string()] = true;
    for (const auto& check : lib->checks()) {
      ++checks;
      auto rows = c.query(check.sql);
      std::cout << lib->name() << "/" << check.name << ": " << rows.size() << " problem(s)"
                << (rows.empty() ? "" : std::string(" - ") + (check.doc ? check.doc : "")) << "\n";
      for (const auto& r : rows) {
        std::cout << "   ";
        for (const auto& col : r) std::cout << " " << (col ? printable(*col) : "NULL");
        std::cout << "\n";
      }
      problems += rows.size();
    }
  }
  std::cout << checks << " check(s), " << problems << " problem(s)\n";
  return problems == 0 ? 0 : 1;
}

int reconcile_ask(const config::Config& cfg) {
  auto libs = load_route_plugins(cfg);
  std::map<std::string, std::shared_ptr<plugin::Instance>> handlers;
  for (size_t i = 0; i < cfg.routes.size(); ++i)
    handlers[cfg.routes[i].name] = std::make_shared<plugin::Instance>(libs[i], cfg.routes[i]);
  boost::asio::io_context io;
  auto work = boost::asio::make_work_guard(io);
  db::Pool pool(cfg.database, 2);
  pipeline::LimitsGate gate(cfg);
  reconcile::Reconciler reconciler(io, pool, cfg, handlers, gate, nullptr,
                                   cfg.host.id + "#reconcile-" + random_uuid().substr(0, 8));
  reconcile::ReconcileSummary summary;
  reconciler.run_once([&](reconcile::ReconcileSummary s) {
    summary = s;
    io.stop();
  });
  io.run();
  pool.stop(std::chrono::steady_clock::now() + std::chrono::seconds(10));
  std::cout << "reconcile: " << summary.examined << " examined, " << summary.applied << " applied -> done, "
            << summary.redriven_done << " re-driven -> done, " << summary.failed << " failed, " << summary.undecided
            << " undecided, " << summary.left_stuck << " stuck left for an operator, " << summary.deferred
            << " deferred (no budget)\n";
  db::Connection c(cfg.database);
  operate::record_round(c, operate::cli_actor(), "", reconcile::describe(summary), "");
  return summary.undecided + summary.left_stuck + summary.deferred == 0 ? 0 : 1;
}

int reconcile_resolve(const config::Config& cfg, const std::string& token, const std::string& as,
                      const std::string& note) {
  if (as != "done" && as != "failed") throw std::invalid_argument("--as must be done or failed");
  db::Connection c(cfg.database);
  return report(operate::resolve(c, cfg, operate::cli_actor(), token, as, note));
}

int dlq_list(const config::Config& cfg) {
  db::Connection c(cfg.database);
  const dlq::Outbox outbox(cfg.host.id + "#cli", cfg.claim.lease);
  const auto rows = outbox.list_unpublishable(c, 100000);
  std::cout << rows.size() << " outbox row(s) Kafka refused for good\n";
  for (const auto& u : rows)
    std::cout << "  id=" << u.id << " route=" << u.route << " topic=" << u.topic << " reason=" << u.reason
              << " source=" << u.src_topic << "[" << u.src_partition << "]@" << u.src_offset << " bytes=" << u.bytes
              << " since=" << u.since << " error=\"" << u.publish_error << "\"\n";
  return rows.empty() ? 0 : 1;
}

int dlq_retry(const config::Config& cfg, uint64_t id, const std::string& note) {
  db::Connection c(cfg.database);
  return report(operate::retry_unpublishable(c, cfg, operate::cli_actor(), id, note));
}

int dlq_discard(const config::Config& cfg, uint64_t id, const std::string& note) {
  db::Connection c(cfg.database);
  return report(operate::discard_unpublishable(c, cfg, operate::cli_actor(), id, note));
}

int order_holds_list(const config::Config& cfg, const std::string& route) {
  if (!route.empty() && cfg.route_by_name(route) == nullptr) throw std::invalid_argument("no route named " + route);
  for (const auto& slice : config::split_by_database(cfg)) {
    std::vector<std::string> hold_on_dead;
    bool ordered = false;
    for (const auto& rc : slice.routes) {
      ordered = ordered || ((route.empty() || rc.name == route) && rc.order_by.enabled());
      if (rc.order_by.hold_on_dead()) hold_on_dead.push_back(rc.name);
    }
    if (!ordered) continue;
    db::Connection c(slice.database);
    const auto holds = claim::OrderHolds::list(c, route, hold_on_dead, 100000);
    std::cout << holds.size() << " live order hold(s)" << (route.empty() ? "" : " of route " + route) << "\n";
    for (const auto& h : holds)
      std::cout << "  route=" << h.ns << " order_key=" << printable(h.order_key) << " held_by=" << printable(h.biz_key)
                << " (" << claim::to_string(h.status) << ") origin=" << h.origin << " since=" << h.since << "\n";
  }
  return 0;
}

int order_holds_release(const config::Config& cfg, const std::string& route, const std::string& order_key,
                        const std::string& note) {
  const config::RouteConfig* rc = cfg.route_by_name(route);
  if (rc == nullptr) throw std::invalid_argument("no route named " + route);
  db::Connection c(cfg.database_of(*rc));
  return report(operate::release_hold(c, operate::cli_actor(), route, order_key, note));
}

int route_list(const config::Config& cfg) {
  for (const auto& slice : config::split_by_database(cfg)) {
    db::Connection c(slice.database);
    const auto states = pipeline::RouteControl::read(c);
    for (const auto& rc : slice.routes) {
      const auto it = states.find(rc.name);
      std::cout << rc.name << " (" << rc.topic << "): ";
      if (it == states.end()) {
        std::cout << "running\n";
      } else {
        std::cout << (it->second.paused ? "paused" : "running") << " since " << it->second.changed_at << " by "
                  << it->second.changed_by << "\n";
      }
    }
  }
  return 0;
}

int route_pause(const config::Config& cfg, const std::string& route, bool paused, const std::string& by,
                const std::string& note) {
  const config::RouteConfig* rc = cfg.route_by_name(route);
  if (rc == nullptr) {
    std::string names;
    for (const auto& r : cfg.routes) names += " " + r.name;
    std::cerr << "no route named " << route << " in " << cfg.file.string() << "; routes:" << names << "\n";
    return 2;
  }
  db::Connection c(cfg.database_of(*rc));
  operate::Actor who = operate::cli_actor();
  if (!by.empty()) who.name = by;
  return report(operate::pause_route(c, cfg, who, route, paused, note));
}

int route_move(const config::Config& cfg, const offline::MoveAsk& ask, const std::string& by, const std::string& note,
               std::chrono::seconds wait) {
  db::Connection c(cfg.database_of(*cfg.route_by_name(ask.route)));
  operate::Actor who = operate::cli_actor();
  if (!by.empty()) who.name = by;
  const operate::Done done = operate::move_offsets(c, cfg, who, ask, note);
  if (!done.ok) return report(done);
  std::cout << done.message << "\n";
  std::vector<uint64_t> ids;
  for (const auto& m : done.detail["moves"]) ids.push_back(m["id"].get<uint64_t>());
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::vector<claim::OffsetMove> moves;
  for (;;) {
    moves = claim::OffsetMoves::read(c, ids);
    const bool all = std::all_of(moves.begin(), moves.end(), [](const auto& m) { return !m.applied_at.empty(); });
    if (all || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  for (const auto& m : moves) {
    std::cout << "  " << m.topic << "[" << m.partition << "] #" << m.id << " to " << m.to << ": ";
    if (m.applied_at.empty())
      std::cout << "pending: applied by the host that owns the partition once it has read from it (none yet)\n";
    else if (!m.from)
      std::cout << m.applied_by << "\n";
    else
      std::cout << "applied by " << m.applied_by << " at " << m.applied_at << ", from " << *m.from << "\n";
  }
  return 0;
}

int replay(const config::Config& cfg, const operate::ReplayRequest& req, const std::string& note) {
  db::Connection c(cfg.database_of(*cfg.route_by_name(req.route)));
  const operate::Done r = operate::replay(c, cfg, operate::cli_actor(), req, note);
  std::cout << r.detail.value("lines", std::string());
  std::cout << "replay of route " << req.route << (req.dry_run ? " (dry run)" : "") << ": " << r.message << "\n";
  if (r.detail.value("replayed", 0) > 0 && !req.dry_run)
    std::cout << "a running host publishes them and applies each once, with its first idem_token; one that fails "
                 "again is dead-lettered with idemsink.replayed\n";
  return r.detail.value("not_replayable", 0) == 0 ? 0 : 1;
}

int reload_host(const config::Config& cfg, const std::string& url, bool force, const std::string& note) {
  std::string base = url;
  if (base.empty()) {
    const std::string& listen = cfg.host.admin_listen;
    if (listen.empty())
      throw config::ConfigError(cfg.file.string() +
                                ": host.admin_listen is not set, so the host has no admin port to ask; send it SIGHUP");
    const size_t colon = listen.rfind(':');
    std::string address = listen.substr(0, colon);
    if (address.empty() || address == "0.0.0.0") address = "127.0.0.1";  // listening everywhere: ask it here
    if (address == "::" || address == "[::]") address = "[::1]";
    base = (cfg.host.admin_tls_cert.empty() ? "http://" : "https://") + address + listen.substr(colon);
  }
  HttpFetch request;
  request.method = "POST";
  request.url = parse_http_url(base + "/api/v1/host/reload");
  request.headers.push_back({"Content-Type", "application/json"});
  if (!cfg.host.admin_token.empty()) request.headers.push_back({"Authorization", "Bearer " + cfg.host.admin_token});
  request.tls_ca = cfg.host.admin_tls_cert;  // the host's own certificate, or the CA that signed it
  request.body = nlohmann::json{{"note", note}, {"force", force}}.dump();
  request.timeout = std::chrono::seconds(90);  // the host loads plugins and waits for its routes
  const HttpAnswer answer = http_fetch(request);
  const auto j = nlohmann::json::parse(answer.body, nullptr, false);
  const std::string text = !j.is_object()          ? answer.body
                           : j.contains("message") ? j["message"].get<std::string>()
                           : j.contains("error")   ? j["error"].get<std::string>()
                                                   : answer.body;
  std::cout << "reload of " << base << ": "
            << (answer.status == 200 ? "" : "HTTP " + std::to_string(answer.status) + ": ") << text << "\n";
  return answer.status == 200 ? 0 : 1;
}

int operator_log(const config::Config& cfg, const std::string& route, size_t limit) {
  for (const auto& slice : config::split_by_database(cfg)) {
    db::Connection c(slice.database);
    for (const auto& a : operate::OperatorLog::list(c, route, limit))
      std::cout << operate::to_json(a).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}

int audit(const config::Config& cfg) {
  auto report = offline::audit(cfg);
  report.print(std::cout);
  return report.ok() ? 0 : 1;
}

}  // namespace idemsink::app
