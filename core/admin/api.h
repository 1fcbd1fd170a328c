// The operator's API under /api/v1 (its OpenAPI document:
// GET /api/v1/openapi.json): routes, partitions, dead letters, unknown
// claims, order holds and the operator log, and the actions on them, which
// are the CLI's (core/operate/actions.h: one implementation, each action in
// one transaction with its operator-log entry). Answers are JSON; an error is
// {"error": "..."} with 400 (bad input, saying what), 401/403 (auth.h), 404
// (no such thing) or 503 (the database did not answer).
//
// Runs on the API's own threads, never the admin thread: a database that
// does not answer must not stop /metrics and /livez. Each request opens a
// connection to the database of what it touches.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/admin/auth.h"
#include "core/config/config.h"

namespace idemsink::pipeline {
class Engine;
class Reconciler;
}  // namespace idemsink::pipeline
namespace idemsink::metrics {
class Metrics;
}  // namespace idemsink::metrics

namespace idemsink::admin {

/// The part of the host serving one database's routes.
struct SliceView {
  const config::Config* cfg = nullptr;  // [database] is the slice's; only its routes
  pipeline::Engine* engine = nullptr;
  pipeline::Reconciler* reconciler = nullptr;
};

struct ApiRequest {
  std::string method;  // GET or POST
  std::string path;    // without the query
  std::map<std::string, std::string> query;
  std::string body;
  std::string authorization;
  std::string origin;
  std::string own_origin;
};

struct ApiResponse {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
};

class Api {
 public:
  Api(const config::Config& cfg, std::vector<SliceView> slices, metrics::Metrics& metrics, const Auth& auth);

  /// One request (an API thread).
  ApiResponse handle(const ApiRequest& req) const;

 private:
  struct Call;  // one request being answered (api.cc)

  const config::Config& cfg_;
  std::vector<SliceView> slices_;
  metrics::Metrics& metrics_;
  const Auth& auth_;
};

/// "a%20b" -> "a b"; "+" is a space in a query.
std::string percent_decode(std::string_view s);
/// The query string's parameters (a repeated name: the last).
std::map<std::string, std::string> parse_query(std::string_view q);

}  // namespace idemsink::admin
