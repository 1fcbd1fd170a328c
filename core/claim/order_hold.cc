#include "core/claim/order_hold.h"

#include <map>
#include <tuple>
#include <utility>

#include "core/claim/claim_sql.h"

namespace idemsink::claim {
namespace {

using db::Connection;

// The hold's claim row, joined by its primary key.
constexpr const char* kJoinClaim =
    "idemsink_order_hold h LEFT JOIN idemsink_claim c ON c.namespace = h.namespace AND c.biz_key = h.biz_key AND "
    "c.bucket = h.bucket";

std::string namespace_list(std::span<const std::string> names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + Connection::hex(n);
  return out;
}

// SQL: the hold's claim says its record is not finished (see order_hold.h).
std::string live(std::span<const std::string> hold_on_dead) {
  std::string dead_holds;
  if (!hold_on_dead.empty())
    dead_holds = " OR ((" + sql_status_is(Status::Failed, "c.") + " OR " + sql_status_is(Status::Unknown, "c.") +
                 ") AND h.namespace IN (" + namespace_list(hold_on_dead) + "))";
  return "(" + sql_status_is(Status::Pending, "c.") + dead_holds + ")";
}

bool live(Status s, bool hold_on_dead) {
  return s == Status::Pending || (hold_on_dead && (s == Status::Failed || s == Status::Unknown));
}

}  // namespace

const char* OrderHolds::schema() {
  return R"(CREATE TABLE IF NOT EXISTS idemsink_order_hold (
  id               BIGINT UNSIGNED NOT NULL AUTO_INCREMENT COMMENT 'holds are served in this order',
  namespace        VARBINARY(64)   NOT NULL COMMENT 'route name',
  order_key        VARBINARY(255)  NOT NULL COMMENT 'the entity ([route.order_by])',
  biz_key          VARBINARY(255)  NOT NULL COMMENT 'the claim of the record that holds its entity',
  bucket           DATE            NOT NULL,
  origin_topic     VARCHAR(249)    NOT NULL,
  origin_partition INT             NOT NULL,
  origin_offset    BIGINT          NOT NULL,
  created_at       DATETIME(3)     NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_claim (namespace, biz_key),
  KEY idx_entity (namespace, order_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4)";
}

void OrderHolds::add(Connection& c, std::span<const OrderHold> holds) {
  const std::string head =
      "INSERT IGNORE INTO idemsink_order_hold (namespace, order_key, biz_key, bucket, origin_topic, origin_partition, "
      "origin_offset, created_at) VALUES ";
  std::string sql;
  for (const OrderHold& h : holds) {
    sql += (sql.empty() ? head + "(" : ", (") + Connection::hex(h.claim.ns) + ", " + Connection::hex(h.order_key) +
           ", " + Connection::hex(h.claim.biz_key) + ", " + sql::date_literal(h.claim.bucket) + ", " +
           c.quote(h.origin_topic) + ", " + std::to_string(h.origin_partition) + ", " +
           std::to_string(h.origin_offset) + ", NOW(3))";
    // As many statements as the server's packet size needs.
    if (sql.size() >= c.statement_budget() / 2) c.execute(std::exchange(sql, {}));
  }
  if (!sql.empty()) c.execute(sql);
}

std::vector<bool> OrderHolds::blocked(Connection& c, std::span<const OrderAsk> asks) {
  std::vector<bool> out(asks.size(), false);
  if (asks.empty()) return out;
  std::map<std::string, std::vector<std::string>> entities_by_ns;
  for (const auto& a : asks) entities_by_ns[a.ns].push_back(Connection::hex(a.order_key));
  std::string where;
  for (const auto& [ns, keys] : entities_by_ns) {
    where +=
        (where.empty() ? "(" : " OR (") + std::string("h.namespace = ") + Connection::hex(ns) + " AND h.order_key IN (";
    for (size_t i = 0; i < keys.size(); ++i) where += (i ? ", " : "") + keys[i];
    where += "))";
  }
  struct Hold {
    uint64_t id;
    std::string biz_key;
    std::optional<Status> status;  // none: the claim row is gone
  };
  std::map<std::pair<std::string, std::string>, std::vector<Hold>> by_entity;
  for (auto& row : c.query("SELECT h.namespace, h.order_key, h.id, h.biz_key, c.status FROM " +
                           std::string(kJoinClaim) + " WHERE " + where))
    by_entity[{*row[0], *row[1]}].push_back(
        Hold{std::stoull(*row[2]), *row[3],
             row[4] ? std::optional<Status>(static_cast<Status>(std::stoi(*row[4]))) : std::nullopt});
  for (size_t i = 0; i < asks.size(); ++i) {
    const OrderAsk& a = asks[i];
    auto it = by_entity.find({a.ns, a.order_key});
    if (it == by_entity.end()) continue;
    std::optional<uint64_t> own;
    for (const Hold& h : it->second)
      if (h.biz_key == a.biz_key) own = h.id;
    for (const Hold& h : it->second)
      if (h.biz_key != a.biz_key && h.status && live(*h.status, a.hold_on_dead) && (!own || h.id < *own)) out[i] = true;
  }
  return out;
}

uint64_t OrderHolds::purge_stale(Connection& c, std::span<const std::string> hold_on_dead, size_t batch) {
  // The ids first, then a delete by primary key: a short statement that
  // locks only the rows it deletes.
  std::string ids;
  for (auto& row : c.query("SELECT h.id FROM " + std::string(kJoinClaim) + " WHERE c.namespace IS NULL OR NOT " +
                           live(hold_on_dead) + " ORDER BY h.id LIMIT " + std::to_string(batch)))
    ids += (ids.empty() ? "" : ", ") + *row[0];
  if (ids.empty()) return 0;
  // Stale again at the delete: a replay may have re-opened a claim since.
  return c.execute("DELETE h FROM " + std::string(kJoinClaim) + " WHERE h.id IN (" + ids +
                   ") AND (c.namespace IS NULL OR NOT " + live(hold_on_dead) + ")");
}

std::vector<ListedHold> OrderHolds::list(Connection& c, const std::string& ns,
                                         std::span<const std::string> hold_on_dead, size_t limit) {
  std::string sql =
      "SELECT h.id, h.namespace, h.order_key, h.biz_key, c.status, h.origin_topic, h.origin_partition, "
      "h.origin_offset, h.created_at FROM " +
      std::string(kJoinClaim) + " WHERE c.namespace IS NOT NULL AND " + live(hold_on_dead);
  if (!ns.empty()) sql += " AND h.namespace = " + Connection::hex(ns);
  sql += " ORDER BY h.id LIMIT " + std::to_string(limit);
  std::vector<ListedHold> out;
  for (auto& row : c.query(sql))
    out.push_back(ListedHold{std::stoull(*row[0]), *row[1], *row[2], *row[3], static_cast<Status>(std::stoi(*row[4])),
                             *row[5] + "[" + *row[6] + "]@" + *row[7], *row[8]});
  return out;
}

std::map<std::string, uint64_t> OrderHolds::live_by_route(Connection& c, std::span<const std::string> hold_on_dead) {
  std::map<std::string, uint64_t> out;
  for (auto& row : c.query("SELECT h.namespace, COUNT(*) FROM " + std::string(kJoinClaim) +
                           " WHERE c.namespace IS NOT NULL AND " + live(hold_on_dead) + " GROUP BY h.namespace"))
    out[*row[0]] = std::stoull(*row[1]);
  return out;
}

void OrderHolds::release_claim(Connection& c, const RowKey& claim) {
  c.execute("DELETE FROM idemsink_order_hold WHERE namespace = " + Connection::hex(claim.ns) +
            " AND biz_key = " + Connection::hex(claim.biz_key));
}

uint64_t OrderHolds::release(Connection& c, const std::string& ns, const std::string& order_key) {
  return c.execute("DELETE FROM idemsink_order_hold WHERE namespace = " + Connection::hex(ns) +
                   " AND order_key = " + Connection::hex(order_key));
}

}  // namespace idemsink::claim
