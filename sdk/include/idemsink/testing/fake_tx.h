// The SDK's fake of the host's SQL transaction (FakeTx), for unit tests of
// local_tx handlers; part of <idemsink/testing.h>, which includes it.
#pragma once

#include <idemsink/sdk.h>

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace idemsink::sdk::testing {

class FakeHost;

/// The host's transaction for local_tx apply: records every statement the
/// handler runs, and answers each with the next scripted Result (success,
/// one affected row and no rows once the script is used up). Nothing is
/// executed.
class FakeTx {
 public:
  using Row = std::vector<std::optional<std::string>>;  // nullopt = SQL NULL

  /// One bound parameter, copied out of the call.
  struct Param {
    idemsink_sql_type type = IDEMSINK_SQL_NULL;
    int64_t i = 0;      // IDEMSINK_SQL_INT
    double d = 0;       // IDEMSINK_SQL_DOUBLE
    std::string bytes;  // IDEMSINK_SQL_TEXT and IDEMSINK_SQL_BLOB
  };

  /// One tx_execute or tx_query call.
  struct Call {
    bool query = false;  // tx_query rather than tx_execute
    std::string sql;
    std::vector<Param> params;
  };

  /// How the fake answers one statement.
  struct Result {
    int error = 0;  // non-zero: the statement fails with this server error number
    std::string message;
    uint64_t affected_rows = 1;
    std::vector<Row> rows;  // handed to tx_query's row callback
  };
  static Result fails(int error, std::string message) {
    Result r;
    r.error = error;
    r.message = std::move(message);
    return r;
  }
  static Result returns(std::vector<Row> rows) {
    Result r;
    r.rows = std::move(rows);
    return r;
  }

  /// One tx_write_row call (Tx::insert_row, Tx::upsert_row), copied out.
  struct RowWrite {
    idemsink_row_kind kind = IDEMSINK_ROW_INSERT;
    std::string table;
    std::vector<std::string> columns;
    std::vector<Param> values;  // in the columns' order
    size_t key_count = 0;
    std::vector<idemsink_column_update> updates;
  };

  FakeTx() = default;
  FakeTx(const FakeTx&) = delete;  // its address is the idemsink_tx handle
  FakeTx& operator=(const FakeTx&) = delete;

  /// Queues the answer to the next statement not answered yet.
  FakeTx& then(Result r) {
    script_.push_back(std::move(r));
    return *this;
  }
  const std::vector<Call>& calls() const { return calls_; }
  /// The rows queued for the end of the batch; they never answer from the script.
  const std::vector<RowWrite>& rows() const { return rows_; }

  /// The handle passed to a descriptor's apply.
  idemsink_tx* raw() { return reinterpret_cast<idemsink_tx*>(this); }
  /// The Tx passed to a handler's apply when driving the class directly
  /// (defined in testing.h, after FakeHost).
  sdk::Tx tx(const FakeHost& host);

 private:
  friend class FakeHost;

  static FakeTx& from(idemsink_tx* tx) { return *reinterpret_cast<FakeTx*>(tx); }

  static Param copy(const idemsink_sql_param& raw) {
    Param p;
    p.type = raw.type;
    p.i = raw.i;
    p.d = raw.d;
    if (p.type == IDEMSINK_SQL_TEXT || p.type == IDEMSINK_SQL_BLOB) p.bytes = std::string(detail::view(raw.bytes));
    return p;
  }

  Result record(bool query, const char* sql, const idemsink_sql_param* params, size_t n) {
    Call call;
    call.query = query;
    call.sql = sql ? sql : "";
    for (size_t i = 0; i < n; ++i) call.params.push_back(copy(params[i]));
    calls_.push_back(std::move(call));
    if (script_.empty()) return Result{};
    Result r = std::move(script_.front());
    script_.pop_front();
    return r;
  }

  static int execute(idemsink_tx* tx, const char* sql, const idemsink_sql_param* params, size_t n,
                     uint64_t* affected_rows, char* err, size_t err_cap) {
    const Result r = from(tx).record(false, sql, params, n);
    if (r.error != 0) {
      detail::copy_message(err, err_cap, r.message);
      return r.error;
    }
    if (affected_rows) *affected_rows = r.affected_rows;
    return 0;
  }

  static int query(idemsink_tx* tx, const char* sql, const idemsink_sql_param* params, size_t n, idemsink_row_fn on_row,
                   void* row_ctx, char* err, size_t err_cap) {
    const Result r = from(tx).record(true, sql, params, n);
    if (r.error != 0) {
      detail::copy_message(err, err_cap, r.message);
      return r.error;
    }
    for (const Row& row : r.rows) {
      std::vector<idemsink_bytes> columns;
      columns.reserve(row.size());
      for (const auto& c : row)
        columns.push_back(c ? idemsink_bytes{c->data(), c->size()} : idemsink_bytes{nullptr, 0});
      if (on_row) on_row(row_ctx, columns.size(), columns.data());
    }
    return 0;
  }

  static int write_row(idemsink_tx* tx, const idemsink_row* row, char* err, size_t err_cap) {
    if (row == nullptr || row->table == nullptr || (row->column_count > 0 && (!row->columns || !row->values))) {
      detail::copy_message(err, err_cap, "malformed row");
      return 1064;
    }
    RowWrite w;
    w.kind = static_cast<idemsink_row_kind>(row->kind);
    w.table = row->table;
    w.key_count = row->key_count;
    for (size_t i = 0; i < row->column_count; ++i) {
      w.columns.emplace_back(row->columns[i] ? row->columns[i] : "");
      w.values.push_back(copy(row->values[i]));
    }
    if (row->kind == IDEMSINK_ROW_UPSERT && row->updates && row->key_count <= row->column_count)
      for (size_t i = 0; i < row->column_count - row->key_count; ++i)
        w.updates.push_back(static_cast<idemsink_column_update>(row->updates[i]));
    from(tx).rows_.push_back(std::move(w));
    return 0;
  }

  std::vector<Call> calls_;
  std::vector<RowWrite> rows_;
  std::deque<Result> script_;
};

}  // namespace idemsink::sdk::testing
