// Private to format/: a message's plan, made once per message type by
// protobuf_json.cc and read by the decoding in protobuf_decode.cc.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.h>

#include "core/format/protobuf_json.h"

namespace idemsink::format {

struct ProtobufJson::Plan {
  enum class Kind { Message, Timestamp, Duration, Wrapper, Printed };
  struct Field {
    const google::protobuf::FieldDescriptor* f = nullptr;
    const Plan* message = nullptr;  // message and group fields, map entries
    int oneof = -1;                 // its oneof's index, a real one
    bool closed_enum = false;       // a proto2 enum: the parser drops numbers it does not name
    std::string printed;            // its name as the writer prints a key
  };
  const google::protobuf::Descriptor* d = nullptr;
  Kind kind = Kind::Message;
  std::vector<Field> fields;  // by name: the order the JSON prints them
  std::map<uint64_t, size_t> by_number;
  int oneofs = 0;
  bool any_required = false;

  const Field* find(uint64_t number, size_t& index) const {
    auto it = by_number.find(number);
    if (it == by_number.end()) return nullptr;
    index = it->second;
    return &fields[it->second];
  }
};

}  // namespace idemsink::format
