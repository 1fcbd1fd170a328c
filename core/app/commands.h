// The CLI's commands, one function each; main.cc only parses arguments.
// Each returns the process exit code.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/operate/actions.h"

namespace idemsink::app {

int run(const config::Config& cfg);
/// Validates the config and loads every plugin; with `connect`, also logs
/// in to the Kafka cluster (exit 1 when it cannot).
int check_config(const config::Config& cfg, bool connect);
/// `action`: print (the DDL), apply, or migrate (an older claim table brought
/// to the current layout while hosts run).
int schema(const config::Config& cfg, const std::string& action);
int dev_kafka(int brokers, const std::vector<std::string>& topics, int control_port);

/// Unknown and stuck claims, one line each.
int reconcile_list(const config::Config& cfg);
/// Every route plugin's reconciliation checks; exit 1 if any finds a problem.
int reconcile_check(const config::Config& cfg);
/// One reconcile round through the plugins' hooks, as the host runs it.
int reconcile_ask(const config::Config& cfg);
/// An operator's decision for one claim (unknown or stuck) by idem_token.
int reconcile_resolve(const config::Config& cfg, const std::string& token, const std::string& as,
                      const std::string& note);
/// Every committed offset accounted for; exit 1 if not.
int audit(const config::Config& cfg);

/// Outbox rows Kafka refused for good; exit 1 if there are any.
int dlq_list(const config::Config& cfg);
/// Puts an unpublishable row back in the publishing queue.
int dlq_retry(const config::Config& cfg, uint64_t id, const std::string& note);
/// Drops an unpublishable row from the publishing queue, with a note.
int dlq_discard(const config::Config& cfg, uint64_t id, const std::string& note);

/// Live order holds ([route.order_by]) of a route (all routes when empty), oldest first; exit 0.
int order_holds_list(const config::Config& cfg, const std::string& route);
/// An operator lets an entity of a route go on: its holds are deleted.
int order_holds_release(const config::Config& cfg, const std::string& route, const std::string& order_key,
                        const std::string& note);

/// Every route's operator pause, from the database; exit 0.
int route_list(const config::Config& cfg);
/// Pauses or resumes a route on every host of the group (they follow within
/// 2 s); kept across restarts.
int route_pause(const config::Config& cfg, const std::string& route, bool paused, const std::string& by,
                const std::string& note);

/// `idemsink replay`: dead (failed) claims of a route re-opened and their
/// records sent back to its source topic; exit 1 if some could not be replayed.
/// `idemsink route rewind|skip`: requests the move, then waits up to
/// `wait` for the hosts to apply it, printing each partition's move.
int route_move(const config::Config& cfg, const offline::MoveAsk& ask, const std::string& by, const std::string& note,
               std::chrono::seconds wait);

int replay(const config::Config& cfg, const operate::ReplayRequest& req, const std::string& note);

/// The operator log, newest first, one JSON object per line.
int operator_log(const config::Config& cfg, const std::string& route, size_t limit);

/// `idemsink reload`: asks the host on this machine (its admin port,
/// host.admin_listen, or `url`) to read its config file again; prints what
/// came of it. 0 applied or unchanged, 1 refused.
int reload_host(const config::Config& cfg, const std::string& url, bool force, const std::string& note);

}  // namespace idemsink::app
