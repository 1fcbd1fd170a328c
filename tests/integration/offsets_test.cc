// The commit rule under the conditions that broke it: fetching paused and
// resumed hundreds of times (backpressure), holes in the offsets, a
// partition whose fetch silently stops, lag before the first record.
// Every scenario counts both halves of the contract: no key applied twice,
// every produced record accounted for, committed offsets at the end.
#define BOOST_TEST_MODULE offsets
#include <boost/test/unit_test.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace std::chrono_literals;

namespace {

// `n` records over `partitions` partitions, every tenth re-sends the order of
// seven records earlier (same key, same payload): 10% duplicates.
std::vector<TestMessage> orders(int n, int partitions, std::set<std::string>& keys) {
  std::vector<TestMessage> msgs;
  msgs.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const int order = i % 10 == 9 ? i - 7 : i;
    const std::string key = "o-" + std::to_string(order);
    keys.insert(key);
    msgs.push_back({key, "{\"order\":" + std::to_string(order) + "}", {}, order % partitions});
  }
  return msgs;
}

}  // namespace

// Hundreds of pause/resume cycles while records flow: with librdkafka 2.0's
// batch consume this skipped offsets and committed over them.
BOOST_AUTO_TEST_CASE(backpressure_pauses_skip_nothing) {
  constexpr int kRecords = 200'000, kPartitions = 16, kRuns = 2;  // buffers of 200 and 400: the most pauses
  for (int run = 0; run < kRuns; ++run) {
    BOOST_TEST_CONTEXT("run " << run) {
      Scenario s("offsets_backpressure_" + std::to_string(run));
      const std::string topic = "orders" + std::to_string(run);
      s.topic(topic, kPartitions);
      std::set<std::string> keys;
      s.kafka.produce(topic, orders(kRecords, kPartitions, keys));
      // Small fetches answered at once: a resumed partition refills the
      // buffer quickly, a little at a time, and the next pause follows soon.
      const std::string group = "g" + std::to_string(run);
      auto& host =
          s.host("host-a", {s.scripted("waybill", topic)},
                 {.group = group,
                  .host_lines = "max_buffered_records = " + std::to_string(200 << run) + "\n",
                  .consumer_lines = "\"fetch.wait.max.ms\" = \"10\"\n\"max.partition.fetch.bytes\" = \"4096\"\n"
                                    "\"queued.min.messages\" = \"100\"\n"});
      s.wait_committed(host, 600s, {topic}, group);

      // Every key claimed and applied exactly once.
      auto per_key = s.calls_per_key();
      size_t missing = 0, twice = 0;
      for (const auto& k : keys) {
        const int n = per_key[k];
        if (n == 0) ++missing;
        if (n > 1) ++twice;
      }
      BOOST_TEST(missing == 0u, missing << " of " << keys.size() << " keys never called");
      BOOST_TEST(twice == 0u, twice << " keys called more than once");
      BOOST_TEST(std::stoul(*s.connect()->query("SELECT COUNT(*) FROM idemsink_claim WHERE " +
                                                sql_status_is(claim::Status::Done))[0][0]) == keys.size());

      const std::string log = host.log();
      size_t pauses = 0;
      for (size_t p = log.find("fetching paused"); p != std::string::npos; p = log.find("fetching paused", p + 1))
        ++pauses;
      BOOST_TEST_MESSAGE("run " << run << ": " << pauses << " pauses, " << keys.size() << " keys, " << kRecords
                                << " records");
      BOOST_TEST(pauses >= 100u, "only " << pauses << " pauses: the scenario did not exercise backpressure");
      BOOST_TEST(host.stop() == 0);

      const auto [audit_rc, audit_out] = s.audit(host);
      BOOST_TEST(audit_rc == 0, audit_out);
      BOOST_TEST(audit_out.find("audit ok: " + std::to_string(kRecords) + " committed records") != std::string::npos,
                 audit_out);
    }
  }
}

