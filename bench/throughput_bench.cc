// throughput_bench: the claim path at the database's speed, told in one run.
//
// End to end: one host, a handler that reports ok at once (noop_handler),
// 16 partitions, RECORDS records with 10% duplicates, produced while the host
// consumes. It prints records/s, the CPU the host and MariaDB spent per
// record (from /proc of the processes this run started), statements per
// record and the host's peak RSS, and proves the count: every unique key
// done once, every duplicate skipped, every offset committed.
//
// Ceiling: on the same server, in the same run, the same unique rows claimed
// and marked done by the simplest batched SQL the schema allows (a 500-row
// INSERT, then an UPDATE by primary key), each statement its own durable
// commit as the host's are. The host's rate over the ceiling's is the share
// of the database's speed the host reaches.
//
// Big table: the rows examined by one 500-key claim read with 3 and with 13
// months kept (100,000 old rows spread over them); with --prefill N the
// end-to-end run is repeated on a claim table pre-filled with N old rows
// over --months M (default 13), and its rate compared with the empty
// table's.
//
//   build/bench/throughput_bench [RECORDS] [--prefill N] [--months M]
#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "core/claim/claim_store.h"
#include "core/claim/schema.h"
#include "core/common/util.h"
#include "core/db/connection.h"
#include "devkit/mariadb_server.h"
#include "devkit/services.h"

using namespace idemsink;
using namespace idemsink::devkit;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kPartitions = 16;
constexpr size_t kCeilingBatch = 500;
const std::string kTopic = "bench.throughput";         // the empty-table run
const std::string kBigTopic = "bench.throughput.big";  // the pre-filled run

// CPU time (user + system) a process has used so far, in microseconds.
double cpu_micros(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  // Fields after the command name (which may hold spaces) start past ')'.
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) * 1e6 / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Peak resident set size of a process, in MiB.
double peak_rss_mib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

// Keys in produce order: every tenth repeats an earlier key (10% duplicates).
std::vector<std::string> bench_keys(int records) {
  std::vector<std::string> keys;
  std::mt19937 rng(42);
  int unique = 0;
  for (int i = 0; i < records; ++i) {
    if (i % 10 == 9 && unique > 0) {
      keys.push_back("ORD-" + std::to_string(std::uniform_int_distribution<int>(0, unique - 1)(rng)));
    } else {
      keys.push_back("ORD-" + std::to_string(unique++));
    }
  }
  return keys;
}

void produce(const std::string& bootstrap, const std::string& topic, const std::vector<std::string>& keys) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap.c_str(), err, sizeof err);
  rd_kafka_conf_set(conf, "linger.ms", "20", err, sizeof err);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  for (const auto& key : keys) {
    const std::string value = "{\"order_id\":\"" + key + "\",\"sku\":\"SKU-1\",\"qty\":1}";
    while (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_KEY(key.data(), key.size()),
                             RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()),
                             RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
      rd_kafka_poll(rk, 10);
  }
  rd_kafka_flush(rk, 60000);
  rd_kafka_destroy(rk);
}

int64_t committed_total(const std::string& bootstrap, const std::string& group, const std::string& topic) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap.c_str(), err, sizeof err);
  rd_kafka_conf_set(conf, "group.id", group.c_str(), err, sizeof err);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  rd_kafka_topic_partition_list_t* l = rd_kafka_topic_partition_list_new(kPartitions);
  for (int p = 0; p < kPartitions; ++p) rd_kafka_topic_partition_list_add(l, topic.c_str(), p);
  rd_kafka_committed(rk, l, 10000);
  int64_t total = 0;
  for (int i = 0; i < l->cnt; ++i) total += std::max<int64_t>(0, l->elems[i].offset);
  rd_kafka_topic_partition_list_destroy(l);
  rd_kafka_destroy(rk);
  return total;
}

// The value of an unlabelled or single-route series in a scrape.
double metric(const std::string& scrape, const std::string& series) {
  const size_t at = scrape.find("\n" + series + " ");
  if (at == std::string::npos) throw std::runtime_error("no series " + series + " in /metrics");
  return std::stod(scrape.substr(at + series.size() + 2));
}

