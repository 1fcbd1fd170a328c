// A reload while the host runs: the file read and checked, new handler
// instances and added routes made before anything changes, then the changed
// routes reconfigured on the engine thread, groups added and removed, and
// the admin port's view renewed.
#include <algorithm>
#include <condition_variable>
#include <future>
#include <stdexcept>

#include "core/app/host.h"
#include "core/app/host_run.h"
#include "core/common/log.h"
#include "core/db/pool.h"

namespace idemsink::app::detail {

namespace asio = boost::asio;
using json = nlohmann::json;
using pipeline::Engine;
using pipeline::Route;

namespace {

// A route whose new handler instance refused its options: the reload is
// refused with nothing changed.
struct ReloadRefused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

operate::Done refused(const std::string& why) {
  return operate::Done{false, "refused, nothing changed: " + why, {{"result", "refused"}}};
}

}  // namespace

// The file as read and checked, and what it changes against what runs.
struct HostRun::Draft {
  std::string text;
  std::optional<config::Config> next;
  std::vector<std::shared_ptr<plugin::Library>> libs;
  config::ReloadPlan plan;
};

// The routes of one slice and group a reload adds.
struct HostRun::Addition {
  Slice* slice;
  std::string group;
  std::vector<std::unique_ptr<Route>> routes;
};

// A route changed in place (on the engine thread).
struct HostRun::Change {
  Slice* slice;
  config::RouteConfig route;
  std::shared_ptr<plugin::Instance> handler;  // null: its options are the same
};

// Runs `fn` on the engine thread and waits for its result (the reloader's
// thread; the engine thread runs until the shutdown, which waits for a
// reload under way).
template <class Fn>
std::invoke_result_t<Fn> HostRun::on_engine(Fn fn) {
  std::packaged_task<std::invoke_result_t<Fn>()> task(std::move(fn));
  auto result = task.get_future();
  asio::post(io_, [&task] { task(); });
  return result.get();
}

// A reload (config/reload.h), from SIGHUP, the admin API or `idemsink
// reload`: the file read and checked as at start-up (plugins loaded,
// options checked, new handler instances created) before anything
// changes, then each changed route reconfigured on the engine thread.
// One at a time; logged, counted and in the operator log whatever came of it.
operate::Done HostRun::reload(const operate::Actor& who, bool force, const std::string& note) {
  if (draining_) return refused("the host is stopping");
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

operate::Done HostRun::try_reload(bool force) {
  if (draining_) return refused("the host is stopping");
  Draft draft;
  try {
    draft = read_draft();
  } catch (const std::exception& e) {  // ConfigError, LoadError: the file does not pass
    return refused(e.what());
  }
  config::Config& next = *draft.next;
  const config::ReloadPlan& plan = draft.plan;
  const std::string hash = config_hash(draft.text);
  if (!plan.changes_anything()) {
    running_text_ = draft.text;  // comments or layout only
    metrics_.set_config(cfg_.file.string(), hash);
    return {true, "no setting changed (config " + hash + ")", {{"result", "unchanged"}, {"hash", hash}}};
  }
  if (const std::string why = plan.refusal(force); !why.empty()) return refused(why);
  // Every new instance is created before anything changes: a plugin that
  // refuses its options leaves the running config as it is.
  json routes = json::array();
  std::vector<Change> changes;
  try {
    changes = prepare_changes(draft, force, routes);
  } catch (const ReloadRefused& e) {
    return refused(e.what());
  }
  std::vector<Addition> additions;
  try {
    additions = prepare_additions(next, draft.libs, plan.routes_of(config::RouteChange::Kind::Added));
  } catch (const std::exception& e) {
    return refused(e.what());
  }
  for (const auto& name : plan.routes_of(config::RouteChange::Kind::Added))
    routes.push_back({{"route", name}, {"added", true}});
  for (const auto& name : plan.routes_of(config::RouteChange::Kind::Removed))
    routes.push_back({{"route", name}, {"removed", true}});
  const auto level = plan.log_level_changed ? std::optional(next.host.log_level) : std::nullopt;
  if (const std::string late = apply_changes(std::move(changes), level, routes.size()); !late.empty())
    return {false, late, {{"result", "refused"}, {"routes", routes}}};
  // Routes added, then removed: a consumer of their own starts or closes;
  // no other group rebalances.
  std::string failures;
  const std::set<std::string> not_added = add_groups(additions, failures);
  std::set<std::pair<Slice*, std::string>> removals;
  for (const auto& name : plan.routes_of(config::RouteChange::Kind::Removed))
    removals.insert({slice_of(name), running_.route_by_name(name)->group_id});
  for (const auto& [slice, group] : removals) remove_group(*slice, group);
  if (!not_added.empty()) {
    // What runs is the file but for those routes: the next reload compares with that.
    std::erase_if(next.routes, [&](const config::RouteConfig& r) { return not_added.contains(r.name); });
    draft.text = config::without_routes(draft.text, not_added);
  }
  const std::string description = plan.describe();
  run_from_now(std::move(next), std::move(draft.text));
  if (!not_added.empty())
    return {false,
            description + ", but" + failures.substr(1) + " (restart, or reload to try again)",
            {{"result", "refused"}, {"routes", routes}}};
  return {true, description + " (config " + hash + ")", {{"result", "applied"}, {"hash", hash}, {"routes", routes}}};
}

HostRun::Draft HostRun::read_draft() const {
  Draft d;
  d.text = read_config_text();
  d.next = config::load_text(d.text, cfg_.file);
  d.libs = load_route_plugins(*d.next);
  d.plan = config::plan_reload(running_, running_text_, *d.next, d.text);
  return d;
}

// The routes changed in place, each with a new handler instance when its
// options changed (ReloadRefused when the plugin refuses them); `routes` gets
// what changed of each.
std::vector<HostRun::Change> HostRun::prepare_changes(const Draft& draft, bool force, json& routes) {
  std::vector<Change> changes;
  for (const auto& name : draft.plan.routes_to_apply(force)) {
    const auto& rc = *draft.next->route_by_name(name);
    const size_t index = static_cast<size_t>(&rc - draft.next->routes.data());
    Change c{slice_of(name), rc, nullptr};
    const auto& keys = std::find_if(draft.plan.routes.begin(), draft.plan.routes.end(), [&](const auto& r) {
                         return r.route == name;
                       })->keys;
    if (std::any_of(keys.begin(), keys.end(), [](const std::string& k) { return k.starts_with("route.options."); })) {
      try {
        c.handler = retirer_.adopt(std::make_unique<plugin::Instance>(draft.libs[index], rc));
      } catch (const std::exception& e) {
        throw ReloadRefused("route " + name + ": " + e.what());
      }
    }
    routes.push_back({{"route", name}, {"changed", keys}, {"new_instance", c.handler != nullptr}});
    changes.push_back(std::move(c));
  }
  return changes;
}

// Applied on the engine thread, each route on its own (a local_tx route
// once its apply jobs ended); the others never notice. Empty when all are
// applied; else why not all (`routes`: how many the reload touches).
std::string HostRun::apply_changes(std::vector<Change> changes, std::optional<LogLevel> log_level, size_t routes) {
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
  asio::post(io_, [changes = std::move(changes), one_done, log_level]() mutable {
    if (log_level) set_log_level(*log_level);
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
  // A local_tx route waits for its apply jobs, which wait for the
  // database: not for ever here. A route not changed yet changes once
  // they end; the next reload compares with the file as it ran before.
  const auto deadline = std::chrono::steady_clock::now() + kApplyWait;
  std::unique_lock lk(pending->mu);
  while (pending->left > 0) {
    pending->cv.wait_for(lk, std::chrono::milliseconds(200));
    if (pending->left > 0 && (draining_ || std::chrono::steady_clock::now() >= deadline))
      return std::string(draining_ ? "the host began stopping" : "a local_tx route's apply jobs did not end") +
             " while the reload applied: " + std::to_string(pending->left) + " of " + std::to_string(routes) +
             " route(s) not changed yet (each changes once its jobs end)";
  }
  return "";
}

// Each group of added routes started; returns the routes of the groups whose
// consumer could not start (not added), and says why in `failures`.
std::set<std::string> HostRun::add_groups(std::vector<Addition>& additions, std::string& failures) {
  std::set<std::string> not_added;
  for (auto& a : additions) {
    std::set<std::string> names;
    for (const auto& r : a.routes) names.insert(r->cfg.name);
    try {
      add_group(a);
    } catch (const std::exception& e) {
      not_added.merge(names);
      failures += "; group " + a.group + ": its consumer could not start (" + e.what() + "), its routes were not added";
    }
  }
  return not_added;
}

// What runs from now on: `next` (as far as it was applied) and its file's
// text, and the admin port's view of the routes as they now run.
void HostRun::run_from_now(config::Config next, std::string text) {
  const auto views = views_of(next);
  for (auto& s : slices_) s.routes = views.at(&s);
  views_.set(slice_views());
  running_ = std::move(next);
  running_text_ = std::move(text);
  metrics_.set_config(cfg_.file.string(), config_hash(running_text_));
}

// The slices' routes as `next` has them: the admin port's and the reconcilers' view.
std::map<const Slice*, std::shared_ptr<const config::Config>> HostRun::views_of(const config::Config& next) const {
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

// The routes a reload adds, made before anything changes (an instance may
// refuse its options), one entry per slice and group.
std::vector<HostRun::Addition> HostRun::prepare_additions(const config::Config& next,
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
      throw std::runtime_error("route " + name + ": database " + database +
                               " has not started its routes (it did not answer yet): restart, or reload once it runs");
    // A plugin file new to the database brings its tables.
    if (s->cfg.claim.apply_schema &&
        std::none_of(s->libs.begin(), s->libs.end(), [&](const auto& l) { return l->path() == lib->path(); })) {
      try {
        db::Pool::run_once(s->cfg.database, [&](db::Connection& c) {
          for (const char* stmt : lib->schema()) c.execute(stmt);
        });
      } catch (const db::DbError& e) {
        throw std::runtime_error("route " + name + ": the tables of plugin " + lib->path().string() + ": " + e.what());
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
void HostRun::add_group(Addition& a) {
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
void HostRun::remove_group(Slice& s, const std::string& group) {
  bool removed = false;  // at once: the slice had not started
  std::unique_ptr<kafka::Consumer> consumer = on_engine([&] {
    std::unique_ptr<kafka::Consumer> out;
    auto it = std::find_if(s.consumers.begin(), s.consumers.end(), [&](const auto& c) { return c->group() == group; });
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

}  // namespace idemsink::app::detail
