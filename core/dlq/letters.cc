#include "core/dlq/letters.h"

#include <array>

#include "core/claim/claim_store.h"
#include "core/common/util.h"
#include "core/dlq/headers.h"

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

std::map<std::string, int64_t> open_letters_by_route(Connection& c) {
  std::map<std::string, int64_t> out;
  for (auto& r : c.query("SELECT route, COUNT(*) FROM idemsink_dlq_outbox WHERE " +
                         sql_purpose_is(Purpose::DeadLetter) + " AND discarded_at IS NULL GROUP BY route"))
    out[*r[0]] = std::stoll(*r[1]);
  return out;
}

std::optional<StoredMessage> newest_message(Connection& c, const std::string& token) {
  for (auto& r : c.query("SELECT msg_key, msg_value, msg_timestamp FROM idemsink_dlq_outbox WHERE idem_token = " +
                         c.quote(token) + " ORDER BY id DESC LIMIT 1"))
    return StoredMessage{r[0], r[1], std::stoll(*r[2])};
  return std::nullopt;
}

std::map<std::string, LetterMessage> dead_letter_messages(Connection& c, const std::vector<std::string>& tokens) {
  std::map<std::string, LetterMessage> out;
  if (tokens.empty()) return out;
  std::string list;
  for (const auto& t : tokens) list += (list.empty() ? "" : ", ") + c.quote(t);
  // In id order: the newest row of a token is the one left.
  for (auto& r : c.query("SELECT idem_token, msg_key, msg_value, msg_timestamp, reason FROM idemsink_dlq_outbox "
                         "WHERE idem_token IN (" +
                         list + ") AND " + sql_purpose_is(Purpose::DeadLetter) + " ORDER BY id")) {
    LetterMessage& m = out[*r[0]];
    m.key = r[1];
    m.value = r[2];
    m.timestamp_ms = std::stoll(*r[3]);
    m.reason = *r[4];
  }
  return out;
}

std::set<int64_t> offsets_in_outbox(Connection& c, const std::string& route, const std::string& topic,
                                    int32_t partition, const std::vector<int64_t>& offsets) {
  std::set<int64_t> out;
  if (offsets.empty()) return out;
  std::string list;
  for (int64_t o : offsets) list += (list.empty() ? "" : ",") + std::to_string(o);
  for (auto& r : c.query("SELECT src_offset FROM idemsink_dlq_outbox WHERE route = " + Connection::hex(route) +
                         " AND src_topic = " + c.quote(topic) + " AND src_partition = " + std::to_string(partition) +
                         " AND src_offset IN (" + list + ") AND NOT " + sql_is_event()))
    out.insert(std::stoll(*r[0]));
  return out;
}

std::vector<LostRange> lost_ranges(Connection& c, const std::string& route, const std::string& topic,
                                   int32_t partition) {
  std::vector<LostRange> out;
  for (auto& r :
       c.query("SELECT src_offset, msg_headers, host, created_at FROM idemsink_dlq_outbox WHERE route = " +
               Connection::hex(route) + " AND " + sql_purpose_is(Purpose::Lost) + " AND src_topic = " + c.quote(topic) +
               " AND src_partition = " + std::to_string(partition) + " ORDER BY src_offset")) {
    LostRange range{std::stoll(*r[0]), std::stoll(*r[0]) + 1, r[2].value_or("?"), r[3].value_or("?")};
    for (const auto& h : decode_headers(r[1].value_or("")))
      if (h.name == headers::kLostTo && h.value) range.to = std::stoll(*h.value);
    out.push_back(std::move(range));
  }
  return out;
}

