#include "core/format/registry.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "core/common/http_fetch.h"
#include "core/common/log.h"

namespace idemsink::format {
namespace {

using Json = nlohmann::json;

// The registry could not say (unreachable, slow, 5xx, a refused login, an
// answer that is not the registry's): whoever waits, waits on.
struct Unanswered : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One GET of the registry's API; the JSON answer, or nullopt for a 404 that
// the registry itself gave (its error_code 404xx: no such schema or version).
std::optional<Json> get(const config::SchemaRegistryConfig& cfg, const std::string& path) {
  HttpFetch req;
  try {
    req.url = parse_http_url(cfg.url + path);
  } catch (const std::exception& e) {
    throw Unanswered(cfg.url + ": " + e.what());
  }
  req.headers = {{"Accept", "application/vnd.schemaregistry.v1+json, application/json"}};
  if (!cfg.username.empty())
    req.headers.emplace_back("Authorization", "Basic " + base64_encode(cfg.username + ":" + cfg.password));
  if (!cfg.token.empty()) req.headers.emplace_back("Authorization", "Bearer " + cfg.token);
  req.tls_ca = cfg.tls_ca;
  req.timeout = cfg.timeout;
  HttpAnswer res;
  try {
    res = http_fetch(req);
  } catch (const std::exception& e) {
    throw Unanswered("GET " + cfg.url + path + ": " + e.what());
  }
  auto j = Json::parse(res.body, nullptr, false);
  if (res.status == 404 && !j.is_discarded() && j.is_object() && j.contains("error_code") &&
      j["error_code"].is_number_integer() && j["error_code"].get<int>() / 100 == 404)
    return std::nullopt;
  if (res.status != 200)
    throw Unanswered("GET " + cfg.url + path + ": HTTP " + std::to_string(res.status) +
                     (res.status == 401 || res.status == 403 ? " (the registry refused the host's credentials)"
                      : res.status == 404                    ? " (not the registry's API: check schema_registry.url)"
                                                             : ""));
  if (j.is_discarded() || !j.is_object() || !j.contains("schema") || !j["schema"].is_string())
    throw Unanswered("GET " + cfg.url + path + ": the answer is not a schema");
  return j;
}

// Every schema the answer references, deepest first, each once.
void collect_references(const config::SchemaRegistryConfig& cfg, const Json& answer,
                        std::vector<std::pair<std::string, std::string>>& out, int depth) {
  if (!answer.contains("references") || !answer["references"].is_array()) return;
  if (depth > 32) throw std::runtime_error("references nested more than 32 deep");
  for (const auto& ref : answer["references"]) {
    const std::string name = ref.value("name", "");
    if (std::any_of(out.begin(), out.end(), [&](const auto& r) { return r.first == name; })) continue;
    const std::string subject = ref.value("subject", "");
    const Json& v = ref.contains("version") ? ref["version"] : Json("latest");
    const std::string version = v.is_string() ? v.get<std::string>() : v.dump();
    auto sub = get(cfg, "/subjects/" + percent_encode(subject) + "/versions/" + percent_encode(version));
    if (!sub)
      throw std::runtime_error("reference " + name + " (subject " + subject + " version " + version + ") is unknown");
    collect_references(cfg, *sub, out, depth + 1);
    out.emplace_back(name, (*sub)["schema"].get<std::string>());
  }
}

}  // namespace

Registry::Registry(config::SchemaRegistryConfig cfg) : cfg_(std::move(cfg)), thread_([this] { run(); }) {}

Registry::~Registry() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::shared_ptr<const Schema> Registry::cached(int32_t id) const {
  std::lock_guard lk(mu_);
  auto it = cache_.find(id);
  if (it == cache_.end()) return nullptr;
  // "Unknown" may be a registry behind its leader, or one pointed at the
  // wrong place and corrected since: asked again after a minute.
  if (it->second->unknown && std::chrono::steady_clock::now() - it->second->fetched > std::chrono::minutes(1))
    return nullptr;
  return it->second;
}

void Registry::when_cached(int32_t id, std::function<void()> ready) {
  if (cached(id)) {
    ready();
    return;
  }
  // Cached meanwhile: the thread fetches it again, and answers.
  std::lock_guard lk(mu_);
  waiters_[id].push_back(std::move(ready));
  wake_.notify_all();
}

std::string Registry::problem() const {
  std::lock_guard lk(mu_);
  return problem_;
}

size_t Registry::waiting() const {
  std::lock_guard lk(mu_);
  return waiters_.size();
}

std::shared_ptr<Schema> Registry::load(int32_t id) {
  auto s = std::make_shared<Schema>();
  s->id = id;
  const auto answer = get(cfg_, "/schemas/ids/" + std::to_string(id));
  if (!answer) {
    s->error = "schema id " + std::to_string(id) + " is unknown to the registry (" + cfg_.url + ")";
    s->unknown = true;
    return s;
  }
  // Absent: Avro, the registry's first format.
  s->type = answer->contains("schemaType") && (*answer)["schemaType"].is_string()
                ? (*answer)["schemaType"].get<std::string>()
                : "AVRO";
  const std::string text = (*answer)["schema"].get<std::string>();
  try {
    std::vector<std::pair<std::string, std::string>> refs;
    collect_references(cfg_, *answer, refs, 0);
    if (s->type == "AVRO") {
      std::vector<std::string> texts;
      for (auto& r : refs) texts.push_back(std::move(r.second));
      s->avro = std::make_unique<AvroSchema>(text, texts);
    } else if (s->type == "PROTOBUF") {
      s->protobuf = std::make_unique<ProtobufSchema>(text, refs);
    } else if (s->type != "JSON") {
      s->error = "schema id " + std::to_string(id) + " is of type " + s->type + ", which the host does not read";
    }
  } catch (const Unanswered&) {
    throw;
  } catch (const std::exception& e) {
    s->error = "schema id " + std::to_string(id) + ": " + e.what();
  }
  return s;
}

std::shared_ptr<const Schema> Registry::fetch_now(int32_t id) {
  if (auto s = cached(id)) return s;
  auto s = load(id);
  std::lock_guard lk(mu_);
  return cache_[id] = std::move(s);
}

namespace {

using Clock = std::chrono::steady_clock;

// Where one schema id's fetching is: when it is asked next, and how long
// after that if it fails again.
struct Attempt {
  Clock::time_point due;
  std::chrono::milliseconds backoff{1000};
  bool seen_unknown = false;
};

// The waited-for id due first, and when; an id not asked yet is due now.
std::pair<int32_t, Clock::time_point> first_due(const std::map<int32_t, std::vector<std::function<void()>>>& waiters,
                                                std::map<int32_t, Attempt>& attempts) {
  int32_t id = 0;
  auto due = Clock::time_point::max();
  for (const auto& [waiting, _] : waiters) {
    const auto at = attempts.try_emplace(waiting, Attempt{Clock::now()}).first->second.due;
    if (at < due) {
      due = at;
      id = waiting;
    }
  }
  return {id, due};
}

}  // namespace

// One id at a time, the one due first: an id that keeps failing backs off
// on its own (1 s doubling to 30 s) and never holds up the others.
void Registry::run() {
  std::map<int32_t, Attempt> attempts;
  std::unique_lock lk(mu_);
  for (;;) {
    wake_.wait(lk, [&] { return stopping_ || !waiters_.empty(); });
    if (stopping_) return;
    const auto [id, due] = first_due(waiters_, attempts);
    if (due > Clock::now()) {
      wake_.wait_until(lk, due, [&] { return stopping_; });
      continue;
    }
    lk.unlock();
    std::shared_ptr<Schema> schema;
    std::string problem;
    try {
      schema = load(id);
    } catch (const std::exception& e) {
      problem = e.what();
    }
    Attempt& attempt = attempts[id];
    // The first "unknown" is asked again once: a registry follower may not
    // have the id its leader just gave the producer.
    if (schema && schema->unknown && !attempt.seen_unknown) {
      attempt.seen_unknown = true;
      attempt.due = Clock::now() + std::chrono::seconds(2);
      lk.lock();
      continue;
    }
    lk.lock();
    if (!schema) {
      if (up_.exchange(false) || problem_ != problem)
        spdlog::warn("schema registry: {}; records needing schema id {} wait, asked again in {}s", problem, id,
                     attempt.backoff.count() / 1000);
      problem_ = problem;
      attempt.due = Clock::now() + attempt.backoff;
      attempt.backoff = std::min(attempt.backoff * 2, std::chrono::milliseconds(30000));
      continue;
    }
    if (!up_.exchange(true)) spdlog::info("schema registry: {} answers again", cfg_.url);
    problem_.clear();
    attempts.erase(id);
    if (!schema->error.empty()) spdlog::error("schema registry: {}", schema->error);
    schema->fetched = Clock::now();
    cache_[id] = schema;
    auto ready = std::move(waiters_[id]);
    waiters_.erase(id);
    lk.unlock();
    for (auto& f : ready) f();
    lk.lock();
  }
}

Registry& Registries::of(const config::SchemaRegistryConfig& cfg) {
  for (auto& r : registries_)
    if (r->config() == cfg) return *r;
  return *registries_.emplace_back(std::make_unique<Registry>(cfg));
}

Registry* Registries::for_route(const config::RouteConfig& route) {
  if (!config::in_registry(route.value_format) && !config::in_registry(route.key_format)) return nullptr;
  return &of(route.schema_registry);
}

std::vector<const Registry*> Registries::all() const {
  std::vector<const Registry*> out;
  for (const auto& r : registries_) out.push_back(r.get());
  return out;
}

}  // namespace idemsink::format
