#define BOOST_TEST_MODULE format
#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include <boost/asio/ip/tcp.hpp>

#include "core/common/http_fetch.h"
#include "core/format/avro.h"
#include "core/format/decoder.h"
#include "core/format/protobuf.h"

using namespace idemsink::format;
using nlohmann::json;
using namespace std::string_literals;

namespace {

const char* kOrder = R"({
  "type": "record", "name": "Order", "namespace": "com.acme",
  "fields": [
    {"name": "id", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
    {"name": "note", "type": ["null", "string"], "default": null},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
    {"name": "extra", "type": {"type": "map", "values": "long"}},
    {"name": "payload", "type": ["int", "string"]}
  ]})";

// id "P-1", amount 12.50, note "hi", tags [a, b], kind B, extra {x: 5}, payload int -3.
const std::string kOrderBytes = "\x06P-1"s + "\x04\x04\xE2"s + "\x02\x04hi"s +
                                "\x04\x02"
                                "a"
                                "\x02"
                                "b"
                                "\x00"s +
                                "\x02"s + "\x02\x02x\x0A\x00"s + "\x00\x05"s;

}  // namespace

BOOST_AUTO_TEST_CASE(avro_decodes_with_the_writers_schema_as_documented) {
  AvroSchema schema(kOrder);
  const auto out = json::parse(schema.to_json(kOrderBytes));
  BOOST_TEST(out == json::parse(R"({"id": "P-1", "amount": "12.50", "note": "hi", "tags": ["a", "b"], "kind": "B",
                                   "extra": {"x": 5}, "payload": {"int": -3}})"),
             out.dump());
}

BOOST_AUTO_TEST_CASE(avro_decimals_are_exact_text_signs_and_all) {
  AvroSchema schema(R"({"type": "bytes", "logicalType": "decimal", "precision": 30, "scale": 2})");
  BOOST_TEST(schema.to_json("\x02\x83"s) == R"("-1.25")");
  BOOST_TEST(schema.to_json("\x02\x05"s) == R"("0.05")");
  // 2^72 - 1 cents: beyond a double's 53 bits, still exact.
  BOOST_TEST(schema.to_json("\x14\x00\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF"s) == R"("47223664828696452136.95")");
}

BOOST_AUTO_TEST_CASE(avro_bytes_that_do_not_fit_the_schema_are_refused) {
  AvroSchema schema(kOrder);
  BOOST_CHECK_THROW(schema.to_json(kOrderBytes.substr(0, kOrderBytes.size() - 1)), std::runtime_error);
  BOOST_CHECK_THROW(schema.to_json(kOrderBytes + "\x00"s), std::runtime_error);
  std::string bad_union = kOrderBytes;
  bad_union[bad_union.size() - 2] = '\x08';  // payload branch 4 of 2
  BOOST_CHECK_THROW(schema.to_json(bad_union), std::runtime_error);
  BOOST_CHECK_THROW(schema.to_json("\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF"s), std::runtime_error);
}

BOOST_AUTO_TEST_CASE(avro_names_defined_in_a_referenced_schema_resolve) {
  const std::string money = R"({"type": "record", "name": "Money", "namespace": "com.acme",
                                "fields": [{"name": "cents", "type": "long"}]})";
  AvroSchema schema(R"({"type": "record", "name": "Paid", "namespace": "com.acme",
                        "fields": [{"name": "total", "type": "Money"}, {"name": "next", "type": ["null", "Paid"]}]})",
                    {money});
  BOOST_TEST(schema.to_json("\xC8\x01\x02\x02\x00"s) ==
             R"({"next":{"next":null,"total":{"cents":1}},"total":{"cents":100}})");
  BOOST_CHECK_THROW(AvroSchema(R"({"type": "record", "name": "P", "fields": [{"name": "m", "type": "Money"}]})"),
                    std::runtime_error);
}

namespace {

const char* kProto = R"(syntax = "proto3";
package acme;
import "google/protobuf/timestamp.proto";
import "acme/money.proto";
message Other { int32 x = 1; }
message Order {
  message Line { string sku = 1; }
  string id = 1;
  int64 cents = 2;
  Line line = 3;
  google.protobuf.Timestamp at = 4;
  Money total = 5;
  bool gift = 6;
}
)";
const std::vector<std::pair<std::string, std::string>> kProtoRefs = {
    {"acme/money.proto", "syntax = \"proto3\";\npackage acme;\nmessage Money { int64 cents = 1; }\n"}};

}  // namespace

BOOST_AUTO_TEST_CASE(protobuf_picks_the_message_by_its_indexes) {
  ProtobufSchema schema(kProto, kProtoRefs);
  // [1]: Order; id, cents 1250, line {sku s1}, at 1 s, total {cents 7};
  // gift false, its default, is left out.
  const std::string order = "\x02\x02"s + "\x0A\x03P-1"s + "\x10\xE2\x09"s + "\x1A\x04\x0A\x02s1"s +
                            "\x22\x02\x08\x01"s + "\x2A\x02\x08\x07"s;
  BOOST_TEST(json::parse(schema.to_json(order)) ==
                 json::parse(R"({"id": "P-1", "cents": "1250", "line": {"sku": "s1"}, "at": "1970-01-01T00:00:01Z",
                                 "total": {"cents": "7"}})"),
             schema.to_json(order));
  // The short form: the file's first message.
  BOOST_TEST(json::parse(schema.to_json("\x00\x08\x07"s)) == json::parse(R"({"x": 7})"));
  // [1, 0]: Order.Line.
  BOOST_TEST(json::parse(schema.to_json("\x04\x02\x00\x0A\x02s1"s)) == json::parse(R"({"sku": "s1"})"));
  BOOST_CHECK_THROW(schema.to_json("\x02\x06\x08\x07"s), std::runtime_error);   // no message 3
  BOOST_CHECK_THROW(schema.to_json("\x02\x02\x0A\x09P"s), std::runtime_error);  // a string cut short
}

