#define BOOST_TEST_MODULE util
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "core/claim/claim_store.h"
#include "core/common/util.h"
#include "core/db/connection.h"
#include "core/dlq/outbox.h"

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

BOOST_AUTO_TEST_CASE(durations_whose_milliseconds_overflow_are_refused) {
  BOOST_TEST(parse_duration("9223372036854775807ms")->count() == INT64_MAX);
  BOOST_TEST(!parse_duration("9223372036854775808ms").has_value());
  BOOST_TEST(parse_duration("9223372036854775s")->count() == 9223372036854775000LL);
  BOOST_TEST(!parse_duration("9223372036854776s").has_value());
  BOOST_TEST(parse_duration("106751991167d")->count() == 106751991167LL * 86400000);
  BOOST_TEST(!parse_duration("106751991168d").has_value());
  BOOST_TEST(!parse_duration("213503982335d").has_value());  // 2^64 ms and a little: used to wrap to 9.5 h
  BOOST_TEST(!parse_duration("153722867280913m").has_value());
  BOOST_TEST(!parse_duration("2562047788016h").has_value());
}

BOOST_AUTO_TEST_CASE(listen_addresses_are_ip_and_port) {
  auto v4 = parse_host_port("127.0.0.1:9464");
  BOOST_REQUIRE(v4.has_value());
  BOOST_TEST(v4->host == "127.0.0.1");
  BOOST_TEST(v4->port == 9464);
  auto v6 = parse_host_port("[::1]:65535");
  BOOST_REQUIRE(v6.has_value());
  BOOST_TEST(v6->host == "::1");
  BOOST_TEST(v6->port == 65535);
  BOOST_TEST(parse_host_port("0.0.0.0:0")->port == 0);
  for (const char* bad : {"127.0.0.1:65536", "127.0.0.1:70000", "127.0.0.1:999999", "127.0.0.1:", "127.0.0.1", ":9464",
                          "[]:9464", "localhost:9464", "::1:9464", "[::1]", "[127.0.0.1]:80", "127.0.0.1:+80",
                          "127.0.0.1:-1", "127.0.0.1: 80", "1.2.3:80"})
    BOOST_TEST(!parse_host_port(bad).has_value(), bad);
}

BOOST_AUTO_TEST_CASE(secret_looking_names) {
  for (const char* name : {"sasl.password", "ssl.key.location", "ssl.keystore.password",
                           "sasl.oauthbearer.client.secret", "API_TOKEN", "Password", "password_env"})
    BOOST_TEST(looks_secret(name), name);
  for (const char* name : {"bootstrap.servers", "session.timeout.ms", "client.id", "endpoint", ""})
    BOOST_TEST(!looks_secret(name), name);
}

// idem_tokens come from the OS CSPRNG: 16 threads drawing at once (as claim
// jobs and hosts do) never repeat one another, and every token is a
// well-formed v4 UUID.
BOOST_AUTO_TEST_CASE(uuids_from_16_threads_are_v4_and_distinct) {
  constexpr int kThreads = 16, kEach = 100000;
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> drawn(kThreads);
  std::atomic<int> malformed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      drawn[t].reserve(kEach);
      for (int i = 0; i < kEach; ++i) {
        const std::string u = random_uuid();
        bool ok = u.size() == 36 && u[8] == '-' && u[13] == '-' && u[18] == '-' && u[23] == '-' && u[14] == '4' &&
                  std::string_view("89ab").find(u[19]) != std::string_view::npos;
        std::string hex;
        for (size_t k = 0; k < u.size(); ++k)
          if (k != 8 && k != 13 && k != 18 && k != 23) {
            ok = ok && std::isxdigit(static_cast<unsigned char>(u[k])) &&
                 !std::isupper(static_cast<unsigned char>(u[k]));
            hex += u[k];
          }
        if (!ok || hex.size() != 32) {
          ++malformed;
          continue;
        }
        drawn[t].emplace_back(std::stoull(hex.substr(0, 16), nullptr, 16), std::stoull(hex.substr(16), nullptr, 16));
      }
    });
  for (auto& th : threads) th.join();
  BOOST_TEST(malformed.load() == 0);
  std::vector<std::pair<uint64_t, uint64_t>> all;
  for (auto& d : drawn) all.insert(all.end(), d.begin(), d.end());
  std::sort(all.begin(), all.end());
  BOOST_TEST((std::adjacent_find(all.begin(), all.end()) == all.end()));
  BOOST_TEST(all.size() == static_cast<size_t>(kThreads) * kEach);
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
  BOOST_TEST(sanitize_utf8(std::string("a\xff\xfe"
                                       "b",
                                       4),
                           100) == "a??b");
  BOOST_TEST(sanitize_utf8(std::string("a\0b", 3), 100) == "a?b");
  // Cut on a character boundary: "订" is 3 bytes.
  BOOST_TEST(sanitize_utf8("订单", 4) == "订");
}

