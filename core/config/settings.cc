#include "core/config/settings.h"

#include <vector>

#include "core/config/setting_binding.h"

namespace idemsink::config {
namespace {

using namespace binding;

// The single declaration table, in two parts (the [[route]] part in
// settings_route.cc): validation, defaults, bounds, the fields values land
// in and the generated reference all come from here.
constexpr Setting kProcessSettings[] = {
    declare(Type::Section, {.path = "host", .doc = "This host process."}),
    field<&HostConfig::id>(
        {.path = "host.id",
         .doc = "Stable identity of this host (default: the machine's hostname). Claims are owned by `<id>#<run>`: a "
                "host restarted with the same id takes over its own leases at once instead of waiting for them to "
                "expire. Two live hosts must never share an id."}),
    field<&HostConfig::max_in_flight>(
        {.path = "host.max_in_flight",
         .default_value = "2000",
         .min = 1,
         .max = 100000,
         .doc = "Handler calls in flight at once, all routes together (Little's law: rate x latency)."}),
    field<&HostConfig::max_buffered_records>(
        {.path = "host.max_buffered_records",
         .default_value = "20000",
         .min = 1,
         .max = 10000000,
         .doc = "Consumed records not yet durable, per consumer group; above it the group's fetching pauses (the "
                "consumer stays in the group)."}),
    field<&HostConfig::shutdown_grace>(
        {.path = "host.shutdown_grace",
         .default_value = "30s",
         .max = 3600000,
         .doc = "On SIGTERM or partition revocation: how long in-flight calls may finish before the host lets go."}),
    field<&HostConfig::log_level>(
        {.path = "host.log_level", .default_value = "info", .doc = "trace, debug, info, warn or error."}),
    field<&HostConfig::log_format>(
        {.path = "host.log_format",
         .default_value = "text",
         .doc = "text, or json: one object per line with time, level, thread, message and, where a line is about a "
                "record, route, topic, partition, offset, biz_key (printable) and idem_token."}),
    field<&HostConfig::log_file>({.path = "host.log_file",
                                  .doc = "Where `idemsink run` writes its log; empty = stderr (the service manager's "
                                         "journal). SIGHUP reopens it, for logrotate."}),
    field<&HostConfig::admin_listen>(
        {.path = "host.admin_listen",
         .doc = "Address of the admin HTTP server (/metrics, /status, pause/resume): an IP address and a port, e.g. "
                "\"127.0.0.1:9464\" or \"[::1]:9464\"; empty = off."}),
    declare(Type::String,
            {.path = "host.admin_token_env",
             .doc = "Name of an environment variable holding a bearer token with the admin role (named \"admin\" "
                    "in the operator log): requests send `Authorization: Bearer <token>`. Without any token, POST "
                    "is accepted only when admin_listen is a loopback address."}),
    field<&HostConfig::admin_tokens_file>(
        {.path = "host.admin_tokens_file",
         .doc = "A file of admin port tokens, one per line: `NAME ROLE ROUTES SECRET`, ROLE viewer (reads), "
                "operator (pause, replay, resolve, discard, release) or admin (also host-wide actions), ROUTES `*` "
                "or a comma-separated list an operator may act on, SECRET the token or `env:VARIABLE`; `#` starts "
                "a comment. With tokens, every POST needs one, and GETs of /api/v1, /status and /routes need one "
                "unless admin_listen is a loopback address."}),
    field<&HostConfig::admin_tls_cert>(
        {.path = "host.admin_tls_cert", .doc = "PEM certificate (chain) of the admin port: it speaks HTTPS."}),
    field<&HostConfig::admin_tls_key>({.path = "host.admin_tls_key", .doc = "PEM private key of admin_tls_cert."}),
    field<&HostConfig::admin_hostnames>(
        {.path = "host.admin_hostnames",
         .doc = "Names clients reach the admin port by, comma-separated, besides its IP addresses and localhost (e.g. "
                "\"idemsink-0.idemsink.prod.svc\"): a request for data or an action naming another host in its Host "
                "header is refused, so a web page whose name was re-bound to this address (DNS rebinding) cannot "
                "use the port."}),
    field<&HostConfig::admin_open_probes>(
        {.path = "host.admin_open_probes",
         .default_value = "true",
         .doc = "GET /metrics, /livez, /readyz and /healthz need no token (scrapers and probes); false: a viewer "
                "token, like the rest."}),

    declare(Type::Section, {.path = "kafka", .required = true, .doc = "The Kafka cluster and consumer group."}),
    field<&KafkaConfig::bootstrap_servers>(
        {.path = "kafka.bootstrap_servers", .required = true, .doc = "Comma-separated host:port list."}),
    field<&KafkaConfig::group_id>({.path = "kafka.group_id",
                                   .default_value = "idemsink",
                                   .doc = "Consumer group; all hosts of one deployment share it."}),
    field<&KafkaConfig::max_poll_records>({.path = "kafka.max_poll_records",
                                           .default_value = "500",
                                           .min = 1,
                                           .max = 100000,
                                           .doc = "Records taken per poll and claimed as one batch."}),
    field<&KafkaConfig::poll_timeout>({.path = "kafka.poll_timeout",
                                       .default_value = "100ms",
                                       .min = 1,
                                       .max = 60000,
                                       .doc = "How long one poll waits for records."}),
    field<&KafkaConfig::commit_interval>(
        {.path = "kafka.commit_interval",
         .default_value = "1s",
         .min = 10,
         .max = 600000,
         .doc = "How often durable offsets are committed (also on revoke and shutdown)."}),
    field<&KafkaConfig::stall_timeout>(
        {.path = "kafka.stall_timeout",
         .default_value = "30s",
         .min = 1000,
         .max = 3600000,
         .doc =
             "A partition that should be fetching and is behind the end of the partition (its last stable offset), yet "
             "receives no record for this long, is stalled: logged, counted and read again from where it stands."}),
    field<&KafkaConfig::properties>(
        {.path = "kafka.properties",
         .doc = "librdkafka properties for both clients (security.protocol, sasl.*, ...)."}),
    field<&KafkaConfig::consumer_properties>(
        {.path = "kafka.consumer",
         .doc =
             "librdkafka properties for the consumer only (session.timeout.ms, partition.assignment.strategy, ...). "
             "enable.auto.commit and enable.auto.offset.store are always false, isolation.level is read_committed."}),
    field<&KafkaConfig::producer_properties>(
        {.path = "kafka.producer",
         .doc =
             "librdkafka properties for the DLQ producer only. enable.idempotence=true and acks=all are always set."}),

    declare(Type::Section,
            {.path = "kafka.oauth",
             .doc = "SASL/OAUTHBEARER with tokens the host fetches itself: OAuth 2.0 client credentials against a "
                    "token endpoint (librdkafka as Debian builds it has no OIDC). Needs \"sasl.mechanisms\" = "
                    "\"OAUTHBEARER\" in [kafka.properties]. A token is fetched again before it expires; an "
                    "endpoint that does not answer makes the host not ready and is asked again, never a crash."}),
    field<&OAuthConfig::token_endpoint>(
        {.path = "kafka.oauth.token_endpoint", .doc = "The token endpoint's URL (https://, or http:// on loopback)."}),
    field<&OAuthConfig::client_id>({.path = "kafka.oauth.client_id", .doc = "The client id; required."}),
    declare(Type::String,
            {.path = "kafka.oauth.client_secret_env",
             .doc = "Name of an environment variable holding the client secret; it must be set when this is."}),
    declare(Type::String,
            {.path = "kafka.oauth.client_secret_file",
             .doc = "A file holding the client secret (one line); readable by its owner only (mode 0600 or "
                    "0400). One of client_secret_env and client_secret_file is required. Never logged."}),
    field<&OAuthConfig::scope>(
        {.path = "kafka.oauth.scope", .doc = "Scopes to ask for, space-separated; empty: none."}),
    field<&OAuthConfig::principal>(
        {.path = "kafka.oauth.principal",
         .doc = "The principal name handed to librdkafka with the token; empty: the token's \"sub\" claim (a JWT), "
                "else client_id."}),
    field<&OAuthConfig::tls_ca>(
        {.path = "kafka.oauth.tls_ca",
         .doc = "PEM file of the CAs the endpoint's certificate must chain to; empty: the system's."}),
    field<&OAuthConfig::timeout>({.path = "kafka.oauth.timeout",
                                  .default_value = "10s",
                                  .min = 100,
                                  .max = 120000,
                                  .doc = "How long one token request may take."}),

    declare(Type::Section,
            {.path = "schema_registry",
             .doc = "A Confluent-compatible schema registry (Confluent's, Apicurio's /apis/ccompat/v7, Karapace): "
                    "where routes with value or key format avro, protobuf or json_schema fetch the writer's schema by "
                    "the id each record carries (docs/formats.md). Schemas are cached for the process's life (an id "
                    "never changes). While it cannot be reached, records needing a schema it has not yet given wait "
                    "(their partition holds; /readyz and idemsink_schema_registry_up say so); nothing is "
                    "dead-lettered for it."}),
    field<&SchemaRegistryConfig::url>(
        {.path = "schema_registry.url",
         .doc = "Base URL, e.g. \"https://registry.internal:8081\" or \"http://127.0.0.1:8080/apis/ccompat/v7\"."}),
    field<&SchemaRegistryConfig::username>(
        {.path = "schema_registry.username", .doc = "Basic auth user; its password from password_env."}),
    declare(Type::String, {.path = "schema_registry.password_env",
                           .doc = "Name of an environment variable holding the basic auth password."}),
    declare(Type::String, {.path = "schema_registry.token_env",
                           .doc = "Name of an environment variable holding a bearer token (instead of basic auth)."}),
    field<&SchemaRegistryConfig::tls_ca>(
        {.path = "schema_registry.tls_ca",
         .doc = "PEM file of the CAs an https:// registry's certificate must chain to; empty: the system's."}),
    field<&SchemaRegistryConfig::timeout>({.path = "schema_registry.timeout",
                                           .default_value = "5s",
                                           .min = 100,
                                           .max = 120000,
                                           .doc = "How long one request to the registry may take."}),

    declare(Type::Section,
            {.path = "database", .required = true, .doc = "The business MariaDB holding the claim table."}),
    field<&DatabaseConfig::host>({.path = "database.host", .default_value = "127.0.0.1", .doc = "Server host (TCP)."}),
    field<&DatabaseConfig::port>(
        {.path = "database.port", .default_value = "3306", .min = 1, .max = 65535, .doc = "Server port."}),
    field<&DatabaseConfig::socket>(
        {.path = "database.socket", .doc = "Unix socket path; when set, used instead of host/port."}),
    field<&DatabaseConfig::user>({.path = "database.user", .default_value = "root", .doc = "User name."}),
    field<&DatabaseConfig::password>(
        {.path = "database.password", .doc = "Password (prefer password_env). Never logged."}),
    declare(Type::String,
            {.path = "database.password_env",
             .doc = "Name of an environment variable holding the password; it must be set when this is."}),
    field<&DatabaseConfig::database>({.path = "database.database", .required = true, .doc = "Schema (database) name."}),
    field<&DatabaseConfig::pool_size>({.path = "database.pool_size",
                                       .default_value = "4",
                                       .min = 2,
                                       .max = 64,
                                       .doc = "Connections, one worker thread each."}),
    field<&DatabaseConfig::connect_timeout>({.path = "database.connect_timeout",
                                             .default_value = "5s",
                                             .min = 100,
                                             .max = 600000,
                                             .doc = "Connect timeout per attempt."}),
    field<&DatabaseConfig::job_give_up_after>(
        {.path = "database.job_give_up_after",
         .default_value = "1m",
         .min = 1000,
         .max = 86400000,
         .doc = "A job failing for another reason than a lost connection (an unexpected server error) is retried this "
                "long, then given up: its records are released, never wedged. A lost connection is waited out however "
                "long."}),
    field<&DatabaseConfig::tls_mode>(
        {.path = "database.tls_mode",
         .default_value = "disabled",
         .doc = "TLS to the server: disabled; preferred (TLS when the server offers it, else plain); required (TLS, "
                "the certificate not checked); verify (TLS, the certificate checked against tls_ca and the host name). "
                "Not used over a Unix socket."}),
    field<&DatabaseConfig::tls_ca>({.path = "database.tls_ca",
                                    .doc = "PEM file of the CA certificate(s) the server's certificate must chain to; "
                                           "required with tls_mode = \"verify\" and used only then."}),
    field<&DatabaseConfig::tls_cert>(
        {.path = "database.tls_cert", .doc = "Client certificate (PEM) for servers that require one; with tls_key."}),
    field<&DatabaseConfig::tls_key>({.path = "database.tls_key", .doc = "Private key (PEM) of tls_cert."}),
    field<&DatabaseConfig::reconnect_backoff_max>(
        {.path = "database.reconnect_backoff_max",
         .default_value = "5s",
         .min = 10,
         .max = 600000,
         .doc = "Longest wait between reconnect attempts while the database is gone."}),

    declare(Type::Section, {.path = "claim", .doc = "The claim/dedup state machine."}),
    field<&ClaimConfig::lease>({.path = "claim.lease",
                                .default_value = "30s",
                                .min = 1000,
                                .max = 86400000,
                                .doc = "Lease on a pending claim, renewed while its record is being handled; another "
                                       "host may take it over only after it expires."}),
    field<&ClaimConfig::wait_recheck>(
        {.path = "claim.wait_recheck",
         .default_value = "1s",
         .min = 10,
         .max = 600000,
         .doc = "How often a record whose key is held by another live host is checked again."}),
    field<&ClaimConfig::retention_days>({.path = "claim.retention_days",
                                         .default_value = "90",
                                         .min = 2,
                                         .max = 36500,
                                         .doc = "Claim rows are kept this long (monthly partitions, dropped whole)."}),
    field<&ClaimConfig::horizon_margin_days>(
        {.path = "claim.horizon_margin_days",
         .default_value = "7",
         .min = 1,
         .max = 36500,
         .doc = "Records older than retention minus this margin are refused (DLQ reason beyond_replay_horizon): their "
                "claim may already be dropped."}),
    field<&ClaimConfig::max_future_skew>(
        {.path = "claim.max_future_skew",
         .default_value = "1h",
         .max = 86400000 * 30LL,
         .doc = "Records timestamped further in the future than this are refused (DLQ reason timestamp_in_future)."}),
    field<&ClaimConfig::apply_schema>(
        {.path = "claim.apply_schema",
         .default_value = "true",
         .doc = "Create missing tables and partitions at start-up (`idemsink schema apply` does the same by hand)."}),
    field<&ClaimConfig::derived_tokens>(
        {.path = "claim.derived_tokens",
         .default_value = "true",
         .doc =
             "The idem_token sent to remotes is derived from the route and the biz_key (a name-based UUID in a "
             "namespace made once per deployment and kept in idemsink_meta), so a record claimed again after its claim "
             "row was lost (a database failover that went back in time, a partition dropped at retention) calls the "
             "remote with the token the remote already saw. false: a random token per claim, as before 0.2."}),
    field<&ClaimConfig::max_takeovers>({.path = "claim.max_takeovers",
                                        .default_value = "5",
                                        .min = 1,
                                        .max = 1000,
                                        .doc = "A record whose claim was taken over this many times (its host kept "
                                               "dying on it) is failed to the DLQ instead of being handled again."}),
    field<&ClaimConfig::flush_linger>(
        {.path = "claim.flush_linger",
         .default_value = "5ms",
         .max = 1000,
         .doc = "How long completions wait to be marked done together in one statement."}),
    field<&ClaimConfig::stuck_after>(
        {.path = "claim.stuck_after",
         .default_value = "10m",
         .min = 1000,
         .max = 86400000 * 30LL,
         .doc =
             "A pending claim nobody holds and nobody touched for this long is stuck: its record is not coming back."}),
    field<&ClaimConfig::reconcile_interval>(
        {.path = "claim.reconcile_interval",
         .default_value = "1m",
         .max = 86400000,
         .doc = "How often unknown and stuck claims are put to their plugin's reconcile hook; \"0s\" turns it off."}),
    field<&ClaimConfig::reconcile_after>(
        {.path = "claim.reconcile_after",
         .default_value = "0s",
         .max = 86400000,
         .doc = "An unknown claim is put to the reconcile hook no earlier than this after its last call began, so a "
                "call still on its way is never taken for one that did not happen (and re-driven). \"0s\": the route's "
                "call_timeout plus 10s."}),
    field<&ClaimConfig::unknown_dlq_after>(
        {.path = "claim.unknown_dlq_after",
         .default_value = "1h",
         .max = 86400000 * 30LL,
         .doc = "An unknown record of a route whose plugin can reconcile reaches the DLQ only if the hook still cannot "
                "tell after this long; settled ones never do. Routes without a reconcile hook dead-letter unknowns at "
                "once."}),
    field<&ClaimConfig::maintenance_interval>(
        {.path = "claim.maintenance_interval",
         .default_value = "1h",
         .min = 1000,
         .max = 86400000,
         .doc =
             "How often the claim table's monthly partitions are created ahead (3 months) and dropped past retention, "
             "by one host at a time; with apply_schema off they are only watched (idemsink_claim_partitions_ahead)."}),
    field<&ClaimConfig::outbox_retention>({.path = "claim.outbox_retention",
                                           .default_value = "7d",
                                           .min = 60000,
                                           .max = 86400000 * 3650LL,
                                           .doc = "Published DLQ outbox rows (payloads included) are deleted this long "
                                                  "after publishing, in small batches."}),
};
static_assert(bindings_match_sections(kProcessSettings), "a setting is bound to a field of another section");
static_assert(defaults_are_choices(kProcessSettings), "a choice's default is not one of its choices");

}  // namespace

namespace detail {
std::span<const Setting> process_settings() { return kProcessSettings; }
}  // namespace detail

std::span<const Setting> settings() {
  // The process's sections first, then the route's: the reference's order.
  static const std::vector<Setting> all = [] {
    std::vector<Setting> out(detail::process_settings().begin(), detail::process_settings().end());
    out.insert(out.end(), detail::route_settings().begin(), detail::route_settings().end());
    return out;
  }();
  return all;
}

const Setting* find_setting(std::string_view path) {
  for (const auto& s : settings())
    if (s.path == path) return &s;
  return nullptr;
}

}  // namespace idemsink::config
