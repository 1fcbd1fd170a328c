// A Confluent-compatible schema registry, asked for writer schemas by id
// (GET /schemas/ids/{id}, references through /subjects/{s}/versions/{v}).
// An id never changes its schema, so what is fetched is kept for the
// process's life. Fetching runs on a thread of its own: the engine thread
// never waits for the registry. While the registry cannot be reached (or
// refuses the host's credentials) a schema is asked again, 1 s doubling to
// 30 s, and whoever waits for it waits on; only an answer about the id itself
// (unknown, asked twice; or a schema that does not parse) ends the wait
// with an error. An id is asked one at a time, each backing off on its own.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/config/config.h"
#include "core/format/avro.h"
#include "core/format/protobuf.h"

namespace idemsink::format {

/// One schema as the registry gave it, parsed; or why it cannot serve.
struct Schema {
  int32_t id = 0;
  std::string type;  // AVRO, PROTOBUF or JSON
  std::unique_ptr<AvroSchema> avro;
  std::unique_ptr<ProtobufSchema> protobuf;
  std::string error;     // set: the id is unknown, or its schema does not parse
  bool unknown = false;  // the registry does not know the id (kept a minute only)
  std::chrono::steady_clock::time_point fetched = std::chrono::steady_clock::now();
};

class Registry {
 public:
  explicit Registry(config::SchemaRegistryConfig cfg);
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  /// The schema, when fetched; thread-safe.
  std::shared_ptr<const Schema> cached(int32_t id) const;
  /// Calls `ready` (on the registry's thread) once the schema is cached,
  /// found or found wanting; at once if it is.
  void when_cached(int32_t id, std::function<void()> ready);
  /// Fetches on the calling thread, waiting as long as it takes (offline
  /// commands); throws when the registry cannot be reached.
  std::shared_ptr<const Schema> fetch_now(int32_t id);

  /// Whether the last request reached the registry and was answered (not a
  /// connection failure, a time-out, a 5xx or a refused login).
  bool up() const { return up_.load(); }
  /// Why it is not up, for /readyz.
  std::string problem() const;
  /// Schemas waited for now.
  size_t waiting() const;
  const config::SchemaRegistryConfig& config() const { return cfg_; }

 private:
  std::shared_ptr<Schema> load(int32_t id);
  void run();

  const config::SchemaRegistryConfig cfg_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::map<int32_t, std::shared_ptr<Schema>> cache_;
  std::map<int32_t, std::vector<std::function<void()>>> waiters_;
  std::string problem_;
  std::atomic<bool> up_{true};
  bool stopping_ = false;
  std::thread thread_;
};

/// Registries by their settings: routes naming the same registry share one.
class Registries {
 public:
  Registry& of(const config::SchemaRegistryConfig& cfg);
  /// The registry the route's value or key format reads from; none when
  /// neither format is in a registry.
  Registry* for_route(const config::RouteConfig& route);
  std::vector<const Registry*> all() const;

 private:
  std::vector<std::unique_ptr<Registry>> registries_;
};

}  // namespace idemsink::format
