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

  int port() const { return port_; }
  /// The server process (its CPU time, for benchmarks).
  pid_t pid() const { return server_->pid(); }
  const std::string& socket() const { return socket_; }

 private:
  void start();
  ScratchDir dir_;
  std::vector<std::string> extra_args_;
  bool grant_tables_;
  int port_ = 0;
  std::string socket_;
  std::unique_ptr<Process> server_;
};

}  // namespace idemsink::devkit
