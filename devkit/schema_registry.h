// A schema registry for tests: Apicurio Registry (scripts/format-tools puts
// it in build/registry) in memory on a loopback port, speaking Confluent's
// API under /apis/ccompat/v7. Stoppable and startable again (its schemas are
// in memory: a restart forgets them, which the tests that stop it never need
// back), so the host's "registry unreachable" path can be driven.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "devkit/process.h"

namespace idemsink::devkit {

class SchemaRegistry {
 public:
  explicit SchemaRegistry(const std::filesystem::path& dir);
  ~SchemaRegistry();

  /// The base URL of the Confluent-compatible API.
  std::string url() const;
  /// Stops it (SIGKILL): requests fail to connect until start().
  void kill();
  /// Starts it on the same port; returns once it answers.
  void start();

  /// Where build/registry is (IDEMSINK_REGISTRY_DIR overrides).
  static std::filesystem::path install_dir();

 private:
  std::filesystem::path dir_;
  int port_;
  std::unique_ptr<Process> proc_;
};

}  // namespace idemsink::devkit
