// One MariaDB connection (Connector/C, text protocol plus prepared statements
// for plugin SQL). Every value reaches SQL either escaped by the connector
// (quote) or as a hex literal (hex): binary keys with quotes, backslashes or
// NUL bytes round-trip exactly.
#pragma once

#include <mysql.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/config/config.h"

namespace idemsink::db {

/// How the pipeline must react to a database error; decided here only.
enum class ErrorClass {
  ConnectionLost,  ///< server gone or unreachable: reconnect, re-run the job
  Transient,       ///< deadlock, lock wait timeout: re-run the job
  Data,            ///< the server refused a row's data (too long, invalid text, no partition, packet too
                   ///< large): the same statement fails again; isolate the row
  Unexpected       ///< anything else: back off and re-run, for a bounded time (not the ABI's PERMANENT)
};

class DbError : public std::runtime_error {
 public:
  DbError(unsigned code, const std::string& msg);
  unsigned code() const { return code_; }
  ErrorClass error_class() const { return class_; }

 private:
  unsigned code_;
  ErrorClass class_;
};

ErrorClass classify(unsigned mysql_errno);

using Row = std::vector<std::optional<std::string>>;

class Connection {
 public:
  /// Connects; throws DbError.
  explicit Connection(const config::DatabaseConfig& cfg);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  /// Runs a statement that returns no rows; returns affected rows.
  uint64_t execute(std::string_view sql);
  /// Runs a statement returning rows (SELECT, INSERT ... RETURNING).
  std::vector<Row> query(std::string_view sql);

  void begin() { execute("START TRANSACTION"); }
  void commit() { execute("COMMIT"); }
  /// Rolls back, ignoring errors (the connection may already be gone).
  void rollback_quietly() noexcept;

  /// 'text' escaped by the connector for this connection's charset.
  std::string quote(std::string_view text);
  /// X'..' literal: exact for any bytes.
  static std::string hex(std::string_view bytes);

  /// Prepared statement with bound parameters (plugin SQL in local_tx).
  struct Param {
    enum class Type { Null, Int, Double, Text, Blob } type = Type::Null;
    int64_t i = 0;
    double d = 0;
    std::string_view bytes;
  };
  uint64_t execute_prepared(const std::string& sql, const std::vector<Param>& params);
  std::vector<Row> query_prepared(const std::string& sql, const std::vector<Param>& params);

  /// Statements sent on this connection so far (for statements-per-batch figures).
  uint64_t statements_sent() const { return statements_; }
  /// The server's max_allowed_packet, read at connect.
  uint64_t max_packet() const { return max_packet_; }
  /// The server's @@server_id, read at connect: another one on a reconnect
  /// means another server answers (a failover).
  uint64_t server_id() const { return server_id_; }
  /// The size one multi-row statement is built up to: well below max_packet().
  size_t statement_budget() const { return static_cast<size_t>(max_packet_ / 10 * 9); }
  MYSQL* raw() { return mysql_; }

 private:
  [[noreturn]] void throw_error();
  MYSQL_STMT* prepared(const std::string& sql);
  void run_prepared(MYSQL_STMT* st, const std::vector<Param>& params);

  MYSQL* mysql_ = nullptr;
  std::map<std::string, MYSQL_STMT*> stmt_cache_;
  uint64_t statements_ = 0;
  uint64_t max_packet_ = 16 << 20;
  uint64_t server_id_ = 0;
};

}  // namespace idemsink::db
