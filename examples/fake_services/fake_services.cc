// idemsink-fake-services: the external systems the shipped plugins talk to,
// with injectable latency and faults, and counters of what was *really*
// applied, so tests and the demo can prove "once".
//
//   POST /waybills                 logistics API; honours Idempotency-Key: the
//                                  same key returns the same waybill number
//   GET  /waybills/by-key/KEY      did a waybill with this key get created?
//   POST /inventory/reserve        inventory RPC; idempotent by request_id
//   GET  /inventory/reservations/ID
//   POST /sms/send                 SMS gateway with NO idempotency: every call sends
//   GET  /sms/messages?client_ref=REF   messages sent with this client reference
//   POST /payments                 payment API; a replayed Idempotency-Key is answered
//                                  409 (no receipt); 201 {"payment": {"id": ...}}
//   GET  /payments/by-key/KEY      {"payment": {"id": ...}} or 404
//   ANY  /scripted/STATUS, /scripted/html   that status (no Retry-After), or a 200 that is not JSON
//   GET  /stats[?detail=1]         per service: requests, effects applied,
//                                  orders with more than one effect (double_applied),
//                                  and from a record's production to its effect
//                                  (its order's "produced_ms", if sent) P50/P99
//   POST /admin/faults/SERVICE     JSON {"latency_mean_ms", "latency_p99_ms",
//                                  "timeout_after_apply", "error_5xx", "reject_4xx",
//                                  "record_delay_ms", "early_hints"}
//   POST /admin/reset              forget everything
//   POST /oauth/token              OAuth 2.0 client credentials (--oauth-client ID:SECRET,
//                                  HTTP Basic or form): an unsecured JWT ("alg":"none",
//                                  sub = the client id, exp, scope), valid --oauth-token-ttl s;
//                                  Kafka's unsecured OAUTHBEARER validator accepts it
//   POST /admin/oauth              JSON {"down": bool, "ttl_s": N, "revoke": bool}: the endpoint
//                                  answers 503, issues tokens of another life, or refuses those
//                                  issued so far (as if they had expired early)
// With --require-oauth, the services answer 401 to a request without a
// token the endpoint issued that has not expired (stats: oauth.unauthorized).
// With --require-token T, the services answer 401 without "Authorization: Bearer T";
// with --tls-cert/--tls-key they are also served over HTTPS on a second port.
//
// Faults, per request: a 5xx *before* applying (probability error_5xx); a
// 4xx business rejection (decided per order id, so retries get the same
// answer); an order id starting "REJECT-" is always rejected (422), one
// starting "DOWN-" always answered 503 (not applied): records that fail on
// their own, whatever the faults; a timeout *after* applying (the effect happens, the response is
// held back past any sane client timeout). Latency is log-normal with the
// given mean and P99. A slow gateway (record_delay_ms, sms) sends at once
// but shows the message to lookups, and answers, only that much later. One thread, asynchronous: thousands of
// concurrent requests on one core.
#include <utility>  // before Boost.Asio 1.74: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/core/detail/base64.hpp>
#include <boost/beast/http.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/program_options.hpp>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace po = boost::program_options;
using tcp = asio::ip::tcp;
using json = nlohmann::json;

