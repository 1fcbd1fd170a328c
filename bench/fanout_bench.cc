// fanout_bench: what several routes on one topic cost, told in one run.
//
// The same RECORDS records (16 partitions, unique keys, each an order event
// whose "type" cycles over three kinds), in the topic before the host starts,
// drained three ways by one host with a handler that reports ok at once
// (noop_handler), each on a fresh database:
//
//   one route     the baseline: one group reads the topic, one effect each
//   fan-out       three routes, each in a group of its own: three effects each
//   mixed         three routes, each taking one type ([route.when]): one
//                 effect each, the other two routes skip it
//
// It prints, for each, the records the routes took in (records x routes) per
// second, the effects per second, and the CPU the host and MariaDB spent per
// effect, with ratios against the one-route run; and proves the count: each
// route's every record done or skipped, none twice.
//
//   build/bench/fanout_bench [RECORDS]
#include <signal.h>

#include <iomanip>
#include <iostream>
#include <thread>

#include "devkit/mariadb_server.h"
#include "devkit/services.h"
#include "bench_kafka.h"
#include "host_config.h"
#include "host_metrics.h"
#include "proc_stats.h"

using namespace idemsink;
using namespace idemsink::devkit;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kPartitions = 16;
const std::vector<std::string> kTypes = {"order.paid", "order.shipped", "order.cancelled"};
const std::vector<std::string> kRoutes = {"waybill", "inventory", "sms"};

struct Run {
  std::string name;
  size_t routes = 1;
  bool filtered = false;  // each route takes one type
};

struct Result {
  double seconds = 0;
  double host_cpu_us = 0;
  double db_cpu_us = 0;
  double done = 0;
  double skipped = 0;
};

std::string route_toml(const std::string& name, const std::string& topic, const std::string& group, bool first,
                       const std::string& when) {
  std::string t =
      "[[route]]\nname = \"" + name + "\"\ntopic = \"" + topic + "\"\nplugin = \"" + IDEMSINK_BENCH_PLUGIN + "\"\n";
  if (!first) t += "group_id = \"" + group + "." + name + "\"\n";
  if (!when.empty()) t += "when = " + when + "\n";
  return t;
}

Result drain(DevKafka& kafka, const std::string& topic, int records, const Run& run, const ScratchDir& dir) {
  auto& mariadb = MariaDbServer::shared();
  mariadb.fresh_database("bench_fanout");
  const std::string group = "bench-fanout-" + topic;
  const int admin = free_port();
  std::string cfg = bench::host_toml({.id = "bench-fanout",
                                      .admin_port = admin,
                                      .bootstrap = kafka.bootstrap(),
                                      .group = group,
                                      .socket = mariadb.socket(),
                                      .database = "bench_fanout"});
  for (size_t r = 0; r < run.routes; ++r)
    cfg += route_toml(kRoutes[r], topic, group, r == 0,
                      run.filtered ? "{ json = \"type\", equals = \"" + kTypes[r] + "\" }" : "");
  write_file(dir / (topic + ".toml"), cfg);
  Process host({IDEMSINK_BINARY, "run", "--config", (dir / (topic + ".toml")).string()}, dir / (topic + ".out"),
               dir / (topic + ".log"));
  const double db_cpu0 = bench::cpu_micros(mariadb.pid());
  const auto t0 = Clock::now();  // the host's start-up and group joins are part of the run, the same in each
  std::vector<std::string> series;
  for (size_t r = 0; r < run.routes; ++r) {
    series.push_back("idemsink_records_done_total{route=\"" + kRoutes[r] + "\"}");
    series.push_back("idemsink_records_skipped_total{route=\"" + kRoutes[r] + "\"}");
  }
  bench::wait_for_admin_port(admin);
  const auto last = bench::wait_for_outcomes(admin, series, double(records) * double(run.routes), 1800s,
                                             "the host to finish every record of " + run.name);
  Result out;
  out.seconds = std::chrono::duration<double>(last - t0).count();
  out.host_cpu_us = bench::cpu_micros(host.pid());  // its whole life: start-up is in the run
  out.db_cpu_us = bench::cpu_micros(mariadb.pid()) - db_cpu0;
  const std::string scrape = http_request(admin, "GET", "/metrics").second;
  for (size_t r = 0; r < run.routes; ++r) {
    out.done += bench::metric(scrape, "idemsink_records_done_total{route=\"" + kRoutes[r] + "\"}");
    out.skipped += bench::metric(scrape, "idemsink_records_skipped_total{route=\"" + kRoutes[r] + "\"}");
  }
  host.signal(SIGTERM);
  host.wait(60s);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int records = argc > 1 ? std::stoi(argv[1]) : 100000;
  const std::vector<Run> runs = {
      {"one route", 1, false}, {"fan-out, 3 routes", 3, false}, {"mixed, 3 routes", 3, true}};
  std::vector<std::string> args;
  for (size_t i = 0; i < runs.size(); ++i)
    args.insert(args.end(), {"--topic", "bench.fanout." + std::to_string(i) + ":" + std::to_string(kPartitions)});
  ScratchDir dir("fanout-bench");
  DevKafka kafka(IDEMSINK_BINARY, args);
  for (size_t i = 0; i < runs.size(); ++i)
    bench::produce(kafka.bootstrap(), "bench.fanout." + std::to_string(i), records, [](int n) {
      const std::string id = "ORD-" + std::to_string(n);
      return std::pair(id, "{\"order_id\":\"" + id + "\",\"type\":\"" + kTypes[size_t(n) % kTypes.size()] +
                               "\",\"sku\":\"SKU-1\",\"qty\":1}");
    });

  std::cout << "fanout_bench: " << records
            << " records in the topic before the host starts, 16 partitions, no-op handler, one host\n"
            << "  " << std::left << std::setw(20) << "run" << std::right << std::setw(14) << "taken in/s"
            << std::setw(12) << "effects/s" << std::setw(16) << "host us/effect" << std::setw(15) << "db us/effect"
            << std::setw(13) << "vs one route"
            << "\n";
  bool counted = true;
  double base_taken = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const Run& run = runs[i];
    const Result r = drain(kafka, "bench.fanout." + std::to_string(i), records, run, dir);
    const double taken = double(records) * double(run.routes) / r.seconds;
    if (i == 0) base_taken = taken;
    const double effects = run.filtered ? double(records) : double(records) * double(run.routes);
    counted = counted && r.done == effects && r.done + r.skipped == double(records) * double(run.routes);
    std::cout << "  " << std::left << std::setw(20) << run.name << std::right << std::fixed << std::setprecision(0)
              << std::setw(14) << taken << std::setw(12) << r.done / r.seconds << std::setprecision(1) << std::setw(16)
              << r.host_cpu_us / r.done << std::setw(15) << r.db_cpu_us / r.done << std::setprecision(2)
              << std::setw(12) << taken / base_taken << "x\n";
    std::cout << "    accounted: " << int64_t(r.done) << " done + " << int64_t(r.skipped) << " skipped of "
              << records * int64_t(run.routes) << " (records x routes)\n";
  }
  std::cout << (counted ? "every record of every route done or skipped, none twice\n"
                        : "WRONG: records lost or applied twice\n");
  return counted ? 0 : 1;
}
