// The long-running host: loads plugins, prepares the schema, wires the
// database pool, the consumer, the DLQ producer, the engine and the admin
// server, and runs until SIGTERM/SIGINT, then drains and exits 0.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/plugin/plugin.h"

namespace idemsink::app {

/// Loads every route's plugin (each file once) and checks its options.
/// Throws plugin::LoadError or config::ConfigError.
std::vector<std::shared_ptr<plugin::Library>> load_route_plugins(const config::Config& cfg);

/// Core and plugin DDL, in order, for `schema print`.
std::vector<std::string> schema_statements(const config::Config& cfg,
                                           const std::vector<std::shared_ptr<plugin::Library>>& libs);

/// Applies the core schema (tables, partitions) and the plugins' DDL.
void apply_schema(const config::Config& cfg, const std::vector<std::shared_ptr<plugin::Library>>& libs);

/// Blocks SIGTERM and SIGINT in the calling thread (and the threads it
/// starts), from main() on: a host stopped while it starts must drain and
/// exit 0, not die of the signal. run_host() unblocks them once it catches
/// them.
void block_stop_signals();

/// Runs the host; returns the process exit code.
int run_host(const config::Config& cfg);

}  // namespace idemsink::app
