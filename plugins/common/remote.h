// Pieces shared by the remote plugins: the standard endpoint options, a
// request body carrying the order, and reporting an HTTP result through the
// SDK's completion using the shared classification.
#pragma once

#include <idemsink/sdk.h>

#include <algorithm>
#include <sys/stat.h>

#include <boost/beast/core/detail/base64.hpp>
#include <boost/beast/core/string.hpp>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <charconv>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <simdjson.h>
#include <string>
#include <string_view>

#include "plugins/common/http_client.h"

namespace idemsink::plugins {

/// endpoint / timeout / max_connections, declared the same way by every remote plugin.
#define IDEMSINK_REMOTE_OPTIONS(default_endpoint)                                                                 \
  {"endpoint", IDEMSINK_OPTION_STRING, default_endpoint, "base URL of the service, http[s]://host:port[/path]"},  \
      {"tls_ca", IDEMSINK_OPTION_STRING, "",                                                                      \
       "https: CA file the service's certificate must chain to (default: the system's CAs)"},                     \
      {"tls_verify", IDEMSINK_OPTION_BOOL, "true", "https: check the service's certificate and host name"},       \
      {"timeout", IDEMSINK_OPTION_DURATION, "2s", "per-call deadline; no answer by then counts as uncertain"},    \
      {"max_connections", IDEMSINK_OPTION_INT, "64",                                                              \
       "keep-alive connections to the service, one call each at a time"},                                         \
      {"oauth_token_url", IDEMSINK_OPTION_STRING, "",                                                             \
       "OAuth 2.0 client credentials: the token endpoint; every request carries its bearer token"},               \
      {"oauth_client_id", IDEMSINK_OPTION_STRING, "", "OAuth: the client id"},                                    \
      {"oauth_client_secret_env", IDEMSINK_OPTION_STRING, "",                                                     \
       "OAuth: the environment variable holding the client secret"},                                              \
      {"oauth_client_secret_file", IDEMSINK_OPTION_STRING, "",                                                    \
       "OAuth: a file holding the client secret, readable by its owner only"},                                    \
      {"oauth_scope", IDEMSINK_OPTION_STRING, "", "OAuth: scopes to ask for, space-separated"}, {                 \
    "headers", IDEMSINK_OPTION_STRING, "",                                                                        \
        "extra request headers, \"Name: value\" separated by \";\" (e.g. \"Authorization: Bearer ${API_TOKEN}\")" \
  }

/// The oauth_* options: the secret from the environment or from a file only
/// its owner can read, never from the config file; throws
/// std::invalid_argument naming the option (never the secret).
inline OAuthOptions oauth_options(const sdk::Options& o, const HttpClient::Options& c) {
  OAuthOptions a;
  a.token_url = o.str("oauth_token_url");
  const std::string id = o.str("oauth_client_id"), env = o.str("oauth_client_secret_env"),
                    file = o.str("oauth_client_secret_file");
  if (a.token_url.empty()) {
    if (!id.empty() || !env.empty() || !file.empty() || !o.str("oauth_scope").empty())
      throw std::invalid_argument("oauth_token_url: is required by the other oauth_* options");
    return a;
  }
  parse_url(a.token_url);  // throws naming the URL's problem
  if (id.empty()) throw std::invalid_argument("oauth_client_id: is required with oauth_token_url");
  if (env.empty() == file.empty())
    throw std::invalid_argument(
        "oauth_client_secret_env: set one of oauth_client_secret_env and oauth_client_secret_file");
  if (!env.empty()) {
    const char* v = std::getenv(env.c_str());
    if (v == nullptr || *v == '\0')
      throw std::invalid_argument("oauth_client_secret_env: environment variable " + env + " is not set");
    a.client_secret = v;
  } else {
    struct stat st {};
    if (::stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      throw std::invalid_argument("oauth_client_secret_file: cannot read " + file);
    if ((st.st_mode & 077) != 0)
      throw std::invalid_argument("oauth_client_secret_file: " + file +
                                  " may be read by others than its owner: chmod 600 it");
    std::ifstream in(file);
    std::getline(in, a.client_secret);
    while (!a.client_secret.empty() && std::isspace(static_cast<unsigned char>(a.client_secret.back())))
      a.client_secret.pop_back();
    if (a.client_secret.empty()) throw std::invalid_argument("oauth_client_secret_file: " + file + " holds no secret");
  }
  for (const auto& [name, value] : c.headers)
    if (boost::beast::iequals(name, "Authorization"))
      throw std::invalid_argument("headers: Authorization is set by oauth_token_url; leave it out");
  a.client_id = id;
  a.scope = o.str("oauth_scope");
  a.tls_ca = c.tls_ca;
  a.tls_verify = c.tls_verify;
  a.timeout = c.timeout;
  return a;
}

inline HttpClient::Options client_options(const sdk::Options& o) {
  HttpClient::Options c;
  c.endpoint = parse_url(o.str("endpoint"));
  c.timeout = o.duration("timeout");
  const auto n = o.integer("max_connections");
  if (n < 1 || n > 10000) throw std::invalid_argument("max_connections must be between 1 and 10000");
  c.max_connections = static_cast<size_t>(n);
  c.headers = parse_headers(o.str("headers"));
  c.tls_ca = o.str("tls_ca");
  c.tls_verify = o.boolean("tls_verify");
  if (!c.endpoint.tls && !c.tls_ca.empty())
    throw std::invalid_argument("tls_ca is set but the endpoint is not https://");
  c.oauth = oauth_options(o, c);
  return c;
}

/// Deepest nesting of arrays and objects a record value may have: the JSON
/// library serialises recursively, so a hostile value nested 200,000 deep
/// would overflow the stack.
constexpr size_t kMaxJsonDepth = 128;

/// Nesting depth of the JSON-looking text `s` (brackets outside strings).
inline size_t json_depth(std::string_view s) {
  size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

/// Whether `s` is valid UTF-8 (what the JSON library requires when writing).
inline bool valid_utf8(std::string_view s) { return simdjson::validate_utf8(s.data(), s.size()); }

/// Why a record cannot be sent to a JSON service at all (decided before
/// sending, so the answer is permanent, never "maybe sent"), or nothing.
inline std::optional<std::string> unsendable(const sdk::Record& rec) {
  if (!valid_utf8(rec.biz_key()))
    return std::string("the biz_key is not valid UTF-8 and cannot be carried in a JSON request");
  if (const size_t depth = json_depth(rec.json()); depth > kMaxJsonDepth)
    return "the record value nests " + std::to_string(depth) + " levels deep (at most " +
           std::to_string(kMaxJsonDepth) + ")";
  return std::nullopt;
}

/// The last moment this call's request may go on the wire: the host's
/// deadline (ABI v1.1), a little early so that "not sent" reaches the host
/// before it gives up on the call; nothing (the client's own timeout) from a
/// host that does not say.
inline HttpClient::SendBy send_by(const sdk::Record& rec) {
  const auto timeout = rec.timeout();
  if (!timeout) return std::nullopt;
  const auto margin = std::min<std::chrono::milliseconds>(*timeout / 10, std::chrono::milliseconds(100));
  return std::chrono::steady_clock::now() + *timeout - margin;
}

/// The record value as JSON text: the value itself when it is JSON (as the
/// producer wrote it, numbers and all), else as order_payload() makes it.
inline std::string order_json(const sdk::Record& rec);

/// The record value as JSON when it is JSON, as a string when it is other
/// text, and as {"value_base64": ...} when it is not UTF-8 (binary).
inline nlohmann::json order_payload(const sdk::Record& rec) {
  auto j = nlohmann::json::parse(rec.json(), nullptr, false);
  if (!j.is_discarded()) return j;
  if (valid_utf8(rec.json())) return nlohmann::json(std::string(rec.json()));
  std::string b64(boost::beast::detail::base64::encoded_size(rec.json().size()), '\0');
  b64.resize(boost::beast::detail::base64::encode(b64.data(), rec.json().data(), rec.json().size()));
  return nlohmann::json{{"value_base64", b64}};
}

inline std::string order_json(const sdk::Record& rec) {
  // A leading byte-order mark is accepted by the parser but is no JSON a
  // service reads inside a body: such a value is written out again.
  constexpr std::string_view kBom = "\xEF\xBB\xBF";
  if (rec.json().substr(0, kBom.size()) != kBom && nlohmann::json::accept(rec.json())) return std::string(rec.json());
  return order_payload(rec).dump();
}

/// A JSON string holding `text` (valid UTF-8: unsendable() checked it).
inline std::string json_string(std::string_view text) { return nlohmann::json(std::string(text)).dump(); }

/// The pause a Retry-After header asks for (delta-seconds, at most a day;
/// an HTTP-date is not honoured: clocks differ, and the table's retry applies).
inline std::optional<std::chrono::milliseconds> retry_after(const HttpResult& r) {
  const auto v = r.header("Retry-After");
  if (!v) return std::nullopt;
  int64_t s = 0;
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), s);
  if (ec != std::errc() || p != v->data() + v->size() || s < 0) return std::nullopt;
  return std::chrono::seconds(std::min<int64_t>(s, 86400));
}

/// An HTTP callback that never lets an exception out: one thrown while
/// reading the answer is logged with the route and key, and the call ends
/// with `on_throw` (for a call: what the HTTP status says; for a reconcile
/// question: cannot tell).
template <class Fn>
std::function<void(HttpResult)> guarded(const sdk::Host& host, const sdk::Record& rec, sdk::SharedCompletion done,
                                        Fn fn, std::function<idemsink_outcome(const HttpResult&)> on_throw) {
  // The record does not outlive invoke(): its route and key are kept for
  // the message, which is made only if it is needed.
  return [host, route = std::string(rec.route()), key = std::string(rec.biz_key()), done = std::move(done),
          fn = std::move(fn), on_throw = std::move(on_throw)](HttpResult r) {
    try {
      fn(done, r);
    } catch (const std::exception& e) {
      host.error("route " + route + " key " +
                 nlohmann::json(key).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
                 ": reading the answer failed: " + e.what());
      done.report(on_throw(r), std::string("unreadable answer: ") + e.what());
    }
  };
}

/// The callback for a call's answer.
template <class Fn>
std::function<void(HttpResult)> guarded_call(const sdk::Host& host, const sdk::Record& rec, sdk::Completion done,
                                             Fn fn) {
  return guarded(host, rec, sdk::SharedCompletion(std::move(done)), std::move(fn),
                 [](const HttpResult& r) { return classify(r); });
}

/// The callback for a reconcile answer.
template <class Fn>
std::function<void(HttpResult)> guarded_question(const sdk::Host& host, const sdk::Record& rec, sdk::Completion done,
                                                 Fn fn) {
  return guarded(host, rec, sdk::SharedCompletion(std::move(done)), std::move(fn),
                 [](const HttpResult&) { return IDEMSINK_OUTCOME_RETRYABLE; });
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
inline void lookup_receipt(const sdk::Host& host, HttpClient& http, const sdk::Record& rec, const std::string& target,
                           const char* field, const std::string& not_found, sdk::Completion done) {
  http.request("GET", target, "", {}, send_by(rec),
               guarded_question(host, rec, std::move(done),
                                [field, not_found](const sdk::SharedCompletion& done, const HttpResult& r) {
                                  if (r.failure == HttpResult::Failure::None && r.status == 404)
                                    return done.permanent(not_found);
                                  // Cannot tell now; a pause asked for holds the route's look-ups too.
                                  if (const auto pause = retry_after(r);
                                      pause && *pause >= std::chrono::seconds(1) && classify(r) != IDEMSINK_OUTCOME_OK)
                                    return done.retry_after(*pause, describe(r));
                                  if (classify(r) != IDEMSINK_OUTCOME_OK) return done.retryable(describe(r));
                                  report(done, r, field);
                                }));
}

}  // namespace idemsink::plugins
