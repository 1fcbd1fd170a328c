#include "core/admin/api.h"

#include "core/admin/api_call.h"

namespace idemsink::admin {

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
