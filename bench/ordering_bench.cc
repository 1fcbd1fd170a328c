// ordering_bench: what order per entity ([route.order_by]) costs a route,
// told in one run.
//
// RECORDS events (16 partitions, in the topic before the host starts) of
// RECORDS / 10 entities, ten events each, keyed by their entity, each with
// its own id as biz_key; a handler that reports ok at once (noop_handler).
// Two topics lay the same events out two ways:
//
//   spread    an entity's events far apart (each 1 / 10 of the topic after
//             the one before), as a stream of updates over time is
//   bunched   an entity's ten events one after the other: the worst case,
//             where a poll holds all ten and nine of them wait
//
// One host drains each topic ROUNDS times each way, alternately (which goes
// first swaps each round), each drain in a group of its own on a fresh
// database:
//
//   plain     the baseline: the route without order_by
//   ordered   the same route with [route.order_by] from = "key": an entity's
//             next event is claimed when the one before it ends
//
// It prints each drain's rate (from its first 1 % of outcomes to its last,
// read from the host's counters) and the host's and MariaDB's CPU per record
// over that span; the pairs of an entity's consecutive events whose later
// one was claimed before the earlier was done (from the claim rows: none
// when order is kept); each round's ratio of the two times and, per layout,
// their median; and the count (every event done once, by the host's
// counters and by the claim rows). What order costs is less batching and
// one more statement per claim batch (docs/outputs.md).
//
//   build/bench/ordering_bench [RECORDS] [ROUNDS]
#include <signal.h>

#include <algorithm>
#include <iomanip>
#include <iostream>

#include "bench_kafka.h"
#include "core/claim/claim_store.h"
#include "devkit/mariadb_server.h"
#include "devkit/services.h"
#include "host_config.h"
#include "host_metrics.h"
#include "proc_stats.h"

using namespace idemsink;
using namespace idemsink::devkit;
using namespace std::chrono_literals;

