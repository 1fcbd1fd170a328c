// Operator pauses per route, kept in the database (idemsink_route_control),
// so that every host of the group obeys and a restart keeps a paused route
// paused. A paused route stops fetching its topic and its retry topics (the
// host stays in the group); records it had already consumed finish.
//
// Set by POST /routes/NAME/pause|resume on any host's admin port or by
// `idemsink route pause|resume NAME`; every host reads the table every 2 s.
// A host that cannot read it at start keeps its routes paused until it can:
// an outage must not undo a pause.
#pragma once

#include "core/common/asio.h"
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/db/connection.h"
#include "core/db/pool.h"
#include "core/pipeline/fetch_gate.h"
#include "core/common/periodic.h"
#include "core/pipeline/controls.h"
#include "core/pipeline/record.h"

namespace idemsink::pipeline {

class RouteControl {
 public:
  struct State {
    bool paused = false;
    std::string changed_by;  // who paused or resumed it last
    std::string changed_at;  // when (database time)
  };

  static const char* schema();
  /// Reads nothing from the table: throws the server's error when it is missing.
  static void check_table(db::Connection& c);
  /// Every route's row; a missing table reads as no pauses (the schema is older).
  static std::map<std::string, State> read(db::Connection& c);
  static void write(db::Connection& c, const std::string& route, bool paused, const std::string& by);

  RouteControl(boost::asio::io_context& io, db::Pool& pool, const config::DatabaseConfig& database,
               std::vector<Route*> routes);

  /// Applies the stored pauses before the consumer starts (blocking).
  void load_at_start();
  void start();
  void stop();

  /// A route a reload added (engine thread): its stored pause applies before
  /// its consumer starts.
  void add(Route* route);
  /// A route a reload removed, once its consumer closed.
  void remove(const std::string& route);

  bool has(const std::string& route) const;
  /// Stores an operator's pause or resume and applies it here at once; the
  /// other hosts follow within a refresh. Blocking, on its own connection
  /// (admin thread, at most database.connect_timeout when the server is
  /// unreachable); throws db::DbError when it was not stored.
  void set(const std::string& route, bool paused, const std::string& by);
  /// A pause or resume someone else stored (the operator API): applied here
  /// at once rather than at the next refresh.
  void stored(const std::string& route, bool paused, const std::string& by);

  std::vector<RoutePause> view() const;

 private:
  void refresh();
  /// Pauses and resumes the routes as `states` say (any thread).
  void apply(const std::map<std::string, State>& states, bool known);
  void apply_locked(const std::map<std::string, State>& states, bool known);

  boost::asio::io_context& io_;
  db::Pool& pool_;
  const config::DatabaseConfig& database_;
  Periodic timer_;
  bool refreshing_ = false;  // engine thread

  mutable std::mutex mu_;
  std::vector<Route*> routes_;  // a reload adds and removes them
  bool known_ = false;          // the table was read once
  std::map<std::string, State> states_;
  std::map<std::string, bool> applied_;  // route -> paused, as the fetch gate was told
  uint64_t sets_ = 0;                    // operator sets through this host
};

}  // namespace idemsink::pipeline
