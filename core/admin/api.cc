#include "core/admin/api.h"

#include "core/admin/url.h"

#include <openssl/evp.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <functional>
#include <future>

#include "core/admin/console.h"
#include "core/claim/order_hold.h"
#include "core/common/log.h"
#include "core/common/util.h"
#include "core/db/connection.h"
#include "core/dlq/letters.h"
#include "core/metrics/metrics.h"
#include "core/offline/offset_move.h"
#include "core/offline/replay.h"
#include "core/operate/actions.h"
#include "core/operate/operator_log.h"
#include "core/pipeline/engine.h"
#include "core/reconcile/reconciler.h"

namespace idemsink::admin {
namespace {

using claim::Status;
using nlohmann::json;

// An answer other than 200, thrown by a handler.
struct HttpError {
  int status;
  std::string message;
};

std::string base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

// Bytes as JSON: text when it is UTF-8, and always base64.
json bytes_json(const std::optional<std::string>& b) {
  if (!b) return nullptr;
  json j = {{"base64", base64(*b)}};
  if (sanitize_utf8(*b, b->size()) == *b) j["text"] = *b;
  return j;
}

json letter_json(const dlq::LetterRow& l, bool whole) {
  json j = {{"id", l.id},
            {"route", l.route},
            {"reason", l.reason},
            {"error", l.error},
            {"biz_key", l.biz_key ? json(*l.biz_key) : json(nullptr)},
            {"source", {{"topic", l.src_topic}, {"partition", l.src_partition}, {"offset", l.src_offset}}},
            {"idem_token", l.idem_token},
            {"calls", l.calls},
            {"created_at", l.created_at},
            {"state", l.state},
            {"claim_status", l.claim_status},
            {"discard_note", l.discard_note}};
  if (!whole) return j;
  j["key"] = bytes_json(l.key);
  j["value"] = bytes_json(l.value);
  j["timestamp_ms"] = l.timestamp_ms;
  j["headers"] = json::array();
  for (const auto& h : l.headers) j["headers"].push_back({{"name", h.name}, {"value", bytes_json(h.value)}});
  return j;
}

// A dead letter's record as its route reads it: the value and key decoded,
// or why not. Schemas this host has not fetched are asked for, never waited
// for on an API thread: the answer says to look again.
json decoded_json(const dlq::LetterRow& l, const format::RecordDecoder& decoder) {
  const auto d = decoder.decode(l.value ? std::optional<std::string_view>(*l.value) : std::nullopt,
                                l.key ? std::optional<std::string_view>(*l.key) : std::nullopt);
  auto parsed = [](const std::optional<std::string>& text) {
    json j = text ? json::parse(*text, nullptr, false) : json(nullptr);
    return j.is_discarded() ? json(nullptr) : j;  // a key that is not JSON: the problem says so
  };
  json j = {{"value", parsed(d.value_json)}, {"key", parsed(d.key_json)}};
  if (d.registry) {
    d.registry->when_cached(d.schema_id, [] {});
    j["problem"] = "schema id " + std::to_string(d.schema_id) + " is not fetched by this host yet (" +
                   (d.registry->up() ? "asked for now" : "the registry: " + d.registry->problem()) +
                   "): look again in a moment";
  } else if (d.undecodable) {
    j["problem"] = *d.undecodable;
  }
  return j;
}

const char* answer_name(idemsink_outcome o) {
  switch (o) {
    case IDEMSINK_OUTCOME_OK: return "applied";
    case IDEMSINK_OUTCOME_PERMANENT: return "not_applied";
    default: return "cannot_tell";
  }
}

}  // namespace

// One request: who asks, its parts, and the helpers every endpoint uses.
struct Api::Call {
  const Api& api;
  const ApiRequest& req;
  std::vector<std::string> parts;  // the path after /api/v1, split at '/'
  Caller caller;
  // The slices as the request began (a reload may add or remove routes meanwhile).
  const std::shared_ptr<const std::vector<SliceView>> slices = api.slices_.get();

  void authorize(Need need, const std::string& route = "") {
    const Auth::Verdict v = api.auth_.check(need, req.authorization, req.origin, req.host, req.scheme, route);
    if (!v.caller) throw HttpError{v.status, v.why};
    caller = *v.caller;
  }
  operate::Actor actor() const { return {caller.name, to_string(caller.role)}; }