namespace {

constexpr int kPartitions = 16;
constexpr int kPerEntity = 10;
const std::string kDone = "idemsink_records_done_total{route=\"orders\"}";
const std::string kSkipped = "idemsink_records_skipped_total{route=\"orders\"}";

struct Layout {
  std::string name;
  int (*entity_of)(int n, int entities);  // event n's entity; its seq counts up in offset order
};
const std::vector<Layout> kLayouts = {
    {"spread", [](int n, int entities) { return n % entities; }},
    {"bunched", [](int n, int) { return n / kPerEntity; }},
};

std::string topic_of(const Layout& layout) { return "bench.ordering." + layout.name; }

struct Result {
  double seconds = 0;  // from the first 1 % of outcomes to the last
  double timed = 0;    // the outcomes in that span
  double host_cpu_us = 0;
  double db_cpu_us = 0;
  double done = 0;
  double skipped = 0;
  int64_t done_rows = 0;
  int64_t claimed_early = 0;  // an entity's event claimed before the one before it was done
};

int64_t scalar(db::Connection& c, const std::string& sql) { return std::stoll(c.query(sql).at(0).at(0).value()); }

// The claim rows' count of done events, and of pairs of an entity's
// consecutive events ("E12#3", "E12#4") whose later one's claim was written
// before the earlier one's done mark: both on the database's clock (NOW(3)).
void read_claims(const config::DatabaseConfig& database, Result& out) {
  db::Connection c(database);
  out.done_rows = scalar(c, "SELECT COUNT(*) FROM idemsink_claim WHERE namespace = 'orders' AND " +
                                claim::sql_status_is(claim::Status::Done));
  out.claimed_early = scalar(c,
                             "SELECT COUNT(*) FROM idemsink_claim a JOIN idemsink_claim b ON b.namespace = a.namespace "
                             "AND b.biz_key = CONCAT(SUBSTRING_INDEX(a.biz_key, '#', 1), '#', "
                             "SUBSTRING_INDEX(a.biz_key, '#', -1) + 1) "
                             "WHERE a.namespace = 'orders' AND b.created_at < a.updated_at");
}

// Produces the layout's events; an entity's events get seq 0, 1, ... in offset order.
void produce(const DevKafka& kafka, const Layout& layout, int records, int entities) {
  std::vector<int> next_seq(size_t(entities), 0);
  bench::produce(kafka.bootstrap(), topic_of(layout), records, [&](int n) {
    const int e = layout.entity_of(n, entities);
    const std::string entity = "E" + std::to_string(e);
    const std::string id = entity + "#" + std::to_string(next_seq[size_t(e)]++);
    return std::pair(entity, "{\"id\":\"" + id + "\",\"entity\":\"" + entity + "\"}");
  });
}

Result drain(const DevKafka& kafka, const std::string& topic, int records, const std::string& name, bool ordered,
             const ScratchDir& dir) {
  auto& mariadb = MariaDbServer::shared();
  const config::DatabaseConfig database = mariadb.fresh_database("bench_ordering");
  const int admin = free_port();
  const std::string cfg = bench::host_toml({.id = "bench-ordering",
                                            .admin_port = admin,
                                            .bootstrap = kafka.bootstrap(),
                                            .group = "bench-ordering-" + name,
                                            .socket = mariadb.socket(),
                                            .database = "bench_ordering"}) +
                          "[[route]]\nname = \"orders\"\ntopic = \"" + topic + "\"\nplugin = \"" +
                          IDEMSINK_BENCH_PLUGIN + "\"\nkey = { from = \"json\", json = \"id\" }\n" +
                          (ordered ? "[route.order_by]\nfrom = \"key\"\n" : "");
  const auto config = dir / (name + ".toml");
  write_file(config, cfg);
  Process host({IDEMSINK_BINARY, "run", "--config", config.string()}, dir / (name + ".out"), dir / (name + ".log"));
  bench::wait_for_admin_port(admin);
  // The group's join and the first claims are not the route's cost.
  const auto first = bench::reach_outcomes(admin, {kDone, kSkipped}, records / 100.0, 600s, "1 % of " + name);
  const double host_cpu0 = bench::cpu_micros(host.pid()), db_cpu0 = bench::cpu_micros(mariadb.pid());
  const auto last = bench::wait_for_outcomes(admin, {kDone, kSkipped}, records, 1800s, "every record of " + name);
  Result out;
  out.seconds = std::chrono::duration<double>(last - first.at).count();
  out.timed = records - first.outcomes;
  out.host_cpu_us = bench::cpu_micros(host.pid()) - host_cpu0;
  out.db_cpu_us = bench::cpu_micros(mariadb.pid()) - db_cpu0;
  const std::string scrape = http_request(admin, "GET", "/metrics").second;
  out.done = bench::metric(scrape, kDone);
  out.skipped = bench::metric(scrape, kSkipped);
  host.signal(SIGTERM);
  host.wait(60s);
  read_claims(database, out);
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  int records = 100000, rounds = 3;
  try {
    if (argc > 1) records = std::stoi(argv[1]);
    if (argc > 2) rounds = std::stoi(argv[2]);
  } catch (const std::exception&) {
    records = 0;  // not a number: the usage below
  }
  if (records < 100 * kPerEntity || records % kPerEntity != 0 || rounds < 1) {
    std::cerr << "usage: ordering_bench [RECORDS, a multiple of 10 >= 1000] [ROUNDS >= 1]\n";
    return 2;
  }
  const int entities = records / kPerEntity;
  ScratchDir dir("ordering-bench");
  std::vector<std::string> args;
  for (const auto& layout : kLayouts)
    args.insert(args.end(), {"--topic", topic_of(layout) + ":" + std::to_string(kPartitions)});
  DevKafka kafka(IDEMSINK_BINARY, args);
  for (const auto& layout : kLayouts) produce(kafka, layout, records, entities);

  std::cout << "ordering_bench: " << records << " events of " << entities
            << " entities in the topic before the host starts, 16 partitions, no-op handler, one host\n"
            << "  " << std::left << std::setw(20) << "drain" << std::right << std::setw(12) << "records/s"
            << std::setw(16) << "host us/record" << std::setw(15) << "db us/record" << std::setw(16) << "claimed early"
            << "\n";
  bool counted = true, ordered_kept = true;
  std::vector<std::vector<double>> ratios(kLayouts.size());
  for (int round = 1; round <= rounds; ++round)
    for (size_t l = 0; l < kLayouts.size(); ++l) {
      double seconds[2] = {0, 0};
      const bool ordered_first = round % 2 == 0;  // neither way always drains first
      for (const bool ordered : {ordered_first, !ordered_first}) {
        const std::string name = kLayouts[l].name + (ordered ? "-ordered-" : "-plain-") + std::to_string(round);
        const Result r = drain(kafka, topic_of(kLayouts[l]), records, name, ordered, dir);
        seconds[ordered] = r.seconds;
        counted = counted && r.done == records && r.skipped == 0 && r.done_rows == records;
        ordered_kept = ordered_kept && (!ordered || r.claimed_early == 0);
        std::cout << "  " << std::left << std::setw(20) << name << std::right << std::fixed << std::setprecision(0)
                  << std::setw(12) << r.timed / r.seconds << std::setprecision(1) << std::setw(16)
                  << r.host_cpu_us / r.timed << std::setw(15) << r.db_cpu_us / r.timed << std::setw(16)
                  << r.claimed_early << "    (" << int64_t(r.done) << " done, " << int64_t(r.skipped) << " skipped, "
                  << r.done_rows << " rows done)\n";
      }
      ratios[l].push_back(seconds[1] / seconds[0]);
      std::cout << "  " << kLayouts[l].name << ", round " << round << ": ordered takes " << std::setprecision(2)
                << ratios[l].back() << "x the plain route's time\n";
    }
  for (size_t l = 0; l < kLayouts.size(); ++l)
    std::cout << kLayouts[l].name << ", median over " << rounds << " rounds: ordered takes " << median(ratios[l])
              << "x the plain route's time\n";
  std::cout << (counted ? "every event done once in every drain\n" : "WRONG: records lost, skipped or applied twice\n")
            << (ordered_kept ? "" : "WRONG: an ordered drain claimed an event before the one before it was done\n");
  return counted && ordered_kept ? 0 : 1;
}
