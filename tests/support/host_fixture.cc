#include "tests/support/host_fixture.h"

#include <boost/test/unit_test.hpp>

#include "devkit/services.h"

#include <signal.h>

#include <cstdlib>
#include <map>
#include <sstream>

namespace idemsink::test {

std::string base_config(const TestKafka& kafka, const config::DatabaseConfig& db, const std::string& host_id,
                        const std::string& group, const std::string& extra_host_lines,
                        const std::string& extra_consumer_lines, const std::string& extra_kafka_lines) {
  // Set to librdkafka debug contexts ("cgrp,topic,fetch") to follow the
  // group and fetcher state of every host a test starts.
  const char* rdkafka_debug = std::getenv("IDEMSINK_TEST_RDKAFKA_DEBUG");
  std::ostringstream os;
  os << "[host]\nid = \"" << host_id << "\"\nshutdown_grace = \"10s\"\nlog_level = \""
     << (rdkafka_debug ? "debug" : "info") << "\"\n"
     << extra_host_lines << "\n[kafka]\nbootstrap_servers = \"" << kafka.bootstrap() << "\"\ngroup_id = \"" << group
     << "\"\nmax_poll_records = 200\ncommit_interval = \"200ms\"\n"
     << extra_kafka_lines << "[kafka.properties]\n";
  if (rdkafka_debug)
    os << "\"log_level\" = \"7\"\n\"debug\" = \"" << rdkafka_debug << "\"\n";
  else
    os << "\"log_level\" = \"4\"\n";
  os << "[kafka.consumer]\n\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"500\"\n"
     << "\"topic.metadata.refresh.interval.ms\" = \"2000\"\n"
     << extra_consumer_lines << "\n[database]\nhost = \"" << db.host << "\"\nport = " << db.port << "\nuser = \""
     << db.user << "\"\ndatabase = \"" << db.database << "\"\npool_size = 4\nconnect_timeout = \"2s\"\n"
     << "reconnect_backoff_max = \"500ms\"\n"
     << "\n[claim]\nlease = \"10s\"\nwait_recheck = \"200ms\"\n\n";
  return os.str();
}

std::string route_config(const RouteSpec& r) {
  std::ostringstream os;
  const std::string plugin = r.plugin.rfind('/', 0) == 0 ? r.plugin : test_plugin_dir() + "/" + r.plugin;
  os << "[[route]]\nname = \"" << r.name << "\"\ntopic = \"" << r.topic << "\"\nplugin = \"" << plugin << "\"\n";
  if (!r.key_toml.empty()) os << r.key_toml << "\n";
  os << r.extra << "\n";
  if (!r.options.empty()) {
    os << "[route.options]\n";
    for (const auto& [k, v] : r.options) os << k << " = " << v << "\n";
  }
  os << "\n";
  return os.str();
}

int http_status(int port, const std::string& target) {
  try {
    return http_request(port, "GET", target).first;
  } catch (const std::exception&) {
    return -1;  // not listening (yet)
  }
}

int64_t admin_metric(int admin_port, const std::string& series) {
  std::pair<int, std::string> answer;
  try {
    answer = http_request(admin_port, "GET", "/metrics");
  } catch (const std::exception&) {
    return -1;  // not listening (yet)
  }
  const auto& [status, body] = answer;
  if (status != 200) return -1;
  const auto at = body.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stoll(body.substr(at + series.size() + 2));
}

std::string status_is_not(claim::Status s) { return "NOT " + claim::sql_status_is(s); }
std::string status_in(claim::Status a, claim::Status b) {
  return "(" + claim::sql_status_is(a) + " OR " + claim::sql_status_is(b) + ")";
}

int64_t scalar(db::Connection& c, const std::string& sql) { return std::stoll(*c.query(sql).at(0).at(0)); }

std::pair<int, std::string> run_cli(const ScratchDir& dir, const std::string& name, std::vector<std::string> args,
                                    std::chrono::seconds timeout) {
  args.insert(args.begin(), idemsink_binary());
  Process p(args, dir / (name + ".out"), dir / (name + ".err"));
  auto rc = p.wait(timeout);
  if (!rc) throw std::runtime_error(name + " did not finish");
  return {*rc, p.out() + p.err()};
}

HostProcess::HostProcess(const ScratchDir& dir, const std::string& name, const std::string& config_toml,
                         std::map<std::string, std::string> env)
    : config_(dir / (name + ".toml")) {
  write_file(config_, config_toml);
  proc_ = std::make_unique<Process>(std::vector<std::string>{idemsink_binary(), "run", "--config", config_.string()},
                                    dir / (name + ".out"), dir / (name + ".log"), std::move(env));
}

HostProcess::~HostProcess() = default;

int HostProcess::stop(std::chrono::milliseconds timeout) {
  proc_->signal(SIGTERM);
  auto rc = proc_->wait(timeout);
  if (!rc) {
    // Where every thread waits says why the exit hangs; the log alone
    // rarely does (a hang logs nothing). Written beside the log.
    auto threads_file = proc_->err_path();
    const std::string threads = thread_dump(proc_->pid(), threads_file.replace_extension(".threads"));
    proc_->kill_now();
    throw std::runtime_error("host did not exit within " + std::to_string(timeout.count()) +
                             "ms of SIGTERM; its log:\n" + log_tail(16000) + "\nits threads:\n" + threads);
  }
  return *rc;
}

std::string thread_dump(pid_t pid, const std::filesystem::path& out) {
  if (!std::filesystem::exists("/usr/bin/gdb")) return "(no /usr/bin/gdb to take a thread dump)";
  Process gdb({"/usr/bin/gdb", "-batch", "-nx", "-p", std::to_string(pid), "-ex", "thread apply all bt"}, out,
              out.string() + ".err");
  if (!gdb.wait(std::chrono::seconds(60))) {
    gdb.kill_now();
    return "(gdb did not finish within 60s)";
  }
  std::string dump = gdb.out();
  return dump.size() > 60000 ? dump.substr(0, 60000) + "\n..." : dump;
}

std::string HostProcess::log_tail(size_t bytes) const {
  const std::string all = log();
  return all.size() > bytes ? "...\n" + all.substr(all.size() - bytes) : all;
}

void wait_committed(TestKafka& kafka, const std::string& group, const std::vector<std::pair<std::string, int>>& topics,
                    HostProcess& host, std::chrono::milliseconds timeout) {
  std::map<std::string, std::map<int32_t, int64_t>> hi;
  for (const auto& [topic, partitions] : topics) hi[topic] = kafka.high_watermarks(topic, partitions);
  std::string behind;  // "topic/partition committed/high", for the failure message
  try {
    wait_until(
        [&] {
          if (!host.running()) throw std::runtime_error("host exited early:\n" + host.log());
          behind.clear();
          for (const auto& [topic, partitions] : topics) {
            std::map<int32_t, int64_t> c;
            try {
              c = kafka.committed(group, topic, partitions);
            } catch (const std::runtime_error& e) {
              behind = std::string(" (reading the committed offsets failed: ") + e.what() + ")";
              return false;  // the coordinator moving, or errors a test injected
            }
            for (int p = 0; p < partitions; ++p)
              if (c[p] < hi[topic][p])
                behind += " " + topic + "/" + std::to_string(p) + " " + std::to_string(c[p]) + "/" +
                          std::to_string(hi[topic][p]);
          }
          return behind.empty();
        },
        // Each check is a consumer of its own: not too often on a 2-core machine.
        timeout, "committed offsets to reach the end", std::chrono::milliseconds(200));
  } catch (const std::runtime_error& e) {
    // A flake seen only on a CI machine must carry what is needed to explain it.
    throw std::runtime_error(std::string(e.what()) + "; behind:" + behind + "\nhost log (tail):\n" + host.log_tail());
  }
}

std::pair<int, std::string> audit(const ScratchDir& dir, HostProcess& host) {
  static int run = 0;
  return run_cli(dir, "audit-" + std::to_string(++run), {"audit", "--config", host.config_path().string()},
                 std::chrono::minutes(5));
}

void audit_clean(const ScratchDir& dir, HostProcess& host) {
  auto [rc, out] = audit(dir, host);
  BOOST_TEST(rc == 0, out);
  BOOST_TEST(out.find("audit ok") != std::string::npos, out);
  // A record that took a step outside its life's table (pipeline/stage.cc).
  const std::string log = host.log();
  const auto bug = log.find("bug:");
  BOOST_TEST(bug == std::string::npos, log.substr(bug == std::string::npos ? 0 : bug, 400));
}

std::vector<std::vector<std::string>> read_call_log(const std::filesystem::path& file) {
  std::vector<std::vector<std::string>> out;
  std::istringstream in(read_file(file));
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cols;
    std::istringstream ls(line);
    std::string col;
    while (std::getline(ls, col, '\t')) cols.push_back(col);
    out.push_back(std::move(cols));
  }
  return out;
}

std::map<std::string, int> calls_per_hex_key(const std::filesystem::path& file) {
  std::map<std::string, int> out;
  for (const auto& cols : read_call_log(file)) ++out[cols.at(1)];
  return out;
}

void expect_each_key_called_once(const std::map<std::string, int>& calls_per_key, size_t expected_keys) {
  BOOST_TEST(calls_per_key.size() == expected_keys);
  for (const auto& [key, n] : calls_per_key) BOOST_TEST(n == 1, key << " called " << n << " times");
}

}  // namespace idemsink::test