// N old rows, done, spread evenly over the newest `months` monthly buckets,
// generated by the server (the SEQUENCE engine) in transactions of 500,000.
void prefill(db::Connection& c, int64_t rows, int months) {
  std::string buckets;
  for (int m = 0; m < months; ++m) buckets += ", '" + claim::month_start(std::chrono::system_clock::now(), -m) + "'";
  constexpr int64_t kChunk = 500000;
  for (int64_t from = 1; from <= rows; from += kChunk) {
    const int64_t to = std::min(rows, from + kChunk - 1);
    c.execute(
        "INSERT INTO idemsink_claim (namespace, biz_key, bucket, status, attempt, idem_token, owner, payload_hash, "
        "receipt, calls, src_topic, src_partition, src_offset, created_at, updated_at) SELECT 'noop', CONCAT('OLD-', "
        "seq), ELT(1 + seq % " +
        std::to_string(months) + buckets +
        "), 2, 1, UUID(), 'prefill', UNHEX(MD5(seq)), 'r', 1, 'old', 0, seq, NOW(3), NOW(3) FROM seq_" +
        std::to_string(from) + "_to_" + std::to_string(to));
  }
}

// Index reads of this session so far (keys looked up, rows stepped through).
int64_t handler_reads(db::Connection& c) {
  int64_t n = 0;
  for (auto& r : c.query("SHOW SESSION STATUS LIKE 'Handler_read%'")) n += std::stoll(r[1].value_or("0"));
  return n;
}

// Rows the claim path's read examines for one poll of 500 keys already
// claimed (in older months), with `months` kept.
int64_t rows_examined_per_poll(int months) {
  const std::string name = "bench_probe_" + std::to_string(months);
  db::Connection c(MariaDbServer::shared().fresh_database(name));
  claim::apply_schema(c, std::chrono::system_clock::now(), {months * 31, 3});
  prefill(c, 100000, months);
  claim::ClaimStore store("bench", "bench#probe", std::chrono::seconds(30));
  std::vector<claim::ClaimRequest> reqs;
  const std::string bucket = claim::month_start(std::chrono::system_clock::now(), 0);
  for (int i = 1; i <= 500; ++i) {
    claim::ClaimRequest q;
    q.key = claim::RowKey{"noop", "OLD-" + std::to_string(i * 97), bucket};
    q.check_payload = false;
    q.src_topic = kTopic;
    reqs.push_back(q);
  }
  const int64_t before = handler_reads(c);
  const auto results = store.claim(c, reqs);  // every key is done already: one read, nothing written
  const int64_t examined = handler_reads(c) - before;
  for (const auto& r : results)
    if (r.verdict != claim::Verdict::Done) throw std::runtime_error("probe: an old key was not found done");
  return examined;
}

struct E2e {
  double seconds = 0;
  double host_cpu_us = 0;
  double db_cpu_us = 0;
  double statements = 0;
  double done = 0;
  double duplicates = 0;
  double peak_rss_mib = 0;
};

