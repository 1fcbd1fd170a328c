// What a reload of the config file would change, and whether it may.
//
// The running file and the new one are compared key by key, as written
// (the TOML documents, so a setting added later is compared without being
// listed here), route by route by name. Each difference falls in a class:
//
//   changed   a route's options, rate limit (but one newly shared by the
//             group), circuit thresholds, filter ([route.when]),
//             concurrency, payload_check, max_record_bytes, attempts and
//             backoff ([route.retry] but its topics), [route.output], a
//             longer call_timeout: applied to that route alone, while it runs
//             (pipeline::Engine::reconfigure, the reconciler's snapshot);
//             host.log_level too.
//   identity  where a route's biz_key comes from ([route.key]), its database
//             ([route.database]), or its name (a route gone and one come
//             on its topic in one reload): records already claimed would
//             get another identity and run again. Refused unless forced; a
//             forced key change is applied, a database or a name needs a
//             restart even then.
//   restart   anything else: [kafka], [database], [claim], [schema_registry],
//             [host] but its log level, a route's topic, group, start_at,
//             a shorter call_timeout, the retry topics, [route.dlq],
//             circuit.enabled, formats, order_by or plugin file. Refused,
//             naming the keys.
//   added     a route that is new, in a group no running route reads, on a
//   removed   database a running route uses; a route that is gone, the last
//             of its group: its own consumer starts, or closes (its
//             partitions drained and committed as at shutdown), and no other
//             route's group rebalances. One sharing its group with a route
//             that stays would rebalance that route, and an added one with
//             [route.order_by] needs the hold lists made at start: a restart.
//
// A reload applies all of its changes or none.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "core/config/config.h"

namespace idemsink::config {

struct RouteChange {
  enum class Kind { Unchanged, Changed, Identity, Restart, Added, Removed };
  std::string route;
  Kind kind = Kind::Unchanged;
  std::vector<std::string> keys;  // the keys that differ, "route.retry.max_attempts"; never their values
  std::string why;                // Identity and Restart: what it would do
  bool forcible = false;          // Identity: applied when forced
};

struct ReloadPlan {
  std::vector<std::string> restart_keys;  // outside the routes
  bool log_level_changed = false;
  std::vector<RouteChange> routes;  // the running routes in order, then the added ones

  bool changes_anything() const;
  /// Why it may not be applied (empty: it may be).
  std::string refusal(bool force) const;
  /// One line for the log and the operator log: what changed, route by route.
  std::string describe() const;
  /// The routes to reconfigure (Changed, and Identity when forced).
  std::vector<std::string> routes_to_apply(bool force) const;
  /// The routes of one kind (Added, Removed), in the plan's order.
  std::vector<std::string> routes_of(RouteChange::Kind kind) const;
  /// The change of one route of the plan (it must be there).
  const RouteChange& route(const std::string& name) const;
};

/// Compares the running config (and the text it was read from) with a new
/// one that loaded. Throws ConfigError when a text does not parse.
ReloadPlan plan_reload(const Config& running, const std::string& running_text, const Config& next,
                       const std::string& next_text);

/// The file's text without the [[route]] tables named `routes`: what runs
/// when a reload could not add them.
std::string without_routes(const std::string& text, const std::set<std::string>& routes);

}  // namespace idemsink::config
