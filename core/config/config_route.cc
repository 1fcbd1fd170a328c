// The [[route]] tables of a config file: each route's key, condition,
// formats, retry and DLQ, its own database and registry, and the checks
// across routes (names, groups, the topics the relay publishes to).
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <string_view>
#include <utility>

#include "core/config/config.h"
#include "core/config/sections.h"
#include "core/config/settings.h"
#include "core/config/toml_reader.h"

namespace idemsink::config {
namespace {

using detail::finish_database;
using detail::finish_registry;

// Where a key comes from ([route.key] or [route.order_by]): only the field
// `from` names is kept.
KeySource key_source(const Reader& section, const std::string& path, const std::string& from, std::string& header,
                     std::string& json_path) {
  if (from == "key") {
    header.clear();
    json_path.clear();
    return KeySource::MessageKey;
  }
  if (from == "header") {
    json_path.clear();
    if (header.empty()) fail(section.table_pos(), path + ".header", "required when from = \"header\"");
    return KeySource::Header;
  }
  if (from == "json") {
    header.clear();
    if (json_path.empty()) fail(section.table_pos(), path + ".json", "required when from = \"json\"");
    return KeySource::JsonField;
  }
  fail(section.pos_of_key("from"), path + ".from", "must be \"key\", \"header\" or \"json\", not \"" + from + "\"");
}

Condition read_condition(const toml::table& t, const std::string& path, const std::string& file);

// A non-empty string at `key` of a condition.
std::string condition_text(const toml::table& t, std::string_view key, const std::string& path,
                           const std::string& file) {
  const toml::node& n = *t.get(key);
  if (!n.is_string() || n.as_string()->get().empty())
    fail(pos_of(file, n), path + "." + std::string(key), "expected a non-empty string");
  return n.as_string()->get();
}

// all = [...], any = [...] or not = {...}: `key` says which.
Condition read_combination(Condition c, const toml::table& t, std::string_view key, const std::string& path,
                           const std::string& file) {
  const std::string where = path + "." + std::string(key);
  const toml::node& n = *t.get(key);
  if (key == "not") {
    if (!n.is_table()) fail(pos_of(file, n), where, "expected a condition (a table)");
    c.kind = Condition::Kind::Not;
    c.parts.push_back(read_condition(*n.as_table(), where, file));
    return c;
  }
  c.kind = key == "all" ? Condition::Kind::All : Condition::Kind::Any;
  if (!n.is_array() || n.as_array()->empty())
    fail(pos_of(file, n), where, "expected a list of one or more conditions ([{ ... }, { ... }])");
  for (const auto& elem : *n.as_array()) {
    if (!elem.is_table()) fail(pos_of(file, elem), where, "expected a condition (a table)");
    c.parts.push_back(read_condition(*elem.as_table(), where, file));
  }
  return c;
}

// What a test looks at: json = "field.path", header = "name" or key = true.
void read_subject(Condition& c, const toml::table& t, const std::string& path, const std::string& file) {
  if (t.get("json") != nullptr) {
    c.subject = Condition::Subject::Json;
    c.name = condition_text(t, "json", path, file);
    if (c.name.front() == '.' || c.name.back() == '.' || c.name.find("..") != std::string::npos)
      fail(pos_of(file, *t.get("json")), path + ".json", "\"" + c.name + "\" is not a dotted field path (a.b.c)");
  } else if (t.get("header") != nullptr) {
    c.subject = Condition::Subject::Header;
    c.name = condition_text(t, "header", path, file);
  } else {
    const toml::node& n = *t.get("key");
    if (!n.is_boolean() || !n.as_boolean()->get())
      fail(pos_of(file, n), path + ".key", "write key = true to test the record's Kafka key");
    c.subject = Condition::Subject::Key;
  }
}

// What a test says of it: equals, starts_with, one_of or exists.
void read_test(Condition& c, const toml::table& t, const std::string& path, const std::string& file) {
  if (t.get("equals") != nullptr) {
    c.test = Condition::Test::Equals;
    c.values.push_back(condition_text(t, "equals", path, file));
  } else if (t.get("starts_with") != nullptr) {
    c.test = Condition::Test::StartsWith;
    c.values.push_back(condition_text(t, "starts_with", path, file));
  } else if (t.get("one_of") != nullptr) {
    c.test = Condition::Test::OneOf;
    const toml::node& n = *t.get("one_of");
    if (!n.is_array() || n.as_array()->empty())
      fail(pos_of(file, n), path + ".one_of", "expected a list of one or more strings");
    for (const auto& elem : *n.as_array()) {
      if (!elem.is_string()) fail(pos_of(file, elem), path + ".one_of", "expected strings");
      c.values.push_back(elem.as_string()->get());
    }
  } else {
    const toml::node& n = *t.get("exists");
    if (!n.is_boolean()) fail(pos_of(file, n), path + ".exists", "expected true or false");
    c.test = n.as_boolean()->get() ? Condition::Test::Exists : Condition::Test::Absent;
  }
}

// [route.when] and its parts: one test (a subject and what it must be), or
// all / any / not of other conditions; every mistake named with its key.
Condition read_condition(const toml::table& t, const std::string& path, const std::string& file) {
  Condition c;
  c.pos = pos_of(file, t);
  static const std::set<std::string> kKeys = {"all", "any",    "not",    "json",        "header",
                                              "key", "equals", "one_of", "starts_with", "exists"};
  for (const auto& [k, v] : t)
    if (!kKeys.count(std::string(k.str())))
      fail(pos_of(file, v), path + "." + std::string(k.str()),
           "unknown key in a condition (a test: json, header or key with equals, one_of, starts_with or exists; or "
           "all, any, not)");
  const auto combined = [&](std::string_view key) { return t.get(key) != nullptr; };
  const int combinators = combined("all") + combined("any") + combined("not");
  const int subjects = combined("json") + combined("header") + combined("key");
  const int tests = combined("equals") + combined("one_of") + combined("starts_with") + combined("exists");
  if (combinators > 1 || (combinators == 1 && subjects + tests > 0))
    fail(c.pos, path, "a condition is all, any, not, or one test, never several at once");
  if (combinators == 1)
    return read_combination(std::move(c), t, combined("all") ? "all" : combined("any") ? "any" : "not", path, file);
  if (subjects != 1)
    fail(c.pos, path, "a test names one thing of the record: json = \"field.path\", header = \"name\" or key = true");
  if (tests != 1) fail(c.pos, path, "a test says one thing of it: equals, one_of, starts_with or exists");
  read_subject(c, t, path, file);
  read_test(c, t, path, file);
  return c;
}

Format read_format(const Reader& section, const std::string& path) {
  const std::string text = section.str("format");
  for (Format f : {Format::Json, Format::Avro, Format::Protobuf, Format::JsonSchema, Format::String, Format::Bytes})
    if (text == to_string(f)) return f;
  fail(section.pos_of_key("format"), path,
       "must be json, avro, protobuf, json_schema, string or bytes, not \"" + text + "\"");
}

// What reads a value as JSON cannot read one the route says is opaque.
void check_formats(const RouteConfig& rc, const Reader& r) {
  if (rc.value_format != Format::String && rc.value_format != Format::Bytes) return;
  const std::string why = std::string("the value format is ") + std::string(to_string(rc.value_format)) +
                          ", which has no fields (route.value.format)";
  if (rc.key_source == KeySource::JsonField)
    fail(r.sub("key").pos_of_key("json"), "route.key.json", "a json path cannot be read: " + why);
  if (rc.order_by.source == KeySource::JsonField)
    fail(r.sub("order_by").pos_of_key("json"), "route.order_by.json", "a json path cannot be read: " + why);
  if (rc.when && rc.when->needs_json()) fail(rc.when->pos, "route.when", "a json test cannot be decided: " + why);
}

// [route.order_by]: where an entity's key comes from.
void read_order_by(OrderByConfig& ob, const Reader& order_by) {
  if (ob.from.empty()) fail(order_by.table_pos(), "route.order_by.from", "required in [route.order_by]");
  ob.source = key_source(order_by, "route.order_by", ob.from, ob.header, ob.json_path);
}

// [route.retry] and [route.circuit]: the bounds one setting puts on another.
void check_limits(const RouteConfig& rc, const Reader& r) {
  const Reader retry = r.sub("retry");
  if (rc.retry.backoff_max < rc.retry.backoff_initial)
    fail(retry.table_pos(), "route.retry.backoff_max", "must not be smaller than backoff_initial");

  const Reader circuit = r.sub("circuit");
  if (rc.circuit.probe_max < rc.circuit.probe_initial)
    fail(circuit.table_pos(), "route.circuit.probe_max", "must not be smaller than probe_initial");
  if (rc.circuit.min_calls > rc.circuit.window)
    fail(circuit.table_pos(), "route.circuit.min_calls", "must not be larger than window");
}

// [route.options]: the handler's options as written (strings with ${ENV}
// expanded), checked against the plugin's declarations later.
std::map<std::string, OptionValue> read_options(const toml::table& opts, const std::string& file) {
  std::map<std::string, OptionValue> out;
  for (const auto& [k, v] : opts) {
    const std::string name(k.str());
    OptionValue ov;
    ov.pos = pos_of(file, v);
    ov.toml_type = v.is_string()    ? OptionValue::TomlType::String
                   : v.is_integer() ? OptionValue::TomlType::Integer
                   : v.is_boolean() ? OptionValue::TomlType::Boolean
                                    : OptionValue::TomlType::Float;
    ov.text = v.is_string() ? expand_env(**v.as_string(), ov.pos, "route.options." + name, looks_secret(name))
                            : scalar_text(v);
    out.emplace(name, std::move(ov));
  }
  return out;
}

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

