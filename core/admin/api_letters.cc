// /api/v1/dead-letters: the list, one whole, and an operator's replay or
// discard.
#include "core/admin/api_call.h"

namespace idemsink::admin {

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

}  // namespace idemsink::admin
