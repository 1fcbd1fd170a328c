#include "core/admin/admin_server.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "core/common/fault.h"
#include "core/common/log.h"
#include "core/common/util.h"
#include "core/pipeline/engine.h"
#include "core/metrics/metrics.h"

namespace idemsink::admin {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = boost::asio::ip::tcp;

namespace {

// Limits for a port that may face a hostile network: requests are tiny.
constexpr size_t kMaxConnections = 64;
constexpr uint32_t kHeaderLimit = 8 * 1024;
constexpr uint64_t kBodyLimit = 4 * 1024;
constexpr auto kRequestDeadline = std::chrono::seconds(10);  // also the idle keep-alive wait

// Compares without an early exit, so response time says nothing about how
// much of a guessed token was right.
bool same_secret(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

// One connection: read requests, answer, until the peer closes.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, AdminServer::Shared& shared) : stream_(std::move(socket)), shared_(shared) {
    ++shared_.connections;
  }
  ~Session() { --shared_.connections; }

  void run() { read(); }

 private:
  void read() {
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(kBodyLimit);
    stream_.expires_after(kRequestDeadline);
    http::async_read(stream_, buf_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec == http::error::header_limit) return self->refuse(http::status::request_header_fields_too_large);
      if (ec == http::error::body_limit) return self->refuse(http::status::payload_too_large);
      if (ec) return;  // closed, timed out or malformed: nothing worth answering
      self->respond(self->parser_->release());
    });
  }

  // A request over a limit: answered, and the connection closed.
  void refuse(http::status status) {
    auto res = std::make_shared<http::response<http::string_body>>(status, 11);
    res->keep_alive(false);
    res->body() = std::string(http::obsolete_reason(status)) + "\n";
    res->prepare_payload();
    write(res);
  }

  void respond(http::request<http::string_body> req) {
    auto res = std::make_shared<http::response<http::string_body>>(http::status::ok, req.version());
    res->keep_alive(req.keep_alive());
    try {
      answer(req, *res);
    } catch (const std::exception& e) {
      // Never past this point: an exception on the admin thread would end the host.
      spdlog::error("admin: {} {} failed: {}", std::string(req.method_string()),
                    printable(std::string_view(req.target().data(), req.target().size())), e.what());
      res->result(http::status::internal_server_error);
      res->body() = "internal error\n";
    }
    res->prepare_payload();
    write(res);
  }

  void answer(const http::request<http::string_body>& req, http::response<http::string_body>& res) {
    if (fault::once("admin_throws")) throw std::runtime_error("fault admin_throws");
    const std::string target(req.target());
    const auto method = req.method();
    if (method == http::verb::get && target == "/metrics") {
      res.set(http::field::content_type, "text/plain; version=0.0.4");
      res.body() = shared_.metrics.prometheus();
    } else if (method == http::verb::get && target == "/status") {
      res.set(http::field::content_type, "application/json");
      res.body() = shared_.metrics.status_json(shared_.host_id, shared_.engines.front()->operator_paused());
    } else if (method == http::verb::get && target == "/livez") {
      // The engine thread beats every second; a loop stuck in one handler
      // (a plugin blocking it, a deadlock) stops the beat.
      const auto silent = shared_.metrics.since_heartbeat();
      const bool alive = silent < std::chrono::seconds(10);
      res.result(alive ? http::status::ok : http::status::service_unavailable);
      res.body() = alive ? "ok\n" : "engine loop has not run for " + std::to_string(silent.count() / 1000) + "s\n";
    } else if (method == http::verb::get && (target == "/readyz" || target == "/healthz")) {
      // Each problem on its own line: a database unreachable or a job
      // failing (which), Kafka down or refusing the login (the error), or
      // no partitions once the group has settled.
      const std::string problem = shared_.metrics.readiness_problem();
      res.result(problem.empty() ? http::status::ok : http::status::service_unavailable);
      res.body() = problem.empty() ? "ok\n" : problem;
    } else if (method == http::verb::get && target == "/routes") {
      res.set(http::field::content_type, "application/json");
      res.body() = routes_json();
    } else if (method == http::verb::post && (target == "/pause" || target == "/resume")) {
      if (refused(req, res)) return;
      for (auto* engine : shared_.engines) engine->set_operator_pause(target == "/pause");
      res.body() = target == "/pause" ? "paused\n" : "resumed\n";
    } else if (method == http::verb::post && target.rfind("/routes/", 0) == 0) {
      if (refused(req, res)) return;
      set_route_pause(target.substr(std::string_view("/routes/").size()), res);
    } else {
      res.result(http::status::not_found);
      res.body() =
          "unknown endpoint; try GET /metrics, /status, /livez, /readyz, /routes; POST /pause, /resume, "
          "/routes/NAME/pause, /routes/NAME/resume\n";
    }
  }

  // Refuses a state-changing request that lacks the right to it; true if refused.
  bool refused(const http::request<http::string_body>& req, http::response<http::string_body>& res) const {
    const char* why = forbidden(req);
    if (why == nullptr) return false;
    const std::string_view reason(why);
    res.result(reason.find("bearer token") != std::string_view::npos ? http::status::unauthorized
                                                                     : http::status::forbidden);
    if (res.result() == http::status::unauthorized) res.set(http::field::www_authenticate, "Bearer");
    res.body() = std::string(why) + "\n";
    spdlog::warn("admin: refused POST {}: {}", printable(std::string_view(req.target().data(), req.target().size())),
                 why);
    return true;
  }

  std::string routes_json() const {
    nlohmann::json out = nlohmann::json::array();
    for (auto* engine : shared_.engines)
      for (const auto& v : engine->route_control().view())
        out.push_back({{"route", v.route},
                       {"topic", v.topic},
                       {"paused", v.state.paused},
                       {"changed_by", v.state.changed_by},
                       {"changed_at", v.state.changed_at},
                       {"circuit_open", v.circuit_open}});
    return out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }

  // "NAME/pause" or "NAME/resume": stored in the database, so every host of
  // the group obeys and a restart keeps it.
  void set_route_pause(const std::string& rest, http::response<http::string_body>& res) {
    const auto slash = rest.rfind('/');
    const std::string name = slash == std::string::npos ? rest : rest.substr(0, slash);
    const std::string action = slash == std::string::npos ? "" : rest.substr(slash + 1);
    if (action != "pause" && action != "resume") {
      res.result(http::status::not_found);
      res.body() = "POST /routes/NAME/pause or /routes/NAME/resume\n";
      return;
    }
    for (auto* engine : shared_.engines) {
      if (!engine->route_control().has(name)) continue;
      try {
        engine->route_control().set(name, action == "pause", "admin port of " + shared_.host_id);
      } catch (const std::exception& e) {
        res.result(http::status::service_unavailable);
        res.body() = "route " + name + ": not " + (action == "pause" ? "paused" : "resumed") +
                     ": the database did not take it: " + e.what() + "\n";
        return;
      }
      spdlog::info("admin: route {} {} through the admin port", name, action == "pause" ? "paused" : "resumed");
      res.set(http::field::content_type, "application/json");
      res.body() = routes_json();
      return;
    }
    res.result(http::status::not_found);
    res.body() = "no route named " + printable(name) + "\n";
  }

  // Why a state-changing request is refused, or nullptr.
  const char* forbidden(const http::request<http::string_body>& req) const {
    // Browsers send Origin on cross-site requests; operators' tools do not.
    if (req.find(http::field::origin) != req.end()) return "requests carrying an Origin header are refused";
    if (shared_.token.empty())
      return shared_.loopback ? nullptr : "POST needs host.admin_token_env when admin_listen is not a loopback address";
    const auto field = req[http::field::authorization];
    const std::string_view auth(field.data(), field.size());
    constexpr std::string_view kBearer = "Bearer ";
    if (auth.substr(0, kBearer.size()) != kBearer) return "missing bearer token";
    return same_secret(auth.substr(kBearer.size()), shared_.token) ? nullptr : "wrong bearer token";
  }

  void write(std::shared_ptr<http::response<http::string_body>> res) {
    stream_.expires_after(kRequestDeadline);
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, size_t) {
      if (ec || !res->keep_alive()) {
        beast::error_code ignored;
        self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
        return;
      }
      self->read();
    });
  }

  beast::tcp_stream stream_;
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

AdminServer::AdminServer(const std::string& listen, std::string token, metrics::Metrics& metrics,
                         std::vector<pipeline::Engine*> engines, std::string host_id)
    : shared_{metrics, std::move(engines), std::move(host_id), std::move(token), false, 0},
      acceptor_(io_, parse_listen(listen)) {
  port_ = acceptor_.local_endpoint().port();
  shared_.loopback = acceptor_.local_endpoint().address().is_loopback();
  spdlog::info("admin: listening on {}:{} (POST {})", acceptor_.local_endpoint().address().to_string(), port_,
               !shared_.token.empty() ? "needs the bearer token"
               : shared_.loopback     ? "from this machine"
                                      : "refused");
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
}

void AdminServer::accept() {
  acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (!ec) {
      if (shared_.connections < kMaxConnections) {
        std::make_shared<Session>(std::move(socket), shared_)->run();
      } else {
        beast::error_code ignored;
        socket.close(ignored);  // at the cap: refused at once, the others keep being served
      }
    }
    if (acceptor_.is_open()) accept();
  });
}

}  // namespace idemsink::admin
