// Host configuration: the typed result of reading and validating a TOML file.
//
// Every setting is declared once in settings.cc or, a route's, in
// settings_route.cc (name, field, default, bounds, doc). Loading rejects unknown keys and bad values with an error
// naming the file, line and key; conf/CONFIGURATION.md is generated from the same table. The structs below carry no
// defaults of their own: a default-constructed one is zero/empty, and only loading fills in the declared defaults.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/common/log_settings.h"
#include "core/common/util.h"

namespace idemsink::config {

/// A config file problem, already formatted as "file:line:col: key: reason".
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Where a value came from, to point errors found after loading (for example
/// a handler option the plugin rejects) at the right line.
struct SourcePos {
  std::string file;
  uint32_t line = 0;
  uint32_t column = 0;
  std::string where() const;  // "file:line:col"
};

/// database.tls_mode: no TLS, TLS if the server offers it, TLS required, or
/// TLS with the server's certificate checked against tls_ca.
enum class TlsMode { Disabled, Preferred, Required, Verify };
/// route.rate_limit.scope: the rate is the consumer group's, shared among its
/// hosts, or each host's own.
enum class RateScope { Group, Host };
/// route.start_at: where a route in a new consumer group begins; Unset
/// follows the consumer's auto.offset.reset.
enum class StartAt { Unset, Earliest, Latest };
/// route.order_by.on_dead: a dead record lets its entity's later records go
/// on, or holds them until a person settles it.
enum class OnDead { GoOn, Hold };

/// The settings whose value is one of a closed list hold an enum. `names`
/// are the values as the file writes them, in the enum's order; the settings
/// table takes its choices from here.
template <class E>
struct Choices;
template <>
struct Choices<LogLevel> {
  static constexpr std::string_view names[] = {"trace", "debug", "info", "warn", "error"};
};
template <>
struct Choices<LogFormat> {
  static constexpr std::string_view names[] = {"text", "json"};
};
template <>
struct Choices<TlsMode> {
  static constexpr std::string_view names[] = {"disabled", "preferred", "required", "verify"};
};
template <>
struct Choices<RateScope> {
  static constexpr std::string_view names[] = {"group", "host"};
};
template <>
struct Choices<StartAt> {
  static constexpr std::string_view names[] = {"", "earliest", "latest"};  // "": left unset
};
template <>
struct Choices<OnDead> {
  static constexpr std::string_view names[] = {"go_on", "hold"};
};
/// A choice as the file writes it: "verify" for TlsMode::Verify.
template <class E>
constexpr std::string_view choice_name(E e) {
  return Choices<E>::names[static_cast<size_t>(e)];
}

/// Who may use the admin port, and for what (admin/auth.h).
struct AdminToken {
  std::string name;                 // shown in the operator log
  std::string role;                 // viewer, operator or admin
  std::vector<std::string> routes;  // an operator's routes; empty: all
  std::string secret;               // never logged
};

struct HostConfig {
  std::string id;       // stable identity; owner prefix of claims
  int max_in_flight{};  // handler calls in flight, all routes
  int max_buffered_records{};
  Millis shutdown_grace{};
  LogLevel log_level{};
  LogFormat log_format{};
  std::string log_file;      // "" = stderr
  std::string admin_listen;  // "" = no admin HTTP server
  std::string admin_token;   // from the variable host.admin_token_env names; "" = none; never logged
  std::string admin_tokens_file;
  std::vector<AdminToken> admin_tokens;  // read from admin_tokens_file, and admin_token as "admin"
  std::string admin_tls_cert;            // PEM files: the admin port speaks HTTPS
  std::string admin_tls_key;
  bool admin_open_probes{};     // /metrics, /livez, /readyz need no token
  std::string admin_hostnames;  // names the port answers to besides IP literals and localhost (comma-separated)
};

/// [kafka.oauth]: SASL/OAUTHBEARER with tokens the host fetches itself
/// (OAuth 2.0 client credentials): librdkafka 2.0.2 as Debian builds it has
/// no OIDC of its own (no libcurl).
struct OAuthConfig {
  std::string token_endpoint;  // empty: not used
  std::string client_id;
  std::string client_secret;  // from client_secret_env or client_secret_file; never logged
  std::string scope;
  std::string principal;  // empty: the token's "sub", else client_id
  std::string tls_ca;     // PEM CAs the endpoint's certificate must chain to; empty: the system's
  Millis timeout{};
  bool enabled() const { return !token_endpoint.empty(); }
};

/// [schema_registry] (or a route's own [route.schema_registry]): a
/// Confluent-compatible schema registry the avro, protobuf and json_schema
/// formats fetch writer schemas from, by id (docs/formats.md).
struct SchemaRegistryConfig {
  std::string url;       // empty: none
  std::string username;  // basic auth, with password
  std::string password;  // from password_env; never logged
  std::string token;     // bearer, from token_env; never logged
  std::string tls_ca;    // PEM CAs the registry's certificate must chain to; empty: the system's
  Millis timeout{};
  bool enabled() const { return !url.empty(); }
  bool operator==(const SchemaRegistryConfig&) const = default;
};

/// How a record's value (or key) is written: JSON text, the Confluent wire
/// format with a schema in the registry (avro, protobuf, json_schema), or
/// opaque (string, bytes).
enum class Format { Json, Avro, Protobuf, JsonSchema, String, Bytes };
std::string_view to_string(Format f);
/// Whether the format is the Confluent wire format (a schema id in the registry).
inline bool in_registry(Format f) { return f == Format::Avro || f == Format::Protobuf || f == Format::JsonSchema; }

struct KafkaConfig {
  std::string bootstrap_servers;
  std::string group_id;
  int max_poll_records{};
  Millis poll_timeout{};
  Millis commit_interval{};
  Millis stall_timeout{};
  std::map<std::string, std::string> properties;           // both clients
  std::map<std::string, std::string> consumer_properties;  // consumer only
  std::map<std::string, std::string> producer_properties;  // DLQ producer only
  OAuthConfig oauth;
};

struct DatabaseConfig {
  std::string host;
  int port{};
  std::string socket;
  std::string user;
  std::string password;  // resolved from password or password_env; never logged
  std::string database;
  int pool_size{};
  Millis connect_timeout{};
  Millis reconnect_backoff_max{};
  Millis job_give_up_after{};
  TlsMode tls_mode{};
  std::string tls_ca;    // PEM file of the CA(s) that signed the server's certificate
  std::string tls_cert;  // client certificate (PEM), with tls_key
  std::string tls_key;

  /// "<schema>@<host>:<port>" or "<schema>@<socket>": names the database in metrics and logs.
  std::string label() const { return database + "@" + (socket.empty() ? host + ":" + std::to_string(port) : socket); }
};

struct ClaimConfig {
  Millis lease{};
  Millis wait_recheck{};
  int retention_days{};
  int horizon_margin_days{};
  Millis max_future_skew{};
  bool apply_schema{};
  bool derived_tokens{};
  int max_takeovers{};
  Millis flush_linger{};
  Millis stuck_after{};
  Millis reconcile_interval{};
  Millis reconcile_after{};  // 0: per route, see Config::reconcile_after
  Millis unknown_dlq_after{};
  Millis outbox_retention{};
  Millis maintenance_interval{};
};

enum class KeySource { MessageKey, Header, JsonField };

struct RetryConfig {
  int max_attempts{};
  Millis backoff_initial{};
  Millis backoff_max{};
  /// Delayed retry topics: empty = retry in place. Otherwise a failed call
  /// forwards the record to "<topic>.retry.N" to be retried after topics[N-1].
  std::vector<Millis> topics;
  /// What the tiers' names start with: "<topic>", or "<topic>.<route>" for a
  /// route sharing its topic with others (each its own retry topics).
  std::string stem;
  std::string topic_name(size_t tier) const { return stem + ".retry." + std::to_string(tier); }
};

/// Route health: when most of a route's recent calls fail retryable or
/// uncertain, its circuit opens (see pipeline/circuit_breaker.h).
struct CircuitConfig {
  bool enabled{};
  int window{};           // the last N calls that ended
  int failure_percent{};  // open at this share of failures in the window...
  int min_calls{};        // ...once at least this many calls ended
  Millis probe_initial{};
  Millis probe_max{};
  Millis max_wait{};  // a record's failures count again after waiting this long (0: never)
};

/// [route.rate_limit]: calls started per period (0: no limit), shared by
/// the group in proportion to the partitions each host owns (see
/// pipeline/rate_limiter.h), or per host.
struct RateLimitConfig {
  int64_t rate{};
  Millis per{};
  int64_t burst{};  // 0: one period's worth
  RateScope scope{};
  Millis max_hold{};  // the longest Retry-After honoured
};

struct DlqConfig {
  bool enabled{};
  std::string topic;  // loading defaults it to "<topic>.dlq"
};

/// [route.output]: an event published for each record's outcome, written to
/// the outbox in the transaction that records the outcome (done always; failed
/// and unknown when asked), so it is published exactly once in effect.
struct OutputConfig {
  std::string topic;  // empty: no events
  bool include_failed{};
  bool include_unknown{};
  bool enabled() const { return !topic.empty(); }
};

/// [route.order_by]: an ordering key (the entity) besides the biz_key.
/// Records of one entity are called one at a time in offset order, and wait
/// for an earlier one that is still unfinished (see pipeline/key_queue.h and
/// claim/order_hold.h).
struct OrderByConfig {
  std::string from;  // "key", "header" or "json"; empty: no ordering beyond the biz_key
  KeySource source{};
  std::string header;
  std::string json_path;
  OnDead on_dead{};
  int64_t max_waiting = 10000;  // records waiting for holds, kept apart from the host's buffer
  bool enabled() const { return !from.empty(); }
  /// An earlier record of the entity that ended failed or unknown keeps
  /// holding the later ones until a person settles it.
  bool hold_on_dead() const { return on_dead == OnDead::Hold; }
};

/// [route.when]: which records a route takes, decided from the record alone
/// (deterministic: every host and every re-read decides the same). A test of
/// one thing of the record, or all / any / not of other conditions.
struct Condition {
  enum class Kind { Test, All, Any, Not } kind = Kind::Test;
  std::vector<Condition> parts;  // All, Any: one or more; Not: exactly one
  /// Test: what of the record is looked at.
  enum class Subject { Json, Header, Key } subject = Subject::Key;
  std::string name;  // Json: a dotted field path; Header: its name
  /// Test: what it must be. A JSON field compares by its text: a string as
  /// itself, a number or boolean as written ("42", "true").
  enum class Test { Equals, OneOf, StartsWith, Exists, Absent } test = Test::Exists;
  std::vector<std::string> values;  // Equals, StartsWith: one; OneOf: one or more
  SourcePos pos;
  /// Whether deciding it needs the value as JSON.
  bool needs_json() const;
  /// The condition as written, for logs: json "type" equals "order.paid".
  std::string describe() const;
};

/// A handler option as written in [route.options]; typed against the
/// plugin's declarations when the plugin is loaded.
struct OptionValue {
  enum class TomlType { String, Integer, Float, Boolean } toml_type;
  std::string text;  // the value as text (strings after ${} expansion, numbers in decimal)
  SourcePos pos;
};

struct RouteConfig {
  std::string name;  // claim namespace
  std::string topic;
  /// The consumer group reading the route's topics (kafka.group_id unless
  /// set): routes of one topic need groups of their own, each with its own
  /// offsets, lag and rebalances, as Kafka Connect's connectors do.
  std::string group_id;
  StartAt start_at{};
  /// The other routes reading the same topic (in groups of their own).
  std::vector<std::string> topic_siblings;
  bool shares_topic_with(std::string_view route) const {
    for (const auto& s : topic_siblings)
      if (s == route) return true;
    return false;
  }
  std::filesystem::path plugin;
  SourcePos plugin_pos;
  KeySource key_source{};  // MessageKey
  std::string key_header;
  std::string key_json_path;  // dotted path, e.g. "order.id"
  int concurrency{};          // 0 = only the host-wide cap
  Millis call_timeout{};
  bool payload_check{};
  int64_t max_record_bytes{};
  SourcePos max_record_bytes_pos;
  RetryConfig retry;
  CircuitConfig circuit;
  RateLimitConfig rate_limit;
  DlqConfig dlq;
  OutputConfig output;
  OrderByConfig order_by;
  /// [route.database]: this route's own database (every key inherited from
  /// [database] unless set); empty: the route uses [database].
  std::optional<DatabaseConfig> database;
  std::optional<Condition> when;  // none: every record
  /// [route.value] and [route.key_format]: how the value and the key are
  /// written; downstream of decoding everything sees them as JSON.
  Format value_format = Format::Json;
  Format key_format = Format::String;
  /// The registry of a route with a registry format ([schema_registry],
  /// with what [route.schema_registry] sets).
  SchemaRegistryConfig schema_registry;
  std::map<std::string, OptionValue> options;
  SourcePos pos;

  /// Retry tier `tier` (1, 2, ...)'s topic.
  std::string retry_topic(size_t tier) const { return retry.topic_name(tier); }
  /// The route's own topic and its retry topics: what its consumer reads.
  std::vector<std::string> topics() const {
    std::vector<std::string> out{topic};
    for (size_t tier = 1; tier <= retry.topics.size(); ++tier) out.push_back(retry_topic(tier));
    return out;
  }
};

struct Config {
  std::filesystem::path file;
  HostConfig host;
  KafkaConfig kafka;
  DatabaseConfig database;
  ClaimConfig claim;
  SchemaRegistryConfig schema_registry;
  std::vector<RouteConfig> routes;

  const RouteConfig* route_for_topic(const std::string& topic) const;
  const RouteConfig* route_by_name(const std::string& name) const;
  /// The database holding the route's claims, outbox and local_tx writes.
  const DatabaseConfig& database_of(const RouteConfig& route) const {
    return route.database ? *route.database : database;
  }
  /// How long after a call began its outcome may be asked about: claim.reconcile_after,
  /// or the route's call_timeout plus 10s.
  Millis reconcile_after(const RouteConfig& route) const {
    return claim.reconcile_after.count() > 0 ? claim.reconcile_after : route.call_timeout + Millis(10000);
  }
};

/// The config split by database: one Config per distinct database the
/// routes use, with that database as [database] and only its routes, in the
/// order the routes first name them. One element when no route has its own.
/// Routes naming one database (schema, host and port, or socket) share a
/// slice with the settings of the first (user, pool size, TLS).
std::vector<Config> split_by_database(const Config& cfg);

/// Reads and validates a config file. Throws ConfigError.
Config load_file(const std::filesystem::path& path);

/// Same, from the text read from `path` (relative paths resolve beside it).
Config load_text(const std::string& text, const std::filesystem::path& path);

/// Same, from text (`name` is used in error messages).
Config load_string(const std::string& text, const std::string& name);

/// Markdown reference of every setting, generated from the declarations.
std::string reference_markdown();

}  // namespace idemsink::config
