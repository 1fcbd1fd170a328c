// Private to config/: the config file's sections read into a Config,
// shared by config.cc (the whole file) and config_route.cc (its [[route]]
// tables). Each throws ConfigError naming the file, line and key.
#pragma once

#include <filesystem>
#include <string>

#include <toml++/toml.h>

#include "core/config/config.h"
#include "core/config/toml_reader.h"

namespace idemsink::config::detail {

/// [database] (or a route's own) checked, its password from the environment.
void finish_database(DatabaseConfig& d, const Reader& r, const std::string& section);
/// [schema_registry] (or a route's own): secrets from the environment, URL and CA checked.
void finish_registry(SchemaRegistryConfig& g, const Reader& r, const std::string& section);
/// Every [[route]] of `doc` into `c.routes`, each with its database and registry.
void read_routes(const toml::table& doc, Config& c, const std::string& file, const std::filesystem::path& base_dir);
/// What the relay publishes fits the producer and never lands on a consumed topic.
void check_publishing(const Config& c);

}  // namespace idemsink::config::detail