// What utf8mb4 columns refuse (MariaDB error 1366) never gets through.
BOOST_AUTO_TEST_CASE(sanitize_refuses_overlongs_surrogates_and_beyond_unicode) {
  BOOST_TEST(sanitize_utf8("\xC0\xAF", 100) == "??");                        // overlong '/'
  BOOST_TEST(sanitize_utf8("\xE0\x80\xAF", 100) == "???");                   // overlong, 3 bytes
  BOOST_TEST(sanitize_utf8("\xF0\x80\x80\xAF", 100) == "????");              // overlong, 4 bytes
  BOOST_TEST(sanitize_utf8("\xED\xA0\x80", 100) == "???");                   // a surrogate (U+D800)
  BOOST_TEST(sanitize_utf8("\xF4\x90\x80\x80", 100) == "????");              // U+110000
  BOOST_TEST(sanitize_utf8("\xF5\x80\x80\x80x", 100) == "????x");            // F5: no such lead byte
  BOOST_TEST(sanitize_utf8("\xF0\x9F\x98\x80", 100) == "\xF0\x9F\x98\x80");  // U+1F600 stays
  BOOST_TEST(sanitize_utf8("\xED\x9F\xBF", 100) == "\xED\x9F\xBF");          // U+D7FF stays
  BOOST_TEST(sanitize_utf8("\xE4\xB8", 100) == "??");                        // truncated sequence
}

BOOST_AUTO_TEST_CASE(buckets_are_utc_months_of_the_record_timestamp) {
  BOOST_TEST(claim::bucket_of(0) == "1970-01-01");
  BOOST_TEST(claim::bucket_of(1796083199999LL) == "2026-11-01");  // 2026-11-30T23:59:59.999Z
  BOOST_TEST(claim::bucket_of(1796083200000LL) == "2026-12-01");  // one ms later: next month
}

// Derived idem_tokens: RFC 4122 version 5, checked against the RFC's own
// example (the DNS namespace and "www.example.com"); another namespace or
// another name gives another token.
BOOST_AUTO_TEST_CASE(name_based_uuids_are_rfc_4122_version_5) {
  const std::string dns = "6ba7b810-9dad-11d1-80b4-00c04fd430c8";
  BOOST_TEST(idemsink::name_uuid(dns, "www.example.com") == "2ed6657d-e927-568b-95e1-2665a8aea6a2");
  BOOST_TEST(idemsink::name_uuid(dns, "www.example.com") == idemsink::name_uuid(dns, "www.example.com"));
  BOOST_TEST(idemsink::name_uuid(dns, "www.example.org") != idemsink::name_uuid(dns, "www.example.com"));
  BOOST_TEST(idemsink::name_uuid("6ba7b811-9dad-11d1-80b4-00c04fd430c8", "www.example.com") !=
             idemsink::name_uuid(dns, "www.example.com"));
  BOOST_CHECK_THROW(idemsink::name_uuid("not-a-uuid", "x"), std::invalid_argument);
}

// Galera's answers: a certification conflict at commit is re-run like a
// deadlock, a node not ready like a lost connection (reconnect, re-run).
BOOST_AUTO_TEST_CASE(galera_answers_are_classified) {
  BOOST_TEST((idemsink::db::classify(1213) == idemsink::db::ErrorClass::Transient));
  BOOST_TEST((idemsink::db::classify(1047) == idemsink::db::ErrorClass::ConnectionLost));
}

// The numbers stored in idemsink_claim.status and idemsink_dlq_outbox.purpose
// are a data format: rows written by an older host are read by a newer one,
// and docs/design.md gives them to operators. The enums are their
// only source in code, so an enum value changed by mistake would move code and
// tests together; this pins them to the documented numbers.
BOOST_AUTO_TEST_CASE(stored_status_and_purpose_numbers_never_change) {
  BOOST_TEST(static_cast<int>(claim::Status::Pending) == 1);
  BOOST_TEST(static_cast<int>(claim::Status::Done) == 2);
  BOOST_TEST(static_cast<int>(claim::Status::Failed) == 3);
  BOOST_TEST(static_cast<int>(claim::Status::Unknown) == 4);
  BOOST_TEST(claim::sql_status_is(claim::Status::Unknown, "c.") == "c.status = 4");
  BOOST_TEST(static_cast<int>(dlq::Purpose::DeadLetter) == 1);
  BOOST_TEST(static_cast<int>(dlq::Purpose::Forward) == 2);
  BOOST_TEST(static_cast<int>(dlq::Purpose::Replay) == 3);
  BOOST_TEST(static_cast<int>(dlq::Purpose::Lost) == 4);
  BOOST_TEST(dlq::sql_purpose_is(dlq::Purpose::Lost) == "purpose = 4");
}
