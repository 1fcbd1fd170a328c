// sanitize_utf8 and printable on any bytes: the result is always valid
// UTF-8 (the JSON writer, which validates strictly, takes it), never longer
// than asked, and printable() has no control bytes.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/common/util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  for (size_t max : {size_t{0}, size_t{1}, size_t{7}, size_t{1024}, size}) {
    const std::string out = idemsink::sanitize_utf8(in, max);
    if (out.size() > max) __builtin_trap();
    (void)nlohmann::json(out).dump();  // throws (and the target fails) on invalid UTF-8
  }
  const std::string shown = idemsink::printable(in, 64);
  for (unsigned char c : shown)
    if (c < 0x20 || c == 0x7F) __builtin_trap();
  return 0;
}