namespace {

struct Faults {
  double latency_mean_ms = 0;
  double latency_p99_ms = 0;
  double timeout_after_apply = 0;
  double error_5xx = 0;
  double reject_4xx = 0;
  double record_delay_ms = 0;
  double early_hints = 0;  // probability of a 103 Early Hints before the answer (legal HTTP/1.1)
};

void to_json(json& j, const Faults& f) {
  j = json{{"latency_mean_ms", f.latency_mean_ms},
           {"latency_p99_ms", f.latency_p99_ms},
           {"timeout_after_apply", f.timeout_after_apply},
           {"error_5xx", f.error_5xx},
           {"reject_4xx", f.reject_4xx},
           {"record_delay_ms", f.record_delay_ms},
           {"early_hints", f.early_hints}};
}

void update(Faults& f, const json& j) {
  f.latency_mean_ms = j.value("latency_mean_ms", f.latency_mean_ms);
  f.latency_p99_ms = j.value("latency_p99_ms", f.latency_p99_ms);
  f.timeout_after_apply = j.value("timeout_after_apply", f.timeout_after_apply);
  f.error_5xx = j.value("error_5xx", f.error_5xx);
  f.reject_4xx = j.value("reject_4xx", f.reject_4xx);
  f.record_delay_ms = j.value("record_delay_ms", f.record_delay_ms);
  f.early_hints = j.value("early_hints", f.early_hints);
}

struct Service {
  Faults faults;
  uint64_t requests = 0, applied = 0, rejected = 0, errors_5xx = 0, timeouts = 0;
  std::map<std::string, std::string> by_key;  // idempotency key -> receipt
  std::map<std::string, int> per_order;       // order id -> effects really applied
  // From the record's production (its order's "produced_ms", when the
  // client sends the record) to the first application of its effect.
  std::vector<int64_t> effect_latency_ms;
  struct Sent {
    std::string message_id;
    std::chrono::steady_clock::time_point visible;  // recorded (seen by lookups) from then on
  };
  std::map<std::string, std::vector<Sent>> by_ref;  // sms client_ref -> messages
};

std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

struct Reply {
  http::status status = http::status::ok;
  json body;
  std::chrono::milliseconds delay{0};
  std::vector<std::pair<std::string, std::string>> headers;
  std::optional<std::string> raw_body;  // sent as is instead of `body` (text that is not JSON)
  bool early_hints = false;             // a 103 goes out at once, the answer after its delay
};

std::string base64url(const std::string& s) {
  std::string out(beast::detail::base64::encoded_size(s.size()), '\0');
  out.resize(beast::detail::base64::encode(out.data(), s.data(), s.size()));
  for (auto& c : out) c = c == '+' ? '-' : c == '/' ? '_' : c;
  while (!out.empty() && out.back() == '=') out.pop_back();
  return out;
}

std::string base64_decode(const std::string& s) {
  std::string out(beast::detail::base64::decoded_size(s.size()), '\0');
  out.resize(beast::detail::base64::decode(out.data(), s.data(), s.size()).first);
  return out;
}

// An OAuth 2.0 token endpoint (client credentials) and the tokens it issued.
struct OAuthServer {
  std::string client_id, client_secret;  // empty: no endpoint
  std::chrono::seconds ttl{3600};
  bool down = false;
  bool required = false;                                                // the services want one of its tokens
  std::map<std::string, std::chrono::steady_clock::time_point> issued;  // token -> expiry
  uint64_t tokens = 0, unauthorized = 0, refused_clients = 0;

  bool valid(std::string_view authorization) const {
    if (authorization.rfind("Bearer ", 0) != 0) return false;
    auto it = issued.find(std::string(authorization.substr(7)));
    return it != issued.end() && std::chrono::steady_clock::now() < it->second;
  }

  Reply token(const http::request<http::string_body>& req, const std::string& form) {
    if (down) return {http::status::service_unavailable, {{"error", "temporarily_unavailable"}}};
    // The client's credentials: HTTP Basic (RFC 6749 2.3.1), or the form.
    std::string id, secret;
    const std::string auth(req[http::field::authorization]);
    if (auth.rfind("Basic ", 0) == 0) {
      const std::string pair = base64_decode(auth.substr(6));
      id = percent_decode(pair.substr(0, pair.find(':')));
      secret = pair.find(':') == std::string::npos ? "" : percent_decode(pair.substr(pair.find(':') + 1));
    }
    std::string grant, scope;
    std::istringstream fields(form);
    for (std::string kv; std::getline(fields, kv, '&');) {
      const std::string k = kv.substr(0, kv.find('=')),
                        v = percent_decode(kv.substr(std::min(kv.size(), kv.find('=') + 1)));
      if (k == "grant_type") grant = v;
      if (k == "scope") scope = v;
      if (k == "client_id" && id.empty()) id = v;
      if (k == "client_secret" && secret.empty()) secret = v;
    }
    if (grant != "client_credentials") return {http::status::bad_request, {{"error", "unsupported_grant_type"}}};
    if (id != client_id || secret != client_secret) {
      ++refused_clients;
      return {http::status::unauthorized, {{"error", "invalid_client"}}};
    }
    const auto now_s =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    json claims{{"sub", id}, {"iat", now_s}, {"exp", now_s + ttl.count()}, {"jti", std::to_string(++tokens)}};
    if (!scope.empty()) claims["scope"] = scope;
    const std::string jwt = base64url(R"({"alg":"none"})") + "." + base64url(claims.dump()) + ".";
    issued[jwt] = std::chrono::steady_clock::now() + ttl;
    return {http::status::ok, {{"access_token", jwt}, {"token_type", "Bearer"}, {"expires_in", ttl.count()}}};
  }
};

class World {
 public:
  World(uint64_t seed, std::chrono::milliseconds hold, std::string token, OAuthServer oauth)
      : rng_(seed), hold_(hold), token_(std::move(token)), oauth_(std::move(oauth)) {
    for (const char* s : {"waybill", "inventory", "sms", "payment"}) services_[s];
  }

