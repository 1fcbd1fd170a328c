#include "core/plugin/deferred_rows.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <compare>

#include "core/plugin/tx.h"

namespace idemsink::plugin {
namespace {

// At most this many rows per statement; and a prepared statement binds at
// most 65,535 parameters.
constexpr size_t kMaxRows = 128;
constexpr size_t kMaxParams = 65535;
constexpr size_t kMaxColumns = 4096;  // MariaDB's most per table

// `name` or `database`.`name`, quoted; empty if `name` is not an identifier.
std::string quoted_identifier(const char* name) {
  if (name == nullptr) return {};
  std::string out = "`";
  size_t part = 0;
  for (const char* p = name; *p; ++p) {
    const unsigned char ch = static_cast<unsigned char>(*p);
    if (ch == '.' && part > 0 && out.find('.') == std::string::npos) {
      out += "`.`";
      part = 0;
      continue;
    }
    if (!(std::isalnum(ch) || ch == '_' || ch == '$') || ++part > 64) return {};
    out.push_back(static_cast<char>(ch));
  }
  if (part == 0) return {};
  return out + "`";
}

std::strong_ordering compare(const auto& a, const auto& b) {
  if (a.type != b.type) return a.type <=> b.type;
  using T = db::Connection::Param::Type;
  switch (a.type) {
    case T::Null: return std::strong_ordering::equal;
    case T::Int: return a.i <=> b.i;
    case T::Double: return std::strong_order(a.d, b.d);
    case T::Text:
    case T::Blob: return a.bytes <=> b.bytes;
  }
  return std::strong_ordering::equal;
}

}  // namespace

std::string DeferredRows::add(const idemsink_row& row) {
  if (row.struct_size < offsetof(idemsink_row, updates) + sizeof row.updates) return "idemsink_row too short";
  if (row.kind != IDEMSINK_ROW_INSERT && row.kind != IDEMSINK_ROW_UPSERT) return "unknown row kind";
  if (row.column_count == 0 || row.columns == nullptr || row.values == nullptr) return "a row needs columns";
  if (row.column_count > kMaxColumns) return "too many columns";
  const bool upsert = row.kind == IDEMSINK_ROW_UPSERT;
  if (upsert ? row.key_count == 0 || row.key_count > row.column_count : row.key_count != 0)
    return upsert ? "an upsert needs between 1 and column_count key columns" : "an insert has no key columns";
  if (upsert && row.key_count < row.column_count && row.updates == nullptr) return "an upsert needs its updates";
  const std::string table = quoted_identifier(row.table);
  if (table.empty()) return "table name is not an identifier: " + std::string(row.table ? row.table : "(null)");
  std::vector<std::string> columns;
  for (size_t i = 0; i < row.column_count; ++i) {
    columns.push_back(quoted_identifier(row.columns[i]));
    if (columns.back().empty() || columns.back().find('.') != std::string::npos)
      return "column name is not an identifier: " + std::string(row.columns[i] ? row.columns[i] : "(null)");
    if (std::count(columns.begin(), columns.end(), columns.back()) > 1) return "column named twice: " + columns.back();
  }
  std::string prefix = "INSERT INTO " + table + " (";
  std::string row_text = "(";
  for (size_t i = 0; i < columns.size(); ++i) {
    prefix += (i ? ", " : "") + columns[i];
    row_text += i ? ", ?" : "?";
  }
  prefix += ") VALUES ";
  row_text += ")";
  std::string suffix;
  if (upsert) {
    suffix = " ON DUPLICATE KEY UPDATE ";
    if (row.key_count == row.column_count) suffix += columns[0] + " = " + columns[0];  // only ensures the row exists
    for (size_t i = row.key_count; i < row.column_count; ++i) {
      const int32_t how = row.updates[i - row.key_count];
      if (how != IDEMSINK_COLUMN_SET && how != IDEMSINK_COLUMN_ADD) return "unknown column update for " + columns[i];
      suffix += (i > row.key_count ? ", " : "") + columns[i] + " = " +
                (how == IDEMSINK_COLUMN_ADD ? columns[i] + " + " : "") + "VALUES(" + columns[i] + ")";
    }
  }
  Row values(row.column_count);
  for (size_t i = 0; i < row.column_count; ++i) {
    const idemsink_sql_param& p = row.values[i];
    const auto bound = bound_param(p);
    if (!bound) return "unknown value type for " + columns[i];
    if ((p.type == IDEMSINK_SQL_TEXT || p.type == IDEMSINK_SQL_BLOB) && p.bytes.len > 0 && p.bytes.data == nullptr)
      return "value of " + columns[i] + " has no data";
    values[i] = Value{bound->type, bound->i, bound->d, std::string(bound->bytes)};
  }
  const std::string key = prefix + row_text + suffix;
  auto [it, fresh] = shapes_.try_emplace(key);
  Shape& shape = it->second;
  if (fresh) {
    shape.order = next_order_++;
    shape.insert_prefix = std::move(prefix);
    shape.row_text = std::move(row_text);
    shape.upsert_suffix = std::move(suffix);
    shape.key_count = row.key_count;
  }
  shape.rows.push_back(std::move(values));
  return {};
}

void DeferredRows::take(DeferredRows&& other) {
  std::vector<std::pair<size_t, std::map<std::string, Shape>::node_type>> incoming;
  for (auto it = other.shapes_.begin(); it != other.shapes_.end();) {
    auto next = std::next(it);
    const size_t order = it->second.order;
    incoming.emplace_back(order, other.shapes_.extract(it));
    it = next;
  }
  std::sort(incoming.begin(), incoming.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [order, node] : incoming) {
    auto found = shapes_.find(node.key());
    if (found == shapes_.end()) {
      node.mapped().order = next_order_++;
      shapes_.insert(std::move(node));
    } else {
      auto& rows = found->second.rows;
      std::move(node.mapped().rows.begin(), node.mapped().rows.end(), std::back_inserter(rows));
    }
  }
  other.next_order_ = 0;
}

void DeferredRows::write(db::Connection& c) const {
  std::vector<const Shape*> in_order;
  for (const auto& [key, shape] : shapes_) in_order.push_back(&shape);
  std::sort(in_order.begin(), in_order.end(), [](const Shape* a, const Shape* b) { return a->order < b->order; });
  for (const Shape* s : in_order) write_shape(c, *s);
}

void DeferredRows::write_shape(db::Connection& c, const Shape& s) const {
  // An upsert's rows in key order: two batches touching the same keys lock
  // them in one order, so neither waits for the other while holding what it
  // needs (MariaDB's 1213). A stable sort keeps one key's rows in record
  // order (a SET's last value wins as the records came).
  std::vector<const Row*> rows;
  rows.reserve(s.rows.size());
  for (const Row& r : s.rows) rows.push_back(&r);
  if (s.key_count > 0)
    std::stable_sort(rows.begin(), rows.end(), [&](const Row* a, const Row* b) {
      for (size_t i = 0; i < s.key_count; ++i)
        if (auto o = compare((*a)[i], (*b)[i]); o != 0) return o < 0;
      return false;
    });
  const size_t columns = s.rows.front().size();
  const size_t most = std::bit_floor(std::min(kMaxRows, std::max<size_t>(1, kMaxParams / columns)));
  const size_t budget = c.statement_budget();
  auto bytes_of = [](const Row& r) {
    size_t n = 0;
    for (const Value& v : r) n += v.bytes.size() + 8;
    return n;
  };
  std::vector<db::Connection::Param> params;
  for (size_t first = 0; first < rows.size();) {
    // The largest power of two that fits the rows left and the packet.
    size_t n = std::min(most, std::bit_floor(rows.size() - first));
    for (;;) {
      size_t bytes = s.insert_prefix.size() + s.upsert_suffix.size();
      for (size_t i = first; i < first + n; ++i) bytes += bytes_of(*rows[i]) + s.row_text.size() + 2;
      if (bytes <= budget || n == 1) break;
      n /= 2;
    }
    std::string sql = s.insert_prefix;
    params.clear();
    for (size_t i = first; i < first + n; ++i) {
      sql += (i > first ? ", " : "") + s.row_text;
      for (const Value& v : *rows[i]) params.push_back({v.type, v.i, v.d, v.bytes});
    }
    sql += s.upsert_suffix;
    c.execute_prepared(sql, params);
    first += n;
  }
}

}  // namespace idemsink::plugin
