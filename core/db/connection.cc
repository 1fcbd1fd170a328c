#include "core/db/connection.h"

#include <errmsg.h>
#include <mysqld_error.h>

#include <cstring>

namespace idemsink::db {

ErrorClass classify(unsigned code) {
  switch (code) {
    case CR_CONNECTION_ERROR:
    case CR_CONN_HOST_ERROR:
    case CR_SERVER_GONE_ERROR:
    case CR_SERVER_LOST:
    case CR_SERVER_LOST_EXTENDED:
    case CR_COMMANDS_OUT_OF_SYNC:
    case ER_SERVER_SHUTDOWN:
    case ER_CONNECTION_KILLED:
    case ER_QUERY_INTERRUPTED:
    case ER_CON_COUNT_ERROR:
    case ER_TOO_MANY_USER_CONNECTIONS:
    case ER_UNKNOWN_COM_ERROR:  // Galera: "WSREP has not yet prepared node for application use"
      return ErrorClass::ConnectionLost;
    case ER_LOCK_DEADLOCK:  // also Galera's certification failure at commit: another node wrote the row first
    case ER_LOCK_WAIT_TIMEOUT:
    case ER_OPTION_PREVENTS_STATEMENT:  // read-only during a failover
      return ErrorClass::Transient;
    case ER_DATA_TOO_LONG:
    case ER_TRUNCATED_WRONG_VALUE_FOR_FIELD:
    case ER_TRUNCATED_WRONG_VALUE:
    case ER_WARN_DATA_OUT_OF_RANGE:
    case WARN_DATA_TRUNCATED:
    case ER_BAD_NULL_ERROR:
    case ER_INVALID_CHARACTER_STRING:
    case ER_NO_PARTITION_FOR_GIVEN_VALUE:
    case ER_NET_PACKET_TOO_LARGE: return ErrorClass::Data;
    default:
      // Client-side (2xxx) errors not listed above still mean the connection
      // is unusable; server errors (1xxx) are about the statement.
      return code >= 2000 && code < 3000 ? ErrorClass::ConnectionLost : ErrorClass::Unexpected;
  }
}

DbError::DbError(unsigned code, const std::string& msg)
    : std::runtime_error("MariaDB error " + std::to_string(code) + ": " + msg), code_(code), class_(classify(code)) {}

Connection::Connection(const config::DatabaseConfig& cfg) {
  mysql_ = mysql_init(nullptr);
  if (mysql_ == nullptr) throw DbError(CR_OUT_OF_MEMORY, "mysql_init failed");
  unsigned timeout_s = static_cast<unsigned>(std::max<int64_t>(1, cfg.connect_timeout.count() / 1000));
  unsigned io_timeout_s = 120;  // longer than innodb_lock_wait_timeout: a silent server is gone
  my_bool no = 0;
  mysql_options(mysql_, MYSQL_OPT_CONNECT_TIMEOUT, &timeout_s);
  mysql_options(mysql_, MYSQL_OPT_READ_TIMEOUT, &io_timeout_s);
  mysql_options(mysql_, MYSQL_OPT_WRITE_TIMEOUT, &io_timeout_s);
  mysql_options(mysql_, MYSQL_OPT_RECONNECT, &no);  // a silent reconnect would drop our transaction state
  mysql_options(mysql_, MYSQL_SET_CHARSET_NAME, "utf8mb4");
  const bool via_socket = !cfg.socket.empty();
  std::string tls;  // for error messages
  if (cfg.tls_mode != config::TlsMode::Disabled && !via_socket) {
    // Any TLS option makes Connector/C ask for TLS; enforce refuses a server
    // without it; verify checks the chain to tls_ca and the host name (given
    // a CA, Connector/C checks the chain, so only verify passes one).
    auto opt = [](const std::string& s) { return s.empty() ? nullptr : s.c_str(); };
    const bool verifying = cfg.tls_mode == config::TlsMode::Verify;
    mysql_ssl_set(mysql_, opt(cfg.tls_key), opt(cfg.tls_cert), verifying ? opt(cfg.tls_ca) : nullptr, nullptr, nullptr);
    my_bool enforce = cfg.tls_mode != config::TlsMode::Preferred, verify = verifying;
    mysql_optionsv(mysql_, MYSQL_OPT_SSL_ENFORCE, &enforce);
    mysql_optionsv(mysql_, MYSQL_OPT_SSL_VERIFY_SERVER_CERT, &verify);
    tls = ", tls_mode " + std::string(config::choice_name(cfg.tls_mode)) +
          (cfg.tls_ca.empty() ? "" : ", tls_ca " + cfg.tls_ca);
  }
  if (mysql_real_connect(mysql_, via_socket ? nullptr : cfg.host.c_str(), cfg.user.c_str(), cfg.password.c_str(),
                         cfg.database.c_str(), via_socket ? 0 : static_cast<unsigned>(cfg.port),
                         via_socket ? cfg.socket.c_str() : nullptr, 0) == nullptr) {
    unsigned code = mysql_errno(mysql_);
    std::string msg = mysql_error(mysql_);
    mysql_close(mysql_);
    mysql_ = nullptr;
    throw DbError(code, msg + (via_socket ? " (socket " + cfg.socket + ")"
                                          : " (" + cfg.host + ":" + std::to_string(cfg.port) + tls + ")"));
  }
  // READ COMMITTED: claim reads see the newest committed rows; all state
  // changes are conditional single statements, not read-then-write.
  execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED");
  execute("SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ZERO_DATE,NO_ENGINE_SUBSTITUTION'");
  execute("SET time_zone = '+00:00'");
  // Multi-row statements are sized against it: one above it would not be
  // sent, whatever its rows hold.
  // One round trip for both: the server's packet limit, and which server this
  // is (a failover to a replica answers with another id).
  const auto row = query("SELECT @@max_allowed_packet, @@server_id").at(0);
  max_packet_ = std::stoull(row.at(0).value_or("16777216"));
  server_id_ = std::stoull(row.at(1).value_or("0"));
}

Connection::~Connection() {
  for (auto& [sql, st] : stmt_cache_) mysql_stmt_close(st);
  if (mysql_) mysql_close(mysql_);
}

void Connection::throw_error() { throw DbError(mysql_errno(mysql_), mysql_error(mysql_)); }

uint64_t Connection::execute(std::string_view sql) {
  ++statements_;
  if (mysql_real_query(mysql_, sql.data(), sql.size()) != 0) throw_error();
  if (MYSQL_RES* res = mysql_store_result(mysql_))
    mysql_free_result(res);
  else if (mysql_field_count(mysql_) != 0)
    throw_error();
  return mysql_affected_rows(mysql_);
}

std::vector<Row> Connection::query(std::string_view sql) {
  ++statements_;
  if (mysql_real_query(mysql_, sql.data(), sql.size()) != 0) throw_error();
  MYSQL_RES* res = mysql_store_result(mysql_);
  std::vector<Row> rows;
  if (res == nullptr) {
    if (mysql_field_count(mysql_) != 0) throw_error();
    return rows;
  }
  const unsigned n = mysql_num_fields(res);
  rows.reserve(mysql_num_rows(res));
  while (MYSQL_ROW r = mysql_fetch_row(res)) {
    unsigned long* lens = mysql_fetch_lengths(res);
    Row row(n);
    for (unsigned i = 0; i < n; ++i)
      if (r[i]) row[i] = std::string(r[i], lens[i]);
    rows.push_back(std::move(row));
  }
  mysql_free_result(res);
  return rows;
}

void Connection::rollback_quietly() noexcept {
  if (mysql_ == nullptr) return;
  ++statements_;
  mysql_real_query(mysql_, "ROLLBACK", 8);
}

std::string Connection::quote(std::string_view text) {
  std::string out(text.size() * 2 + 3, '\0');
  out[0] = '\'';
  unsigned long n = mysql_real_escape_string(mysql_, out.data() + 1, text.data(), text.size());
  out[n + 1] = '\'';
  out.resize(n + 2);
  return out;
}

std::string Connection::hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(bytes.size() * 2 + 3);
  out += "X'";
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 0xF]);
  }
  out.push_back('\'');
  return out;
}

