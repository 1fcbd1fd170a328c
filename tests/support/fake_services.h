// The fake external services (examples/fake_services) as a test process.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/process.h"

namespace idemsink::test {

class FakeServices {
 public:
  /// `flags` are extra command-line flags, e.g. {"--faults", "waybill:error_5xx=0.05"}.
  explicit FakeServices(std::vector<std::string> flags = {});
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  /// GET /stats?detail=1
  nlohmann::json stats();
  /// Blocking HTTP request to the services; returns {status, body}.
  std::pair<int, std::string> request(const std::string& method, const std::string& target, const std::string& body = "");

 private:
  ScratchDir dir_;
  std::unique_ptr<Process> proc_;
  int port_ = 0;
};

/// Path of the shipped plugin `name` (waybill, inventory, sms, ledger).
std::string shipped_plugin(const std::string& name);

}  // namespace idemsink::test
