#include "core/common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace idemsink {

void init_logging(const std::string& level) {
  static bool sink_installed = false;
  if (!sink_installed) {
    // stderr: stdout belongs to command output (schema print, plugin-info, dev-kafka's address line).
    auto logger = spdlog::stderr_color_mt("idemsink");
    spdlog::set_default_logger(logger);
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%-5l%$ [%t] %v");
    sink_installed = true;
  }
  spdlog::set_level(spdlog::level::from_str(level));
}

}  // namespace idemsink