  const Reader key = r.sub("key");
  rc.key_source = key_source(key, "route.key", key.str("from"), rc.key_header, rc.key_json_path);
  if (r.node("order_by") != nullptr) read_order_by(rc.order_by, r.sub("order_by"));
  check_limits(rc, r);

  const Reader dlq = r.sub("dlq");
  if (rc.dlq.topic.empty()) rc.dlq.topic = rc.topic + ".dlq";
  if (rc.dlq.topic == rc.topic) fail(dlq.pos_of_key("topic"), "route.dlq.topic", "must differ from the source topic");

  if (const toml::node* when = r.node("when")) rc.when = read_condition(*when->as_table(), "route.when", file);
  const Reader value = r.sub("value"), key_format = r.sub("key_format");
  rc.value_format = read_format(value, "route.value.format");
  rc.key_format = read_format(key_format, "route.key_format.format");
  check_formats(rc, r);

  if (const toml::node* opts = r.node("options")) rc.options = read_options(*opts->as_table(), file);
  return rc;
}

// A route's registry: [schema_registry], then what [route.schema_registry]
// sets; required when a format of the route is in the registry.
SchemaRegistryConfig route_registry(const SchemaRegistryConfig& inherited, const toml::table& route,
                                    const RouteConfig& rc, const std::string& file) {
  Config scratch;
  scratch.schema_registry = inherited;
  const Reader r(&route, "route", file, rc.pos);
  if (const toml::node* own = route.get("schema_registry")) {
    const toml::table& t = *own->as_table();
    for (const auto& s : settings()) {
      if (s.store == nullptr || !s.path.starts_with("schema_registry.")) continue;
      if (const toml::node* n = t.get(s.path.substr(16)))
        s.store(Target{&scratch, nullptr}, read_value(s, n, file, pos_of(file, *own), "route." + std::string(s.path)));
    }
    finish_registry(scratch.schema_registry, r.sub("schema_registry"), "route.schema_registry");
  }
  for (const auto& [format, section] : {std::pair{rc.value_format, "value"}, {rc.key_format, "key_format"}})
    if (in_registry(format) && !scratch.schema_registry.enabled())
      fail(r.sub(section).pos_of_key("format"), std::string("route.") + section + ".format",
           std::string(to_string(format)) +
               " needs a schema registry: [schema_registry] url (or the route's [route.schema_registry])");
  return std::move(scratch.schema_registry);
}

// A route's own [route.database]: [database] inherited, then what the
// route's table sets.
DatabaseConfig route_database(const DatabaseConfig& inherited, const toml::node& own, const std::string& file) {
  Config scratch;
  scratch.database = inherited;
  const toml::table& t = *own.as_table();
  for (const auto& s : settings()) {
    if (s.store == nullptr || !s.path.starts_with("database.")) continue;
    if (const toml::node* n = t.get(s.path.substr(9)))
      s.store(Target{&scratch, nullptr}, read_value(s, n, file, pos_of(file, own), "route." + std::string(s.path)));
  }
  finish_database(scratch.database, Reader(&t, "route.database", file, pos_of(file, own)), "route.database");
  return std::move(scratch.database);
}

}  // namespace

