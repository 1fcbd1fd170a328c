#include "core/config/toml_reader.h"

#include <algorithm>
#include <sstream>
#include <variant>

namespace idemsink::config {

SourcePos pos_of(const std::string& file, const toml::node& n) {
  return SourcePos{file, n.source().begin.line, n.source().begin.column};
}

[[noreturn]] void fail(const SourcePos& pos, std::string_view key, const std::string& reason) {
  throw ConfigError(pos.where() + ": " + std::string(key) + ": " + reason);
}

namespace {

// The last part of a dotted path: "password" for "database.password".
std::string_view leaf(std::string_view path) { return path.substr(path.rfind('.') + 1); }

bool valid_env_name(std::string_view name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

}  // namespace

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

void check_table(const toml::table& t, const std::string& prefix, const std::string& file) {
  for (const auto& [k, node] : t) {
    const std::string key(k.str());
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    const Setting* s = find_setting(path);
    // [route.database] takes the keys of [database].
    if (s == nullptr && path.starts_with("route.database.")) s = find_setting(path.substr(6));
    // [route.schema_registry] takes the keys of [schema_registry].
    if (s == nullptr && path.starts_with("route.schema_registry.")) s = find_setting(path.substr(6));
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
      case Type::Condition:  // its content is read by read_condition (config_route.cc)
        if (!node.is_table()) fail(pos, path, "expected a table");
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
      case Type::Choice:
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

namespace {

// A duration string (expanded, parsed, within the setting's bounds).
Millis duration_of(const Setting& s, std::string_view key, const toml::node& n, const std::string& file,
                   const std::string& hint) {
  const SourcePos pos = pos_of(file, n);
  const std::optional<Millis> v = parse_duration(expand_env(**n.as_string(), pos, key, looks_secret(leaf(key))));
  if (!v) fail(pos, key, hint);
  if (v->count() < s.min || v->count() > s.max)
    fail(pos, key, "must be between " + std::to_string(s.min) + "ms and " + std::to_string(s.max) + "ms");
  return *v;
}

// One of a Choice setting's values (expanded).
std::string choice_of(const Setting& s, std::string_view key, const toml::node& n, const std::string& file) {
  const SourcePos pos = pos_of(file, n);
  std::string v = expand_env(**n.as_string(), pos, key, false);
  if (std::find(s.choices.begin(), s.choices.end(), v) != s.choices.end()) return v;
  std::string names;
  for (const std::string_view c : s.choices)
    if (!c.empty()) names += (names.empty() ? "" : ", ") + std::string(c);  // "" stands for leaving it out
  fail(pos, key, "must be one of " + names + "; not \"" + v + "\"");
}

Value declared_default(const Setting& s) {
  const std::string text(s.default_value);
  switch (s.type) {
    case Type::String:
    case Type::Choice: return text;
    case Type::Int: return Value(std::in_place_type<int64_t>, std::stoll(text));
    case Type::Bool: return Value(std::in_place_type<bool>, text == "true");
    case Type::Duration:
      if (const std::optional<Millis> d = parse_duration(text)) return *d;
      break;
    case Type::DurationList: return std::vector<Millis>{};
    case Type::StringMap: return std::map<std::string, std::string>{};
    case Type::Section:
    case Type::SectionArray:
    case Type::Options:
    case Type::Condition: break;
  }
  throw std::logic_error("setting " + std::string(s.path) + " has no usable default");
}

}  // namespace

Value read_value(const Setting& s, const toml::node* n, const std::string& file, const SourcePos& table_pos,
                 std::string_view as) {
  const std::string_view key = as.empty() ? s.path : as;
  if (n == nullptr) {
    if (s.required)
      fail(table_pos, key, "required key is missing in [" + std::string(key.substr(0, key.rfind('.'))) + "]");
    return declared_default(s);
  }
  const SourcePos pos = pos_of(file, *n);
  switch (s.type) {
    case Type::String: return expand_env(**n->as_string(), pos, key, looks_secret(leaf(key)));
    case Type::Choice: return choice_of(s, key, *n, file);
    case Type::Int: {
      const int64_t v = **n->as_integer();
      if (v < s.min || v > s.max)
        fail(pos, key, "must be between " + std::to_string(s.min) + " and " + std::to_string(s.max));
      return Value(std::in_place_type<int64_t>, v);
    }
    case Type::Bool: return Value(std::in_place_type<bool>, **n->as_boolean());
    case Type::Duration:
      return duration_of(s, key, *n, file, "expected a duration string such as \"250ms\", \"2s\", \"5m\", \"1h\"");
    case Type::DurationList: {
      std::vector<Millis> out;
      for (const auto& elem : *n->as_array())
        out.push_back(duration_of(s, key, elem, file, "expected a duration string such as \"10s\""));
      return out;
    }
    case Type::StringMap: {
      std::map<std::string, std::string> out;
      for (const auto& [k, v] : *n->as_table()) {
        const std::string name(k.str());
        out[name] = v.is_string() ? expand_env(**v.as_string(), pos_of(file, v), std::string(key) + "." + name,
                                               looks_secret(name))
                                  : scalar_text(v);
      }
      return out;
    }
    case Type::Section:
    case Type::SectionArray:
    case Type::Options:
    case Type::Condition: break;
  }
  throw std::logic_error("setting " + std::string(s.path) + " holds no value");
}

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

}  // namespace idemsink::config
