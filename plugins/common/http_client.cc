#include "plugins/common/http_client.h"

#include <utility>  // before Boost.Asio 1.74: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/ssl.hpp>
#include <deque>
#include <mutex>
#include <string_view>
#include <stdexcept>
#include <thread>

namespace idemsink::plugins {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

namespace {

bool has_header(const HttpClient::Headers& headers, std::string_view name, size_t from = 0) {
  for (size_t i = from; i < headers.size(); ++i)
    if (beast::iequals(headers[i].first, beast::string_view(name.data(), name.size()))) return true;
  return false;
}

void append_header(std::string& out, std::string_view name, std::string_view value) {
  out.append(name).append(": ").append(value).append("\r\n");
}

// Interim answers read past before a call's final one: a server sending more
// is broken, and the call's answer is taken as lost.
constexpr int kMaxInterimAnswers = 8;

}  // namespace

struct HttpClient::Impl {
  struct Call {
    std::string method;
    std::string target;  // without the endpoint's base path
    std::string body;
    Headers headers;  // this call's; replace the client's of the same name
    std::chrono::steady_clock::time_point send_by;
    std::function<void(HttpResult)> done;
    // While it waits for a connection: fires at send_by.
    std::unique_ptr<asio::steady_timer> queued;
    // Queued: waiting for a connection; Abandoned: its timer reported it not
    // sent (next() skips it); Taken: a connection came first.
    enum class Wait { No, Queued, Abandoned, Taken } wait = Wait::No;
    int interim = 0;            // 1xx answers read so far
    std::string bearer;         // the OAuth token it goes with (Options::oauth)
    bool reauthorized = false;  // sent again once with a new token after a 401
  };
  // One connection: plain TCP, or TLS over it (https endpoints).
  struct Conn {
    Conn(asio::io_context& io, ssl::context* tls) {
      if (tls) {
        secure = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(io, *tls);
      } else {
        plain = std::make_unique<beast::tcp_stream>(io);
      }
    }
    beast::tcp_stream& tcp() { return secure ? beast::get_lowest_layer(*secure) : *plain; }
    /// Runs `fn` with the stream requests are written to and read from.
    template <class Fn>
    void with_stream(Fn&& fn) {
      if (secure) {
        fn(*secure);
      } else {
        fn(*plain);
      }
    }
    std::unique_ptr<beast::tcp_stream> plain;
    std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> secure;
    std::string out;  // the request being written; its capacity is kept from call to call
    beast::flat_buffer buf;
    http::response<http::string_body> res;
  };

  Options opt;
  Headers fixed_headers;  // Host, Content-Type and the `headers` option, as sent with every request
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::unique_ptr<ssl::context> tls;  // https only
  tcp::resolver resolver{io};
  std::vector<tcp::endpoint> endpoints;
  std::vector<std::shared_ptr<Conn>> idle;
  std::deque<std::shared_ptr<Call>> waiting;
  std::unique_ptr<OAuthToken> tokens;  // Options::oauth
  size_t open = 0;                     // connections open or opening
  // Requests handed over by request() from other threads: one wake-up of
  // the client's thread takes every request queued meanwhile.
  std::mutex inbox_mu;
  std::vector<std::shared_ptr<Call>> inbox;
  bool inbox_posted = false;
  std::thread thread;