  Service* service(const std::string& name) {
    auto it = services_.find(name);
    return it == services_.end() ? nullptr : &it->second;
  }

  Reply handle(const http::request<http::string_body>& req) {
    Reply r = answer(req);
    const std::string target(req.target());
    static const std::pair<const char*, const char*> kPrefixes[] = {
        {"/waybills", "waybill"}, {"/inventory/", "inventory"}, {"/sms/", "sms"}, {"/payments", "payment"}};
    for (const auto& [prefix, name] : kPrefixes)
      if (target.rfind(prefix, 0) == 0 &&
          std::uniform_real_distribution<double>(0, 1)(rng_) < services_[name].faults.early_hints)
        r.early_hints = true;
    return r;
  }

  std::chrono::milliseconds hold() const { return hold_; }

 private:
  Reply answer(const http::request<http::string_body>& req) {
    const std::string target(req.target());
    // Decoded as a web framework decodes them: %2F in a key is part of the key.
    const std::string path = percent_decode(target.substr(0, target.find('?')));
    const std::string query =
        target.find('?') == std::string::npos ? "" : percent_decode(target.substr(target.find('?') + 1));
    const bool post = req.method() == http::verb::post;
    if (path == "/healthz") return {http::status::ok, {{"ok", true}}};
    if (path == "/stats") return {http::status::ok, stats(query.find("detail=1") != std::string::npos)};
    if (post && path == "/oauth/token" && !oauth_.client_id.empty()) return oauth_.token(req, req.body());
    if (post && path == "/admin/oauth") {
      json j = json::parse(req.body(), nullptr, false);
      if (j.is_discarded() || !j.is_object()) return {http::status::bad_request, {{"error", "body is not JSON"}}};
      oauth_.down = j.value("down", oauth_.down);
      oauth_.ttl = std::chrono::seconds(j.value("ttl_s", static_cast<int64_t>(oauth_.ttl.count())));
      if (j.value("revoke", false)) oauth_.issued.clear();  // every token issued so far refused from now on
      return {http::status::ok, {{"down", oauth_.down}, {"ttl_s", oauth_.ttl.count()}}};
    }
    // The services (not /stats, /admin) want the bearer token when one is set.
    if (!token_.empty() && path.rfind("/admin/", 0) != 0 && req[http::field::authorization] != "Bearer " + token_)
      return {http::status::unauthorized, {{"error", "missing or wrong bearer token"}}};
    if (oauth_.required && path.rfind("/admin/", 0) != 0 &&
        !oauth_.valid(std::string(req[http::field::authorization]))) {
      ++oauth_.unauthorized;
      return {http::status::unauthorized, {{"error", "invalid_token"}}};
    }
    if (post && path == "/admin/reset") {
      for (auto& [n, s] : services_) s = Service{s.faults, 0, 0, 0, 0, 0, {}, {}, {}};
      return {http::status::ok, {{"reset", true}}};
    }
    if (post && path.rfind("/admin/faults/", 0) == 0) {
      Service* s = service(path.substr(14));
      if (!s) return {http::status::not_found, {{"error", "no such service"}}};
      json j = json::parse(req.body(), nullptr, false);
      if (j.is_discarded()) return {http::status::bad_request, {{"error", "body is not JSON"}}};
      update(s->faults, j);
      return {http::status::ok, s->faults};
    }
    if (!post && path.rfind("/waybills/by-key/", 0) == 0) return lookup("waybill", path.substr(17), "waybill_no");
    if (!post && path.rfind("/inventory/reservations/", 0) == 0)
      return lookup("inventory", path.substr(24), "reservation_id");
    if (!post && path == "/sms/messages") {
      const auto ref = query.rfind("client_ref=", 0) == 0 ? query.substr(11) : std::string();
      auto& sms = services_["sms"];
      json messages = json::array();
      if (auto it = sms.by_ref.find(ref); it != sms.by_ref.end())
        for (const auto& m : it->second)
          if (m.visible <= std::chrono::steady_clock::now()) messages.push_back(m.message_id);
      return {http::status::ok, {{"client_ref", ref}, {"messages", messages}}};
    }
    if (post && path == "/waybills") {
      const std::string key(req["Idempotency-Key"]);
      if (key.empty()) return {http::status::bad_request, {{"error", "Idempotency-Key header required"}}};
      return effect("waybill", req.body(), key, "waybill_no", "WB");
    }
    if (post && path == "/inventory/reserve") {
      json j = json::parse(req.body(), nullptr, false);
      const std::string key = j.is_object() ? j.value("request_id", "") : "";
      if (key.empty()) return {http::status::bad_request, {{"error", "request_id required"}}};
      return effect("inventory", req.body(), key, "reservation_id", "RSV");
    }
    if (post && path == "/sms/send") return effect("sms", req.body(), "", "message_id", "SMS");
    if (!post && path.rfind("/payments/by-key/", 0) == 0) {
      Reply r = lookup("payment", path.substr(17), "id");
      if (r.status == http::status::ok) r.body = {{"payment", r.body}};
      return r;
    }
    if (post && path == "/payments") return payment(req);
    // Answers for tests of a client's rules: /scripted/STATUS answers that
    // status (JSON, no Retry-After); /scripted/html a 200 that is not JSON.
    if (path == "/scripted/html") return {http::status::ok, {}, {}, {}, "<html>maintenance</html>"};
    if (path.rfind("/scripted/", 0) == 0) {
      const int status = std::atoi(path.c_str() + 10);
      if (status >= 200 && status <= 599) return {static_cast<http::status>(status), {{"scripted", status}}};
    }
    return {http::status::not_found, {{"error", "no such endpoint: " + path}}};
  }

