// The offsets kept with the outcomes: per (group, topic, partition), the
// offset below which every record's outcome is durable in this database.
//
// Kafka's committed offset says the same, but a database that goes back in
// time (a promoted asynchronous replica lacking the last seconds of commits)
// loses outcomes Kafka still counts on: a record whose claim vanished would
// be skipped for good. The row here is written before each Kafka commit
// (replication applies transactions in commit order, so a database that has
// the row has every outcome below it), and on assignment a partition starts
// from it when it is behind Kafka's: the lost window is read again. Kafka's
// commit stays as the mirror that lag and tooling read.
//
// A group that begins its topic at the end (route.start_at = "latest")
// stores when it began, and for each partition the offset it began at
// (begin_at), before it takes a record.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/db/connection.h"

namespace idemsink::claim {

struct StoredOffset {
  std::string topic;
  int32_t partition = 0;
  int64_t offset = 0;  // the next record to consume
};

class OffsetStore {
 public:
  OffsetStore(std::string group, std::string host) : group_(std::move(group)), host_(std::move(host)) {}

  static const char* schema();

  /// The stored offsets of these partitions (absent: never stored here).
  std::map<std::pair<std::string, int32_t>, int64_t> read(db::Connection& c,
                                                          std::span<const std::pair<std::string, int32_t>> tps) const;
  /// Stores these offsets, one statement.
  void write(db::Connection& c, std::span<const StoredOffset> offsets) const;
  /// start_at latest: when the group began `topic` (epoch ms), if it has.
  std::optional<int64_t> topic_began(db::Connection& c, const std::string& topic) const;
  /// A partition nobody committed, begun at `offset` (the first record
  /// stamped at or after `began_ms`, when the group began the topic): stored
  /// before a record is taken, so that a member taking it over after a crash
  /// begins there too, and so that the audit knows where the group began.
  /// False when a row was there already (then read it).
  bool begin_at(db::Connection& c, const std::string& topic, int32_t partition, int64_t offset, int64_t began_ms) const;
  /// Where the group began partitions (start_at latest; the audit starts there).
  std::map<std::pair<std::string, int32_t>, int64_t> first_offsets(db::Connection& c) const;

 private:
  std::string group_;
  std::string host_;
};

}  // namespace idemsink::claim