// Transaction markers leave offsets without records, in the middle of a
// partition and at its end. The commit passes them only once a re-read has
// confirmed them, and reaches the high watermark.
BOOST_AUTO_TEST_CASE(verified_holes_are_committed_past, *boost::unit_test::precondition(mock_only)) {
  Scenario s("offsets_holes");
  s.topic("orders", 2);
  std::set<std::string> keys;
  auto batch = [&](int from, int n) {
    std::vector<TestMessage> msgs;
    for (int i = from; i < from + n; ++i) {
      keys.insert("h-" + std::to_string(i));
      msgs.push_back({"h-" + std::to_string(i), "v", {}, i % 2});
    }
    s.kafka.produce("orders", msgs);
  };
  batch(0, 200);
  s.kafka.command("control_records orders 0 3");
  batch(200, 200);
  s.kafka.command("control_records orders 0 2");
  s.kafka.command("control_records orders 1 1");
  batch(400, 100);
  s.kafka.command("control_records orders 0 1");  // trailing: no record will ever follow it
  const auto hi = s.kafka.high_watermarks("orders", 2);
  BOOST_REQUIRE(hi.at(0) == 250 + 3 + 2 + 1);
  BOOST_REQUIRE(hi.at(1) == 250 + 1);

  auto& host = s.host("host-a", {s.scripted("waybill", "orders")}, {.admin = true});
  const int admin_port = s.admin_port(host);
  s.wait_committed(host);
  BOOST_TEST(s.kafka.committed("g", "orders", 2) == hi);

  auto per_key = s.calls_per_key();
  BOOST_TEST(per_key.size() == keys.size());
  for (const auto& k : keys) BOOST_TEST(per_key[k] == 1, k);

  // Four holes, each logged with its range and counted.
  const std::string log = host.log();
  for (const std::string range : {"orders[0] offsets 100..102", "orders[0] offsets 203..204",
                                  "orders[1] offsets 200..200", "orders[0] offsets 255..255"})
    BOOST_TEST(log.find(range + " hold no records") != std::string::npos, range << "\n" << log);
  const std::string metrics = http_request(admin_port, "GET", "/metrics").second;
  BOOST_TEST(metrics.find("idemsink_offset_gaps_total{route=\"waybill\",topic=\"orders\",partition=\"0\"} 3") !=
                 std::string::npos,
             metrics);
  BOOST_TEST(metrics.find("idemsink_offset_gaps_total{route=\"waybill\",topic=\"orders\",partition=\"1\"} 1") !=
             std::string::npos);
  // A family declared twice makes Prometheus reject the whole scrape.
  std::istringstream lines(metrics);
  std::set<std::string> families;
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("# TYPE ", 0) == 0) BOOST_TEST(families.insert(line).second, "declared twice: " << line);
  BOOST_TEST(host.stop() == 0);
  auto [audit_rc, audit_out] = s.audit(host);
  BOOST_TEST(audit_rc == 0, audit_out);
  BOOST_TEST(audit_out.find("audit ok: 500 committed records") != std::string::npos, audit_out);

  // Records whose claims vanish are unaccounted: exit 1, naming their offsets.
  s.connect()->execute(
      "DELETE FROM idemsink_claim WHERE biz_key IN ('h-10', 'h-12', 'h-40')");  // orders[0] offsets 5, 6, 20
  std::tie(audit_rc, audit_out) = s.audit(host);
  BOOST_TEST(audit_rc == 1, audit_out);
  BOOST_TEST(audit_out.find("orders[0] offsets 0..256: 250 records, 247 by claim, 0 by DLQ outbox, 3 UNACCOUNTED at "
                            "offsets 5..6, 20") != std::string::npos,
             audit_out);
  BOOST_TEST(audit_out.find("audit FAILED: 500 committed records, 3 unaccounted") != std::string::npos, audit_out);
}

// A partition whose records stop arriving (the consumer loses its fetch)
// while it has records below its high watermark is a stall: logged,
// counted, and recovered by reading it again from its commit point.
BOOST_AUTO_TEST_CASE(a_stalled_partition_is_detected_and_recovered) {
  Scenario s("offsets_stall");
  s.topic("orders", 4);
  std::set<std::string> keys;
  s.kafka.produce("orders", orders(4000, 4, keys));
  // The 300th record polled, and every later one of its partition, vanish.
  auto& host =
      s.host("host-a", {s.scripted("waybill", "orders")},
             {.admin = true, .kafka_lines = "stall_timeout = \"2s\"\n", .env = {{"IDEMSINK_FAULT", "drop_fetch:300"}}});
  const int admin_port = s.admin_port(host);
  s.wait_committed(host);
  const std::string log = host.log();
  BOOST_TEST(log.find("fault drop_fetch") != std::string::npos);
  BOOST_TEST(log.find("is stalled") != std::string::npos, log);
  BOOST_TEST(log.find("is flowing again") != std::string::npos);
  auto per_key = s.calls_per_key();
  BOOST_TEST(per_key.size() == keys.size());
  for (const auto& k : keys) BOOST_TEST(per_key[k] == 1, k);
  const std::string metrics = http_request(admin_port, "GET", "/metrics").second;
  BOOST_TEST(metrics.find("idemsink_partition_stalls_total{route=\"waybill\",topic=\"orders\"") != std::string::npos);
  int stalls = 0;
  for (size_t p = metrics.find("idemsink_partition_stalls_total{"); p != std::string::npos;
       p = metrics.find("idemsink_partition_stalls_total{", p + 1))
    stalls += std::stoi(metrics.substr(metrics.find("} ", p) + 2));
  BOOST_TEST(stalls == 1);
  BOOST_TEST(metrics.find("idemsink_partition_stalled{route=\"waybill\",topic=\"orders\",partition=\"0\"} 0") !=
             std::string::npos);
  BOOST_TEST(host.stop() == 0);
  const auto [audit_rc, audit_out] = s.audit(host);
  BOOST_TEST(audit_rc == 0, audit_out);
}

