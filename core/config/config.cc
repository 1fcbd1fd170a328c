#include "core/config/config.h"

#include "core/config/sections.h"
#include "core/config/settings.h"
#include "core/config/toml_reader.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <toml++/toml.h>

namespace idemsink::config {
namespace {

std::string default_host_id() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "idemsink";
  return buf;
}

// The first line of a file only its owner may read: an OAuth client secret.
std::string secret_from_file(const std::string& path, const SourcePos& pos) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    fail(pos, "kafka.oauth.client_secret_file", "cannot read " + path);
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    fail(pos, "kafka.oauth.client_secret_file",
         path + " may be read by others than its owner (mode " + mode + "): chmod 600 it");
  }
  std::ifstream in(path);
  std::string secret;
  std::getline(in, secret);
  while (!secret.empty() && std::isspace(static_cast<unsigned char>(secret.back()))) secret.pop_back();
  if (secret.empty()) fail(pos, "kafka.oauth.client_secret_file", path + " holds no secret");
  return secret;
}

// [kafka.oauth]: the client secret from the environment or from a file
// only its owner can read (never from the config file), and what the login
// needs besides.
void finish_oauth(KafkaConfig& k, const Reader& kafka) {
  const Reader r = kafka.sub("oauth");
  OAuthConfig& o = k.oauth;
  if (r.node("token_endpoint") == nullptr) {
    for (const char* key : {"client_id", "client_secret_env", "client_secret_file", "scope", "principal", "tls_ca"})
      if (r.node(key) != nullptr) fail(r.pos_of_key(key), "kafka.oauth.token_endpoint", "is required in [kafka.oauth]");
    return;
  }
  if (o.token_endpoint.rfind("https://", 0) != 0 && o.token_endpoint.rfind("http://", 0) != 0)
    fail(r.pos_of_key("token_endpoint"), "kafka.oauth.token_endpoint", "must be an https:// (or http://) URL");
  if (o.client_id.empty())
    fail(r.pos_of_key("token_endpoint"), "kafka.oauth.client_id", "is required in [kafka.oauth]");
  const toml::node* env = r.node("client_secret_env");
  const toml::node* file = r.node("client_secret_file");
  if (env != nullptr && file != nullptr)
    fail(r.pos_of_key("client_secret_file"), "kafka.oauth.client_secret_file",
         "set one of client_secret_env and client_secret_file, not both");
  if (env == nullptr && file == nullptr)
    fail(r.pos_of_key("token_endpoint"), "kafka.oauth.client_secret_env",
         "a client secret is required: client_secret_env (a variable's name) or client_secret_file");
  if (env != nullptr) {
    const std::string name = **env->as_string();
    const char* v = name.empty() ? nullptr : std::getenv(name.c_str());
    if (v == nullptr || *v == '\0')
      fail(r.pos_of_key("client_secret_env"), "kafka.oauth.client_secret_env",
           "environment variable " + name + " is not set");
    o.client_secret = v;
  } else {
    o.client_secret = secret_from_file(**file->as_string(), r.pos_of_key("client_secret_file"));
  }
  if (!o.tls_ca.empty() && !std::filesystem::is_regular_file(o.tls_ca))
    fail(r.pos_of_key("tls_ca"), "kafka.oauth.tls_ca", "no such file: " + o.tls_ca);
  // The login this section is for, and not librdkafka's test tokens too.
  const auto prop = [&k](const std::string& name) {
    auto it = k.properties.find(name);
    return it == k.properties.end() ? std::string() : it->second;
  };
  std::string mech = prop("sasl.mechanisms").empty() ? prop("sasl.mechanism") : prop("sasl.mechanisms");
  for (auto& ch : mech) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (mech != "OAUTHBEARER")
    fail(r.pos_of_key("token_endpoint"), "kafka.oauth",
         "needs \"sasl.mechanisms\" = \"OAUTHBEARER\" in [kafka.properties] (it is \"" + mech + "\")");
  if (prop("enable.sasl.oauthbearer.unsecure.jwt") == "true")
    fail(r.pos_of_key("token_endpoint"), "kafka.oauth",
         "cannot go with \"enable.sasl.oauthbearer.unsecure.jwt\" = \"true\" (librdkafka's own test tokens)");
}

