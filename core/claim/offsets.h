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
// A group that begins a partition at the log's end (route.start_at =
// "latest") stores that end first (begin_at_end), as a concrete offset.
#pragma once

#include <cstdint>
#include <map>
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
  /// A partition nobody committed, begun at the log's end `end` (start_at
  /// latest): stored before a record is taken, so that a member taking it
  /// over after a crash starts here too, not at a later end (which would
  /// pass over what arrived between), and so that the audit knows where the
  /// group began. False when a row was there already (then read it).
  bool begin_at_end(db::Connection& c, const std::string& topic, int32_t partition, int64_t end) const;
  /// Where the group began partitions at the log's end (the audit starts there).
  std::map<std::pair<std::string, int32_t>, int64_t> first_offsets(db::Connection& c) const;

 private:
  std::string group_;
  std::string host_;
};

}  // namespace idemsink::claim
