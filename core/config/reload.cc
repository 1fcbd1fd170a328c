#include "core/config/reload.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <sstream>
#include <string_view>
#include <toml++/toml.h>

namespace idemsink::config {

namespace {

// Every key of a document (or a table of it) as its dotted path, with its
// value as TOML writes it; arrays whole.
using Flat = std::map<std::string, std::string>;

void flatten(const toml::node& n, const std::string& path, Flat& out) {
  if (const toml::table* t = n.as_table()) {
    for (auto&& [k, v] : *t) flatten(v, path.empty() ? std::string(k.str()) : path + "." + std::string(k.str()), out);
    return;
  }
  std::ostringstream text;
  n.visit([&text](const auto& v) { text << v; });
  out[path] = text.str();
}

toml::table parse_text(const std::string& text, const std::string& file) {
  try {
    return toml::parse(text, file);
  } catch (const toml::parse_error& e) {
    throw ConfigError(file + ": " + std::string(e.description()));
  }
}

std::vector<std::string> differing(const Flat& a, const Flat& b, const std::string& prefix) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : a)
    if (auto it = b.find(k); it == b.end() || it->second != v) keys.push_back(prefix + k);
  for (const auto& [k, v] : b)
    if (!a.contains(k)) keys.push_back(prefix + k);
  return keys;
}

// A [[route]] key (relative to the route) by what changing it means.
enum class Class { InPlace, Identity, Restart };

// In place: what the engine thread reads per record or per call, and the
// reconciler from the reload's snapshot (Reconciler::set_routes). The retry
// topics change the subscription, the DLQ where letters already written
// go, and switching the circuit off while it is open would leave it open:
// those need a restart; call_timeout may only grow (plan_reload).
Class class_of(std::string_view key) {
  const std::string_view section = key.substr(0, key.find('.'));
  for (std::string_view s : {"options", "rate_limit", "when", "output"})
    if (section == s) return Class::InPlace;
  if (section == "circuit" && key != "circuit.enabled") return Class::InPlace;
  for (std::string_view k : {"concurrency", "payload_check", "max_record_bytes", "call_timeout", "retry.max_attempts",
                             "retry.backoff_initial", "retry.backoff_max"})
    if (key == k) return Class::InPlace;
  if (section == "key" || section == "database") return Class::Identity;
  return Class::Restart;  // the topic, group, formats, plugin file, and any key not known here
}

// A rate limit newly shared by the group needs the partition counts of the
// route's topics, which the engine reads at assignment.
bool newly_group_limited(const RouteConfig& before, const RouteConfig& after) {
  const auto group = [](const RateLimitConfig& r) { return r.rate > 0 && r.scope == RateScope::Group; };
  return group(after.rate_limit) && !group(before.rate_limit);
}

std::string joined(const std::vector<std::string>& items, std::string_view sep = ", ") {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : std::string(sep)) + i;
  return out;
}

RouteChange compare_route(const std::string& name, const Flat& before, const Flat& after) {
  RouteChange c{name};
  std::vector<std::string> relative = differing(before, after, "");
  if (relative.empty()) return c;
  std::vector<std::string> restart, identity;
  bool only_key = true;
  for (const auto& k : relative) {
    c.keys.push_back("route." + k);
    switch (class_of(k)) {
      case Class::InPlace: break;
      case Class::Identity:
        identity.push_back("route." + k);
        only_key = only_key && k.starts_with("key");
        break;
      case Class::Restart: restart.push_back("route." + k); break;
    }
  }
  if (!restart.empty()) {
    c.kind = RouteChange::Kind::Restart;
    c.why = "needs a restart (" + joined(restart) + ")";
  } else if (!identity.empty()) {
    c.kind = RouteChange::Kind::Identity;
    c.forcible = only_key;
    c.why = "its identity changes (" + joined(identity) +
            "): records already claimed would be claimed again under another identity and run again";
  } else {
    c.kind = RouteChange::Kind::Changed;
  }
  return c;
}

std::vector<Flat> route_tables(const toml::table& doc, const Config& cfg) {
  std::vector<Flat> out;
  if (const toml::array* routes = doc["route"].as_array())
    for (const toml::node& r : *routes) {
      Flat f;
      flatten(r, "", f);
      out.push_back(std::move(f));
    }
  if (out.size() != cfg.routes.size())
    throw ConfigError(cfg.file.string() + ": " + std::to_string(out.size()) + " [[route]] tables but " +
                      std::to_string(cfg.routes.size()) + " routes loaded");
  return out;
}

