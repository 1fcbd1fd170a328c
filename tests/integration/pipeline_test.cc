// The host end to end: a real `idemsink run` process consuming from the mock
// cluster over TCP, claiming in a real MariaDB, calling test plugins.
#define BOOST_TEST_MODULE pipeline
#include <boost/test/unit_test.hpp>
#include <map>
#include <set>

#include "core/common/util.h"
#include "tests/support/host_fixture.h"
#include "devkit/mariadb_server.h"
#include "tests/support/test_kafka.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace idemsink::devkit;
using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(every_key_is_applied_once_and_offsets_reach_the_end) {
  auto db = MariaDbServer::shared().fresh_database("pipeline_happy");
  TestKafka kafka;
  kafka.create_topic("orders", 4);
  ScratchDir dir("pipeline");
  const auto calls = dir / "calls.log";

  // 1000 records, every fifth one re-publishes an earlier order (same payload).
  std::vector<TestMessage> msgs;
  std::set<std::string> keys;
  for (int i = 0; i < 1000; ++i) {
    const int order = i % 5 == 4 ? i - 3 : i;
    const std::string key = "order-" + std::to_string(order);
    keys.insert(key);
    msgs.push_back({key, "{\"order\":" + std::to_string(order) + "}"});
  }
  kafka.produce("orders", msgs);

  HostProcess host(dir, "host",
                   base_config(kafka, db, "host-a", "g1") +
                       route_config({"waybill",
                                     "orders",
                                     "scripted_idempotent.so",
                                     "",
                                     {{"log", "\"" + calls.string() + "\""}, {"delay", "\"5ms\""}}}));
  wait_committed(kafka, "g1", {{"orders", 4}}, host);

  auto log = read_call_log(calls);
  std::map<std::string, int> per_key;
  for (const auto& cols : log) ++per_key[cols.at(1)];
  BOOST_TEST(per_key.size() == keys.size());
  for (const auto& k : keys) BOOST_TEST(per_key[to_hex(k)] == 1, k << " called " << per_key[to_hex(k)] << " times");

  auto conn = MariaDbServer::shared().connect("pipeline_happy");
  auto rows = conn->query("SELECT status, COUNT(*) FROM idemsink_claim GROUP BY status");
  BOOST_REQUIRE(rows.size() == 1u);
  BOOST_TEST(*rows[0][0] == "2");
  BOOST_TEST(std::stoul(*rows[0][1]) == keys.size());

  BOOST_TEST(host.stop() == 0);
  BOOST_TEST(host.log().find("idemsink host host-a stopped") != std::string::npos);
}
