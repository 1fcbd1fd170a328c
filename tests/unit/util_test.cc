#define BOOST_TEST_MODULE util
#include <boost/test/unit_test.hpp>
#include <set>

#include "core/claim/claim_store.h"
#include "core/common/util.h"

using namespace idemsink;

BOOST_AUTO_TEST_CASE(durations_need_a_unit) {
  BOOST_TEST(parse_duration("250ms")->count() == 250);
  BOOST_TEST(parse_duration("2s")->count() == 2000);
  BOOST_TEST(parse_duration("5m")->count() == 300000);
  BOOST_TEST(parse_duration("1h")->count() == 3600000);
  BOOST_TEST(parse_duration("7d")->count() == 7LL * 86400000);
  BOOST_TEST(!parse_duration("10").has_value());
  BOOST_TEST(!parse_duration("-1s").has_value());
  BOOST_TEST(!parse_duration("1 s").has_value());
  BOOST_TEST(!parse_duration("s").has_value());
}

BOOST_AUTO_TEST_CASE(uuids_are_v4_and_distinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    std::string u = random_uuid();
    BOOST_TEST(u.size() == 36u);
    BOOST_TEST(u[14] == '4');
    BOOST_TEST(std::string("89ab").find(u[19]) != std::string::npos);
    seen.insert(u);
  }
  BOOST_TEST(seen.size() == 1000u);
}

BOOST_AUTO_TEST_CASE(payload_hash_is_16_bytes_and_content_sensitive) {
  BOOST_TEST(payload_hash("a").size() == 16u);
  BOOST_TEST(payload_hash("a") == payload_hash("a"));
  BOOST_TEST(payload_hash("a") != payload_hash("b"));
  BOOST_TEST(payload_hash(std::string("a\0b", 3)) != payload_hash("a"));
}

BOOST_AUTO_TEST_CASE(sanitize_keeps_utf8_and_replaces_garbage) {
  BOOST_TEST(sanitize_utf8("plain", 100) == "plain");
  BOOST_TEST(sanitize_utf8("订单超时", 100) == "订单超时");
  BOOST_TEST(sanitize_utf8(std::string("a\xff\xfe" "b", 4), 100) == "a??b");
  BOOST_TEST(sanitize_utf8(std::string("a\0b", 3), 100) == "a?b");
  // Cut on a character boundary: "订" is 3 bytes.
  BOOST_TEST(sanitize_utf8("订单", 4) == "订");
}

BOOST_AUTO_TEST_CASE(buckets_are_utc_months_of_the_record_timestamp) {
  BOOST_TEST(claim::bucket_of(0) == "1970-01-01");
  BOOST_TEST(claim::bucket_of(1796083199999LL) == "2026-11-01");  // 2026-11-30T23:59:59.999Z
  BOOST_TEST(claim::bucket_of(1796083200000LL) == "2026-12-01");                     // one ms later: next month
}