std::optional<size_t> index_of(const Config& cfg, const std::string& name) {
  for (size_t i = 0; i < cfg.routes.size(); ++i)
    if (cfg.routes[i].name == name) return i;
  return std::nullopt;
}

// Routes by group: an added or removed route may not share its group with a
// route that stays, whose partitions the group's rebalance would move (a
// route of its own group is a consumer of its own, as Kafka Connect gives
// each connector its group).
std::vector<std::string> readers_of(const Config& cfg, const std::string& group, const std::string& except) {
  std::vector<std::string> names;
  for (const auto& r : cfg.routes)
    if (r.group_id == group && r.name != except) names.push_back(r.name);
  return names;
}

// The settings outside [[route]]: the log level changes in place, any other
// needs a restart.
void plan_top_level(const toml::table& before_doc, const toml::table& after_doc, ReloadPlan& plan) {
  Flat before_top, after_top;
  for (auto&& [k, v] : before_doc)
    if (k.str() != "route") flatten(v, std::string(k.str()), before_top);
  for (auto&& [k, v] : after_doc)
    if (k.str() != "route") flatten(v, std::string(k.str()), after_top);
  for (auto& key : differing(before_top, after_top, ""))
    if (key == "host.log_level")
      plan.log_level_changed = true;
    else
      plan.restart_keys.push_back(std::move(key));
}

// A route in both files, `now` as it runs and `next` as the file has it.
RouteChange kept_route(const RouteConfig& now, const RouteConfig& next, const Flat& before, const Flat& after) {
  RouteChange c = compare_route(now.name, before, after);
  // A forced key change applies the route's other changes too: the same checks.
  const bool applies = c.kind == RouteChange::Kind::Changed || c.kind == RouteChange::Kind::Identity;
  if (applies && newly_group_limited(now, next)) {
    c.kind = RouteChange::Kind::Restart;
    c.why =
        "needs a restart (route.rate_limit: a limit newly shared by the group needs the topic's partition "
        "counts, read at assignment)";
  }
  // A call out under the longer deadline must not be taken for one that
  // never happened (the reconciler waits call_timeout before it asks),
  // and the dispatcher's deadlines stay in the order calls started.
  if (applies && next.call_timeout < now.call_timeout) {
    c.kind = RouteChange::Kind::Restart;
    c.why =
        "needs a restart (route.call_timeout lowered: a call out under the longer one could be taken for one "
        "never sent)";
  }
  return c;
}

// A route only the new file has; `gone` loses the route it replaces, if any.
RouteChange added_route(const RouteConfig& r, const Config& running, const Config& next,
                        std::vector<const RouteConfig*>& gone) {
  RouteChange c{r.name, RouteChange::Kind::Added, {"route.name"}};
  // A route gone and one come on its topic in one reload is a rename, or
  // one route replacing another: the new name's claims are empty, so
  // records the old one did would run again.
  for (auto it = gone.begin(); it != gone.end(); ++it)
    if ((*it)->topic == r.topic) {
      c.kind = RouteChange::Kind::Identity;
      c.why = "was route " + (*it)->name + " (same topic" + ((*it)->group_id == r.group_id ? " and group" : "") +
              "): its claims are under the old name, so records already done would run again; renaming, or "
              "replacing a route on its topic, needs a restart (or a reload that removes it, then one that adds "
              "the other, which starts where its group's commits or start_at say)";
      gone.erase(it);
      break;
    }
  if (c.kind != RouteChange::Kind::Added) return c;
  const std::string label = next.database_of(r).label();
  const bool served = std::any_of(running.routes.begin(), running.routes.end(),
                                  [&](const RouteConfig& o) { return running.database_of(o).label() == label; });
  if (const auto sharing = readers_of(running, r.group_id, r.name); !sharing.empty()) {
    c.kind = RouteChange::Kind::Restart;
    c.why = "is new in group " + r.group_id + ", which route(s) " + joined(sharing) +
            " read: joining it would rebalance them; give it a group of its own (group_id = \"" + r.group_id + "." +
            r.name + "\") or restart";
  } else if (r.order_by.enabled()) {
    c.kind = RouteChange::Kind::Restart;
    c.why = "is new with [route.order_by], whose holds the host keeps in lists made at start: restart";
  } else if (!served) {
    c.kind = RouteChange::Kind::Restart;
    c.why = "is new on database " + label + ", where no running route is: a new database needs a restart";
  }
  return c;
}

