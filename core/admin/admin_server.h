// Admin HTTP server (Boost.Beast) on its own thread:
//   GET  /metrics   Prometheus text
//   GET  /status    JSON summary per route
//   GET  /livez     200 while the engine loop runs, 503 when it is stuck
//   GET  /readyz    200 "ok", or 503 naming each problem: a database
//                   unreachable or a job failing, Kafka down or refusing the
//                   login, no partitions once the group settled
//   GET  /healthz   the same as /readyz
//   GET  /routes    each route: paused (by whom, when), circuit open
//   POST /pause     stop fetching (the consumer stays in its group)
//   POST /resume    fetch again
//   POST /routes/NAME/pause|resume   pause or resume one route on every
//                   host of the group, kept across restarts (in the database)
// POST needs the bearer token (host.admin_token_env), or, without one, a
// loopback listen address; a request carrying an Origin header (a browser's
// cross-site request) is refused. At most 64 connections, 8 KiB of headers,
// 4 KiB of body and 10 s per request; nothing thrown while answering leaves
// the admin thread.
#pragma once

#include "core/common/asio.h"
#include <memory>
#include <string>
#include <vector>
#include <thread>

namespace idemsink::pipeline {
class Engine;
}  // namespace idemsink::pipeline
namespace idemsink::metrics {
class Metrics;
}  // namespace idemsink::metrics

namespace idemsink::admin {

class AdminServer {
 public:
  /// `listen` is "host:port" (port 0 picks a free one). Throws on a bad
  /// address or a port in use.
  AdminServer(const std::string& listen, std::string token, metrics::Metrics& metrics,
              std::vector<pipeline::Engine*> engines, std::string host_id);
  ~AdminServer();
  void stop();
  unsigned short port() const { return port_; }

  /// What every connection reads; touched on the admin thread only.
  struct Shared {
    metrics::Metrics& metrics;
    std::vector<pipeline::Engine*> engines;  // one per database; at least one
    std::string host_id;
    std::string token;  // empty: none configured
    bool loopback;      // the listen address is loopback
    size_t connections;
  };

 private:
  void accept();

  Shared shared_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  unsigned short port_ = 0;
  std::thread thread_;
};

}  // namespace idemsink::admin
