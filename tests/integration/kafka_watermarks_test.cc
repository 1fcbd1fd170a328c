// Watermarks asked of a partition whose leader is down: an answer or an
// error within the deadline, never a wait for ever (core/kafka/watermarks.h;
// the host's stall check and `idemsink audit` ask this way).
#define BOOST_TEST_MODULE kafka_watermarks
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <future>
#include <thread>

#include "core/kafka/watermarks.h"
#include "tests/support/test_kafka.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace std::chrono_literals;

namespace {

rd_kafka_t* client(const std::string& bootstrap) {
  char err[256];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap.c_str(), err, sizeof err);
  rd_kafka_conf_set(conf, "log_level", "0", err, sizeof err);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  BOOST_REQUIRE_MESSAGE(rk != nullptr, err);
  return rk;
}

}  // namespace

BOOST_AUTO_TEST_CASE(watermarks_of_a_partition_whose_leader_is_down_come_back_within_the_deadline) {
  TestKafka kafka(3);
  kafka.create_topic("w", 1);
  kafka.produce("w", {{"k1", "v"}, {"k2", "v"}});
  rd_kafka_t* rk = client(kafka.bootstrap());
  kafka::Watermarks w;
  BOOST_TEST_REQUIRE(kafka::query_watermarks(rk, "w", 0, 10000, w) == RD_KAFKA_RESP_ERR_NO_ERROR);
  BOOST_TEST(w.low == 0);
  BOOST_TEST(w.high == 2);

  kafka.broker_down(kafka.leaders("w").at(0));
  const auto t0 = std::chrono::steady_clock::now();
  const auto err = kafka::query_watermarks(rk, "w", 0, 2000, w);
  const auto took = std::chrono::steady_clock::now() - t0;
  BOOST_TEST(err != RD_KAFKA_RESP_ERR_NO_ERROR);
  BOOST_TEST(took < 6s, "took " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms");

  // librdkafka's own query, for the record: before 2.3.0 it waits for ever
  // here. Asked on a thread of its own, given 15 s, and left behind if stuck.
  auto answered = std::make_shared<std::promise<rd_kafka_resp_err_t>>();
  auto future = answered->get_future();
  rd_kafka_t* other = client(kafka.bootstrap());
  std::thread([other, answered] {
    int64_t lo = 0, hi = 0;
    answered->set_value(rd_kafka_query_watermark_offsets(other, "w", 0, &lo, &hi, 2000));
  }).detach();
  const bool returned = future.wait_for(15s) == std::future_status::ready;
  BOOST_TEST_MESSAGE("rd_kafka_query_watermark_offsets with a 2 s timeout and the leader down "
                     << (returned ? "returned" : "did not return within 15 s") << " (librdkafka "
                     << rd_kafka_version_str() << ")");
  rd_kafka_destroy(rk);
}