MYSQL_STMT* Connection::prepared(const std::string& sql) {
  auto it = stmt_cache_.find(sql);
  if (it != stmt_cache_.end()) return it->second;
  MYSQL_STMT* st = mysql_stmt_init(mysql_);
  if (st == nullptr) throw_error();
  if (mysql_stmt_prepare(st, sql.data(), sql.size()) != 0) {
    DbError e(mysql_stmt_errno(st), mysql_stmt_error(st));
    mysql_stmt_close(st);
    throw e;
  }
  stmt_cache_.emplace(sql, st);
  return st;
}

void Connection::run_prepared(MYSQL_STMT* st, const std::vector<Param>& params) {
  if (mysql_stmt_param_count(st) != params.size())
    throw DbError(ER_WRONG_ARGUMENTS, "statement expects " + std::to_string(mysql_stmt_param_count(st)) +
                                          " parameters, got " + std::to_string(params.size()));
  std::vector<MYSQL_BIND> binds(params.size());
  std::vector<long long> ints(params.size());
  std::vector<double> doubles(params.size());
  std::vector<unsigned long> lengths(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    MYSQL_BIND& b = binds[i];
    std::memset(&b, 0, sizeof b);
    const Param& p = params[i];
    switch (p.type) {
      case Param::Type::Null: b.buffer_type = MYSQL_TYPE_NULL; break;
      case Param::Type::Int:
        ints[i] = p.i;
        b.buffer_type = MYSQL_TYPE_LONGLONG;
        b.buffer = &ints[i];
        break;
      case Param::Type::Double:
        doubles[i] = p.d;
        b.buffer_type = MYSQL_TYPE_DOUBLE;
        b.buffer = &doubles[i];
        break;
      case Param::Type::Text:
      case Param::Type::Blob:
        lengths[i] = p.bytes.size();
        b.buffer_type = p.type == Param::Type::Text ? MYSQL_TYPE_STRING : MYSQL_TYPE_BLOB;
        b.buffer = const_cast<char*>(p.bytes.data() ? p.bytes.data() : "");
        b.buffer_length = lengths[i];
        b.length = &lengths[i];
        break;
    }
  }
  ++statements_;
  if ((!binds.empty() && mysql_stmt_bind_param(st, binds.data()) != 0) || mysql_stmt_execute(st) != 0)
    throw DbError(mysql_stmt_errno(st), mysql_stmt_error(st));
}

