#include "core/common/log.h"

#include <fmt/chrono.h>
#include <spdlog/details/file_helper.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/common/util.h"

namespace idemsink {
namespace {

constexpr const char* kTextPattern = "%Y-%m-%dT%H:%M:%S.%e %^%-5l%$ [%t] %v";

thread_local const LogFields* t_fields = nullptr;

// One JSON object per line. Invalid UTF-8 in a message (a remote's error
// text) is replaced, never a reason to lose the line.
class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    nlohmann::ordered_json j;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(msg.time.time_since_epoch()).count() % 1000;
    j["time"] =
        fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:03}Z", fmt::gmtime(std::chrono::system_clock::to_time_t(msg.time)), ms);
    const auto level = spdlog::level::to_string_view(msg.level);
    j["level"] = std::string(level.data(), level.size());
    j["thread"] = msg.thread_id;
    j["message"] = std::string(msg.payload.data(), msg.payload.size());
    if (const LogFields* f = t_fields) {
      if (!f->route.empty()) j["route"] = f->route;
      if (!f->topic.empty()) j["topic"] = f->topic;
      if (f->partition >= 0) j["partition"] = f->partition;
      if (f->offset >= 0) j["offset"] = f->offset;
      if (!f->biz_key.empty()) j["biz_key"] = printable(f->biz_key, 256);
      if (!f->idem_token.empty()) j["idem_token"] = f->idem_token;
    }
    const std::string line = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    dest.append(line.data(), line.data() + line.size());
    dest.push_back('\n');
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonFormatter>(); }
};

// A file that SIGHUP can reopen: logrotate moves it away, the next line
// goes to a new file of the same name.
// A file that cannot be opened again (permissions, a full disk) leaves the
// old one in use: the host logs on and says so.
class ReopenableFileSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit ReopenableFileSink(std::string path) : path_(std::move(path)) {
    file_ = std::make_unique<spdlog::details::file_helper>();
    file_->open(path_, false);
  }
  /// Empty, or why the file could not be opened again.
  std::string reopen() {
    auto fresh = std::make_unique<spdlog::details::file_helper>();
    try {
      fresh->open(path_, false);
    } catch (const std::exception& e) {
      return e.what();
    }
    std::lock_guard lk(mutex_);
    file_.swap(fresh);
    return "";
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    file_->write(buf);
  }
  void flush_() override { file_->flush(); }

 private:
  const std::string path_;
  std::unique_ptr<spdlog::details::file_helper> file_;
};

std::shared_ptr<ReopenableFileSink> g_file_sink;

}  // namespace

void init_logging(LogLevel level, LogFormat format, const std::string& file) {
  static bool logger_installed = false;
  if (!logger_installed) {
    // stderr: stdout belongs to command output (schema print, plugin-info, dev-kafka's address line).
    spdlog::set_default_logger(spdlog::stderr_color_mt("idemsink"));
    logger_installed = true;
  }
  auto logger = spdlog::default_logger();
  if (!file.empty()) {
    g_file_sink = std::make_shared<ReopenableFileSink>(file);  // throws spdlog_ex naming the file
    logger->sinks().clear();
    logger->sinks().push_back(g_file_sink);
    logger->flush_on(spdlog::level::info);  // a line is on disk before the next one is logged
  }
  if (format == LogFormat::Json) {
    logger->set_formatter(std::make_unique<JsonFormatter>());
  } else {
    logger->set_formatter(std::make_unique<spdlog::pattern_formatter>(kTextPattern));
  }
  set_log_level(level);
}

void set_log_level(LogLevel level) {
  switch (level) {
    case LogLevel::Trace: spdlog::set_level(spdlog::level::trace); return;
    case LogLevel::Debug: spdlog::set_level(spdlog::level::debug); return;
    case LogLevel::Info: spdlog::set_level(spdlog::level::info); return;
    case LogLevel::Warn: spdlog::set_level(spdlog::level::warn); return;
    case LogLevel::Error: spdlog::set_level(spdlog::level::err); return;
  }
}

std::string reopen_log_file() {
  if (!g_file_sink) return "logs go to stderr: nothing to reopen";
  return g_file_sink->reopen();
}

LogScope::LogScope(LogFields fields) : fields_(std::move(fields)), outer_(t_fields) { t_fields = &fields_; }

LogScope::~LogScope() { t_fields = outer_; }

}  // namespace idemsink
