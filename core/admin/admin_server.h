// Admin HTTP server (Boost.Beast) on its own thread:
//   GET  /metrics   Prometheus text
//   GET  /status    JSON summary per route
//   GET  /healthz   200 "ok", or 503 while the database is unreachable
//   POST /pause     stop fetching (the consumer stays in its group)
//   POST /resume    fetch again
#pragma once

#include <utility>  // before Boost.Asio 1.74: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
#include <memory>
#include <string>
#include <thread>

namespace idemsink::pipeline {
class Engine;
class Metrics;
}  // namespace idemsink::pipeline

namespace idemsink::admin {

class AdminServer {
 public:
  /// `listen` is "host:port" (port 0 picks a free one). Throws on a bad
  /// address or a port in use.
  AdminServer(const std::string& listen, pipeline::Metrics& metrics, pipeline::Engine& engine, std::string host_id);
  ~AdminServer();
  void stop();
  unsigned short port() const { return port_; }

 private:
  void accept();

  pipeline::Metrics& metrics_;
  pipeline::Engine& engine_;
  std::string host_id_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  unsigned short port_ = 0;
  std::thread thread_;
};

}  // namespace idemsink::admin
