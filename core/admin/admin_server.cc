#include "core/admin/admin_server.h"

#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <type_traits>

#include "core/admin/console.h"
#include "core/admin/url.h"
#include "core/common/fault.h"
#include "core/common/log.h"
#include "core/common/util.h"
#include "core/metrics/metrics.h"
#include "core/pipeline/controls.h"

namespace idemsink::admin {

namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = boost::asio::ssl;
using tcp = boost::asio::ip::tcp;

namespace {

// Limits for a port that may face a hostile network: requests are small.
constexpr size_t kMaxConnections = 64;
constexpr uint32_t kHeaderLimit = 8 * 1024;
constexpr uint64_t kBodyLimit = 64 * 1024;
constexpr auto kRequestDeadline = std::chrono::seconds(10);  // also the idle keep-alive wait
constexpr size_t kMaxApiCalls = 32;

using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

std::string_view field(const Request& req, http::field f) {
  const auto v = req[f];
  return {v.data(), v.size()};
}

// One connection (plain or TLS): read requests, answer, until the peer closes.
template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
 public:
  template <class... Args>
  Session(AdminServer::Shared& shared, Args&&... args) : stream_(std::forward<Args>(args)...), shared_(shared) {
    ++shared_.connections;
  }
  ~Session() { --shared_.connections; }

  void run() {
    if constexpr (std::is_same_v<Stream, beast::tcp_stream>) {
      read();
    } else {
      beast::get_lowest_layer(stream_).expires_after(kRequestDeadline);
      stream_.async_handshake(ssl::stream_base::server, [self = this->shared_from_this()](beast::error_code ec) {
        if (!ec) self->read();
      });
    }
  }

 private:
  void read() {
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(kBodyLimit);
    beast::get_lowest_layer(stream_).expires_after(kRequestDeadline);
    http::async_read(stream_, buf_, *parser_, [self = this->shared_from_this()](beast::error_code ec, size_t) {
      if (ec == http::error::header_limit) return self->refuse(http::status::request_header_fields_too_large);
      if (ec == http::error::body_limit) return self->refuse(http::status::payload_too_large);
      if (ec) return;  // closed, timed out or malformed: nothing worth answering
      self->respond(self->parser_->release());
    });
  }

  // A request over a limit: answered, and the connection closed.
  void refuse(http::status status) {
    auto res = std::make_shared<Response>(status, 11);
    res->keep_alive(false);
    res->body() = std::string(http::obsolete_reason(status)) + "\n";
    res->prepare_payload();
    write(res);
  }

  void respond(Request req) {
    const std::string target(req.target());
    if (target.rfind("/api/v1/", 0) == 0) return api(std::move(req), target);
    // The host's and a route's pause: the API's, with a note saying where they came from.
    if (req.method() == http::verb::post && (target == "/pause" || target == "/resume"))
      return api(std::move(req), "/api/v1/host" + target);
    if (req.method() == http::verb::post && target.rfind("/routes/", 0) == 0)
      return api(std::move(req), "/api/v1" + target);
    auto res = std::make_shared<Response>(http::status::ok, req.version());
    res->keep_alive(req.keep_alive());
    try {
      answer(req, *res);
    } catch (const std::exception& e) {
      // Never past this point: an exception on the admin thread would end the host.
      spdlog::error("admin: {} {} failed: {}", std::string(req.method_string()), printable(target), e.what());
      res->result(http::status::internal_server_error);
      res->body() = "internal error\n";
    }
    res->prepare_payload();
    write(res);
  }

  static constexpr const char* scheme() { return std::is_same_v<Stream, beast::tcp_stream> ? "http" : "https"; }

