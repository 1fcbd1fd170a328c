// What decoding costs the host per record: a 1 KB order as JSON, Avro and
// Protobuf, each taken as the engine takes it (decoded to JSON, its biz_key
// read from a field, its payload hashed: the canonical JSON the decoder
// writes beside it for a decoded value, the bytes for JSON), in the same run,
// on the CPU clock. The
// registry is not in the loop: a schema is fetched once per id per process.
//
//   format_bench [records]   (default 200000)
#include <google/protobuf/compiler/parser.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/json_util.h>
#include <time.h>

#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "core/common/util.h"
#include "core/format/avro.h"
#include "core/format/decoder.h"
#include "core/format/protobuf.h"
#include "core/pipeline/key_extractor.h"

using namespace idemsink;
namespace pb = google::protobuf;

namespace {

const char* kAvroSchema = R"({"type": "record", "name": "Order", "fields": [
  {"name": "order_id", "type": "string"},
  {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
    {"name": "id", "type": "string"}, {"name": "name", "type": "string"}, {"name": "phone", "type": "string"},
    {"name": "address", "type": "string"}]}},
  {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
    {"name": "sku", "type": "string"}, {"name": "title", "type": "string"}, {"name": "qty", "type": "long"},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}}]}}},
  {"name": "total", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
  {"name": "currency", "type": "string"},
  {"name": "created_at", "type": "long"},
  {"name": "note", "type": ["null", "string"], "default": null}]})";

const char* kProto = R"(syntax = "proto3";
message Order {
  message Customer { string id = 1; string name = 2; string phone = 3; string address = 4; }
  message Line { string sku = 1; string title = 2; int64 qty = 3; string price = 4; }
  string order_id = 1; Customer customer = 2; repeated Line lines = 3; string total = 4;
  string currency = 5; int64 created_at = 6; string note = 7;
})";

// The order's data: ids, a customer, eight lines.
nlohmann::json order() {
  nlohmann::json o = {{"order_id", "ORD-2026120600001234"},
                      {"customer",
                       {{"id", "C-88172361"},
                        {"name", "Zhang Wei"},
                        {"phone", "+86-138-0013-8000"},
                        {"address", "No. 969 Wenyi West Road, Yuhang District, Hangzhou, Zhejiang 311121"}}},
                      {"lines", nlohmann::json::array()},
                      {"total", "1234.56"},
                      {"currency", "CNY"},
                      {"created_at", 1796544000000},
                      {"note", "leave at the front desk"}};
  for (int i = 0; i < 8; ++i)
    o["lines"].push_back({{"sku", "SKU-10000" + std::to_string(i)},
                          {"title", "Stainless steel thermos, 500 ml, colour " + std::to_string(i)},
                          {"qty", i + 1},
                          {"price", "154.32"}});
  return o;
}