// `prefill_rows` old rows over `months` months are in the claim table before
// the host starts; the host keeps that many months.
E2e run_host(DevKafka& kafka, const std::string& topic, const std::vector<std::string>& keys, const ScratchDir& dir,
             int64_t prefill_rows, int months) {
  auto& mariadb = MariaDbServer::shared();
  {
    db::Connection c(mariadb.fresh_database("bench_throughput"));
    if (prefill_rows > 0) {
      claim::apply_schema(c, std::chrono::system_clock::now(), {months * 31, 3});
      const auto t0 = Clock::now();
      prefill(c, prefill_rows, months);
      std::cout << "prefilled " << prefill_rows << " claim rows over " << months << " months in " << std::fixed
                << std::setprecision(0) << std::chrono::duration<double>(Clock::now() - t0).count() << " s\n";
    }
  }
  const std::string group = "bench-throughput-" + std::to_string(prefill_rows);
  const int admin = free_port();
  const std::string cfg =
      "[host]\nid = \"bench-throughput\"\nmax_in_flight = 2000\nadmin_listen = \"127.0.0.1:" + std::to_string(admin) +
      "\"\n[kafka]\nbootstrap_servers = \"" + kafka.bootstrap() + "\"\ngroup_id = \"" + group +
      "\"\nmax_poll_records = 500\n[kafka.consumer]\n\"session.timeout.ms\" = "
      "\"6000\"\n[kafka.properties]\n\"log_level\" = \"3\"\n[database]\nsocket = \"" +
      mariadb.socket() +
      "\"\ndatabase = \"bench_throughput\"\n[claim]\nretention_days = " + std::to_string(months * 31) +
      "\n[[route]]\nname = \"noop\"\ntopic = \"" + topic + "\"\nplugin = \"" + IDEMSINK_BENCH_PLUGIN + "\"\n";
  write_file(dir / "host.toml", cfg);
  Process host({IDEMSINK_BINARY, "run", "--config", (dir / "host.toml").string()}, dir / "host.out", dir / "host.log");
  wait_until(
      [&] {
        try {
          auto [code, body] = http_request(admin, "GET", "/status");
          return code == 200 && nlohmann::json::parse(body)["assigned_partitions"].get<int>() == kPartitions;
        } catch (const std::exception&) {
          return false;
        }
      },
      60s, "the host to get its partitions");
  E2e out;
  const double host_cpu0 = cpu_micros(host.pid()), db_cpu0 = cpu_micros(mariadb.pid());
  const double statements0 = metric(http_request(admin, "GET", "/metrics").second, "idemsink_db_statements_total");
  const auto t0 = Clock::now();
  std::thread producer([&] { produce(kafka.bootstrap(), topic, keys); });
  wait_until([&] { return committed_total(kafka.bootstrap(), group, topic) >= int64_t(keys.size()); }, 1800s,
             "the host to commit every record");
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  producer.join();
  out.host_cpu_us = cpu_micros(host.pid()) - host_cpu0;
  out.db_cpu_us = cpu_micros(mariadb.pid()) - db_cpu0;
  const std::string scrape = http_request(admin, "GET", "/metrics").second;
  out.statements = metric(scrape, "idemsink_db_statements_total") - statements0;
  out.done = metric(scrape, "idemsink_records_done_total{route=\"noop\"}");
  out.duplicates = metric(scrape, "idemsink_idempotent_hits_total{route=\"noop\"}");
  out.peak_rss_mib = peak_rss_mib(host.pid());
  host.signal(SIGTERM);
  host.wait(60s);
  return out;
}

struct Ceiling {
  double seconds = 0;
  double db_cpu_us = 0;
};

// The same unique rows, claimed and marked done by the simplest batched SQL.
Ceiling run_ceiling(size_t rows) {
  auto& mariadb = MariaDbServer::shared();
  db::Connection c(mariadb.fresh_database("bench_ceiling"));
  claim::apply_schema(c, std::chrono::system_clock::now(), {});
  const std::string bucket = claim::month_start(std::chrono::system_clock::now(), 0);
  const std::string token_prefix = random_uuid().substr(0, 24);
  Ceiling out;
  const double db_cpu0 = cpu_micros(mariadb.pid());
  const auto t0 = Clock::now();
  for (size_t from = 0; from < rows; from += kCeilingBatch) {
    const size_t to = std::min(rows, from + kCeilingBatch);
    std::string insert =
        "INSERT INTO idemsink_claim (namespace, biz_key, bucket, status, attempt, idem_token, owner, lease_until, "
        "payload_hash, src_topic, src_partition, src_offset, created_at, updated_at) VALUES ";
    std::string keys;
    for (size_t i = from; i < to; ++i) {
      char token_tail[16];
      std::snprintf(token_tail, sizeof token_tail, "%012zx", i);
      const std::string key = "'ORD-" + std::to_string(i) + "'";
      insert += std::string(i == from ? "" : ",") + "('noop'," + key + ",'" + bucket + "',1,1,'" + token_prefix +
                token_tail + "','ceiling',NOW(3) + INTERVAL 30 SECOND,UNHEX(MD5(" + key + ")),'" + kTopic + "'," +
                std::to_string(i % kPartitions) + "," + std::to_string(i) + ",NOW(3),NOW(3))";
      keys += std::string(i == from ? "" : ",") + "('noop'," + key + ",'" + bucket + "')";
    }
    c.execute(insert);
    c.execute(
        "UPDATE idemsink_claim SET status = 2, owner = NULL, lease_until = NULL, receipt = 'noop', calls = 1, "
        "updated_at = NOW(3) WHERE (namespace, biz_key, bucket) IN (" +
        keys + ")");
  }
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  out.db_cpu_us = cpu_micros(mariadb.pid()) - db_cpu0;
  return out;
}

