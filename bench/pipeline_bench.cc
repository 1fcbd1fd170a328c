// pipeline_bench: end-to-end records/s of the host at seed 002's RPC latency
// (waybill plugin, mean 60 ms, P99 350 ms), with the calls of many keys in
// flight at once against one call in flight per partition (the seed's
// sequential consumer loop, 16 partitions). Same machine, same run, same
// records; prints both rates and the ratio, the host's CPU per record, and
// the Little's-law efficiency: the rate reached over what the calls in
// flight allow at the mean latency (in flight / 60 ms).
#include <librdkafka/rdkafka.h>
#include <signal.h>

#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
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
constexpr double kMeanLatencySeconds = 0.060;  // seed 002's RPC

struct Run {
  double rate = 0;         // records/s
  double host_cpu_us = 0;  // per record
  // Per record, the other processes sharing the machine: the fake API, the
  // embedded Kafka, MariaDB. With the host's, what the machine's cores
  // allow: cores x 1 s / (CPU per record).
  double api_cpu_us = 0;
  double kafka_cpu_us = 0;
  double db_cpu_us = 0;
  // From the last outcome until every offset was seen committed.
  double commit_lag_s = 0;
  double total_cpu_us() const { return host_cpu_us + api_cpu_us + kafka_cpu_us + db_cpu_us; }
};

