// Dead letters as an operator sees them (the console, `idemsink outbox`):
// the dead-letter rows of the outbox, filtered, with what became of each
// record (its claim's status now: a replayed record shows done), one whole
// with its payload and headers, and an operator's discard. The outbox's
// other SQL is in outbox.cc.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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

struct LetterRow {
  uint64_t id = 0;
  std::string route;
  std::string reason;
  std::string error;
  std::optional<std::string> biz_key;
  std::string src_topic;
  int32_t src_partition = 0;
  int64_t src_offset = 0;
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
/// An operator decides a dead letter needs nothing more: it leaves the list
/// (and is not replayed), and if it is still waiting for Kafka it is not
/// published. False if no such letter, or it is discarded already.
bool discard_letter(db::Connection& c, uint64_t id, const std::string& note);

}  // namespace idemsink::dlq