  // A payment API as many are: a replayed Idempotency-Key gets 409 instead
  // of the first answer, and the receipt only from the look-up.
  Reply payment(const http::request<http::string_body>& req) {
    const std::string key(req["Idempotency-Key"]);
    if (key.empty()) return {http::status::bad_request, {{"error", "Idempotency-Key header required"}}};
    Service& s = services_["payment"];
    if (s.by_key.count(key)) {
      ++s.requests;
      return {http::status::conflict,
              {{"error", "a payment with this Idempotency-Key was already made"}},
              latency(s.faults)};
    }
    Reply r = effect("payment", req.body(), key, "id", "PAY");
    if (r.status == http::status::ok) {
      r.status = http::status::created;
      r.body = {{"payment", {{"id", r.body["id"]}, {"status", "captured"}}}};
    }
    return r;
  }

  Reply lookup(const std::string& name, const std::string& key, const char* field) {
    auto& s = services_[name];
    auto it = s.by_key.find(key);
    if (it == s.by_key.end()) return {http::status::not_found, {{"error", "unknown key"}}};
    return {http::status::ok, {{field, it->second}}};
  }

  // One side effect. `idem_key` empty: not idempotent, every call applies.
  Reply effect(const std::string& name, const std::string& body, const std::string& idem_key, const char* field,
               const char* prefix) {
    Service& s = services_[name];
    ++s.requests;
    json j = json::parse(body, nullptr, false);
    const std::string order = j.is_object() ? j.value("order_id", "") : "";
    if (order.empty()) return {http::status::bad_request, {{"error", "order_id required"}}};
    const auto delay = latency(s.faults);
    std::uniform_real_distribution<double> u(0, 1);
    if (u(rng_) < s.faults.error_5xx || order.rfind("DOWN-", 0) == 0) {  // refused before doing anything
      ++s.errors_5xx;
      return {http::status::service_unavailable, {{"error", "temporarily unavailable"}}, delay, {{"Retry-After", "1"}}};
    }
    if (order.rfind("REJECT-", 0) == 0 || rejected(name, order, s.faults.reject_4xx)) {  // sticks to the order
      ++s.rejected;
      return {
          http::status::unprocessable_entity, {{"error", "rejected: invalid destination for order " + order}}, delay};
    }
    std::string receipt;
    if (!idem_key.empty()) {
      auto it = s.by_key.find(idem_key);
      if (it != s.by_key.end()) {
        receipt = it->second;  // idempotent replay: same answer, no new effect
      } else {
        receipt = prefix + std::to_string(100000 + s.by_key.size());
        s.by_key.emplace(idem_key, receipt);
        if (++s.per_order[order] == 1) note_latency(s, j);
        ++s.applied;
      }
    } else {
      receipt = prefix + std::to_string(100000 + s.applied);
      ++s.per_order[order];
      ++s.applied;
      const auto record_delay = std::chrono::milliseconds(static_cast<int64_t>(s.faults.record_delay_ms));
      s.by_ref[j.value("client_ref", "")].push_back({receipt, std::chrono::steady_clock::now() + record_delay});
      if (record_delay.count() > 0) return {http::status::ok, {{field, receipt}}, std::max(delay, record_delay)};
    }
    if (u(rng_) < s.faults.timeout_after_apply) {  // applied, but the answer comes too late
      ++s.timeouts;
      return {http::status::ok, {{field, receipt}}, hold_};
    }
    return {http::status::ok, {{field, receipt}}, delay};
  }

