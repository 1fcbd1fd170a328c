#include "core/claim/offsets.h"

#include "core/common/util.h"

namespace idemsink::claim {

const char* OffsetStore::schema() {
  return R"(CREATE TABLE IF NOT EXISTS idemsink_offsets (
  group_id      VARCHAR(255)    NOT NULL,
  topic         VARCHAR(249)    NOT NULL,
  part          INT             NOT NULL,
  next_offset   BIGINT          NOT NULL COMMENT 'every record below has its outcome in this database',
  first_offset  BIGINT          NULL     COMMENT 'where the group began the partition (start_at latest, no commit anywhere); the audit reads from here',
  began_at      DATETIME(3)     NULL     COMMENT 'start_at latest: when the group began the topic; a partition it never committed begins at the first record stamped then or later',
  updated_by    VARCHAR(128)    NOT NULL,
  updated_at    DATETIME(3)     NOT NULL,
  PRIMARY KEY (group_id, topic, part)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4)";
}

std::map<std::pair<std::string, int32_t>, int64_t> OffsetStore::read(
    db::Connection& c, std::span<const std::pair<std::string, int32_t>> tps) const {
  std::map<std::pair<std::string, int32_t>, int64_t> out;
  if (tps.empty()) return out;
  std::string where;
  for (const auto& [topic, partition] : tps)
    where += (where.empty() ? "" : " OR ") +
             ("(topic = " + c.quote(topic) + " AND part = " + std::to_string(partition) + ")");
  for (auto& r : c.query("SELECT topic, part, next_offset FROM idemsink_offsets WHERE group_id = " + c.quote(group_) +
                         " AND (" + where + ")"))
    out[{*r[0], std::stoi(*r[1])}] = std::stoll(*r[2]);
  return out;
}

void OffsetStore::write(db::Connection& c, std::span<const StoredOffset> offsets) const {
  if (offsets.empty()) return;
  std::string values;
  const std::string group = c.quote(group_), host = c.quote(sanitize_utf8(host_, 128));
  for (const auto& o : offsets)
    values += (values.empty() ? "(" : ", (") + group + ", " + c.quote(o.topic) + ", " + std::to_string(o.partition) +
              ", " + std::to_string(o.offset) + ", " + host + ", NOW(3))";
  c.execute("INSERT INTO idemsink_offsets (group_id, topic, part, next_offset, updated_by, updated_at) VALUES " +
            values +
            " ON DUPLICATE KEY UPDATE next_offset = VALUES(next_offset), updated_by = VALUES(updated_by), "
            "updated_at = VALUES(updated_at)");
}

std::optional<int64_t> OffsetStore::topic_began(db::Connection& c, const std::string& topic) const {
  auto rows = c.query(
      "SELECT CAST(UNIX_TIMESTAMP(MIN(began_at)) * 1000 AS SIGNED) FROM idemsink_offsets WHERE "
      "group_id = " +
      c.quote(group_) + " AND topic = " + c.quote(topic) + " AND began_at IS NOT NULL");
  if (rows.empty() || !rows[0][0]) return std::nullopt;
  return std::stoll(*rows[0][0]);
}

bool OffsetStore::begin_at(db::Connection& c, const std::string& topic, int32_t partition, int64_t offset,
                           int64_t began_ms) const {
  // Only where nothing is stored: a row another member wrote meanwhile wins.
  return c.execute(
             "INSERT IGNORE INTO idemsink_offsets (group_id, topic, part, next_offset, first_offset, began_at, "
             "updated_by, updated_at) VALUES (" +
             c.quote(group_) + ", " + c.quote(topic) + ", " + std::to_string(partition) + ", " +
             std::to_string(offset) + ", " + std::to_string(offset) + ", FROM_UNIXTIME(" +
             std::to_string(began_ms / 1000) + "." + std::to_string(1000 + began_ms % 1000).substr(1) + "), " +
             c.quote(sanitize_utf8(host_, 128)) + ", NOW(3))") == 1;
}

std::map<std::pair<std::string, int32_t>, int64_t> OffsetStore::first_offsets(db::Connection& c) const {
  std::map<std::pair<std::string, int32_t>, int64_t> out;
  // A schema from before start_at has no such column, and no such start.
  if (c.query("SELECT 1 FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = "
              "'idemsink_offsets' AND COLUMN_NAME = 'first_offset'")
          .empty())
    return out;
  for (auto& r : c.query("SELECT topic, part, first_offset FROM idemsink_offsets WHERE group_id = " + c.quote(group_) +
                         " AND first_offset IS NOT NULL"))
    out[{*r[0], std::stoi(*r[1])}] = std::stoll(*r[2]);
  return out;
}

}  // namespace idemsink::claim
