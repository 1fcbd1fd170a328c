#include "core/common/http_fetch.h"

#include <utility>  // before Boost.Asio 1.74: its awaitable.hpp uses std::exchange
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/core/detail/base64.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <stdexcept>

namespace idemsink {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// Blocking calls on Beast's streams ignore their timers: every step runs as
// an asynchronous operation on the request's own io_context, with the whole
// request's deadline on the stream's timer and on the context itself (name
// resolution has no timer of its own).
class Steps {
 public:
  Steps(asio::io_context& io, std::chrono::milliseconds timeout)
      : io_(io), deadline_(std::chrono::steady_clock::now() + timeout) {}
  std::chrono::steady_clock::time_point deadline() const { return deadline_; }

  /// Starts `op` with a completion handler and runs until it completes or
  /// the deadline passes; throws on either failure.
  template <class Op>
  void run(const char* what, Op op) {
    bool done = false;
    boost::system::error_code result;
    op([&](boost::system::error_code ec, auto&&...) {
      result = ec;
      done = true;
    });
    io_.restart();
    io_.run_until(deadline_);
    if (!done) {
      io_.stop();
      throw std::runtime_error(std::string(what) + ": timed out");
    }
    if (result) throw std::runtime_error(std::string(what) + ": " + result.message());
  }

 private:
  asio::io_context& io_;
  const std::chrono::steady_clock::time_point deadline_;
};

template <class Stream>
HttpAnswer exchange(Steps& steps, Stream& stream, http::request<http::string_body>& req) {
  steps.run("sending the request", [&](auto handler) { http::async_write(stream, req, handler); });
  beast::flat_buffer buf;
  // An interim answer (1xx, RFC 9110 15.2) is read past: the final one follows.
  for (int interim = 0;; ++interim) {
    http::response<http::string_body> res;
    steps.run("reading the answer", [&](auto handler) { http::async_read(stream, buf, res, handler); });
    const int status = static_cast<int>(res.result_int());
    if (status >= 200 || status == 101) return {status, std::move(res.body())};
    if (interim == 8) throw std::runtime_error("more than eight interim answers");
  }
}

}  // namespace

HttpUrl parse_http_url(const std::string& url) {
  HttpUrl u;
  std::string rest;
  if (url.rfind("https://", 0) == 0) {
    u.tls = true;
    rest = url.substr(8);
  } else if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else {
    throw std::runtime_error("not an http(s) URL");
  }
  const auto slash = rest.find('/');
  u.target = slash == std::string::npos ? "/" : rest.substr(slash);
  rest = rest.substr(0, slash);
  const auto colon = rest.rfind(':');
  u.host = colon == std::string::npos ? rest : rest.substr(0, colon);
  u.port = colon == std::string::npos ? (u.tls ? "443" : "80") : rest.substr(colon + 1);
  if (u.host.empty()) throw std::runtime_error("no host in the URL");
  return u;
}

HttpAnswer http_fetch(const HttpFetch& r) {
  asio::io_context io;
  Steps steps(io, r.timeout);
  http::request<http::string_body> req{r.method == "POST" ? http::verb::post : http::verb::get, r.url.target, 11};
  req.set(http::field::host, r.url.host);
  for (const auto& [name, value] : r.headers) req.set(name, value);
  if (!r.body.empty() || r.method == "POST") {
    req.body() = r.body;
    req.prepare_payload();
  }
  tcp::resolver resolver(io);
  tcp::resolver::results_type endpoints;
  steps.run("resolving the host", [&](auto handler) {
    resolver.async_resolve(r.url.host, r.url.port,
                           [&endpoints, handler](boost::system::error_code ec, tcp::resolver::results_type found) {
                             endpoints = std::move(found);
                             handler(ec);
                           });
  });
  if (!r.url.tls) {
    beast::tcp_stream stream(io);
    stream.expires_at(steps.deadline());
    steps.run("connecting", [&](auto handler) { stream.async_connect(endpoints, handler); });
    return exchange(steps, stream, req);
  }
  asio::ssl::context tls(asio::ssl::context::tls_client);
  tls.set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                  asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1);
  if (r.tls_ca.empty()) {
    tls.set_default_verify_paths();
  } else {
    tls.load_verify_file(r.tls_ca);
  }
  tls.set_verify_mode(asio::ssl::verify_peer);
  tls.set_verify_callback(asio::ssl::host_name_verification(r.url.host));
  beast::ssl_stream<beast::tcp_stream> stream(io, tls);
  if (!SSL_set_tlsext_host_name(stream.native_handle(), r.url.host.c_str()))
    throw std::runtime_error("TLS: cannot set the server name");
  beast::get_lowest_layer(stream).expires_at(steps.deadline());
  steps.run("connecting", [&](auto handler) { beast::get_lowest_layer(stream).async_connect(endpoints, handler); });
  steps.run("the TLS handshake",
            [&](auto handler) { stream.async_handshake(asio::ssl::stream_base::client, handler); });
  return exchange(steps, stream, req);
}

std::string percent_encode(std::string_view text) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string base64_encode(std::string_view bytes) {
  std::string out(beast::detail::base64::encoded_size(bytes.size()), '\0');
  out.resize(beast::detail::base64::encode(out.data(), bytes.data(), bytes.size()));
  return out;
}

bool base64_decode(std::string_view text, std::string& out) {
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  for (char c : text)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '/')) return false;
  std::string padded(text);
  while (padded.size() % 4) padded += '=';
  out.assign(beast::detail::base64::decoded_size(padded.size()), '\0');
  // Beast stops reading at the padding: everything before it must be read.
  const auto [written, read] = beast::detail::base64::decode(out.data(), padded.data(), padded.size());
  out.resize(written);
  return read >= text.size();
}

}  // namespace idemsink
