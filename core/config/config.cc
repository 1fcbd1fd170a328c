#include "core/config/config.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <toml++/toml.h>

namespace idemsink::config {
namespace {

enum class Type { String, Int, Bool, Duration, DurationList, Section, SectionArray, StringMap, Options };

// One declared setting. `path` uses dots; "route" is the array of routes.
struct Setting {
  std::string_view path;
  Type type;
  std::string_view default_value;  // text form; "" with required=false means "unset"
  bool required;
  int64_t min;  // Int: value; Duration: milliseconds
  int64_t max;
  std::string_view doc;
};

// The single declaration table: validation, defaults, bounds and the
// generated reference all come from here.
constexpr Setting kSettings[] = {
    {"host", Type::Section, "", false, 0, 0, "This host process."},
    {"host.id", Type::String, "", false, 0, 0,
     "Stable identity of this host (default: the machine's hostname). Claims are owned by `<id>#<run>`: a host "
     "restarted with the same id takes over its own leases at once instead of waiting for them to expire. Two live "
     "hosts must never share an id."},
    {"host.max_in_flight", Type::Int, "2000", false, 1, 100000,
     "Handler calls in flight at once, all routes together (Little's law: rate x latency)."},
    {"host.max_buffered_records", Type::Int, "20000", false, 1, 10000000,
     "Consumed records not yet durable; above it fetching pauses (the consumer stays in the group)."},
    {"host.shutdown_grace", Type::Duration, "30s", false, 0, 3600000,
     "On SIGTERM or partition revocation: how long in-flight calls may finish before the host lets go."},
    {"host.log_level", Type::String, "info", false, 0, 0, "trace, debug, info, warn or error."},
    {"host.admin_listen", Type::String, "", false, 0, 0,
     "Address of the admin HTTP server (/metrics, /status, pause/resume), e.g. \"127.0.0.1:9464\"; empty = off."},

    {"kafka", Type::Section, "", true, 0, 0, "The Kafka cluster and consumer group."},
    {"kafka.bootstrap_servers", Type::String, "", true, 0, 0, "Comma-separated host:port list."},
    {"kafka.group_id", Type::String, "idemsink", false, 0, 0, "Consumer group; all hosts of one deployment share it."},
    {"kafka.max_poll_records", Type::Int, "500", false, 1, 100000, "Records taken per poll and claimed as one batch."},
    {"kafka.poll_timeout", Type::Duration, "100ms", false, 1, 60000, "How long one poll waits for records."},
    {"kafka.commit_interval", Type::Duration, "1s", false, 10, 600000,
     "How often durable offsets are committed (also on revoke and shutdown)."},
    {"kafka.stall_timeout", Type::Duration, "30s", false, 1000, 3600000,
     "A partition that should be fetching and is behind the end of the partition (its last stable offset), yet "
     "receives no record for this long, is stalled: logged, counted and read again from where it stands."},
    {"kafka.properties", Type::StringMap, "", false, 0, 0,
     "librdkafka properties for both clients (security.protocol, sasl.*, ...)."},
    {"kafka.consumer", Type::StringMap, "", false, 0, 0,
     "librdkafka properties for the consumer only (session.timeout.ms, partition.assignment.strategy, ...). "
     "enable.auto.commit and enable.auto.offset.store are always false, isolation.level is read_committed."},
    {"kafka.producer", Type::StringMap, "", false, 0, 0,
     "librdkafka properties for the DLQ producer only. enable.idempotence=true and acks=all are always set."},

    {"database", Type::Section, "", true, 0, 0, "The business MariaDB holding the claim table."},
    {"database.host", Type::String, "127.0.0.1", false, 0, 0, "Server host (TCP)."},
    {"database.port", Type::Int, "3306", false, 1, 65535, "Server port."},
    {"database.socket", Type::String, "", false, 0, 0, "Unix socket path; when set, used instead of host/port."},
    {"database.user", Type::String, "root", false, 0, 0, "User name."},
    {"database.password", Type::String, "", false, 0, 0, "Password (prefer password_env). Never logged."},
    {"database.password_env", Type::String, "", false, 0, 0,
     "Name of an environment variable holding the password; it must be set when this is."},
    {"database.database", Type::String, "", true, 0, 0, "Schema (database) name."},
    {"database.pool_size", Type::Int, "4", false, 2, 64, "Connections, one worker thread each."},
    {"database.connect_timeout", Type::Duration, "5s", false, 100, 600000, "Connect timeout per attempt."},
    {"database.reconnect_backoff_max", Type::Duration, "5s", false, 10, 600000,
     "Longest wait between reconnect attempts while the database is gone."},

    {"claim", Type::Section, "", false, 0, 0, "The claim/dedup state machine."},
    {"claim.lease", Type::Duration, "30s", false, 1000, 86400000,
     "Lease on a pending claim, renewed while its record is being handled; another host may take it over only "
     "after it expires."},
    {"claim.wait_recheck", Type::Duration, "1s", false, 10, 600000,
     "How often a record whose key is held by another live host is checked again."},
    {"claim.retention_days", Type::Int, "90", false, 2, 36500,
     "Claim rows are kept this long (monthly partitions, dropped whole)."},
    {"claim.horizon_margin_days", Type::Int, "7", false, 1, 36500,
     "Records older than retention minus this margin are refused (DLQ reason beyond_replay_horizon): their claim "
     "may already be dropped."},
    {"claim.max_future_skew", Type::Duration, "1h", false, 0, 86400000 * 30LL,
     "Records timestamped further in the future than this are refused (DLQ reason timestamp_in_future)."},
    {"claim.apply_schema", Type::Bool, "true", false, 0, 0,
     "Create missing tables and partitions at start-up (`idemsink schema apply` does the same by hand)."},
    {"claim.max_takeovers", Type::Int, "5", false, 1, 1000,
     "A record whose claim was taken over this many times (its host kept dying on it) is failed to the DLQ "
     "instead of being handled again."},
    {"claim.flush_linger", Type::Duration, "5ms", false, 0, 1000,
     "How long completions wait to be marked done together in one statement."},
    {"claim.stuck_after", Type::Duration, "10m", false, 1000, 86400000 * 30LL,
     "A pending claim nobody holds and nobody touched for this long is stuck: its record is not coming back."},
    {"claim.reconcile_interval", Type::Duration, "1m", false, 0, 86400000,
     "How often unknown and stuck claims are put to their plugin's reconcile hook; \"0s\" turns it off."},

    {"route", Type::SectionArray, "", true, 0, 0, "One [[route]] per topic: which handler runs for its records."},
    {"route.name", Type::String, "", true, 0, 0,
     "Route name, also the claim namespace: one biz_key can have one claim per route. [A-Za-z0-9_.-], at most 64."},
    {"route.topic", Type::String, "", true, 0, 0, "Source topic."},
    {"route.plugin", Type::String, "", true, 0, 0, "Handler plugin (.so) path, relative to this file's folder."},
    {"route.concurrency", Type::Int, "0", false, 0, 100000,
     "Calls in flight for this route; 0 = only the host-wide max_in_flight."},
    {"route.call_timeout", Type::Duration, "30s", false, 10, 3600000,
     "Deadline for one handler call to report; past it the call counts as uncertain."},
    {"route.payload_check", Type::Bool, "true", false, 0, 0,
     "A redelivered biz_key with a different payload is a conflict (DLQ), not a duplicate."},
    {"route.max_record_bytes", Type::Int, "1048576", false, 1, 1LL << 30,
     "Larger records are refused (DLQ reason record_too_large)."},
    {"route.key", Type::Section, "", false, 0, 0, "Where the biz_key comes from."},
    {"route.key.from", Type::String, "key", false, 0, 0, "\"key\" (the Kafka key), \"header\" or \"json\"."},
    {"route.key.header", Type::String, "", false, 0, 0, "Header name, with from = \"header\"."},
    {"route.key.json", Type::String, "", false, 0, 0, "Dotted field path in a JSON value, with from = \"json\"."},
    {"route.retry", Type::Section, "", false, 0, 0, "Retries of retryable (and, for idempotent kinds, uncertain) outcomes."},
    {"route.retry.max_attempts", Type::Int, "5", false, 1, 1000, "Calls per record before it is dead-lettered."},
    {"route.retry.backoff_initial", Type::Duration, "200ms", false, 1, 3600000,
     "First backoff; doubles per attempt, with full jitter."},
    {"route.retry.backoff_max", Type::Duration, "30s", false, 1, 86400000, "Backoff cap."},
    {"route.retry.topics", Type::DurationList, "", false, 1, 86400000 * 7LL,
     "Delayed retry topics instead of in-place retries, e.g. [\"10s\", \"5m\"]: a failed call forwards the record to "
     "\"<topic>.retry.N\" (the topics must exist), where it is retried once the N-th delay has passed; after the "
     "last it is dead-lettered. The source partition moves on at once."},
    {"route.dlq", Type::Section, "", false, 0, 0, "Dead-letter queue."},
    {"route.dlq.enabled", Type::Bool, "true", false, 0, 0,
     "Publish dead records to the DLQ topic (they are always recorded in the database)."},
    {"route.dlq.topic", Type::String, "", false, 0, 0, "DLQ topic (default: \"<topic>.dlq\")."},
    {"route.options", Type::Options, "", false, 0, 0,
     "Handler options, checked against the plugin's declarations (`idemsink plugin-info`)."},
};

const Setting* find_setting(std::string_view path) {
  for (const auto& s : kSettings)
    if (s.path == path) return &s;
  return nullptr;
}

const char* type_name(Type t) {
  switch (t) {
    case Type::String: return "string";
    case Type::Int: return "integer";
    case Type::Bool: return "boolean";
    case Type::Duration: return "duration";
    case Type::DurationList: return "array of durations";
    case Type::Section: return "table";
    case Type::SectionArray: return "array of tables";
    case Type::StringMap: return "table of strings";
    case Type::Options: return "table";
  }
  return "?";
}

SourcePos pos_of(const std::string& file, const toml::node& n) {
  return SourcePos{file, n.source().begin.line, n.source().begin.column};
}

[[noreturn]] void fail(const SourcePos& pos, std::string_view key, const std::string& reason) {
  throw ConfigError(pos.where() + ": " + std::string(key) + ": " + reason);
}

// Expands ${NAME} from the environment; an unset variable is an error.
std::string expand_env(const std::string& in, const SourcePos& pos, std::string_view key) {
  std::string out;
  size_t i = 0;
  while (i < in.size()) {
    if (in.compare(i, 2, "${") == 0) {
      size_t end = in.find('}', i + 2);
      if (end == std::string::npos) fail(pos, key, "unterminated ${ in \"" + in + "\"");
      std::string name = in.substr(i + 2, end - i - 2);
      const char* v = std::getenv(name.c_str());
      if (v == nullptr) fail(pos, key, "environment variable " + name + " is not set");
      out += v;
      i = end + 1;
    } else {
      out.push_back(in[i++]);
    }
  }
  return out;
}

// Rejects unknown keys and wrong types anywhere in the document.
void check_table(const toml::table& t, const std::string& prefix, const std::string& file) {
  for (const auto& [k, node] : t) {
    const std::string key(k.str());
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    const Setting* s = find_setting(path);
    const SourcePos pos = pos_of(file, node);
    if (s == nullptr) {
      fail(pos, path, prefix.empty() ? "unknown section or key" : "unknown key in [" + prefix + "]");
    }
    switch (s->type) {
      case Type::Section:
        if (!node.is_table()) fail(pos, path, "expected a table");
        check_table(*node.as_table(), path, file);
        break;
      case Type::SectionArray:
        if (!node.is_array_of_tables()) fail(pos, path, "expected [[" + path + "]] tables");
        for (const auto& elem : *node.as_array()) check_table(*elem.as_table(), path, file);
        break;
      case Type::StringMap:
      case Type::Options:
        if (!node.is_table()) fail(pos, path, "expected a table");
        for (const auto& [mk, mv] : *node.as_table()) {
          if (!(mv.is_string() || mv.is_integer() || mv.is_floating_point() || mv.is_boolean()))
            fail(pos_of(file, mv), path + "." + std::string(mk.str()), "expected a string, number or boolean");
        }
        break;
      case Type::String:
        if (!node.is_string()) fail(pos, path, "expected a string");
        break;
      case Type::Int:
        if (!node.is_integer()) fail(pos, path, "expected an integer");
        break;
      case Type::Bool:
        if (!node.is_boolean()) fail(pos, path, "expected true or false");
        break;
      case Type::Duration:
        if (!node.is_string() || !parse_duration(**node.as_string()))
          fail(pos, path, "expected a duration string such as \"250ms\", \"2s\", \"5m\", \"1h\"");
        break;
      case Type::DurationList:
        if (!node.is_array()) fail(pos, path, "expected an array of durations such as [\"10s\", \"5m\"]");
        for (const auto& elem : *node.as_array())
          if (!elem.is_string() || !parse_duration(**elem.as_string()))
            fail(pos_of(file, elem), path, "expected a duration string such as \"10s\"");
        break;
    }
  }
}

std::string scalar_text(const toml::node& n) {
  if (n.is_string()) return **n.as_string();
  if (n.is_integer()) return std::to_string(**n.as_integer());
  if (n.is_boolean()) return **n.as_boolean() ? "true" : "false";
  std::ostringstream os;
  os << **n.as_floating_point();
  return os.str();
}

// Typed access to one validated table, applying declared defaults and bounds.
class Reader {
 public:
  Reader(const toml::table* t, std::string prefix, std::string file, SourcePos table_pos)
      : t_(t), prefix_(std::move(prefix)), file_(std::move(file)), table_pos_(std::move(table_pos)) {}

