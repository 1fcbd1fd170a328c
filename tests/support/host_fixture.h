// Running the idemsink host under test as a real process, with a generated
// config, so tests can SIGKILL it exactly as an outage would.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "core/claim/claim_store.h"
#include "core/config/config.h"
#include "core/db/connection.h"
#include "tests/support/test_kafka.h"
#include "devkit/process.h"

namespace idemsink::test {

using namespace idemsink::devkit;

/// [host], [kafka], [database] and [claim] sections for tests: short
/// session timeout (fast rejoin on the mock cluster), fast commits. The
/// extra lines go into [host], [kafka.consumer] and [kafka].
std::string base_config(const TestKafka& kafka, const config::DatabaseConfig& db, const std::string& host_id,
                        const std::string& group, const std::string& extra_host_lines = "",
                        const std::string& extra_consumer_lines = "", const std::string& extra_kafka_lines = "");

/// One [[route]] table.
struct RouteSpec {
  std::string name;
  std::string topic;
  std::string plugin;                          // file name in the test plugin folder, or an absolute path
  std::string key_toml = "";                   // e.g. "key = { from = \"json\", json = \"order.id\" }"
  std::map<std::string, std::string> options;  // TOML values, already quoted as needed
  std::string extra;                           // more lines for the table
};
std::string route_config(const RouteSpec& r);

/// Every thread's stack of a running process (gdb attached for a moment),
/// also written to `out`; a note saying why when there is none.
std::string thread_dump(pid_t pid, const std::filesystem::path& out);

class HostProcess {
 public:
  HostProcess(const ScratchDir& dir, const std::string& name, const std::string& config_toml,
              std::map<std::string, std::string> env = {});
  ~HostProcess();

  Process& proc() { return *proc_; }
  bool running() { return proc_->running(); }
  /// SIGTERM and wait for a clean exit; returns the exit code.
  int stop(std::chrono::milliseconds timeout = std::chrono::seconds(60));
  void kill() { proc_->kill_now(); }
  std::string log() const { return proc_->err(); }
  /// The last `bytes` of the log, for failure messages.
  std::string log_tail(size_t bytes = 20000) const;
  const std::filesystem::path& config_path() const { return config_; }

 private:
  std::filesystem::path config_;
  std::unique_ptr<Process> proc_;
};

/// Waits until the group's committed offsets reach the high watermarks of
/// every (topic, partitions); fails early, with its log, if the host exits.
void wait_committed(TestKafka& kafka, const std::string& group, const std::vector<std::pair<std::string, int>>& topics,
                    HostProcess& host, std::chrono::milliseconds timeout = std::chrono::seconds(120));

/// The status of GET `target` on 127.0.0.1:port, or -1 when nothing answers.
int http_status(int port, const std::string& target);

/// The value of one series in a host's /metrics (e.g.
/// `idemsink_route_circuit_open{route="waybill"}`), or -1 when absent.
int64_t admin_metric(int admin_port, const std::string& series);

/// A claim's status in a test's SQL, rendered from claim::Status as the core
/// renders it, so that no query spells a number:
/// "... WHERE " + sql_status_is(claim::Status::Done).
using claim::sql_status_is;
std::string status_is_not(claim::Status s);
std::string status_in(claim::Status a, claim::Status b);

/// The first column of the first row of `sql`, as a number.
int64_t scalar(db::Connection& c, const std::string& sql);

/// Runs `idemsink ARGS...` to the end (at most `timeout`, else it throws);
/// {exit code, stdout + stderr}.
std::pair<int, std::string> run_cli(const ScratchDir& dir, const std::string& name, std::vector<std::string> args,
                                    std::chrono::seconds timeout = std::chrono::seconds(120));

/// `idemsink audit` of the host's config (at most 5 minutes: it reads every
/// committed record); {exit code, what it printed}.
std::pair<int, std::string> audit(const ScratchDir& dir, HostProcess& host);
/// Every committed record accounted for: the audit exits 0 saying "audit ok"
/// (a test failure otherwise, with the audit's output), and no record of the
/// host took a step outside its life's table (no "bug:" in its log).
void audit_clean(const ScratchDir& dir, HostProcess& host);

/// The scripted plugin's call log, one vector of columns per call.
std::vector<std::vector<std::string>> read_call_log(const std::filesystem::path& file);
/// Calls per biz_key in a scripted plugin's call log, keys hex as logged.
std::map<std::string, int> calls_per_hex_key(const std::filesystem::path& file);
/// The no-effect-twice half of the contract, and the every-record half for a
/// run in which every key was to be called: `expected_keys` keys called, each
/// exactly once (a failure names the key and its count).
void expect_each_key_called_once(const std::map<std::string, int>& calls_per_key, size_t expected_keys);

}  // namespace idemsink::test
