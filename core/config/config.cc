#include "core/config/config.h"

#include "core/config/settings.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <toml++/toml.h>

namespace idemsink::config {
namespace {

SourcePos pos_of(const std::string& file, const toml::node& n) {
  return SourcePos{file, n.source().begin.line, n.source().begin.column};
}

[[noreturn]] void fail(const SourcePos& pos, std::string_view key, const std::string& reason) {
  throw ConfigError(pos.where() + ": " + std::string(key) + ": " + reason);
}

// The last part of a dotted path: "password" for "database.password".
std::string_view leaf(std::string_view path) { return path.substr(path.rfind('.') + 1); }

bool valid_env_name(std::string_view name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// The one expansion rule for every string in the file: ${NAME} is the
// environment variable's value (unset is an error), $$ is a literal $, any
// other $ stays as it is, and an unterminated ${ is an error. `secret` keeps
// every part of the text, variable names included, out of the error (the key
// and the position still show).
std::string expand_env(const std::string& in, const SourcePos& pos, std::string_view key, bool secret) {
  std::string out;
  size_t i = 0;
  while (i < in.size()) {
    if (in[i] != '$' || i + 1 == in.size() || (in[i + 1] != '$' && in[i + 1] != '{')) {
      out.push_back(in[i++]);
      continue;
    }
    if (in[i + 1] == '$') {
      out.push_back('$');
      i += 2;
      continue;
    }
    const std::string at = " at character " + std::to_string(i + 1) + " of the value";
    const size_t end = in.find('}', i + 2);
    if (end == std::string::npos)
      fail(pos, key, "unterminated ${" + at + (secret ? "" : " \"" + in + "\"") + " (write $$ for a literal $)");
    const std::string name = in.substr(i + 2, end - i - 2);
    if (!valid_env_name(name))
      fail(pos, key,
           "invalid environment variable name" + (secret ? at : " \"" + name + "\"" + at) +
               " (letters, digits and _; write $$ for a literal $)");
    const char* v = std::getenv(name.c_str());
    if (v == nullptr)
      fail(pos, key,
           secret ? "the environment variable" + at + " is not set" : "environment variable " + name + " is not set");
    out += v;
    i = end + 1;
  }
  return out;
}

// Rejects unknown keys and wrong types anywhere in the document. Values are
// parsed and bounds-checked when read, after expansion.
void check_table(const toml::table& t, const std::string& prefix, const std::string& file) {
  for (const auto& [k, node] : t) {
    const std::string key(k.str());
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    const Setting* s = find_setting(path);
    // [route.database] takes the keys of [database].
    if (s == nullptr && path.starts_with("route.database.")) s = find_setting(path.substr(6));
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
        if (!node.is_string()) fail(pos, path, "expected a duration string such as \"250ms\", \"2s\", \"5m\", \"1h\"");
        break;
      case Type::DurationList:
        if (!node.is_array()) fail(pos, path, "expected an array of durations such as [\"10s\", \"5m\"]");
        for (const auto& elem : *node.as_array())
          if (!elem.is_string()) fail(pos_of(file, elem), path, "expected a duration string such as \"10s\"");
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

// A duration string (expanded, parsed, within the setting's bounds).
Millis duration_of(const Setting& s, const toml::node& n, const std::string& file, const std::string& hint) {
  const SourcePos pos = pos_of(file, n);
  const std::optional<Millis> v = parse_duration(expand_env(**n.as_string(), pos, s.path, looks_secret(leaf(s.path))));
  if (!v) fail(pos, s.path, hint);
  if (v->count() < s.min || v->count() > s.max)
    fail(pos, s.path, "must be between " + std::to_string(s.min) + "ms and " + std::to_string(s.max) + "ms");
  return *v;
}

Value declared_default(const Setting& s) {
  const std::string text(s.default_value);
  switch (s.type) {
    case Type::String: return text;
    case Type::Int: return Value(std::in_place_type<int64_t>, std::stoll(text));
    case Type::Bool: return Value(std::in_place_type<bool>, text == "true");
    case Type::Duration:
      if (const std::optional<Millis> d = parse_duration(text)) return *d;
      break;
    case Type::DurationList: return std::vector<Millis>{};
    case Type::StringMap: return std::map<std::string, std::string>{};
    case Type::Section:
    case Type::SectionArray:
    case Type::Options: break;
  }
  throw std::logic_error("setting " + std::string(s.path) + " has no usable default");
}

// The value of setting `s` from node `n` (null when the file leaves it out):
// typed, expanded and bounds-checked, or else the declared default. A missing
// required key is reported at `table_pos`, its enclosing table.
Value read_value(const Setting& s, const toml::node* n, const std::string& file, const SourcePos& table_pos) {
  if (n == nullptr) {
    if (s.required)
      fail(table_pos, s.path, "required key is missing in [" + std::string(s.path.substr(0, s.path.rfind('.'))) + "]");
    return declared_default(s);
  }
  const SourcePos pos = pos_of(file, *n);
  switch (s.type) {
    case Type::String: return expand_env(**n->as_string(), pos, s.path, looks_secret(leaf(s.path)));
    case Type::Int: {
      const int64_t v = **n->as_integer();
      if (v < s.min || v > s.max)
        fail(pos, s.path, "must be between " + std::to_string(s.min) + " and " + std::to_string(s.max));
      return Value(std::in_place_type<int64_t>, v);
    }
    case Type::Bool: return Value(std::in_place_type<bool>, **n->as_boolean());
    case Type::Duration:
      return duration_of(s, *n, file, "expected a duration string such as \"250ms\", \"2s\", \"5m\", \"1h\"");
    case Type::DurationList: {
      std::vector<Millis> out;
      for (const auto& elem : *n->as_array())
        out.push_back(duration_of(s, elem, file, "expected a duration string such as \"10s\""));
      return out;
    }
    case Type::StringMap: {
      std::map<std::string, std::string> out;
      for (const auto& [k, v] : *n->as_table()) {
        const std::string key(k.str());
        out[key] = v.is_string() ? expand_env(**v.as_string(), pos_of(file, v), std::string(s.path) + "." + key,
                                              looks_secret(key))
                                 : scalar_text(v);
      }
      return out;
    }
    case Type::Section:
    case Type::SectionArray:
    case Type::Options: break;
  }
  throw std::logic_error("setting " + std::string(s.path) + " holds no value");
}

// Reads every bound setting in `scope` from table `t` into `target`: scope ""
// is the top-level sections of the document, "route" one [[route]] table.
void read_bound(const toml::table& t, std::string_view scope, const std::string& file, const SourcePos& t_pos,
                const Target& target) {
  for (const auto& s : settings()) {
    if (s.store == nullptr) continue;
    const bool in_route = s.path.substr(0, 6) == "route.";
    if (in_route == scope.empty()) continue;
    std::string_view rel = scope.empty() ? s.path : s.path.substr(scope.size() + 1);
    // Walk down the enclosing tables; where one is missing, so is the key.
    const toml::table* table = &t;
    SourcePos pos = t_pos;
    for (size_t dot = rel.find('.'); table != nullptr && dot != std::string_view::npos; dot = rel.find('.')) {
      const toml::node* sub = table->get(rel.substr(0, dot));
      table = sub != nullptr ? sub->as_table() : nullptr;
      if (sub != nullptr) pos = pos_of(file, *sub);
      rel.remove_prefix(dot + 1);
    }
    const toml::node* n = table != nullptr ? table->get(rel) : nullptr;
    s.store(target, read_value(s, n, file, pos));
  }
}

// Access to one validated table for the settings the code reads itself and
// for the positions of errors found across fields.
class Reader {
 public:
  Reader(const toml::table* t, std::string prefix, std::string file, SourcePos table_pos)
      : t_(t), prefix_(std::move(prefix)), file_(std::move(file)), table_pos_(std::move(table_pos)) {}

  std::string str(std::string_view key) const {
    return std::get<std::string>(read_value(decl(key), node(key), file_, table_pos_));
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
  std::string path(std::string_view key) const {
    return prefix_.empty() ? std::string(key) : prefix_ + "." + std::string(key);
  }

 private:
  const Setting& decl(std::string_view key) const {
    const Setting* s = find_setting(path(key));
    if (s == nullptr) throw std::logic_error("undeclared setting " + path(key));
    return *s;
  }
  const toml::table* t_;
  std::string prefix_;
  std::string file_;
  SourcePos table_pos_;
};

RouteConfig read_route(const toml::table& t, const std::string& file, const std::filesystem::path& base_dir) {
  const Reader r(&t, "route", file, pos_of(file, t));
  RouteConfig rc;
  rc.pos = r.table_pos();
  read_bound(t, "route", file, rc.pos, Target{nullptr, &rc});

  static const std::regex kName("[A-Za-z0-9_.-]{1,64}");
  if (!std::regex_match(rc.name, kName))
    fail(r.pos_of_key("name"), "route.name", "\"" + rc.name + "\" must be 1-64 characters of [A-Za-z0-9_.-]");
  if (rc.topic.empty()) fail(r.pos_of_key("topic"), "route.topic", "must not be empty");
  if (!rc.plugin.is_absolute()) rc.plugin = (base_dir / rc.plugin).lexically_normal();
  rc.plugin_pos = r.pos_of_key("plugin");
  rc.max_record_bytes_pos = r.pos_of_key("max_record_bytes");

  // Only the field `from` names is kept.
  const Reader key = r.sub("key");
  const std::string from = key.str("from");
  if (from == "key") {
    rc.key_source = KeySource::MessageKey;
    rc.key_header.clear();
    rc.key_json_path.clear();
  } else if (from == "header") {
    rc.key_source = KeySource::Header;
    rc.key_json_path.clear();
    if (rc.key_header.empty()) fail(key.table_pos(), "route.key.header", "required when from = \"header\"");
  } else if (from == "json") {
    rc.key_source = KeySource::JsonField;
    rc.key_header.clear();
    if (rc.key_json_path.empty()) fail(key.table_pos(), "route.key.json", "required when from = \"json\"");
  } else {
    fail(key.pos_of_key("from"), "route.key.from", "must be \"key\", \"header\" or \"json\", not \"" + from + "\"");
  }

  const Reader retry = r.sub("retry");
  if (rc.retry.backoff_max < rc.retry.backoff_initial)
    fail(retry.table_pos(), "route.retry.backoff_max", "must not be smaller than backoff_initial");

  const Reader circuit = r.sub("circuit");
  if (rc.circuit.probe_max < rc.circuit.probe_initial)
    fail(circuit.table_pos(), "route.circuit.probe_max", "must not be smaller than probe_initial");
  if (rc.circuit.min_calls > rc.circuit.window)
    fail(circuit.table_pos(), "route.circuit.min_calls", "must not be larger than window");

  const Reader rate_limit = r.sub("rate_limit");
  if (rc.rate_limit.scope != "group" && rc.rate_limit.scope != "host")
    fail(rate_limit.pos_of_key("scope"), "route.rate_limit.scope",
         "must be \"group\" or \"host\", got \"" + rc.rate_limit.scope + "\"");

  const Reader dlq = r.sub("dlq");
  if (rc.dlq.topic.empty()) rc.dlq.topic = rc.topic + ".dlq";
  if (rc.dlq.topic == rc.topic) fail(dlq.pos_of_key("topic"), "route.dlq.topic", "must differ from the source topic");

  if (const toml::node* opts = r.node("options")) {
    for (const auto& [k, v] : *opts->as_table()) {
      const std::string name(k.str());
      OptionValue ov;
      ov.pos = pos_of(file, v);
      ov.toml_type = v.is_string()    ? OptionValue::TomlType::String
                     : v.is_integer() ? OptionValue::TomlType::Integer
                     : v.is_boolean() ? OptionValue::TomlType::Boolean
                                      : OptionValue::TomlType::Float;
      ov.text = v.is_string() ? expand_env(**v.as_string(), ov.pos, "route.options." + name, looks_secret(name))
                              : scalar_text(v);
      rc.options.emplace(name, std::move(ov));
    }
  }
  return rc;
}

std::string default_host_id() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "idemsink";
  return buf;
}

// password_env, and the TLS settings checked against each other, for
// [database] or a route's [route.database] (`section`).
void finish_database(DatabaseConfig& d, const Reader& r, const std::string& section) {
  const toml::node* env_node = r.node("password_env");
  if (env_node != nullptr) {
    const std::string name = **env_node->as_string();
    const char* v = name.empty() ? "" : std::getenv(name.c_str());
    if (v == nullptr)
      fail(r.pos_of_key("password_env"), section + ".password_env", "environment variable " + name + " is not set");
    if (!name.empty()) d.password = v;
  }
  static const std::set<std::string> kTlsModes{"disabled", "preferred", "required", "verify"};
  if (!kTlsModes.count(d.tls_mode))
    fail(r.pos_of_key("tls_mode"), section + ".tls_mode", "must be one of disabled, preferred, required, verify");
  if (d.tls_mode == "verify" && d.tls_ca.empty())
    fail(r.pos_of_key("tls_mode"), section + ".tls_mode",
         "\"verify\" needs " + section + ".tls_ca: the CA the server's certificate must chain to");
  if (d.tls_cert.empty() != d.tls_key.empty())
    fail(r.pos_of_key(d.tls_cert.empty() ? "tls_key" : "tls_cert"), section + ".tls_cert",
         "tls_cert and tls_key go together");
  for (const auto& [key, path] : {std::pair<const char*, const std::string*>{"tls_ca", &d.tls_ca},
                                  {"tls_cert", &d.tls_cert},
                                  {"tls_key", &d.tls_key}}) {
    if (path->empty()) continue;
    if (d.tls_mode == "disabled")
      fail(r.pos_of_key(key), section + "." + key, "is set but " + section + ".tls_mode is \"disabled\"");
    if (!std::filesystem::is_regular_file(*path))
      fail(r.pos_of_key(key), section + "." + key, "no such file: " + *path);
  }
}

Config build(const toml::table& doc, const std::string& file, const std::filesystem::path& base_dir) {
  check_table(doc, "", file);
  const SourcePos top{file, 1, 1};
  if (!doc.contains("kafka")) fail(top, "kafka", "required section [kafka] is missing");
  if (!doc.contains("database")) fail(top, "database", "required section [database] is missing");
  if (!doc.contains("route")) fail(top, "route", "at least one [[route]] is required");

  Config c;
  c.file = file;
  read_bound(doc, "", file, top, Target{&c, nullptr});

  // Defaults that are not constants, and checks across fields.
  const Reader root(&doc, "", file, top);
  const Reader host = root.sub("host");
  if (c.host.id.empty()) c.host.id = default_host_id();
  if (c.host.id.size() > 96 || c.host.id.find('#') != std::string::npos)
    fail(host.pos_of_key("id"), "host.id", "must be at most 96 characters and contain no '#'");
  static const std::set<std::string> kLevels{"trace", "debug", "info", "warn", "error"};
  if (!kLevels.count(c.host.log_level))
    fail(host.pos_of_key("log_level"), "host.log_level", "must be one of trace, debug, info, warn, error");
  if (c.host.log_format != "text" && c.host.log_format != "json")
    fail(host.pos_of_key("log_format"), "host.log_format", "must be text or json, not \"" + c.host.log_format + "\"");
  if (!c.host.admin_listen.empty() && !parse_host_port(c.host.admin_listen))
    fail(host.pos_of_key("admin_listen"), "host.admin_listen",
         "must be an IP address and a port 0..65535 such as \"127.0.0.1:9464\" or \"[::1]:9464\", not \"" +
             c.host.admin_listen + "\"");

  const std::string token_env = host.str("admin_token_env");
  if (!token_env.empty()) {
    const char* v = std::getenv(token_env.c_str());
    if (v == nullptr || *v == '\0')
      fail(host.pos_of_key("admin_token_env"), "host.admin_token_env",
           "environment variable " + token_env + " is not set (or empty)");
    c.host.admin_token = v;
  }

  finish_database(c.database, root.sub("database"), "database");

  // A revocation waits up to shutdown_grace inside the rebalance callback,
  // where the consumer does not poll: past max.poll.interval.ms the group
  // evicts the member, and its rejoin rebalances everything again.
  int64_t max_poll_interval = 300000;  // the consumer's default (kafka/consumer.cc)
  for (const auto* props : {&c.kafka.properties, &c.kafka.consumer_properties}) {
    auto it = props->find("max.poll.interval.ms");
    if (it != props->end()) max_poll_interval = std::strtoll(it->second.c_str(), nullptr, 10);
  }
  constexpr int64_t kCloseAllowance = 5000;  // the commit and the rest of the callback
  if (c.host.shutdown_grace.count() + kCloseAllowance > max_poll_interval)
    fail(host.pos_of_key("shutdown_grace"), "host.shutdown_grace",
         std::to_string(c.host.shutdown_grace.count()) + "ms plus " + std::to_string(kCloseAllowance) +
             "ms to commit must stay below the consumer's max.poll.interval.ms (" + std::to_string(max_poll_interval) +
             "ms): a revocation waiting that long gets the host evicted from its group; lower shutdown_grace or "
             "raise max.poll.interval.ms in [kafka.consumer]");

  const Reader claim = root.sub("claim");
  if (c.claim.horizon_margin_days >= c.claim.retention_days)
    fail(claim.pos_of_key("horizon_margin_days"), "claim.horizon_margin_days", "must be smaller than retention_days");

  std::set<std::string> names, topics;
  for (const auto& elem : *doc.get("route")->as_array()) {
    RouteConfig rc = read_route(*elem.as_table(), file, base_dir);
    if (const toml::node* own = elem.as_table()->get("database")) {
      // Inherit [database], then apply what the route's table sets.
      Config scratch;
      scratch.database = c.database;
      const toml::table& t = *own->as_table();
      for (const auto& s : settings()) {
        if (s.store == nullptr || !s.path.starts_with("database.")) continue;
        if (const toml::node* n = t.get(s.path.substr(9)))
          s.store(Target{&scratch, nullptr}, read_value(s, n, file, pos_of(file, *own)));
      }

      finish_database(scratch.database, Reader(&t, "route.database", file, pos_of(file, *own)), "route.database");
      rc.database = std::move(scratch.database);
    }
    if (!names.insert(rc.name).second) fail(rc.pos, "route.name", "duplicate route name \"" + rc.name + "\"");
    if (!topics.insert(rc.topic).second)
      fail(rc.pos, "route.topic", "topic \"" + rc.topic + "\" already has a route (one route per topic)");
    c.routes.push_back(std::move(rc));
  }
  // What the relay publishes (a refused record's copy, a forward) carries up
  // to max_record_bytes of payload and the DLQ headers: the producer must
  // take it, or the row could never be published.
  constexpr int64_t kHeaderAllowance = 16384;
  int64_t message_max = 1000000;  // librdkafka's default
  for (const auto* props : {&c.kafka.properties, &c.kafka.producer_properties}) {
    auto it = props->find("message.max.bytes");
    if (it != props->end()) message_max = std::strtoll(it->second.c_str(), nullptr, 10);
  }
  for (const auto& rc : c.routes) {
    if ((rc.dlq.enabled || !rc.retry.topics.empty()) && rc.max_record_bytes + kHeaderAllowance > message_max)
      fail(rc.max_record_bytes_pos, "route.max_record_bytes",
           std::to_string(rc.max_record_bytes) + " bytes of payload plus " + std::to_string(kHeaderAllowance) +
               " of DLQ headers do not fit the producer's message.max.bytes (" + std::to_string(message_max) +
               "): lower it, or raise message.max.bytes in [kafka.producer] (and the broker's limit)");
    if (topics.count(rc.dlq.topic))
      fail(rc.pos, "route.dlq.topic", "DLQ topic \"" + rc.dlq.topic + "\" is the source topic of a route");
    for (size_t tier = 1; tier <= rc.retry.topics.size(); ++tier)
      if (topics.count(rc.retry.topic_name(rc.topic, tier)))
        fail(rc.pos, "route.retry.topics",
             "retry topic \"" + rc.retry.topic_name(rc.topic, tier) + "\" is the source topic of a route");
  }
  return c;
}

}  // namespace

std::vector<Config> split_by_database(const Config& cfg) {
  std::vector<Config> out;
  std::vector<std::string> ids;
  for (const auto& rc : cfg.routes) {
    const DatabaseConfig& db = cfg.database_of(rc);
    // One slice per database (schema on a server): two slices on one would
    // share the outbox and the claim table under one owner.
    const std::string id = db.label();
    size_t i = 0;
    while (i < ids.size() && ids[i] != id) ++i;
    if (i == ids.size()) {
      ids.push_back(id);
      Config slice = cfg;
      slice.database = db;
      slice.routes.clear();
      out.push_back(std::move(slice));
    }
    out[i].routes.push_back(rc);
  }
  return out;
}

namespace {

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

}  // namespace idemsink::config
