#include "devkit/mariadb_server.h"

#include <signal.h>

#include <stdexcept>
#include <thread>

namespace idemsink::devkit {
namespace {

std::string find_binary(const std::vector<std::string>& candidates) {
  for (const auto& c : candidates)
    if (std::filesystem::exists(c)) return c;
  throw std::runtime_error("MariaDB server binary not found (tried " + candidates.front() +
                           "); install mariadb-server (scripts/install-deps)");
}

}  // namespace

MariaDbServer& MariaDbServer::shared() {
  static MariaDbServer server;
  return server;
}

MariaDbServer::MariaDbServer(std::vector<std::string> extra_args, bool grant_tables)
    : dir_("mariadb"), extra_args_(std::move(extra_args)), grant_tables_(grant_tables) {
  const std::string install = find_binary({"/usr/bin/mariadb-install-db", "/usr/bin/mysql_install_db"});
  Process init({install, "--no-defaults", "--datadir=" + (dir_ / "data").string(), "--user=root",
                "--auth-root-authentication-method=normal", "--skip-test-db"},
               dir_ / "install.out", dir_ / "install.err");
  auto rc = init.wait(std::chrono::seconds(120));
  if (!rc || *rc != 0)
    throw std::runtime_error("mariadb-install-db failed: " + read_file(dir_ / "install.err") +
                             read_file(dir_ / "install.out"));
  port_ = free_port();
  socket_ = (dir_ / "mysqld.sock").string();
  start();
}

MariaDbServer::~MariaDbServer() {
  if (server_) {
    server_->signal(SIGTERM);
    if (!server_->wait(std::chrono::seconds(20))) server_->kill_now();
  }
}

void MariaDbServer::start() {
  const std::string mariadbd = find_binary({"/usr/sbin/mariadbd", "/usr/sbin/mysqld"});
  std::vector<std::string> args{mariadbd,
                                "--no-defaults",
                                "--datadir=" + (dir_ / "data").string(),
                                "--socket=" + socket_,
                                "--port=" + std::to_string(port_),
                                "--bind-address=127.0.0.1",
                                "--user=root",
                                "--skip-name-resolve",
                                "--innodb-buffer-pool-size=256M",
                                "--max-connections=1000",
                                "--pid-file=" + (dir_ / "mysqld.pid").string()};
  if (!grant_tables_) args.push_back("--skip-grant-tables");
  args.insert(args.end(), extra_args_.begin(), extra_args_.end());
  server_ = std::make_unique<Process>(args, dir_ / "server.out", dir_ / "server.err");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    try {
      db::Connection c(root_over_socket());
      return;
    } catch (const db::DbError&) {
    }
    if (!server_->running())
      throw std::runtime_error("mariadbd exited during start-up: " + read_file(dir_ / "server.err"));
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("mariadbd did not accept connections within 60s: " + read_file(dir_ / "server.err"));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void MariaDbServer::kill() { server_->kill_now(); }

void MariaDbServer::restart() {
  if (server_ && server_->running()) kill();
  start();
}

config::DatabaseConfig MariaDbServer::database(const std::string& name) const {
  config::DatabaseConfig cfg;
  cfg.host = "127.0.0.1";
  cfg.port = port_;
  cfg.user = "root";
  cfg.database = name;
  cfg.pool_size = 4;
  cfg.connect_timeout = std::chrono::milliseconds(2000);
  cfg.reconnect_backoff_max = std::chrono::milliseconds(500);
  cfg.job_give_up_after = std::chrono::seconds(60);
  return cfg;
}

config::DatabaseConfig MariaDbServer::root_over_socket() const {
  config::DatabaseConfig cfg = database("");
  cfg.socket = socket_;
  return cfg;
}

config::DatabaseConfig MariaDbServer::fresh_database(const std::string& name) {
  db::Connection c(root_over_socket());
  c.execute("DROP DATABASE IF EXISTS `" + name + "`");
  c.execute("CREATE DATABASE `" + name + "` CHARACTER SET utf8mb4");
  return database(name);
}

std::unique_ptr<db::Connection> MariaDbServer::connect(const std::string& name) const {
  return std::make_unique<db::Connection>(database(name));
}

}  // namespace idemsink::devkit
