#include "core/config/settings.h"

#include <filesystem>
#include <sstream>
#include <type_traits>

namespace idemsink::config {
namespace {

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
  } else {
    dst = std::get<F>(std::move(v));
  }
}

// A setting stored into `Member`; its type follows from the field's.
template <auto Member>
constexpr Setting field(std::string_view path, std::string_view default_value, bool required, int64_t min, int64_t max,
                        std::string_view doc) {
  using M = MemberOf<decltype(Member)>;
  return Setting{path,           type_of<typename M::Field>(),     default_value, required, min, max, doc,
                 &store<Member>, Section<typename M::Struct>::path};
}

// A section, or a setting the loading code reads itself.
constexpr Setting declare(std::string_view path, Type type, std::string_view default_value, bool required, int64_t min,
                          int64_t max, std::string_view doc) {
  return Setting{path, type, default_value, required, min, max, doc, nullptr, {}};
}

// The single declaration table: validation, defaults, bounds, the fields
// values land in and the generated reference all come from here.
constexpr Setting kSettings[] = {
    declare("host", Type::Section, "", false, 0, 0, "This host process."),
    field<&HostConfig::id>(
        "host.id", "", false, 0, 0,
        "Stable identity of this host (default: the machine's hostname). Claims are owned by `<id>#<run>`: a host "
        "restarted with the same id takes over its own leases at once instead of waiting for them to expire. Two live "
        "hosts must never share an id."),
    field<&HostConfig::max_in_flight>(
        "host.max_in_flight", "2000", false, 1, 100000,
        "Handler calls in flight at once, all routes together (Little's law: rate x latency)."),
    field<&HostConfig::max_buffered_records>(
        "host.max_buffered_records", "20000", false, 1, 10000000,
        "Consumed records not yet durable; above it fetching pauses (the consumer stays in the group)."),
    field<&HostConfig::shutdown_grace>(
        "host.shutdown_grace", "30s", false, 0, 3600000,
        "On SIGTERM or partition revocation: how long in-flight calls may finish before the host lets go."),
    field<&HostConfig::log_level>("host.log_level", "info", false, 0, 0, "trace, debug, info, warn or error."),
    field<&HostConfig::log_format>(
        "host.log_format", "text", false, 0, 0,
        "text, or json: one object per line with time, level, thread, message and, where a line is about a "
        "record, route, topic, partition, offset, biz_key (printable) and idem_token."),
    field<&HostConfig::log_file>("host.log_file", "", false, 0, 0,
                                 "Where `idemsink run` writes its log; empty = stderr (the service manager's "
                                 "journal). SIGHUP reopens it, for logrotate."),
    field<&HostConfig::admin_listen>(
        "host.admin_listen", "", false, 0, 0,
        "Address of the admin HTTP server (/metrics, /status, pause/resume): an IP address and a port, e.g. "
        "\"127.0.0.1:9464\" or \"[::1]:9464\"; empty = off."),
    declare("host.admin_token_env", Type::String, "", false, 0, 0,
            "Name of an environment variable holding a bearer token: POST requests (pause, resume) must carry "
            "`Authorization: Bearer <token>`. Without it, POST is accepted only when admin_listen is a loopback "
            "address. GET /metrics, /status and /healthz never need it."),

    declare("kafka", Type::Section, "", true, 0, 0, "The Kafka cluster and consumer group."),
    field<&KafkaConfig::bootstrap_servers>("kafka.bootstrap_servers", "", true, 0, 0,
                                           "Comma-separated host:port list."),
    field<&KafkaConfig::group_id>("kafka.group_id", "idemsink", false, 0, 0,
                                  "Consumer group; all hosts of one deployment share it."),
    field<&KafkaConfig::max_poll_records>("kafka.max_poll_records", "500", false, 1, 100000,
                                          "Records taken per poll and claimed as one batch."),
    field<&KafkaConfig::poll_timeout>("kafka.poll_timeout", "100ms", false, 1, 60000,
                                      "How long one poll waits for records."),
    field<&KafkaConfig::commit_interval>("kafka.commit_interval", "1s", false, 10, 600000,
                                         "How often durable offsets are committed (also on revoke and shutdown)."),
    field<&KafkaConfig::stall_timeout>(
        "kafka.stall_timeout", "30s", false, 1000, 3600000,
        "A partition that should be fetching and is behind the end of the partition (its last stable offset), yet "
        "receives no record for this long, is stalled: logged, counted and read again from where it stands."),
    field<&KafkaConfig::properties>("kafka.properties", "", false, 0, 0,
                                    "librdkafka properties for both clients (security.protocol, sasl.*, ...)."),
    field<&KafkaConfig::consumer_properties>(
        "kafka.consumer", "", false, 0, 0,
        "librdkafka properties for the consumer only (session.timeout.ms, partition.assignment.strategy, ...). "
        "enable.auto.commit and enable.auto.offset.store are always false, isolation.level is read_committed."),
    field<&KafkaConfig::producer_properties>(
        "kafka.producer", "", false, 0, 0,
        "librdkafka properties for the DLQ producer only. enable.idempotence=true and acks=all are always set."),

    declare("database", Type::Section, "", true, 0, 0, "The business MariaDB holding the claim table."),
    field<&DatabaseConfig::host>("database.host", "127.0.0.1", false, 0, 0, "Server host (TCP)."),
    field<&DatabaseConfig::port>("database.port", "3306", false, 1, 65535, "Server port."),
    field<&DatabaseConfig::socket>("database.socket", "", false, 0, 0,
                                   "Unix socket path; when set, used instead of host/port."),
    field<&DatabaseConfig::user>("database.user", "root", false, 0, 0, "User name."),
    field<&DatabaseConfig::password>("database.password", "", false, 0, 0,
                                     "Password (prefer password_env). Never logged."),
    declare("database.password_env", Type::String, "", false, 0, 0,
            "Name of an environment variable holding the password; it must be set when this is."),
    field<&DatabaseConfig::database>("database.database", "", true, 0, 0, "Schema (database) name."),
    field<&DatabaseConfig::pool_size>("database.pool_size", "4", false, 2, 64, "Connections, one worker thread each."),
    field<&DatabaseConfig::connect_timeout>("database.connect_timeout", "5s", false, 100, 600000,
                                            "Connect timeout per attempt."),
    field<&DatabaseConfig::job_give_up_after>(
        "database.job_give_up_after", "1m", false, 1000, 86400000,
        "A job failing for another reason than a lost connection (an unexpected server error) is retried this long, "
        "then given up: its records are released, never wedged. A lost connection is waited out however long."),
    field<&DatabaseConfig::tls_mode>(
        "database.tls_mode", "disabled", false, 0, 0,
        "TLS to the server: disabled; preferred (TLS when the server offers it, else plain); required (TLS, the "
        "certificate not checked); verify (TLS, the certificate checked against tls_ca and the host name). Not used "
        "over a Unix socket."),
    field<&DatabaseConfig::tls_ca>("database.tls_ca", "", false, 0, 0,
                                   "PEM file of the CA certificate(s) the server's certificate must chain to; "
                                   "required with tls_mode = \"verify\" and used only then."),
    field<&DatabaseConfig::tls_cert>("database.tls_cert", "", false, 0, 0,
                                     "Client certificate (PEM) for servers that require one; with tls_key."),
    field<&DatabaseConfig::tls_key>("database.tls_key", "", false, 0, 0, "Private key (PEM) of tls_cert."),
    field<&DatabaseConfig::reconnect_backoff_max>(
        "database.reconnect_backoff_max", "5s", false, 10, 600000,
        "Longest wait between reconnect attempts while the database is gone."),

    declare("claim", Type::Section, "", false, 0, 0, "The claim/dedup state machine."),
    field<&ClaimConfig::lease>(
        "claim.lease", "30s", false, 1000, 86400000,
        "Lease on a pending claim, renewed while its record is being handled; another host may take it over only "
        "after it expires."),
    field<&ClaimConfig::wait_recheck>("claim.wait_recheck", "1s", false, 10, 600000,
                                      "How often a record whose key is held by another live host is checked again."),
    field<&ClaimConfig::retention_days>("claim.retention_days", "90", false, 2, 36500,
                                        "Claim rows are kept this long (monthly partitions, dropped whole)."),
    field<&ClaimConfig::horizon_margin_days>(
        "claim.horizon_margin_days", "7", false, 1, 36500,
        "Records older than retention minus this margin are refused (DLQ reason beyond_replay_horizon): their claim "
        "may already be dropped."),
    field<&ClaimConfig::max_future_skew>(
        "claim.max_future_skew", "1h", false, 0, 86400000 * 30LL,
        "Records timestamped further in the future than this are refused (DLQ reason timestamp_in_future)."),
    field<&ClaimConfig::apply_schema>(
        "claim.apply_schema", "true", false, 0, 0,
        "Create missing tables and partitions at start-up (`idemsink schema apply` does the same by hand)."),
    field<&ClaimConfig::derived_tokens>(
        "claim.derived_tokens", "true", false, 0, 0,
        "The idem_token sent to remotes is derived from the route and the biz_key (a name-based UUID in a namespace "
        "made once per deployment and kept in idemsink_meta), so a record claimed again after its claim row was lost "
        "(a database failover that went back in time, a partition dropped at retention) calls the remote with the "
        "token the remote already saw. false: a random token per claim, as before 0.2."),
    field<&ClaimConfig::max_takeovers>(
        "claim.max_takeovers", "5", false, 1, 1000,
        "A record whose claim was taken over this many times (its host kept dying on it) is failed to the DLQ "
        "instead of being handled again."),
    field<&ClaimConfig::flush_linger>("claim.flush_linger", "5ms", false, 0, 1000,
                                      "How long completions wait to be marked done together in one statement."),
    field<&ClaimConfig::stuck_after>(
        "claim.stuck_after", "10m", false, 1000, 86400000 * 30LL,
        "A pending claim nobody holds and nobody touched for this long is stuck: its record is not coming back."),
    field<&ClaimConfig::reconcile_interval>(
        "claim.reconcile_interval", "1m", false, 0, 86400000,
        "How often unknown and stuck claims are put to their plugin's reconcile hook; \"0s\" turns it off."),
    field<&ClaimConfig::reconcile_after>(
        "claim.reconcile_after", "0s", false, 0, 86400000,
        "An unknown claim is put to the reconcile hook no earlier than this after its last call began, so a call "
        "still on its way is never taken for one that did not happen (and re-driven). \"0s\": the route's "
        "call_timeout plus 10s."),
    field<&ClaimConfig::unknown_dlq_after>(
        "claim.unknown_dlq_after", "1h", false, 0, 86400000 * 30LL,
        "An unknown record of a route whose plugin can reconcile reaches the DLQ only if the hook still cannot tell "
        "after this long; settled ones never do. Routes without a reconcile hook dead-letter unknowns at once."),
    field<&ClaimConfig::maintenance_interval>(
        "claim.maintenance_interval", "1h", false, 1000, 86400000,
        "How often the claim table's monthly partitions are created ahead (3 months) and dropped past retention, by "
        "one host at a time; with apply_schema off they are only watched (idemsink_claim_partitions_ahead)."),
    field<&ClaimConfig::outbox_retention>(
        "claim.outbox_retention", "7d", false, 60000, 86400000 * 3650LL,
        "Published DLQ outbox rows (payloads included) are deleted this long after publishing, in small batches."),

    declare("route", Type::SectionArray, "", true, 0, 0,
            "One [[route]] per topic: which handler runs for its records."),
    field<&RouteConfig::name>(
        "route.name", "", true, 0, 0,
        "Route name, also the claim namespace: one biz_key can have one claim per route. [A-Za-z0-9_.-], at most 64."),
    field<&RouteConfig::topic>("route.topic", "", true, 0, 0, "Source topic."),
    field<&RouteConfig::plugin>("route.plugin", "", true, 0, 0,
                                "Handler plugin (.so) path, relative to this file's folder."),
    field<&RouteConfig::concurrency>("route.concurrency", "0", false, 0, 100000,
                                     "Calls in flight for this route; 0 = only the host-wide max_in_flight."),
    field<&RouteConfig::call_timeout>("route.call_timeout", "30s", false, 10, 3600000,
                                      "Deadline for one handler call to report; past it the call counts as uncertain."),
    field<&RouteConfig::payload_check>(
        "route.payload_check", "true",
        false, 0, 0, "A redelivered biz_key with a different payload is a conflict (DLQ), not a duplicate."),
    field<&RouteConfig::max_record_bytes>(
        "route.max_record_bytes", "983040", false, 1, 1LL << 30,
        "Larger records (key + value) are refused (DLQ reason record_too_large), and their DLQ copy keeps this much "
        "of the payload. With the DLQ's headers (up to 16 KiB) it must fit the producer's message.max.bytes "
        "(librdkafka's default 1000000), which check-config verifies."),
    declare("route.key", Type::Section, "", false, 0, 0, "Where the biz_key comes from."),
    declare("route.key.from", Type::String, "key", false, 0, 0, "\"key\" (the Kafka key), \"header\" or \"json\"."),
    field<&RouteConfig::key_header>("route.key.header", "", false, 0, 0, "Header name, with from = \"header\"."),
    field<&RouteConfig::key_json_path>("route.key.json", "", false, 0, 0,
                                       "Dotted field path in a JSON value, with from = \"json\"."),
    declare("route.retry", Type::Section, "", false, 0, 0,
            "Retries of retryable (and, for idempotent kinds, uncertain) outcomes."),
    field<&RetryConfig::max_attempts>("route.retry.max_attempts", "5", false, 1, 1000,
                                      "Calls per record before it is dead-lettered."),
    field<&RetryConfig::backoff_initial>("route.retry.backoff_initial", "200ms", false, 1, 3600000,
                                         "First backoff; doubles per attempt, with full jitter."),
    field<&RetryConfig::backoff_max>("route.retry.backoff_max", "30s", false, 1, 86400000, "Backoff cap."),
    field<&RetryConfig::topics>(
        "route.retry.topics", "", false, 1, 86400000 * 7LL,
        "Delayed retry topics instead of in-place retries, e.g. [\"10s\", \"5m\"]: a failed call forwards the record "
        "to "
        "\"<topic>.retry.N\" (the topics must exist), where it is retried once the N-th delay has passed; after the "
        "last it is dead-lettered. The source partition moves on at once."),
    declare("route.circuit", Type::Section, "", false, 0, 0,
            "Route health: a circuit breaker that stops calling a remote that is down instead of spending "
            "records' attempts on it."),
    field<&CircuitConfig::enabled>("route.circuit.enabled", "true", false, 0, 0,
                                   "Open the circuit when most recent calls fail retryable or uncertain."),
    field<&CircuitConfig::window>("route.circuit.window", "50", false, 1, 100000,
                                  "How many of the route's most recent calls (that ended) are judged."),
    field<&CircuitConfig::failure_percent>(
        "route.circuit.failure_percent", "80", false, 1, 100,
        "The circuit opens when at least this share of the calls in the window failed retryable or uncertain "
        "(permanent answers and successes count as healthy). While open: no calls, the route's partitions stop "
        "fetching (the host stays in its group), and failed calls do not count toward retry.max_attempts."),
    field<&CircuitConfig::min_calls>("route.circuit.min_calls", "20", false, 1, 100000,
                                     "Calls that must have ended in the window before it can open."),
    field<&CircuitConfig::probe_initial>(
        "route.circuit.probe_initial", "1s", false, 10, 3600000,
        "While open, one call goes out as a probe after this long, then after twice as long each time it fails; "
        "a probe that succeeds (or is answered permanent) closes the circuit."),
    field<&CircuitConfig::probe_max>("route.circuit.probe_max", "10s", false, 10, 3600000,
                                     "The longest wait between probes."),
    field<&CircuitConfig::max_wait>(
        "route.circuit.max_wait", "10m", false, 0, 86400000,
        "How long a record's failed calls may wait for the open circuit uncounted; after that they count toward "
        "retry.max_attempts again. It bounds the wait of a record that the remote refuses for itself when it is "
        "the only one left to probe with (a quiet topic: nothing new to fetch). 0 = wait as long as the circuit "
        "stays open."),
    declare("route.database", Type::Section, "", false, 0, 0,
            "This route's own database, with the keys of [database]; each one not set here is inherited from "
            "[database]. The route's claims, DLQ outbox and local_tx writes live there, with a pool, schema, health "
            "and consumer of their own: one database down stalls only the routes that use it."),
    declare("route.rate_limit", Type::Section, "", false, 0, 0,
            "Calls started per period for this route, so its remote is not overrun. A 429 or 503 answered with "
            "Retry-After (plugins/http) also holds the route's calls that long; such calls do not count toward "
            "retry.max_attempts."),
    field<&RateLimitConfig::rate>("route.rate_limit.rate", "0", false, 0, 1000000,
                                  "Calls per `per`; 0 = no limit."),
    field<&RateLimitConfig::per>("route.rate_limit.per", "1s", false, 1, 86400000, "The period of `rate`."),
    field<&RateLimitConfig::burst>("route.rate_limit.burst", "0", false, 0, 1000000,
                                   "Calls that may start at once after a quiet spell; 0 = `rate` (one period's worth)."),
    field<&RateLimitConfig::scope>(
        "route.rate_limit.scope", "group", false, 0, 0,
        "\"group\": the rate is the whole group's; each host takes the share of the route's partitions it owns "
        "(source and retry topics), so the shares add up to the rate whatever the assignment. \"host\": each host "
        "may call at the full rate."),
    field<&RateLimitConfig::max_hold>("route.rate_limit.max_hold", "60s", false, 0, 86400000,
                                      "The longest hold a Retry-After answer can ask for."),
    declare("route.dlq", Type::Section, "", false, 0, 0, "Dead-letter queue."),
    field<&DlqConfig::enabled>("route.dlq.enabled", "true", false, 0, 0,
                               "Publish dead records to the DLQ topic (they are always recorded in the database)."),
    field<&DlqConfig::topic>("route.dlq.topic", "", false, 0, 0, "DLQ topic (default: \"<topic>.dlq\")."),
    declare("route.options", Type::Options, "", false, 0, 0,
            "Handler options, checked against the plugin's declarations (`idemsink plugin-info`)."),
};