// As Confluent's serializers register a schema: a FileDescriptorProto,
// serialized and base64-encoded (here money.proto: acme.shop.Money).
BOOST_AUTO_TEST_CASE(protobuf_schemas_registered_as_descriptors_are_read) {
  ProtobufSchema schema(
      "Cgttb25leS5wcm90bxIJYWNtZS5zaG9wIigKBU1vbmV5EhAKCGN1cnJlbmN5GAEgASgJEg0KBWNlbnRzGAIgASgDYgZwcm90bzM=", {});
  BOOST_TEST(json::parse(schema.to_json("\x00\x0A\x03"
                                        "CNY"
                                        "\x10\x05"s)) == json::parse(R"({"currency": "CNY", "cents": "5"})"));
}

BOOST_AUTO_TEST_CASE(protobuf_schemas_that_do_not_parse_or_resolve_are_refused) {
  BOOST_CHECK_THROW(ProtobufSchema("syntax = \"proto3\"; message {", {}), std::runtime_error);
  BOOST_CHECK_THROW(ProtobufSchema(kProto, {}), std::runtime_error);  // acme/money.proto missing
}

BOOST_AUTO_TEST_CASE(the_payload_check_sees_data_not_its_encoding) {
  BOOST_TEST(canonical_json(R"({"b": 1, "a": null, "c": {"z": null, "y": [2, null]}})") ==
             R"({"b":1,"c":{"y":[2,null]}})");
  BOOST_TEST(canonical_json(R"({"c":{"y":[2,null]},"b":1})") == R"({"b":1,"c":{"y":[2,null]}})");
  BOOST_TEST(canonical_json("not json") == "not json");
}

BOOST_AUTO_TEST_CASE(keys_read_as_text) {
  BOOST_TEST(*key_text(R"("P-1")") == "P-1");
  BOOST_TEST(*key_text("42") == "42");
  BOOST_TEST(*key_text(R"({"b": 2, "a": "x"})") == R"({"a":"x","b":2})");
  BOOST_TEST(!key_text("P-1"));
}

BOOST_AUTO_TEST_CASE(the_wire_format_names_its_schema) {
  BOOST_TEST(*Decoder::schema_id("\x00\x00\x00\x01\x02rest"s) == 258);
  BOOST_TEST(!Decoder::schema_id("\x01\x00\x00\x00\x01"s));
  BOOST_TEST(!Decoder::schema_id("\x00\x00\x00\x01"s));
  // A record not in the wire format is undecodable before any registry is asked.
  Decoder avro(idemsink::config::Format::Avro, nullptr, "value");
  const auto out = avro.decode(R"({"id": 1})");
  BOOST_REQUIRE(std::holds_alternative<Undecodable>(out));
  BOOST_TEST(std::get<Undecodable>(out).why.find("not in the schema registry's wire format") != std::string::npos);
}

// What one hostile record (and the schema its sender registered) may not do:
// blow the output up, take quadratic time, or nest past the stack.
BOOST_AUTO_TEST_CASE(hostile_records_are_refused_not_obeyed) {
  std::string blocks;  // 500 blocks of 100 nulls each, in 1,001 bytes
  for (int i = 0; i < 500; ++i) blocks += "\xC8\x01"s;
  blocks += '\0';
  BOOST_CHECK_THROW(AvroSchema(R"({"type": "array", "items": "null"})").to_json(blocks), std::runtime_error);
  BOOST_CHECK_THROW(AvroSchema(R"({"type": "bytes", "logicalType": "decimal", "precision": 200, "scale": 2})")
                        .to_json("\x82\x01"s + std::string(65, '\x01')),
                    std::runtime_error);
  std::string deep = "\"long\"";
  for (int i = 0; i < 300; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  BOOST_CHECK_THROW(AvroSchema{deep}, std::runtime_error);
  BOOST_TEST(!key_text(std::string(200, '[') + std::string(200, ']')));
  BOOST_TEST(canonical_json(std::string(200, '[') + std::string(200, ']')).size() == 400u);  // left as it is
}

BOOST_AUTO_TEST_CASE(a_key_stays_the_same_key_across_schema_versions) {
  BOOST_TEST(*key_text(R"({"shipment_id": "S-1", "region": null})") == R"({"shipment_id":"S-1"})");
  BOOST_TEST(*key_text(" 1.50 ") == "1.50");
}

// A registry that takes the connection and never answers: the request
// gives up at its timeout (a blocking read on Beast ignores its timer).
BOOST_AUTO_TEST_CASE(a_silent_server_times_out) {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor silent(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  idemsink::HttpFetch req;
  req.url = idemsink::parse_http_url("http://127.0.0.1:" + std::to_string(silent.local_endpoint().port()) + "/x");
  req.timeout = std::chrono::milliseconds(300);
  const auto start = std::chrono::steady_clock::now();
  BOOST_CHECK_THROW(idemsink::http_fetch(req), std::runtime_error);
  BOOST_TEST((std::chrono::steady_clock::now() - start < std::chrono::seconds(10)));
}
