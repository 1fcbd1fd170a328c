// Host configuration: the typed result of reading and validating a TOML file.
//
// Every setting is declared once in settings.cc (name, type, default, bounds,
// doc). Loading rejects unknown keys and bad values with an error naming the
// file, line and key; conf/CONFIGURATION.md is generated from the same table.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/common/util.h"

namespace idemsink::config {

/// A config file problem, already formatted as "file:line:col: key: reason".
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Where a value came from, to point errors found after loading (for example
/// a handler option the plugin rejects) at the right line.
struct SourcePos {
  std::string file;
  uint32_t line = 0;
  uint32_t column = 0;
  std::string where() const;  // "file:line:col"
};

struct HostConfig {
  std::string id;                 // stable identity; owner prefix of claims
  int max_in_flight = 2000;       // handler calls in flight, all routes
  int max_buffered_records = 20000;
  Millis shutdown_grace{30000};
  std::string log_level = "info";
  std::string admin_listen;       // "" = no admin HTTP server
};

struct KafkaConfig {
  std::string bootstrap_servers;
  std::string group_id;
  int max_poll_records = 500;
  Millis poll_timeout{100};
  Millis commit_interval{1000};
  Millis stall_timeout{30000};
  std::map<std::string, std::string> properties;           // both clients
  std::map<std::string, std::string> consumer_properties;  // consumer only
  std::map<std::string, std::string> producer_properties;  // DLQ producer only
};

struct DatabaseConfig {
  std::string host = "127.0.0.1";
  int port = 3306;
  std::string socket;
  std::string user = "root";
  std::string password;  // resolved from password or password_env; never logged
  std::string database;
  int pool_size = 4;
  Millis connect_timeout{5000};
  Millis reconnect_backoff_max{5000};
};

struct ClaimConfig {
  Millis lease{30000};
  Millis wait_recheck{1000};
  int retention_days = 90;
  int horizon_margin_days = 7;
  Millis max_future_skew{3600000};
  bool apply_schema = true;
  int max_takeovers = 5;
  Millis flush_linger{5};
  Millis stuck_after{600000};
  Millis reconcile_interval{60000};
};

enum class KeySource { MessageKey, Header, JsonField };

struct RetryConfig {
  int max_attempts = 5;
  Millis backoff_initial{200};
  Millis backoff_max{30000};
  /// Delayed retry topics: empty = retry in place. Otherwise a failed call
  /// forwards the record to "<topic>.retry.N" to be retried after topics[N-1].
  std::vector<Millis> topics;
  std::string topic_name(const std::string& source, size_t tier) const {
    return source + ".retry." + std::to_string(tier);
  }
};

struct DlqConfig {
  bool enabled = true;
  std::string topic;  // default "<topic>.dlq"
};

/// A handler option as written in [route.options]; typed against the
/// plugin's declarations when the plugin is loaded.
struct OptionValue {
  enum class TomlType { String, Integer, Float, Boolean } toml_type;
  std::string text;  // the value as text (strings verbatim, numbers in decimal)
  SourcePos pos;
};

struct RouteConfig {
  std::string name;  // claim namespace
  std::string topic;
  std::filesystem::path plugin;
  SourcePos plugin_pos;
  KeySource key_source = KeySource::MessageKey;
  std::string key_header;
  std::string key_json_path;  // dotted path, e.g. "order.id"
  int concurrency = 0;        // 0 = only the host-wide cap
  Millis call_timeout{30000};
  bool payload_check = true;
  int64_t max_record_bytes = 1 << 20;
  RetryConfig retry;
  DlqConfig dlq;
  std::map<std::string, OptionValue> options;
  SourcePos pos;
};

struct Config {
  std::filesystem::path file;
  HostConfig host;
  KafkaConfig kafka;
  DatabaseConfig database;
  ClaimConfig claim;
  std::vector<RouteConfig> routes;

  const RouteConfig* route_for_topic(const std::string& topic) const;
  const RouteConfig* route_by_name(const std::string& name) const;
};

/// Reads and validates a config file. Throws ConfigError.
Config load_file(const std::filesystem::path& path);

/// Same, from text (`name` is used in error messages).
Config load_string(const std::string& text, const std::string& name);

/// Markdown reference of every setting, generated from the declarations.
std::string reference_markdown();

}  // namespace idemsink::config