uint64_t Connection::execute_prepared(const std::string& sql, const std::vector<Param>& params) {
  MYSQL_STMT* st = prepared(sql);
  run_prepared(st, params);
  uint64_t affected = mysql_stmt_affected_rows(st);
  mysql_stmt_free_result(st);
  return affected;
}

std::vector<Row> Connection::query_prepared(const std::string& sql, const std::vector<Param>& params) {
  MYSQL_STMT* st = prepared(sql);
  run_prepared(st, params);
  std::vector<Row> rows;
  MYSQL_RES* meta = mysql_stmt_result_metadata(st);
  if (meta == nullptr) return rows;
  const unsigned n = mysql_num_fields(meta);
  mysql_free_result(meta);
  // Fetch every column as a string: first learn each length, then fetch it.
  std::vector<MYSQL_BIND> binds(n);
  std::vector<unsigned long> lengths(n);
  std::vector<my_bool> nulls(n);
  for (unsigned i = 0; i < n; ++i) {
    std::memset(&binds[i], 0, sizeof binds[i]);
    binds[i].buffer_type = MYSQL_TYPE_STRING;
    binds[i].length = &lengths[i];
    binds[i].is_null = &nulls[i];
  }
  if (mysql_stmt_bind_result(st, binds.data()) != 0) throw DbError(mysql_stmt_errno(st), mysql_stmt_error(st));
  if (mysql_stmt_store_result(st) != 0) throw DbError(mysql_stmt_errno(st), mysql_stmt_error(st));
  for (;;) {
    int rc = mysql_stmt_fetch(st);
    if (rc == MYSQL_NO_DATA) break;
    if (rc == 1) throw DbError(mysql_stmt_errno(st), mysql_stmt_error(st));
    Row row(n);
    for (unsigned i = 0; i < n; ++i) {
      if (nulls[i]) continue;
      std::string v(lengths[i], '\0');
      if (lengths[i] > 0) {
        MYSQL_BIND col;
        std::memset(&col, 0, sizeof col);
        col.buffer_type = MYSQL_TYPE_STRING;
        col.buffer = v.data();
        col.buffer_length = lengths[i];
        if (mysql_stmt_fetch_column(st, &col, i, 0) != 0) throw DbError(mysql_stmt_errno(st), mysql_stmt_error(st));
      }
      row[i] = std::move(v);
    }
    rows.push_back(std::move(row));
  }
  mysql_stmt_free_result(st);
  return rows;
}

}  // namespace idemsink::db
