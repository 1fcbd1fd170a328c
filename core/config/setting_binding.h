// How a row of the settings table (settings.cc) binds to the field its
// value lands in: the section struct of each field, the setting type that
// follows from the field's C++ type, and the row builders `field<&S::m>()`
// and `declare()`. Included by settings.cc and settings_route.cc only.
#pragma once

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/config/config.h"
#include "core/config/settings.h"

namespace idemsink::config::binding {

// The struct holding each section's bound fields, and where to find it.
template <class S>
struct Section;
template <>
struct Section<HostConfig> {
  static constexpr std::string_view path = "host";
  static HostConfig& of(const Target& t) { return t.config->host; }
};
template <>
struct Section<KafkaConfig> {
  static constexpr std::string_view path = "kafka";
  static KafkaConfig& of(const Target& t) { return t.config->kafka; }
};
template <>
struct Section<OAuthConfig> {
  static constexpr std::string_view path = "kafka.oauth";
  static OAuthConfig& of(const Target& t) { return t.config->kafka.oauth; }
};
template <>
struct Section<SchemaRegistryConfig> {
  static constexpr std::string_view path = "schema_registry";
  static SchemaRegistryConfig& of(const Target& t) { return t.config->schema_registry; }
};
template <>
struct Section<DatabaseConfig> {
  static constexpr std::string_view path = "database";
  static DatabaseConfig& of(const Target& t) { return t.config->database; }
};
template <>
struct Section<ClaimConfig> {
  static constexpr std::string_view path = "claim";
  static ClaimConfig& of(const Target& t) { return t.config->claim; }
};
template <>
struct Section<RouteConfig> {
  static constexpr std::string_view path = "route";
  static RouteConfig& of(const Target& t) { return *t.route; }
};
template <>
struct Section<RetryConfig> {
  static constexpr std::string_view path = "route.retry";
  static RetryConfig& of(const Target& t) { return t.route->retry; }
};
template <>
struct Section<CircuitConfig> {
  static constexpr std::string_view path = "route.circuit";
  static CircuitConfig& of(const Target& t) { return t.route->circuit; }
};
template <>
struct Section<RateLimitConfig> {
  static constexpr std::string_view path = "route.rate_limit";
  static RateLimitConfig& of(const Target& t) { return t.route->rate_limit; }
};
template <>
struct Section<DlqConfig> {
  static constexpr std::string_view path = "route.dlq";
  static DlqConfig& of(const Target& t) { return t.route->dlq; }
};

template <>
struct Section<OutputConfig> {
  static constexpr std::string_view path = "route.output";
  static OutputConfig& of(const Target& t) { return t.route->output; }
};
template <>
struct Section<OrderByConfig> {
  static constexpr std::string_view path = "route.order_by";
  static OrderByConfig& of(const Target& t) { return t.route->order_by; }
};

template <class P>
struct MemberOf;
template <class S, class F>
struct MemberOf<F S::*> {
  using Struct = S;
  using Field = F;
};

// The setting type a field holds.
template <class F>
constexpr Type type_of() {
  if constexpr (std::is_same_v<F, std::string> || std::is_same_v<F, std::filesystem::path>) {
    return Type::String;
  } else if constexpr (std::is_enum_v<F>) {
    return Type::Choice;
  } else if constexpr (std::is_same_v<F, int> || std::is_same_v<F, int64_t>) {
    return Type::Int;
  } else if constexpr (std::is_same_v<F, bool>) {
    return Type::Bool;
  } else if constexpr (std::is_same_v<F, Millis>) {
    return Type::Duration;
  } else if constexpr (std::is_same_v<F, std::vector<Millis>>) {
    return Type::DurationList;
  } else {
    static_assert(std::is_same_v<F, std::map<std::string, std::string>>, "no setting type holds this field");
    return Type::StringMap;
  }
}

template <auto Member>
void store(const Target& t, Value&& v) {
  using F = typename MemberOf<decltype(Member)>::Field;
  auto& dst = Section<typename MemberOf<decltype(Member)>::Struct>::of(t).*Member;
  if constexpr (std::is_same_v<F, int>) {
    dst = static_cast<int>(std::get<int64_t>(v));  // within the declared bounds
  } else if constexpr (std::is_same_v<F, std::filesystem::path>) {
    dst = std::get<std::string>(std::move(v));
  } else if constexpr (std::is_enum_v<F>) {
    // read_value() let through only the declared choices
    const auto& names = Choices<F>::names;
    dst = static_cast<F>(std::find(std::begin(names), std::end(names), std::get<std::string>(v)) - std::begin(names));
  } else {
    dst = std::get<F>(std::move(v));
  }
}

// One row of the table, by name: what is left out is empty, false or 0.
struct Row {
  std::string_view path;
  std::string_view default_value = "";
  bool required = false;
  int64_t min = 0, max = 0;  // bounds of an integer (a duration: in milliseconds)
  std::string_view doc;
};

// A setting stored into `Member`; its type follows from the field's.
template <auto Member>
constexpr Setting field(Row r) {
  using M = MemberOf<decltype(Member)>;
  std::span<const std::string_view> choices;
  if constexpr (std::is_enum_v<typename M::Field>) choices = Choices<typename M::Field>::names;
  return Setting{r.path,         type_of<typename M::Field>(),      r.default_value, r.required, r.min, r.max, r.doc,
                 &store<Member>, Section<typename M::Struct>::path, choices};
}

// A section, or a setting the loading code reads itself.
constexpr Setting declare(Type type, Row r) {
  return Setting{r.path, type, r.default_value, r.required, r.min, r.max, r.doc, nullptr, {}, {}};
}

// Every bound setting lives under the section its field's struct stands for.
template <size_t N>
constexpr bool bindings_match_sections(const Setting (&table)[N]) {
  for (const auto& s : table) {
    // Bound settings are the ones with a section (comparing the function
    // pointer is not a constant expression in sanitizer builds).
    const std::string_view sec = s.store_section;
    if (sec.empty()) continue;
    if (s.path.size() <= sec.size() || s.path.substr(0, sec.size()) != sec || s.path[sec.size()] != '.') return false;
  }
  return true;
}

// Every choice's declared default is one of its choices.
template <size_t N>
constexpr bool defaults_are_choices(const Setting (&table)[N]) {
  for (const auto& s : table)
    if (s.type == Type::Choice && std::find(s.choices.begin(), s.choices.end(), s.default_value) == s.choices.end())
      return false;
  return true;
}

}  // namespace idemsink::config::binding

namespace idemsink::config::detail {

// The two parts of the declaration table, concatenated by settings().
std::span<const Setting> process_settings();  // settings.cc
std::span<const Setting> route_settings();    // settings_route.cc

}  // namespace idemsink::config::detail
