#include "core/format/avro.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "core/common/http_fetch.h"

namespace idemsink::format {

struct AvroSchema::Type {
  enum class Kind { Null, Boolean, Int, Long, Float, Double, Bytes, String, Record, Enum, Array, Map, Union, Fixed };
  Kind kind = Kind::Null;
  std::string name;  // full name of a named type; the primitive's name otherwise
  bool decimal = false;
  int scale = 0;
  size_t size = 0;                                          // fixed
  std::vector<std::pair<std::string, const Type*>> fields;  // record
  std::vector<std::string> printed_names;                   // record: its fields' keys as printed
  std::vector<std::string> symbols;                         // enum
  const Type* items = nullptr;                              // array items, map values
  std::vector<const Type*> branches;                        // union
  size_t non_null_branches = 0;                             // union
};

namespace {

using Json = nlohmann::json;
using Kind = AvroSchema::Type::Kind;

[[noreturn]] void bad_schema(const std::string& why) { throw std::runtime_error("Avro schema: " + why); }

const std::map<std::string, Kind>& primitives() {
  static const std::map<std::string, Kind> k{
      {"null", Kind::Null},   {"boolean", Kind::Boolean}, {"int", Kind::Int},     {"long", Kind::Long},
      {"float", Kind::Float}, {"double", Kind::Double},   {"bytes", Kind::Bytes}, {"string", Kind::String}};
  return k;
}

std::string full_name(const Json& j, const std::string& ns) {
  const std::string name = j.at("name").get<std::string>();
  if (name.find('.') != std::string::npos) return name;
  const std::string own =
      j.contains("namespace") && j["namespace"].is_string() ? j["namespace"].get<std::string>() : ns;
  return own.empty() ? name : own + "." + name;
}

std::string space_of(const std::string& full) {
  const auto dot = full.rfind('.');
  return dot == std::string::npos ? "" : full.substr(0, dot);
}

// Reads the encoding from front to back; every read checks what is left.
class Reader {
 public:
  // A record decodes to at most a few values per byte (plus a margin for
  // empty records and nulls, which take none): beyond that the schema and
  // the bytes conspire to blow the output up (zero-width array items, a
  // named type used twice at every level), and the record is refused.
  explicit Reader(std::string_view b) : b_(b), budget_(8 * b.size() + 1024) {}
  void count_value() {
    if (budget_-- == 0) throw std::runtime_error("decodes to more values than its size allows");
  }
  bool done() const { return pos_ == b_.size(); }
  size_t left() const { return b_.size() - pos_; }

  int64_t varlong() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= b_.size()) throw std::runtime_error("ends inside a number");
      const auto byte = static_cast<uint8_t>(b_[pos_++]);
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return static_cast<int64_t>((v >> 1) ^ (~(v & 1) + 1));  // zigzag
    }
    throw std::runtime_error("a number longer than 10 bytes");
  }
  std::string_view take(size_t n) {
    if (n > left()) throw std::runtime_error("ends inside a value (" + std::to_string(n) + " bytes announced)");
    auto out = b_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  std::string_view sized() {
    const int64_t n = varlong();
    if (n < 0) throw std::runtime_error("a negative length");
    return take(static_cast<size_t>(n));
  }
  template <class T>
  T fixed_le() {
    auto raw = take(sizeof(T));
    T v;
    std::memcpy(&v, raw.data(), sizeof(T));  // Avro is little-endian, as are the machines we build for
    return v;
  }

 private:
  std::string_view b_;
  size_t pos_ = 0;
  size_t budget_;
};

// A decimal's unscaled value (big-endian two's complement) as decimal text
// with its scale: exact, whatever its size, as money needs.
std::string decimal_text(std::string_view be, int scale) {
  if (be.empty()) return "0";
  const bool negative = static_cast<uint8_t>(be[0]) & 0x80;
  std::string digits;    // of the magnitude, most significant first
  if (be.size() <= 8) {  // an amount in one machine word: the usual case, without division by hand
    uint64_t v = negative ? ~uint64_t{0} : 0;  // sign-extended
    for (char c : be) v = (v << 8) | static_cast<uint8_t>(c);
    char buf[24];
    digits.assign(buf, std::to_chars(buf, buf + sizeof buf, negative ? ~v + 1 : v).ptr);
  } else {
    std::vector<uint8_t> mag(be.begin(), be.end());
    if (negative) {  // two's complement: invert and add one
      for (auto& b : mag) b = static_cast<uint8_t>(~b);
      for (size_t i = mag.size(); i-- > 0;)
        if (++mag[i] != 0) break;
    }
    for (bool any = true; any;) {  // repeated division by ten, least significant first
      any = false;
      unsigned rem = 0;
      for (auto& b : mag) {
        const unsigned cur = (rem << 8) | b;
        b = static_cast<uint8_t>(cur / 10);
        rem = cur % 10;
        any = any || b != 0;
      }
      digits += static_cast<char>('0' + rem);
    }
    std::reverse(digits.begin(), digits.end());
  }
  if (digits.size() <= static_cast<size_t>(scale))
    digits.insert(0, static_cast<size_t>(scale) + 1 - digits.size(), '0');
  if (scale > 0) digits.insert(digits.size() - static_cast<size_t>(scale), ".");
  return negative ? "-" + digits : digits;
}