namespace detail {

// Every [[route]]: one name each; several may read one topic, each in a
// consumer group of its own (two in one group would split the topic's
// partitions between them, each route seeing a part of its records), and
// each then with retry topics of its own.
void read_routes(const toml::table& doc, Config& c, const std::string& file, const std::filesystem::path& base_dir) {
  std::set<std::string> names;
  std::map<std::pair<std::string, std::string>, std::string> reader;  // (topic, group) -> route
  for (const auto& elem : *doc.get("route")->as_array()) {
    RouteConfig rc = read_route(*elem.as_table(), file, base_dir);
    const Reader route(elem.as_table(), "route", file, rc.pos);
    if (const toml::node* own = elem.as_table()->get("database")) rc.database = route_database(c.database, *own, file);
    rc.schema_registry = route_registry(c.schema_registry, *elem.as_table(), rc, file);
    if (!names.insert(rc.name).second) fail(rc.pos, "route.name", "duplicate route name \"" + rc.name + "\"");
    if (rc.group_id.empty()) rc.group_id = c.kafka.group_id;
    if (auto [it, fresh] = reader.try_emplace({rc.topic, rc.group_id}, rc.name); !fresh)
      fail(route.pos_of_key(route.node("group_id") ? "group_id" : "topic"), "route.group_id",
           "routes " + it->second + " and " + rc.name + " both read topic \"" + rc.topic + "\" in consumer group \"" +
               rc.group_id +
               "\": each route of a topic needs a group of its own, or they would split its "
               "partitions. The route that read the topic before keeps \"" +
               rc.group_id + "\" (its committed offsets and its retry topics " + rc.topic +
               ".retry.N); give the new one a group of its own: group_id = \"" + rc.group_id + "." + rc.name +
               "\" if " + rc.name + " is new, \"" + rc.group_id + "." + it->second + "\" if " + it->second +
               " is (and start_at)");
    // The route reading its topic in kafka.group_id keeps the retry topics a
    // topic's route always had; a route in a group of its own gets its own,
    // named after it. So adding a route never renames another's retry
    // topics (the records waiting there would be nobody's).
    rc.retry.stem = rc.group_id == c.kafka.group_id ? rc.topic : rc.topic + "." + rc.name;
    c.routes.push_back(std::move(rc));
  }
  // Each route knows the others of its topic: a replayed copy meant for one
  // of them is not its own.
  for (auto& rc : c.routes)
    for (const auto& other : c.routes)
      if (other.topic == rc.topic && other.name != rc.name) rc.topic_siblings.push_back(other.name);
}

// What the relay publishes (a refused record's copy, a forward) carries up
// to max_record_bytes of payload and the DLQ headers: the producer must take
// it, or the row could never be published. Nor may it publish to a topic a
// route consumes.
void check_publishing(const Config& c) {
  constexpr int64_t kHeaderAllowance = 16384;
  int64_t message_max = 1000000;  // librdkafka's default
  for (const auto* props : {&c.kafka.properties, &c.kafka.producer_properties}) {
    auto it = props->find("message.max.bytes");
    if (it != props->end()) message_max = std::strtoll(it->second.c_str(), nullptr, 10);
  }
  std::set<std::string> topics, retry_topics;
  for (const auto& rc : c.routes) topics.insert(rc.topic);
  for (const auto& rc : c.routes)
    for (size_t tier = 1; tier <= rc.retry.topics.size(); ++tier)
      if (!retry_topics.insert(rc.retry_topic(tier)).second)
        fail(rc.pos, "route.retry.topics", "retry topic \"" + rc.retry_topic(tier) + "\" is another route's too");
  for (const auto& rc : c.routes) {
    if ((rc.dlq.enabled || !rc.retry.topics.empty()) && rc.max_record_bytes + kHeaderAllowance > message_max)
      fail(rc.max_record_bytes_pos, "route.max_record_bytes",
           std::to_string(rc.max_record_bytes) + " bytes of payload plus " + std::to_string(kHeaderAllowance) +
               " of DLQ headers do not fit the producer's message.max.bytes (" + std::to_string(message_max) +
               "): lower it, or raise message.max.bytes in [kafka.producer] (and the broker's limit)");
    if (topics.count(rc.dlq.topic))
      fail(rc.pos, "route.dlq.topic", "DLQ topic \"" + rc.dlq.topic + "\" is the source topic of a route");
    if (retry_topics.count(rc.dlq.topic))
      fail(rc.pos, "route.dlq.topic", "DLQ topic \"" + rc.dlq.topic + "\" is a route's retry topic");
    for (size_t tier = 1; tier <= rc.retry.topics.size(); ++tier)
      if (topics.count(rc.retry_topic(tier)))
        fail(rc.pos, "route.retry.topics",
             "retry topic \"" + rc.retry_topic(tier) + "\" is the source topic of a route");
    // Events read back as records would make events of their own.
    if (rc.output.enabled() && (topics.count(rc.output.topic) || retry_topics.count(rc.output.topic)))
      fail(rc.pos, "route.output.topic",
           "output topic \"" + rc.output.topic + "\" is the source or retry topic of a route");
    if (rc.output.enabled() && rc.output.topic == rc.dlq.topic)
      fail(rc.pos, "route.output.topic", "output topic \"" + rc.output.topic + "\" is the route's DLQ topic");
  }
}

}  // namespace detail

