// The [[route]] part of the settings' declaration table (settings.cc has
// the rest): one row per setting of a route.
#include "core/config/setting_binding.h"
#include "core/config/settings.h"

namespace idemsink::config {
namespace {

using namespace binding;

constexpr Setting kRouteSettings[] = {
    declare(Type::SectionArray,
            {.path = "route",
             .required = true,
             .doc = "Which handler runs for a topic's records. Several routes may read one topic (one record, several "
                    "effects), each in a consumer group of its own (group_id)."}),
    field<&RouteConfig::name>({.path = "route.name",
                               .required = true,
                               .doc = "Route name, also the claim namespace: one biz_key can have one claim per route. "
                                      "[A-Za-z0-9_.-], at most 64."}),
    field<&RouteConfig::topic>({.path = "route.topic", .required = true, .doc = "Source topic."}),
    field<&RouteConfig::group_id>(
        {.path = "route.group_id",
         .doc = "The consumer group reading the route's topics; default kafka.group_id. Routes of one topic need "
                "groups of their own (they would split its partitions otherwise): each keeps its own offsets, lag and "
                "rebalances, and one route slow or paused never holds another back. The route that keeps a group "
                "keeps that group's committed offsets; a route in a new group starts where start_at says."}),
    field<&RouteConfig::start_at>(
        {.path = "route.start_at",
         .doc = "Where the route's group starts a partition it never committed: \"earliest\" (everything the topic "
                "still holds) or \"latest\" (records arriving from now on); default: [kafka.consumer] "
                "auto.offset.reset, itself earliest. Matters for a route added to a topic that already has records; "
                "a group that committed keeps its offsets. \"latest\" is the moment the group first began the topic: "
                "a partition it never committed (added later, say) begins at its first record stamped then or later "
                "(docs/routes.md). Retry topics always begin at their start."}),
    declare(Type::Condition,
            {.path = "route.when",
             .doc = "Which records the route takes, decided from the record alone (docs/routes.md): a test, "
                    "{ json = \"type\", equals = \"order.paid\" } (json = a field path, header = a name, or key = "
                    "true; then equals, one_of = [...], starts_with or exists = true|false), or all = [...], "
                    "any = [...], not = {...} of others. A record not taken is skipped: counted, committed, "
                    "accounted by the audit; one whose value cannot be read for a json test is dead-lettered."}),
    field<&RouteConfig::plugin>({.path = "route.plugin",
                                 .required = true,
                                 .doc = "Handler plugin (.so) path, relative to this file's folder."}),
    field<&RouteConfig::concurrency>({.path = "route.concurrency",
                                      .default_value = "0",
                                      .max = 100000,
                                      .doc = "Calls in flight for this route; 0 = only the host-wide max_in_flight."}),
    field<&RouteConfig::call_timeout>(
        {.path = "route.call_timeout",
         .default_value = "30s",
         .min = 10,
         .max = 3600000,
         .doc = "Deadline for one handler call to report; past it the call counts as uncertain."}),
    field<&RouteConfig::payload_check>(
        {.path = "route.payload_check",
         .default_value = "true",
         .doc = "A redelivered biz_key with a different payload is a conflict (DLQ), not a duplicate."}),
    field<&RouteConfig::max_record_bytes>(
        {.path = "route.max_record_bytes",
         .default_value = "983040",
         .min = 1,
         .max = 1LL << 30,
         .doc = "Larger records (key + value) are refused (DLQ reason record_too_large), and their DLQ copy keeps this "
                "much of the payload. With the DLQ's headers (up to 16 KiB) it must fit the producer's "
                "message.max.bytes (librdkafka's default 1000000), which check-config verifies."}),
    declare(Type::Section, {.path = "route.key", .doc = "Where the biz_key comes from."}),
    declare(
        Type::String,
        {.path = "route.key.from", .default_value = "key", .doc = "\"key\" (the Kafka key), \"header\" or \"json\"."}),
    field<&RouteConfig::key_header>({.path = "route.key.header", .doc = "Header name, with from = \"header\"."}),
    field<&RouteConfig::key_json_path>(
        {.path = "route.key.json", .doc = "Dotted field path in a JSON value, with from = \"json\"."}),
    declare(Type::Section,
            {.path = "route.retry", .doc = "Retries of retryable (and, for idempotent kinds, uncertain) outcomes."}),
    field<&RetryConfig::max_attempts>({.path = "route.retry.max_attempts",
                                       .default_value = "5",
                                       .min = 1,
                                       .max = 1000,
                                       .doc = "Calls per record before it is dead-lettered."}),
    field<&RetryConfig::backoff_initial>({.path = "route.retry.backoff_initial",
                                          .default_value = "200ms",
                                          .min = 1,
                                          .max = 3600000,
                                          .doc = "First backoff; doubles per attempt, with full jitter."}),
    field<&RetryConfig::backoff_max>(
        {.path = "route.retry.backoff_max", .default_value = "30s", .min = 1, .max = 86400000, .doc = "Backoff cap."}),
    field<&RetryConfig::topics>(
        {.path = "route.retry.topics",
         .min = 1,
         .max = 86400000 * 7LL,
         .doc = "Delayed retry topics instead of in-place retries, e.g. [\"10s\", \"5m\"]: a failed call forwards the "
                "record to \"<topic>.retry.N\" (\"<topic>.<route>.retry.N\" for a route in a group_id of its own; the "
                "topics "
                "must exist), where it is retried once the N-th delay has passed; after the last it is dead-lettered. "
                "The source partition moves on at once."}),
    declare(Type::Section, {.path = "route.circuit",
                            .doc = "Route health: a circuit breaker that stops calling a remote that is down instead "
                                   "of spending records' attempts on it."}),
    field<&CircuitConfig::enabled>({.path = "route.circuit.enabled",
                                    .default_value = "true",
                                    .doc = "Open the circuit when most recent calls fail retryable or uncertain."}),
    field<&CircuitConfig::window>({.path = "route.circuit.window",
                                   .default_value = "50",
                                   .min = 1,
                                   .max = 100000,
                                   .doc = "How many of the route's most recent calls (that ended) are judged."}),
    field<&CircuitConfig::failure_percent>(
        {.path = "route.circuit.failure_percent",
         .default_value = "80",
         .min = 1,
         .max = 100,
         .doc = "The circuit opens when at least this share of the calls in the window failed retryable or uncertain "
                "(permanent answers and successes count as healthy). While open: no calls, the route's partitions stop "
                "fetching (the host stays in its group), and failed calls do not count toward retry.max_attempts."}),
    field<&CircuitConfig::min_calls>({.path = "route.circuit.min_calls",
                                      .default_value = "20",
                                      .min = 1,
                                      .max = 100000,
                                      .doc = "Calls that must have ended in the window before it can open."}),
    field<&CircuitConfig::probe_initial>(
        {.path = "route.circuit.probe_initial",
         .default_value = "1s",
         .min = 10,
         .max = 3600000,
         .doc = "While open, one call goes out as a probe after this long, then after twice as long each time it "
                "fails; a probe that succeeds (or is answered permanent) closes the circuit."}),
    field<&CircuitConfig::probe_max>({.path = "route.circuit.probe_max",
                                      .default_value = "10s",
                                      .min = 10,
                                      .max = 3600000,
                                      .doc = "The longest wait between probes."}),
    field<&CircuitConfig::max_wait>(
        {.path = "route.circuit.max_wait",
         .default_value = "10m",
         .max = 86400000,
         .doc = "How long a record's failed calls may wait for the open circuit uncounted; after that they count "
                "toward retry.max_attempts again. It bounds the wait of a record that the remote refuses for itself "
                "when it is the only one left to probe with (a quiet topic: nothing new to fetch). 0 = wait as long as "
                "the circuit stays open."}),
    declare(Type::Section,
            {.path = "route.value",
             .doc = "How the route's record values are written (docs/formats.md). Downstream of decoding, the "
                    "biz_key and order_by paths, [route.when], the plugin (Record::json()) and the payload check see "
                    "the value as JSON; dead letters keep the original bytes."}),
    declare(Type::String,
            {.path = "route.value.format",
             .default_value = "json",
             .doc = "\"json\" (JSON text), \"avro\", \"protobuf\" or \"json_schema\" (Confluent's wire format: "
                    "a zero byte, the schema's 4-byte id, the encoded record; needs [schema_registry]), \"string\" or "
                    "\"bytes\" (opaque: no json paths or tests on it). A value that does not decode is "
                    "dead-lettered as undecodable_value, naming the schema id."}),
    declare(Type::Section, {.path = "route.key_format", .doc = "How the route's Kafka keys are written."}),
    declare(Type::String,
            {.path = "route.key_format.format",
             .default_value = "string",
             .doc = "\"string\" (the key's bytes as they are; the default), \"bytes\" (the same), \"json\", or a "
                    "registry format (\"avro\", \"protobuf\", \"json_schema\"): the key decoded to JSON, and a key "
                    "that is a JSON string or number is its text, an object or array its compact JSON (sorted keys)."}),
    declare(Type::Section,
            {.path = "route.schema_registry",
             .doc = "This route's own schema registry, with the keys of [schema_registry]; each one not set here is "
                    "inherited from [schema_registry]."}),
    declare(Type::Section,
            {.path = "route.database",
             .doc = "This route's own database, with the keys of [database]; each one not set here is inherited from "
                    "[database]. The route's claims, DLQ outbox and local_tx writes live there, with a pool, schema, "
                    "health and consumer of their own: one database down stalls only the routes that use it."}),
    declare(Type::Section, {.path = "route.rate_limit",
                            .doc = "Calls started per period for this route, so its remote is not overrun. A 429 or "
                                   "503 answered with Retry-After (plugins/http) also holds the route's calls that "
                                   "long; such calls do not count toward retry.max_attempts."}),
    field<&RateLimitConfig::rate>({.path = "route.rate_limit.rate",
                                   .default_value = "0",
                                   .max = 1000000,
                                   .doc = "Calls per `per`; 0 = no limit."}),
    field<&RateLimitConfig::per>({.path = "route.rate_limit.per",
                                  .default_value = "1s",
                                  .min = 1,
                                  .max = 86400000,
                                  .doc = "The period of `rate`."}),
    field<&RateLimitConfig::burst>(
        {.path = "route.rate_limit.burst",
         .default_value = "0",
         .max = 1000000,
         .doc = "Calls that may start at once after a quiet spell; 0 = `rate` (one period's worth)."}),
    field<&RateLimitConfig::scope>(
        {.path = "route.rate_limit.scope",
         .default_value = "group",
         .doc = "\"group\": the rate is the whole group's; each host takes the share of the route's partitions it owns "
                "(source and retry topics), so the shares add up to the rate whatever the assignment. \"host\": each "
                "host may call at the full rate."}),
    field<&RateLimitConfig::max_hold>({.path = "route.rate_limit.max_hold",
                                       .default_value = "60s",
                                       .max = 86400000,
                                       .doc = "The longest hold a Retry-After answer can ask for."}),
    declare(Type::Section, {.path = "route.dlq", .doc = "Dead-letter queue."}),
    field<&DlqConfig::enabled>(
        {.path = "route.dlq.enabled",
         .default_value = "true",
         .doc = "Publish dead records to the DLQ topic (they are always recorded in the database)."}),
    field<&DlqConfig::topic>({.path = "route.dlq.topic", .doc = "DLQ topic (default: \"<topic>.dlq\")."}),
    declare(Type::Section,
            {.path = "route.output",
             .doc = "An event for each record's outcome (docs/outputs.md): written to the outbox in the transaction "
                    "that records the outcome and published by the relay, so it is published exactly once in effect "
                    "(a rare repeat carries the same idemsink.event_id)."}),
    field<&OutputConfig::topic>({.path = "route.output.topic",
                                 .doc = "Topic the events go to; unset: no events. Keyed by the biz_key; the "
                                        "value is a JSON envelope (route, biz_key, idem_token, outcome, receipt, "
                                        "source position)."}),
    field<&OutputConfig::include_failed>(
        {.path = "route.output.include_failed",
         .default_value = "false",
         .doc = "Also an event when a record ends failed (dead-lettered, its effect never applied)."}),
    field<&OutputConfig::include_unknown>(
        {.path = "route.output.include_unknown",
         .default_value = "false",
         .doc = "Also an event when a record ends unknown (its effect may have happened; a later settlement as done "
                "publishes a done event)."}),
    declare(Type::Section,
            {.path = "route.order_by",
             .doc = "An ordering key besides the biz_key (docs/outputs.md): records of one entity are called one at "
                    "a time in offset order, and wait, durably, for an earlier one still backing off, held by the "
                    "circuit or in a retry topic."}),
    field<&OrderByConfig::from>(
        {.path = "route.order_by.from",
         .doc = "\"key\" (the Kafka key), \"header\" or \"json\", as for [route.key]; required in [route.order_by]."}),
    field<&OrderByConfig::header>({.path = "route.order_by.header", .doc = "Header name, with from = \"header\"."}),
    field<&OrderByConfig::json_path>(
        {.path = "route.order_by.json", .doc = "Dotted field path in a JSON value, with from = \"json\"."}),
    field<&OrderByConfig::on_dead>(
        {.path = "route.order_by.on_dead",
         .default_value = "go_on",
         .doc = "When an earlier record of an entity ends failed or unknown: \"go_on\" (the later ones run) or "
                "\"hold\" (they wait until a person replays or settles it, or releases the entity: "
                "`idemsink order-holds`)."}),
    field<&OrderByConfig::max_waiting>(
        {.path = "route.order_by.max_waiting",
         .default_value = "10000",
         .min = 1,
         .max = 10000000,
         .doc = "Records of the route kept in memory while they wait for an entity's hold (an earlier record in a "
                "retry topic, or dead with on_dead = \"hold\"). They do not count toward "
                "host.max_buffered_records, so a held entity never pauses other routes; at this many the route's "
                "own topic stops fetching, until half as many wait."}),
    declare(Type::Options,
            {.path = "route.options",
             .doc = "Handler options, checked against the plugin's declarations (`idemsink plugin-info`)."}),
};
static_assert(bindings_match_sections(kRouteSettings), "a setting is bound to a field of another section");
static_assert(defaults_are_choices(kRouteSettings), "a choice's default is not one of its choices");

}  // namespace

namespace detail {
std::span<const Setting> route_settings() { return kRouteSettings; }
}  // namespace detail

}  // namespace idemsink::config