  // Query parameters.
  std::string param(const std::string& name) const {
    const auto it = req.query.find(name);
    if (it == req.query.end()) return "";
    if (sanitize_utf8(it->second, it->second.size()) != it->second) throw HttpError{400, name + " is not UTF-8 text"};
    return it->second;
  }
  uint64_t number(const std::string& name, uint64_t fallback, uint64_t max) const {
    const std::string v = param(name);
    if (v.empty()) return fallback;
    uint64_t n = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || end != v.data() + v.size() || n > max)
      throw HttpError{400, name + " must be a whole number up to " + std::to_string(max) + ", not \"" + v + "\""};
    return n;
  }
  // The POST body.
  json body() const {
    const json j = json::parse(req.body.empty() ? "{}" : req.body, nullptr, false);
    if (!j.is_object()) throw HttpError{400, "the body must be a JSON object"};
    return j;
  }
  static std::string text(const json& b, const char* name, bool required) {
    if (!b.contains(name)) {
      if (required) throw HttpError{400, std::string(name) + " is required"};
      return "";
    }
    if (!b[name].is_string()) throw HttpError{400, std::string(name) + " must be a string"};
    return b[name].get<std::string>();
  }
  static std::string note(const json& b) {
    const std::string n = text(b, "note", true);
    if (n.find_first_not_of(" \t\n") == std::string::npos) throw HttpError{400, "note must say why"};
    return n;
  }

  const SliceView& slice_of(const std::string& route) const {
    for (const auto& s : (*slices))
      if (s.cfg->route_by_name(route)) return s;
    throw HttpError{404, "no route named " + route};
  }
  // The slice holding a claim or letter, found by asking each database.
  template <class Found>
  const SliceView* find_in_slices(Found&& found) const {
    for (const auto& s : (*slices)) {
      db::Connection c(s.cfg->database);
      if (found(c, s)) return &s;
    }
    return nullptr;
  }
  // The databases a dead letter's id may belong to: ids are per database, so
  // with several the request names the route (`route=`).
  std::vector<const SliceView*> slices_of_letter(const std::string& route_in_body = "") const {
    const std::string route = route_in_body.empty() ? param("route") : route_in_body;
    if (!route.empty()) return {&slice_of(route)};
    if ((*slices).size() > 1)
      throw HttpError{400, "routes use several databases and dead letter ids are per database: name the route"};
    return {&(*slices).front()};
  }
  static json done_json(const operate::Done& d) {
    if (!d.ok) throw HttpError{409, d.message};
    return {{"ok", true}, {"message", d.message}, {"detail", d.detail}};
  }

  json route_json(const config::RouteConfig& rc, const SliceView& s, const std::map<std::string, int64_t>& unknown,
                  const std::map<std::string, int64_t>& letters, const json& lag) const;
  json routes();
  json partitions() const;
  json route_action();
  json letters();
  json letter_action();
  json unknowns();
  json unknown();
  json unknown_action();
  json holds();
  json holds_release();
  json host_action();
  json host_reload();
  json route_move();
  json operator_log();
};

json Api::Call::route_json(const config::RouteConfig& rc, const SliceView& s,
                           const std::map<std::string, int64_t>& unknown, const std::map<std::string, int64_t>& letters,
                           const json& lag) const {
  metrics::RouteMetrics& m = api.metrics_.route(rc.name);
  json j = {{"name", rc.name},
            {"topic", rc.topic},
            {"group", rc.group_id},
            {"database", s.cfg->database.label()},
            {"circuit_open", m.circuit_open.load() != 0},
            {"in_flight", m.in_flight.load()},
            {"lag", lag},
            {"rate", api.rate(rc.name, m.done.load())},
            {"counters",
             {{"consumed", m.consumed.load()},
              {"done", m.done.load()},
              {"dead", m.dead.load()},
              {"unknown", m.unknown.load()},
              {"duplicates", m.duplicates.load()},
              {"skipped", m.skipped.load()},
              {"retries", m.retries.load()}}},
            {"letters_pending", m.dlq_pending.load()},
            {"letters_unpublishable", m.dlq_unpublishable.load()},
            {"dead_letters", letters.count(rc.name) ? letters.at(rc.name) : 0},
            {"unknown_now", unknown.count(rc.name) ? unknown.at(rc.name) : 0},
            {"order_holds", m.order_holds.load()},
            {"paused", false}};
  for (const auto& v : s.engine->route_control().view())
    if (v.route == rc.name) {
      j["paused"] = v.state.paused;
      j["paused_by"] = v.state.changed_by;
      j["paused_at"] = v.state.changed_at;
    }
  return j;
}

