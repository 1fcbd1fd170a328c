// `idemsink audit`: proves the commit rule after the fact. Every record of
// every route topic below the group's committed offset must be accounted
// for: a terminal claim (done, failed, unknown) for its key, or a DLQ
// outbox row for its exact position (poison input, retry forwards), or an
// operator's skip that passed over it (named in the report, never as lost).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "core/config/config.h"

namespace idemsink::offline {

struct PartitionAudit {
  std::string route;  // routes of one topic are audited apart, each in its group
  std::string topic;
  int32_t partition = 0;
  int64_t low = 0;        // oldest offset Kafka still has
  int64_t committed = 0;  // the group's commit point (exclusive)
  int64_t consumed = 0;   // records read in [low, committed)
  int64_t by_claim = 0;
  int64_t by_outbox = 0;
  int64_t skipped = 0;           // not taken by the route ([route.when])
  std::vector<int64_t> missing;  // offsets accounted for by nothing
  /// Offset ranges [from, to) Kafka deleted by retention before the group
  /// read them, as the host recorded them, with who and when.
  struct Lost {
    int64_t from;
    int64_t to;
    std::string noted;
  };
  std::vector<Lost> lost;
  /// Ranges [from, to) an operator's skip passed over (claim/offset_moves.h):
  /// a record there with no outcome is accounted as skipped by them.
  struct OperatorSkip {
    int64_t from;
    int64_t to;
    std::string noted;  // which skip, who, when, why
  };
  std::vector<OperatorSkip> operator_skips;
  int64_t by_operator_skip = 0;
  bool skipped_by_operator(int64_t offset) const {
    for (const auto& s : operator_skips)
      if (offset >= s.from && offset < s.to) return true;
    return false;
  }
};

struct AuditReport {
  std::vector<PartitionAudit> partitions;
  bool ok() const;
  void print(std::ostream& os) const;
};

/// Reads the topics and the database; throws on Kafka or database errors.
AuditReport audit(const config::Config& cfg);

}  // namespace idemsink::offline