std::string_view to_string(Format f) {
  switch (f) {
    case Format::Json: return "json";
    case Format::Avro: return "avro";
    case Format::Protobuf: return "protobuf";
    case Format::JsonSchema: return "json_schema";
    case Format::String: return "string";
    case Format::Bytes: return "bytes";
  }
  return "?";
}

bool Condition::needs_json() const {
  if (kind == Kind::Test) return subject == Subject::Json;
  return std::any_of(parts.begin(), parts.end(), [](const Condition& p) { return p.needs_json(); });
}

std::string Condition::describe() const {
  const auto list = [&](const char* word) {
    std::string out = std::string(word) + "(";
    for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i].describe();
    return out + ")";
  };
  switch (kind) {
    case Kind::All: return list("all");
    case Kind::Any: return list("any");
    case Kind::Not: return "not " + parts.at(0).describe();
    case Kind::Test: break;
  }
  std::string out = subject == Subject::Json     ? "json \"" + name + "\""
                    : subject == Subject::Header ? "header \"" + name + "\""
                                                 : "key";
  switch (test) {
    case Test::Equals: return out + " equals \"" + values.at(0) + "\"";
    case Test::StartsWith: return out + " starts with \"" + values.at(0) + "\"";
    case Test::Exists: return out + " exists";
    case Test::Absent: return out + " is absent";
    case Test::OneOf: {
      out += " is one of [";
      for (size_t i = 0; i < values.size(); ++i) out += (i ? ", \"" : "\"") + values[i] + "\"";
      return out + "]";
    }
  }
  return out;
}

}  // namespace idemsink::config
