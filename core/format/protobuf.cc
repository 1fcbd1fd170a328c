#include "core/format/protobuf.h"

#include <google/protobuf/compiler/parser.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/json_util.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <list>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "core/format/json_writer.h"

#include "core/common/http_fetch.h"

namespace idemsink::format {
namespace {

namespace pb = google::protobuf;

class Collect : public pb::io::ErrorCollector {
 public:
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    if (what.empty()) what = "line " + std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message;
  }
  std::string what;
};

class CollectPool : public pb::DescriptorPool::ErrorCollector {
 public:
  void AddError(const std::string& file, const std::string& element, const pb::Message*, ErrorLocation,
                const std::string& message) override {
    if (what.empty()) what = file + ": " + element + ": " + message;
  }
  std::string what;
};

// .proto text, or a FileDescriptorProto serialized and base64-encoded.
pb::FileDescriptorProto file_of(std::string_view text, const std::string& name) {
  pb::FileDescriptorProto out;
  std::string raw;
  if (text.find_first_of(" \n;{") == std::string_view::npos && base64_decode(text, raw) && out.ParseFromString(raw)) {
    out.set_name(name);
    return out;
  }
  pb::io::ArrayInputStream input(text.data(), static_cast<int>(text.size()));
  Collect errors;
  pb::io::Tokenizer tokens(&input, &errors);
  pb::compiler::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.Parse(&tokens, &out))
    throw std::runtime_error("protobuf schema " + name + " does not parse: " + errors.what);
  out.set_name(name);
  return out;
}

struct Reader {
  std::string_view b;
  size_t pos = 0;
  int64_t varint_zigzag() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= b.size()) throw std::runtime_error("ends inside its message indexes");
      const auto byte = static_cast<uint8_t>(b[pos++]);
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return static_cast<int64_t>((v >> 1) ^ (~(v & 1) + 1));
    }
    throw std::runtime_error("a message index longer than 10 bytes");
  }
};

// A fraction of a second as protobuf's JSON writes it: none, or 3, 6 or 9 digits.
std::string nanos_text(int32_t nanos) {
  if (nanos == 0) return "";
  char buf[16];
  if (nanos % 1000000 == 0)
    std::snprintf(buf, sizeof buf, ".%03d", nanos / 1000000);
  else if (nanos % 1000 == 0)
    std::snprintf(buf, sizeof buf, ".%06d", nanos / 1000);
  else
    std::snprintf(buf, sizeof buf, ".%09d", nanos);
  return buf;
}

// google.protobuf.Timestamp as RFC 3339 text in UTC, within the years 1 to 9999.
std::string timestamp_text(int64_t seconds, int32_t nanos) {
  if (seconds < -62135596800 || seconds > 253402300799 || nanos < 0 || nanos > 999999999)
    throw std::runtime_error("a Timestamp out of range (" + std::to_string(seconds) + " s, " + std::to_string(nanos) +
                             " ns)");
  using namespace std::chrono;
  const sys_seconds at{std::chrono::seconds(seconds)};
  const auto day = floor<days>(at);
  const year_month_day date{day};
  const hh_mm_ss time{at - day};
  char buf[40];
  std::snprintf(buf, sizeof buf, "%04d-%02u-%02uT%02d:%02d:%02d", static_cast<int>(date.year()),
                static_cast<unsigned>(date.month()), static_cast<unsigned>(date.day()),
                static_cast<int>(time.hours().count()), static_cast<int>(time.minutes().count()),
                static_cast<int>(time.seconds().count()));
  return buf + nanos_text(nanos) + "Z";
}

// google.protobuf.Duration as seconds with a fraction: "-1.500s".
std::string duration_text(int64_t seconds, int32_t nanos) {
  if (seconds < -315576000000 || seconds > 315576000000 || nanos < -999999999 || nanos > 999999999 ||
      (seconds > 0 && nanos < 0) || (seconds < 0 && nanos > 0))
    throw std::runtime_error("a Duration out of range (" + std::to_string(seconds) + " s, " + std::to_string(nanos) +
                             " ns)");
  const bool negative = seconds < 0 || nanos < 0;
  return (negative ? "-" : "") + std::to_string(negative ? -seconds : seconds) + nanos_text(negative ? -nanos : nanos) +
         "s";
}

// A message walked by reflection into JSON, as protobuf's JSON mapping
// prints it (docs/formats.md), without its printer's detour through the
// binary encoding and a type resolver.
class JsonWalk {
 public:
  explicit JsonWalk(JsonWriter& out) : out_(out) {}