json Api::Call::partitions() const {
  // Each partition as a route reads it (routes of one topic, apart).
  const json status = json::parse(api.metrics_.status_json("", false), nullptr, false);
  return status.value("partitions", json::array());
}

json Api::Call::routes() {
  authorize(Need::Read);
  const json parts_now = partitions();
  json out = json::array();
  for (const auto& s : (*slices)) {
    std::map<std::string, int64_t> unknown, letters;
    db::Connection c(s.cfg->database);
    for (auto& r : c.query("SELECT namespace, COUNT(*) FROM idemsink_claim WHERE " +
                           claim::sql_status_is(Status::Unknown) + " GROUP BY namespace"))
      unknown[*r[0]] = std::stoll(*r[1]);
    for (auto& r : c.query("SELECT route, COUNT(*) FROM idemsink_dlq_outbox WHERE " +
                           dlq::sql_purpose_is(dlq::Purpose::DeadLetter) + " AND discarded_at IS NULL GROUP BY route"))
      letters[*r[0]] = std::stoll(*r[1]);
    for (const auto& rc : s.cfg->routes) {
      if (parts.size() > 1 && parts[1] != rc.name) continue;
      // The route's lag: null while a partition's is not known yet.
      json lag = 0;
      for (const auto& p : parts_now)
        if (p.value("route", "") == rc.name)
          lag =
              lag.is_null() || p["lag"].is_null() ? json(nullptr) : json(lag.get<int64_t>() + p["lag"].get<int64_t>());
      json j = route_json(rc, s, unknown, letters, lag);
      if (parts.size() > 1) {
        j["partitions"] = json::array();
        for (const auto& p : parts_now)
          if (p.value("route", "") == rc.name) j["partitions"].push_back(p);
        return j;
      }
      out.push_back(std::move(j));
    }
  }
  if (parts.size() > 1) throw HttpError{404, "no route named " + parts[1]};
  return out;
}

// POST /routes/{route}/pause|resume {"note"}
json Api::Call::route_action() {
  const std::string& route = parts[1];
  authorize(Need::Act);  // who first: nothing about the host is told to a stranger
  const SliceView& s = slice_of(route);
  authorize(Need::Route, route);
  const std::string why = note(body());
  const bool pause = parts[2] == "pause";
  db::Connection c(s.cfg->database);
  json out = done_json(operate::pause_route(c, *s.cfg, actor(), route, pause, why));
  s.engine->route_control().stored(route, pause, caller.name);  // here at once, the others within 2 s
  return out;
}

// POST /routes/NAME/rewind|skip {note, to_time | to_offsets: [{partition,
// offset}]}: the route's offsets move on every host (claim/offset_moves.h).
json Api::Call::route_move() {
  const std::string& route = parts[1];
  authorize(Need::Act);
  const SliceView& s = slice_of(route);
  authorize(Need::Route, route);
  const json b = body();
  const std::string why = note(b);
  offline::MoveAsk ask;
  ask.route = route;
  ask.kind = parts[2] == "skip" ? claim::OffsetMove::Kind::Skip : claim::OffsetMove::Kind::Rewind;
  const std::string to_time = text(b, "to_time", false);
  if (!to_time.empty()) {
    if (ask.kind == claim::OffsetMove::Kind::Skip) throw HttpError{400, "a skip names its offsets (to_offsets)"};
    try {
      ask.to_time_ms = offline::point_in_time_ms(to_time);
    } catch (const std::invalid_argument& e) {
      throw HttpError{400, e.what()};
    }
  }
  if (b.contains("to_offsets")) {
    if (!b["to_offsets"].is_array()) throw HttpError{400, "to_offsets must be a list of {partition, offset}"};
    for (const auto& t : b["to_offsets"]) {
      if (!t.is_object() || !t.contains("partition") || !t.contains("offset") || !t["partition"].is_number_integer() ||
          !t["offset"].is_number_integer() || t["partition"].get<int64_t>() < 0 ||
          t["partition"].get<int64_t>() > INT32_MAX || t["offset"].get<int64_t>() < 0)
        throw HttpError{400, "to_offsets must be a list of {partition, offset}, both whole numbers, not negative"};
      ask.to_offsets.push_back({t["partition"].get<int32_t>(), t["offset"].get<int64_t>()});
    }
  }
  if (ask.to_time_ms.has_value() == !ask.to_offsets.empty())
    throw HttpError{400, "say where to: to_time or to_offsets (one of them)"};
  db::Connection c(s.cfg->database);
  try {
    return done_json(operate::move_offsets(c, *s.cfg, actor(), ask, why));
  } catch (const offline::KafkaUnavailable& e) {
    throw HttpError{503, std::string("Kafka did not answer: ") + e.what()};
  }
}