void number(JsonWriter& out, double d) {
  if (std::isfinite(d)) return out.number(d);
  out.string(std::isnan(d) ? "NaN" : d > 0 ? "Infinity" : "-Infinity");  // as JSON cannot hold them
}

void decode_value(const AvroSchema::Type& t, Reader& in, JsonWriter& out, int depth);

// An array's items or a map's entries, in blocks: each a count (negative:
// followed by the block's size in bytes), up to a count of zero.
void decode_blocks(const AvroSchema::Type& t, Reader& in, JsonWriter& out, int depth) {
  t.kind == Kind::Array ? out.begin_array() : out.begin_object();
  for (int64_t n = in.varlong(); n != 0; n = in.varlong()) {
    if (n < 0) {  // a block with its size in bytes after the count
      if (n == std::numeric_limits<int64_t>::min()) throw std::runtime_error("a block count out of range");
      n = -n;
      in.varlong();
    }
    if (static_cast<uint64_t>(n) > in.left()) throw std::runtime_error("a block of more items than bytes left");
    for (int64_t i = 0; i < n; ++i) {
      if (t.kind == Kind::Map) out.key(in.sized());  // a view of the record's bytes, as key() needs
      decode_value(*t.items, in, out, depth + 1);
    }
  }
  return t.kind == Kind::Array ? out.end_array() : out.end_object();
}

// The branch the union's index names.
void decode_union(const AvroSchema::Type& t, Reader& in, JsonWriter& out, int depth) {
  const int64_t i = in.varlong();
  if (i < 0 || static_cast<size_t>(i) >= t.branches.size())
    throw std::runtime_error("union has no branch " + std::to_string(i));
  const auto& branch = *t.branches[static_cast<size_t>(i)];
  // An optional value ([null, T]) is the value or null; a union of more
  // types says which, as Avro's JSON encoding does: {"type": value}.
  if (branch.kind == Kind::Null || t.non_null_branches <= 1) return decode_value(branch, in, out, depth + 1);
  out.begin_object();
  out.key(branch.name);
  decode_value(branch, in, out, depth + 1);
  return out.end_object();
}

void decode_value(const AvroSchema::Type& t, Reader& in, JsonWriter& out, int depth) {
  if (depth > 200) throw std::runtime_error("nested more than 200 deep");
  in.count_value();
  switch (t.kind) {
    case Kind::Null: return out.null();
    case Kind::Boolean: {
      const auto b = in.take(1)[0];
      if (b != 0 && b != 1) throw std::runtime_error("a boolean that is neither 0 nor 1");
      return out.boolean(b == 1);
    }
    case Kind::Int:
    case Kind::Long: return out.integer(in.varlong());
    case Kind::Float: return number(out, in.fixed_le<float>());
    case Kind::Double: return number(out, in.fixed_le<double>());
    case Kind::String: return out.string(in.sized());
    case Kind::Bytes:
    case Kind::Fixed: {
      const auto raw = t.kind == Kind::Bytes ? in.sized() : in.take(t.size);
      // 64 bytes hold 150 digits; the text conversion is quadratic in them.
      if (t.decimal && raw.size() > 64)
        throw std::runtime_error("a decimal of " + std::to_string(raw.size()) + " bytes (at most 64)");
      return out.string(t.decimal ? decimal_text(raw, t.scale) : base64_encode(raw));
    }
    case Kind::Record: {
      out.begin_object();
      for (size_t i = 0; i < t.fields.size(); ++i) {
        out.key(t.fields[i].first, t.printed_names[i]);
        decode_value(*t.fields[i].second, in, out, depth + 1);
      }
      return out.end_object();
    }
    case Kind::Enum: {
      const int64_t i = in.varlong();
      if (i < 0 || static_cast<size_t>(i) >= t.symbols.size())
        throw std::runtime_error("enum " + t.name + " has no symbol " + std::to_string(i));
      return out.string(t.symbols[static_cast<size_t>(i)]);
    }
    case Kind::Array:
    case Kind::Map: return decode_blocks(t, in, out, depth);
    case Kind::Union: return decode_union(t, in, out, depth);
  }
  throw std::logic_error("unknown Avro kind");
}

}  // namespace

