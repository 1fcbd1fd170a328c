// One record's protobuf value decoded into the JSON protobuf's own writer
// prints, by the plans protobuf_json.cc made: the wire format read field by
// field, well-known types written as protobuf writes them.
#include "core/format/protobuf_json.h"
#include "core/format/protobuf_plan.h"
#include "core/format/protobuf_wire.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <list>
#include <nlohmann/json.hpp>
#include <span>
#include <stdexcept>
#include <vector>

#include "core/common/http_fetch.h"

namespace idemsink::format {

namespace pb = google::protobuf;
using FD = pb::FieldDescriptor;
using namespace wire;

namespace {

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

}  // namespace

// One record's decoding: the fields of the messages being read, the text
// that must outlive the writer's keys.
class ProtobufJson::Decode {
 public:
  Decode(const ProtobufJson& self, JsonWriter& out) : self_(self), out_(out) {}

  // A message's encoding may come in parts: the occurrences of a field that
  // merge into one message, read as if written in a row.
  using Bodies = std::span<const std::string_view>;

  void message(const Plan& p, Bodies bodies, int depth) {
    if (depth > kMaxDepth) throw std::runtime_error("nested more than " + std::to_string(kMaxDepth) + " deep");
    switch (p.kind) {
      case Plan::Kind::Timestamp:
      case Plan::Kind::Duration: {
        const size_t base = scan(p, bodies, depth);
        uint64_t seconds = 0, nanos = 0;
        for (size_t k = base; k < seen_.size(); ++k) (seen_[k].f->f->number() == 1 ? seconds : nanos) = seen_[k].value;
        seen_.resize(base);
        const auto s = static_cast<int64_t>(seconds);
        const auto n = static_cast<int32_t>(low32(nanos));
        return out_.string(p.kind == Plan::Kind::Timestamp ? timestamp_text(s, n) : duration_text(s, n));
      }
      case Plan::Kind::Wrapper: {  // its value, even at its default
        const size_t base = scan(p, bodies, depth);
        const Seen last = seen_.size() > base ? seen_.back() : Seen{&p.fields.front(), 0, {}};
        seen_.resize(base);
        return scalar(*last.f, last.value, last.span);
      }
      case Plan::Kind::Printed: return printed(p, bodies);
      case Plan::Kind::Message: break;
    }
    const size_t base = scan(p, bodies, depth), end = seen_.size();
    // A oneof holds the member set last, from where it was set: another
    // member in between clears it (a proto2 enum's unnamed number sets none).
    std::vector<const Plan::Field*> winner(static_cast<size_t>(p.oneofs), nullptr);
    std::vector<size_t> since(static_cast<size_t>(p.oneofs), base);
    for (size_t k = base; k < end; ++k) {
      const Plan::Field* f = seen_[k].f;
      if (f->oneof < 0 || !names_value(*f, seen_[k].value)) continue;
      const auto o = static_cast<size_t>(f->oneof);
      if (winner[o] != f) {
        winner[o] = f;
        since[o] = k;
      }
    }
    out_.begin_object();
    for (const Plan::Field& f : p.fields) {
      if (f.oneof >= 0 && winner[static_cast<size_t>(f.oneof)] != &f) continue;
      if (f.f->is_map()) {
        map(f, base, end, depth);
      } else if (f.f->is_repeated()) {
        repeated(f, base, end, depth);
      } else {
        singular(f, f.oneof >= 0 ? since[static_cast<size_t>(f.oneof)] : base, end, depth);
      }
    }
    out_.end_object();
    seen_.resize(base);
  }

 private:
  struct Seen {
    const Plan::Field* f;
    uint64_t value;         // varint and fixed wire types
    std::string_view span;  // length-delimited and groups
    bool packed = false;    // a repeated scalar's items in `span`
  };

