// The admin API's request, shared by the files that answer it (private to
// admin/): api.cc routes a request to its resource, api_routes.cc,
// api_letters.cc, api_unknowns.cc and api_host.cc answer them, api_json.cc
// holds the JSON every resource writes.
#pragma once

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
#include "core/pipeline/controls.h"
#include "core/reconcile/reconciler.h"

namespace idemsink::admin {

using claim::Status;
using nlohmann::json;

// An answer other than 200, thrown by a handler.
struct HttpError {
  int status;
  std::string message;
};

// Bytes as JSON: text when it is UTF-8, and always base64.
json bytes_json(const std::optional<std::string>& b);
json letter_json(const dlq::LetterRow& l, bool whole);
// A dead letter's record as its route reads it: the value and key decoded,
// or why not. Schemas this host has not fetched are asked for, never waited
// for on an API thread: the answer says to look again.
json decoded_json(const dlq::LetterRow& l, const format::RecordDecoder& decoder);
const char* answer_name(idemsink_outcome o);

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
  json whoami();
  json routes();
  json partitions() const;
  json all_partitions();
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

}  // namespace idemsink::admin