  std::string str(std::string_view key) const {
    const Setting& s = decl(key);
    if (const toml::node* n = node(key)) return expand_env(**n->as_string(), pos_of(file_, *n), s.path);
    if (s.required) missing(s);
    return std::string(s.default_value);
  }
  int64_t integer(std::string_view key) const {
    const Setting& s = decl(key);
    int64_t v = 0;
    if (const toml::node* n = node(key)) {
      v = **n->as_integer();
      if (v < s.min || v > s.max)
        fail(pos_of(file_, *n), s.path, "must be between " + std::to_string(s.min) + " and " + std::to_string(s.max));
    } else {
      if (s.required) missing(s);
      v = std::stoll(std::string(s.default_value));
    }
    return v;
  }
  bool boolean(std::string_view key) const {
    const Setting& s = decl(key);
    if (const toml::node* n = node(key)) return **n->as_boolean();
    return s.default_value == "true";
  }
  Millis duration(std::string_view key) const {
    const Setting& s = decl(key);
    if (const toml::node* n = node(key)) {
      Millis v = *parse_duration(**n->as_string());
      if (v.count() < s.min || v.count() > s.max)
        fail(pos_of(file_, *n), s.path,
             "must be between " + std::to_string(s.min) + "ms and " + std::to_string(s.max) + "ms");
      return v;
    }
    return *parse_duration(s.default_value);
  }
  std::vector<Millis> duration_list(std::string_view key) const {
    const Setting& s = decl(key);
    std::vector<Millis> out;
    if (const toml::node* n = node(key)) {
      for (const auto& elem : *n->as_array()) {
        Millis v = *parse_duration(**elem.as_string());
        if (v.count() < s.min || v.count() > s.max)
          fail(pos_of(file_, elem), s.path,
               "must be between " + std::to_string(s.min) + "ms and " + std::to_string(s.max) + "ms");
        out.push_back(v);
      }
    }
    return out;
  }
  std::map<std::string, std::string> string_map(std::string_view key) const {
    std::map<std::string, std::string> out;
    if (const toml::node* n = node(key))
      for (const auto& [k, v] : *n->as_table()) out[std::string(k.str())] = scalar_text(v);
    return out;
  }
  Reader sub(std::string_view key) const {
    const toml::node* n = node(key);
    static const toml::table kEmpty;
    return Reader(n ? n->as_table() : &kEmpty, path(key), file_, n ? pos_of(file_, *n) : table_pos_);
  }
  const toml::node* node(std::string_view key) const { return t_->get(key); }
  SourcePos pos_of_key(std::string_view key) const {
    const toml::node* n = node(key);
    return n ? pos_of(file_, *n) : table_pos_;
  }
  const SourcePos& table_pos() const { return table_pos_; }
  std::string path(std::string_view key) const { return prefix_.empty() ? std::string(key) : prefix_ + "." + std::string(key); }

