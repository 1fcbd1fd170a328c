// The config loader on any text: a ConfigError naming where, or a config;
// never another exception, a crash or a hang.
#include <cstdint>
#include <string>

#include "core/config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)idemsink::config::load_string(text, "fuzz.toml");
  } catch (const idemsink::config::ConfigError&) {
  }
  return 0;
}
