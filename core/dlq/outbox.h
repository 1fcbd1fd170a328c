// The outbox: records on their way to another topic, made durable in the
// business database before the source offset may move past them.
//
//   dead letter  a record that ends `failed` or `unknown` gets its row in the
//                same transaction as the claim transition; a record that
//                cannot even be claimed (poison input, payload conflict,
//                beyond the replay horizon) gets only the row
//   forward      a record moving on to its next retry topic gets its row in
//                the transaction that releases its claim
//   lost         offsets [src_offset, lost_to) of a partition that Kafka deleted
//                by retention before the group read them: no record, no
//                outcome; written before the commit passes them, listed by
//                `idemsink audit`, never published
//   held         an unknown record of a route whose plugin can reconcile: its
//                row (the payload a re-drive needs) is held back for
//                claim.unknown_dlq_after, and published only if the claim is
//                still unknown then; settled, it is stamped and never sent
//
// The relay (relay.h) publishes unpublished rows to Kafka and stamps them; if
// Kafka refuses, the rows wait and the source partition keeps flowing. A row
// Kafka can never take (too large, topic unknown, not authorised) is set
// aside as unpublishable, so the rows after it flow; an operator lists,
// retries or discards it (`idemsink outbox`). Published rows are purged after
// claim.outbox_retention. One row per route, purpose and source record (and
// event id, for outcome events), so re-running a job or redelivering the
// record never adds a second entry, while a record forwarded and later
// dead-lettered keeps both, and each of a record's outcomes keeps its event.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/common/source.h"
#include "core/db/connection.h"

namespace idemsink::dlq {

/// A Kafka header as stored in the outbox.
struct StoredHeader {
  std::string name;
  std::optional<std::string> value;
};

/// What an outbox row is for; the values are the table's `purpose` column.
enum class Purpose : int {
  DeadLetter = 1,    ///< to the route's DLQ topic
  Forward = 2,       ///< to the route's next retry topic
  Replay = 3,        ///< back to the route's source topic: an operator replays a dead record
  Lost = 4,          ///< not a record: offsets Kafka deleted by retention before they were read (never published)
  EventDone = 5,     ///< an outcome event ([route.output]) of a record done
  EventFailed = 6,   ///< ... of a record that ended failed
  EventUnknown = 7,  ///< ... of a record that ended unknown
};
/// An outcome event (outcome_event.h), not a copy of a record.
inline bool is_event(Purpose p) {
  return p == Purpose::EventDone || p == Purpose::EventFailed || p == Purpose::EventUnknown;
}
/// The row's record has its outcome already (a dead letter, an event): a row
/// Kafka cannot take is set aside for an operator. A forward or a replay
/// carries a record still on its way, which waits instead.
inline bool record_finished(Purpose p) { return p == Purpose::DeadLetter || is_event(p); }
/// SQL: "<alias>purpose = N", N from the enum (never a literal in a statement).
std::string sql_purpose_is(Purpose p, std::string_view alias = "");
/// SQL: the row is an outcome event.
std::string sql_is_event(std::string_view alias = "");

/// One outbox row.
struct Letter : Source {
  uint64_t id = 0;  // set when read back
  Purpose purpose = Purpose::DeadLetter;
  std::string route;
  /// Where the relay publishes it: the DLQ topic or the next retry topic;
  /// empty when the route does not publish its dead letters (the row is the record).
  std::string topic;
  std::optional<std::string> biz_key;
  std::string reason;  // to_string(Reason), see reason.h
  std::string error;   // human-readable message
  std::optional<std::string> key;
  std::optional<std::string> value;
  std::vector<StoredHeader> headers;
  int64_t timestamp_ms = 0;
  std::string idem_token;  // empty without a claim
  uint32_t calls = 0;
  int64_t first_failure_ms = 0;
  int64_t last_failure_ms = 0;
  std::string host;
  /// Held back from publishing this long (0: publish at once).
  std::chrono::milliseconds hold{0};
  /// An outcome event's id: one row per event, as a record may have several
  /// events of one purpose at one position (failed, replayed, failed again).
  /// Empty for every other row: one per route, purpose and position.
  std::string event_id;
};

std::string encode_headers(const std::vector<StoredHeader>& headers);
std::vector<StoredHeader> decode_headers(std::string_view blob);

/// A row Kafka refused for good, waiting for an operator.
struct Unpublishable : Source {
  uint64_t id = 0;
  std::string route;
  std::string topic;
  std::string reason;
  uint64_t bytes = 0;  // key + value
  std::string publish_error;
  std::string since;
};

class Outbox {
 public:
  Outbox(std::string owner, std::chrono::milliseconds lease) : owner_(std::move(owner)), lease_(lease) {}

