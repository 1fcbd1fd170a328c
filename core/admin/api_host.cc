// /api/v1/host and /api/v1/operator-log: the host paused, resumed or
// reloaded, and what operators did.
#include "core/admin/api_call.h"

namespace idemsink::admin {

json Api::Call::host_action() {
  authorize(Need::Host);
  const std::string why = note(body());
  const bool pause = parts[1] == "pause";
  for (const auto& s : (*slices)) s.controls->set_operator_pause(pause);
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

}  // namespace idemsink::admin
