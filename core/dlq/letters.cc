#include "core/dlq/letters.h"

#include <array>

#include "core/claim/claim_store.h"
#include "core/common/util.h"

namespace idemsink::dlq {
namespace {

using db::Connection;

enum Column : size_t {
  kId,
  kRoute,
  kReason,
  kError,
  kBizKey,
  kSrcTopic,
  kSrcPartition,
  kSrcOffset,
  kToken,
  kCalls,
  kCreated,
  kState,
  kClaimStatus,
  kDiscardNote,
  kMsgKey,
  kMsgValue,
  kMsgHeaders,
  kMsgTimestamp,
  kColumns
};
// The columns of a letter, by name; the last four only for one whole letter.
constexpr std::array<std::string_view, kColumns> kSelect = {
    "o.id",
    "o.route",
    "o.reason",
    "IFNULL(o.error, '')",
    "o.biz_key",
    "o.src_topic",
    "o.src_partition",
    "o.src_offset",
    "IFNULL(o.idem_token, '')",
    "o.calls",
    "DATE_FORMAT(o.created_at, '%Y-%m-%dT%H:%i:%s.%fZ')",
    "CASE WHEN o.discarded_at IS NOT NULL THEN 'discarded' WHEN o.unpublishable_at IS NOT NULL AND o.published_at IS "
    "NULL THEN 'unpublishable' WHEN o.published_at IS NOT NULL THEN 'published' WHEN o.held_until IS NOT NULL THEN "
    "'held' ELSE 'pending' END",
    "IFNULL(c.status, 0)",
    "IFNULL(o.discard_note, '')",
    "o.msg_key",
    "o.msg_value",
    "o.msg_headers",
    "o.msg_timestamp"};

std::string select(size_t columns) {
  std::string out = "SELECT ";
  for (size_t i = 0; i < columns; ++i) out += (i ? ", " : "") + std::string(kSelect[i]);
  // The claim by its token (indexed), in the letter's route.
  return out +
         " FROM idemsink_dlq_outbox o LEFT JOIN idemsink_claim c ON c.idem_token = o.idem_token AND c.namespace = "
         "o.route WHERE " +
         sql_purpose_is(Purpose::DeadLetter, "o.");
}

LetterRow read_row(const db::Row& r, bool whole) {
  LetterRow l;
  l.id = std::stoull(*r[kId]);
  l.route = *r[kRoute];
  l.reason = *r[kReason];
  l.error = *r[kError];
  l.biz_key = r[kBizKey];
  l.src_topic = *r[kSrcTopic];
  l.src_partition = std::stoi(*r[kSrcPartition]);
  l.src_offset = std::stoll(*r[kSrcOffset]);
  l.idem_token = *r[kToken];
  l.calls = static_cast<uint32_t>(std::stoul(*r[kCalls]));
  l.created_at = *r[kCreated];
  l.state = *r[kState];
  const int status = std::stoi(*r[kClaimStatus]);
  l.claim_status = status == 0 ? "" : claim::to_string(static_cast<claim::Status>(status));
  l.discard_note = *r[kDiscardNote];
  if (whole) {
    l.key = r[kMsgKey];
    l.value = r[kMsgValue];
    l.headers = decode_headers(r[kMsgHeaders].value_or(""));
    l.timestamp_ms = std::stoll(*r[kMsgTimestamp]);
  }
  return l;
}

}  // namespace

std::vector<LetterRow> list_letters(Connection& c, const LetterQuery& q) {
  std::string sql = select(kMsgKey);
  if (!q.route.empty()) sql += " AND o.route = " + c.quote(q.route);
  if (!q.reason.empty()) sql += " AND o.reason = " + c.quote(q.reason);
  if (!q.key.empty()) sql += " AND o.biz_key = " + Connection::hex(q.key);
  if (!q.since.empty()) sql += " AND o.created_at >= " + q.since;
  if (!q.include_discarded) sql += " AND o.discarded_at IS NULL";
  if (q.before_id > 0) sql += " AND o.id < " + std::to_string(q.before_id);
  sql += " ORDER BY o.id DESC LIMIT " + std::to_string(q.limit);
  std::vector<LetterRow> out;
  for (const auto& r : c.query(sql)) out.push_back(read_row(r, false));
  return out;
}

std::optional<LetterRow> letter(Connection& c, uint64_t id) {
  const auto rows = c.query(select(kColumns) + " AND o.id = " + std::to_string(id));
  if (rows.empty()) return std::nullopt;
  return read_row(rows.front(), true);
}

bool discard_letter(Connection& c, uint64_t id, const std::string& note) {
  // Still waiting for Kafka: stamped, so the relay leaves it (as a discard
  // of an unpublishable row always did).
  // publish_error before published_at: MariaDB assigns left to right.
  return c.execute("UPDATE idemsink_dlq_outbox SET discarded_at = NOW(3), discard_note = " +
                   c.quote(sanitize_utf8(note, 1024)) + ", publish_error = IF(published_at IS NULL, " +
                   c.quote(sanitize_utf8("discarded by operator: " + note, 255)) +
                   ", publish_error), published_at = IFNULL(published_at, NOW(3)) WHERE id = " + std::to_string(id) +
                   " AND " + sql_purpose_is(Purpose::DeadLetter) + " AND discarded_at IS NULL") == 1;
}

}  // namespace idemsink::dlq
