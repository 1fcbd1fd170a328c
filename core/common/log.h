// Logging: one spdlog logger for the whole host, named by component in the
// message. A duplicate is an INFO line and a counter, never an ERROR.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace idemsink {

/// Sets the global level ("trace".."error") and the line format. Safe to
/// call again (e.g. after the config is read).
void init_logging(const std::string& level);

}  // namespace idemsink
