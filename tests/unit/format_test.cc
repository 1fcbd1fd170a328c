#define BOOST_TEST_MODULE format
#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include <algorithm>
#include <boost/asio/ip/tcp.hpp>
#include <cmath>
#include <cstring>
#include <google/protobuf/compiler/parser.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/json_util.h>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "core/common/http_fetch.h"
#include "core/format/avro.h"
#include "core/format/decoder.h"
#include "core/format/json_writer.h"
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
  // The text itself is what the host prints for that JSON, and the payload
  // check's form is it without null members.
  const auto decoded = schema.decode(kOrderBytes);
  BOOST_TEST(decoded.json == out.dump());
  BOOST_TEST(decoded.canonical() == canonical_json(decoded.json));
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

namespace {

const char* kSample = R"(syntax = "proto3";
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";
import "google/protobuf/any.proto";
message Sample {
  enum Colour { RED = 0; BLUE = 1; }
  string id = 1;
  google.protobuf.Timestamp at = 2;
  google.protobuf.Duration wait = 3;
  google.protobuf.Int64Value count = 4;
  google.protobuf.Int32Value zero = 5;
  map<string, int64> totals = 6;
  map<int32, string> names = 7;
  Colour colour = 8;
  bytes blob = 9;
  float ratio = 10;
  double score = 11;
  google.protobuf.Struct extra = 12;
  repeated Colour colours = 13;
  optional int32 maybe = 14;
  uint64 big = 15;
  repeated double values = 16;
  bool flag = 17;
  repeated Sample children = 18;
  oneof pay { string card = 19; int64 points = 20; Sample gift = 22; }
  google.protobuf.Any any = 21;
}
)";

// proto2: closed enums, required fields, groups.
const char* kLegacy = R"(syntax = "proto2";
message Legacy {
  enum E { A = 1; B = 2; }
  required string id = 1;
  optional E e = 2;
  repeated E es = 3;
  optional group G = 4 { optional int32 x = 5; repeated string tags = 6; }
  optional int32 n = 7 [default = 5];
}
)";

// The sample written from JSON by libprotobuf, plus `tail` (raw fields), in
// Confluent's framing (the short message index).
namespace pb = google::protobuf;

// A message of the schema's first type as libprotobuf builds it, for the
// reference encoder, parser and printer (the decoder builds its own).
std::unique_ptr<pb::Message> new_message(const char* schema) {
  static pb::DescriptorPool pool(pb::DescriptorPool::generated_pool());
  static pb::DynamicMessageFactory factory(&pool);
  static std::map<const char*, const pb::Descriptor*> built;
  if (!built.count(schema)) {
    pb::FileDescriptorProto file;
    pb::io::ArrayInputStream input(schema, static_cast<int>(std::strlen(schema)));
    pb::io::Tokenizer tokens(&input, nullptr);
    pb::compiler::Parser parser;
    BOOST_TEST_REQUIRE(parser.Parse(&tokens, &file));
    file.set_name("reference_" + std::to_string(built.size()) + ".proto");
    built[schema] = pool.BuildFile(file)->message_type(0);
  }
  return std::unique_ptr<pb::Message>(factory.GetPrototype(built[schema])->New());
}

// A message written from JSON by libprotobuf, plus `tail` (raw fields), in
// Confluent's framing (the short message index).
std::string sample_bytes(const std::string& value, const std::string& tail = "", const char* schema = kSample) {
  auto msg = new_message(schema);
  const auto status = pb::util::JsonStringToMessage(value, msg.get());
  BOOST_TEST_REQUIRE(status.ok(), status.ToString() << ": " << value);
  return "\x00"s + msg->SerializePartialAsString() + tail;
}

// What protobuf's own parser and JSON printer make of the same bytes; none
// when the parser refuses them, or the printer (a Timestamp out of range).
std::optional<std::string> printed_by_protobuf(const std::string& framed, const char* schema = kSample) {
  auto msg = new_message(schema);
  if (!msg->ParseFromString(framed.substr(1))) return std::nullopt;
  std::string out;
  pb::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  if (!pb::util::MessageToJsonString(*msg, &out, options).ok()) return std::nullopt;
  return out;
}