  explicit Impl(Options o) : opt(std::move(o)) {
    // The `headers` option replaces a default of the same name.
    for (const auto& [name, value] : {std::pair<std::string, std::string>{"Host", opt.endpoint.host},
                                      std::pair<std::string, std::string>{"Content-Type", "application/json"}})
      if (!has_header(opt.headers, name)) fixed_headers.emplace_back(name, value);
    fixed_headers.insert(fixed_headers.end(), opt.headers.begin(), opt.headers.end());
    if (opt.endpoint.tls) {
      // Verification is on unless switched off: the system's CAs, or the
      // given CA file; the name checked is the endpoint's host.
      tls = std::make_unique<ssl::context>(ssl::context::tls_client);
      tls->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                       ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
      if (opt.tls_verify) {
        if (opt.tls_ca.empty()) {
          tls->set_default_verify_paths();
        } else {
          tls->load_verify_file(opt.tls_ca);  // throws naming the problem: a missing or unreadable file
        }
        tls->set_verify_mode(ssl::verify_peer);
        tls->set_verify_callback(ssl::host_name_verification(opt.endpoint.host));
      } else {
        tls->set_verify_mode(ssl::verify_none);
      }
    }
    // Resolved once here so a name that does not resolve is a start-up
    // error; every new connection resolves it again (connect()).
    for (const auto& e : resolver.resolve(opt.endpoint.host, std::to_string(opt.endpoint.port))) endpoints.push_back(e);
    if (endpoints.empty()) throw std::invalid_argument("cannot resolve " + opt.endpoint.host);
    if (opt.oauth.enabled()) tokens = std::make_unique<OAuthToken>(io, opt.oauth);
    thread = std::thread([this] { io.run(); });
  }
  ~Impl() {
    work.reset();
    asio::post(io, [this] {
      for (auto& c : idle) c->tcp().close();
      idle.clear();
    });
    io.stop();
    thread.join();
    tokens.reset();  // calls waiting for a token are told they were not sent
    // Calls still queued never went out: report them so no completion is
    // lost. Their timers go while the io_context they belong to is alive.
    for (auto& c : waiting) c->queued.reset();
    for (auto& c : waiting)
      if (c->wait == Call::Wait::Queued)
        c->done(HttpResult{HttpResult::Failure::BeforeSend, 0, {}, "client shutting down"});
    for (auto& c : inbox) c->done(HttpResult{HttpResult::Failure::BeforeSend, 0, {}, "client shutting down"});
  }

  void hand_over(std::shared_ptr<Call> call) {
    {
      std::lock_guard lock(inbox_mu);
      inbox.push_back(std::move(call));
      if (inbox_posted) return;
      inbox_posted = true;
    }
    asio::post(io, [this] {
      std::vector<std::shared_ptr<Call>> calls;
      {
        std::lock_guard lock(inbox_mu);
        calls.swap(inbox);
        inbox_posted = false;
      }
      for (auto& c : calls) start(std::move(c));
    });
  }

  // The request as HTTP/1.1 bytes, into the connection's buffer: the
  // client's headers (those the call does not replace), the call's, and the
  // length of the body (none for a GET or DELETE without one, as the RFC
  // asks of a request that carries no content).
  void serialize(const Call& call, std::string& out) const {
    out.clear();
    out.append(call.method).append(" ").append(opt.endpoint.base_path).append(call.target).append(" HTTP/1.1\r\n");
    for (const auto& [name, value] : fixed_headers)
      if (!has_header(call.headers, name)) append_header(out, name, value);
    if (!call.bearer.empty() && !has_header(call.headers, "Authorization"))
      append_header(out, "Authorization", "Bearer " + call.bearer);
    // A call's header replaces the client's of the same name, and a later one
    // of the call an earlier one (what setting a header means).
    for (size_t i = 0; i < call.headers.size(); ++i) {
      const auto& [name, value] = call.headers[i];
      if (!is_framing_header(name) && !has_header(call.headers, name, i + 1)) append_header(out, name, value);
    }
    if (!call.body.empty() || call.method == "POST" || call.method == "PUT" || call.method == "PATCH")
      append_header(out, "Content-Length", std::to_string(call.body.size()));
    out.append("\r\n").append(call.body);
  }

  /// Why `call` cannot be written as a request at all, or nothing.
  std::optional<std::string> malformed(const Call& call) const {
    if (!valid_target(opt.endpoint.base_path + call.target))
      return "its target holds a space or control character: " + call.target.substr(0, 200);
    for (const auto& [name, value] : call.headers) {
      if (!valid_header_name(name)) return "\"" + name.substr(0, 64) + "\" is not a header name";
      if (!valid_header_value(value)) return "the value of " + name + " holds a control character";
    }
    return std::nullopt;
  }

  static bool past(const Call& call) { return std::chrono::steady_clock::now() >= call.send_by; }

