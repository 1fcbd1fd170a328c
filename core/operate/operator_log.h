// The operator log: every action a person takes on the pipeline (pause or
// resume a route, replay or discard dead letters, resolve an unknown claim,
// release an entity's hold), who took it, on which records, with their note
// and what came of it. One row per action, written in the transaction of the
// action itself, so the log cannot miss an action that happened nor show one
// that did not. Read by the console and `idemsink operator-log`.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/db/connection.h"

namespace idemsink::operate {

/// Who acts: the admin token's name (the console, the API) or "cli:<user>".
struct Actor {
  std::string name;
  std::string role;  // viewer, operator, admin (the CLI acts as admin)
};

/// The actor of a command run on this machine.
Actor cli_actor();

struct LogEntry {
  std::string action;                                // e.g. "route.pause", "letters.replay", "unknown.resolve"
  std::string route;                                 // empty: host-wide
  nlohmann::json records = nlohmann::json::array();  // what it touched: keys, tokens, outbox ids
  std::string note;
  std::string result;
};

struct LoggedAction {
  uint64_t id = 0;
  std::string at;  // UTC, database time
  std::string who;
  std::string role;
  LogEntry entry;
};

class OperatorLog {
 public:
  static const char* schema();
  /// Appends an entry in the caller's transaction.
  static void append(db::Connection& c, const Actor& who, const LogEntry& entry);
  /// Newest first; `route` empty for all, `before_id` 0 for the newest.
  static std::vector<LoggedAction> list(db::Connection& c, const std::string& route, size_t limit,
                                        uint64_t before_id = 0);
};

nlohmann::json to_json(const LoggedAction& a);

}  // namespace idemsink::operate
