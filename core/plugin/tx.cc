#include "core/plugin/tx.h"

#include <mysqld_error.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>
#include <vector>

namespace idemsink::plugin {
namespace {

void write_err(char* err, size_t cap, const std::string& msg) {
  if (err == nullptr || cap == 0) return;
  const size_t n = std::min(msg.size(), cap - 1);
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}

std::vector<db::Connection::Param> to_params(const idemsink_sql_param* params, size_t n) {
  std::vector<db::Connection::Param> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = bound_param(params[i]).value_or(db::Connection::Param{});
  return out;
}

// Why nothing may run on `tx` (not during an apply, or its transaction
// already broken): the error number, with its message in err; 0 if it may.
int unusable(const idemsink_tx* tx, const char* what, char* err, size_t cap) {
  if (tx == nullptr || tx->conn == nullptr) {
    write_err(err, cap, std::string("no transaction: ") + what + " may only be called during apply");
    return ER_UNKNOWN_ERROR;
  }
  if (tx->broken_code != 0) {
    write_err(err, cap, "transaction already aborted: " + tx->broken_message);
    return static_cast<int>(tx->broken_code);
  }
  return 0;
}

// A statement or row refused as written: it ends its record (db_rejected)
// unless the plugin still reports ok, as it would be refused on every attempt.
int refuse(idemsink_tx* tx, unsigned code, const std::string& why, char* err, size_t cap) {
  if (tx->refused_code == 0) {
    tx->refused_code = code;
    tx->refused_message = why;
  }
  write_err(err, cap, why);
  return static_cast<int>(code);
}

uint64_t bound_bytes(const idemsink_sql_param* params, size_t n) {
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; ++i)
    if (params[i].type == IDEMSINK_SQL_TEXT || params[i].type == IDEMSINK_SQL_BLOB) bytes += params[i].bytes.len;
  return bytes;
}

template <class Body>
int guarded(idemsink_tx* tx, const char* sql, const idemsink_sql_param* params, size_t n, char* err, size_t cap,
            Body&& body) {
  if (int rc = unusable(tx, "tx_execute/tx_query", err, cap)) return rc;
  ++tx->statements;
  if (sql == nullptr) {
    write_err(err, cap, "no SQL given");
    return ER_NOT_SUPPORTED_YET;
  }
  if (const std::string why = refused_in_claim_tx(sql); !why.empty()) {
    write_err(err, cap, why);
    return ER_NOT_SUPPORTED_YET;
  }
  // The server refuses a statement above max_allowed_packet and closes the
  // connection with it (the transaction gone, the batch re-run, refused
  // again): such a statement is refused here, before it is sent, like a
  // value the server refuses.
  const uint64_t bytes = std::strlen(sql) + bound_bytes(params, n);
  if (bytes + 1024 > tx->conn->max_packet())
    return refuse(tx, ER_NET_PACKET_TOO_LARGE,
                  "statement of " + std::to_string(bytes) + " bytes exceeds the server's max_allowed_packet (" +
                      std::to_string(tx->conn->max_packet()) + ")",
                  err, cap);
  try {
    body();
    return 0;
  } catch (const db::DbError& e) {
    // A deadlock rolls the whole transaction back, a lost connection takes
    // it with it: nothing may run after either. A refused value rolls back
    // only its statement.
    const db::ErrorClass cls = e.error_class();
    if (cls == db::ErrorClass::ConnectionLost || cls == db::ErrorClass::Transient) {
      tx->broken_code = e.code();
      tx->broken_message = e.what();
    } else if (cls == db::ErrorClass::Data && tx->refused_code == 0) {
      tx->refused_code = e.code();
      tx->refused_message = e.what();
    }
    write_err(err, cap, e.what());
    return static_cast<int>(e.code() ? e.code() : ER_UNKNOWN_ERROR);
  }
}

int tx_execute(idemsink_tx* tx, const char* sql, const idemsink_sql_param* params, size_t n, uint64_t* affected,
               char* err, size_t cap) {
  return guarded(tx, sql, params, n, err, cap, [&] {
    uint64_t rows = tx->conn->execute_prepared(sql, to_params(params, n));
    if (affected) *affected = rows;
  });
}

int tx_query(idemsink_tx* tx, const char* sql, const idemsink_sql_param* params, size_t n, idemsink_row_fn on_row,
             void* row_ctx, char* err, size_t cap) {
  return guarded(tx, sql, params, n, err, cap, [&] {
    for (const auto& row : tx->conn->query_prepared(sql, to_params(params, n))) {
      std::vector<idemsink_bytes> cols(row.size());
      for (size_t i = 0; i < row.size(); ++i)
        cols[i] = row[i] ? idemsink_bytes{row[i]->data(), row[i]->size()} : idemsink_bytes{nullptr, 0};
      if (on_row) on_row(row_ctx, cols.size(), cols.data());
    }
  });
}

int tx_write_row(idemsink_tx* tx, const idemsink_row* row, char* err, size_t cap) {
  if (int rc = unusable(tx, "tx_write_row", err, cap)) return rc;
  if (row == nullptr) {
    write_err(err, cap, "no row given");
    return ER_WRONG_ARGUMENTS;
  }
  DeferredRows one;  // checked and copied before it joins the record's rows
  if (const std::string why = one.add(*row); !why.empty())
    return refuse(tx, ER_WRONG_ARGUMENTS, "tx_write_row: " + why, err, cap);
  // Like a statement above max_allowed_packet (guarded): refused here, as the
  // server would refuse the statement holding the row and close the connection.
  const uint64_t bytes = bound_bytes(row->values, row->column_count);
  if (bytes + 4096 > tx->conn->statement_budget())
    return refuse(tx, ER_NET_PACKET_TOO_LARGE,
                  "row of " + std::to_string(bytes) +
                      " bytes is too large for one statement under the server's max_allowed_packet (" +
                      std::to_string(tx->conn->max_packet()) + ")",
                  err, cap);
  tx->rows.take(std::move(one));
  return 0;
}

}  // namespace