json Api::Call::letters() {
  authorize(Need::Read);
  if (parts.size() > 1) {
    uint64_t id = 0;
    const auto [end, ec] = std::from_chars(parts[1].data(), parts[1].data() + parts[1].size(), id);
    if (ec != std::errc() || end != parts[1].data() + parts[1].size())
      throw HttpError{400, "a dead letter's id is a number, not \"" + parts[1] + "\""};
    for (const SliceView* s : slices_of_letter()) {
      db::Connection c(s->cfg->database);
      if (auto l = dlq::letter(c, id); l && s->cfg->route_by_name(l->route)) {
        json j = letter_json(*l, true);
        if (auto d = s->decoders.find(l->route); d != s->decoders.end()) j["decoded"] = decoded_json(*l, *d->second);
        return j;
      }
    }
    throw HttpError{404, "no dead letter has id " + parts[1]};
  }
  dlq::LetterQuery q;
  q.route = param("route");
  if (!q.route.empty()) slice_of(q.route);
  q.reason = param("reason");
  q.key = param("key");
  if (!param("since").empty()) {
    try {
      q.since = offline::since_expression(param("since"));
    } catch (const std::invalid_argument& e) {
      throw HttpError{400, e.what()};
    }
  }
  q.include_discarded = param("discarded") == "true";
  q.limit = number("limit", 50, 500);
  q.before_id = number("before", 0, UINT64_MAX);
  json out = json::array();
  for (const auto& s : (*slices)) {
    if (!q.route.empty() && !s.cfg->route_by_name(q.route)) continue;
    db::Connection c(s.cfg->database);
    for (const auto& l : dlq::list_letters(c, q))
      if (s.cfg->route_by_name(l.route)) out.push_back(letter_json(l, false));
  }
  return {{"letters", out}};
}

