#include "core/dlq/outbox.h"

#include <cstring>

#include "core/claim/claim_store.h"
#include "core/common/util.h"
#include "core/dlq/reason.h"

namespace idemsink::dlq {
namespace {

using db::Connection;

// A held letter (an unknown outcome's, kept back while reconciliation may
// still settle it) goes out once its hold is over, and only while its claim
// is still unknown: the claim module says what "unknown" is.
const std::string kHeldLetterDue = "(held_until IS NULL OR (held_until < NOW(3) AND " +
                                   claim::sql_claim_is_unknown("idemsink_dlq_outbox.idem_token") + "))";

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
bool get_u32(std::string_view& in, uint32_t& v) {
  if (in.size() < 4) return false;
  v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  in.remove_prefix(4);
  return true;
}

std::string opt_hex(const std::optional<std::string>& v) { return v ? Connection::hex(*v) : "NULL"; }

std::string id_list(std::span<const uint64_t> ids) {
  std::string s;
  for (uint64_t id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s;
}

}  // namespace

// Layout: per header, u32 name length, name, u32 value length or
// 0xFFFFFFFF for a null value, value.
std::string encode_headers(const std::vector<StoredHeader>& headers) {
  std::string out;
  for (const auto& h : headers) {
    put_u32(out, static_cast<uint32_t>(h.name.size()));
    out += h.name;
    if (h.value) {
      put_u32(out, static_cast<uint32_t>(h.value->size()));
      out += *h.value;
    } else {
      put_u32(out, 0xFFFFFFFFu);
    }
  }
  return out;
}

std::vector<StoredHeader> decode_headers(std::string_view in) {
  std::vector<StoredHeader> out;
  while (!in.empty()) {
    uint32_t n = 0, vn = 0;
    if (!get_u32(in, n) || in.size() < n) break;
    StoredHeader h;
    h.name = std::string(in.substr(0, n));
    in.remove_prefix(n);
    if (!get_u32(in, vn)) break;
    if (vn != 0xFFFFFFFFu) {
      if (in.size() < vn) break;
      h.value = std::string(in.substr(0, vn));
      in.remove_prefix(vn);
    }
    out.push_back(std::move(h));
  }
  return out;
}

const char* Outbox::schema() {
  return R"(CREATE TABLE IF NOT EXISTS idemsink_dlq_outbox (
  id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  route           VARBINARY(64)   NOT NULL,
    purpose         TINYINT         NOT NULL DEFAULT 1 COMMENT '1 dead letter, 2 forward to a retry topic, 3 replay to the source topic, 4 offsets lost to retention, 5-7 outcome event of a record done, failed, unknown',
  dlq_topic       VARCHAR(249)    NOT NULL COMMENT 'where it is published (a retry topic for a forward)',
  biz_key         VARBINARY(255)  NULL,
  reason          VARCHAR(64)     NOT NULL COMMENT 'machine-readable failure class',
  error           VARCHAR(1024)   NULL,
  src_topic       VARCHAR(249)    NOT NULL,
  src_partition   INT             NOT NULL,
  src_offset      BIGINT          NOT NULL,
  msg_key         MEDIUMBLOB      NULL,
  msg_value       LONGBLOB        NULL,
  msg_headers     MEDIUMBLOB      NULL,
  msg_timestamp   BIGINT          NOT NULL,
  idem_token      CHAR(36) CHARACTER SET ascii NULL,
  calls           INT UNSIGNED    NOT NULL DEFAULT 0,
  first_failure   DATETIME(3)     NOT NULL,
  last_failure    DATETIME(3)     NOT NULL,
  host            VARCHAR(128)    NOT NULL,
  owner           VARCHAR(128)    NULL COMMENT 'relay holding the row for publishing',
  lease_until     DATETIME(3)     NULL,
  created_at      DATETIME(3)     NOT NULL,
  published_at    DATETIME(3)     NULL,
  unpublishable_at DATETIME(3)    NULL COMMENT 'Kafka refused it for good: set aside for an operator',
  publish_error   VARCHAR(255)    NULL,
  held_until      DATETIME(3)     NULL COMMENT 'an unknown record left to reconciliation: published only if still unknown after this',
  discarded_at    DATETIME(3)     NULL COMMENT 'an operator decided it needs nothing more',
  discard_note    VARCHAR(1024)   NULL,
  event_id        VARBINARY(128)  NOT NULL DEFAULT '' COMMENT 'an outcome event: its idemsink.event_id; empty for any other row',
  PRIMARY KEY (id),
  UNIQUE KEY uk_letter (route, purpose, src_topic, src_partition, src_offset, event_id),
    KEY idx_unpublished (published_at, unpublishable_at, lease_until),
  KEY idx_token (idem_token)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4)";
}

void Outbox::check_table(Connection& c) { c.query("SELECT 1 FROM idemsink_dlq_outbox LIMIT 0"); }

void Outbox::migrate(Connection& c) {
  c.execute(
      "ALTER TABLE idemsink_dlq_outbox "
      "ADD COLUMN IF NOT EXISTS purpose TINYINT NOT NULL DEFAULT 1 COMMENT '1 dead letter, 2 forward to a retry topic' "
      "AFTER route, "
      "ADD COLUMN IF NOT EXISTS unpublishable_at DATETIME(3) NULL COMMENT 'Kafka refused it for good: set aside for "
      "an operator' AFTER published_at, "
      "ADD COLUMN IF NOT EXISTS publish_error VARCHAR(255) NULL AFTER unpublishable_at, "
      "ADD COLUMN IF NOT EXISTS held_until DATETIME(3) NULL COMMENT 'an unknown record left to reconciliation: "
      "published only if still unknown after this' AFTER publish_error, "
      "ADD COLUMN IF NOT EXISTS discarded_at DATETIME(3) NULL COMMENT 'an operator decided it needs nothing more' "
      "AFTER held_until, "
      "ADD COLUMN IF NOT EXISTS discard_note VARCHAR(1024) NULL AFTER discarded_at, "
      "ADD COLUMN IF NOT EXISTS event_id VARBINARY(128) NOT NULL DEFAULT '' COMMENT 'an outcome event: its "
      "idemsink.event_id; empty for any other row' AFTER discard_note, "
      "ADD KEY IF NOT EXISTS idx_token (idem_token)");
  // Before event ids were part of the key, a record's second event of one
  // outcome (failed, replayed, failed again) was dropped by INSERT IGNORE.
  const auto key_has_event_id = [&c] {
    return !c.query("SHOW INDEX FROM idemsink_dlq_outbox WHERE Key_name = 'uk_letter' AND Column_name = 'event_id'")
                .empty();
  };
  // The first version's unique key (source position only) dropped a second
  // row for the same record: a forward and its later dead letter.
  if (!c.query("SHOW INDEX FROM idemsink_dlq_outbox WHERE Key_name = 'uk_source'").empty()) {
    c.execute("UPDATE idemsink_dlq_outbox SET " + sql_purpose_is(Purpose::Forward) + " WHERE reason = 'retry'");
    c.execute(
        "ALTER TABLE idemsink_dlq_outbox DROP INDEX uk_source, "
        "ADD UNIQUE KEY uk_letter (route, purpose, src_topic, src_partition, src_offset, event_id), "
        "DROP INDEX idx_unpublished, ADD KEY idx_unpublished (published_at, unpublishable_at, lease_until)");
  }
  if (!key_has_event_id()) {
    // Event rows written before keep an empty id: a repeat of one of them
    // after the upgrade is a new row, published once more, carrying the
    // same idemsink.event_id a consumer drops repeats by.
    c.execute(
        "ALTER TABLE idemsink_dlq_outbox DROP INDEX uk_letter, "
        "ADD UNIQUE KEY uk_letter (route, purpose, src_topic, src_partition, src_offset, event_id)");
  }
}

std::string sql_purpose_is(Purpose p, std::string_view alias) {
  return std::string(alias) + "purpose = " + std::to_string(static_cast<int>(p));
}

std::string sql_is_event(std::string_view alias) {
  return "(" + sql_purpose_is(Purpose::EventDone, alias) + " OR " + sql_purpose_is(Purpose::EventFailed, alias) +
         " OR " + sql_purpose_is(Purpose::EventUnknown, alias) + ")";
}

void Outbox::insert(Connection& c, std::span<const Letter> letters) const {
  const std::string head =
      "INSERT IGNORE INTO idemsink_dlq_outbox (route, purpose, dlq_topic, biz_key, reason, error, src_topic, "
      "src_partition, src_offset, msg_key, msg_value, msg_headers, msg_timestamp, idem_token, calls, first_failure, "
      "last_failure, host, owner, lease_until, held_until, event_id, created_at) VALUES ";
  const std::string owner = c.quote(owner_);
  const std::string lease = "NOW(3) + INTERVAL " + std::to_string(lease_.count() * 1000) + " MICROSECOND";
  std::string sql;
  for (const auto& d : letters) {
    std::string row =
        "(" + Connection::hex(d.route) + ", " + std::to_string(static_cast<int>(d.purpose)) + ", " + c.quote(d.topic) +
        ", " + opt_hex(d.biz_key) + ", " + c.quote(d.reason) + ", " + c.quote(sanitize_utf8(d.error, 1024)) + ", " +
        c.quote(d.src_topic) + ", " + std::to_string(d.src_partition) + ", " + std::to_string(d.src_offset) + ", " +
        opt_hex(d.key) + ", " + opt_hex(d.value) + ", " + Connection::hex(encode_headers(d.headers)) + ", " +
        std::to_string(d.timestamp_ms) + ", " + (d.idem_token.empty() ? "NULL" : c.quote(d.idem_token)) + ", " +
        std::to_string(d.calls) + ", FROM_UNIXTIME(" + std::to_string(d.first_failure_ms / 1000.0) +
        "), FROM_UNIXTIME(" + std::to_string(d.last_failure_ms / 1000.0) + "), " + c.quote(sanitize_utf8(d.host, 128)) +
        ", " + owner + ", " + lease + ", " +
        (d.hold.count() > 0 ? "NOW(3) + INTERVAL " + std::to_string(d.hold.count() * 1000) + " MICROSECOND" : "NULL") +
        ", " + Connection::hex(d.event_id) + ", NOW(3))";
    // Sized by bytes, not rows: a statement above the server's packet size
    // would never be sent, however often it is retried.
    if (!sql.empty() && sql.size() + row.size() + 2 > c.statement_budget()) {
      c.execute(sql);
      sql.clear();
    }
    sql += sql.empty() ? head + row : ", " + row;
  }
  if (!sql.empty()) c.execute(sql);
}

void Outbox::insert_replay(Connection& c, const Letter& replay) const {
  c.execute("DELETE FROM idemsink_dlq_outbox WHERE route = " + Connection::hex(replay.route) + " AND " +
            sql_purpose_is(Purpose::Replay) + " AND src_topic = " + c.quote(replay.src_topic) +
            " AND src_partition = " + std::to_string(replay.src_partition) +
            " AND src_offset = " + std::to_string(replay.src_offset));
  insert(c, std::span<const Letter>(&replay, 1));
}

namespace {

// A row of the letters take() reads, its columns in the order it names them.
Letter letter_of(const db::Row& r) {
  Letter d;
  d.id = std::stoull(*r[0]);
  d.route = *r[1];
  d.topic = *r[2];
  d.biz_key = r[3];
  d.reason = *r[4];
  d.error = r[5].value_or("");
  d.src_topic = *r[6];
  d.src_partition = std::stoi(*r[7]);
  d.src_offset = std::stoll(*r[8]);
  d.key = r[9];
  d.value = r[10];
  d.headers = decode_headers(r[11].value_or(""));
  d.timestamp_ms = std::stoll(*r[12]);
  d.idem_token = r[13].value_or("");
  d.calls = static_cast<uint32_t>(std::stoul(*r[14]));
  d.first_failure_ms = std::stoll(*r[15]);
  d.last_failure_ms = std::stoll(*r[16]);
  d.host = *r[17];
  // A value this version does not know (a row of a later one) is a dead letter.
  const int purpose = std::stoi(*r[18]);
  d.purpose = purpose >= 2 && purpose <= static_cast<int>(Purpose::EventUnknown) ? static_cast<Purpose>(purpose)
                                                                                 : Purpose::DeadLetter;
  return d;
}

}  // namespace

std::vector<Letter> Outbox::take(Connection& c, size_t limit, uint64_t byte_budget, std::span<const uint64_t> exclude,
                                 std::span<const std::string> skip_topics) const {
  const std::string owner = c.quote(owner_);
  const std::string lease = "NOW(3) + INTERVAL " + std::to_string(lease_.count() * 1000) + " MICROSECOND";
  // A held row goes out once its hold is over, and only while its claim is
  // still unknown: one reconciliation settled is never a dead letter.
  // Rows of an earlier run of this host id are free at once, as its claims
  // are: that run is dead (host ids are unique among live hosts).
  const std::string host_id = c.quote(owner_.substr(0, owner_.find('#')));
  std::string free = "published_at IS NULL AND unpublishable_at IS NULL AND (owner = " + owner +
                     " OR owner IS NULL OR lease_until < NOW(3) OR SUBSTRING_INDEX(owner, '#', 1) = " + host_id +
                     ") AND " + kHeldLetterDue;
  if (!exclude.empty()) free += " AND id NOT IN (" + id_list(exclude) + ")";
  if (!skip_topics.empty()) {
    std::string topics;
    for (const auto& t : skip_topics) topics += (topics.empty() ? "" : ", ") + c.quote(t);
    free += " AND dlq_topic NOT IN (" + topics + ")";
  }
  std::vector<uint64_t> candidates;
  uint64_t bytes = 0;
  for (auto& r : c.query("SELECT id, IFNULL(LENGTH(msg_key), 0) + IFNULL(LENGTH(msg_value), 0) FROM "
                         "idemsink_dlq_outbox WHERE " +
                         free + " ORDER BY id LIMIT " + std::to_string(limit))) {
    const uint64_t size = std::stoull(*r[1]);
    if (!candidates.empty() && bytes + size > byte_budget) break;
    candidates.push_back(std::stoull(*r[0]));
    bytes += size;
  }
  if (candidates.empty()) return {};
  // CAS: only rows still free (or ours) become ours.
  c.execute("UPDATE idemsink_dlq_outbox SET owner = " + owner + ", lease_until = " + lease + " WHERE " + free +
            " AND id IN (" + id_list(candidates) + ")");
  std::vector<Letter> out;
  for (auto& r : c.query(
           "SELECT id, route, dlq_topic, biz_key, reason, error, src_topic, src_partition, src_offset, msg_key, "
           "msg_value, msg_headers, msg_timestamp, idem_token, calls, "
           "CAST(UNIX_TIMESTAMP(first_failure) * 1000 AS SIGNED), CAST(UNIX_TIMESTAMP(last_failure) * 1000 AS SIGNED), "
           "host, purpose FROM idemsink_dlq_outbox WHERE published_at IS NULL AND owner = " +
           owner + " AND id IN (" + id_list(candidates) + ") ORDER BY id")) {
    out.push_back(letter_of(r));
  }
  return out;
}

uint64_t Outbox::renew(Connection& c, std::span<const uint64_t> ids) const {
  if (ids.empty()) return 0;
  return c.execute("UPDATE idemsink_dlq_outbox SET lease_until = NOW(3) + INTERVAL " +
                   std::to_string(lease_.count() * 1000) + " MICROSECOND WHERE owner = " + c.quote(owner_) +
                   " AND published_at IS NULL AND id IN (" + id_list(ids) + ")");
}

void Outbox::mark_published(Connection& c, std::span<const uint64_t> ids) const {
  if (ids.empty()) return;
  c.execute("UPDATE idemsink_dlq_outbox SET published_at = NOW(3), owner = NULL, lease_until = NULL WHERE id IN (" +
            id_list(ids) + ") AND published_at IS NULL");
}

void Outbox::mark_unpublishable(Connection& c, uint64_t id, std::string_view error) const {
  c.execute("UPDATE idemsink_dlq_outbox SET unpublishable_at = NOW(3), publish_error = " +
            c.quote(sanitize_utf8(error, 255)) + ", owner = NULL, lease_until = NULL WHERE id = " + std::to_string(id) +
            " AND published_at IS NULL");
}

uint64_t Outbox::pending(Connection& c) const {
  auto rows =
      c.query("SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE published_at IS NULL AND unpublishable_at IS NULL AND " +
              kHeldLetterDue);
  return rows.empty() ? 0 : std::stoull(*rows[0][0]);
}

uint64_t Outbox::settle_held(Connection& c, std::span<const std::string> tokens) {
  if (tokens.empty()) return 0;
  std::string list;
  for (const auto& t : tokens) list += (list.empty() ? "" : ", ") + c.quote(t);
  return c.execute(
      "UPDATE idemsink_dlq_outbox SET published_at = NOW(3), publish_error = 'settled by reconciliation: not "
      "published', owner = NULL, lease_until = NULL WHERE idem_token IN (" +
      list + ") AND held_until IS NOT NULL AND published_at IS NULL");
}

uint64_t Outbox::publish_settled_failure(Connection& c, std::string_view idem_token, std::string_view reason,
                                         std::string_view error) {
  return c.execute("UPDATE idemsink_dlq_outbox SET held_until = NULL, reason = " + c.quote(reason) +
                   ", error = " + c.quote(sanitize_utf8(error, 1024)) +
                   ", owner = NULL, lease_until = NULL WHERE idem_token = " + c.quote(idem_token) + " AND " +
                   sql_purpose_is(Purpose::DeadLetter) + " AND held_until IS NOT NULL AND published_at IS NULL");
}

std::map<std::string, std::pair<uint64_t, uint64_t>> Outbox::backlog_by_route(Connection& c) const {
  std::map<std::string, std::pair<uint64_t, uint64_t>> out;
  // The same conditions as pending() and unpublishable(), in one pass.
  for (const auto& r : c.query(
           "SELECT route, SUM(unpublishable_at IS NULL AND " + kHeldLetterDue +
           "), SUM(unpublishable_at IS NOT NULL) FROM idemsink_dlq_outbox WHERE published_at IS NULL GROUP BY route"))
    out[r[0].value_or("")] = {std::stoull(r[1].value_or("0")), std::stoull(r[2].value_or("0"))};
  return out;
}

uint64_t Outbox::unpublishable(Connection& c) const {
  auto rows =
      c.query("SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE published_at IS NULL AND unpublishable_at IS NOT NULL");
  return rows.empty() ? 0 : std::stoull(*rows[0][0]);
}

std::vector<Unpublishable> Outbox::list_unpublishable(Connection& c, size_t limit) const {
  std::vector<Unpublishable> out;
  for (auto& r : c.query("SELECT id, route, dlq_topic, reason, src_topic, src_partition, src_offset, "
                         "IFNULL(LENGTH(msg_key), 0) + IFNULL(LENGTH(msg_value), 0), IFNULL(publish_error, ''), "
                         "unpublishable_at FROM idemsink_dlq_outbox WHERE published_at IS NULL AND unpublishable_at IS "
                         "NOT NULL ORDER BY id LIMIT " +
                         std::to_string(limit))) {
    Unpublishable u;
    u.id = std::stoull(*r[0]);
    u.route = *r[1];
    u.topic = *r[2];
    u.reason = *r[3];
    u.src_topic = *r[4];
    u.src_partition = std::stoi(*r[5]);
    u.src_offset = std::stoll(*r[6]);
    u.bytes = std::stoull(*r[7]);
    u.publish_error = *r[8];
    u.since = *r[9];
    out.push_back(std::move(u));
  }
  return out;
}

bool Outbox::retry_unpublishable(Connection& c, uint64_t id) const {
  return c.execute("UPDATE idemsink_dlq_outbox SET unpublishable_at = NULL, publish_error = NULL WHERE id = " +
                   std::to_string(id) + " AND published_at IS NULL AND unpublishable_at IS NOT NULL") == 1;
}

bool Outbox::discard_unpublishable(Connection& c, uint64_t id, std::string_view note) const {
  return c.execute("UPDATE idemsink_dlq_outbox SET published_at = NOW(3), discarded_at = NOW(3), discard_note = " +
                   c.quote(sanitize_utf8(std::string(note), 1024)) +
                   ", publish_error = " + c.quote(sanitize_utf8("discarded by operator: " + std::string(note), 255)) +
                   " WHERE id = " + std::to_string(id) +
                   " AND published_at IS NULL AND unpublishable_at IS NOT NULL") == 1;
}

uint64_t Outbox::purge_published(Connection& c, std::chrono::milliseconds age, size_t batch) const {
  return c.execute("DELETE FROM idemsink_dlq_outbox WHERE published_at < NOW(3) - INTERVAL " +
                   std::to_string(age.count() * 1000) + " MICROSECOND ORDER BY published_at LIMIT " +
                   std::to_string(batch));
}

}  // namespace idemsink::dlq