// The decoder against protobuf: the same verdict, and the same values.
void same_as_protobuf(const ProtobufSchema& schema, const std::string& bytes, const char* schema_text = kSample) {
  const auto reference = printed_by_protobuf(bytes, schema_text);
  if (!reference) {
    BOOST_CHECK_THROW(schema.decode(bytes), std::runtime_error);
    return;
  }
  const auto decoded = schema.decode(bytes);
  // The same values (a double prints as -2.0 where protobuf writes -2).
  BOOST_TEST(json::parse(decoded.json) == json::parse(*reference), decoded.json << "\n" << *reference);
  BOOST_TEST(json::parse(decoded.canonical()) == json::parse(canonical_json(*reference)));
  BOOST_TEST(decoded.canonical() == canonical_json(decoded.json));
}

// A random Sample as JSON, every field type at times, at its default at times.
json random_sample(std::mt19937& rng, int depth) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  auto some = [&] { return pick(3) != 0; };
  static const std::vector<std::string> texts = {"", "P-1", "中文 \"q\"\n", "😀", "a\\b"};
  static const std::vector<std::string> times = {"2026-12-06T08:10:24.120Z", "1970-01-01T00:00:00Z",
                                                 "1969-12-31T23:59:59.999999999Z", "0001-01-01T00:00:00Z"};
  // Non-negative: two merged into one must not mix signs (invalid: protobuf's
  // C++ printer still prints it, its other printers and this decoder refuse it).
  static const std::vector<std::string> waits = {"0s", "1.500s", "0.000001s", "315576000000s"};
  json j = json::object();
  if (some()) j["id"] = texts[static_cast<size_t>(pick(5))];
  if (some()) j["at"] = times[static_cast<size_t>(pick(4))];
  if (some()) j["wait"] = waits[static_cast<size_t>(pick(4))];
  if (some()) j["count"] = std::to_string(static_cast<int64_t>(rng()) * (pick(2) ? -1 : 1) * pick(3));
  if (some()) j["zero"] = pick(3) - 1;
  if (some()) {
    j["totals"] = json::object();
    for (int i = pick(4); i > 0; --i) j["totals"][texts[static_cast<size_t>(pick(5))]] = std::to_string(pick(100) - 50);
  }
  if (some()) {
    j["names"] = json::object();
    for (int i = pick(4); i > 0; --i)
      j["names"][std::to_string(pick(2000) - 1000)] = texts[static_cast<size_t>(pick(5))];
  }
  if (some()) j["colour"] = pick(2) ? "BLUE" : "RED";
  if (some()) j["blob"] = std::vector<std::string>{"", "AA==", "AAEC/w==", "3q2+7w=="}[static_cast<size_t>(pick(4))];
  if (some()) j["ratio"] = std::vector<double>{0, 0.1, -2.5, 16777216, 1e-30}[static_cast<size_t>(pick(5))];
  if (some()) j["score"] = pick(4) == 0 ? json("NaN") : json(static_cast<double>(static_cast<int32_t>(rng())) / 7.0);
  if (some()) j["extra"] = {{"z", nullptr}, {"a", {1, "x", pick(2) == 1}}};
  if (some()) {
    j["colours"] = json::array();
    for (int i = pick(4); i > 0; --i) j["colours"].push_back(pick(2) ? "BLUE" : "RED");
  }
  if (some()) j["maybe"] = pick(3) - 1;
  if (some()) j["big"] = std::to_string(static_cast<uint64_t>(rng()) << pick(33));
  if (some()) {
    j["values"] = json::array();
    for (int i = pick(4); i > 0; --i) j["values"].push_back(static_cast<double>(pick(2001) - 1000) / 8.0);
  }
  if (some()) j["flag"] = pick(2) == 1;
  if (depth < 2 && some()) {
    j["children"] = json::array();
    for (int i = pick(3); i > 0; --i) j["children"].push_back(random_sample(rng, depth + 1));
  }
  if (pick(3) == 0) {  // a oneof (two messages in a row may set both: the last read wins)
    if (pick(2))
      j["card"] = texts[static_cast<size_t>(pick(5))];
    else
      j["points"] = std::to_string(pick(1000));
  }
  return j;
}

}  // namespace