AvroSchema::AvroSchema(std::string_view schema, const std::vector<std::string>& references) {
  try {
    for (const auto& ref : references) {
      const Json r = Json::parse(ref);
      parse(&r, "", 0);
    }
    const Json doc = Json::parse(schema);
    root_ = parse(&doc, "", 0);
  } catch (const Json::exception& e) {
    bad_schema(e.what());
  }
}

AvroSchema::~AvroSchema() = default;

const AvroSchema::Type* AvroSchema::named(const std::string& name, const std::string& ns) const {
  // A simple name is in the enclosing namespace first, as the spec reads.
  if (name.find('.') == std::string::npos && !ns.empty())
    if (auto it = names_.find(ns + "." + name); it != names_.end()) return it->second;
  if (auto it = names_.find(name); it != names_.end()) return it->second;
  bad_schema("unknown type \"" + name + "\" (not defined before its use, nor in a referenced schema)");
}

// A record (or error), an enum or a fixed: named, so that later types may
// use it by its name.
void AvroSchema::define_named(Type& t, const void* node, const std::string& kind, const std::string& ns, int depth) {
  const Json& j = *static_cast<const Json*>(node);
  t.name = full_name(j, ns);
  names_[t.name] = &t;  // before the fields: a record may hold itself
  if (kind == "enum") {
    t.kind = Kind::Enum;
    t.symbols = j.at("symbols").get<std::vector<std::string>>();
  } else if (kind == "fixed") {
    t.kind = Kind::Fixed;
    t.size = j.at("size").get<size_t>();
  } else {
    t.kind = Kind::Record;
    for (const auto& f : j.at("fields")) {
      t.fields.emplace_back(f.at("name").get<std::string>(), parse(&f.at("type"), space_of(t.name), depth + 1));
      if (!valid_utf8(t.fields.back().first)) bad_schema("a field name that is not UTF-8");
      t.printed_names.push_back(printed_key(t.fields.back().first));
    }
  }
}

const AvroSchema::Type* AvroSchema::parse(const void* node, const std::string& ns, int depth) {
  if (depth > 200) bad_schema("nested more than 200 deep");
  const Json& j = *static_cast<const Json*>(node);
  if (j.is_string()) {
    const std::string name = j.get<std::string>();
    if (auto p = primitives().find(name); p != primitives().end()) {
      Type& t = *types_.emplace_back(std::make_unique<Type>());
      t.kind = p->second;
      t.name = name;
      return &t;
    }
    return named(name, ns);
  }
  if (j.is_array()) {
    Type& t = *types_.emplace_back(std::make_unique<Type>());
    t.kind = Kind::Union;
    t.name = "union";
    for (const auto& b : j) t.branches.push_back(parse(&b, ns, depth + 1));
    if (t.branches.empty()) bad_schema("an empty union");
    for (const auto* b : t.branches) t.non_null_branches += b->kind != Kind::Null;
    return &t;
  }
  if (!j.is_object() || !j.contains("type")) bad_schema("a type must be a name, a union or an object with \"type\"");
  const Json& type = j["type"];
  if (!type.is_string()) return parse(&type, ns, depth + 1);  // {"type": {...}} or {"type": [...]}
  const std::string kind = type.get<std::string>();
  Type& t = *types_.emplace_back(std::make_unique<Type>());
  t.name = kind;
  const std::string logical =
      j.contains("logicalType") && j["logicalType"].is_string() ? j["logicalType"].get<std::string>() : "";
  if (auto p = primitives().find(kind); p != primitives().end()) {
    t.kind = p->second;
  } else if (kind == "record" || kind == "error" || kind == "enum" || kind == "fixed") {
    define_named(t, &j, kind, ns, depth);
  } else if (kind == "array") {
    t.kind = Kind::Array;
    t.items = parse(&j.at("items"), ns, depth + 1);
  } else if (kind == "map") {
    t.kind = Kind::Map;
    t.items = parse(&j.at("values"), ns, depth + 1);
  } else {
    types_.pop_back();
    return named(kind, ns);
  }
  if (logical == "decimal" && (t.kind == Kind::Bytes || t.kind == Kind::Fixed)) {
    t.decimal = true;
    t.scale = j.contains("scale") ? j["scale"].get<int>() : 0;
    if (t.scale < 0 || t.scale > 1000) bad_schema("decimal scale " + std::to_string(t.scale));
  }
  return &t;
}

DecodedJson AvroSchema::decode(std::string_view bytes) const {
  Reader in(bytes);
  JsonWriter out(bytes.size());
  decode_value(*root_, in, out, 0);
  if (!in.done()) throw std::runtime_error(std::to_string(in.left()) + " bytes left after the record");
  return out.finish();
}

}  // namespace idemsink::format
