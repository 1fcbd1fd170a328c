// Dead letters as an operator sees them (the console, `idemsink outbox`):
// the dead-letter rows of the outbox, filtered, with what became of each
// record (its claim's status now: a replayed record shows done), one whole
// with its payload and headers, and an operator's discard. The outbox's
// other SQL is in outbox.cc.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/common/source.h"
#include "core/claim/claim_store.h"
#include "core/db/connection.h"
#include "core/dlq/outbox.h"

namespace idemsink::dlq {

struct LetterQuery {
  std::string route;   // empty: every route
  std::string reason;  // the idemsink.reason
  std::string key;     // one biz_key
  std::string since;   // SQL expression: letters written at or after it
  bool include_discarded = false;
  size_t limit = 50;
  uint64_t before_id = 0;  // paging: letters older than this id
};

struct LetterRow : Source {
  uint64_t id = 0;
  std::string route;
  std::string reason;
  std::string error;
  std::optional<std::string> biz_key;
  std::string idem_token;
  uint32_t calls = 0;
  std::string created_at;
  std::string state;         // published, pending, held, unpublishable, discarded
  std::string claim_status;  // the claim's status now ("" without a claim)
  std::string discard_note;
  // Only in letter(): the record itself.
  std::optional<std::string> key;
  std::optional<std::string> value;
  std::vector<StoredHeader> headers;
  int64_t timestamp_ms = 0;
};

/// Newest first.
std::vector<LetterRow> list_letters(db::Connection& c, const LetterQuery& q);
/// One dead letter, whole; none if no dead letter has this id.
std::optional<LetterRow> letter(db::Connection& c, uint64_t id);
/// Dead letters not discarded, counted per route (the console's routes).
std::map<std::string, int64_t> open_letters_by_route(db::Connection& c);

/// A record as an outbox row keeps it.
struct StoredMessage {
  std::optional<std::string> key;
  std::optional<std::string> value;
  int64_t timestamp_ms = 0;
};
/// The record of the newest outbox row of `token`, of any purpose (the
/// console's unknown record); none without a row.
std::optional<StoredMessage> newest_message(db::Connection& c, const std::string& token);
/// The record each of `tokens` was dead-lettered with (its newest dead
/// letter), and the letter's reason, by token; tokens without one are
/// missing (the reconciler's look-ups and re-drives).
struct LetterMessage : StoredMessage {
  std::string reason;
};
std::map<std::string, LetterMessage> dead_letter_messages(db::Connection& c, const std::vector<std::string>& tokens);

/// Of `offsets` of one partition of a route's topic, those with an outbox
/// row other than an outcome event: dead-lettered, forwarded or noted lost
/// (the audit).
std::set<int64_t> offsets_in_outbox(db::Connection& c, const std::string& route, const std::string& topic,
                                    int32_t partition, const std::vector<int64_t>& offsets);
/// Ranges of one partition a host found deleted by Kafka before it read
/// them (Purpose::Lost), in offset order (the audit).
struct LostRange {
  int64_t from = 0;
  int64_t to = 0;  // exclusive
  std::string host;
  std::string noted_at;
};
std::vector<LostRange> lost_ranges(db::Connection& c, const std::string& route, const std::string& topic,
                                   int32_t partition);

/// Failed claims of one route and, for each, its newest dead letter (a
/// replay's candidates; `idemsink replay`, the console).
struct FailedQuery {
  std::string route;
  std::optional<std::string> reason;  // the dead letter's idemsink.reason
  std::optional<std::string> since;   // SQL expression: claims failed at or after it
  std::optional<std::string> key;     // one biz_key
  std::vector<uint64_t> letter_ids;   // only claims whose newest dead letter is one of these
};
struct FailedClaim {
  claim::RowKey row;
  std::string token;
  std::string src;  // "topic[partition]@offset" of the claim's record
  /// Its newest dead letter not discarded, if the outbox still has it:
  /// the letter's outbox id and the record as it was written.
  uint64_t letter_id = 0;
  std::optional<Letter> letter;
};
/// One page of up to `limit`, in primary key order, after the row `after`
/// (keyset paging; none: from the start).
std::vector<FailedClaim> failed_claims(db::Connection& c, const FailedQuery& q,
                                       const std::optional<claim::RowKey>& after, size_t limit);

/// An operator decides a dead letter needs nothing more: it leaves the list
/// (and is not replayed), and if it is still waiting for Kafka it is not
/// published. False if no such letter, or it is discarded already.
bool discard_letter(db::Connection& c, uint64_t id, const std::string& note);

}  // namespace idemsink::dlq
