// Logging: one spdlog logger for the whole host, named by component in the
// message. A duplicate is an INFO line and a counter, never an ERROR.
//
// Text (the default) or JSON, one object per line: time, level, thread,
// message and, where a line is about a record or a route, the fields of the
// LogScope active on the logging thread (route, topic, partition, offset,
// biz_key made printable, idem_token).
#pragma once

#include <spdlog/spdlog.h>

#include <cstdint>
#include <string>

#include "core/common/log_settings.h"

namespace idemsink {

/// Sets the global level, the line format and where lines go (a file, or
/// stderr when empty). Safe to call again (e.g. after the config is read).
void init_logging(LogLevel level, LogFormat format = LogFormat::Text, const std::string& file = "");
/// Changes the global level alone (a reload).
void set_log_level(LogLevel level);

/// Reopens the log file (after logrotate moved it away). Empty when done;
/// otherwise why not (logging to stderr, or the file cannot be opened: the
/// old file stays in use).
std::string reopen_log_file();

/// What a log line is about; empty strings and negative numbers are left out.
struct LogFields {
  std::string route;
  std::string topic;
  int32_t partition = -1;
  int64_t offset = -1;
  std::string biz_key;  // raw bytes: made printable when written
  std::string idem_token;
};

/// The fields of the lines logged by this thread while it lives (nested
/// scopes: the innermost wins).
class LogScope {
 public:
  explicit LogScope(LogFields fields);
  ~LogScope();
  LogScope(const LogScope&) = delete;
  LogScope& operator=(const LogScope&) = delete;

 private:
  LogFields fields_;
  const LogFields* outer_;
};

}  // namespace idemsink
