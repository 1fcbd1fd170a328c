#include "tests/support/scenario.h"

#include <boost/test/unit_test.hpp>

namespace idemsink::test {

Scenario::Scenario(const std::string& name, int brokers) : Scenario(name, devkit::MariaDbServer::shared(), brokers) {}

Scenario::Scenario(const std::string& name, devkit::MariaDbServer& server, int brokers)
    : name(name), kafka(brokers), db(server.fresh_database(name)), dir(name) {}

Scenario& Scenario::topic(const std::string& topic, int partitions, const std::map<std::string, std::string>& configs) {
  kafka.create_topic(topic, partitions, configs);
  topics_.emplace_back(topic, partitions);
  return *this;
}

RouteSpec Scenario::scripted(const std::string& route, const std::string& topic, const std::string& extra,
                             const std::string& plugin) const {
  return RouteSpec{route, topic, plugin, "", {{"log", "\"" + calls_log().string() + "\""}}, extra};
}

HostProcess& Scenario::host(const std::string& id, const std::vector<RouteSpec>& routes, HostOptions opt) {
  std::string host_lines = opt.host_lines;
  int port = 0;
  if (opt.admin) {
    port = devkit::free_port();
    host_lines += "admin_listen = \"127.0.0.1:" + std::to_string(port) + "\"\n";
  }
  std::string cfg = base_config(kafka, db, id, opt.group, host_lines, opt.consumer_lines, opt.kafka_lines);
  if (!opt.claim_lines.empty()) cfg.replace(cfg.find("[claim]\n"), 8, "[claim]\n" + opt.claim_lines);
  for (const auto& r : routes) cfg += route_config(r);
  hosts_.push_back(std::make_unique<HostProcess>(dir, id + "-" + std::to_string(hosts_.size()), cfg, opt.env));
  if (opt.admin) admin_ports_[hosts_.back().get()] = port;
  return *hosts_.back();
}

int Scenario::admin_port(const HostProcess& host) const {
  auto it = admin_ports_.find(&host);
  if (it == admin_ports_.end()) throw std::logic_error("the host was started without an admin port");
  return it->second;
}

void Scenario::wait_committed(HostProcess& host, std::chrono::milliseconds timeout,
                              const std::vector<std::string>& topics, const std::string& group) {
  std::vector<std::pair<std::string, int>> which;
  for (const auto& [t, partitions] : topics_)
    if (topics.empty() || std::find(topics.begin(), topics.end(), t) != topics.end()) which.emplace_back(t, partitions);
  // DLQ topics are not consumed by the group: they are not waited for.
  std::erase_if(which, [&](const auto& t) {
    return topics.empty() && t.first.size() > 4 && t.first.compare(t.first.size() - 4, 4, ".dlq") == 0;
  });
  test::wait_committed(kafka, group, which, host, timeout);
}

std::unique_ptr<db::Connection> Scenario::connect() const { return std::make_unique<db::Connection>(db); }

int64_t Scenario::scalar(const std::string& sql) const {
  auto c = connect();
  return test::scalar(*c, sql);
}

std::string hex_of(std::string_view bytes) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
  return out;
}

std::map<std::string, int> Scenario::calls_per_key() const {
  std::map<std::string, int> out;
  if (!std::filesystem::exists(calls_log())) return out;
  for (const auto& cols : read_call_log(calls_log())) {
    const std::string& h = cols.at(1);
    std::string key;
    for (size_t i = 0; i + 1 < h.size(); i += 2)
      key.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
    ++out[key];
  }
  return out;
}

void Scenario::audit_clean(HostProcess& host) { test::audit_clean(dir, host); }

}  // namespace idemsink::test