// One line: what, the figure, the target and whether it holds.
void line(const std::string& what, double value, int precision, const std::string& unit, const std::string& target,
          bool holds) {
  std::cout << "  " << std::left << std::setw(34) << what << std::right << std::setw(10) << std::fixed
            << std::setprecision(precision) << value << " " << std::left << std::setw(10) << unit;
  if (!target.empty()) std::cout << " target " << std::setw(10) << target << (holds ? " met" : " MISSED");
  std::cout << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  int records = 200000, months = 13;
  int64_t prefill_rows = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--prefill" && i + 1 < argc) {
      prefill_rows = std::stoll(argv[++i]);
    } else if (arg == "--months" && i + 1 < argc) {
      months = std::stoi(argv[++i]);
    } else {
      records = std::stoi(arg);
    }
  }
  const auto keys = bench_keys(records);
  std::map<std::string, int> seen;
  for (const auto& k : keys) ++seen[k];
  const size_t unique = seen.size();

  ScratchDir dir("throughput-bench");
  DevKafka kafka(IDEMSINK_BINARY, {"--topic", kTopic + ":" + std::to_string(kPartitions), "--topic",
                                   kBigTopic + ":" + std::to_string(kPartitions)});
  const E2e e2e = run_host(kafka, kTopic, keys, dir, 0, 3);
  const Ceiling ceiling = run_ceiling(unique);
  const int64_t examined_3 = rows_examined_per_poll(3), examined_13 = rows_examined_per_poll(13);

  const double rate = records / e2e.seconds;
  const double rows_rate = unique / e2e.seconds;
  const double ceiling_rate = unique / ceiling.seconds;
  bool counted = e2e.done == double(unique) && e2e.duplicates == double(records - unique);
  std::cout << "throughput_bench: " << records << " records (" << unique << " keys, " << records - unique
            << " duplicates), 16 partitions, no-op handler, one host, MariaDB durable commits\n";
  line("end to end", rate, 0, "rec/s", ">= 25000", rate >= 25000);
  line("host CPU per record", e2e.host_cpu_us / records, 1, "us", "<= 20", e2e.host_cpu_us / records <= 20);
  line("MariaDB CPU per record", e2e.db_cpu_us / records, 1, "us", "<= 35", e2e.db_cpu_us / records <= 35);
  line("statements per record", e2e.statements / records, 4, "", "<= 0.01", e2e.statements / records <= 0.01);
  line("host peak RSS", e2e.peak_rss_mib, 0, "MiB", "", true);
  line("ceiling: batched INSERT + UPDATE", ceiling_rate, 0, "rows/s", "", true);
  line("ceiling: MariaDB CPU per row", ceiling.db_cpu_us / unique, 1, "us", "", true);
  line("host / ceiling (rows/s)", 100.0 * rows_rate / ceiling_rate, 0, "%", ">= 65", rows_rate / ceiling_rate >= 0.65);
  line("rows examined per 500-key read, 3 months", double(examined_3), 0, "", "", true);
  line("rows examined per 500-key read, 13 months", double(examined_13), 0, "", "", true);
  std::cout << "  accounted: " << e2e.done << " done + " << e2e.duplicates << " duplicates of " << records
            << (counted ? " (every record, no key twice)" : " (WRONG: records lost or applied twice)") << "\n";
  if (prefill_rows > 0) {
    const E2e big = run_host(kafka, kBigTopic, keys, dir, prefill_rows, months);
    const double big_rate = records / big.seconds;
    const bool big_counted = big.done == double(unique) && big.duplicates == double(records - unique);
    counted = counted && big_counted;
    std::cout << "on a claim table of " << prefill_rows << " rows over " << months << " months:\n";
    line("end to end", big_rate, 0, "rec/s", "", true);
    line("MariaDB CPU per record", big.db_cpu_us / records, 1, "us", "", true);
    line("empty-table rate / this rate", rate / big_rate, 2, "x", "<= 1.5", rate / big_rate <= 1.5);
    std::cout << "  accounted: " << big.done << " done + " << big.duplicates << " duplicates of " << records
              << (big_counted ? " (every record, no key twice)" : " (WRONG: records lost or applied twice)") << "\n";
  }
  return counted ? 0 : 1;
}