  // The message's fields as read, appended to seen_ (from the index it
  // returns); unknown fields and those with a wire type their type cannot
  // have are passed over, as the parser keeps them aside.
  size_t scan(const Plan& p, Bodies bodies, int depth) {
    const size_t base = seen_.size();
    for (std::string_view body : bodies) scan_part(p, body, depth);
    if (p.any_required)
      for (const auto& f : p.fields)
        if (f.f->is_required() && std::none_of(seen_.begin() + static_cast<long>(base), seen_.end(),
                                               [&](const Seen& s) { return s.f == &f && names_value(f, s.value); }))
          throw std::runtime_error(p.d->full_name() + " lacks its required field " + f.f->name());
    return base;
  }

  void scan_part(const Plan& p, std::string_view body, int depth) {
    Wire in{body};
    while (!in.done()) {
      const uint64_t tag = in.varint();
      const int wire = static_cast<int>(tag & 7);
      const uint64_t number = tag >> 3;
      if (number == 0 || number > 536870911) throw std::runtime_error("a field number out of range");
      size_t index = 0;
      const Plan::Field* f = p.find(number, index);
      if (!f || !fits(*f->f, wire)) {
        in.skip(wire, number, depth);
        continue;
      }
      Seen s{f, 0, {}};
      switch (wire) {
        case 0: s.value = in.varint(); break;
        case 1: s.value = in.fixed(8); break;
        case 5: s.value = in.fixed(4); break;
        case 2:
          s.span = in.take(in.varint());
          s.packed = f->f->cpp_type() != FD::CPPTYPE_STRING && f->f->cpp_type() != FD::CPPTYPE_MESSAGE;
          // Every occurrence, as the parser checks each: also one a later one overwrites.
          if (f->f->type() == FD::TYPE_STRING) check_utf8(*f->f, s.span);
          break;
        case 3: s.span = in.group(number, depth + 1); break;
      }
      seen_.push_back(s);
    }
  }

  static bool fits(const FD& f, int wire) {
    const FD::Type t = f.type();
    if (t == FD::TYPE_GROUP) return wire == 3;
    if (t == FD::TYPE_MESSAGE || t == FD::TYPE_STRING || t == FD::TYPE_BYTES) return wire == 2;
    if (wire == 2) return f.is_repeated();  // packed
    if (varint_type(t)) return wire == 0;
    if (fixed32_type(t)) return wire == 5;
    return fixed64_type(t) && wire == 1;
  }

  bool names_value(const Plan::Field& f, uint64_t v) const {
    return !f.closed_enum || f.f->enum_type()->FindValueByNumber(static_cast<int32_t>(low32(v))) != nullptr;
  }

  void singular(const Plan::Field& f, size_t base, size_t end, int depth) {
    if (f.message) {  // every occurrence merges into one message: read in a row, never copied
      Parts parts;
      for (size_t k = base; k < end; ++k)
        if (seen_[k].f == &f) parts.add(seen_[k].span);
      if (parts.empty()) return;
      out_.key(f.f->name(), f.printed);
      return message(*f.message, parts.bodies(), depth + 1);
    }
    const Seen* last = nullptr;  // the last wins; a proto2 enum's unnamed number is not a value
    for (size_t k = base; k < end; ++k)
      if (seen_[k].f == &f && names_value(f, seen_[k].value)) last = &seen_[k];
    if (!last) return;
    const Seen s = *last;
    if (!f.f->has_presence() &&
        (f.f->cpp_type() == FD::CPPTYPE_STRING ? s.span.empty() : is_zero(f.f->type(), s.value)))
      return;
    out_.key(f.f->name(), f.printed);
    scalar(f, s.value, s.span);
  }

