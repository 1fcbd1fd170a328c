// The host end to end: a real `idemsink run` process consuming from the mock
// cluster over TCP, claiming in a real MariaDB, calling test plugins.
#define BOOST_TEST_MODULE pipeline
#include <boost/test/unit_test.hpp>
#include <map>
#include <set>

#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(every_key_is_applied_once_and_offsets_reach_the_end) {
  Scenario s("pipeline_happy");
  s.topic("orders", 4);

  // 1000 records, every fifth one re-publishes an earlier order (same payload).
  std::vector<TestMessage> msgs;
  std::set<std::string> keys;
  for (int i = 0; i < 1000; ++i) {
    const int order = i % 5 == 4 ? i - 3 : i;
    const std::string key = "order-" + std::to_string(order);
    keys.insert(key);
    msgs.push_back({key, "{\"order\":" + std::to_string(order) + "}"});
  }
  s.kafka.produce("orders", msgs);

  auto& host = s.host("host-a", {with_delay(s.scripted("waybill", "orders"), "5ms")});
  s.wait_committed(host);

  auto per_key = s.calls_per_key();
  BOOST_TEST(per_key.size() == keys.size());
  for (const auto& k : keys) BOOST_TEST(per_key[k] == 1, k << " called " << per_key[k] << " times");

  auto rows = s.connect()->query("SELECT status, COUNT(*) FROM idemsink_claim GROUP BY status");
  BOOST_REQUIRE(rows.size() == 1u);
  BOOST_TEST(*rows[0][0] == "2");
  BOOST_TEST(std::stoul(*rows[0][1]) == keys.size());

  BOOST_TEST(host.stop() == 0);
  BOOST_TEST(host.log().find("idemsink host host-a stopped") != std::string::npos);
}
