#include "core/operate/actions.h"

#include <sstream>

#include "core/claim/claim_store.h"
#include "core/claim/offset_moves.h"
#include "core/claim/order_hold.h"
#include "core/common/util.h"
#include "core/dlq/letters.h"
#include "core/dlq/outbox.h"
#include "core/dlq/outcome_event.h"
#include "core/dlq/reason.h"
#include "core/offline/replay.h"
#include "core/pipeline/route_control.h"

namespace idemsink::operate {
namespace {

// Runs `act` and the log entry it fills in one transaction; rolled back, and
// the error passed on, if either fails.
template <class Act>
Done logged(db::Connection& c, const Actor& who, LogEntry entry, Act&& act) {
  c.begin();
  try {
    Done done = act(entry);
    entry.result = done.message;
    if (done.ok) OperatorLog::append(c, who, entry);
    c.commit();
    return done;
  } catch (...) {
    c.rollback_quietly();
    throw;
  }
}

}  // namespace

Done pause_route(db::Connection& c, const config::Config& cfg, const Actor& who, const std::string& route, bool paused,
                 const std::string& note) {
  if (cfg.route_by_name(route) == nullptr) return {false, "no route named " + route, nullptr};
  return logged(c, who, {paused ? "route.pause" : "route.resume", route, nlohmann::json::array(), note, ""},
                [&](LogEntry&) {
                  pipeline::RouteControl::write(c, route, paused, who.name);
                  return Done{true,
                              "route " + route + (paused ? " paused" : " resumed") +
                                  ": every running host of the group follows within 2 s",
                              {{"route", route}, {"paused", paused}}};
                });
}

Done move_offsets(db::Connection& c, const config::Config& cfg, const Actor& who, const offline::MoveAsk& ask,
                  const std::string& note) {
  const bool skip = ask.kind == claim::OffsetMove::Kind::Skip;
  if (skip && note.find_first_not_of(" \t\n") == std::string::npos)
    return {false, "a skip passes over records: its note must say why", nullptr};
  offline::MovePlan plan = offline::plan_move(cfg, ask);
  if (!plan.refusal.empty())
    return {false, std::string(skip ? "skip" : "rewind") + " refused: " + plan.refusal, nullptr};
  // Records a skip passed over have no claims: read again, they would run.
  if (!skip)
    for (const auto& m : plan.moves)
      for (const auto& s : claim::OffsetMoves::skips(c, m.group, m.topic, m.partition))
        if (m.to < s.to)
          return {false,
                  "rewind refused: " + m.topic + "[" + std::to_string(m.partition) + "] " + std::to_string(m.to) +
                      " is before the end of skip #" + std::to_string(s.id) + " by " + s.requested_by + " (" + s.note +
                      "), which passed over " + std::to_string(*s.from) + ".." + std::to_string(s.to - 1) +
                      ": read again, those records would run; rewind to " + std::to_string(s.to) + " or later",
                  nullptr};
  for (auto& m : plan.moves) {
    m.requested_by = who.name;
    m.note = note;
  }
  return logged(c, who, {skip ? "route.skip" : "route.rewind", ask.route, nlohmann::json::array(), note, ""},
                [&](LogEntry& entry) {
                  const auto ids = claim::OffsetMoves::request(c, plan.moves);
                  nlohmann::json moves = nlohmann::json::array();
                  for (size_t i = 0; i < ids.size(); ++i)
                    moves.push_back({{"id", ids[i]},
                                     {"topic", plan.moves[i].topic},
                                     {"partition", plan.moves[i].partition},
                                     {"to", plan.moves[i].to}});
                  entry.records = moves;
                  std::string lines;
                  for (const auto& l : plan.lines) lines += (lines.empty() ? "" : "; ") + l;
                  return Done{true,
                              std::string(skip ? "skip" : "rewind") + " of route " + ask.route + " requested (" +
                                  lines + "): each partition's owner applies it within 2 s",
                              {{"route", ask.route}, {"kind", skip ? "skip" : "rewind"}, {"moves", moves}}};
                });
}

Done replay(db::Connection& c, const config::Config& cfg, const Actor& who, const ReplayRequest& req,
            const std::string& note) {
  offline::ReplayFilter filter;
  filter.route = req.route;
  filter.reason = req.reason;
  if (req.since) filter.since = offline::since_expression(*req.since);
  filter.key = req.key;
  filter.letter_ids = req.letter_ids;
  filter.dry_run = req.dry_run;
  nlohmann::json replayed = nlohmann::json::array();
  // Each record re-opened commits with its own log entry.
  filter.in_transaction = [&](db::Connection& tx, const std::string& biz_key, const std::string& token,
                              uint64_t letter_id) {
    const nlohmann::json record = {{"biz_key", biz_key}, {"idem_token", token}, {"letter", letter_id}};
    replayed.push_back(record);
    OperatorLog::append(tx, who,
                        {"letters.replay", req.route, nlohmann::json::array({record}), note,
                         "re-opened; its record goes back to " + cfg.route_by_name(req.route)->topic});
  };
  std::ostringstream lines;
  const offline::ReplayReport r = offline::replay(c, cfg, filter, lines);
  std::string message = std::to_string(r.matched) + " failed claim(s) matched, " + std::to_string(r.replayed) +
                        (req.dry_run ? " would be" : "") + " re-opened and sent back, " +
                        std::to_string(r.not_replayable) + " not replayable, " + std::to_string(r.taken_by_other) +
                        " no longer failed";
  return {true,
          message,
          {{"matched", r.matched},
           {"replayed", r.replayed},
           {"not_replayable", r.not_replayable},
           {"taken_by_other", r.taken_by_other},
           {"dry_run", req.dry_run},
           {"records", replayed},
           {"lines", lines.str()}}};
}

Done discard_letter(db::Connection& c, const Actor& who, uint64_t id, const std::string& note) {
  const std::optional<dlq::LetterRow> l = dlq::letter(c, id);
  if (!l) return {false, "no dead letter has id " + std::to_string(id), nullptr};
  return logged(c, who, {"letters.discard", l->route, nlohmann::json::array({{{"letter", id}}}), note, ""},
                [&](LogEntry&) {
                  if (!dlq::discard_letter(c, id, note))
                    return Done{false, "dead letter " + std::to_string(id) + " is discarded already", nullptr};
                  return Done{true, "dead letter " + std::to_string(id) + " discarded", {{"letter", id}}};
                });
}

Done discard_unpublishable(db::Connection& c, const config::Config& cfg, const Actor& who, uint64_t id,
                           const std::string& note) {
  const dlq::Outbox outbox(cfg.host.id + "#operator", cfg.claim.lease);
  return logged(c, who, {"outbox.discard", "", nlohmann::json::array({{{"outbox_id", id}}}), note, ""}, [&](LogEntry&) {
    if (!outbox.discard_unpublishable(c, id, note))
      return Done{false, "no unpublishable outbox row has id " + std::to_string(id), nullptr};
    return Done{true, "outbox row " + std::to_string(id) + " discarded", {{"outbox_id", id}}};
  });
}

Done retry_unpublishable(db::Connection& c, const config::Config& cfg, const Actor& who, uint64_t id,
                         const std::string& note) {
  const dlq::Outbox outbox(cfg.host.id + "#operator", cfg.claim.lease);
  return logged(c, who, {"outbox.retry", "", nlohmann::json::array({{{"outbox_id", id}}}), note, ""}, [&](LogEntry&) {
    if (!outbox.retry_unpublishable(c, id))
      return Done{false, "no unpublishable outbox row has id " + std::to_string(id), nullptr};
    return Done{true, "outbox row " + std::to_string(id) + " is back in the publishing queue", {{"outbox_id", id}}};
  });
}

Done resolve(db::Connection& c, const config::Config& cfg, const Actor& who, const std::string& token,
             const std::string& as, const std::string& note) {
  if (as != "done" && as != "failed") return {false, "resolve as done or failed, not \"" + as + "\"", nullptr};
  const claim::ClaimStore store(cfg.host.id, cfg.host.id + "#operator", cfg.claim.lease);
  const dlq::Outbox outbox(cfg.host.id + "#operator", cfg.claim.lease);
  const std::vector<std::string> tokens{token};
  std::string route;
  for (const auto& s : store.read_settled(c, tokens)) route = s.row.ns;
  return logged(
      c, who, {"unknown.resolve", route, nlohmann::json::array({{{"idem_token", token}, {"as", as}}}), note, ""},
      [&](LogEntry&) {
        const claim::Status status = as == "done" ? claim::Status::Done : claim::Status::Failed;
        const auto resolution = store.resolve_by_operator(c, token, status, note);
        if (resolution.redrive)
          return Done{false,
                      "claim " + token + " is being re-driven by reconciliation (" + *resolution.redrive +
                          "): its result settles it; resolve it after that if it is still unknown",
                      nullptr};
        if (!resolution.resolved)
          return Done{false,
                      "no unknown or stuck claim has token " + token +
                          " (it may be done, failed, or still held by a live host)",
                      nullptr};
        // Its outcome event; a letter held back for reconciliation never
        // sent when it is done, published now when it is failed (a dead
        // record is in the DLQ, whoever settled it).
        const size_t events = dlq::write_settlement_events(c, cfg, store, outbox, tokens);
        if (status == claim::Status::Done)
          dlq::Outbox::settle_held(c, tokens);
        else
          dlq::Outbox::publish_settled_failure(c, token, dlq::to_string(dlq::Reason::NotApplied),
                                               "resolved failed by " + who.name + ": " + note);
        return Done{true,
                    "claim " + token + " resolved as " + as + (events ? "; its outcome event is on its way" : ""),
                    {{"idem_token", token}, {"as", as}, {"events", events}}};
      });
}

Done record_round(db::Connection& c, const Actor& who, const std::string& route, const std::string& result,
                  const std::string& note) {
  return logged(c, who, {"unknown.ask", route, nlohmann::json::array(), note, ""}, [&](LogEntry&) {
    return Done{true, "reconcile round: " + result, {{"result", result}}};
  });
}

Done release_hold(db::Connection& c, const Actor& who, const std::string& route, const std::string& order_key,
                  const std::string& note) {
  return logged(c, who, {"holds.release", route, nlohmann::json::array({{{"order_key", order_key}}}), note, ""},
                [&](LogEntry&) {
                  const uint64_t n = claim::OrderHolds::release(c, route, order_key);
                  if (n == 0)
                    return Done{false, "route " + route + " has no hold on order key " + printable(order_key), nullptr};
                  return Done{true,
                              "route " + route + " order key " + printable(order_key) + ": " + std::to_string(n) +
                                  " hold(s) released; its waiting records go on within claim.wait_recheck",
                              {{"released", n}}};
                });
}

}  // namespace idemsink::operate