  // An API call runs on the API's threads (it may wait for a database or a
  // plugin); its answer comes back to this connection's thread, which also
  // drops the call's hold on the session.
  void api(Request req, const std::string& target) {
    ApiRequest r;
    r.method = std::string(req.method_string());
    const size_t q = target.find('?');
    r.path = target.substr(0, q);
    if (q != std::string::npos) r.query = parse_query(std::string_view(target).substr(q + 1));
    r.body = std::move(req.body());
    // The old /pause and /routes/NAME/pause took no body: their note says where they came from.
    if (r.body.empty() && r.method == "POST" && target != std::string(req.target()))
      r.body = nlohmann::json{{"note", "through POST " + std::string(req.target())}}.dump();
    r.authorization = std::string(field(req, http::field::authorization));
    r.origin = std::string(field(req, http::field::origin));
    r.host = std::string(field(req, http::field::host));
    r.scheme = scheme();
    if (++shared_.api_calls > kMaxApiCalls) {
      --shared_.api_calls;
      return answer_api(ApiResponse{503, "{\"error\":\"the API is busy: too many calls at once; try again\"}\n"},
                        req.version(), req.keep_alive());
    }
    boost::asio::post(shared_.api_threads, [self = this->shared_from_this(), r = std::move(r), version = req.version(),
                                            keep = req.keep_alive()]() mutable {
      ApiResponse out;
      try {
        out = self->shared_.api.handle(r);
      } catch (const std::exception& e) {
        spdlog::error("admin: {} {} failed: {}", r.method, printable(r.path), e.what());
        out = {500, nlohmann::json{{"error", std::string("internal error: ") + e.what()}}.dump(
                        -1, ' ', false, nlohmann::json::error_handler_t::replace) +
                        "\n"};
      }
      --self->shared_.api_calls;
      if (out.status == 401 || out.status == 403)
        spdlog::warn("admin: refused {} {}: {}", r.method, printable(r.path), printable(out.body, 300));
      auto& executor = self->stream_;
      boost::asio::post(executor.get_executor(), [self = std::move(self), out = std::move(out), version, keep] {
        self->answer_api(out, version, keep);
      });
    });
  }

  void answer_api(const ApiResponse& out, unsigned version, bool keep) {
    auto res = std::make_shared<Response>(static_cast<http::status>(out.status), version);
    res->keep_alive(keep);
    res->set(http::field::content_type, out.content_type);
    res->set(http::field::cache_control, "no-store");
    if (out.status == 401) res->set(http::field::www_authenticate, "Bearer");
    res->body() = out.body;
    res->prepare_payload();
    write(res);
  }

  // Refuses a request its caller may not make; true if refused.
  bool refused(const Request& req, Response& res, Need need, const std::string& route = "") const {
    const Auth::Verdict v =
        shared_.auth.check(need, field(req, http::field::authorization), field(req, http::field::origin),
                           field(req, http::field::host), scheme(), route);
    if (v.caller) return false;
    res.result(static_cast<http::status>(v.status));
    if (v.status == 401) res.set(http::field::www_authenticate, "Bearer");
    res.body() = v.why + "\n";
    spdlog::warn("admin: refused {} {}: {}", std::string(req.method_string()),
                 printable(std::string_view(req.target().data(), req.target().size())), v.why);
    return true;
  }

  void answer(const Request& req, Response& res) {
    if (fault::once("admin_throws")) throw std::runtime_error("fault admin_throws");
    const std::string target(req.target());
    const auto method = req.method();
    if (method == http::verb::get && (target == "/" || target.rfind("/console/", 0) == 0)) {
      // The console's files carry no data: the API it calls asks for a token.
      const auto file = console_file(target);
      if (!file) {
        res.result(http::status::not_found);
        res.body() = "no such file\n";
        return;
      }
      res.set(http::field::content_type, std::string(file->content_type));
      res.set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'");
      res.body() = std::string(file->body);
    } else if (method == http::verb::get && target == "/metrics") {
      if (refused(req, res, Need::Probe)) return;
      res.set(http::field::content_type, "text/plain; version=0.0.4");
      res.body() = shared_.metrics.prometheus();
    } else if (method == http::verb::get && target == "/livez") {
      if (refused(req, res, Need::Probe)) return;
      // The engine thread beats every second; a loop stuck in one handler
      // (a plugin blocking it, a deadlock) stops the beat.
      const auto silent = shared_.metrics.since_heartbeat();
      const bool alive = silent < std::chrono::seconds(10);
      res.result(alive ? http::status::ok : http::status::service_unavailable);
      res.body() = alive ? "ok\n" : "engine loop has not run for " + std::to_string(silent.count() / 1000) + "s\n";
    } else if (method == http::verb::get && (target == "/readyz" || target == "/healthz")) {
      if (refused(req, res, Need::Probe)) return;
      // Each problem on its own line: a database unreachable or a job
      // failing (which), Kafka down or refusing the login (the error), or
      // no partitions once the group has settled.
      const std::string problem = shared_.metrics.readiness_problem();
      res.result(problem.empty() ? http::status::ok : http::status::service_unavailable);
      res.body() = problem.empty() ? "ok\n" : problem;
    } else if (method == http::verb::get && target == "/status") {
      if (refused(req, res, Need::Read)) return;
      res.set(http::field::content_type, "application/json");
      res.body() = shared_.metrics.status_json(shared_.host_id, shared_.engines.front()->operator_paused());
    } else if (method == http::verb::get && target == "/routes") {
      if (refused(req, res, Need::Read)) return;
      res.set(http::field::content_type, "application/json");
      res.body() = routes_json();
    } else {
      res.result(http::status::not_found);
      res.body() =
          "unknown endpoint; try GET / (the console), /api/v1/openapi.json, /metrics, /status, /livez, /readyz, "
          "/routes; POST /pause, /resume, /routes/NAME/pause, /routes/NAME/resume\n";
    }
  }

