#include "core/kafka/oauth.h"

#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>

#include "core/common/http_fetch.h"
#include "core/common/log.h"

namespace idemsink::kafka::oauth {
namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The claims of a JWT (its middle part, base64url), or nothing.
std::optional<nlohmann::json> jwt_claims(const std::string& token) {
  const auto a = token.find('.');
  const auto b = a == std::string::npos ? a : token.find('.', a + 1);
  if (b == std::string::npos) return std::nullopt;
  std::string part = token.substr(a + 1, b - a - 1);
  for (auto& c : part) c = c == '-' ? '+' : c == '_' ? '/' : c;
  std::string raw;
  if (!base64_decode(part, raw)) return std::nullopt;
  auto j = nlohmann::json::parse(raw, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

// One POST, synchronous, every step within `timeout`.
HttpAnswer post(const config::OAuthConfig& cfg, const HttpUrl& url, const std::string& body) {
  HttpFetch req;
  req.method = "POST";
  req.url = url;
  req.headers = {{"Content-Type", "application/x-www-form-urlencoded"},
                 {"Accept", "application/json"},
                 // RFC 6749 2.3.1: the client authenticates with HTTP Basic,
                 // its id and secret form-encoded first.
                 {"Authorization",
                  "Basic " + base64_encode(percent_encode(cfg.client_id) + ":" + percent_encode(cfg.client_secret))}};
  req.body = body;
  req.tls_ca = cfg.tls_ca;
  req.timeout = cfg.timeout;
  return http_fetch(req);
}

// The process's token, shared by its clients while more than half of its
// life is left; fetched again, by the first to ask, once it is not.
class TokenCache {
 public:
  explicit TokenCache(config::OAuthConfig cfg) : cfg_(std::move(cfg)) {}

  Token get() {
    std::lock_guard lk(mu_);
    const int64_t now = now_ms();
    if (token_ && now < fetched_ms_ + (token_->expires_ms - fetched_ms_) / 2) return *token_;
    try {
      Token t = fetch(cfg_);
      if (!token_ || failing_)
        spdlog::info("kafka: OAuth token from {} (valid {}s)", cfg_.token_endpoint, (t.expires_ms - now) / 1000);
      failing_ = false;
      fetched_ms_ = now;
      token_ = t;
      return t;
    } catch (const std::exception& e) {
      if (!failing_) spdlog::error("kafka: {}; the clients ask again within 10s", e.what());
      failing_ = true;
      // A token still valid serves meanwhile: the endpoint may be back before it expires.
      if (token_ && now + 1000 < token_->expires_ms) return *token_;
      throw;
    }
  }

 private:
  const config::OAuthConfig cfg_;
  std::mutex mu_;
  std::optional<Token> token_;
  int64_t fetched_ms_ = 0;
  bool failing_ = false;
};

// One per process: a process has one [kafka] section (made by the first
// prepare(), never destroyed: librdkafka's threads may ask until exit).
std::once_flag g_once;
TokenCache* g_cache = nullptr;

void refresh_cb(rd_kafka_t* rk, const char*, void*) {
  try {
    const Token t = g_cache->get();
    char err[512];
    if (rd_kafka_oauthbearer_set_token(rk, t.value.c_str(), t.expires_ms, t.principal.c_str(), nullptr, 0, err,
                                       sizeof err) != RD_KAFKA_RESP_ERR_NO_ERROR)
      rd_kafka_oauthbearer_set_token_failure(rk, (std::string("the token was refused by librdkafka: ") + err).c_str());
  } catch (const std::exception& e) {
    rd_kafka_oauthbearer_set_token_failure(rk, e.what());
  }
}

}  // namespace

void prepare(rd_kafka_conf_t* conf, const config::KafkaConfig& cfg) {
  if (!cfg.oauth.enabled()) return;
  std::call_once(g_once, [&] { g_cache = new TokenCache(cfg.oauth); });
  rd_kafka_conf_set_oauthbearer_token_refresh_cb(conf, &refresh_cb);
  rd_kafka_conf_enable_sasl_queue(conf, 1);
}

void attach(rd_kafka_t* rk, const config::KafkaConfig& cfg) {
  if (!cfg.oauth.enabled()) return;
  if (rd_kafka_error_t* e = rd_kafka_sasl_background_callbacks_enable(rk)) {
    const std::string why = rd_kafka_error_string(e);
    rd_kafka_error_destroy(e);
    throw std::runtime_error("kafka: OAuth token callbacks cannot run on librdkafka's background thread: " + why);
  }
}

Token fetch(const config::OAuthConfig& cfg) {
  const std::string where = "OAuth token endpoint " + cfg.token_endpoint;
  HttpUrl url;
  try {
    url = parse_http_url(cfg.token_endpoint);
  } catch (const std::exception& e) {
    throw std::runtime_error(where + ": " + e.what());
  }
  std::string body = "grant_type=client_credentials";
  if (!cfg.scope.empty()) body += "&scope=" + percent_encode(cfg.scope);
  HttpAnswer res;
  try {
    res = post(cfg, url, body);
  } catch (const std::exception& e) {
    throw std::runtime_error(where + " did not answer: " + e.what());
  }
  const auto j = nlohmann::json::parse(res.body, nullptr, false);
  if (res.status != 200) {
    // An OAuth error answer names its error (invalid_client, ...); the body is not echoed further.
    std::string what = "HTTP " + std::to_string(res.status);
    if (!j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_string())
      what += " " + j["error"].get<std::string>();
    throw std::runtime_error(where + " refused the client: " + what);
  }
  if (j.is_discarded() || !j.is_object() || !j.contains("access_token") || !j["access_token"].is_string())
    throw std::runtime_error(where + " answered without an access_token");
  Token t;
  t.value = j["access_token"].get<std::string>();
  const int64_t lifetime_s = j.contains("expires_in") && j["expires_in"].is_number_integer()
                                 ? j["expires_in"].get<int64_t>()
                                 : 3600;  // RFC 6749 5.1: recommended, not required
  t.expires_ms = now_ms() + lifetime_s * 1000;
  const auto claims = jwt_claims(t.value);
  // A JWT's own expiry and subject win: they are what the broker checks.
  if (claims && claims->contains("exp") && (*claims)["exp"].is_number())
    t.expires_ms = std::min(t.expires_ms, static_cast<int64_t>((*claims)["exp"].get<double>() * 1000));
  if (!cfg.principal.empty()) {
    t.principal = cfg.principal;
  } else if (claims && claims->contains("sub") && (*claims)["sub"].is_string()) {
    t.principal = (*claims)["sub"].get<std::string>();
  } else {
    t.principal = cfg.client_id;
  }
  return t;
}

}  // namespace idemsink::kafka::oauth
