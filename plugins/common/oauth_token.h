// OAuth 2.0 client credentials (RFC 6749 4.4) for the remote plugins: the
// bearer token a service wants, fetched from its token endpoint on the HTTP
// client's own thread, cached until shortly before it expires, and fetched
// again, once, when the service answers 401 to it. The client secret goes
// into the token request's Authorization header (HTTP Basic) and nowhere
// else: not into errors, not into the log.
#pragma once

#include <utility>  // before Boost.Asio 1.74: its awaitable.hpp uses std::exchange
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace idemsink::plugins {

struct OAuthOptions {
  std::string token_url;  // empty: no token
  std::string client_id;
  std::string client_secret;
  std::string scope;
  std::string tls_ca;  // https: the CAs the endpoint's certificate must chain to; empty: the system's
  bool tls_verify = true;
  std::chrono::milliseconds timeout{5000};
  bool enabled() const { return !token_url.empty(); }
};

/// Runs on `io`'s thread only (the HTTP client's).
class OAuthToken {
 public:
  OAuthToken(boost::asio::io_context& io, OAuthOptions opt);
  ~OAuthToken();

  /// The token, now if a valid one is cached, else once fetched: `then(token,
  /// "")`, or `then(nullopt, why)` when the endpoint failed (the caller's
  /// request was never sent). Requests asking while a fetch is under way
  /// wait for that one fetch.
  using Then = std::function<void(std::optional<std::string> token, std::string why)>;
  void get(Then then);
  /// The service refused `token` (401): the next get() fetches a new one,
  /// unless one newer than it is already cached.
  void refused(const std::string& token);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idemsink::plugins
