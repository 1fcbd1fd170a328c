// The engine changed from outside while it runs: routes a reload adds,
// changes or removes, an operator's pause, operators' offset moves.
#include "core/pipeline/engine.h"

#include <algorithm>

#include "core/common/log.h"

namespace idemsink::pipeline {

namespace asio = boost::asio;

Engine::FeedPlan Engine::add_routes(std::vector<std::unique_ptr<Route>> routes) {
  const std::string group = routes.at(0)->cfg.group_id;
  for (const auto& f : feeds_)
    if (f->group == group) throw std::logic_error("add_routes: group " + group + " has a feed already");
  std::vector<Route*> added;
  for (auto& r : routes) {
    // Added back while a call of its removed self is still out: that call's
    // deadline stands, so the reconciler never takes it for one never sent.
    for (const auto& old : removed_routes_)
      if (old->cfg.name == r->cfg.name && old->live > 0 && old->cfg.call_timeout > r->cfg.call_timeout) {
        spdlog::warn("route {}: call_timeout stays {}ms while a call of the route as it was removed is out",
                     r->cfg.name, old->cfg.call_timeout.count());
        r->cfg.call_timeout = old->cfg.call_timeout;
      }
    added.push_back(r.get());
    routes_.push_back(std::move(r));
  }
  auto made = std::make_unique<Feed>(*this, group, added);
  Feed& feed = *made;
  {
    // The host's pause reaches the new feed too, however the two cross.
    std::lock_guard lk(feeds_mu_);
    feed.gate.set_operator_pause(operator_paused_);
    feeds_.push_back(std::move(made));
  }
  for (Route* r : added) {
    route_control_.add(r);
    housekeeping_.add_route(r->cfg, *r->metrics);
  }
  std::vector<std::string> topics;
  for (const auto& [topic, tr] : feed.route_by_topic) topics.push_back(topic);
  return {group, std::move(topics), &feed};
}

void Engine::attach_feed(const std::string& group, kafka::Consumer* consumer) {
  for (auto& f : feeds_)
    if (f->group == group) {
      f->consumer = consumer;
      f->gate.attach(consumer);
      f->partitions.attach(consumer);
      return;
    }
  throw std::logic_error("attach_feed: no feed of group " + group);
}

void Engine::remove_feed(const std::string& group) {
  auto feed = std::find_if(feeds_.begin(), feeds_.end(), [&](const auto& f) { return f->group == group; });
  if (feed == feeds_.end()) throw std::logic_error("remove_feed: no feed of group " + group);
  for (Route* r : (*feed)->routes) {
    route_control_.remove(r->cfg.name);
    health_.stop(*r);
    ++r->reloads;  // a change still waiting for its jobs is dropped
    r->held_for_reload = false;
    // Its instance goes with its last call (a record holds the one it called).
    if (r->live == 0) r->handler.reset();
    auto it = std::find_if(routes_.begin(), routes_.end(), [&](const auto& own) { return own.get() == r; });
    removed_routes_.push_back(std::move(*it));
    routes_.erase(it);
  }
  // Its consumer is closed and may be destroyed: nothing of the feed may
  // reach it any more (a store in flight commits nowhere).
  (*feed)->gate.attach(nullptr);
  (*feed)->partitions.attach(nullptr);
  {
    std::lock_guard lk(feeds_mu_);
    removed_feeds_.push_back(std::move(*feed));
    feeds_.erase(feed);
  }
  update_rate_shares();
}

bool Engine::holds_records_of(const std::string& group) const {
  for (const auto& f : removed_feeds_)
    if (f->group == group)
      for (const auto& [id, rec] : records_)
        if (rec->part->owner == &f->partitions) return true;
  return false;
}

void Engine::set_operator_pause(bool paused) {
  std::lock_guard lk(feeds_mu_);
  operator_paused_ = paused;
  for (auto& f : feeds_) f->gate.set_operator_pause(paused);
}

bool Engine::operator_paused() const {
  std::lock_guard lk(feeds_mu_);
  return operator_paused_;
}

Engine::~Engine() = default;

std::shared_ptr<const config::Config> Engine::routes_config() const {
  auto out = std::make_shared<config::Config>(cfg_);
  out->routes.clear();
  for (const auto& r : routes_) out->routes.push_back(r->cfg);
  return out;
}

void Engine::apply_offset_moves() {
  if (moves_reading_) return;
  moves_reading_ = true;
  std::vector<std::string> groups;
  for (const auto& f : feeds_) groups.push_back(f->group);
  pool_.submit(
      "read operators' offset moves",
      [this, groups](db::Connection& c) {
        std::vector<claim::OffsetMove> moves;
        for (const auto& g : groups)
          for (auto& m : claim::OffsetMoves::pending(c, g)) moves.push_back(std::move(m));
        asio::post(io_, [this, moves = std::move(moves)] {
          moves_reading_ = false;
          for (const auto& m : moves)
            for (auto& f : feeds_)
              if (f->group == m.group) f->partitions.move(m, owner_);
        });
      },
      [this](const db::DbError&) { asio::post(io_, [this] { moves_reading_ = false; }); });
}

void Engine::reconfigure(config::RouteConfig next, std::shared_ptr<plugin::Instance> handler,
                         std::function<void()> applied) {
  Route* route = route_named(next.name);
  if (route == nullptr) {  // gone meanwhile (a reload that failed part way): nothing to change
    spdlog::error("reload: route {} does not run here; its change is not applied", next.name);
    return applied();
  }
  // A local_tx route's settings are read by its apply jobs on database
  // workers: its calls stop starting, its jobs end, then they change.
  route->held_for_reload = true;
  const uint64_t number = ++route->reloads;
  auto change = [this, route, number, next = std::move(next), handler = std::move(handler),
                 applied = std::move(applied)]() mutable {
    // A later reload's change, waiting too, carries the whole route as its
    // file has it: this older one gives way (or the route was removed).
    if (route->reloads != number) return applied();
    const auto now = std::chrono::steady_clock::now();
    // Only the fields a reload may change (config/reload.h): the route's
    // name and topics are read by the admin port's threads meanwhile.
    config::RouteConfig& cfg = route->cfg;
    cfg.options = std::move(next.options);
    cfg.concurrency = next.concurrency;
    cfg.payload_check = next.payload_check;
    cfg.max_record_bytes = next.max_record_bytes;
    cfg.circuit = next.circuit;
    cfg.rate_limit = next.rate_limit;
    cfg.when = std::move(next.when);
    // Never lower (config/reload.cc): a call out under the longer deadline
    // must keep it, and the dispatcher's deadlines their call order.
    cfg.call_timeout = std::max(cfg.call_timeout, next.call_timeout);
    cfg.retry.max_attempts = next.retry.max_attempts;
    cfg.retry.backoff_initial = next.retry.backoff_initial;
    cfg.retry.backoff_max = next.retry.backoff_max;
    cfg.output = std::move(next.output);
    cfg.key_source = next.key_source;  // forced only
    cfg.key_header = std::move(next.key_header);
    cfg.key_json_path = std::move(next.key_json_path);
    route->filter.reset();
    if (cfg.when) route->filter.emplace(*cfg.when);
    route->extractor = KeyExtractor(cfg);
    route->circuit.set_config(cfg.circuit);
    route->limiter.set_config(cfg.rate_limit, now);
    if (handler) route->handler = std::move(handler);
    route->held_for_reload = false;
    update_rate_shares();
    dispatcher_.pump();
    applied();
  };
  when_idle(*route, std::move(change));
}

void Engine::when_idle(Route& route, std::function<void()> then) {
  if (!local_tx_.busy(route)) return then();
  // Its jobs end within a transaction's time: a short poll, never for long.
  auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(5));
  timer->async_wait([this, &route, timer, then = std::move(then)](boost::system::error_code ec) mutable {
    if (!ec) when_idle(route, std::move(then));
  });
}

}  // namespace idemsink::pipeline
