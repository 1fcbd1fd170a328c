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

// The router: what openapi.json documents, each with the Call function that
// answers it; a {name} segment matches any one segment of the path. Null
// answers with the document itself.
struct Api::Endpoint {
  std::string_view method;
  std::string_view path;
  json (Call::*answer)();
};

const Api::Endpoint Api::kEndpoints[] = {
    {"GET", "/openapi.json", nullptr},
    {"GET", "/whoami", &Call::whoami},
    {"GET", "/routes", &Call::routes},
    {"GET", "/routes/{route}", &Call::routes},
    {"POST", "/routes/{route}/pause", &Call::route_action},
    {"POST", "/routes/{route}/resume", &Call::route_action},
    {"POST", "/routes/{route}/rewind", &Call::route_move},
    {"POST", "/routes/{route}/skip", &Call::route_move},
    {"GET", "/partitions", &Call::all_partitions},
    {"GET", "/dead-letters", &Call::letters},
    {"GET", "/dead-letters/{id}", &Call::letters},
    {"POST", "/dead-letters/replay", &Call::letter_action},
    {"POST", "/dead-letters/{id}/discard", &Call::letter_action},
    {"GET", "/unknowns", &Call::unknowns},
    {"GET", "/unknowns/{token}", &Call::unknown},
    {"POST", "/unknowns/{token}/resolve", &Call::unknown_action},
    {"POST", "/unknowns/{token}/ask", &Call::unknown_action},
    {"GET", "/holds", &Call::holds},
    {"POST", "/holds/release", &Call::holds_release},
    {"POST", "/host/pause", &Call::host_action},
    {"POST", "/host/resume", &Call::host_action},
    {"POST", "/host/reload", &Call::host_reload},
    {"GET", "/operator-log", &Call::operator_log},
};

std::vector<std::pair<std::string_view, std::string_view>> Api::endpoints() {
  std::vector<std::pair<std::string_view, std::string_view>> out;
  for (const Endpoint& e : kEndpoints) out.emplace_back(e.method, e.path);
  return out;
}

const Api::Endpoint* Api::endpoint_for(std::string_view method, const std::vector<std::string>& parts) {
  for (const Endpoint& e : kEndpoints) {
    if (e.method != method) continue;
    std::string_view rest = e.path.substr(1);
    size_t i = 0;
    for (; i < parts.size() && !rest.empty(); ++i) {
      const std::string_view segment = rest.substr(0, rest.find('/'));
      if (!segment.starts_with('{') && segment != parts[i]) break;
      rest.remove_prefix(std::min(rest.size(), segment.size() + 1));
    }
    if (i == parts.size() && rest.empty()) return &e;
  }
  return nullptr;
}

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
  try {
    const Endpoint* e = endpoint_for(req.method, call.parts);
    if (e == nullptr)
      throw HttpError{404, "no such endpoint: " + req.method + " " + req.path + " (see /api/v1/openapi.json)"};
    if (e->answer == nullptr) return {200, openapi_document()};
    const json out = (call.*(e->answer))();
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