// A route only the running file has.
RouteChange removed_route(const RouteConfig& r, const Config& next) {
  RouteChange c{r.name, RouteChange::Kind::Removed, {"route.name"}};
  if (const auto sharing = readers_of(next, r.group_id, r.name); !sharing.empty()) {
    c.kind = RouteChange::Kind::Restart;
    c.why = "is gone from group " + r.group_id + ", which route(s) " + joined(sharing) +
            " read on: leaving it would rebalance them; restart";
  }
  return c;
}

}  // namespace

ReloadPlan plan_reload(const Config& running, const std::string& running_text, const Config& next,
                       const std::string& next_text) {
  const toml::table before_doc = parse_text(running_text, running.file.string());
  const toml::table after_doc = parse_text(next_text, next.file.string());
  ReloadPlan plan;
  plan_top_level(before_doc, after_doc, plan);
  const std::vector<Flat> before = route_tables(before_doc, running), after = route_tables(after_doc, next);
  std::vector<const RouteConfig*> gone;
  for (size_t i = 0; i < running.routes.size(); ++i) {
    const auto& r = running.routes[i];
    if (const auto j = index_of(next, r.name))
      plan.routes.push_back(kept_route(r, next.routes[*j], before[i], after[*j]));
    else
      gone.push_back(&r);
  }
  for (const auto& r : next.routes)
    if (!index_of(running, r.name)) plan.routes.push_back(added_route(r, running, next, gone));
  for (const RouteConfig* r : gone) plan.routes.push_back(removed_route(*r, next));
  return plan;
}

std::string without_routes(const std::string& text, const std::set<std::string>& routes) {
  toml::table doc = parse_text(text, "the config");
  if (toml::array* tables = doc["route"].as_array())
    for (size_t i = tables->size(); i-- > 0;) {
      const toml::table* t = (*tables)[i].as_table();
      const auto name = t ? (*t)["name"].value<std::string>() : std::nullopt;
      if (name && routes.contains(*name)) tables->erase(tables->begin() + static_cast<std::ptrdiff_t>(i));
    }
  std::ostringstream out;
  out << doc;
  return out.str();
}

bool ReloadPlan::changes_anything() const {
  if (log_level_changed || !restart_keys.empty()) return true;
  for (const auto& r : routes)
    if (r.kind != RouteChange::Kind::Unchanged) return true;
  return false;
}

std::string ReloadPlan::refusal(bool force) const {
  std::vector<std::string> why;
  if (!restart_keys.empty()) why.push_back("needs a restart (" + joined(restart_keys) + ")");
  for (const auto& r : routes) {
    if (r.kind == RouteChange::Kind::Restart) why.push_back("route " + r.route + " " + r.why);
    if (r.kind != RouteChange::Kind::Identity) continue;
    if (!force)
      why.push_back("route " + r.route + ": " + r.why + "; refused unless forced");
    else if (!r.forcible)
      why.push_back("route " + r.route + ": " + r.why);
  }
  return joined(why, "; ");
}

std::string ReloadPlan::describe() const {
  std::vector<std::string> parts;
  if (log_level_changed) parts.push_back("host.log_level");
  if (!restart_keys.empty()) parts.push_back(joined(restart_keys));
  for (const auto& r : routes) switch (r.kind) {
      case RouteChange::Kind::Unchanged: break;
      case RouteChange::Kind::Added: parts.push_back("route " + r.route + " added"); break;
      case RouteChange::Kind::Removed: parts.push_back("route " + r.route + " removed"); break;
      default: parts.push_back("route " + r.route + ": " + joined(r.keys));
    }
  return parts.empty() ? "no change" : "changed " + joined(parts, "; ");
}

std::vector<std::string> ReloadPlan::routes_to_apply(bool force) const {
  std::vector<std::string> out;
  for (const auto& r : routes)
    if (r.kind == RouteChange::Kind::Changed || (force && r.kind == RouteChange::Kind::Identity && r.forcible))
      out.push_back(r.route);
  return out;
}

std::vector<std::string> ReloadPlan::routes_of(RouteChange::Kind kind) const {
  std::vector<std::string> out;
  for (const auto& r : routes)
    if (r.kind == kind) out.push_back(r.route);
  return out;
}

const RouteChange& ReloadPlan::route(const std::string& name) const {
  for (const auto& r : routes)
    if (r.route == name) return r;
  throw std::logic_error("no route " + name + " in the reload plan");
}

}  // namespace idemsink::config
