// A route's value (or key) decoded from the format its config names into the
// JSON the rest of the host reads (docs/formats.md). Registry formats carry
// Confluent's framing: a zero byte, the schema's id (4 bytes, big-endian),
// then the record encoded under that schema.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "core/config/config.h"
#include "core/format/json_writer.h"
#include "core/format/registry.h"

namespace idemsink::format {

/// The bytes do not decode: the record is dead-lettered (undecodable_value).
struct Undecodable {
  std::string why;  // names the schema id where there is one
};
/// The schema is not fetched yet: the record waits for it.
struct NeedsSchema {
  int32_t id;
};

class Decoder {
 public:
  /// `registry`: required for a registry format, unused otherwise.
  Decoder(config::Format format, Registry* registry, std::string what);

  /// The JSON, on the engine thread: never waits (NeedsSchema instead).
  std::variant<DecodedJson, Undecodable, NeedsSchema> decode(std::string_view bytes) const;
  /// The same, fetching a missing schema on the calling thread (offline
  /// commands); throws when the registry cannot be reached.
  std::variant<DecodedJson, Undecodable> decode_now(std::string_view bytes) const;

  Registry* registry() const { return registry_; }
  /// The schema id the bytes name, when they carry Confluent's framing.
  static std::optional<int32_t> schema_id(std::string_view bytes);

 private:
  std::variant<DecodedJson, Undecodable> with(const Schema& schema, std::string_view body) const;

  config::Format format_;
  Registry* registry_;
  std::string what_;  // "value" or "key", for messages
};

/// A record's value and key as its route reads them: decoded (JSON), not
/// decodable (why), or waiting for a schema.
struct DecodedRecord {
  std::optional<std::string> value_json;       // none: the value is read as written
  std::optional<std::string> value_canonical;  // the payload check's form, where it is not value_json
  std::optional<std::string> key_json;         // none: the key is read as written
  std::optional<std::string> key_text;         // the key as the biz_key and [route.when] read it
  std::optional<std::string> undecodable;
  Registry* registry = nullptr;  // set: schema `schema_id` is not fetched yet
  int32_t schema_id = 0;
};

/// A route's [route.value] and [route.key_format] applied to its records.
class RecordDecoder {
 public:
  /// `registry`: the route's, when a format of it is in one.
  RecordDecoder(const config::RouteConfig& route, Registry* registry);
  /// Whether the route's records need it at all (else they are read as written).
  static bool needed(const config::RouteConfig& route);

  /// On the engine thread: never waits (registry set instead).
  DecodedRecord decode(std::optional<std::string_view> value, std::optional<std::string_view> key) const;
  /// Fetching missing schemas on the calling thread (offline commands).
  DecodedRecord decode_now(std::optional<std::string_view> value, std::optional<std::string_view> key) const;

 private:
  DecodedRecord run(std::optional<std::string_view> value, std::optional<std::string_view> key, bool wait) const;

  std::optional<Decoder> value_, key_;
  bool key_is_json_ = false;
};

/// A key's text as the biz_key and [route.when] read it: a JSON string's
/// text, a number as written, anything else compact JSON with its keys
/// sorted and null members dropped (so a later schema version adding an
/// optional field left null keeps the key); nullopt when it is not JSON (or
/// nested more than 128 deep).
std::optional<std::string> key_text(std::string_view json);

/// JSON with object keys sorted and null members dropped, compact: what the
/// payload check hashes for a decoded value, so that a re-send written with
/// another schema version of the same data (fields reordered, an optional
/// field added and left null) is the same payload. Input that is not JSON
/// comes back as it is.
std::string canonical_json(std::string_view json);

}  // namespace idemsink::format
