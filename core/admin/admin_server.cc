#include "core/admin/admin_server.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "core/common/log.h"
#include "core/common/util.h"
#include "core/pipeline/engine.h"
#include "core/pipeline/metrics.h"

namespace idemsink::admin {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = boost::asio::ip::tcp;

namespace {

// One connection: read requests, answer, until the peer closes.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, pipeline::Metrics& metrics, pipeline::Engine& engine, const std::string& host_id)
      : stream_(std::move(socket)), metrics_(metrics), engine_(engine), host_id_(host_id) {}

  void run() { read(); }

 private:
  void read() {
    req_ = {};
    stream_.expires_after(std::chrono::seconds(30));
    http::async_read(stream_, buf_, req_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return;
      self->respond();
    });
  }

  void respond() {
    auto res = std::make_shared<http::response<http::string_body>>(http::status::ok, req_.version());
    res->keep_alive(req_.keep_alive());
    const std::string target(req_.target());
    const auto method = req_.method();
    if (method == http::verb::get && target == "/metrics") {
      res->set(http::field::content_type, "text/plain; version=0.0.4");
      res->body() = metrics_.prometheus();
    } else if (method == http::verb::get && target == "/status") {
      res->set(http::field::content_type, "application/json");
      res->body() = metrics_.status_json(host_id_, engine_.operator_paused());
    } else if (method == http::verb::get && target == "/healthz") {
      // Unreachable and failing are different pages: the first is the
      // database's, the second a job's (its error says which).
      const bool reachable = metrics_.db_healthy.load() != 0;
      const bool jobs_ok = metrics_.db_jobs_failing.load() == 0;
      res->result(reachable && jobs_ok ? http::status::ok : http::status::service_unavailable);
      res->body() = !reachable ? "database unreachable\n"
                    : !jobs_ok ? "a database job is failing: " + metrics_.db_last_job_error() + "\n"
                               : "ok\n";
    } else if (method == http::verb::post && (target == "/pause" || target == "/resume")) {
      engine_.set_operator_pause(target == "/pause");
      res->body() = target == "/pause" ? "paused\n" : "resumed\n";
    } else {
      res->result(http::status::not_found);
      res->body() = "unknown endpoint; try GET /metrics, GET /status, GET /healthz, POST /pause, POST /resume\n";
    }
    res->prepare_payload();
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
  http::request<http::string_body> req_;
  pipeline::Metrics& metrics_;
  pipeline::Engine& engine_;
  const std::string& host_id_;
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

AdminServer::AdminServer(const std::string& listen, pipeline::Metrics& metrics, pipeline::Engine& engine,
                         std::string host_id)
    : metrics_(metrics), engine_(engine), host_id_(std::move(host_id)), acceptor_(io_, parse_listen(listen)) {
  port_ = acceptor_.local_endpoint().port();
  spdlog::info("admin: listening on {}:{}", acceptor_.local_endpoint().address().to_string(), port_);
  accept();
  thread_ = std::thread([this] { io_.run(); });
}

AdminServer::~AdminServer() { stop(); }

void AdminServer::stop() {
  io_.stop();
  if (thread_.joinable()) thread_.join();
}

void AdminServer::accept() {
  acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (!ec) std::make_shared<Session>(std::move(socket), metrics_, engine_, host_id_)->run();
    if (acceptor_.is_open()) accept();
  });
}

}  // namespace idemsink::admin