// The reflection walk against protobuf's printer, type by type: the same
// JSON, the well-known types included.
BOOST_AUTO_TEST_CASE(protobuf_json_is_protobufs_own_mapping) {
  ProtobufSchema schema(kSample, {});
  const std::vector<std::string> samples = {
      sample_bytes(
          R"({"id": "P-\"1\"\n中", "at": "2026-12-06T08:10:24.120Z", "wait": "-1.500s", "count": "42", "zero": 0,
              "totals": {"b": "2", "a": "-1"}, "names": {"10": "ten", "9": "nine"}, "colour": "BLUE",
              "blob": "AAEC/w==", "ratio": 0.1, "score": "NaN", "extra": {"z": null, "a": [1, "x", true, {"k": 2.5}]},
              "colours": ["BLUE", "RED"], "maybe": 0, "big": "18446744073709551615", "values": [1.5, 1e300, -2],
              "flag": true, "children": [{"id": "c1", "at": "1969-12-31T23:59:59.000000001Z"}, {}]})",
          "\x40\x07"s),  // colour 7: a number this schema has no name for
      sample_bytes(R"({"at": "0001-01-01T00:00:00Z", "wait": "315576000000.000001s", "score": "-Infinity"})"),
      sample_bytes(R"({"at": "9999-12-31T23:59:59.999999999Z", "wait": "0.000000001s", "ratio": 16777216})"),
      sample_bytes("{}"),
      // gift, card, gift: the card in between clears the first gift (not merged)
      sample_bytes("{}",
                   "\xb2\x01\x03\x0a\x01"
                   "a"s +
                       "\x9a\x01\x01x"s + "\xb2\x01\x02\x70\x01"s),
      "\x00\x0a\x01\xff\x0a\x01"
      "a"s,  // an id not UTF-8, then another: the parser refuses it
  };
  for (const auto& bytes : samples) same_as_protobuf(schema, bytes);
  BOOST_TEST(json::parse(schema.to_json(samples[4])) == json::parse(R"({"gift": {"maybe": 1}})"));
  // A float is its shortest text: the float protobuf's 9 digits name too.
  const auto max_float = json::parse(schema.to_json(sample_bytes(R"({"ratio": 3.4028235e38})")));
  BOOST_TEST(max_float.at("ratio").get<double>() == 3.4028235e38);
  BOOST_TEST(
      static_cast<float>(
          json::parse(*printed_by_protobuf(sample_bytes(R"({"ratio": 3.4028235e38})"))).at("ratio").get<double>()) ==
      3.4028235e38f);
}

// The parser's rules, on random messages and on what the wire allows beside
// them: two messages in a row (singular fields: the last wins; messages
// merge; repeated fields append; a oneof keeps the member read last),
// repeated scalars unpacked as well as packed, a known field in another wire
// type (kept aside by the parser), unknown fields, a string that is not
// UTF-8, bytes cut short.
BOOST_AUTO_TEST_CASE(protobuf_json_follows_the_parser_on_random_messages) {
  ProtobufSchema schema(kSample, {});
  std::mt19937 rng(45);
  const std::vector<std::string> extras = {
      "",
      "\x81\x01"s + std::string("\x00\x00\x00\x00\x00\x00\xf8\x3f", 8),  // values: 1.5, unpacked
      "\x68\x01\x68\x00"s,                                               // colours BLUE, RED, unpacked
      "\x08\x05"s,                                                       // id as a varint: not a string
      "\xf8\x3e\x07"s + "\xfa\x3e\x02hi"s,                               // unknown fields 1007
      "\x12\x02\x08\x01"s,                                               // at {seconds 1}: merges
      "\x0a\x01\xff"s,                                                   // id not UTF-8
      "\x0a\x05P-"s,                                                     // cut short
      "\x9a\x01\x01x"s + "\xa0\x01\x05"s,                                // card, then points
      "\xb2\x01\x03\x0a\x01"
      "a"s +
          "\x9a\x01\x01x"s + "\xb2\x01\x02\x70\x01"s,  // gift, card, gift: not merged
      "\x0a\x01\xff\x0a\x01"
      "a"s,  // an id not UTF-8, then another
  };
  for (int i = 0; i < 400; ++i) {
    std::string bytes = sample_bytes(random_sample(rng, 0).dump());
    if (rng() % 2) bytes += sample_bytes(random_sample(rng, 0).dump()).substr(1);
    bytes += extras[rng() % extras.size()];
    same_as_protobuf(schema, bytes);
  }
}

