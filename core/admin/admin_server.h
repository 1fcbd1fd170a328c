// Admin HTTP server (Boost.Beast) on its own thread, HTTPS when
// host.admin_tls_cert/key are set:
//   GET  /metrics   Prometheus text
//   GET  /livez     200 while the engine loop runs, 503 when it is stuck
//   GET  /readyz    200 "ok", or 503 naming each problem: a database
//                   unreachable or a job failing, Kafka down or refusing the
//                   login, no partitions once the group settled
//   GET  /healthz   the same as /readyz
//   GET  /status    JSON summary per route
//   GET  /routes    each route: paused (by whom, when), circuit open
//   POST /pause     stop fetching (the consumer stays in its group)
//   POST /resume    fetch again
//   POST /routes/NAME/pause|resume   pause or resume one route on every
//                   host of the group, kept across restarts (in the database)
//                   (these four are the API's /host/... and /routes/...:
//                   logged in the operator log like them)
//   /api/v1/...     the operator's API (api.h), on threads of its own
//   GET  /          the console (console.h): a page per route, dead
//                   letters, unknown claims, order holds, the operator log
// Who may do what: auth.h. At most 64 connections, 8 KiB of headers, 64 KiB
// of body and 10 s per request; at most 32 API calls at a time (a call may
// wait for a plugin's reconcile hook or a database: 503 "busy" beyond);
// nothing thrown while answering leaves the admin thread.
#pragma once

#include "core/common/asio.h"
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/admin/api.h"
#include "core/admin/auth.h"
#include "core/config/config.h"

namespace idemsink::metrics {
class Metrics;
}  // namespace idemsink::metrics

namespace idemsink::admin {

class AdminServer {
 public:
  /// `cfg.host.admin_listen` is "host:port" (port 0 picks a free one).
  /// Throws on a bad address, a port in use, or TLS files it cannot use.
  AdminServer(const config::Config& cfg, metrics::Metrics& metrics, const SliceViews& slices, Api::Reload reload = {});
  ~AdminServer();
  void stop();
  unsigned short port() const { return port_; }

  /// What every connection reads; touched on the admin thread only, but for
  /// the API, which runs on `api_threads`.
  struct Shared {
    metrics::Metrics& metrics;
    std::vector<pipeline::Controls*> engines;  // one per database; at least one
    std::string host_id;
    const Auth& auth;
    Api api;
    boost::asio::thread_pool& api_threads;
    bool tls;
    std::atomic<size_t> connections{0};  // a session may end on an API thread
    std::atomic<size_t> api_calls{0};    // queued or running on the API threads
  };

 private:
  void accept();

  // Declared first, destroyed last: sessions and API calls still queued when
  // the io context and the threads go hold a reference to it.
  std::unique_ptr<Auth> auth_;
  std::unique_ptr<Shared> shared_;
  boost::asio::io_context io_;
  boost::asio::thread_pool api_threads_{4};
  std::optional<boost::asio::ssl::context> tls_;
  boost::asio::ip::tcp::acceptor acceptor_;
  unsigned short port_ = 0;
  std::thread thread_;
};

}  // namespace idemsink::admin