// POST /dead-letters/replay {"route", "ids", "reason", "since", "key", "dry_run", "note"}
// POST /dead-letters/{id}/discard {"note"}
json Api::Call::letter_action() {
  authorize(Need::Act);
  const json b = body();
  if (parts[1] == "replay") {
    operate::ReplayRequest r;
    r.route = text(b, "route", true);
    const SliceView& s = slice_of(r.route);
    authorize(Need::Route, r.route);
    if (b.contains("ids")) {
      if (!b["ids"].is_array()) throw HttpError{400, "ids must be an array of dead letter ids"};
      for (const auto& id : b["ids"]) {
        if (!id.is_number_unsigned()) throw HttpError{400, "ids must be an array of dead letter ids"};
        r.letter_ids.push_back(id.get<uint64_t>());
      }
      if (r.letter_ids.empty()) throw HttpError{400, "ids is empty: name the letters, or leave ids out for all"};
    }
    if (const std::string v = text(b, "reason", false); !v.empty()) r.reason = v;
    if (const std::string v = text(b, "key", false); !v.empty()) r.key = v;
    if (const std::string v = text(b, "since", false); !v.empty()) {
      try {
        offline::since_expression(v);
      } catch (const std::invalid_argument& e) {
        throw HttpError{400, e.what()};
      }
      r.since = v;
    }
    if (b.contains("dry_run") && !b["dry_run"].is_boolean()) throw HttpError{400, "dry_run must be true or false"};
    r.dry_run = b.value("dry_run", false);
    const std::string why = r.dry_run ? text(b, "note", false) : note(b);
    db::Connection c(s.cfg->database);
    return done_json(operate::replay(c, *s.cfg, actor(), r, why));
  }
  uint64_t id = 0;
  const auto [end, ec] = std::from_chars(parts[1].data(), parts[1].data() + parts[1].size(), id);
  if (ec != std::errc() || end != parts[1].data() + parts[1].size() || parts.size() != 3 || parts[2] != "discard")
    throw HttpError{404, "POST /dead-letters/replay or /dead-letters/{id}/discard"};
  const SliceView* s = slices_of_letter(text(b, "route", false)).front();
  std::optional<dlq::LetterRow> found;
  {
    db::Connection c(s->cfg->database);
    found = dlq::letter(c, id);
  }
  if (!found || !s->cfg->route_by_name(found->route)) throw HttpError{404, "no dead letter has id " + parts[1]};
  authorize(Need::Route, found->route);
  const std::string why = note(b);
  db::Connection c(s->cfg->database);
  return done_json(operate::discard_letter(c, actor(), id, why));
}

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
    for (auto& r : c.query("SELECT msg_key, msg_value, msg_timestamp FROM idemsink_dlq_outbox WHERE idem_token = " +
                           c.quote(token) + " ORDER BY id DESC LIMIT 1")) {
      key = r[0];
      value = r[1];
      timestamp_ms = std::stoll(*r[2]);
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
  auto answer = std::make_shared<std::promise<std::pair<idemsink_outcome, std::string>>>();
  auto asked = answer->get_future();
  if (s->reconciler->ask_hook(*claim, key, value, timestamp_ms, [answer](idemsink_outcome o, std::string detail) {
        answer->set_value({o, std::move(detail)});
      })) {
    const auto deadline = s->cfg->route_by_name(claim->row.ns)->call_timeout + std::chrono::seconds(2);
    if (asked.wait_for(deadline) == std::future_status::ready) {
      const auto [o, detail] = asked.get();
      j["hook"] = {{"answer", answer_name(o)}, {"detail", sanitize_utf8(detail, 1024)}};
    }
  }
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
json Api::Call::host_action() {
  authorize(Need::Host);
  const std::string why = note(body());
  const bool pause = parts[1] == "pause";
  for (const auto& s : (*slices)) s.engine->set_operator_pause(pause);
  std::string result = std::string("host ") + api.cfg_.host.id + (pause ? " paused" : " resumed");
  // Done in memory whatever the database says: a pause must work while it is down.
  try {
    db::Connection c((*slices).front().cfg->database);
    c.begin();
    operate::OperatorLog::append(c, actor(), {pause ? "host.pause" : "host.resume", "", json::array(), why, result});
    c.commit();
  } catch (const db::DbError& e) {
    spdlog::warn("admin: {} by {}; the operator log did not take it: {}", result, caller.name, e.what());
    result += "; not in the operator log (the database did not take it: " + std::string(e.what()) + ")";
  }
  return {{"ok", true}, {"message", result}};
}

// POST /host/reload {"note", "force"}: this host reads its config file
// again (app/host.h); 409 when it changed nothing, saying why.
json Api::Call::host_reload() {
  authorize(Need::Host);
  const json b = body();
  const std::string why = note(b);
  if (b.contains("force") && !b["force"].is_boolean()) throw HttpError{400, "force must be true or false"};
  const bool force = b.value("force", false);
  if (!api.reload_) throw HttpError{503, "this host does not reload"};
  const operate::Done done = api.reload_(actor(), force, why);
  if (!done.ok) throw HttpError{409, done.message};
  return {{"ok", true}, {"message", done.message}, {"detail", done.detail}};
}

json Api::Call::operator_log() {
  authorize(Need::Read);
  const std::string route = param("route");
  const size_t limit = number("limit", 100, 1000);
  std::vector<operate::LoggedAction> all;
  for (const auto& s : (*slices)) {
    db::Connection c(s.cfg->database);
    for (auto& a : operate::OperatorLog::list(c, route, limit, number("before", 0, UINT64_MAX))) all.push_back(a);
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.at > b.at; });
  if (all.size() > limit) all.resize(limit);
  json out = json::array();
  for (const auto& a : all) out.push_back(operate::to_json(a));
  return {{"actions", out}};
}