  static void note_latency(Service& s, const json& body) {
    if (!body.contains("order") || !body["order"].is_object() || !body["order"].contains("produced_ms") ||
        !body["order"]["produced_ms"].is_number())
      return;
    const int64_t now =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    s.effect_latency_ms.push_back(now - body["order"]["produced_ms"].get<int64_t>());
  }

  static json latency_summary(std::vector<int64_t> v) {
    if (v.empty()) return {{"count", 0}};
    std::sort(v.begin(), v.end());
    auto at = [&](double q) {
      return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
    };
    return {{"count", v.size()}, {"p50", at(0.5)}, {"p99", at(0.99)}, {"max", v.back()}};
  }

  bool rejected(const std::string& name, const std::string& order, double p) const {
    if (p <= 0) return false;
    const size_t h = std::hash<std::string>{}(name + "/" + order);
    return static_cast<double>(h % 1000000) / 1e6 < p;
  }

  // Log-normal with the configured mean and P99 (z(0.99) = 2.326).
  std::chrono::milliseconds latency(const Faults& f) {
    if (f.latency_mean_ms <= 0) return std::chrono::milliseconds(0);
    const double ratio = std::max(1.0001, f.latency_p99_ms / f.latency_mean_ms);
    const double z = 2.326;
    const double disc = z * z - 2 * std::log(ratio);
    const double sigma = disc > 0 ? z - std::sqrt(disc) : z;
    const double mu = std::log(f.latency_mean_ms) - sigma * sigma / 2;
    std::lognormal_distribution<double> d(mu, sigma);
    return std::chrono::milliseconds(static_cast<int64_t>(d(rng_)));
  }

  json stats(bool detail) const {
    json out;
    for (const auto& [name, s] : services_) {
      uint64_t doubled = 0;
      for (const auto& [order, n] : s.per_order) doubled += n > 1;
      json j{{"requests", s.requests},
             {"applied", s.applied},
             {"orders", s.per_order.size()},
             {"double_applied", doubled},
             {"rejected_4xx", s.rejected},
             {"errors_5xx", s.errors_5xx},
             {"timeouts_after_apply", s.timeouts},
             {"effect_latency_ms", latency_summary(s.effect_latency_ms)},
             {"faults", s.faults}};
      if (detail) j["per_order"] = s.per_order;
      out[name] = j;
    }
    out["oauth"] = {
        {"tokens", oauth_.tokens}, {"unauthorized", oauth_.unauthorized}, {"refused_clients", oauth_.refused_clients}};
    return out;
  }