// A partition the group never committed is read from its beginning: until
// its first record arrives, where it stands is unknown. One that then
// delivers nothing (seen in CI: its start seek failed, was retried, and no
// record ever came) is a stall too, recovered by seeking its beginning again.
BOOST_AUTO_TEST_CASE(a_partition_read_from_its_beginning_that_delivers_nothing_is_stalled) {
  Scenario s("offsets_stall_at_start");
  s.topic("orders", 1);
  std::set<std::string> keys;
  s.kafka.produce("orders", orders(200, 1, keys));
  // The first record polled, and every later one of the partition, vanish.
  auto& host = s.host("host-a", {s.scripted("waybill", "orders")},
                      {.kafka_lines = "stall_timeout = \"2s\"\n", .env = {{"IDEMSINK_FAULT", "drop_fetch:1"}}});
  s.wait_committed(host);
  const std::string log = host.log();
  BOOST_TEST(log.find("fault drop_fetch") != std::string::npos, log);
  BOOST_TEST(log.find("is stalled") != std::string::npos, log);
  auto per_key = s.calls_per_key();
  BOOST_TEST(per_key.size() == keys.size());
  for (const auto& k : keys) BOOST_TEST(per_key[k] == 1, k);
  BOOST_TEST(host.stop() == 0);
}

// A partition that never fetches (its route paused by an operator before
// the host started) still shows its lag: the host asks the brokers for its
// ends. Until they answer the lag is unknown (null, NaN), never 0, which
// would read "caught up" while 500 records wait.
BOOST_AUTO_TEST_CASE(the_lag_of_a_partition_that_never_fetches_is_asked_of_the_brokers) {
  Scenario s("offsets_lag_unfetched");
  s.topic("orders", 2);
  std::set<std::string> keys;
  s.kafka.produce("orders", orders(500, 2, keys));
  const auto route = s.scripted("waybill", "orders");
  const auto cli_config = s.dir / "cli.toml";
  write_file(cli_config, s.config("cli", {route}));
  for (std::vector<std::string> args : {std::vector<std::string>{"schema", "apply"},
                                        {"route", "pause", "waybill", "--note", "before the host starts"}}) {
    args.insert(args.end(), {"--config", cli_config.string()});
    const auto [rc, out] = run_cli(s.dir, args[0], args);
    BOOST_REQUIRE_MESSAGE(rc == 0, out);
  }
  auto& host = s.host("host-a", {route}, {.admin = true});
  const int admin_port = s.admin_port(host);
  int zero_samples = 0, samples = 0;
  nlohmann::json status;
  wait_until(
      [&] {
        if (!host.running()) throw std::runtime_error(host.log());
        try {
          status = nlohmann::json::parse(http_request(admin_port, "GET", "/status").second);
        } catch (const std::exception&) {
          return false;  // admin not listening yet
        }
        int known = 0;
        for (const auto& p : status["partitions"]) {
          ++samples;
          if (p["lag"].is_number() && p["lag"].get<int64_t>() == 0) ++zero_samples;
          known += p["lag"].is_number();
        }
        return known == 2 && status["lag"].is_number() && status["lag"].get<int64_t>() == 500;
      },
      30s, "both partitions' lag known in /status");
  BOOST_TEST(samples > 0);
  BOOST_TEST(zero_samples == 0, status.dump());
  BOOST_TEST(http_request(admin_port, "GET", "/metrics").second.find("\nidemsink_consumer_lag 500\n") !=
             std::string::npos);
  BOOST_TEST(s.calls_per_key().empty());  // paused: nothing was called
  BOOST_TEST(host.stop() == 0);
}

// Right after an assignment, before any record of a partition arrives, its
// lag is measured from the group's committed offset, never reported as 0.
BOOST_AUTO_TEST_CASE(lag_before_the_first_record_counts_from_the_committed_offset) {
  Scenario s("offsets_lag");
  s.topic("orders", 1);
  std::set<std::string> keys;
  s.kafka.produce("orders", orders(1000, 1, keys));
  s.kafka.commit("g", "orders", {{0, 100}});
  // Every record of the partition vanishes (and the stall check waits a
  // minute): the host is assigned the partition and consumes nothing of it.
  auto& host =
      s.host("host-a", {s.scripted("waybill", "orders")},
             {.admin = true, .kafka_lines = "stall_timeout = \"60s\"\n", .env = {{"IDEMSINK_FAULT", "drop_fetch:1"}}});
  const int admin_port = s.admin_port(host);
  nlohmann::json partition;
  wait_until(
      [&] {
        if (!host.running()) throw std::runtime_error(host.log());
        try {
          auto status = nlohmann::json::parse(http_request(admin_port, "GET", "/status").second);
          for (const auto& p : status["partitions"])
            if (p["high_watermark"].get<int64_t>() == 1000) partition = p;
        } catch (const std::exception&) {
          return false;  // admin not listening yet
        }
        return !partition.is_null();
      },
      30s, "the partition's high watermark in /status");
  BOOST_TEST(partition["committed"].get<int64_t>() == 100);
  BOOST_TEST(partition["lag"].get<int64_t>() == 900, partition.dump());
  BOOST_TEST(http_request(admin_port, "GET", "/metrics")
                 .second.find("idemsink_partition_lag{route=\"waybill\",topic=\"orders\",partition=\"0\"} 900") !=
             std::string::npos);
  BOOST_TEST(host.stop() == 0);
}
