// Rows a local_tx plugin queues with tx_write_row, written together at the
// end of its batch: one multi-row statement per shape instead of one
// statement per record.
#pragma once

#include <idemsink/plugin_abi.h>

#include <map>
#include <string>
#include <vector>

#include "core/db/connection.h"

namespace idemsink::plugin {

class DeferredRows {
 public:
  /// Checks and copies one row. Returns why it is malformed, or empty.
  std::string add(const idemsink_row& row);
  /// Moves the rows of `other` (one record's, once it reported ok) in after these.
  void take(DeferredRows&& other);
  bool empty() const { return shapes_.empty(); }

  /// Writes every row inside the caller's transaction: per shape, in the
  /// order the shapes were first named, statements of up to 128 rows (sizes
  /// that are powers of two, so a connection prepares few distinct texts);
  /// an upsert's rows ordered by their key's bytes. Throws db::DbError.
  void write(db::Connection& c) const;

 private:
  struct Value {
    db::Connection::Param::Type type = db::Connection::Param::Type::Null;
    int64_t i = 0;
    double d = 0;
    std::string bytes;
  };
  using Row = std::vector<Value>;
  struct Shape {
    size_t order = 0;           // first named: statements follow it
    std::string insert_prefix;  // INSERT INTO `t` (`a`, `b`) VALUES
    std::string row_text;       // (?, ?)
    std::string upsert_suffix;  // ON DUPLICATE KEY UPDATE ... (empty for INSERT)
    size_t key_count = 0;
    std::vector<Row> rows;
  };
  void write_shape(db::Connection& c, const Shape& s) const;

  std::map<std::string, Shape> shapes_;  // by the statement text without its rows
  size_t next_order_ = 0;
};

}  // namespace idemsink::plugin