// proto2 against the parsed message (protobuf's printer writes no groups and
// repeats a closed enum's unnamed numbers from the unknown fields).
// What a hostile record could make costly stays linear, and still matches:
// a message field written 50,000 times (they merge), a map of 2,000 keys
// written in reverse order; an Any holding one of the schema's own messages.
BOOST_AUTO_TEST_CASE(protobuf_merges_and_big_maps_cost_what_they_weigh) {
  ProtobufSchema schema(kSample, {});
  std::string merges;
  for (int i = 0; i < 50000; ++i) merges += "\x12\x02\x08\x01"s;  // at {seconds 1}, again and again
  same_as_protobuf(schema, "\x00"s + merges);
  json names = json::object();
  for (int i = 2000; i > 0; --i) names[std::to_string(i)] = "n" + std::to_string(i);
  same_as_protobuf(schema, sample_bytes(json{{"names", names}}.dump()));
  same_as_protobuf(schema,
                   sample_bytes(R"({"any": {"@type": "type.googleapis.com/Sample", "id": "inner", "count": "7"}})"));
  BOOST_TEST(json::parse(schema.to_json(sample_bytes(R"({"any": {"@type": "type.googleapis.com/Sample", "id": "x"}})")))
                 .at("any")
                 .at("id") == "x");
}

BOOST_AUTO_TEST_CASE(protobuf_json_keeps_proto2s_rules) {
  ProtobufSchema schema(kLegacy, {});
  // id L-1, e B, es [A, B], G {x 3, tags [t]}.
  const std::string base = "\x00"s + "\x0a\x03L-1"s + "\x10\x02"s + "\x18\x01\x18\x02"s + "\x23\x28\x03\x32\x01t\x24"s;
  const json expected = json::parse(R"({"id": "L-1", "e": "B", "es": ["A", "B"], "g": {"x": 3, "tags": ["t"]}})");
  const std::vector<std::pair<std::string, json>> cases = {
      {base, expected},
      {base + "\x10\x07"s, expected},  // e = 7: unnamed, dropped (e stays B)
      {base + "\x18\x07\x18\x01"s,     // es 7 dropped, A kept
       json::parse(R"({"id": "L-1", "e": "B", "es": ["A", "B", "A"], "g": {"x": 3, "tags": ["t"]}})")},
      {base + "\x23\x28\x09\x24"s,  // another G {x 9}: merges
       json::parse(R"({"id": "L-1", "e": "B", "es": ["A", "B"], "g": {"x": 9, "tags": ["t"]}})")},
      {base + "\x38\x00"s,  // n = 0, set: printed
       json::parse(R"({"id": "L-1", "e": "B", "es": ["A", "B"], "g": {"x": 3, "tags": ["t"]}, "n": 0})")},
  };
  for (const auto& [bytes, want] : cases) BOOST_TEST(json::parse(schema.to_json(bytes)) == want, schema.to_json(bytes));
  // The required id missing: the parser refuses the message, and so does the decoder.
  BOOST_TEST(!printed_by_protobuf("\x00\x10\x01"s, kLegacy));
  BOOST_CHECK_THROW(schema.decode("\x00\x10\x01"s), std::runtime_error);
}

BOOST_AUTO_TEST_CASE(protobuf_schemas_that_do_not_parse_or_resolve_are_refused) {
  BOOST_CHECK_THROW(ProtobufSchema("syntax = \"proto3\"; message {", {}), std::runtime_error);
  BOOST_CHECK_THROW(ProtobufSchema(kProto, {}), std::runtime_error);  // acme/money.proto missing
}

