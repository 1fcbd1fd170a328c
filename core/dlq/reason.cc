#include "core/dlq/reason.h"

#include <array>
#include <utility>

namespace idemsink::dlq {
namespace {

constexpr std::array<std::pair<Reason, const char*>, 20> kNames{{
    {Reason::RecordTooLarge, "record_too_large"},
    {Reason::MissingKey, "missing_key"},
    {Reason::UndecodableValue, "undecodable_value"},
    {Reason::BizKeyTooLong, "biz_key_too_long"},
    {Reason::OrderKeyTooLong, "order_key_too_long"},
    {Reason::MissingTimestamp, "missing_timestamp"},
    {Reason::BeyondReplayHorizon, "beyond_replay_horizon"},
    {Reason::TimestampInFuture, "timestamp_in_future"},
    {Reason::PayloadConflict, "payload_conflict"},
    {Reason::Permanent, "permanent"},
    {Reason::RetriesExhausted, "retries_exhausted"},
    {Reason::Uncertain, "uncertain"},
    {Reason::OwnerVanished, "owner_vanished"},
    {Reason::CrashLoop, "crash_loop"},
    {Reason::MaybeApplied, "maybe_applied"},
    {Reason::NotApplied, "not_applied"},
    {Reason::DbRejected, "db_rejected"},
    {Reason::DeletedByRetention, "deleted_by_retention"},
    {Reason::NoClaimPartition, "no_claim_partition"},
    {Reason::Retry, "retry"},
}};

}  // namespace

const char* to_string(Reason r) {
  for (const auto& [reason, name] : kNames)
    if (reason == r) return name;
  return "?";
}

std::optional<Reason> reason_from_string(std::string_view s) {
  for (const auto& [reason, name] : kNames)
    if (s == name) return reason;
  return std::nullopt;
}

}  // namespace idemsink::dlq