// Every bound setting lives under the section its field's struct stands for.
constexpr bool bindings_match_sections() {
  for (const auto& s : kSettings) {
    // Bound settings are the ones with a section (comparing the function
    // pointer is not a constant expression in sanitizer builds).
    const std::string_view sec = s.store_section;
    if (sec.empty()) continue;
    if (s.path.size() <= sec.size() || s.path.substr(0, sec.size()) != sec || s.path[sec.size()] != '.') return false;
  }
  return true;
}
static_assert(bindings_match_sections(), "a setting is bound to a field of another section");

}  // namespace

std::span<const Setting> settings() { return kSettings; }

const Setting* find_setting(std::string_view path) {
  for (const auto& s : kSettings)
    if (s.path == path) return &s;
  return nullptr;
}

const char* type_name(Type t) {
  switch (t) {
    case Type::String: return "string";
    case Type::Int: return "integer";
    case Type::Bool: return "boolean";
    case Type::Duration: return "duration";
    case Type::DurationList: return "array of durations";
    case Type::Section: return "table";
    case Type::SectionArray: return "array of tables";
    case Type::StringMap: return "table of strings";
    case Type::Options: return "table";
  }
  return "?";
}

std::string reference_markdown() {
  std::ostringstream os;
  os << "# Configuration reference\n\n"
        "Generated by `idemsink config-reference` from the declarations in `core/config/settings.cc`; do not edit.\n\n"
        "Unknown keys and values of the wrong type or out of bounds are errors naming the file, line and key. "
        "Every string value, [kafka.properties], [kafka.consumer], [kafka.producer] and [route.options] included, "
        "may use `${ENV_VAR}`; an unset variable or an unterminated `${` is an error, and `$$` is a literal `$`. "
        "Durations are strings with a unit: `ms`, `s`, `m`, `h`, `d`.\n";
  for (const auto& s : kSettings) {
    if (s.type == Type::Section || s.type == Type::SectionArray) {
      const bool array = s.type == Type::SectionArray;
      os << "\n## " << (array ? "[[" : "[") << s.path << (array ? "]]" : "]") << "\n\n" << s.doc;
      if (s.required) os << " Required.";
      os << "\n\n| key | type | default | bounds | description |\n|---|---|---|---|---|\n";
      continue;
    }

    os << "| `" << s.path.substr(s.path.find('.') + 1) << "` | " << type_name(s.type) << " | ";
    if (s.required) {
      os << "required";
    } else if (!s.default_value.empty()) {
      os << '`' << s.default_value << '`';
    }
    os << " | ";
    if (s.type == Type::Int) os << s.min << " .. " << s.max;
    if (s.type == Type::Duration) os << s.min << "ms .. " << s.max << "ms";
    os << " | " << s.doc << " |\n";
  }
  return os.str();
}

}  // namespace idemsink::config