// Runs a host over `topic` with `in_flight` calls at most, over as many
// connections (HTTP/1.1 carries one call at a time on each): records/s from
// the first assigned partition to the last record done, and its CPU then.
Run run(const std::string& name, int in_flight, const std::string& topic, int records, DevKafka& kafka,
        FakeServices& services, const ScratchDir& dir) {
  auto& mariadb = MariaDbServer::shared();
  mariadb.fresh_database("bench_" + name);
  const int admin = free_port();
  std::string cfg = bench::host_toml({.id = "bench-" + name,
                                      .admin_port = admin,
                                      .bootstrap = kafka.bootstrap(),
                                      .group = "bench-" + name,
                                      .socket = mariadb.socket(),
                                      .database = "bench_" + name,
                                      .max_in_flight = in_flight,
                                      .max_poll_records = 200}) +
                    "[[route]]\nname = \"waybill\"\ntopic = \"" + topic + "\"\nplugin = \"" + IDEMSINK_PLUGIN_DIR +
                    "/libidemsink_waybill.so\"\n"
                    "key = { from = \"json\", json = \"order_id\" }\n[route.options]\nendpoint = \"" +
                    services.url() + "\"\nmax_connections = " + std::to_string(in_flight) + "\n";
  write_file(dir / (name + ".toml"), cfg);
  Process host({IDEMSINK_BINARY, "run", "--config", (dir / (name + ".toml")).string()}, dir / (name + ".out"),
               dir / (name + ".log"));
  wait_until(
      [&] {
        try {
          auto [code, body] = http_request(admin, "GET", "/status");
          return code == 200 && nlohmann::json::parse(body)["assigned_partitions"].get<int>() > 0;
        } catch (const std::exception&) {
          return false;
        }
      },
      60s, name + " to get its partitions");
  const auto t0 = Clock::now();
  const double cpu0 = bench::cpu_micros(host.pid()), api0 = bench::cpu_micros(services.pid()),
               kafka0 = bench::cpu_micros(kafka.pid()), db0 = bench::cpu_micros(mariadb.pid());
  // Every key is new: every record should end done. One that ends dead or
  // unknown ends the wait too, and is reported (the rate then counts it).
  const std::string done = "idemsink_records_done_total{route=\"waybill\"}";
  const auto last_done = bench::wait_for_outcomes(
      admin,
      {done, "idemsink_records_dead_total{route=\"waybill\"}", "idemsink_records_unknown_total{route=\"waybill\"}"},
      records, 900s, name + " to finish every record");
  if (const double n = bench::metric(http_request(admin, "GET", "/metrics").second, done); n < records)
    std::cerr << name << ": " << records - n << " record(s) did not end done (dead-lettered or unknown)\n";
  Run out;
  out.rate = records / std::chrono::duration<double>(last_done - t0).count();
  out.host_cpu_us = (bench::cpu_micros(host.pid()) - cpu0) / records;
  out.api_cpu_us = (bench::cpu_micros(services.pid()) - api0) / records;
  out.kafka_cpu_us = (bench::cpu_micros(kafka.pid()) - kafka0) / records;
  out.db_cpu_us = (bench::cpu_micros(mariadb.pid()) - db0) / records;
  wait_until([&] { return bench::committed_total(kafka.bootstrap(), "bench-" + name, topic, kPartitions) >= records; },
             120s, name + " to commit everything");
  out.commit_lag_s = std::chrono::duration<double>(Clock::now() - last_done).count();
  host.signal(SIGTERM);
  host.wait(60s);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  // Each case gets enough records to reach its steady state: rates compare,
  // counts need not match.
  const int narrow_records = argc > 1 ? std::stoi(argv[1]) : 4000;
  const int wide_records = argc > 2 ? std::stoi(argv[2]) : 40000;
  ScratchDir dir("pipeline-bench");
  DevKafka kafka(IDEMSINK_BINARY, {"--topic", "bench.wide:16", "--topic", "bench.narrow:16"});
  FakeServices services(IDEMSINK_FAKE_SERVICES, {"--faults", "waybill:latency_mean_ms=60,latency_p99_ms=350"});
  auto order = [](int i) {
    const std::string key = "ORD-" + std::to_string(i);
    return std::pair(key, "{\"order_id\":\"" + key + "\",\"sku\":\"SKU-" + std::to_string(i % 300) + "\"}");
  };
  bench::produce(kafka.bootstrap(), "bench.narrow", narrow_records, order);
  bench::produce(kafka.bootstrap(), "bench.wide", wide_records, order);
  const Run narrow = run("narrow", kPartitions, "bench.narrow", narrow_records, kafka, services, dir);
  const Run wide = run("wide", 2000, "bench.wide", wide_records, kafka, services, dir);
  auto row = [](const std::string& what, const Run& r, int in_flight) {
    const double efficiency = r.rate / (in_flight / kMeanLatencySeconds);
    std::cout << std::left << std::setw(46) << what << std::right << std::setw(8) << std::fixed << std::setprecision(0)
              << r.rate << " rec/s" << std::setw(8) << std::setprecision(1) << r.host_cpu_us << " us CPU/rec"
              << std::setw(7) << std::setprecision(0) << 100 * efficiency << "% of Little's law\n";
  };
  std::cout << "pipeline_bench: " << narrow_records << " / " << wide_records
            << " records, 16 partitions, waybill RPC mean 60 ms / P99 350 ms\n";
  row("16 in flight (one per partition, seed's loop)", narrow, kPartitions);
  row("2000 in flight (key-ordered, async)", wide, 2000);
  // Where the wide run's CPU went: the bound of a machine whose every
  // process is busy (the benchmark's own, and other work, come on top).
  const double cores = static_cast<double>(std::thread::hardware_concurrency());
  std::cout << std::left << std::setw(46) << "2000 in flight, CPU us per record" << std::right << std::setprecision(1)
            << "host " << wide.host_cpu_us << ", fake API " << wide.api_cpu_us << ", Kafka " << wide.kafka_cpu_us
            << ", MariaDB " << wide.db_cpu_us << ": " << wide.total_cpu_us() << "\n"
            << std::left << std::setw(46) << "what the machine's cores allow" << std::right << std::setw(8)
            << std::setprecision(0) << cores * 1e6 / wide.total_cpu_us() << " rec/s (" << cores << " cores)\n";
  std::cout << std::left << std::setw(46) << "every offset committed after the last outcome" << std::right
            << std::setw(8) << std::setprecision(1) << wide.commit_lag_s << " s (kafka.commit_interval 1 s)\n";
  std::cout << std::left << std::setw(46) << "speed-up" << std::right << std::setw(8) << std::setprecision(1)
            << wide.rate / narrow.rate << "x\n"
            << std::left << std::setw(46) << "seed 002's peak on one host (>= 5800 rec/s)"
            << (wide.rate >= 5800 ? "met" : "MISSED") << "\n";
  return 0;
}
