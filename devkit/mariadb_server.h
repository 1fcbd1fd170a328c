// A real mariadbd for tests and the demo: Debian's server binary in a
// scratch data directory, on a loopback port of its own, stopped with its
// parent process.
#pragma once

#include <memory>
#include <string>
#include <vector>
#include "core/config/config.h"
#include "core/db/connection.h"
#include "devkit/process.h"

namespace idemsink::devkit {

class MariaDbServer {
 public:
  /// One server per process, started on first use.
  static MariaDbServer& shared();

  /// `extra_args` go to mariadbd (e.g. TLS settings). Without
  /// `grant_tables` every client is root and no privilege is checked.
  explicit MariaDbServer(std::vector<std::string> extra_args = {}, bool grant_tables = false);
  ~MariaDbServer();

  /// Settings for a fresh, empty database `name` (dropped and recreated).
  config::DatabaseConfig fresh_database(const std::string& name);
  /// Settings for database `name` without touching it.
  config::DatabaseConfig database(const std::string& name) const;
  std::unique_ptr<db::Connection> connect(const std::string& name) const;

  /// SIGKILLs the server (the database "goes away"); restart() brings it back
  /// on the same port and data.
  void kill();
  void restart();

  /// root over the Unix socket: works whatever the server demands of TCP
  /// clients (TLS, a user's privileges).
  config::DatabaseConfig root_over_socket() const;

  // Replication, for failover tests. Start both servers with
  // replication_args(id) (binlog on, a server id of their own).

  /// mariadbd arguments of a server taking part in replication.
  static std::vector<std::string> replication_args(int server_id);
  /// Makes this server a replica of `primary`; with `semi_sync`, the
  /// primary's commits wait until this replica has received them.
  void replicate_from(const MariaDbServer& primary, bool semi_sync = false);
  /// Promotes a replica whose primary is gone: what it received but has not
  /// applied yet is applied first when `apply_received` (semi-synchronous:
  /// nothing acknowledged is lost), thrown away otherwise (asynchronous with
  /// a lag: the last seconds are lost); then it stops replicating and takes
  /// writes.
  void promote(bool apply_received);
  /// Waits until this replica has applied everything `primary` has
  /// committed so far (its GTID position).
  void catch_up_with(const MariaDbServer& primary) const;
  /// From now on, this replica applies what it receives `delay_s` seconds
  /// late.
  void lag_by(int delay_s);
  /// SQL as root over the socket.
  void execute(const std::string& sql) const;

  /// mariadbd arguments of node `index` (0-based) of a Galera cluster whose
  /// nodes listen for group communication on `gcomm_ports`; node 0 with
  /// `bootstrap` starts the cluster, the others join it (state transfer by
  /// rsync).
  static std::vector<std::string> galera_args(size_t index, const std::vector<int>& gcomm_ports, bool bootstrap);

  int port() const { return port_; }
  /// The server process (its CPU time, for benchmarks).
  pid_t pid() const { return server_->pid(); }
  const std::string& socket() const { return socket_; }

 private:
  std::vector<std::string> server_args() const;
  void start();
  bool galera() const;
  /// The last committed write set of a stopped Galera node, "uuid:seqno".
  std::string recover_galera_position() const;
  /// A Galera node run by root: the joiner's rsync daemon runs as nobody.
  bool rsync_as_nobody() const;
  ScratchDir dir_;
  std::vector<std::string> extra_args_;
  bool grant_tables_;
  int port_ = 0;
  std::string socket_;
  /// Where a restarted Galera node resumes (empty: as InnoDB says).
  std::string start_position_;
  std::unique_ptr<Process> server_;
};

}  // namespace idemsink::devkit
