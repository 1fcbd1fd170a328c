#include "core/pipeline/route_control.h"

#include <fmt/chrono.h>

#include "core/common/log.h"

namespace idemsink::pipeline {

namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {
constexpr unsigned kNoSuchTable = 1146;
constexpr auto kRefreshEvery = 2s;

std::string utc_now_text() {
  const auto now = std::chrono::system_clock::now();
  return fmt::format("{:%Y-%m-%d %H:%M:%S}", fmt::gmtime(std::chrono::system_clock::to_time_t(now)));
}
}  // namespace

void RouteControl::check_table(db::Connection& c) { c.query("SELECT 1 FROM idemsink_route_control LIMIT 0"); }

const char* RouteControl::schema() {
  return R"(CREATE TABLE IF NOT EXISTS idemsink_route_control (
  route       VARBINARY(64) NOT NULL,
  paused      TINYINT       NOT NULL,
  changed_by  VARCHAR(255)  NOT NULL,
  changed_at  DATETIME(3)   NOT NULL,
  PRIMARY KEY (route)
) ENGINE=InnoDB COMMENT='operator pauses per route: every host of the group obeys them')";
}

std::map<std::string, RouteControl::State> RouteControl::read(db::Connection& c) {
  std::map<std::string, State> out;
  try {
    for (const auto& row : c.query("SELECT route, paused, changed_by, changed_at FROM idemsink_route_control"))
      out[row[0].value_or("")] = State{row[1].value_or("0") != "0", row[2].value_or(""), row[3].value_or("")};
  } catch (const db::DbError& e) {
    if (e.code() != kNoSuchTable) throw;
  }
  return out;
}

void RouteControl::write(db::Connection& c, const std::string& route, bool paused, const std::string& by) {
  c.execute("INSERT INTO idemsink_route_control (route, paused, changed_by, changed_at) VALUES (" + c.quote(route) +
            ", " + (paused ? "1" : "0") + ", " + c.quote(by.substr(0, 255)) +
            ", NOW(3)) ON DUPLICATE KEY UPDATE paused = VALUES(paused), changed_by = VALUES(changed_by), "
            "changed_at = VALUES(changed_at)");
}

RouteControl::RouteControl(asio::io_context& io, db::Pool& pool, const config::DatabaseConfig& database,
                           std::vector<Route*> routes)
    : io_(io), pool_(pool), database_(database), timer_(io), routes_(std::move(routes)) {}

void RouteControl::load_at_start() {
  try {
    std::map<std::string, State> states;
    db::Pool::run_once(database_, [&](db::Connection& c) { states = read(c); });
    apply(states, true);
  } catch (const std::exception& e) {
    spdlog::warn("route pauses could not be read from {} ({}); routes stay paused until they can be", database_.label(),
                 e.what());
    apply({}, false);
  }
}

void RouteControl::start() {
  timer_.start(kRefreshEvery, [this] { refresh(); });
}

void RouteControl::stop() { timer_.stop(); }

void RouteControl::refresh() {
  if (refreshing_) return;  // the last read still waits for the database
  refreshing_ = true;
  uint64_t generation;
  {
    std::lock_guard lk(mu_);
    generation = sets_;
  }
  pool_.submit(
      "read route pauses",
      [this, generation](db::Connection& c) {
        auto states = read(c);
        asio::post(io_, [this, generation, states = std::move(states)] {
          refreshing_ = false;
          // A read that began before an operator's set here may predate it.
          std::lock_guard lk(mu_);
          if (generation == sets_) apply_locked(states, true);
        });
      },
      [this](const db::DbError&) { asio::post(io_, [this] { refreshing_ = false; }); });
}

void RouteControl::add(Route* route) {
  std::lock_guard lk(mu_);
  routes_.push_back(route);
  apply_locked(states_, known_);
}

void RouteControl::remove(const std::string& route) {
  std::lock_guard lk(mu_);
  std::erase_if(routes_, [&](const Route* r) { return r->cfg.name == route; });
  applied_.erase(route);
}

bool RouteControl::has(const std::string& route) const {
  std::lock_guard lk(mu_);
  for (const Route* r : routes_)
    if (r->cfg.name == route) return true;
  return false;
}

void RouteControl::set(const std::string& route, bool paused, const std::string& by) {
  db::Pool::run_once(database_, [&](db::Connection& c) { write(c, route, paused, by); });
  stored(route, paused, by);
}

void RouteControl::stored(const std::string& route, bool paused, const std::string& by) {
  // Applied here at once; the next refresh brings the database's own time.
  std::lock_guard lk(mu_);
  ++sets_;
  std::map<std::string, State> states = states_;
  states[route] = State{paused, by, utc_now_text()};
  apply_locked(states, true);
}

void RouteControl::apply(const std::map<std::string, State>& states, bool known) {
  std::lock_guard lk(mu_);
  apply_locked(states, known);
}

void RouteControl::apply_locked(const std::map<std::string, State>& states, bool known) {
  if (known) {
    states_ = states;
    known_ = true;
  }
  for (Route* r : routes_) {
    const auto it = states.find(r->cfg.name);
    const bool paused = !known || (it != states.end() && it->second.paused);
    auto [was, fresh] = applied_.try_emplace(r->cfg.name, false);
    if (!fresh && was->second == paused) continue;
    if (fresh && !paused) continue;  // fetching is the gate's default
    was->second = paused;
    r->gate->set_topics_paused(r->topics(), FetchGate::TopicPause::Operator, paused);
    r->metrics->paused.store(paused ? 1 : 0);
    if (!known) continue;  // logged once by load_at_start
    if (paused) {
      spdlog::info("route {}: paused by {} at {}: its topics stop fetching; records already consumed finish",
                   r->cfg.name, it->second.changed_by, it->second.changed_at);
    } else {
      spdlog::info("route {}: resumed{}", r->cfg.name,
                   it == states.end() ? "" : " by " + it->second.changed_by + " at " + it->second.changed_at);
    }
  }
}

std::vector<RoutePause> RouteControl::view() const {
  std::lock_guard lk(mu_);
  std::vector<RoutePause> out;
  for (const Route* r : routes_) {
    RoutePause v{.route = r->cfg.name, .topic = r->cfg.topic, .circuit_open = r->metrics->circuit_open.load() != 0};
    if (auto it = states_.find(r->cfg.name); it != states_.end()) {
      v.paused = it->second.paused;
      v.changed_by = it->second.changed_by;
      v.changed_at = it->second.changed_at;
    }
    if (auto it = applied_.find(r->cfg.name); it != applied_.end()) v.paused = it->second;
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace idemsink::pipeline
