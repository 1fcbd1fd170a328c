// What an operator does to the pipeline, one function per action, shared by
// the CLI (`idemsink route`, `replay`, `outbox`, `reconcile --resolve`,
// `order-holds release`) and the admin API (the console). Each runs in one
// transaction with its operator-log entry (operator_log.h), on the database
// of the route it acts on, and says what came of it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/db/connection.h"
#include "core/offline/offset_move.h"
#include "core/operate/operator_log.h"

namespace idemsink::operate {

/// What came of an action.
struct Done {
  bool ok = false;
  std::string message;    // one line, for a person
  nlohmann::json detail;  // the figures, for a program
};

/// Pauses or resumes a route on every host of the group (kept in the
/// database; hosts follow within 2 s).
Done pause_route(db::Connection& c, const config::Config& cfg, const Actor& who, const std::string& route, bool paused,
                 const std::string& note);

/// Moves a route's offsets (offline/offset_move.h checks where to, asking
/// Kafka): stored with its log entry for the hosts to apply
/// (claim/offset_moves.h). A skip needs a note that says why.
Done move_offsets(db::Connection& c, const config::Config& cfg, const Actor& who, const offline::MoveAsk& ask,
                  const std::string& note);

struct ReplayRequest {
  std::string route;
  std::optional<std::string> reason;
  std::optional<std::string> since;  // "2h", "2026-11-30 14:05"
  std::optional<std::string> key;
  std::vector<uint64_t> letter_ids;
  bool dry_run = false;
};
/// Re-opens dead (failed) claims and sends their records back to the
/// source topic (offline/replay.h); each record in its own transaction with
/// its log entry. A dry run changes and logs nothing.
Done replay(db::Connection& c, const config::Config& cfg, const Actor& who, const ReplayRequest& req,
            const std::string& note);

/// A dead letter needs nothing more (dlq/letters.h).
Done discard_letter(db::Connection& c, const Actor& who, uint64_t id, const std::string& note);

/// An outbox row Kafka refused for good (a letter or an event) is dropped
/// from the publishing queue; it stays in the table, stamped, with the note.
Done discard_unpublishable(db::Connection& c, const config::Config& cfg, const Actor& who, uint64_t id,
                           const std::string& note);

/// An unpublishable outbox row goes back in the publishing queue.
Done retry_unpublishable(db::Connection& c, const config::Config& cfg, const Actor& who, uint64_t id,
                         const std::string& note);

/// A person's decision for an unknown or stuck claim (by idem_token): done
/// or failed. Its outcome event and the stamp of a held letter commit with it.
Done resolve(db::Connection& c, const config::Config& cfg, const Actor& who, const std::string& token,
             const std::string& as, const std::string& note);

/// An operator asked for a reconcile round (`idemsink reconcile --ask`, the
/// console's "ask again"): its result, logged once the round has settled
/// what it could (each settlement in its own transaction, as every round's).
Done record_round(db::Connection& c, const Actor& who, const std::string& route, const std::string& result,
                  const std::string& note);

/// An entity of an ordered route goes on: its holds are deleted.
Done release_hold(db::Connection& c, const Actor& who, const std::string& route, const std::string& order_key,
                  const std::string& note);

}  // namespace idemsink::operate