namespace {

// A random JSON value: every kind, strings with escapes, control characters,
// multi-byte text and bytes that are not UTF-8, nulls as members and items.
json random_json(std::mt19937& rng, int depth) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  auto text = [&] {
    static const std::vector<std::string> pieces = {"a",    "Z",    "\"",           "\\", "\n",   "\t",
                                                    "\x01", "\x1f", "\x7f",         "é",  "中文", "😀",
                                                    "\xff", "\xc3", "\xed\xa0\x80", "/",  " "};
    std::string s;
    for (int i = pick(6); i > 0; --i) s += pieces[static_cast<size_t>(pick(static_cast<int>(pieces.size())))];
    return s;
  };
  switch (depth > 3 ? pick(6) : pick(8)) {
    case 0: return nullptr;
    case 1: return pick(2) == 1;
    case 2: return static_cast<int64_t>(rng()) - static_cast<int64_t>(rng()) * 1000003;
    case 3: return std::numeric_limits<uint64_t>::max() - rng();
    case 4: return static_cast<double>(static_cast<int32_t>(rng())) / 7.0 * std::pow(10.0, pick(40) - 20);
    case 5: return text();
    case 6: {
      json a = json::array();
      for (int i = pick(5); i > 0; --i) a.push_back(random_json(rng, depth + 1));
      return a;
    }
    default: {
      json o = json::object();
      std::set<std::string> printed;  // keys that are not UTF-8 must not become another key once replaced
      for (int i = pick(6); i > 0; --i) {
        const std::string k = text();
        if (printed.insert(json::parse(json(k).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>())
                .second)
          o[k] = random_json(rng, depth + 1);
      }
      return o;
    }
  }
}

// Walks `j` into `out` as a decoder would: members in whatever order it
// reads them (shuffled), a key sometimes written twice (the last kept).
void walk(const json& j, JsonWriter& out, std::mt19937& rng) {
  switch (j.type()) {
    case json::value_t::object: {
      std::vector<const std::string*> keys;
      for (const auto& [k, v] : j.items()) keys.push_back(&k);
      std::shuffle(keys.begin(), keys.end(), rng);
      out.begin_object();
      for (const std::string* k : keys) {
        if (rng() % 4 == 0) {
          out.key(*k);
          out.string("an earlier value");
        }
        out.key(*k);
        walk(j.at(*k), out, rng);
      }
      return out.end_object();
    }
    case json::value_t::array:
      out.begin_array();
      for (const auto& v : j) walk(v, out, rng);
      return out.end_array();
    case json::value_t::string: return out.string(j.get_ref<const std::string&>());
    case json::value_t::boolean: return out.boolean(j.get<bool>());
    case json::value_t::number_integer: return out.integer(j.get<int64_t>());
    case json::value_t::number_unsigned: return out.unsigned_integer(j.get<uint64_t>());
    case json::value_t::number_float: return out.number(j.get<double>());
    default: return out.null();
  }
}

}  // namespace

// The decoders write their JSON straight into text; it must be the text the
// rest of the host prints for the same value (nlohmann's dump), and the
// payload check's form exactly canonical_json's, or a record would change
// its hash with the path it took.
BOOST_AUTO_TEST_CASE(the_json_writer_prints_what_the_host_prints) {
  std::mt19937 rng(20261206);
  for (int i = 0; i < 3000; ++i) {
    const json doc = random_json(rng, 0);
    JsonWriter writer;
    walk(doc, writer, rng);
    const DecodedJson out = writer.finish();
    // As the document prints, read back (where a key was not UTF-8, its
    // replaced text is what sorts).
    const std::string printed = doc.dump(-1, ' ', false, json::error_handler_t::replace);
    const std::string expected = json::parse(printed).dump();
    BOOST_TEST_REQUIRE(out.json == expected);
    BOOST_TEST_REQUIRE(out.canonical() == canonical_json(expected));
  }
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