  static void report_not_sent(const std::shared_ptr<Call>& call) {
    call->done(HttpResult{
        HttpResult::Failure::BeforeSend, 0, {}, "no connection was free before the call's deadline; abandoned unsent"});
  }

  void start(std::shared_ptr<Call> call) {
    if (auto why = malformed(*call)) return call->done(HttpResult{HttpResult::Failure::Invalid, 0, {}, *why});
    if (past(*call)) return report_not_sent(call);
    // A service behind OAuth: the call waits for its token (cached, or one
    // fetch for every call asking meanwhile); without one it is not sent.
    if (tokens && call->bearer.empty())
      return tokens->get([this, call](std::optional<std::string> token, std::string why) {
        if (!token) return call->done(HttpResult{HttpResult::Failure::BeforeSend, 0, {}, why});
        call->bearer = std::move(*token);
        start(call);
      });
    if (!idle.empty()) {
      auto conn = idle.back();
      idle.pop_back();
      send(conn, call, /*reused=*/true);
    } else if (open < opt.max_connections) {
      ++open;
      connect(call);
    } else {
      queue(std::move(call));
    }
  }

  // Waits for a connection until its send_by, then is reported not sent and
  // never sent: the host has given up on it by then.
  void queue(std::shared_ptr<Call> call) {
    call->wait = Call::Wait::Queued;
    call->queued = std::make_unique<asio::steady_timer>(io, call->send_by);
    call->queued->async_wait([call](beast::error_code ec) {
      if (ec || call->wait != Call::Wait::Queued) return;
      call->wait = Call::Wait::Abandoned;
      report_not_sent(call);
    });
    waiting.push_back(std::move(call));
  }

  void failed_before_send(const std::shared_ptr<Call>& call, const std::string& what) {
    --open;
    call->done(HttpResult{HttpResult::Failure::BeforeSend, 0, {}, what});
    next();
  }

  // A new connection resolves the name again: a service that moved (a new
  // load balancer address) is found without a restart. If resolving fails
  // the addresses last seen are tried.
  void connect(std::shared_ptr<Call> call) {
    resolver.async_resolve(
        opt.endpoint.host, std::to_string(opt.endpoint.port),
        [this, call](beast::error_code ec, tcp::resolver::results_type results) {
          if (!ec && !results.empty()) endpoints.assign(results.begin(), results.end());
          auto conn = std::make_shared<Conn>(io, tls.get());
          conn->tcp().expires_after(opt.timeout);
          conn->tcp().async_connect(endpoints, [this, conn, call](beast::error_code ec, const tcp::endpoint&) {
            if (ec) return failed_before_send(call, "connect: " + ec.message());
            if (!conn->secure) return send(conn, call, false);
            // SNI: the name of the service, for servers hosting several.
            if (!SSL_set_tlsext_host_name(conn->secure->native_handle(), opt.endpoint.host.c_str()))
              return failed_before_send(call, "TLS: cannot set the server name");
            conn->secure->async_handshake(ssl::stream_base::client, [this, conn, call](beast::error_code ec) {
              // Nothing was sent yet: a refused certificate is retryable, and
              // its reason (e.g. "certificate verify failed") is the error.
              if (ec) {
                conn->tcp().close();
                return failed_before_send(call, "TLS handshake: " + ec.message());
              }
              send(conn, call, false);
            });
          });
        });
  }

  void send(std::shared_ptr<Conn> conn, std::shared_ptr<Call> call, bool reused) {
    // The one place a request goes on the wire: never past its deadline (a
    // connection that took long to open, or came free late).
    if (past(*call)) {
      release(conn);
      report_not_sent(call);
      next();
      return;
    }
    conn->tcp().expires_after(opt.timeout);
    serialize(*call, conn->out);
    conn->with_stream([&](auto& stream) {
      asio::async_write(stream, asio::buffer(conn->out), [this, conn, call, reused](beast::error_code ec, size_t) {
        if (ec) {
          close(conn);
          // A kept-alive connection the server already closed: nothing was
          // processed, so resend once on a fresh connection.
          if (reused) {
            start(call);
            return;
          }
          call->done(HttpResult{HttpResult::Failure::BeforeSend, 0, {}, "write: " + ec.message()});
          next();
          return;
        }
        receive(conn, call);
      });
    });
  }