  std::string routes_json() const {
    nlohmann::json out = nlohmann::json::array();
    for (auto* engine : shared_.engines)
      for (const auto& v : engine->route_pauses())
        out.push_back({{"route", v.route},
                       {"topic", v.topic},
                       {"paused", v.paused},
                       {"changed_by", v.changed_by},
                       {"changed_at", v.changed_at},
                       {"circuit_open", v.circuit_open}});
    return out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }

  void write(std::shared_ptr<Response> res) {
    beast::get_lowest_layer(stream_).expires_after(kRequestDeadline);
    http::async_write(stream_, *res, [self = this->shared_from_this(), res](beast::error_code ec, size_t) {
      if (ec || !res->keep_alive()) {
        beast::error_code ignored;
        beast::get_lowest_layer(self->stream_).socket().shutdown(tcp::socket::shutdown_send, ignored);
        return;
      }
      self->read();
    });
  }

  Stream stream_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  AdminServer::Shared& shared_;
};

tcp::endpoint parse_listen(const std::string& listen) {
  const std::optional<HostPort> hp = parse_host_port(listen);
  if (!hp)
    throw std::invalid_argument(
        "host.admin_listen must be an IP address and a port 0..65535 (\"127.0.0.1:9464\", "
        "\"[::1]:9464\"), got \"" +
        listen + "\"");
  return tcp::endpoint(boost::asio::ip::make_address(hp->host), hp->port);
}

}  // namespace

AdminServer::AdminServer(const config::Config& cfg, metrics::Metrics& metrics, const SliceViews& slices,
                         Api::Reload reload)
    : acceptor_(io_, parse_listen(cfg.host.admin_listen)) {
  port_ = acceptor_.local_endpoint().port();
  const bool loopback = acceptor_.local_endpoint().address().is_loopback();
  if (!cfg.host.admin_tls_cert.empty()) {
    tls_.emplace(ssl::context::tls_server);
    tls_->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                      ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
    tls_->use_certificate_chain_file(cfg.host.admin_tls_cert);
    tls_->use_private_key_file(cfg.host.admin_tls_key, ssl::context::pem);
  }
  std::vector<pipeline::Controls*> engines;
  for (const auto& s : *slices.get()) engines.push_back(s.controls);
  auth_ = std::make_unique<Auth>(cfg.host.admin_tokens, loopback, cfg.host.admin_open_probes, cfg.host.admin_hostnames,
                                 "admin port of " + cfg.host.id);
  shared_.reset(new Shared{metrics, engines, cfg.host.id, *auth_, Api(cfg, slices, metrics, *auth_, std::move(reload)),
                           api_threads_, tls_.has_value()});
  spdlog::info("admin: listening on {}://{}:{} ({} token(s); {})", tls_ ? "https" : "http",
               acceptor_.local_endpoint().address().to_string(), port_, cfg.host.admin_tokens.size(),
               !cfg.host.admin_tokens.empty() ? "actions need a token"
               : loopback                     ? "actions from this machine"
                                              : "actions refused: no token configured");
  accept();
  thread_ = std::thread([this] {
    for (;;) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {
        spdlog::error("admin: {}; serving on", e.what());
      }
    }
  });
}

AdminServer::~AdminServer() { stop(); }

void AdminServer::stop() {
  io_.stop();
  if (thread_.joinable()) thread_.join();
  api_threads_.stop();  // a call waiting for a plugin or a database ends with its own deadline
  api_threads_.join();
}

void AdminServer::accept() {
  acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (!ec) {
      if (shared_->connections >= kMaxConnections) {
        beast::error_code ignored;
        socket.close(ignored);  // at the cap: refused at once, the others keep being served
      } else if (tls_) {
        std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(*shared_, std::move(socket), *tls_)->run();
      } else {
        std::make_shared<Session<beast::tcp_stream>>(*shared_, std::move(socket))->run();
      }
    }
    if (acceptor_.is_open()) accept();
  });
}

}  // namespace idemsink::admin