  std::map<std::string, Service> services_;
  std::mt19937_64 rng_;
  std::chrono::milliseconds hold_;
  std::string token_;
  OAuthServer oauth_;
};

// One connection, plain (Stream = beast::tcp_stream) or TLS
// (beast::ssl_stream over it).
template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
 public:
  template <class... TlsContext>
  Session(tcp::socket s, World& world, TlsContext&... tls)
      : stream_(std::move(s), tls...), world_(world), timer_(stream_.get_executor()) {}
  void run() {
    if constexpr (std::is_same_v<Stream, beast::tcp_stream>) {
      read();
    } else {
      beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(30));
      stream_.async_handshake(asio::ssl::stream_base::server, [self = this->shared_from_this()](beast::error_code ec) {
        if (!ec) self->read();
      });
    }
  }

 private:
  void read() {
    req_ = {};
    beast::get_lowest_layer(stream_).expires_after(std::chrono::minutes(10));
    http::async_read(stream_, buf_, req_, [self = this->shared_from_this()](beast::error_code ec, size_t) {
      if (!ec) self->respond();
    });
  }
  void respond() {
    Reply r = world_.handle(req_);
    auto res = std::make_shared<http::response<http::string_body>>(r.status, req_.version());
    res->set(http::field::content_type, "application/json");
    for (const auto& [name, value] : r.headers) res->set(name, value);
    res->keep_alive(req_.keep_alive());
    res->body() = r.raw_body ? *r.raw_body : r.body.dump();
    res->prepare_payload();
    if (r.early_hints) {
      // The interim answer at once, the final one after the service's delay.
      static const std::string kEarlyHints = "HTTP/1.1 103 Early Hints\r\nLink: </receipt.css>; rel=preload\r\n\r\n";
      asio::async_write(stream_, asio::buffer(kEarlyHints),
                        [self = this->shared_from_this(), res, delay = r.delay](beast::error_code ec, size_t) {
                          if (!ec) self->answer_after(res, delay);
                        });
      return;
    }
    answer_after(res, r.delay);
  }
  void answer_after(std::shared_ptr<http::response<http::string_body>> res, std::chrono::milliseconds delay) {
    timer_.expires_after(delay);
    timer_.async_wait([self = this->shared_from_this(), res](beast::error_code) {
      beast::get_lowest_layer(self->stream_).expires_after(std::chrono::minutes(1));
      http::async_write(self->stream_, *res, [self, res](beast::error_code ec, size_t) {
        if (ec || !res->keep_alive()) {
          beast::error_code ignored;
          beast::get_lowest_layer(self->stream_).socket().shutdown(tcp::socket::shutdown_send, ignored);
          return;
        }
        self->read();
      });
    });
  }
  Stream stream_;
  World& world_;
  asio::steady_timer timer_;
  beast::flat_buffer buf_;
  http::request<http::string_body> req_;
};

// `tls` null: plain HTTP.
void accept(tcp::acceptor& acceptor, World& world, asio::ssl::context* tls) {
  acceptor.async_accept([&acceptor, &world, tls](beast::error_code ec, tcp::socket s) {
    if (!ec) {
      if (tls) {
        std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(std::move(s), world, *tls)->run();
      } else {
        std::make_shared<Session<beast::tcp_stream>>(std::move(s), world)->run();
      }
    }
    accept(acceptor, world, tls);
  });
}

