// Protobuf values read with the writer's schema as the registry holds it:
// .proto text (or a serialized FileDescriptorProto in base64, as some
// serializers register it), its imports resolved from the schema's
// references and the well-known types libprotobuf carries, the message picked
// by the record's message indexes, read into protobuf's JSON mapping
// (protobuf_json.h, docs/formats.md).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/format/json_writer.h"

namespace idemsink::format {

class ProtobufSchema {
 public:
  /// `references`: (import name, schema text) of every file the schema
  /// imports, directly or not, those a file imports before it. Throws
  /// std::runtime_error naming what does not parse or resolve.
  ProtobufSchema(std::string_view schema, const std::vector<std::pair<std::string, std::string>>& references);
  ~ProtobufSchema();

  /// The JSON (and its canonical form) of the message the indexes at the
  /// front of `bytes` name; throws std::runtime_error when the bytes do not
  /// decode.
  DecodedJson decode(std::string_view bytes) const;
  std::string to_json(std::string_view bytes) const { return decode(bytes).json; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idemsink::format