  void message(const pb::Message& m) {
    const pb::Descriptor* d = m.GetDescriptor();
    const pb::Reflection* r = m.GetReflection();
    const std::string& type = d->full_name();
    if (type == "google.protobuf.Timestamp" || type == "google.protobuf.Duration") {
      const int64_t seconds = r->GetInt64(m, d->field(0));
      const int32_t nanos = r->GetInt32(m, d->field(1));
      return out_.string(type == "google.protobuf.Timestamp" ? timestamp_text(seconds, nanos)
                                                             : duration_text(seconds, nanos));
    }
    if (d->file()->name() == "google/protobuf/wrappers.proto") return value(m, r, d->field(0), -1);
    if (type == "google.protobuf.Struct" || type == "google.protobuf.Value" || type == "google.protobuf.ListValue" ||
        type == "google.protobuf.Any" || type == "google.protobuf.FieldMask")
      return printed(m);
    std::vector<const pb::FieldDescriptor*> fields;  // those set, or not at their default in proto3
    r->ListFields(m, &fields);
    out_.begin_object();
    for (const pb::FieldDescriptor* f : fields) {
      if (f->is_extension()) continue;  // as the printer, which knows no extension of a dynamic pool
      out_.key(f->name());
      if (f->is_map()) {
        map(m, r, f);
      } else if (f->is_repeated()) {
        out_.begin_array();
        for (int i = 0, n = r->FieldSize(m, f); i < n; ++i) value(m, r, f, i);
        out_.end_array();
      } else {
        value(m, r, f, -1);
      }
    }
    out_.end_object();
  }

 private:
  // A field's value: the singular one (index -1) or a repeated one's item.
  void value(const pb::Message& m, const pb::Reflection* r, const pb::FieldDescriptor* f, int i) {
    using C = pb::FieldDescriptor;
    const bool one = i < 0;
    switch (f->cpp_type()) {
      case C::CPPTYPE_INT32: return out_.integer(one ? r->GetInt32(m, f) : r->GetRepeatedInt32(m, f, i));
      case C::CPPTYPE_UINT32: return out_.unsigned_integer(one ? r->GetUInt32(m, f) : r->GetRepeatedUInt32(m, f, i));
      // 64-bit integers are strings, as JavaScript's numbers cannot hold them.
      case C::CPPTYPE_INT64: return out_.string(std::to_string(one ? r->GetInt64(m, f) : r->GetRepeatedInt64(m, f, i)));
      case C::CPPTYPE_UINT64:
        return out_.string(std::to_string(one ? r->GetUInt64(m, f) : r->GetRepeatedUInt64(m, f, i)));
      case C::CPPTYPE_DOUBLE: return number(one ? r->GetDouble(m, f) : r->GetRepeatedDouble(m, f, i));
      case C::CPPTYPE_FLOAT: {
        // The float's shortest text read as a double: 0.1f is 0.1, not 0.10000000149011612.
        const float v = one ? r->GetFloat(m, f) : r->GetRepeatedFloat(m, f, i);
        if (!std::isfinite(v)) return number(v);
        char buf[32];
        *std::to_chars(buf, buf + sizeof buf - 1, v).ptr = '\0';
        return number(std::strtod(buf, nullptr));
      }
      case C::CPPTYPE_BOOL: return out_.boolean(one ? r->GetBool(m, f) : r->GetRepeatedBool(m, f, i));
      case C::CPPTYPE_ENUM: {
        if (f->enum_type()->full_name() == "google.protobuf.NullValue") return out_.null();
        const int number = one ? r->GetEnumValue(m, f) : r->GetRepeatedEnumValue(m, f, i);
        const pb::EnumValueDescriptor* e = f->enum_type()->FindValueByNumber(number);
        return e ? out_.string(e->name()) : out_.integer(number);  // a value this schema does not name
      }
      case C::CPPTYPE_STRING: {
        std::string scratch;
        const std::string& s =
            one ? r->GetStringReference(m, f, &scratch) : r->GetRepeatedStringReference(m, f, i, &scratch);
        return f->type() == C::TYPE_BYTES ? out_.string(base64_encode(s)) : out_.string(s);
      }
      case C::CPPTYPE_MESSAGE: return message(one ? r->GetMessage(m, f) : r->GetRepeatedMessage(m, f, i));
    }
  }

  // A map field: an object keyed by each entry's key as text.
  void map(const pb::Message& m, const pb::Reflection* r, const pb::FieldDescriptor* f) {
    const pb::FieldDescriptor* key = f->message_type()->map_key();
    const pb::FieldDescriptor* val = f->message_type()->map_value();
    out_.begin_object();
    for (int i = 0, n = r->FieldSize(m, f); i < n; ++i) {
      const pb::Message& entry = r->GetRepeatedMessage(m, f, i);
      const pb::Reflection* er = entry.GetReflection();
      std::string& text = keys_.emplace_back();  // kept until the walk ends, as key() needs
      switch (key->cpp_type()) {
        case pb::FieldDescriptor::CPPTYPE_INT32: text = std::to_string(er->GetInt32(entry, key)); break;
        case pb::FieldDescriptor::CPPTYPE_UINT32: text = std::to_string(er->GetUInt32(entry, key)); break;
        case pb::FieldDescriptor::CPPTYPE_INT64: text = std::to_string(er->GetInt64(entry, key)); break;
        case pb::FieldDescriptor::CPPTYPE_UINT64: text = std::to_string(er->GetUInt64(entry, key)); break;
        case pb::FieldDescriptor::CPPTYPE_BOOL: text = er->GetBool(entry, key) ? "true" : "false"; break;
        default: text = er->GetString(entry, key);
      }
      out_.key(text);
      value(entry, er, val, -1);
    }
    out_.end_object();
  }