 private:
  const Setting& decl(std::string_view key) const {
    const Setting* s = find_setting(path(key));
    if (s == nullptr) throw std::logic_error("undeclared setting " + path(key));
    return *s;
  }
  [[noreturn]] void missing(const Setting& s) const {
    fail(table_pos_, s.path, "required key is missing" + (prefix_.empty() ? "" : " in [" + prefix_ + "]"));
  }
  const toml::table* t_;
  std::string prefix_;
  std::string file_;
  SourcePos table_pos_;
};

RouteConfig read_route(const Reader& r, const std::filesystem::path& base_dir) {
  RouteConfig rc;
  rc.pos = r.table_pos();
  rc.name = r.str("name");
  static const std::regex kName("[A-Za-z0-9_.-]{1,64}");
  if (!std::regex_match(rc.name, kName))
    fail(r.pos_of_key("name"), "route.name", "\"" + rc.name + "\" must be 1-64 characters of [A-Za-z0-9_.-]");
  rc.topic = r.str("topic");
  if (rc.topic.empty()) fail(r.pos_of_key("topic"), "route.topic", "must not be empty");
  std::filesystem::path plugin = r.str("plugin");
  rc.plugin = plugin.is_absolute() ? plugin : (base_dir / plugin).lexically_normal();
  rc.plugin_pos = r.pos_of_key("plugin");
  rc.concurrency = static_cast<int>(r.integer("concurrency"));
  rc.call_timeout = r.duration("call_timeout");
  rc.payload_check = r.boolean("payload_check");
  rc.max_record_bytes = r.integer("max_record_bytes");

  Reader key = r.sub("key");
  const std::string from = key.str("from");
  if (from == "key") {
    rc.key_source = KeySource::MessageKey;
  } else if (from == "header") {
    rc.key_source = KeySource::Header;
    rc.key_header = key.str("header");
    if (rc.key_header.empty()) fail(key.table_pos(), "route.key.header", "required when from = \"header\"");
  } else if (from == "json") {
    rc.key_source = KeySource::JsonField;
    rc.key_json_path = key.str("json");
    if (rc.key_json_path.empty()) fail(key.table_pos(), "route.key.json", "required when from = \"json\"");
  } else {
    fail(key.pos_of_key("from"), "route.key.from", "must be \"key\", \"header\" or \"json\", not \"" + from + "\"");
  }

  Reader retry = r.sub("retry");
  rc.retry.max_attempts = static_cast<int>(retry.integer("max_attempts"));
  rc.retry.backoff_initial = retry.duration("backoff_initial");
  rc.retry.backoff_max = retry.duration("backoff_max");
  if (rc.retry.backoff_max < rc.retry.backoff_initial)
    fail(retry.table_pos(), "route.retry.backoff_max", "must not be smaller than backoff_initial");
  rc.retry.topics = retry.duration_list("topics");

  Reader dlq = r.sub("dlq");
  rc.dlq.enabled = dlq.boolean("enabled");
  rc.dlq.topic = dlq.str("topic");
  if (rc.dlq.topic.empty()) rc.dlq.topic = rc.topic + ".dlq";
  if (rc.dlq.topic == rc.topic) fail(dlq.pos_of_key("topic"), "route.dlq.topic", "must differ from the source topic");

  if (const toml::node* opts = r.node("options")) {
    for (const auto& [k, v] : *opts->as_table()) {
      OptionValue ov;
      ov.pos = pos_of(r.table_pos().file, v);
      ov.toml_type = v.is_string()    ? OptionValue::TomlType::String
                     : v.is_integer() ? OptionValue::TomlType::Integer
                     : v.is_boolean() ? OptionValue::TomlType::Boolean
                                      : OptionValue::TomlType::Float;
      ov.text = v.is_string() ? expand_env(**v.as_string(), ov.pos, "route.options." + std::string(k.str()))
                              : scalar_text(v);
      rc.options.emplace(std::string(k.str()), std::move(ov));
    }
  }
  return rc;
}

std::string default_host_id() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "idemsink";
  return buf;
}

Config build(const toml::table& doc, const std::string& file, const std::filesystem::path& base_dir) {
  check_table(doc, "", file);
  const SourcePos top{file, 1, 1};
  Reader root(&doc, "", file, top);
  if (!doc.contains("kafka")) fail(top, "kafka", "required section [kafka] is missing");
  if (!doc.contains("database")) fail(top, "database", "required section [database] is missing");
  if (!doc.contains("route")) fail(top, "route", "at least one [[route]] is required");

  Config c;
  c.file = file;

  Reader host = root.sub("host");
  c.host.id = host.str("id");
  if (c.host.id.empty()) c.host.id = default_host_id();
  if (c.host.id.size() > 96 || c.host.id.find('#') != std::string::npos)
    fail(host.pos_of_key("id"), "host.id", "must be at most 96 characters and contain no '#'");
  c.host.max_in_flight = static_cast<int>(host.integer("max_in_flight"));
  c.host.max_buffered_records = static_cast<int>(host.integer("max_buffered_records"));
  c.host.shutdown_grace = host.duration("shutdown_grace");
  c.host.log_level = host.str("log_level");
  static const std::set<std::string> kLevels{"trace", "debug", "info", "warn", "error"};
  if (!kLevels.count(c.host.log_level))
    fail(host.pos_of_key("log_level"), "host.log_level", "must be one of trace, debug, info, warn, error");
  c.host.admin_listen = host.str("admin_listen");

  Reader kafka = root.sub("kafka");
  c.kafka.bootstrap_servers = kafka.str("bootstrap_servers");
  c.kafka.group_id = kafka.str("group_id");
  c.kafka.max_poll_records = static_cast<int>(kafka.integer("max_poll_records"));
  c.kafka.poll_timeout = kafka.duration("poll_timeout");
  c.kafka.commit_interval = kafka.duration("commit_interval");
  c.kafka.stall_timeout = kafka.duration("stall_timeout");
  c.kafka.properties = kafka.string_map("properties");
  c.kafka.consumer_properties = kafka.string_map("consumer");
  c.kafka.producer_properties = kafka.string_map("producer");

  Reader db = root.sub("database");
  c.database.host = db.str("host");
  c.database.port = static_cast<int>(db.integer("port"));
  c.database.socket = db.str("socket");
  c.database.user = db.str("user");
  c.database.password = db.str("password");
  const std::string password_env = db.str("password_env");
  if (!password_env.empty()) {
    const char* v = std::getenv(password_env.c_str());
    if (v == nullptr)
      fail(db.pos_of_key("password_env"), "database.password_env",
           "environment variable " + password_env + " is not set");
    c.database.password = v;
  }
  c.database.database = db.str("database");
  c.database.pool_size = static_cast<int>(db.integer("pool_size"));
  c.database.connect_timeout = db.duration("connect_timeout");
  c.database.reconnect_backoff_max = db.duration("reconnect_backoff_max");

  Reader claim = root.sub("claim");
  c.claim.lease = claim.duration("lease");
  c.claim.wait_recheck = claim.duration("wait_recheck");
  c.claim.retention_days = static_cast<int>(claim.integer("retention_days"));
  c.claim.horizon_margin_days = static_cast<int>(claim.integer("horizon_margin_days"));
  if (c.claim.horizon_margin_days >= c.claim.retention_days)
    fail(claim.pos_of_key("horizon_margin_days"), "claim.horizon_margin_days", "must be smaller than retention_days");
  c.claim.max_future_skew = claim.duration("max_future_skew");
  c.claim.apply_schema = claim.boolean("apply_schema");
  c.claim.max_takeovers = static_cast<int>(claim.integer("max_takeovers"));
  c.claim.flush_linger = claim.duration("flush_linger");
  c.claim.stuck_after = claim.duration("stuck_after");
  c.claim.reconcile_interval = claim.duration("reconcile_interval");

  std::set<std::string> names, topics;
  for (const auto& elem : *doc.get("route")->as_array()) {
    const toml::table& t = *elem.as_table();
    Reader r(&t, "route", file, pos_of(file, t));
    RouteConfig rc = read_route(r, base_dir);
    if (!names.insert(rc.name).second) fail(rc.pos, "route.name", "duplicate route name \"" + rc.name + "\"");
    if (!topics.insert(rc.topic).second)
      fail(rc.pos, "route.topic", "topic \"" + rc.topic + "\" already has a route (one route per topic)");
    c.routes.push_back(std::move(rc));
  }
  for (const auto& rc : c.routes) {
    if (topics.count(rc.dlq.topic))
      fail(rc.pos, "route.dlq.topic", "DLQ topic \"" + rc.dlq.topic + "\" is the source topic of a route");
    for (size_t tier = 1; tier <= rc.retry.topics.size(); ++tier)
      if (topics.count(rc.retry.topic_name(rc.topic, tier)))
        fail(rc.pos, "route.retry.topics",
             "retry topic \"" + rc.retry.topic_name(rc.topic, tier) + "\" is the source topic of a route");
  }
  return c;
}

Config parse(const std::string& text, const std::string& name, const std::filesystem::path& base_dir) {
  try {
    toml::table doc = toml::parse(text, name);
    return build(doc, name, base_dir);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw ConfigError(name + ":" + std::to_string(b.line) + ":" + std::to_string(b.column) + ": " +
                      std::string(e.description()));
  }
}

}  // namespace

