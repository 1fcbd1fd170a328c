// Hostile input for the shipped remote plugins, decided before anything is
// sent: values nested deeper than the JSON writer can take and keys that are
// not UTF-8 are refused (permanent, never "maybe sent"), binary values are
// carried as base64, and an exception while reading an answer is that call's
// failure, logged with the route and key, never the end of the host.
#define BOOST_TEST_MODULE remote_plugins
#include <boost/test/unit_test.hpp>
#include <idemsink/testing.h>

#include <future>

#include "plugins/common/remote.h"

using namespace idemsink;
using namespace idemsink::plugins;
using sdk::testing::FakeHost;
using sdk::testing::RecordBuilder;
using sdk::testing::RecordingCompletion;

BOOST_AUTO_TEST_CASE(deeply_nested_values_and_non_utf8_keys_are_unsendable) {
  RecordBuilder deep;
  deep.route("waybill").biz_key("K1").value(std::string(200000, '[') + std::string(200000, ']'));
  const auto why = unsendable(deep.record());
  BOOST_REQUIRE(why.has_value());
  BOOST_TEST(why->find("200000 levels") != std::string::npos, *why);

  RecordBuilder fine;
  fine.route("waybill").biz_key("K2").value("{\"a\":[[[\"]]]]]]\"]]]}");  // brackets inside strings do not count
  BOOST_TEST(!unsendable(fine.record()).has_value());

  RecordBuilder bad_key;
  bad_key.route("sms").biz_key("K\xC0\xAF").value("{}");
  BOOST_TEST(unsendable(bad_key.record()).value_or("").find("not valid UTF-8") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(binary_values_travel_as_base64) {
  RecordBuilder bin;
  bin.route("waybill").biz_key("K3").value(std::string("\xFF\x00\x80zz", 5));
  const auto payload = order_payload(bin.record());
  BOOST_TEST(payload.dump() == "{\"value_base64\":\"/wCAeno=\"}");
  RecordBuilder text;
  text.route("waybill").biz_key("K4").value("plain text");
  BOOST_TEST(order_payload(text.record()).dump() == "\"plain text\"");
}

// A JSON value goes out as the producer wrote it: a parse and re-write would
// round a number beyond 64 bits (an amount in the smallest unit, an id) to a
// double.
BOOST_AUTO_TEST_CASE(a_json_value_is_sent_as_written) {
  RecordBuilder big;
  big.route("waybill").biz_key("K6").value("{\"amount\": 123456789012345678901234567890, \"id\": \"A\"}");
  BOOST_TEST(order_json(big.record()) == "{\"amount\": 123456789012345678901234567890, \"id\": \"A\"}");
  BOOST_TEST(order_payload(big.record()).dump() != order_json(big.record()));  // what a re-write did
  RecordBuilder text;
  text.route("waybill").biz_key("K7").value("plain \"text\"");
  BOOST_TEST(order_json(text.record()) == "\"plain \\\"text\\\"\"");
  RecordBuilder bad_utf8_in_json;
  bad_utf8_in_json.route("waybill").biz_key("K8").value(std::string("{\"a\":\"\xC0\xAF\"}"));
  BOOST_TEST(order_json(bad_utf8_in_json.record()) == "{\"value_base64\":\"eyJhIjoiwK8ifQ==\"}");
  RecordBuilder bom;
  bom.route("waybill").biz_key("K9").value("\xEF\xBB\xBF{\"a\": 1}");
  BOOST_TEST(order_json(bom.record()) == "{\"a\":1}");
}

BOOST_AUTO_TEST_CASE(an_exception_reading_an_answer_is_that_calls_failure) {
  FakeHost host;
  RecordBuilder rec;
  rec.route("sms").biz_key("K5").value("{}");
  const HttpResult ok{HttpResult::Failure::None, 200, "{\"messages\":[1]}", ""};
  auto throwing = [](const sdk::SharedCompletion&, const HttpResult& r) {
    (void)nlohmann::json::parse(r.body)["messages"][0].get<std::string>();  // throws: 1 is not a string
  };
  {
    RecordingCompletion done;
    guarded_question(host.host(), rec.record(), done.completion(), throwing)(ok);
    BOOST_TEST((done.outcome() == IDEMSINK_OUTCOME_RETRYABLE));  // cannot tell, asked again later
    BOOST_TEST(done.detail().find("unreadable answer") != std::string::npos, done.detail());
  }
  {
    RecordingCompletion done;
    guarded_call(host.host(), rec.record(), done.completion(), throwing)(ok);
    BOOST_TEST((done.outcome() == IDEMSINK_OUTCOME_OK));  // a 2xx: the effect happened
  }
  {
    RecordingCompletion done;
    const HttpResult unavailable{HttpResult::Failure::None, 503, "{}", ""};
    guarded_call(host.host(), rec.record(), done.completion(), throwing)(unavailable);
    BOOST_TEST((done.outcome() == IDEMSINK_OUTCOME_RETRYABLE));
  }
  BOOST_TEST(host.logged("route sms key \"K5\": reading the answer failed"));
}

BOOST_AUTO_TEST_CASE(extra_headers_parse_and_bad_ones_are_refused_without_their_value) {
  const auto h = parse_headers(" Authorization: Bearer abc ; X-Tenant:shop-1;");
  BOOST_REQUIRE(h.size() == 2u);
  BOOST_TEST(h[0].first == "Authorization");
  BOOST_TEST(h[0].second == "Bearer abc");
  BOOST_TEST(h[1].second == "shop-1");
  BOOST_TEST(parse_headers("").empty());
  const auto twice = parse_headers("X-Tenant: a; x-tenant: b");  // the last of a name, as one header
  BOOST_REQUIRE(twice.size() == 1u);
  BOOST_TEST(twice[0].second == "b");
  for (const char* bad : {"no colon here", ": value", "Bad Name: x", "X-Ok: line\r\nInjected: 1", "Content-Length: 5",
                          "transfer-encoding: chunked"}) {
    try {
      parse_headers(bad);
      BOOST_FAIL("accepted: " << bad);
    } catch (const std::invalid_argument& e) {
      BOOST_TEST(std::string(e.what()).find("headers:") == 0u, e.what());
      BOOST_TEST(std::string(e.what()).find("Injected") == std::string::npos);  // the value is not echoed
    }
  }
}

// The client writes no request whose target or header could end its line:
// such a request is malformed (permanent: the record made it), never sent,
// never even connected for.
BOOST_AUTO_TEST_CASE(the_client_refuses_control_characters_in_the_request_line_and_headers) {
  HttpClient::Options o;
  o.endpoint = parse_url("http://127.0.0.1:1");  // nothing listens: a request that went out would fail to connect
  HttpClient client(o);
  const auto result = [&](const std::string& target, HttpClient::Headers headers) {
    std::promise<HttpResult> p;
    client.request("GET", target, "", std::move(headers), std::nullopt, [&p](HttpResult r) { p.set_value(r); });
    return p.get_future().get();
  };
  const HttpResult smuggled = result("/x HTTP/1.1\r\nX-Forwarded-User: admin\r\n\r\nDELETE /accounts/1", {});
  BOOST_TEST((smuggled.failure == HttpResult::Failure::Invalid));
  BOOST_TEST((classify(smuggled) == IDEMSINK_OUTCOME_PERMANENT));
  const HttpResult header = result("/x", {{"X-Ref", "a\r\nX-Forwarded-User: admin"}});
  BOOST_TEST((header.failure == HttpResult::Failure::Invalid));
  const HttpResult fine = result("/x?a=%20b", {{"X-Ref", "a\tb"}});
  BOOST_TEST((fine.failure == HttpResult::Failure::BeforeSend));  // well-formed: it tried to connect
}