namespace {

// What a page of failed claims reads: the claim and its newest dead letter,
// column by column.
enum FailedColumn : size_t {
  kFailedBizKey,
  kFailedBucket,
  kFailedToken,
  kFailedClaimTopic,
  kFailedClaimPartition,
  kFailedClaimOffset,
  kFailedLetterId,
  kFailedReason,
  kFailedSrcTopic,
  kFailedSrcPartition,
  kFailedSrcOffset,
  kFailedLetterKey,
  kFailedLetterValue,
  kFailedLetterHeaders,
  kFailedLetterTimestamp,
  kFailedColumns
};
constexpr std::array<std::string_view, kFailedColumns> kFailedSelect = {"c.biz_key",
                                                                        "DATE_FORMAT(c.bucket, '%Y-%m-%d')",
                                                                        "c.idem_token",
                                                                        "c.src_topic",
                                                                        "c.src_partition",
                                                                        "c.src_offset",
                                                                        "o.id",
                                                                        "o.reason",
                                                                        "o.src_topic",
                                                                        "o.src_partition",
                                                                        "o.src_offset",
                                                                        "o.msg_key",
                                                                        "o.msg_value",
                                                                        "o.msg_headers",
                                                                        "o.msg_timestamp"};

}  // namespace

std::vector<FailedClaim> failed_claims(Connection& c, const FailedQuery& q, const std::optional<claim::RowKey>& after,
                                       size_t limit) {
  std::string where =
      "c.namespace = " + Connection::hex(q.route) + " AND " + claim::sql_status_is(claim::Status::Failed, "c.");
  if (q.key) where += " AND c.biz_key = " + Connection::hex(*q.key);
  if (q.since) where += " AND c.updated_at >= " + *q.since;
  // The newest dead letter of each claim (a replayed record dead again has a newer one).
  const std::string letter =
      "(SELECT MAX(o2.id) FROM idemsink_dlq_outbox o2 WHERE o2.idem_token = c.idem_token AND o2.route = c.namespace "
      "AND " +
      sql_purpose_is(Purpose::DeadLetter, "o2.") + ")";
  if (q.reason) where += " AND o.reason = " + c.quote(*q.reason);
  // A letter an operator discarded needs nothing more.
  where += " AND o.discarded_at IS NULL";
  if (!q.letter_ids.empty()) {
    std::string ids;
    for (uint64_t id : q.letter_ids) ids += (ids.empty() ? "" : ", ") + std::to_string(id);
    where += " AND o.id IN (" + ids + ")";
  }
  if (after)
    where += " AND (c.biz_key, c.bucket) > (" + Connection::hex(after->biz_key) + ", DATE'" + after->bucket + "')";
  std::string select = "SELECT ";
  for (size_t i = 0; i < kFailedSelect.size(); ++i) select += (i ? ", " : "") + std::string(kFailedSelect[i]);
  std::vector<FailedClaim> out;
  for (const auto& r : c.query(select + " FROM idemsink_claim c LEFT JOIN idemsink_dlq_outbox o ON o.id = " + letter +
                               " WHERE " + where + " ORDER BY c.biz_key, c.bucket LIMIT " + std::to_string(limit))) {
    FailedClaim f;
    f.row = {q.route, *r[kFailedBizKey], *r[kFailedBucket]};
    f.token = *r[kFailedToken];
    f.src = *r[kFailedClaimTopic] + "[" + *r[kFailedClaimPartition] + "]@" + *r[kFailedClaimOffset];
    if (r[kFailedLetterId]) {
      f.letter_id = std::stoull(*r[kFailedLetterId]);
      Letter d;
      d.headers = decode_headers(r[kFailedLetterHeaders].value_or(""));
      d.src_topic = *r[kFailedSrcTopic];
      d.src_partition = std::stoi(*r[kFailedSrcPartition]);
      d.src_offset = std::stoll(*r[kFailedSrcOffset]);
      d.key = r[kFailedLetterKey];
      d.value = r[kFailedLetterValue];
      d.timestamp_ms = std::stoll(*r[kFailedLetterTimestamp]);
      f.letter = std::move(d);
    }
    out.push_back(std::move(f));
  }
  return out;
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