  void number(double d) {
    if (std::isfinite(d)) return out_.number(d);
    out_.string(std::isnan(d) ? "NaN" : d > 0 ? "Infinity" : "-Infinity");
  }

  // The well-known types whose JSON is its own shape (Struct, Any ...): by
  // protobuf's printer, then into the writer, so their keys sort too.
  void printed(const pb::Message& m) {
    std::string text;
    pb::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    if (auto status = pb::util::MessageToJsonString(m, &text, options); !status.ok())
      throw std::runtime_error(m.GetDescriptor()->full_name() +
                               " cannot be printed as JSON: " + std::string(status.message()));
    json(nlohmann::json::parse(text));
  }
  void json(const nlohmann::json& j) {
    switch (j.type()) {
      case nlohmann::json::value_t::object:
        out_.begin_object();
        for (const auto& [k, v] : j.items()) {
          out_.key(keys_.emplace_back(k));
          json(v);
        }
        return out_.end_object();
      case nlohmann::json::value_t::array:
        out_.begin_array();
        for (const auto& v : j) json(v);
        return out_.end_array();
      case nlohmann::json::value_t::string: return out_.string(j.get_ref<const std::string&>());
      case nlohmann::json::value_t::boolean: return out_.boolean(j.get<bool>());
      case nlohmann::json::value_t::number_integer: return out_.integer(j.get<int64_t>());
      case nlohmann::json::value_t::number_unsigned: return out_.unsigned_integer(j.get<uint64_t>());
      case nlohmann::json::value_t::number_float: return number(j.get<double>());
      default: return out_.null();
    }
  }

  JsonWriter& out_;
  std::list<std::string> keys_;  // a list: views of its strings stay valid
};

}  // namespace

struct ProtobufSchema::Impl {
  // The well-known types (google/protobuf/*.proto) come from the pool
  // libprotobuf was built with.
  pb::DescriptorPool pool{pb::DescriptorPool::generated_pool()};
  const pb::FileDescriptor* file = nullptr;
  mutable pb::DynamicMessageFactory factory{&pool};
};

ProtobufSchema::ProtobufSchema(std::string_view schema,
                               const std::vector<std::pair<std::string, std::string>>& references)
    : impl_(std::make_unique<Impl>()) {
  CollectPool errors;
  for (const auto& [name, text] : references) {
    if (impl_->pool.FindFileByName(name) != nullptr) continue;  // a well-known type, or built already
    if (impl_->pool.BuildFileCollectingErrors(file_of(text, name), &errors) == nullptr)
      throw std::runtime_error("protobuf schema: import " + name + ": " + errors.what);
  }
  impl_->file = impl_->pool.BuildFileCollectingErrors(file_of(schema, "idemsink_record.proto"), &errors);
  if (impl_->file == nullptr) throw std::runtime_error("protobuf schema: " + errors.what);
  if (impl_->file->message_type_count() == 0) throw std::runtime_error("protobuf schema: it defines no message");
}

ProtobufSchema::~ProtobufSchema() = default;

DecodedJson ProtobufSchema::decode(std::string_view bytes) const {
  // Confluent's framing: how many indexes (0: just the first message), then
  // the index of the message in the file, then in that message, and so on.
  Reader in{bytes};
  std::vector<int64_t> path;
  const int64_t count = in.varint_zigzag();
  if (count < 0 || count > 100) throw std::runtime_error("a message index count of " + std::to_string(count));
  for (int64_t i = 0; i < count; ++i) path.push_back(in.varint_zigzag());
  if (path.empty()) path.push_back(0);
  const pb::Descriptor* d = nullptr;
  for (size_t i = 0; i < path.size(); ++i) {
    const int64_t at = path[i];
    const int n = i == 0 ? impl_->file->message_type_count() : d->nested_type_count();
    if (at < 0 || at >= n) throw std::runtime_error("the schema has no message at index " + std::to_string(at));
    d = i == 0 ? impl_->file->message_type(static_cast<int>(at)) : d->nested_type(static_cast<int>(at));
  }
  std::unique_ptr<pb::Message> msg(impl_->factory.GetPrototype(d)->New());
  const auto body = bytes.substr(in.pos);
  if (!msg->ParseFromArray(body.data(), static_cast<int>(body.size())))
    throw std::runtime_error("does not parse as " + d->full_name());
  // The names the schema writes, as paths name them. A field at its default
  // (0, "", false) is left out, as proto3 cannot tell it from one never set:
  // so a record written under a later version with a field added and left
  // unset reads as the same JSON (the same payload, the same key).
  JsonWriter out(body.size());
  JsonWalk(out).message(*msg);
  return out.finish();
}

}  // namespace idemsink::format
