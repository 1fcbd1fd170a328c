// The declaration table behind config.h: one entry per setting (path,
// type, default, bounds, doc, and the field its value lands in). Loading,
// validation and the generated reference (conf/CONFIGURATION.md) all read
// it. Internal to core/config.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/config/config.h"

namespace idemsink::config {

// Choice: a string from a closed list, held as an enum (config.h's Choices).
enum class Type {
  String,
  Choice,
  Int,
  Bool,
  Duration,
  DurationList,
  Section,
  SectionArray,
  StringMap,
  Options,
  Condition
};

// One setting's value, read from the file or taken from its declared default.
using Value = std::variant<std::string, int64_t, bool, Millis, std::vector<Millis>, std::map<std::string, std::string>>;

// Where values are stored while loading: the Config for the top-level
// sections, the RouteConfig being read for route.* settings.
struct Target {
  Config* config;
  RouteConfig* route;
};

// Stores a value of the setting's type into the field the setting is bound to.
using Store = void (*)(const Target&, Value&&);

// One declared setting. `path` uses dots; "route" is the array of routes.
struct Setting {
  std::string_view path;
  Type type;
  std::string_view default_value;  // text form; "" with required=false means "unset"
  bool required;
  int64_t min;  // Int: value; Duration: milliseconds
  int64_t max;
  std::string_view doc;
  Store store;                                // null for sections and settings read by code
  std::string_view store_section;             // path of the section the bound field lives in
  std::span<const std::string_view> choices;  // Choice: the values the file may write, in the enum's order
};

/// Every declared setting, in file order.
std::span<const Setting> settings();
/// The setting at a dotted path, or null.
const Setting* find_setting(std::string_view path);
const char* type_name(Type t);

}  // namespace idemsink::config
