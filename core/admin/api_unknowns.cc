// /api/v1/unknowns and /api/v1/holds: records whose outcome is not known,
// asked about or resolved, and the holds of an ordered route's entities.
#include "core/admin/api_call.h"

namespace idemsink::admin {

json Api::Call::unknowns() {
  authorize(Need::Read);
  const std::string route = param("route");
  if (!route.empty()) slice_of(route);
  const size_t limit = number("limit", 100, 1000);
  json out = json::array();
  for (const auto& s : (*slices)) {
    std::vector<claim::ClaimStore::Namespace> names;
    for (const auto& rc : s.cfg->routes)
      if (route.empty() || rc.name == route) names.push_back({rc.name, std::chrono::milliseconds(0)});
    if (names.empty()) continue;
    db::Connection c(s.cfg->database);
    const claim::ClaimStore store(s.cfg->host.id, s.cfg->host.id + "#console", s.cfg->claim.lease);
    for (const auto& u : store.unsettled(c, names, s.cfg->claim.stuck_after, limit, true))
      out.push_back({{"route", u.row.ns},
                     {"biz_key", u.row.biz_key},
                     {"status", claim::to_string(u.status)},
                     {"attempt", u.attempt},
                     {"calls", u.calls},
                     {"idem_token", u.idem_token},
                     {"source", {{"topic", u.src_topic}, {"partition", u.src_partition}, {"offset", u.src_offset}}},
                     {"last_error", u.last_error},
                     {"updated_at", u.updated_at}});
  }
  return {{"unknowns", out}};
}

namespace {

// What the route's reconcile hook answers about `claim` now, or null when it
// does not answer within the route's call timeout and 2 s more.
json hook_answer(const SliceView& s, const claim::ClaimStore::Settled& claim, const std::optional<std::string>& key,
                 const std::optional<std::string>& value, int64_t timestamp_ms) {
  auto answer = std::make_shared<std::promise<std::pair<idemsink_outcome, std::string>>>();
  auto asked = answer->get_future();
  if (s.reconciler->ask_hook(claim, key, value, timestamp_ms, [answer](idemsink_outcome o, std::string detail) {
        answer->set_value({o, std::move(detail)});
      })) {
    const auto deadline = s.cfg->route_by_name(claim.row.ns)->call_timeout + std::chrono::seconds(2);
    if (asked.wait_for(deadline) == std::future_status::ready) {
      const auto [o, detail] = asked.get();
      return {{"answer", answer_name(o)}, {"detail", sanitize_utf8(detail, 1024)}};
    }
  }
  return nullptr;
}

}  // namespace

// GET /unknowns/{token}: the claim, its record, and what the route's
// reconcile hook answers now (nothing is settled by asking).
json Api::Call::unknown() {
  authorize(Need::Read);
  const std::string& token = parts[1];
  const std::vector<std::string> tokens{token};
  std::optional<claim::ClaimStore::Settled> claim;
  std::optional<std::string> key, value;
  int64_t timestamp_ms = 0;
  const SliceView* s = find_in_slices([&](db::Connection& c, const SliceView& sv) {
    const claim::ClaimStore store(sv.cfg->host.id, sv.cfg->host.id + "#console", sv.cfg->claim.lease);
    for (auto& found : store.read_settled(c, tokens))
      if (sv.cfg->route_by_name(found.row.ns)) claim = found;
    if (!claim) return false;
    if (auto m = dlq::newest_message(c, token)) {
      key = std::move(m->key);
      value = std::move(m->value);
      timestamp_ms = m->timestamp_ms;
    }
    return true;
  });
  if (s == nullptr) throw HttpError{404, "no claim has token " + token};
  json j = {
      {"route", claim->row.ns},
      {"biz_key", claim->row.biz_key},
      {"status", claim::to_string(claim->status)},
      {"attempt", claim->attempt},
      {"calls", claim->calls},
      {"idem_token", token},
      {"receipt", claim->receipt},
      {"last_error", claim->last_error},
      {"source", {{"topic", claim->src_topic}, {"partition", claim->src_partition}, {"offset", claim->src_offset}}},
      {"key", bytes_json(key)},
      {"value", bytes_json(value)},
      {"hook", nullptr}};
  // Asking makes the host call the remote: only for an operator of the
  // route (a viewer reads the claim and its record), and a few at a time
  // (each question holds one of the port's request slots).
  if (s->reconciler == nullptr) return j;
  if (!api.auth_.check(Need::Route, req.authorization, req.origin, req.host, req.scheme, claim->row.ns).caller) {
    j["hook"] = {{"answer", "not_asked"}, {"detail", "asking the remote needs an operator of route " + claim->row.ns}};
    return j;
  }
  if (api.hook_questions_.fetch_add(1) >= Api::kMaxHookQuestions) {
    api.hook_questions_.fetch_sub(1);
    j["hook"] = {{"answer", "not_asked"},
                 {"detail", std::to_string(Api::kMaxHookQuestions) + " questions to remotes are running; ask again"}};
    return j;
  }
  j["hook"] = hook_answer(*s, *claim, key, value, timestamp_ms);
  api.hook_questions_.fetch_sub(1);
  return j;
}

// POST /unknowns/{token}/resolve {"as", "note"}; POST /unknowns/{token}/ask {"note"}
json Api::Call::unknown_action() {
  authorize(Need::Act);
  const std::string& token = parts[1];
  const std::vector<std::string> tokens{token};
  std::string route;
  const SliceView* s = find_in_slices([&](db::Connection& c, const SliceView& sv) {
    const claim::ClaimStore store(sv.cfg->host.id, sv.cfg->host.id + "#console", sv.cfg->claim.lease);
    for (auto& found : store.read_settled(c, tokens))
      if (sv.cfg->route_by_name(found.row.ns)) route = found.row.ns;
    return !route.empty();
  });
  if (s == nullptr) throw HttpError{404, "no claim has token " + token};
  authorize(Need::Route, route);
  const json b = body();
  if (parts[2] == "resolve") {
    const std::string as = text(b, "as", true);
    if (as != "done" && as != "failed") throw HttpError{400, "as must be \"done\" or \"failed\", not \"" + as + "\""};
    const std::string why = note(b);
    db::Connection c(s->cfg->database);
    return done_json(operate::resolve(c, *s->cfg, actor(), token, as, why));
  }
  // Ask again: a reconcile round of the claim's route now, as the host runs
  // one every claim.reconcile_interval; its result goes to the operator log.
  if (s->reconciler == nullptr) throw HttpError{409, "route " + route + " has no reconcile hook"};
  auto done = std::make_shared<std::promise<reconcile::ReconcileSummary>>();
  auto round = done->get_future();
  s->reconciler->run_once_on_engine([done](reconcile::ReconcileSummary r) { done->set_value(r); }, route);
  if (round.wait_for(std::chrono::seconds(30)) != std::future_status::ready)
    throw HttpError{503, "the reconcile round did not end within 30 s; it goes on"};
  db::Connection c(s->cfg->database);
  return done_json(operate::record_round(c, actor(), route, reconcile::describe(round.get()), text(b, "note", false)));
}

json Api::Call::holds() {
  authorize(Need::Read);
  const std::string route = param("route");
  if (!route.empty()) slice_of(route);
  json out = json::array();
  for (const auto& s : (*slices)) {
    std::vector<std::string> hold_on_dead;
    for (const auto& rc : s.cfg->routes)
      if (rc.order_by.hold_on_dead()) hold_on_dead.push_back(rc.name);
    db::Connection c(s.cfg->database);
    for (const auto& h : claim::OrderHolds::list(c, route, hold_on_dead, number("limit", 200, 1000)))
      if (s.cfg->route_by_name(h.ns))
        out.push_back({{"id", h.id},
                       {"route", h.ns},
                       {"order_key", h.order_key},
                       {"held_by", h.biz_key},
                       {"status", claim::to_string(h.status)},
                       {"origin", h.origin},
                       {"since", h.since}});
  }
  return {{"holds", out}};
}

// POST /holds/release {"route", "order_key", "note"}
json Api::Call::holds_release() {
  authorize(Need::Act);
  const json b = body();
  const std::string route = text(b, "route", true);
  const SliceView& s = slice_of(route);
  authorize(Need::Route, route);
  const std::string order_key = text(b, "order_key", true);
  const std::string why = note(b);
  db::Connection c(s.cfg->database);
  return done_json(operate::release_hold(c, actor(), route, order_key, why));
}

// POST /host/pause|resume {"note"}: this host stops (or resumes) fetching
// every partition; its consumer stays in the group. Not kept in a database:
// the entry in the log says who did it.

}  // namespace idemsink::admin