// Avro's binary encoding of the order, written here for the benchmark only.
struct AvroWriter {
  std::string out;
  void varlong(int64_t v) {
    uint64_t z = (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
    while (z >= 0x80) {
      out += static_cast<char>((z & 0x7f) | 0x80);
      z >>= 7;
    }
    out += static_cast<char>(z);
  }
  void str(const std::string& s) {
    varlong(static_cast<int64_t>(s.size()));
    out += s;
  }
  void decimal(const std::string& text) {  // "154.32", scale 2: two bytes hold it
    std::string digits;
    for (char c : text)
      if (c != '.') digits += c;
    const int64_t unscaled = std::stoll(digits);
    str(std::string{static_cast<char>(unscaled >> 16), static_cast<char>(unscaled >> 8), static_cast<char>(unscaled)});
  }
};

std::string avro_bytes(const nlohmann::json& o) {
  AvroWriter w;
  w.str(o["order_id"]);
  for (const char* f : {"id", "name", "phone", "address"}) w.str(o["customer"][f]);
  w.varlong(static_cast<int64_t>(o["lines"].size()));
  for (const auto& l : o["lines"]) {
    w.str(l["sku"]);
    w.str(l["title"]);
    w.varlong(l["qty"].get<int64_t>());
    w.decimal(l["price"]);
  }
  w.varlong(0);
  w.decimal(o["total"]);
  w.str(o["currency"]);
  w.varlong(o["created_at"].get<int64_t>());
  w.varlong(1);  // the note's string branch
  w.str(o["note"]);
  return w.out;
}

std::string protobuf_bytes(const nlohmann::json& o) {
  pb::FileDescriptorProto file;
  pb::io::ArrayInputStream input(kProto, static_cast<int>(std::strlen(kProto)));
  pb::io::Tokenizer tokens(&input, nullptr);
  pb::compiler::Parser parser;
  if (!parser.Parse(&tokens, &file)) throw std::runtime_error("the benchmark's .proto does not parse");
  file.set_name("order.proto");
  pb::DescriptorPool pool;
  const pb::FileDescriptor* fd = pool.BuildFile(file);
  pb::DynamicMessageFactory factory(&pool);
  std::unique_ptr<pb::Message> msg(factory.GetPrototype(fd->message_type(0))->New());
  if (!pb::util::JsonStringToMessage(o.dump(), msg.get()).ok())
    throw std::runtime_error("the order does not fit the benchmark's .proto");
  return std::string(1, '\0') + msg->SerializeAsString();  // message indexes: the short form
}

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// Microseconds of CPU per record of `take`, over `n` records.
double per_record(int n, const std::function<void()>& take) {
  for (int i = 0; i < n / 20; ++i) take();  // warm
  const double start = cpu_seconds();
  for (int i = 0; i < n; ++i) take();
  return (cpu_seconds() - start) / n * 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 200000;
  const nlohmann::json o = order();
  const std::string json = o.dump();
  const std::string avro = avro_bytes(o);
  const std::string proto = protobuf_bytes(o);
  format::AvroSchema avro_schema(kAvroSchema);
  format::ProtobufSchema proto_schema(kProto, {});
  pipeline::KeyExtractor key(config::KeySource::JsonField, "", "order_id");
  rd_kafka_message_t msg{};
  std::string sink;

  // As the engine takes a record: the biz_key from the JSON, the payload hashed.
  auto take_json = [&](const std::string& value) {
    msg.payload = const_cast<char*>(value.data());
    msg.len = value.size();
    auto k = key.extract(pipeline::RecordView::raw(&msg));
    if (!std::holds_alternative<std::string>(k)) throw std::runtime_error("no key");
    sink = payload_hash(value);
  };
  auto take_decoded = [&](const format::DecodedJson& decoded) {
    pipeline::RecordView view = pipeline::RecordView::raw(&msg);
    view.value = decoded.json;
    auto k = key.extract(view);
    if (!std::holds_alternative<std::string>(k)) throw std::runtime_error("no key");
    sink = payload_hash(decoded.canonical());
  };

  std::printf("a %zu-byte order as JSON, %zu bytes as Avro, %zu as Protobuf; %d records each\n", json.size(),
              avro.size(), proto.size(), n);
  const double json_us = per_record(n, [&] { take_json(json); });
  const double avro_us = per_record(n, [&] { take_decoded(avro_schema.decode(avro)); });
  const double proto_us = per_record(n, [&] { take_decoded(proto_schema.decode(proto)); });
  // The decoders alone, to show where the difference lies.
  const double avro_decode_us = per_record(n, [&] { sink = avro_schema.decode(avro).canonical(); });
  const double proto_decode_us = per_record(n, [&] { sink = proto_schema.decode(proto).canonical(); });
  std::printf("%-9s %8s %14s %14s\n", "format", "CPU µs", "µs over JSON", "of it decoding");
  std::printf("%-9s %8.2f %14s %14s\n", "json", json_us, "-", "-");
  std::printf("%-9s %8.2f %14.2f %14.2f\n", "avro", avro_us, avro_us - json_us, avro_decode_us);
  std::printf("%-9s %8.2f %14.2f %14.2f\n", "protobuf", proto_us, proto_us - json_us, proto_decode_us);
  return 0;
}
