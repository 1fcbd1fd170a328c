// Pieces shared by the remote plugins: the standard endpoint options, a
// request body carrying the order, and reporting an HTTP result through the
// SDK's completion using the shared classification.
#pragma once

#include <idemsink/sdk.h>

#include <nlohmann/json.hpp>
#include <string>

#include "plugins/common/http_client.h"

namespace idemsink::plugins {

/// endpoint / timeout / max_connections, declared the same way by every remote plugin.
#define IDEMSINK_REMOTE_OPTIONS(default_endpoint)                                                                \
  {"endpoint", IDEMSINK_OPTION_STRING, default_endpoint, "base URL of the service, http://host:port[/path]"},    \
      {"timeout", IDEMSINK_OPTION_DURATION, "2s", "per-call deadline; no answer by then counts as uncertain"}, { \
    "max_connections", IDEMSINK_OPTION_INT, "64", "keep-alive connections kept open to the service"              \
  }

inline HttpClient::Options client_options(const sdk::Options& o) {
  HttpClient::Options c;
  c.endpoint = parse_url(o.str("endpoint"));
  c.timeout = o.duration("timeout");
  const auto n = o.integer("max_connections");
  if (n < 1 || n > 10000) throw std::invalid_argument("max_connections must be between 1 and 10000");
  c.max_connections = static_cast<size_t>(n);
  return c;
}

/// The record value as JSON when it is JSON, as a string otherwise.
inline nlohmann::json order_payload(const sdk::Record& rec) {
  auto j = nlohmann::json::parse(rec.value(), nullptr, false);
  return j.is_discarded() ? nlohmann::json(std::string(rec.value())) : j;
}

/// Reports an HTTP result; on success the receipt is `field` of the JSON body.
inline void report(const sdk::SharedCompletion& done, const HttpResult& r, const char* field) {
  const idemsink_outcome o = classify(r);
  if (o != IDEMSINK_OUTCOME_OK) return done.report(o, describe(r));
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.contains(field) || !j[field].is_string())
    // The service answered 2xx: the effect happened, only the receipt is unreadable.
    return done.ok("unreadable receipt: " + r.body.substr(0, 200));
  done.ok(j[field].get<std::string>());
}

/// The reconcile answer of a service that can be asked "what did you make
/// for this key?": 404 = certainly not applied, 2xx = applied (receipt in
/// `field`), anything else = cannot tell now.
inline void lookup_receipt(HttpClient& http, const std::string& target, const char* field, const std::string& not_found,
                           sdk::Completion done) {
  // HTTP callbacks are std::function, which must be copyable: share the completion.
  http.request("GET", target, "", {}, [done = sdk::SharedCompletion(std::move(done)), field, not_found](HttpResult r) {
    if (r.failure == HttpResult::Failure::None && r.status == 404) return done.permanent(not_found);
    if (classify(r) != IDEMSINK_OUTCOME_OK) return done.retryable(describe(r));
    report(done, r, field);
  });
}

}  // namespace idemsink::plugins
