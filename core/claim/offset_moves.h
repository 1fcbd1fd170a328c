// An operator's move of a route's offsets (`idemsink route rewind|skip`):
// one row per partition, the target offset, who asked and why; applied by
// whichever host owns the partition (pipeline/partitions.h), which stamps
// where the partition was and when.
//
// A rewind reads records again: each meets its claim (an idempotent hit, no
// call), so rewinding is always safe within the claims' horizon. A skip
// passes over records: the range it passed is kept here, so that the audit
// accounts those records as skipped by an operator, never as lost.
//
// Targets are absolute, so a move applied twice (a host died between moving
// and stamping; the next owner applies it again) lands where it did once.
// A newer move of a partition supersedes an older one not yet applied.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/db/connection.h"

namespace idemsink::claim {

struct OffsetMove {
  enum class Kind { Rewind, Skip };
  uint64_t id = 0;
  std::string group;
  std::string route;
  std::string topic;
  int32_t partition = 0;
  int64_t to = 0;
  Kind kind = Kind::Rewind;
  std::string requested_by;
  std::string note;
  // Once applied:
  std::optional<int64_t> from;  // where the partition's commit point was
  std::string applied_by;       // the host, or "superseded by #id"
  std::string applied_at;
};
const char* to_string(OffsetMove::Kind k);

class OffsetMoves {
 public:
  static const char* schema();
  /// Stores the moves (in the caller's transaction); returns their ids.
  static std::vector<uint64_t> request(db::Connection& c, const std::vector<OffsetMove>& moves);
  /// Of `group`, each partition's newest move not yet applied. A missing
  /// table reads as none (a schema from before moves).
  static std::vector<OffsetMove> pending(db::Connection& c, const std::string& group);
  /// Stamps `move` applied from `from` by `host`, and the partition's older
  /// pending moves superseded. False when another host applied it first
  /// (true again for `host`: a retried job whose commit's reply was lost).
  static bool mark_applied(db::Connection& c, const OffsetMove& move, int64_t from, const std::string& host);
  /// These moves as they are now (the CLI waits for them to be applied).
  static std::vector<OffsetMove> read(db::Connection& c, const std::vector<uint64_t>& ids);
  /// Skips applied to `group`'s `topic`[`partition`] that passed records:
  /// from < to. For the audit.
  static std::vector<OffsetMove> skips(db::Connection& c, const std::string& group, const std::string& topic,
                                       int32_t partition);
};

}  // namespace idemsink::claim
