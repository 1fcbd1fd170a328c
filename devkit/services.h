// The demo's and the tests' external parts as processes: the embedded Kafka
// (`idemsink dev-kafka`) with its control channel, and the fake external
// services with their HTTP API.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "devkit/process.h"

namespace idemsink::devkit {

/// `idemsink dev-kafka`: librdkafka's mock cluster in a process of its own.
class DevKafka {
 public:
  DevKafka(const std::string& idemsink_binary, std::vector<std::string> extra_args = {});
  ~DevKafka();
  const std::string& bootstrap() const { return bootstrap_; }
  /// Sends one control command; throws unless the answer is "ok".
  void command(const std::string& line);
  pid_t pid() const { return proc_->pid(); }
  /// Whether the cluster's process still runs (librdkafka's mock can abort on
  /// an assertion of its own); its stderr, for saying why not.
  bool running() { return proc_->running(); }
  std::string log() const { return proc_->err(); }

 private:
  ScratchDir dir_;
  std::unique_ptr<Process> proc_;
  std::string bootstrap_;
  int control_fd_ = -1;
};

/// `idemsink-fake-services` on a free loopback port.
class FakeServices {
 public:
  /// `flags` are extra command-line flags, e.g. {"--faults", "waybill:error_5xx=0.05"}.
  FakeServices(const std::string& binary, std::vector<std::string> flags = {});
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  /// The same services over HTTPS (started with --tls-cert and --tls-key).
  std::string tls_url() const { return "https://127.0.0.1:" + std::to_string(tls_port_); }
  int port() const { return port_; }
  pid_t pid() const { return proc_->pid(); }
  /// GET /stats?detail=1
  nlohmann::json stats();
  /// POST /admin/reset: every count and effect forgotten, the faults kept.
  void reset();
  /// The orders a service applied at least once (its per-order counts).
  std::set<std::string> applied(const std::string& service);

 private:
  ScratchDir dir_;
  std::unique_ptr<Process> proc_;
  int port_ = 0;
  int tls_port_ = 0;
};

/// A blocking HTTP/1.1 request to 127.0.0.1:port; returns {status, body}.
std::pair<int, std::string> http_request(int port, const std::string& method, const std::string& target,
                                         const std::string& body = "",
                                         const std::vector<std::pair<std::string, std::string>>& headers = {});

}  // namespace idemsink::devkit
