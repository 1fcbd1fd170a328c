// /api/v1/routes and /api/v1/partitions: what each route does now, its
// pause, resume, rewind and skip.
#include "core/admin/api_call.h"

namespace idemsink::admin {

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
  for (const auto& v : s.controls->route_pauses())
    if (v.route == rc.name) {
      j["paused"] = v.paused;
      j["paused_by"] = v.changed_by;
      j["paused_at"] = v.changed_at;
    }
  return j;
}

json Api::Call::whoami() {
  authorize(Need::Read);
  return {{"name", caller.name}, {"role", to_string(caller.role)}, {"routes", caller.routes}};
}

json Api::Call::all_partitions() {
  authorize(Need::Read);
  return {{"partitions", partitions()}};
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
    db::Connection c(s.cfg->database);
    const std::map<std::string, int64_t> unknown = claim::count_by_route(c, Status::Unknown);
    const std::map<std::string, int64_t> letters = dlq::open_letters_by_route(c);
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
  s.controls->route_pause_stored(route, pause, caller.name);  // here at once, the others within 2 s
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

}  // namespace idemsink::admin
