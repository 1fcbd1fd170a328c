// The host side of idemsink_tx: a local_tx plugin's SQL runs on the pool
// connection that holds the claim transaction.
#pragma once

#include <idemsink/plugin_abi.h>

#include <optional>
#include <string>
#include <string_view>

#include "core/db/connection.h"
#include "core/plugin/deferred_rows.h"

/// Opaque to plugins (plugin_abi.h); defined here for the host.
struct idemsink_tx {
  idemsink::db::Connection* conn;
  /// Set when a statement failed in a way that ended the transaction
  /// (deadlock, lost connection): the whole job must be re-run, and every
  /// further statement on this tx is refused so nothing runs outside it.
  unsigned broken_code = 0;
  std::string broken_message;
  /// The first statement the server refused for its data (a value too long
  /// for its column, invalid text): the transaction is intact (MariaDB rolls
  /// back only that statement), but the record's write cannot succeed as
  /// written. Unless the plugin still reports ok, the record is dead-lettered
  /// as db_rejected with this error, and the other records of the batch go on.
  unsigned refused_code = 0;
  std::string refused_message;
  /// Statements the plugin ran (tx_execute, tx_query), failed ones too: a
  /// record that ran none and did not report ok left nothing to undo.
  unsigned statements = 0;
  /// Rows queued by tx_write_row, written by the host after the apply.
  idemsink::plugin::DeferredRows rows;
};

namespace idemsink::plugin {

/// One bound parameter as the connection binds it (bytes point into the
/// caller's), or nullopt for a type this host does not know.
std::optional<db::Connection::Param> bound_param(const idemsink_sql_param& p);

/// Fills the tx_execute / tx_query / tx_write_row members of a host API table.
void install_tx_api(idemsink_host_api& api);

/// Why `sql` may not run inside the claim transaction, or empty if it may.
/// Only data statements run there (INSERT, UPDATE, DELETE, REPLACE, SELECT,
/// after leading comments): anything else could end the transaction (COMMIT,
/// DDL's implicit commit, a procedure, a savepoint, an executable comment)
/// and let the effect commit without its claim, to be applied again.
std::string refused_in_claim_tx(std::string_view sql);

}  // namespace idemsink::plugin
