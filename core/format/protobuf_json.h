// Protobuf's binary encoding read straight into JSON by the message's
// descriptor, printed as protobuf's own JSON mapping prints the parsed
// message (docs/formats.md): the field names as the .proto writes them,
// 64-bit integers as strings, enums by name, a proto3 field at its default
// left out, Timestamp, Duration and the wrappers as their values. No message
// object in between: the parse rules are the parser's (the last of a
// singular field wins, occurrences of a message field merge, packed and
// unpacked repeated fields both read, unknown fields and mismatched wire
// types skipped, a proto2 enum's unknown numbers dropped, required fields
// checked, proto3 strings UTF-8), checked against libprotobuf's parser and
// printer by tests/unit/format_test.cc.
#pragma once

#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/type_resolver.h>

#include <map>
#include <memory>
#include <string_view>

#include "core/format/json_writer.h"

namespace idemsink::format {

class ProtobufJson {
 public:
  /// Plans every message `file` defines and every message they reach. The
  /// well-known types whose JSON is a shape of its own (Struct, Value,
  /// ListValue, Any, FieldMask) are printed by protobuf, resolving types in
  /// the file's pool.
  explicit ProtobufJson(const google::protobuf::FileDescriptor* file);
  ~ProtobufJson();

  /// `bytes`, one message of type `d` (defined in or reached from the
  /// file), as JSON; throws std::runtime_error when they do not parse.
  DecodedJson decode(const google::protobuf::Descriptor* d, std::string_view bytes) const;

  struct Plan;

 private:
  class Decode;
  const Plan* plan_of(const google::protobuf::Descriptor* d);

  std::map<const google::protobuf::Descriptor*, std::unique_ptr<Plan>> plans_;
  std::unique_ptr<google::protobuf::util::TypeResolver> resolver_;
};

}  // namespace idemsink::format
