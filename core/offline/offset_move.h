// Where an operator's rewind or skip of a route (`idemsink route rewind|skip`,
// the console) moves each partition of the route's topic, checked against
// what can still be read: Kafka's log start, and the claims' horizon (a
// record older than claim.retention_days minus horizon_margin_days may have
// lost its claim, so reading it again could run its effect again). The
// moves are applied by the hosts (claim/offset_moves.h).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/claim/offset_moves.h"
#include "core/config/config.h"

namespace idemsink::offline {

struct MoveAsk {
  std::string route;
  claim::OffsetMove::Kind kind = claim::OffsetMove::Kind::Rewind;
  std::optional<int64_t> to_time_ms;                    // every partition: its first record stamped then or later
  std::vector<std::pair<int32_t, int64_t>> to_offsets;  // these partitions (of the route's topic): these offsets
};

struct MovePlan {
  std::vector<claim::OffsetMove> moves;  // group, route, topic, partition, to, kind
  std::string refusal;                   // empty: it may be requested
  std::vector<std::string> lines;        // per partition: where it can be read from, where it goes
};

/// Kafka did not answer what a move needs to know.
class KafkaUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Asks Kafka; throws KafkaUnavailable when it does not answer.
MovePlan plan_move(const config::Config& cfg, const MoveAsk& ask);

/// `--to-time`: a duration back from now ("1h", "30m") or a UTC time
/// ("2026-12-06 14:00", "2026-12-06 14:00:30", "2026-12-06"), as epoch
/// milliseconds. Throws std::invalid_argument.
int64_t point_in_time_ms(const std::string& text);
/// `--to-offset TOPIC:PARTITION:OFFSET`. Throws std::invalid_argument.
std::pair<int32_t, int64_t> partition_offset(const std::string& text, const std::string& topic);

}  // namespace idemsink::offline
