// The two choices a host's log is set up by (host.log_level,
// host.log_format), apart from log.h so the configuration's types can name
// them without pulling in spdlog.
#pragma once

namespace idemsink {

/// The levels a host logs at, least severe first.
enum class LogLevel { Trace, Debug, Info, Warn, Error };
/// Text lines, or one JSON object per line.
enum class LogFormat { Text, Json };

}  // namespace idemsink
