// The stored form of DLQ headers, read back from a database row: any blob
// decodes without crashing, and what decodes encodes to a blob that decodes
// to the same headers.
#include <cstdint>
#include <string>

#include "core/dlq/outbox.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view blob(reinterpret_cast<const char*>(data), size);
  const auto headers = idemsink::dlq::decode_headers(blob);
  const auto again = idemsink::dlq::decode_headers(idemsink::dlq::encode_headers(headers));
  if (again.size() != headers.size()) __builtin_trap();
  for (size_t i = 0; i < headers.size(); ++i)
    if (again[i].name != headers[i].name || again[i].value != headers[i].value) __builtin_trap();
  return 0;
}
