// The operator's API under /api/v1 (its OpenAPI document:
// GET /api/v1/openapi.json): routes, partitions, dead letters, unknown
// claims, order holds and the operator log, and the actions on them, which
// are the CLI's (core/operate/actions.h: one implementation, each action in
// one transaction with its operator-log entry). Answers are JSON; an error is
// {"error": "..."} with 400 (bad input, saying what), 401/403 (auth.h), 404
// (no such thing), 409 (the action did not apply, saying why) or 503 (the
// database did not answer, or the API is busy).
//
// Runs on the API's own threads, never the admin thread: a database that
// does not answer must not stop /metrics and /livez. Each request opens a
// connection to the database of what it touches.
#pragma once

#include <atomic>

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/admin/auth.h"
#include "core/config/config.h"
#include "core/format/decoder.h"
#include "core/operate/actions.h"

namespace idemsink::pipeline {
class Controls;
}  // namespace idemsink::pipeline
namespace idemsink::reconcile {
class Reconciler;
}  // namespace idemsink::reconcile
namespace idemsink::metrics {
class Metrics;
}  // namespace idemsink::metrics

namespace idemsink::admin {

/// The part of the host serving one database's routes.
struct SliceView {
  std::shared_ptr<const config::Config> cfg;  // [database] is the slice's; only its routes
  pipeline::Controls* controls = nullptr;     // the slice's engine, as the admin port may use it
  reconcile::Reconciler* reconciler = nullptr;
  /// The routes whose records are decoded (docs/formats.md): a dead letter
  /// is shown decoded as its route reads it.
  std::map<std::string, const format::RecordDecoder*> decoders;
};

/// The slices as the admin port sees them: replaced whole when a reload adds
/// or removes a route; a request works on the set it began with.
class SliceViews {
 public:
  explicit SliceViews(std::vector<SliceView> slices)
      : slices_(std::make_shared<const std::vector<SliceView>>(std::move(slices))) {}
  std::shared_ptr<const std::vector<SliceView>> get() const {
    std::lock_guard lk(mu_);
    return slices_;
  }
  void set(std::vector<SliceView> slices) {
    auto next = std::make_shared<const std::vector<SliceView>>(std::move(slices));
    std::lock_guard lk(mu_);
    slices_ = std::move(next);
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const std::vector<SliceView>> slices_;
};

struct ApiRequest {
  std::string method;  // GET or POST
  std::string path;    // without the query
  std::map<std::string, std::string> query;
  std::string body;
  std::string authorization;
  std::string origin;
  std::string host;    // the Host header
  std::string scheme;  // http or https
};

struct ApiResponse {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
};

class Api {
 public:
  /// The host's reload (POST /host/reload), on an API thread: blocks until applied or refused.
  using Reload = std::function<operate::Done(const operate::Actor& who, bool force, const std::string& note)>;

  Api(const config::Config& cfg, const SliceViews& slices, metrics::Metrics& metrics, const Auth& auth, Reload reload);

  /// One request (an API thread).
  ApiResponse handle(const ApiRequest& req) const;

  /// The endpoints handle() answers, each as openapi.json writes it
  /// ({"GET", "/routes/{route}"}): a test holds the two to each other.
  static std::vector<std::pair<std::string_view, std::string_view>> endpoints();

 private:
  struct Call;      // one request being answered (api_call.h)
  struct Endpoint;  // a method and path, and the Call function answering it
  static const Endpoint kEndpoints[];
  /// The endpoint a request's method and path segments name, or null.
  static const Endpoint* endpoint_for(std::string_view method, const std::vector<std::string>& parts);
  /// Records done per second per route, from the counters between two calls
  /// at least kRateWindow apart.
  double rate(const std::string& route, uint64_t done) const;

  const config::Config& cfg_;
  const SliceViews& slices_;
  metrics::Metrics& metrics_;
  const Auth& auth_;
  Reload reload_;
  mutable std::mutex rate_mu_;
  struct Sample {
    std::chrono::steady_clock::time_point at;
    uint64_t done = 0;
    double rate = 0;
  };
  mutable std::map<std::string, Sample> rates_;
  /// Reconcile hooks being asked for GET /unknowns/{token} now: each holds a
  /// request slot of the port for up to the route's call_timeout.
  static constexpr int kMaxHookQuestions = 4;
  mutable std::atomic<int> hook_questions_{0};
};

}  // namespace idemsink::admin
