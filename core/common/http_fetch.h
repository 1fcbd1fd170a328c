// One HTTP(S) request, synchronous, on the calling thread, every step
// within a deadline: for the host's own small clients that run on a thread
// of their own (the OAuth token endpoint, the schema registry), never on the
// engine thread. The plugins' HTTP client (plugins/common) is asynchronous
// and pooled; these clients make a request now and then and cache the answer.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace idemsink {

struct HttpUrl {
  bool tls = false;
  std::string host;
  std::string port;
  std::string target;  // path and query, "/" at least
};

/// An http:// or https:// URL; throws std::runtime_error saying what is wrong.
HttpUrl parse_http_url(const std::string& url);

struct HttpFetch {
  std::string method = "GET";
  HttpUrl url;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string tls_ca;  // PEM CAs the server's certificate must chain to; empty: the system's
  std::chrono::milliseconds timeout{5000};
};

struct HttpAnswer {
  int status = 0;
  std::string body;
};

/// Sends the request and reads the answer; throws std::exception (connect,
/// TLS, timeout, a broken answer) with the cause in its message.
HttpAnswer http_fetch(const HttpFetch& request);

/// RFC 3986 percent-encoding: every byte but letters, digits and -_.~
/// (a path segment, a form value).
std::string percent_encode(std::string_view text);

/// Standard base64 of bytes.
std::string base64_encode(std::string_view bytes);
/// The bytes of standard base64 (padding optional); false when it is not base64.
bool base64_decode(std::string_view text, std::string& out);

}  // namespace idemsink
