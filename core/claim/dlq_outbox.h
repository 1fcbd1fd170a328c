// The DLQ outbox: dead records made durable in the business database before
// the source offset may move past them.
//
// A record that ends `failed` or `unknown` gets its outbox row in the same
// transaction as the claim transition; a record that cannot even be claimed
// (poison input, payload conflict, beyond the replay horizon) gets only the
// outbox row. The DLQ relay publishes unpublished rows to Kafka and stamps
// them; if Kafka refuses, the rows wait and the source partition keeps
// flowing. One row per source record (unique source position), so re-running
// a job or redelivering the record never adds a second DLQ entry.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/db/connection.h"

namespace idemsink::claim {

/// A Kafka header as stored in the outbox.
struct StoredHeader {
  std::string name;
  std::optional<std::string> value;
};

struct DeadLetter {
  uint64_t id = 0;  // set when read back
  std::string route;
  std::string dlq_topic;
  std::optional<std::string> biz_key;
  std::string reason;  // machine-readable class, see docs/failure-policy.md
  std::string error;   // human-readable message
  std::string src_topic;
  int32_t src_partition = 0;
  int64_t src_offset = 0;
  std::optional<std::string> key;
  std::optional<std::string> value;
  std::vector<StoredHeader> headers;
  int64_t timestamp_ms = 0;
  std::string idem_token;  // empty without a claim
  uint32_t calls = 0;
  int64_t first_failure_ms = 0;
  int64_t last_failure_ms = 0;
  std::string host;
};

std::string encode_headers(const std::vector<StoredHeader>& headers);
std::vector<StoredHeader> decode_headers(std::string_view blob);

class DlqOutbox {
 public:
  DlqOutbox(std::string owner, std::chrono::milliseconds lease) : owner_(std::move(owner)), lease_(lease) {}

  static const char* schema();

  /// Inserts rows (INSERT IGNORE on the source position), owned by us so no
  /// other host's relay publishes them while ours is about to.
  void insert(db::Connection& c, std::span<const DeadLetter> letters) const;

  /// Takes up to `limit` unpublished rows that are ours, released, or whose
  /// owner's lease ran out, and returns them with their payloads.
  std::vector<DeadLetter> take(db::Connection& c, size_t limit) const;

  /// Extends the lease of the unpublished rows we hold (a relay cycle still
  /// waiting for the broker). Returns rows touched.
  uint64_t renew(db::Connection& c) const;

  /// Stamps rows as published.
  void mark_published(db::Connection& c, std::span<const uint64_t> ids) const;

  /// Unpublished rows, all hosts.
  uint64_t pending(db::Connection& c) const;

 private:
  std::string owner_;
  std::chrono::milliseconds lease_;
};

}  // namespace idemsink::claim
