#include "core/app/commands.h"

#include <iostream>

#include "core/common/log.h"
#include "core/kafka/dev_cluster.h"
#include "core/pipeline/host.h"

namespace idemsink::app {

int run(const config::Config& cfg) { return pipeline::run_host(cfg); }

int check_config(const config::Config& cfg) {
  auto libs = pipeline::load_route_plugins(cfg);
  std::cout << cfg.file.string() << ": ok\n";
  for (size_t i = 0; i < cfg.routes.size(); ++i) {
    const auto& r = cfg.routes[i];
    std::cout << "  route " << r.name << ": " << r.topic << " -> " << libs[i]->name() << " "
              << libs[i]->descriptor().version << " (" << plugin::kind_name(libs[i]->kind()) << "), DLQ "
              << (r.dlq.enabled ? r.dlq.topic : "disabled") << "\n";
  }
  return 0;
}

int schema(const config::Config& cfg, bool apply) {
  auto libs = pipeline::load_route_plugins(cfg);
  if (apply) {
    pipeline::apply_schema(cfg, libs);
    std::cout << "schema applied to " << cfg.database.database << "\n";
    return 0;
  }
  for (const auto& stmt : pipeline::schema_statements(cfg, libs)) std::cout << stmt << ";\n\n";
  return 0;
}

int dev_kafka(int brokers, const std::vector<std::string>& topics, int control_port) {
  kafka::DevClusterOptions opt;
  opt.brokers = brokers;
  opt.control_port = control_port;
  for (const auto& t : topics) {
    const auto colon = t.rfind(':');
    if (colon == std::string::npos || colon == 0) throw std::invalid_argument("--topic wants NAME:PARTITIONS, got " + t);
    opt.topics.emplace_back(t.substr(0, colon), std::stoi(t.substr(colon + 1)));
  }
  return kafka::run_dev_cluster(opt);
}

}  // namespace idemsink::app