std::optional<db::Connection::Param> bound_param(const idemsink_sql_param& p) {
  using T = db::Connection::Param::Type;
  db::Connection::Param out;
  switch (p.type) {
    case IDEMSINK_SQL_NULL: out.type = T::Null; return out;
    case IDEMSINK_SQL_INT:
      out.type = T::Int;
      out.i = p.i;
      return out;
    case IDEMSINK_SQL_DOUBLE:
      out.type = T::Double;
      out.d = p.d;
      return out;
    case IDEMSINK_SQL_TEXT:
    case IDEMSINK_SQL_BLOB:
      out.type = p.type == IDEMSINK_SQL_TEXT ? T::Text : T::Blob;
      out.bytes = std::string_view(p.bytes.data ? p.bytes.data : "", p.bytes.len);
      return out;
  }
  return std::nullopt;
}

std::string refused_in_claim_tx(std::string_view sql) {
  // Skip whitespace and comments; MariaDB runs the body of /*! */ and /*M! */.
  size_t i = 0;
  for (;;) {
    while (i < sql.size() && std::isspace(static_cast<unsigned char>(sql[i]))) ++i;
    if (sql.substr(i, 3) == "/*!" || sql.substr(i, 4) == "/*M!")
      return "executable comments are not allowed in a local_tx statement";
    if (sql.substr(i, 2) == "/*") {
      const size_t end = sql.find("*/", i + 2);
      if (end == std::string_view::npos) return "unterminated comment in a local_tx statement";
      i = end + 2;
    } else if (sql.substr(i, 2) == "--" || sql.substr(i, 1) == "#") {
      const size_t end = sql.find('\n', i);
      if (end == std::string_view::npos) return "a local_tx statement holds only a comment";
      i = end + 1;
    } else {
      break;
    }
  }
  std::string word;
  while (i < sql.size() && std::isalpha(static_cast<unsigned char>(sql[i])))
    word.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(sql[i++]))));
  static const char* kAllowed[] = {"INSERT", "UPDATE", "DELETE", "REPLACE", "SELECT"};
  if (std::any_of(std::begin(kAllowed), std::end(kAllowed), [&](const char* k) { return word == k; })) return {};
  std::string shown(sql.substr(0, 80));
  for (char& c : shown)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  return "only INSERT, UPDATE, DELETE, REPLACE and SELECT run in the claim transaction of a local_tx handler (the "
         "host owns its boundary); refused: \"" +
         shown + (sql.size() > 80 ? "...\"" : "\"");
}

void install_tx_api(idemsink_host_api& api) {
  api.tx_execute = &tx_execute;
  api.tx_query = &tx_query;
  api.tx_write_row = &tx_write_row;
}

}  // namespace idemsink::plugin