  static const char* schema();
  /// Brings a table created by an earlier version up to schema().
  static void migrate(db::Connection& c);
  /// Reads nothing from the table: throws the server's error when it is missing.
  static void check_table(db::Connection& c);

  /// Inserts rows (INSERT IGNORE on route, purpose, source position and event id),
  /// owned by us so no other host's relay publishes them while ours is about
  /// to; as many statements as the server's packet size needs.
  void insert(db::Connection& c, std::span<const Letter> letters) const;
  /// Inserts a replay row, replacing an earlier replay of the same source
  /// position (published, or never published because its claim failed again
  /// before: the new row carries the current token and headers).
  void insert_replay(db::Connection& c, const Letter& replay) const;

  /// Takes unpublished rows that are ours, released, or whose owner's lease
  /// ran out: up to `limit`, and up to `byte_budget` of keys and values (at
  /// least one row), oldest first; rows set aside as unpublishable are not,
  /// nor rows in `exclude` (in flight already) or bound for `skip_topics`.
  std::vector<Letter> take(db::Connection& c, size_t limit, uint64_t byte_budget,
                           std::span<const uint64_t> exclude = {}, std::span<const std::string> skip_topics = {}) const;

  /// Extends the lease of these unpublished rows of ours (in flight, waiting
  /// for the broker). Returns rows touched.
  uint64_t renew(db::Connection& c, std::span<const uint64_t> ids) const;

  /// Stamps rows as published.
  void mark_published(db::Connection& c, std::span<const uint64_t> ids) const;
  /// Sets a row aside: Kafka refused it for good.
  void mark_unpublishable(db::Connection& c, uint64_t id, std::string_view error) const;

  /// Unpublished rows waiting for the relay, all hosts (held ones only once
  /// their hold is over).
  uint64_t pending(db::Connection& c) const;
  /// The held rows of these claims, settled done (by reconciliation or an
  /// operator), are stamped and never published. Returns rows stamped.
  static uint64_t settle_held(db::Connection& c, std::span<const std::string> idem_tokens);
  /// A claim settled failed: its held dead letter is published now, with the
  /// settlement's reason and error, like every failed record's. One already
  /// published (its hold ran out while it was unknown) is left as it is.
  static uint64_t publish_settled_failure(db::Connection& c, std::string_view idem_token, std::string_view reason,
                                          std::string_view error);
  /// Rows set aside as unpublishable, all hosts.
  uint64_t unpublishable(db::Connection& c) const;
  /// Both counts by route: {pending, unpublishable} (routes with neither left out).
  std::map<std::string, std::pair<uint64_t, uint64_t>> backlog_by_route(db::Connection& c) const;
  std::vector<Unpublishable> list_unpublishable(db::Connection& c, size_t limit) const;
  /// An operator's decision on an unpublishable row: publish it again (after
  /// fixing the topic or the limits), or drop it from the queue (it stays in
  /// the table, stamped, with the note). False if no such row is set aside.
  bool retry_unpublishable(db::Connection& c, uint64_t id) const;
  bool discard_unpublishable(db::Connection& c, uint64_t id, std::string_view note) const;

  /// Deletes published rows older than `age`, at most `batch` of them (a
  /// short statement, no long locks). Returns rows deleted.
  uint64_t purge_published(db::Connection& c, std::chrono::milliseconds age, size_t batch) const;

 private:
  std::string owner_;
  std::chrono::milliseconds lease_;
};

}  // namespace idemsink::dlq