std::string SourcePos::where() const { return file + ":" + std::to_string(line) + ":" + std::to_string(column); }

const RouteConfig* Config::route_for_topic(const std::string& topic) const {
  for (const auto& r : routes)
    if (r.topic == topic) return &r;
  return nullptr;
}

const RouteConfig* Config::route_by_name(const std::string& name) const {
  for (const auto& r : routes)
    if (r.name == name) return &r;
  return nullptr;
}

Config load_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path.string() + ": cannot read config file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path.string(), std::filesystem::absolute(path).parent_path());
}

Config load_string(const std::string& text, const std::string& name) {
  return parse(text, name, std::filesystem::current_path());
}

std::string reference_markdown() {
  std::ostringstream os;
  os << "# Configuration reference\n\n"
        "Generated by `idemsink config-reference` from the declarations in `core/config/config.cc`; do not edit.\n\n"
        "Unknown keys and values of the wrong type or out of bounds are errors naming the file, line and key. "
        "String values may use `${ENV_VAR}`; an unset variable is an error. Durations are strings with a unit: "
        "`ms`, `s`, `m`, `h`, `d`.\n";
  for (const auto& s : kSettings) {
    if (s.type == Type::Section || s.type == Type::SectionArray) {
      const bool array = s.type == Type::SectionArray;
      os << "\n## " << (array ? "[[" : "[") << s.path << (array ? "]]" : "]") << "\n\n" << s.doc;
      if (s.required) os << " Required.";
      os << "\n\n| key | type | default | bounds | description |\n|---|---|---|---|---|\n";
      continue;
    }
    std::string_view key = s.path.substr(s.path.find('.') + 1);
    std::string bounds;
    if (s.type == Type::Int) bounds = std::to_string(s.min) + " .. " + std::to_string(s.max);
    if (s.type == Type::Duration) bounds = std::to_string(s.min) + "ms .. " + std::to_string(s.max) + "ms";
    std::string def = s.required ? "required" : (s.default_value.empty() ? "" : "`" + std::string(s.default_value) + "`");
    os << "| `" << key << "` | " << type_name(s.type) << " | " << def << " | " << bounds << " | " << s.doc << " |\n";
  }
  return os.str();
}

}  // namespace idemsink::config
