// Private to format/: protobuf's wire format read front to back, for the
// decoding in protobuf_decode.cc. Every read checks what is left and throws
// std::runtime_error naming what is wrong.
#pragma once

#include <google/protobuf/descriptor.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace idemsink::format::wire {

using FD = google::protobuf::FieldDescriptor;

inline constexpr int kMaxDepth = 100;  // libprotobuf's own recursion limit

// The encoding read front to back; every read checks what is left.
struct Wire {
  std::string_view b;
  size_t pos = 0;

  bool done() const { return pos == b.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (pos >= b.size()) throw std::runtime_error("ends inside a number");
      const auto byte = static_cast<uint8_t>(b[pos++]);
      if (shift < 64) v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return v;
    }
    throw std::runtime_error("a number longer than 10 bytes");
  }
  std::string_view take(uint64_t n) {
    if (n > b.size() - pos) throw std::runtime_error("ends inside a value (" + std::to_string(n) + " bytes announced)");
    auto out = b.substr(pos, n);
    pos += n;
    return out;
  }
  uint64_t fixed(size_t n) {  // little-endian, as the encoding is
    const auto raw = take(n);
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = (v << 8) | static_cast<uint8_t>(raw[i]);
    return v;
  }
  // After a field's tag: its value skipped (a group's up to its end tag).
  void skip(int wire, uint64_t number, int depth) {
    switch (wire) {
      case 0: varint(); return;
      case 1: take(8); return;
      case 2: take(varint()); return;
      case 5: take(4); return;
      case 3: group(number, depth); return;
      case 4: throw std::runtime_error("an end-group tag without its start");
      default: throw std::runtime_error("wire type " + std::to_string(wire));
    }
  }
  // After a start-group tag: the group's content, its end tag read.
  std::string_view group(uint64_t number, int depth) {
    if (depth > kMaxDepth) throw std::runtime_error("nested more than " + std::to_string(kMaxDepth) + " deep");
    const size_t start = pos;
    for (;;) {
      const size_t at = pos;
      const uint64_t tag = varint();
      const int wire = static_cast<int>(tag & 7);
      if (wire == 4) {
        if ((tag >> 3) != number) throw std::runtime_error("a group ends with another field's end tag");
        return b.substr(start, at - start);
      }
      skip(wire, tag >> 3, depth + 1);
    }
  }
};

inline uint32_t low32(uint64_t v) { return static_cast<uint32_t>(v); }
inline int32_t zigzag32(uint32_t u) { return static_cast<int32_t>((u >> 1) ^ (~(u & 1) + 1)); }
inline int64_t zigzag64(uint64_t u) { return static_cast<int64_t>((u >> 1) ^ (~(u & 1) + 1)); }

inline bool varint_type(FD::Type t) {
  return t == FD::TYPE_INT32 || t == FD::TYPE_INT64 || t == FD::TYPE_UINT32 || t == FD::TYPE_UINT64 ||
         t == FD::TYPE_SINT32 || t == FD::TYPE_SINT64 || t == FD::TYPE_BOOL || t == FD::TYPE_ENUM;
}
inline bool fixed32_type(FD::Type t) { return t == FD::TYPE_FIXED32 || t == FD::TYPE_SFIXED32 || t == FD::TYPE_FLOAT; }
inline bool fixed64_type(FD::Type t) { return t == FD::TYPE_FIXED64 || t == FD::TYPE_SFIXED64 || t == FD::TYPE_DOUBLE; }

// Whether a scalar's value is its type's zero (a proto3 field without
// presence is then absent, as the parsed message cannot tell).
inline bool is_zero(FD::Type t, uint64_t v) {
  switch (t) {
    case FD::TYPE_INT32:
    case FD::TYPE_UINT32:
    case FD::TYPE_SINT32:
    case FD::TYPE_ENUM:
    case FD::TYPE_FIXED32:
    case FD::TYPE_SFIXED32:
    case FD::TYPE_FLOAT: return low32(v) == 0;  // a float's bits: -0.0 is not zero
    default: return v == 0;
  }
}

}  // namespace idemsink::format::wire