  void receive(std::shared_ptr<Conn> conn, std::shared_ptr<Call> call) {
    conn->res = {};
    conn->with_stream([&](auto& stream) {
      http::async_read(stream, conn->buf, conn->res, [this, conn, call](beast::error_code rec, size_t) {
        if (rec) {
          // Sent but unanswered: the server may have acted on it. Never
          // resent here; the core decides by handler kind.
          close(conn);
          call->done(HttpResult{
              HttpResult::Failure::AfterSend, 0, {}, rec == beast::error::timeout ? "timeout" : rec.message()});
          next();
          return;
        }
        const unsigned status = conn->res.result_int();
        // An interim answer (103 Early Hints, 100 Continue, 102 Processing)
        // is not the call's: its final answer follows on this connection.
        // Taking it for the answer would leave the final one unread, for the
        // next call on the connection to take as its own.
        if (status >= 100 && status < 200 && status != 101 && ++call->interim <= kMaxInterimAnswers)
          return receive(conn, call);
        if (status >= 100 && status < 200) {
          // A protocol switch nobody asked for, or answers that never end:
          // nothing on this connection can be trusted to be this call's.
          close(conn);
          call->done(HttpResult{
              HttpResult::Failure::AfterSend, 0, {}, "HTTP " + std::to_string(status) + " and no final answer"});
          next();
          return;
        }
        // The service refused the token (expired early, revoked): not
        // processed, so sent again, once, with a token fetched anew.
        if (status == 401 && tokens && !call->reauthorized) {
          conn->res.keep_alive() ? release(conn) : close(conn);
          tokens->refused(call->bearer);
          call->bearer.clear();
          call->reauthorized = true;
          call->interim = 0;
          start(call);
          next();
          return;
        }
        HttpResult r{HttpResult::Failure::None, status, std::move(conn->res.body()), {}, {}};
        for (const auto& field : conn->res)
          r.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
        if (conn->res.keep_alive()) {
          release(conn);
        } else {
          close(conn);
        }
        call->done(std::move(r));
        next();
      });
    });
  }

  // A connection free for the next call.
  void release(const std::shared_ptr<Conn>& conn) {
    conn->tcp().expires_never();
    idle.push_back(conn);
  }

  void close(const std::shared_ptr<Conn>& conn) {
    beast::error_code ignored;
    conn->tcp().socket().shutdown(tcp::socket::shutdown_both, ignored);
    conn->tcp().close();
    --open;
  }

  void next() {
    while (!waiting.empty()) {
      auto call = std::move(waiting.front());
      waiting.pop_front();
      if (call->wait == Call::Wait::Abandoned) continue;  // already reported not sent
      call->wait = Call::Wait::Taken;                     // its timer, even if already due, reports nothing
      call->queued.reset();
      // Past its deadline (its timer not run yet): reported not sent, and
      // the free connection goes to the next call in line.
      if (past(*call)) {
        report_not_sent(call);
        continue;
      }
      return start(std::move(call));
    }
  }
};

HttpClient::HttpClient(Options opt) : impl_(std::make_unique<Impl>(std::move(opt))) {}
HttpClient::~HttpClient() = default;

const Endpoint& HttpClient::endpoint() const { return impl_->opt.endpoint; }

void HttpClient::request(const std::string& method, const std::string& target, std::string body, Headers headers,
                         SendBy send_by, std::function<void(HttpResult)> done) {
  auto call = std::make_shared<Impl::Call>();
  call->method = method;
  call->target = target;
  call->body = std::move(body);
  call->headers = std::move(headers);
  call->send_by = send_by.value_or(std::chrono::steady_clock::now() + impl_->opt.timeout);
  // Nothing a callback throws may leave the client's thread (it would end
  // the host); the plugins' callbacks catch their own (remote.h: guarded),
  // and a completion dropped here is reported uncertain by the SDK.
  call->done = [done = std::move(done)](HttpResult r) {
    try {
      done(std::move(r));
    } catch (...) {
    }
  };
  impl_->hand_over(std::move(call));
}

}  // namespace idemsink::plugins