// host.admin_tokens_file: `NAME ROLE ROUTES SECRET` per line (admin/auth.h).
// An error names the file and line; never the secret.
void read_admin_tokens(HostConfig& h, const SourcePos& setting) {
  std::ifstream in(h.admin_tokens_file);
  if (!in) fail(setting, "host.admin_tokens_file", "cannot read " + h.admin_tokens_file);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t") != std::string::npos && line[line.find_first_not_of(" \t")] == '#')
      continue;  // a comment line (a secret may hold '#')
    std::istringstream words(line);
    std::string name, role, routes, secret, extra;
    if (!(words >> name)) continue;  // blank or a comment
    const std::string where = h.admin_tokens_file + ":" + std::to_string(n);
    if (!(words >> role >> routes >> secret) || (words >> extra))
      fail(setting, "host.admin_tokens_file", where + ": expected NAME ROLE ROUTES SECRET");
    if (role != "viewer" && role != "operator" && role != "admin")
      fail(setting, "host.admin_tokens_file", where + ": role must be viewer, operator or admin, not \"" + role + "\"");
    if (secret.starts_with("env:")) {
      const char* v = std::getenv(secret.substr(4).c_str());
      if (v == nullptr || *v == '\0')
        fail(setting, "host.admin_tokens_file", where + ": environment variable " + secret.substr(4) + " is not set");
      secret = v;
    }
    if (secret.size() < 16)
      fail(setting, "host.admin_tokens_file", where + ": the secret is shorter than 16 characters");
    for (const auto& t : h.admin_tokens)
      if (t.name == name) fail(setting, "host.admin_tokens_file", where + ": token name " + name + " is used twice");
    for (const auto& t : h.admin_tokens)
      if (t.secret == secret) fail(setting, "host.admin_tokens_file", where + ": the secret of " + t.name + " again");
    if (role == "admin" && routes != "*")
      fail(setting, "host.admin_tokens_file", where + ": an admin acts on every route: ROUTES must be *");
    AdminToken t{name, role, {}, secret};
    if (routes != "*") {
      // An empty list means every route to the role check, so a list that
      // names none (",", "a,,b") is a mistake, never a grant of all.
      std::istringstream list(routes);
      for (std::string r; std::getline(list, r, ',');) {
        if (r.empty())
          fail(setting, "host.admin_tokens_file",
               where + ": ROUTES \"" + routes + "\" has an empty name (a comma-separated list, or * for every route)");
        t.routes.push_back(r);
      }
      if (t.routes.empty() || routes.back() == ',')
        fail(setting, "host.admin_tokens_file",
             where + ": ROUTES \"" + routes + "\" names no route (a comma-separated list, or * for every route)");
    }
    h.admin_tokens.push_back(std::move(t));
  }
}

// host.*: the defaults that are not constants, and the checks the settings
// table cannot make.
void finish_host(HostConfig& h, const Reader& host) {
  if (h.id.empty()) h.id = default_host_id();
  if (h.id.size() > 96 || h.id.find('#') != std::string::npos)
    fail(host.pos_of_key("id"), "host.id", "must be at most 96 characters and contain no '#'");
  if (!h.admin_listen.empty() && !parse_host_port(h.admin_listen))
    fail(host.pos_of_key("admin_listen"), "host.admin_listen",
         "must be an IP address and a port 0..65535 such as \"127.0.0.1:9464\" or \"[::1]:9464\", not \"" +
             h.admin_listen + "\"");
  const std::string token_env = host.str("admin_token_env");
  if (!token_env.empty()) {
    const char* v = std::getenv(token_env.c_str());
    if (v == nullptr || *v == '\0')
      fail(host.pos_of_key("admin_token_env"), "host.admin_token_env",
           "environment variable " + token_env + " is not set (or empty)");
    h.admin_token = v;
    h.admin_tokens.push_back({"admin", "admin", {}, v});
  }
  if (!h.admin_tokens_file.empty()) read_admin_tokens(h, host.pos_of_key("admin_tokens_file"));
  if (h.admin_tls_cert.empty() != h.admin_tls_key.empty())
    fail(host.pos_of_key(h.admin_tls_cert.empty() ? "admin_tls_key" : "admin_tls_cert"), "host.admin_tls_cert",
         "admin_tls_cert and admin_tls_key go together");
  for (const auto& [key, path] : {std::pair<const char*, const std::string*>{"admin_tls_cert", &h.admin_tls_cert},
                                  {"admin_tls_key", &h.admin_tls_key}})
    if (!path->empty() && !std::filesystem::is_regular_file(*path))
      fail(host.pos_of_key(key), std::string("host.") + key, "no such file: " + *path);
}

// A revocation waits up to shutdown_grace inside the rebalance callback,
// where the consumer does not poll: past max.poll.interval.ms the group
// evicts the member, and its rejoin rebalances everything again.
void check_shutdown_grace(const Config& c, const Reader& host) {
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
}

}  // namespace

