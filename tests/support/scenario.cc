#include "tests/support/scenario.h"

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <stdexcept>

namespace idemsink::test {

Scenario::Scenario(const std::string& name, int brokers) : Scenario(name, devkit::MariaDbServer::shared(), brokers) {}

Scenario::Scenario(const std::string& name, devkit::MariaDbServer& server, int brokers)
    : name(name), kafka(brokers), db(server.fresh_database(name)), dir(name) {}

Scenario::Scenario(const std::string& name, std::shared_ptr<devkit::KafkaCluster> cluster)
    : name(name), kafka(std::move(cluster)), db(devkit::MariaDbServer::shared().fresh_database(name)), dir(name) {}

Scenario& Scenario::topic(const std::string& topic, int partitions, const std::map<std::string, std::string>& configs) {
  kafka.create_topic(topic, partitions, configs);
  topics_.emplace_back(topic, partitions);
  return *this;
}

RouteSpec Scenario::scripted(const std::string& route, const std::string& topic, const std::string& extra,
                             const std::string& plugin) const {
  return RouteSpec{route, topic, plugin, "", {{"log", "\"" + calls_log().string() + "\""}}, extra};
}

std::string Scenario::config(const std::string& id, const std::vector<RouteSpec>& routes,
                             const HostOptions& opt) const {
  const config::DatabaseConfig& d = opt.database ? *opt.database : db;
  std::string cfg = base_config(kafka, d, id, opt.group, opt.host_lines, opt.consumer_lines, opt.kafka_lines);
  auto insert_after = [&](const std::string& header, const std::string& lines) {
    cfg.replace(cfg.find(header), header.size(), header + lines);
  };
  if (!opt.claim_lines.empty()) insert_after("[claim]\n", opt.claim_lines);
  if (!opt.properties_lines.empty()) insert_after("[kafka.properties]\n", opt.properties_lines);
  if (!opt.bootstrap.empty()) {
    const std::string line = "bootstrap_servers = \"" + kafka.bootstrap() + "\"";
    cfg.replace(cfg.find(line), line.size(), "bootstrap_servers = \"" + opt.bootstrap + "\"");
  }
  cfg += opt.tables;
  if (!opt.producer_lines.empty()) {
    const std::string consumer = "[kafka.consumer]\n";
    cfg.replace(cfg.find(consumer), consumer.size(), "[kafka.producer]\n" + opt.producer_lines + consumer);
  }
  std::string database_lines;
  if (!d.password.empty()) database_lines += "password = \"" + d.password + "\"\n";
  if (d.tls_mode != config::TlsMode::Disabled)
    database_lines += "tls_mode = \"" + std::string(config::choice_name(d.tls_mode)) + "\"\n";
  for (const auto& [key, value] : {std::pair<const char*, const std::string*>{"tls_ca", &d.tls_ca},
                                   {"tls_cert", &d.tls_cert},
                                   {"tls_key", &d.tls_key}})
    if (!value->empty()) database_lines += std::string(key) + " = \"" + *value + "\"\n";
  if (!database_lines.empty()) insert_after("[database]\n", database_lines);
  for (const auto& r : routes) cfg += route_config(r);
  if (opt.edit) opt.edit(cfg);
  return cfg;
}

HostProcess& Scenario::host(const std::string& id, const std::vector<RouteSpec>& routes, HostOptions opt) {
  int port = 0;
  if (opt.admin) {
    port = devkit::free_port();
    opt.host_lines += "admin_listen = \"127.0.0.1:" + std::to_string(port) + "\"\n";
  }
  const std::string cfg = config(id, routes, opt);
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
  for (const auto& t : topics)
    if (std::none_of(topics_.begin(), topics_.end(), [&](const auto& made) { return made.first == t; }))
      throw std::logic_error("wait_committed: the scenario made no topic " + t);
  for (const auto& [t, partitions] : topics_)
    if (topics.empty() || std::find(topics.begin(), topics.end(), t) != topics.end()) which.emplace_back(t, partitions);
  // DLQ topics are not consumed by the group: they are not waited for.
  std::erase_if(which, [&](const auto& t) {
    return topics.empty() && t.first.size() > 4 && t.first.compare(t.first.size() - 4, 4, ".dlq") == 0;
  });
  test::wait_committed(kafka, group, which, host, timeout);
}

std::vector<ConsumedMessage> Scenario::wait_records(const std::string& topic, size_t n,
                                                    std::chrono::milliseconds timeout) {
  const auto made = std::find_if(topics_.begin(), topics_.end(), [&](const auto& t) { return t.first == topic; });
  if (made == topics_.end()) throw std::logic_error("wait_records: the scenario made no topic " + topic);
  std::vector<ConsumedMessage> out;
  devkit::wait_until(
      [&] {
        out = kafka.read_all(topic, made->second);
        return out.size() >= n;
      },
      timeout, std::to_string(n) + " records on " + topic);
  return out;
}

std::unique_ptr<db::Connection> Scenario::connect() const { return std::make_unique<db::Connection>(db); }

int64_t Scenario::scalar(const std::string& sql) const {
  auto c = connect();
  return test::scalar(*c, sql);
}

std::vector<std::vector<std::string>> Scenario::calls() const {
  if (!std::filesystem::exists(calls_log())) return {};
  return read_call_log(calls_log());
}

std::map<std::string, int> Scenario::calls_per_key(const std::filesystem::path& log) {
  std::map<std::string, int> out;
  if (!std::filesystem::exists(log)) return out;
  for (const auto& cols : read_call_log(log)) ++out[unhex(cols.at(1))];
  return out;
}

std::map<std::string, std::vector<std::vector<std::string>>> Scenario::calls_by_key() const {
  std::map<std::string, std::vector<std::vector<std::string>>> out;
  if (!std::filesystem::exists(calls_log())) return out;
  for (auto& cols : read_call_log(calls_log())) out[unhex(cols.at(1))].push_back(std::move(cols));
  return out;
}

std::vector<TestMessage> keyed_messages(const std::string& prefix, int from, int to, const std::string& value) {
  std::vector<TestMessage> out;
  for (int i = from; i < to; ++i) out.push_back({prefix + std::to_string(i), value});
  return out;
}

RouteSpec with_delay(RouteSpec route, const std::string& delay) {
  route.options["delay"] = "\"" + delay + "\"";
  return route;
}

RouteSpec shipped_route(const std::string& plugin, const std::string& topic, const std::string& endpoint,
                        const std::string& timeout, const std::string& extra) {
  RouteSpec r{plugin, topic, shipped_plugin(plugin), "", {{"endpoint", "\"" + endpoint + "\""}}, extra};
  if (!timeout.empty()) r.options["timeout"] = "\"" + timeout + "\"";
  return r;
}

}  // namespace idemsink::test
