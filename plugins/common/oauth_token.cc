#include "plugins/common/oauth_token.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/core/detail/base64.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cctype>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "plugins/common/http_client.h"

namespace idemsink::plugins {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

std::string form_encode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
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

std::string base64(const std::string& s) {
  std::string out(beast::detail::base64::encoded_size(s.size()), '\0');
  out.resize(beast::detail::base64::encode(out.data(), s.data(), s.size()));
  return out;
}

}  // namespace

struct OAuthToken::Impl {
  // One token request: its own connection, closed after the answer.
  struct Fetch {
    Fetch(asio::io_context& io, ssl::context* tls) : resolver(io) {
      if (tls) {
        secure = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(io, *tls);
      } else {
        plain = std::make_unique<beast::tcp_stream>(io);
      }
    }
    beast::tcp_stream& tcp() { return secure ? beast::get_lowest_layer(*secure) : *plain; }
    tcp::resolver resolver;
    std::unique_ptr<beast::tcp_stream> plain;
    std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> secure;
    http::request<http::string_body> req;
    http::response<http::string_body> res;
    beast::flat_buffer buf;
  };

  asio::io_context& io;
  OAuthOptions opt;
  Endpoint endpoint;
  std::unique_ptr<ssl::context> tls;
  std::optional<std::string> token;
  Clock::time_point renew_at;  // a little before it expires
  std::vector<Then> waiting;   // asked while a fetch is under way

  Impl(asio::io_context& i, OAuthOptions o) : io(i), opt(std::move(o)), endpoint(parse_url(opt.token_url)) {
    if (!endpoint.tls) return;
    tls = std::make_unique<ssl::context>(ssl::context::tls_client);
    tls->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                     ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
    if (opt.tls_verify) {
      if (opt.tls_ca.empty()) {
        tls->set_default_verify_paths();
      } else {
        tls->load_verify_file(opt.tls_ca);
      }
      tls->set_verify_mode(ssl::verify_peer);
      tls->set_verify_callback(ssl::host_name_verification(endpoint.host));
    } else {
      tls->set_verify_mode(ssl::verify_none);
    }
  }

  void get(Then then) {
    if (token && Clock::now() < renew_at) return then(token, "");
    waiting.push_back(std::move(then));
    if (waiting.size() == 1) fetch();
  }

  // Every request waiting gets the fetch's outcome.
  void answer(std::optional<std::string> t, const std::string& why) {
    auto all = std::move(waiting);
    waiting.clear();
    for (auto& then : all) then(t, why);
  }

  void failed(const std::string& why) { answer(std::nullopt, "no OAuth token from " + opt.token_url + ": " + why); }

  void fetch() {
    auto f = std::make_shared<Fetch>(io, tls.get());
    f->req = {http::verb::post, endpoint.base_path.empty() ? "/" : endpoint.base_path, 11};
    f->req.set(http::field::host, endpoint.host);
    f->req.set(http::field::content_type, "application/x-www-form-urlencoded");
    f->req.set(http::field::accept, "application/json");
    // RFC 6749 2.3.1: HTTP Basic, the id and secret form-encoded first.
    f->req.set(http::field::authorization,
               "Basic " + base64(form_encode(opt.client_id) + ":" + form_encode(opt.client_secret)));
    f->req.body() = "grant_type=client_credentials" + (opt.scope.empty() ? "" : "&scope=" + form_encode(opt.scope));
    f->req.prepare_payload();
    f->tcp().expires_after(opt.timeout);
    f->resolver.async_resolve(endpoint.host, std::to_string(endpoint.port),
                              [this, f](beast::error_code ec, tcp::resolver::results_type results) {
                                if (ec) return failed("resolve: " + ec.message());
                                f->tcp().async_connect(results, [this, f](beast::error_code ec, const tcp::endpoint&) {
                                  if (ec) return failed("connect: " + ec.message());
                                  if (!f->secure) return write(f, *f->plain);
                                  if (!SSL_set_tlsext_host_name(f->secure->native_handle(), endpoint.host.c_str()))
                                    return failed("TLS: cannot set the server name");
                                  f->secure->async_handshake(ssl::stream_base::client, [this, f](beast::error_code ec) {
                                    if (ec) return failed("TLS handshake: " + ec.message());
                                    write(f, *f->secure);
                                  });
                                });
                              });
  }

  template <class Stream>
  void write(std::shared_ptr<Fetch> f, Stream& stream) {
    http::async_write(stream, f->req, [this, f, &stream](beast::error_code ec, size_t) {
      if (ec) return failed("write: " + ec.message());
      http::async_read(stream, f->buf, f->res, [this, f](beast::error_code ec, size_t) {
        beast::error_code ignored;
        f->tcp().socket().shutdown(tcp::socket::shutdown_both, ignored);
        if (ec) return failed(ec == beast::error::timeout ? "timeout" : ec.message());
        read(f->res);
      });
    });
  }

  void read(const http::response<http::string_body>& res) {
    const auto j = nlohmann::json::parse(res.body(), nullptr, false);
    if (res.result_int() != 200) {
      // An OAuth error names its error (invalid_client, ...); the body goes no further.
      std::string what = "HTTP " + std::to_string(res.result_int());
      if (!j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_string())
        what += " " + j["error"].get<std::string>();
      return failed(what);
    }
    if (j.is_discarded() || !j.is_object() || !j.contains("access_token") || !j["access_token"].is_string())
      return failed("an answer without an access_token");
    const auto lifetime = std::chrono::seconds(
        j.contains("expires_in") && j["expires_in"].is_number_integer() ? j["expires_in"].get<int64_t>() : 3600);
    // Renewed a little before it expires: a tenth of its life, 30 s at most,
    // so a request never goes out with a token about to lapse.
    renew_at = Clock::now() + lifetime - std::min<Clock::duration>(lifetime / 10, std::chrono::seconds(30));
    token = j["access_token"].get<std::string>();
    answer(token, "");
  }
};

OAuthToken::OAuthToken(boost::asio::io_context& io, OAuthOptions opt)
    : impl_(std::make_unique<Impl>(io, std::move(opt))) {}

OAuthToken::~OAuthToken() {
  // Requests still waiting for a token were never sent: they are told so.
  impl_->answer(std::nullopt, "client shutting down");
}

void OAuthToken::get(Then then) { impl_->get(std::move(then)); }

void OAuthToken::refused(const std::string& token) {
  if (impl_->token == token) impl_->token.reset();
}

}  // namespace idemsink::plugins