double Api::rate(const std::string& route, uint64_t done) const {
  constexpr auto kRateWindow = std::chrono::seconds(5);
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lk(rate_mu_);
  auto [it, fresh] = rates_.try_emplace(route, Sample{now, done, 0});
  Sample& s = it->second;
  if (!fresh && now - s.at >= kRateWindow) {
    s.rate = static_cast<double>(done - std::min(done, s.done)) / std::chrono::duration<double>(now - s.at).count();
    s.at = now;
    s.done = done;
  }
  return s.rate;
}

Api::Api(const config::Config& cfg, const SliceViews& slices, metrics::Metrics& metrics, const Auth& auth,
         Reload reload)
    : cfg_(cfg), slices_(slices), metrics_(metrics), auth_(auth), reload_(std::move(reload)) {}

ApiResponse Api::handle(const ApiRequest& req) const {
  Call call{*this, req, {}, {}};
  std::string_view rest = std::string_view(req.path).substr(std::string_view("/api/v1").size());
  while (!rest.empty()) {
    if (rest.front() == '/') rest.remove_prefix(1);
    const size_t slash = rest.find('/');
    if (!rest.empty()) call.parts.push_back(percent_decode(rest.substr(0, slash)));
    if (slash == std::string_view::npos) break;
    rest.remove_prefix(slash);
  }
  const auto& p = call.parts;
  const bool get = req.method == "GET", post = req.method == "POST";
  const std::string first = p.empty() ? "" : p[0];
  try {
    json out;
    if (get && first == "openapi.json" && p.size() == 1) return {200, openapi_document()};
    if (get && first == "whoami" && p.size() == 1) {
      call.authorize(Need::Read);
      out = {{"name", call.caller.name}, {"role", to_string(call.caller.role)}, {"routes", call.caller.routes}};
    } else if (get && first == "routes" && p.size() <= 2) {
      out = call.routes();
    } else if (post && first == "routes" && p.size() == 3 && (p[2] == "pause" || p[2] == "resume")) {
      out = call.route_action();
    } else if (post && first == "routes" && p.size() == 3 && (p[2] == "rewind" || p[2] == "skip")) {
      out = call.route_move();
    } else if (get && first == "partitions" && p.size() == 1) {
      call.authorize(Need::Read);
      out = {{"partitions", call.partitions()}};
    } else if (get && first == "dead-letters" && p.size() <= 2) {
      out = call.letters();
    } else if (post && first == "dead-letters" && p.size() >= 2) {
      out = call.letter_action();
    } else if (get && first == "unknowns" && p.size() == 1) {
      out = call.unknowns();
    } else if (get && first == "unknowns" && p.size() == 2) {
      out = call.unknown();
    } else if (post && first == "unknowns" && p.size() == 3 && (p[2] == "resolve" || p[2] == "ask")) {
      out = call.unknown_action();
    } else if (get && first == "holds" && p.size() == 1) {
      out = call.holds();
    } else if (post && first == "holds" && p.size() == 2 && p[1] == "release") {
      out = call.holds_release();
    } else if (post && first == "host" && p.size() == 2 && (p[1] == "pause" || p[1] == "resume")) {
      out = call.host_action();
    } else if (post && first == "host" && p.size() == 2 && p[1] == "reload") {
      out = call.host_reload();
    } else if (get && first == "operator-log" && p.size() == 1) {
      out = call.operator_log();
    } else {
      throw HttpError{404, "no such endpoint: " + req.method + " " + req.path + " (see /api/v1/openapi.json)"};
    }
    return {200, out.dump(2, ' ', false, json::error_handler_t::replace) + "\n"};
  } catch (const HttpError& e) {
    return {e.status, json{{"error", e.message}}.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"};
  } catch (const db::DbError& e) {
    return {503, json{{"error", std::string("the database did not answer: ") + e.what()}}.dump(
                     -1, ' ', false, json::error_handler_t::replace) +
                     "\n"};
  }
}

}  // namespace idemsink::admin
