#include "devkit/schema_registry.h"

#include <cstdlib>
#include <stdexcept>

#include "core/common/http_fetch.h"

namespace idemsink::devkit {

SchemaRegistry::SchemaRegistry(const std::filesystem::path& dir) : dir_(dir), port_(free_port()) { start(); }

SchemaRegistry::~SchemaRegistry() {
  if (proc_) proc_->kill_now();
}

std::filesystem::path SchemaRegistry::install_dir() {
  if (const char* d = std::getenv("IDEMSINK_REGISTRY_DIR")) return d;
  return IDEMSINK_REGISTRY_DIR;
}

std::string SchemaRegistry::url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/apis/ccompat/v7"; }

void SchemaRegistry::kill() {
  if (proc_) proc_->kill_now();
  proc_.reset();
}

void SchemaRegistry::start() {
  const auto jar = install_dir() / "apicurio-registry-runner.jar";
  if (!std::filesystem::exists(jar))
    throw std::runtime_error("no schema registry at " + jar.string() + ": run scripts/format-tools");
  proc_ = std::make_unique<Process>(
      std::vector<std::string>{java_binary(), "-Xmx384m", "-Dquarkus.http.port=" + std::to_string(port_),
                               "-Dquarkus.http.host=127.0.0.1", "-Dquarkus.log.level=WARN", "-jar", jar.string()},
      dir_ / "registry.out", dir_ / "registry.err");
  HttpFetch ping;
  ping.url = parse_http_url(url() + "/subjects");
  ping.timeout = std::chrono::milliseconds(2000);
  wait_until(
      [&] {
        if (!proc_->running())
          throw std::runtime_error("the schema registry exited: " + proc_->err().substr(0, 2000) +
                                   proc_->out().substr(0, 2000));
        try {
          return http_fetch(ping).status == 200;
        } catch (const std::exception&) {
          return false;
        }
      },
      std::chrono::seconds(120), "the schema registry to answer", std::chrono::milliseconds(200));
}

}  // namespace idemsink::devkit