namespace detail {

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
  if (d.tls_mode == TlsMode::Verify && d.tls_ca.empty())
    fail(r.pos_of_key("tls_mode"), section + ".tls_mode",
         "\"verify\" needs " + section + ".tls_ca: the CA the server's certificate must chain to");
  if (d.tls_cert.empty() != d.tls_key.empty())
    fail(r.pos_of_key(d.tls_cert.empty() ? "tls_key" : "tls_cert"), section + ".tls_cert",
         "tls_cert and tls_key go together");
  for (const auto& [key, path] : {std::pair<const char*, const std::string*>{"tls_ca", &d.tls_ca},
                                  {"tls_cert", &d.tls_cert},
                                  {"tls_key", &d.tls_key}}) {
    if (path->empty()) continue;
    if (d.tls_mode == TlsMode::Disabled)
      fail(r.pos_of_key(key), section + "." + key, "is set but " + section + ".tls_mode is \"disabled\"");
    if (!std::filesystem::is_regular_file(*path))
      fail(r.pos_of_key(key), section + "." + key, "no such file: " + *path);
  }
}

// The secrets of [schema_registry] (or a route's own), from the
// environment, and the URL and CA checked.
void finish_registry(SchemaRegistryConfig& g, const Reader& r, const std::string& section) {
  for (const auto& [key, target] :
       {std::pair<const char*, std::string*>{"password_env", &g.password}, {"token_env", &g.token}}) {
    const toml::node* n = r.node(key);
    if (n == nullptr) continue;
    const std::string name = **n->as_string();
    const char* v = name.empty() ? nullptr : std::getenv(name.c_str());
    if (v == nullptr) fail(r.pos_of_key(key), section + "." + key, "environment variable " + name + " is not set");
    *target = v;
  }
  if (!g.token.empty() && !g.username.empty())
    fail(r.pos_of_key("token_env"), section + ".token_env", "basic auth (username) or a bearer token, not both");
  if (!g.password.empty() && g.username.empty())
    fail(r.pos_of_key("password_env"), section + ".username", "is required with password_env");
  if (!g.url.empty()) {
    if (g.url.rfind("https://", 0) != 0 && g.url.rfind("http://", 0) != 0)
      fail(r.pos_of_key("url"), section + ".url", "must be an http:// or https:// URL, not \"" + g.url + "\"");
    while (g.url.size() > 8 && g.url.back() == '/') g.url.pop_back();
  }
  if (!g.tls_ca.empty() && !std::filesystem::is_regular_file(g.tls_ca))
    fail(r.pos_of_key("tls_ca"), section + ".tls_ca", "no such file: " + g.tls_ca);
}

}  // namespace detail

namespace {

using detail::check_publishing;
using detail::finish_database;
using detail::finish_registry;
using detail::read_routes;

Config build(const toml::table& doc, const std::string& file, const std::filesystem::path& base_dir) {
  check_table(doc, "", file);
  const SourcePos top{file, 1, 1};
  if (!doc.contains("kafka")) fail(top, "kafka", "required section [kafka] is missing");
  if (!doc.contains("database")) fail(top, "database", "required section [database] is missing");
  if (!doc.contains("route")) fail(top, "route", "at least one [[route]] is required");

  Config c;
  c.file = file;
  read_bound(doc, "", file, top, Target{&c, nullptr});
  const Reader root(&doc, "", file, top);
  finish_host(c.host, root.sub("host"));
  finish_database(c.database, root.sub("database"), "database");
  finish_oauth(c.kafka, root.sub("kafka"));
  finish_registry(c.schema_registry, root.sub("schema_registry"), "schema_registry");
  check_shutdown_grace(c, root.sub("host"));
  const Reader claim = root.sub("claim");
  if (c.claim.horizon_margin_days >= c.claim.retention_days)
    fail(claim.pos_of_key("horizon_margin_days"), "claim.horizon_margin_days", "must be smaller than retention_days");
  read_routes(doc, c, file, base_dir);
  check_publishing(c);
  for (const auto& t : c.host.admin_tokens)
    for (const auto& r : t.routes)
      if (c.route_by_name(r) == nullptr)
        fail(root.sub("host").pos_of_key("admin_tokens_file"), "host.admin_tokens_file",
             "token " + t.name + " names route " + r + ", which the config does not have");
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
  return load_text(ss.str(), path);
}

Config load_text(const std::string& text, const std::filesystem::path& path) {
  return parse(text, path.string(), std::filesystem::absolute(path).parent_path());
}

Config load_string(const std::string& text, const std::string& name) {
  return parse(text, name, std::filesystem::current_path());
}

}  // namespace idemsink::config