  void repeated(const Plan::Field& f, size_t base, size_t end, int depth) {
    if (f.message || f.f->cpp_type() == FD::CPPTYPE_STRING) {
      bool any = false;
      for (size_t k = base; k < end; ++k) {
        if (seen_[k].f != &f) continue;
        if (!any) {
          out_.key(f.f->name(), f.printed);
          out_.begin_array();
          any = true;
        }
        const std::string_view span = seen_[k].span;
        f.message ? message(*f.message, Bodies(&span, 1), depth + 1) : scalar(f, 0, span);
      }
      if (any) out_.end_array();
      return;
    }
    std::vector<uint64_t> items;  // packed and unpacked alike, in order
    for (size_t k = base; k < end; ++k) {
      const Seen& s = seen_[k];
      if (s.f != &f) continue;
      if (!s.packed) {
        if (names_value(f, s.value)) items.push_back(s.value);
        continue;
      }
      Wire in{s.span};
      while (!in.done()) {
        const FD::Type t = f.f->type();
        const uint64_t v = varint_type(t) ? in.varint() : in.fixed(fixed32_type(t) ? 4 : 8);
        if (names_value(f, v)) items.push_back(v);
      }
    }
    if (items.empty()) return;
    out_.key(f.f->name(), f.printed);
    out_.begin_array();
    for (uint64_t v : items) scalar(f, v, {});
    out_.end_array();
  }

  // A map: an object keyed by each entry's key as text, the last entry of a key kept.
  void map(const Plan::Field& f, size_t base, size_t end, int depth) {
    const Plan& entry = *f.message;
    const Plan::Field* key_field = nullptr;
    const Plan::Field* value_field = nullptr;
    for (const auto& e : entry.fields) (e.f->number() == 1 ? key_field : value_field) = &e;
    bool any = false;
    for (size_t k = base; k < end; ++k) {
      if (seen_[k].f != &f) continue;
      if (!any) {
        out_.key(f.f->name(), f.printed);
        out_.begin_object();
        any = true;
      }
      const std::string_view entry_body = seen_[k].span;
      const size_t inner = scan(entry, Bodies(&entry_body, 1), depth + 1);
      Seen key{key_field, 0, {}}, value{value_field, 0, {}};
      Parts value_parts;
      for (size_t i = inner; i < seen_.size(); ++i) {
        if (seen_[i].f == key_field) key = seen_[i];
        if (seen_[i].f != value_field) continue;
        if (value_field->message) {
          value_parts.add(seen_[i].span);
        } else if (names_value(*value_field, seen_[i].value)) {
          value = seen_[i];
        }
      }
      seen_.resize(inner);
      out_.key(key_text(*key_field->f, key.value, key.span));
      value_field->message ? message(*value_field->message, value_parts.bodies(), depth + 2)
                           : scalar(*value_field, value.value, value.span);
    }
    if (any) out_.end_object();
  }

  std::string_view key_text(const FD& f, uint64_t v, std::string_view span) {
    switch (f.type()) {
      case FD::TYPE_STRING: return span;  // checked as it was read
      case FD::TYPE_BOOL: return v != 0 ? "true" : "false";
      case FD::TYPE_INT32:
      case FD::TYPE_SFIXED32: return kept(std::to_string(static_cast<int32_t>(low32(v))));
      case FD::TYPE_SINT32: return kept(std::to_string(zigzag32(low32(v))));
      case FD::TYPE_UINT32:
      case FD::TYPE_FIXED32: return kept(std::to_string(low32(v)));
      case FD::TYPE_SINT64: return kept(std::to_string(zigzag64(v)));
      case FD::TYPE_INT64:
      case FD::TYPE_SFIXED64: return kept(std::to_string(static_cast<int64_t>(v)));
      default: return kept(std::to_string(v));
    }
  }

