// reload_bench: what reloads cost a route they do not change, told in one run.
//
// Route a reads RECORDS records (16 partitions, in the topic before the host
// starts) with a handler that reports ok at once (noop_handler); route b, in
// a group of its own, reads a topic with no records. The same drain twice,
// each on a fresh database and topic:
//
//   no reloads   the baseline
//   reloads      every PERIOD ms while route a drains, a reload that removes
//                route b, then one that adds it back, then one that changes
//                its concurrency, and round again
//
// It prints route a's rate in each (from its first 1 % of outcomes to its
// last, read from the host's counters), the ratio, the reloads applied, the
// revocations of route a's partitions in the host's log (none expected: a
// reload never rebalances a group it does not change), and the count
// (every record of route a done, none twice).
//
//   build/bench/reload_bench [RECORDS] [PERIOD_MS]
#include <signal.h>

#include <atomic>
#include <iomanip>
#include <iostream>
#include <thread>

#include "bench_kafka.h"
#include "devkit/mariadb_server.h"
#include "devkit/services.h"
#include "host_config.h"
#include "host_metrics.h"

using namespace idemsink;
using namespace idemsink::devkit;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kPartitions = 16;

struct Result {
  double rate = 0;
  double done = 0;
  int reloads = 0;
  int refused = 0;
  size_t revocations = 0;
};

std::string route_toml(const std::string& name, const std::string& topic, const std::string& extra) {
  return "[[route]]\nname = \"" + name + "\"\ntopic = \"" + topic + "\"\nplugin = \"" + IDEMSINK_BENCH_PLUGIN + "\"\n" +
         extra;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

Result drain(DevKafka& kafka, const std::string& topic, int records, std::chrono::milliseconds period,
             const ScratchDir& dir) {
  auto& mariadb = MariaDbServer::shared();
  mariadb.fresh_database("bench_reload");
  const int admin = free_port();
  const std::string head = bench::host_toml({.id = "bench-reload",
                                             .admin_port = admin,
                                             .bootstrap = kafka.bootstrap(),
                                             .group = "bench-reload-" + topic,
                                             .socket = mariadb.socket(),
                                             .database = "bench_reload"}) +
                           route_toml("a", topic, "");
  const std::string b_group = "group_id = \"bench-reload-b-" + topic + "\"\n";
  const std::vector<std::string> files = {head, head + route_toml("b", "bench.reload.idle", b_group),
                                          head + route_toml("b", "bench.reload.idle", b_group + "concurrency = 8\n")};
  const auto file = dir / (topic + ".toml");
  write_file(file, files[1]);
  Process host({IDEMSINK_BINARY, "run", "--config", file.string()}, dir / (topic + ".out"), dir / (topic + ".log"));
  bench::wait_for_admin_port(admin);
  const std::vector<std::string> series = {"idemsink_records_done_total{route=\"a\"}"};
  const double first = double(records) / 100;
  const auto t0 = bench::wait_for_outcomes(admin, series, first, 600s, "route a's first outcomes");
  const size_t revocations_before = count_of(read_file(dir / (topic + ".log")), "revoking " + topic);

  Result out;
  std::atomic<bool> draining = true;
  std::thread reloader([&] {
    if (period.count() == 0) return;
    // Removed, added back, changed: each step a reload of its own.
    for (size_t step = 0; draining.load(); ++step) {
      std::this_thread::sleep_for(period);
      write_file(file, files[step % 3]);
      const auto [status, body] = http_request(admin, "POST", "/api/v1/host/reload", R"({"note":"reload_bench"})",
                                               {{"Content-Type", "application/json"}});
      if (status == 200)
        ++out.reloads;
      else
        ++out.refused;
    }
  });
  const auto t1 = bench::wait_for_outcomes(admin, series, double(records), 1800s, "route a's every record");
  draining = false;
  reloader.join();
  out.rate = (double(records) - first) / std::chrono::duration<double>(t1 - t0).count();
  out.done = bench::metric(http_request(admin, "GET", "/metrics").second, series[0]);
  out.revocations = count_of(read_file(dir / (topic + ".log")), "revoking " + topic) - revocations_before;
  host.signal(SIGTERM);
  host.wait(60s);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int records = argc > 1 ? std::stoi(argv[1]) : 200000;
  const auto period = std::chrono::milliseconds(argc > 2 ? std::stoi(argv[2]) : 500);
  ScratchDir dir("reload-bench");
  const std::string part = ":" + std::to_string(kPartitions);
  DevKafka kafka(IDEMSINK_BINARY, {"--topic", "bench.reload.0" + part, "--topic", "bench.reload.1" + part, "--topic",
                                   "bench.reload.idle:2"});
  for (const char* topic : {"bench.reload.0", "bench.reload.1"})
    bench::produce(kafka.bootstrap(), topic, records, [](int n) {
      const std::string id = "ORD-" + std::to_string(n);
      return std::pair(id, "{\"order_id\":\"" + id + "\",\"sku\":\"SKU-1\",\"qty\":1}");
    });

  std::cout << "reload_bench: " << records << " records for route a, 16 partitions, no-op handler, one host; "
            << "a reload every " << period.count() << " ms in the second run\n";
  const Result base = drain(kafka, "bench.reload.0", records, 0ms, dir);
  const Result reloaded = drain(kafka, "bench.reload.1", records, period, dir);
  std::cout << std::fixed << std::setprecision(0) << "  no reloads   route a " << base.rate << " rec/s\n"
            << "  reloads      route a " << reloaded.rate << " rec/s, " << reloaded.reloads << " reloads applied ("
            << reloaded.refused << " refused): " << std::setprecision(2) << reloaded.rate / base.rate
            << "x the baseline\n"
            << "  route a's partitions revoked during the drain: " << base.revocations << " and "
            << reloaded.revocations << "\n";
  const bool counted = base.done == records && reloaded.done == records;
  std::cout << (counted ? "every record of route a done once in both runs\n" : "WRONG: records lost or done twice\n");
  return counted && reloaded.refused == 0 ? 0 : 1;
}
