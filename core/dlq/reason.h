// Why a record went to the dead-letter queue (or on to a retry topic): the
// machine-readable class carried in the `idemsink.reason` header and the
// outbox's `reason` column. docs/dlq.md lists every reason with its meaning.
#pragma once

#include <optional>
#include <string_view>

namespace idemsink::dlq {

enum class Reason {
  // Refused before a claim (poison input; the record never ran)
  RecordTooLarge,       ///< key + value above route.max_record_bytes
  MissingKey,           ///< no biz_key where the route says it is
  UndecodableValue,     ///< the value is not the JSON the key extraction needs
  BizKeyTooLong,        ///< biz_key above 255 bytes
  OrderKeyTooLong,      ///< [route.order_by] key above 255 bytes
  MissingTimestamp,     ///< no timestamp: the claim's month cannot be chosen
  BeyondReplayHorizon,  ///< older than retention minus margin: its claim may be gone
  TimestampInFuture,    ///< more than claim.max_future_skew ahead
  PayloadConflict,      ///< the key was claimed with a different payload
  // Ended by the failure policy
  Permanent,         ///< the handler rejected it for good
  RetriesExhausted,  ///< retryable failures until the attempts ran out
  Uncertain,         ///< at-most-once call that may or may not have happened (unknown)
  OwnerVanished,     ///< at-most-once claim taken over from a dead owner (unknown)
  CrashLoop,         ///< taken over claim.max_takeovers times: it may be killing its host (unknown)
  MaybeApplied,      ///< out of attempts, but an earlier call may have applied it (unknown)
  NotApplied,        ///< an unknown settled failed: the remote never applied it, and its attempts are spent
  DbRejected,        ///< the database refused the record's row (idemsink.db_error says why)
  NoClaimPartition,  ///< the record's month has no claim partition and schema changes are off
  // Not a dead letter: the record moves on to its next retry topic
  Retry,
  // Not a record: offsets Kafka deleted by retention before they were read
  DeletedByRetention,
};

const char* to_string(Reason r);
std::optional<Reason> reason_from_string(std::string_view s);

}  // namespace idemsink::dlq