  void scalar(const Plan::Field& field, uint64_t v, std::string_view span) {
    const FD& f = *field.f;
    switch (f.type()) {
      case FD::TYPE_INT32:
      case FD::TYPE_SFIXED32: return out_.integer(static_cast<int32_t>(low32(v)));
      case FD::TYPE_SINT32: return out_.integer(zigzag32(low32(v)));
      case FD::TYPE_UINT32:
      case FD::TYPE_FIXED32: return out_.unsigned_integer(low32(v));
      // 64-bit integers are strings, as JavaScript's numbers cannot hold them.
      case FD::TYPE_INT64:
      case FD::TYPE_SFIXED64: return out_.string(std::to_string(static_cast<int64_t>(v)));
      case FD::TYPE_SINT64: return out_.string(std::to_string(zigzag64(v)));
      case FD::TYPE_UINT64:
      case FD::TYPE_FIXED64: return out_.string(std::to_string(v));
      case FD::TYPE_BOOL: return out_.boolean(v != 0);
      case FD::TYPE_DOUBLE: {
        double d;
        std::memcpy(&d, &v, sizeof d);
        return number(d);
      }
      case FD::TYPE_FLOAT: {
        // The float's shortest text read as a double: 0.1f is 0.1, not 0.10000000149011612.
        const uint32_t bits = low32(v);
        float x;
        std::memcpy(&x, &bits, sizeof x);
        if (!std::isfinite(x)) return number(x);
        char buf[32];
        *std::to_chars(buf, buf + sizeof buf - 1, x).ptr = '\0';
        return number(std::strtod(buf, nullptr));
      }
      case FD::TYPE_ENUM: {
        if (f.enum_type()->full_name() == "google.protobuf.NullValue") return out_.null();
        const auto n = static_cast<int32_t>(low32(v));
        const pb::EnumValueDescriptor* e = f.enum_type()->FindValueByNumber(n);
        return e ? out_.string(e->name()) : out_.integer(n);  // a number this schema does not name
      }
      case FD::TYPE_STRING: return out_.string(span);  // checked as it was read
      case FD::TYPE_BYTES: return out_.string(base64_encode(span));
      default: throw std::logic_error("protobuf: a scalar of type " + std::string(f.type_name()));
    }
  }

  void number(double d) {
    if (std::isfinite(d)) return out_.number(d);
    out_.string(std::isnan(d) ? "NaN" : d > 0 ? "Infinity" : "-Infinity");
  }

  // proto3's strings are UTF-8: the parser refuses a message with one that is not.
  static void check_utf8(const FD& f, std::string_view s) {
    if (f.file()->syntax() == pb::FileDescriptor::SYNTAX_PROTO3 && !valid_utf8(s))
      throw std::runtime_error("the string field " + f.full_name() + " is not UTF-8");
  }

  std::string_view kept(std::string text) { return kept_.emplace_back(std::move(text)); }

  // The encodings a message is merged from: most often one, held without
  // an allocation.
  class Parts {
   public:
    void add(std::string_view part) {
      if (count_++ == 0) {
        first_ = part;
        return;
      }
      if (more_.empty()) more_.push_back(first_);
      more_.push_back(part);
    }
    bool empty() const { return count_ == 0; }
    Bodies bodies() const { return count_ <= 1 ? Bodies(&first_, count_) : Bodies(more_); }

   private:
    size_t count_ = 0;
    std::string_view first_;
    std::vector<std::string_view> more_;
  };

  // Struct, Value, ListValue, Any and FieldMask: printed by protobuf with a
  // type resolver over the schema's own pool (an Any may hold one of its
  // messages), then into the writer, so their keys sort too.
  void printed(const Plan& p, Bodies bodies) {
    std::string binary;
    for (std::string_view part : bodies) binary += part;
    std::string text;
    pb::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    if (auto status = pb::util::BinaryToJsonString(self_.resolver_.get(), "type.googleapis.com/" + p.d->full_name(),
                                                   binary, &text, options);
        !status.ok())
      throw std::runtime_error(p.d->full_name() + " cannot be printed as JSON: " + std::string(status.message()));
    json(nlohmann::json::parse(text));
  }
  void json(const nlohmann::json& j) {
    switch (j.type()) {
      case nlohmann::json::value_t::object:
        out_.begin_object();
        for (const auto& [k, v] : j.items()) {
          out_.key(kept(k));
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

  const ProtobufJson& self_;
  JsonWriter& out_;
  std::vector<Seen> seen_;       // the fields of the messages being read, innermost last
  std::list<std::string> kept_;  // a list: views of its strings stay valid
};

DecodedJson ProtobufJson::decode(const pb::Descriptor* d, std::string_view bytes) const {
  auto it = plans_.find(d);
  if (it == plans_.end()) throw std::logic_error("protobuf: no plan for " + d->full_name());
  JsonWriter out(bytes.size());
  Decode(*this, out).message(*it->second, std::span(&bytes, 1), 0);
  return out.finish();
}

}  // namespace idemsink::format
