// The Kafka headers idemsink writes on the records it publishes (DLQ
// entries and retry-topic forwards), and reads back from retry topics.
// docs/dlq.md describes each.
#pragma once

#include <librdkafka/rdkafka.h>

#include <cstdint>
#include <optional>
#include <string_view>

namespace idemsink::dlq::headers {

// Where the record was consumed when it was dead-lettered or forwarded.
inline constexpr const char* kSourceTopic = "idemsink.source.topic";
inline constexpr const char* kSourcePartition = "idemsink.source.partition";
inline constexpr const char* kSourceOffset = "idemsink.source.offset";
// Where it was first consumed (kept across retry tiers).
inline constexpr const char* kOriginTopic = "idemsink.origin.topic";
inline constexpr const char* kOriginPartition = "idemsink.origin.partition";
inline constexpr const char* kOriginOffset = "idemsink.origin.offset";
inline constexpr const char* kRoute = "idemsink.route";
inline constexpr const char* kReason = "idemsink.reason";
inline constexpr const char* kError = "idemsink.error";
/// Handler calls made so far; a retry tier continues counting from it.
inline constexpr const char* kAttempt = "idemsink.attempt";
/// Of those calls, the ones whose outcome was uncertain (the effect may have
/// happened); a retry tier continues counting from it.
inline constexpr const char* kUncertainCalls = "idemsink.uncertain_calls";
inline constexpr const char* kIdemToken = "idemsink.idem_token";
inline constexpr const char* kBizKey = "idemsink.biz_key";
inline constexpr const char* kFirstFailureMs = "idemsink.first_failure_ms";
inline constexpr const char* kLastFailureMs = "idemsink.last_failure_ms";
inline constexpr const char* kHost = "idemsink.host";
/// Present when the record's key and value were cut to route.max_record_bytes
/// (a record refused as too large): their original sizes, "key,value".
inline constexpr const char* kPayloadCut = "idemsink.payload_cut";
/// The database refused the record's row (reason db_rejected): MariaDB's code
/// and message. The DLQ copy then carries no payload.
inline constexpr const char* kDbError = "idemsink.db_error";
/// Offsets lost to retention (outbox purpose 4): the end of the range (exclusive).
inline constexpr const char* kLostTo = "idemsink.lost_to";
/// The outbox row's id: a consumer that must drop a rare repeat keys on it.
inline constexpr const char* kOutboxId = "idemsink.outbox_id";
// Retry-topic forwards only.
inline constexpr const char* kRetryDueMs = "idemsink.retry.due_ms";
inline constexpr const char* kRetryTier = "idemsink.retry.tier";
// Outcome events ([route.output], outcome_event.h).
/// The same for every publication of one claim's outcome: drop repeats by it.
inline constexpr const char* kEventId = "idemsink.event_id";
/// done, failed or unknown.
inline constexpr const char* kOutcome = "idemsink.outcome";
/// W3C trace context, copied from the source record to its event.
inline constexpr const char* kTraceparent = "traceparent";
/// How many times `idemsink replay` sent this record back to its source topic.
inline constexpr const char* kReplayed = "idemsink.replayed";

/// Headers of an earlier pass (a record replayed from a DLQ, or back from a
/// retry topic) that a new pass replaces rather than piles up; the origin
/// headers survive, so a retried record keeps its first position, and so
/// does idemsink.replayed.
bool replaced_on_republish(std::string_view name);

/// The value of a record's last header `name` (valid while `msg` is).
std::optional<std::string_view> text(const rd_kafka_message_t* msg, const char* name);
/// The decimal integer value of a record's last header `name`.
std::optional<int64_t> integer(const rd_kafka_message_t* msg, const char* name);

/// The route a copy `idemsink replay` put back on a source topic is meant
/// for (the route whose dead letter it was), if `msg` is such a copy. The
/// other routes of that topic took the record once already and skip it;
/// the route itself takes it whatever its [route.when] says now, as it took
/// it before. (A copy of such a record elsewhere, a stream processor's
/// output carrying its headers, names no route of that topic: taken.)
std::optional<std::string_view> replay_target(const rd_kafka_message_t* msg);

}  // namespace idemsink::dlq::headers
