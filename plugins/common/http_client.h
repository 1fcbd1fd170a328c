// Asynchronous HTTP/1.1 client shared by the remote plugins (Boost.Beast on
// one plugin-owned thread): keep-alive connections in a bounded pool, a
// deadline per call, and the one place where HTTP results become handler
// outcomes. Plugins depend on sdk/ and this folder only, never on core/.
#pragma once

#include <idemsink/plugin_abi.h>

#include "plugins/common/oauth_token.h"

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <string>
#include <vector>

namespace idemsink::plugins {

struct HttpResult {
  /// Where a failure happened, which decides retryable vs uncertain.
  enum class Failure {
    None,        ///< a response arrived
    BeforeSend,  ///< no connection, the request could not be written, or none was free before the call's deadline: not
                 ///< applied
    AfterSend,   ///< sent, then timeout or reset before the response: may be applied
    Invalid,     ///< the request itself is malformed (control characters in its target or a header): never sent
  };
  Failure failure = Failure::None;
  unsigned status = 0;
  std::string body;
  std::string error;
  /// The answer's headers (names as the server wrote them).
  std::vector<std::pair<std::string, std::string>> headers;
  /// The first header `name` (case-insensitive), or nothing.
  std::optional<std::string_view> header(std::string_view name) const;
};

/// The classification every remote plugin uses:
///   2xx ok · 4xx except 408/429 permanent · 408/429/5xx retryable (the
///   server says it did not process the request) · failure before sending
///   retryable · timeout or reset after sending uncertain · a malformed
///   request permanent (the record made it; sending it again makes it again).
idemsink_outcome classify(const HttpResult& r);
/// A short text for logs and last_error: "HTTP 503: body..." or the failure.
std::string describe(const HttpResult& r);

struct Endpoint {
  bool tls = false;  // https
  std::string host;
  uint16_t port = 80;     // 443 for https
  std::string base_path;  // from the URL, without trailing slash
};
/// Parses "http://host:port/base" or "https://…"; throws std::invalid_argument.
Endpoint parse_url(const std::string& url);
/// What a request line's target may hold: visible ASCII only (a space would
/// end it, CR LF the line: text a record put there would add headers, or a
/// second request).
bool valid_target(std::string_view target);
/// A header's name: an RFC 9110 token.
bool valid_header_name(std::string_view name);
/// A header's value: tabs and visible bytes, no other control character.
bool valid_header_value(std::string_view value);
/// Content-Length or Transfer-Encoding: the body's framing, the client's to
/// write from the body it sends, never a caller's.
bool is_framing_header(std::string_view name);

/// Parses "Name: value; Name2: value2" (the plugins' `headers` option);
/// throws std::invalid_argument naming the bad entry. Values never appear in
/// the message (they are often secrets).
std::vector<std::pair<std::string, std::string>> parse_headers(const std::string& text);

class HttpClient {
 public:
  struct Options {
    Endpoint endpoint;
    std::chrono::milliseconds timeout{2000};
    size_t max_connections = 64;
    std::vector<std::pair<std::string, std::string>> headers;  // sent with every request (e.g. Authorization)
    // https: the server's certificate is checked (chain and host name)
    // against tls_ca, or the system's CAs when it is empty.
    bool tls_verify = true;
    std::string tls_ca;
    /// A bearer token from an OAuth 2.0 token endpoint on every request
    /// (client credentials); fetched again once when the service answers 401.
    OAuthOptions oauth;
  };
  using Headers = std::vector<std::pair<std::string, std::string>>;
  /// The last moment a request may go on the wire. A request still waiting
  /// for a connection then is abandoned and reported not sent (BeforeSend),
  /// and is never sent later: by then the host has taken the call as
  /// uncertain, and may have asked the remote about it and been told "never
  /// sent". Nothing: the client's own timeout from the request.
  using SendBy = std::optional<std::chrono::steady_clock::time_point>;

  explicit HttpClient(Options opt);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  /// Queues one request; `done` runs exactly once on the client's thread.
  /// Interim answers (1xx) are read past: `done` gets the final one.
  void request(const std::string& method, const std::string& target, std::string body, Headers headers, SendBy send_by,
               std::function<void(HttpResult)> done);

  const Endpoint& endpoint() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idemsink::plugins
