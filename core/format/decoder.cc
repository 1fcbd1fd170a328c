#include "core/format/decoder.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace idemsink::format {
namespace {

using Json = nlohmann::json;

void drop_nulls(Json& j) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end();) {
      if (it->is_null()) {
        it = j.erase(it);
      } else {
        drop_nulls(*it);
        ++it;
      }
    }
  } else if (j.is_array()) {
    for (auto& v : j) drop_nulls(v);
  }
}

// Deeper JSON is refused before nlohmann's recursive parts (dump, the
// null-dropping walk) see it: the engine thread's stack is not for records.
constexpr size_t kMaxJsonDepth = 128;

size_t json_depth(std::string_view json) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : json) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

Decoder::Decoder(config::Format format, Registry* registry, std::string what)
    : format_(format), registry_(registry), what_(std::move(what)) {}

std::optional<int32_t> Decoder::schema_id(std::string_view bytes) {
  if (bytes.size() < 5 || bytes[0] != 0) return std::nullopt;
  uint32_t id = 0;
  for (size_t i = 1; i < 5; ++i) id = (id << 8) | static_cast<uint8_t>(bytes[i]);
  return static_cast<int32_t>(id);
}

std::variant<DecodedJson, Undecodable, NeedsSchema> Decoder::decode(std::string_view bytes) const {
  if (!config::in_registry(format_)) return DecodedJson{std::string(bytes), canonical_json(bytes)};
  const auto id = schema_id(bytes);
  if (!id)
    return Undecodable{
        "the " + what_ + " is not in the schema registry's wire format (" + std::string(config::to_string(format_)) +
        "): " + (bytes.empty() ? "it is empty" : "its first byte is not 0, or it is shorter than 5 bytes")};
  auto schema = registry_->cached(*id);
  if (!schema) return NeedsSchema{*id};
  auto out = with(*schema, bytes.substr(5));
  if (auto* json = std::get_if<DecodedJson>(&out)) return std::move(*json);
  return std::get<Undecodable>(std::move(out));
}

std::variant<DecodedJson, Undecodable> Decoder::decode_now(std::string_view bytes) const {
  auto out = decode(bytes);
  if (auto* need = std::get_if<NeedsSchema>(&out)) return with(*registry_->fetch_now(need->id), bytes.substr(5));
  if (auto* json = std::get_if<DecodedJson>(&out)) return std::move(*json);
  return std::get<Undecodable>(std::move(out));
}

std::variant<DecodedJson, Undecodable> Decoder::with(const Schema& schema, std::string_view body) const {
  const std::string at = "the " + what_ + " (" + std::string(config::to_string(format_)) + ", schema id " +
                         std::to_string(schema.id) + ")";
  if (!schema.error.empty()) return Undecodable{at + ": " + schema.error};
  const bool fits = (format_ == config::Format::Avro && schema.avro) ||
                    (format_ == config::Format::Protobuf && schema.protobuf) ||
                    (format_ == config::Format::JsonSchema && schema.type == "JSON");
  if (!fits) return Undecodable{at + ": the registry holds a " + schema.type + " schema under that id"};
  try {
    if (schema.avro) return schema.avro->decode(body);
    if (schema.protobuf) return schema.protobuf->decode(body);
    if (json_depth(body) > kMaxJsonDepth)
      return Undecodable{at + ": nested more than " + std::to_string(kMaxJsonDepth) + " deep"};
    if (!Json::accept(body)) return Undecodable{at + ": the payload after the schema id is not JSON"};
    return DecodedJson{std::string(body), canonical_json(body)};
  } catch (const std::exception& e) {
    return Undecodable{at + " does not decode: " + e.what()};
  }
}

RecordDecoder::RecordDecoder(const config::RouteConfig& route, Registry* registry)
    : key_is_json_(route.key_format == config::Format::Json) {
  if (config::in_registry(route.value_format)) value_.emplace(route.value_format, registry, "value");
  if (config::in_registry(route.key_format)) key_.emplace(route.key_format, registry, "key");
}

bool RecordDecoder::needed(const config::RouteConfig& route) {
  return config::in_registry(route.value_format) || config::in_registry(route.key_format) ||
         route.key_format == config::Format::Json;
}

DecodedRecord RecordDecoder::decode(std::optional<std::string_view> value, std::optional<std::string_view> key) const {
  return run(value, key, false);
}

DecodedRecord RecordDecoder::decode_now(std::optional<std::string_view> value,
                                        std::optional<std::string_view> key) const {
  return run(value, key, true);
}

DecodedRecord RecordDecoder::run(std::optional<std::string_view> value, std::optional<std::string_view> key,
                                 bool wait) const {
  DecodedRecord d;
  // One side: its JSON, or why not, or the schema it waits for (false).
  auto side = [&](const Decoder& decoder, std::string_view bytes, std::optional<std::string>& json,
                  std::optional<std::string>* canonical) {
    std::variant<DecodedJson, Undecodable, NeedsSchema> out;
    if (!wait) {
      out = decoder.decode(bytes);
    } else if (auto now = decoder.decode_now(bytes); auto* json = std::get_if<DecodedJson>(&now)) {
      out = std::move(*json);
    } else {
      out = std::get<Undecodable>(std::move(now));
    }
    if (auto* need = std::get_if<NeedsSchema>(&out)) {
      d.registry = decoder.registry();
      d.schema_id = need->id;
      return false;
    }
    if (auto* bad = std::get_if<Undecodable>(&out)) {
      if (!d.undecodable) d.undecodable = std::move(bad->why);
    } else {
      auto& decoded = std::get<DecodedJson>(out);
      json = std::move(decoded.json);
      if (canonical) *canonical = std::move(decoded.differing_canonical);
    }
    return true;
  };
  if (value_ && !side(*value_, value.value_or(std::string_view()), d.value_json, &d.value_canonical)) return d;
  if (!key) return d;
  if (key_) {
    if (!side(*key_, *key, d.key_json, nullptr)) return d;
  } else if (key_is_json_) {
    d.key_json = std::string(*key);
  }
  if (!d.key_json) return d;
  d.key_text = key_text(*d.key_json);
  if (!d.key_text && !d.undecodable)
    d.undecodable = "the key is not JSON, or nested more than 128 deep (route.key_format.format)";
  return d;
}

std::optional<std::string> key_text(std::string_view json) {
  if (json_depth(json) > kMaxJsonDepth) return std::nullopt;
  auto j = Json::parse(json, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  if (j.is_string()) return j.get<std::string>();
  // A number as written (nlohmann would print 1.50 as 1.5).
  if (j.is_number()) {
    const auto first = json.find_first_not_of(" \t\r\n"), last = json.find_last_not_of(" \t\r\n");
    return std::string(json.substr(first, last - first + 1));
  }
  // A key written under a later schema version with an optional field left
  // null is the same key: the same claim.
  drop_nulls(j);
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string canonical_json(std::string_view json) {
  if (json_depth(json) > kMaxJsonDepth) return std::string(json);
  auto j = Json::parse(json, nullptr, false);
  if (j.is_discarded()) return std::string(json);
  drop_nulls(j);
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);  // nlohmann's objects keep their keys sorted
}

}  // namespace idemsink::format