// "waybill:latency_mean_ms=50,latency_p99_ms=350,timeout_after_apply=0.1"
void apply_fault_flag(World& world, const std::string& flag) {
  const auto colon = flag.find(':');
  Service* s = colon == std::string::npos ? nullptr : world.service(flag.substr(0, colon));
  if (!s) throw std::invalid_argument("--faults wants SERVICE:key=value,..., SERVICE one of waybill, inventory, sms");
  json j = json::object();
  std::string rest = flag.substr(colon + 1);
  size_t pos = 0;
  while (pos < rest.size()) {
    size_t end = rest.find(',', pos);
    if (end == std::string::npos) end = rest.size();
    const std::string kv = rest.substr(pos, end - pos);
    const auto eq = kv.find('=');
    if (eq == std::string::npos) throw std::invalid_argument("--faults: expected key=value, got " + kv);
    j[kv.substr(0, eq)] = std::stod(kv.substr(eq + 1));
    pos = end + 1;
  }
  update(s->faults, j);
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description desc("idemsink-fake-services options");
  desc.add_options()("help,h", "show this help")("listen", po::value<std::string>()->default_value("127.0.0.1:0"),
                                                 "address to listen on (port 0 picks one)")(
      "seed", po::value<uint64_t>()->default_value(42), "random seed for latencies and faults")(
      "hold", po::value<int>()->default_value(30000), "ms a timed-out-after-apply response is held back")(
      "tls-cert", po::value<std::string>()->default_value(""),
      "also serve HTTPS, on a second loopback port, with this certificate chain (PEM)")(
      "tls-key", po::value<std::string>()->default_value(""), "private key of --tls-cert (PEM)")(
      "require-token", po::value<std::string>()->default_value(""),
      "answer 401 to service requests without \"Authorization: Bearer TOKEN\"")(
      "oauth-client", po::value<std::string>()->default_value(""),
      "ID:SECRET: serve POST /oauth/token (client credentials) for this client")(
      "oauth-token-ttl", po::value<int>()->default_value(3600), "seconds a token issued there lives")(
      "require-oauth", "answer 401 to service requests without a live token of /oauth/token")(
      "faults", po::value<std::vector<std::string>>()->composing(),
      "SERVICE:key=value,... e.g. waybill:latency_mean_ms=50,latency_p99_ms=350,timeout_after_apply=0.1,"
      "error_5xx=0.05,reject_4xx=0.01 (repeatable)");
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc;
      return 0;
    }
    po::notify(vm);
    OAuthServer oauth;
    if (const std::string client = vm["oauth-client"].as<std::string>(); !client.empty()) {
      oauth.client_id = client.substr(0, client.find(':'));
      oauth.client_secret = client.find(':') == std::string::npos ? "" : client.substr(client.find(':') + 1);
    }
    oauth.ttl = std::chrono::seconds(vm["oauth-token-ttl"].as<int>());
    oauth.required = vm.count("require-oauth") != 0;
    World world(vm["seed"].as<uint64_t>(), std::chrono::milliseconds(vm["hold"].as<int>()),
                vm["require-token"].as<std::string>(), std::move(oauth));
    if (vm.count("faults"))
      for (const auto& f : vm["faults"].as<std::vector<std::string>>()) apply_fault_flag(world, f);
    const std::string listen = vm["listen"].as<std::string>();
    const auto colon = listen.rfind(':');
    asio::io_context io;
    tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address(listen.substr(0, colon)),
                                             static_cast<unsigned short>(std::stoi(listen.substr(colon + 1)))));
    std::cout << "listening on " << acceptor.local_endpoint().address().to_string() << ":"
              << acceptor.local_endpoint().port() << std::endl;
    asio::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&](auto, int) { io.stop(); });
    accept(acceptor, world, nullptr);
    // HTTPS on a second port: the same services (the plain port keeps
    // /stats and /admin reachable for tests' plain clients).
    std::unique_ptr<asio::ssl::context> tls;
    std::unique_ptr<tcp::acceptor> tls_acceptor;
    if (!vm["tls-cert"].as<std::string>().empty()) {
      tls = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
      tls->use_certificate_chain_file(vm["tls-cert"].as<std::string>());
      tls->use_private_key_file(vm["tls-key"].as<std::string>(), asio::ssl::context::pem);
      tls_acceptor = std::make_unique<tcp::acceptor>(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
      std::cout << "tls listening on 127.0.0.1:" << tls_acceptor->local_endpoint().port() << std::endl;
      accept(*tls_acceptor, world, tls.get());
    }
    io.run();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "idemsink-fake-services: " << e.what() << "\n";
    return 2;
  }
}
