// The host side of idemsink_tx: a local_tx plugin's SQL runs on the pool
// connection that holds the claim transaction.
#pragma once

#include <idemsink/plugin_abi.h>

#include "core/db/connection.h"

/// Opaque to plugins (plugin_abi.h); defined here for the host.
struct idemsink_tx {
  idemsink::db::Connection* conn;
  /// Set when a statement failed in a way that ended the transaction
  /// (deadlock, lost connection): the whole job must be re-run, and every
  /// further statement on this tx is refused so nothing runs outside it.
  unsigned broken_code = 0;
  std::string broken_message;
};

namespace idemsink::plugin {

/// Fills the tx_execute / tx_query members of a host API table.
void install_tx_api(idemsink_host_api& api);

}  // namespace idemsink::plugin
