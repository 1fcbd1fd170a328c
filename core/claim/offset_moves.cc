#include "core/claim/offset_moves.h"

#include <mysqld_error.h>

#include "core/common/util.h"

namespace idemsink::claim {

namespace {

constexpr const char* kColumns =
    "id, group_id, route, topic, part, to_offset, kind, requested_by, note, from_offset, applied_by, "
    "DATE_FORMAT(applied_at, '%Y-%m-%d %H:%i:%s.%f')";

std::vector<OffsetMove> rows_of(db::Connection& c, const std::string& sql) {
  std::vector<OffsetMove> out;
  for (auto& r : c.query(sql)) {
    OffsetMove m;
    m.id = std::stoull(*r[0]);
    m.group = *r[1];
    m.route = *r[2];
    m.topic = *r[3];
    m.partition = std::stoi(*r[4]);
    m.to = std::stoll(*r[5]);
    m.kind = *r[6] == "skip" ? OffsetMove::Kind::Skip : OffsetMove::Kind::Rewind;
    m.requested_by = *r[7];
    m.note = *r[8];
    if (r[9]) m.from = std::stoll(*r[9]);
    m.applied_by = r[10].value_or("");
    m.applied_at = r[11].value_or("");
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace

const char* to_string(OffsetMove::Kind k) { return k == OffsetMove::Kind::Skip ? "skip" : "rewind"; }

const char* OffsetMoves::schema() {
  return R"(CREATE TABLE IF NOT EXISTS idemsink_offset_moves (
  id            BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  group_id      VARCHAR(255)    NOT NULL,
  route         VARCHAR(255)    NOT NULL,
  topic         VARCHAR(249)    NOT NULL,
  part          INT             NOT NULL,
  to_offset     BIGINT          NOT NULL COMMENT 'the partition reads on from here',
  kind          VARCHAR(8)      NOT NULL COMMENT 'rewind (read again: claims answer) or skip (pass over: the audit accounts the range)',
  requested_by  VARCHAR(255)    NOT NULL,
  requested_at  DATETIME(3)     NOT NULL,
  note          TEXT            NOT NULL,
  from_offset   BIGINT          NULL     COMMENT 'the commit point when it moved; a skip passed [from_offset, to_offset)',
  applied_by    VARCHAR(255)    NULL,
  applied_at    DATETIME(3)     NULL,
  PRIMARY KEY (id),
  KEY pending (group_id, applied_at, topic, part)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4)";
}

std::vector<uint64_t> OffsetMoves::request(db::Connection& c, const std::vector<OffsetMove>& moves) {
  std::vector<uint64_t> ids;
  for (const auto& m : moves) {
    c.execute(
        "INSERT INTO idemsink_offset_moves (group_id, route, topic, part, to_offset, kind, requested_by, "
        "requested_at, note) VALUES (" +
        c.quote(m.group) + ", " + c.quote(m.route) + ", " + c.quote(m.topic) + ", " + std::to_string(m.partition) +
        ", " + std::to_string(m.to) + ", '" + to_string(m.kind) + "', " + c.quote(sanitize_utf8(m.requested_by, 255)) +
        ", NOW(3), " + c.quote(sanitize_utf8(m.note, 4096)) + ")");
    ids.push_back(std::stoull(*c.query("SELECT LAST_INSERT_ID()")[0][0]));
  }
  return ids;
}

std::vector<OffsetMove> OffsetMoves::pending(db::Connection& c, const std::string& group) {
  try {
    // The newest per partition: an older one it supersedes is stamped with it.
    return rows_of(c, std::string("SELECT ") + kColumns +
                          " FROM idemsink_offset_moves m WHERE group_id = " + c.quote(group) +
                          " AND applied_at IS NULL AND NOT EXISTS (SELECT 1 FROM idemsink_offset_moves n WHERE "
                          "n.group_id = m.group_id AND n.topic = m.topic AND n.part = m.part AND n.applied_at IS "
                          "NULL AND n.id > m.id) ORDER BY id");
  } catch (const db::DbError& e) {
    if (e.code() == ER_NO_SUCH_TABLE) return {};
    throw;
  }
}

bool OffsetMoves::mark_applied(db::Connection& c, const OffsetMove& move, int64_t from, const std::string& host) {
  const std::string where = " WHERE group_id = " + c.quote(move.group) + " AND topic = " + c.quote(move.topic) +
                            " AND part = " + std::to_string(move.partition) + " AND applied_at IS NULL";
  const bool applied = c.execute("UPDATE idemsink_offset_moves SET from_offset = " + std::to_string(from) +
                                 ", applied_by = " + c.quote(sanitize_utf8(host, 255)) + ", applied_at = NOW(3)" +
                                 where + " AND id = " + std::to_string(move.id)) == 1;
  if (!applied) {
    // Applied by this host already: a retry of a job whose commit's reply was lost.
    const auto rows = c.query("SELECT applied_by FROM idemsink_offset_moves WHERE id = " + std::to_string(move.id));
    return !rows.empty() && rows[0][0] && *rows[0][0] == sanitize_utf8(host, 255);
  }
  c.execute("UPDATE idemsink_offset_moves SET applied_by = " + c.quote("superseded by #" + std::to_string(move.id)) +
            ", applied_at = NOW(3)" + where + " AND id < " + std::to_string(move.id));
  return true;
}

std::vector<OffsetMove> OffsetMoves::read(db::Connection& c, const std::vector<uint64_t>& ids) {
  if (ids.empty()) return {};
  std::string list;
  for (const auto id : ids) list += (list.empty() ? "" : ",") + std::to_string(id);
  return rows_of(
      c, std::string("SELECT ") + kColumns + " FROM idemsink_offset_moves WHERE id IN (" + list + ") ORDER BY id");
}

std::vector<OffsetMove> OffsetMoves::skips(db::Connection& c, const std::string& group, const std::string& topic,
                                           int32_t partition) {
  try {
    return rows_of(c, std::string("SELECT ") + kColumns +
                          " FROM idemsink_offset_moves WHERE group_id = " + c.quote(group) +
                          " AND topic = " + c.quote(topic) + " AND part = " + std::to_string(partition) +
                          " AND kind = 'skip' AND from_offset < to_offset ORDER BY id");
  } catch (const db::DbError& e) {
    if (e.code() == ER_NO_SUCH_TABLE) return {};
    throw;
  }
}

}  // namespace idemsink::claim
