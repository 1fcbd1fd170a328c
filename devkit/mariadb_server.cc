#include "devkit/mariadb_server.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <regex>
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
  // A temporary directory of its own: a starting server deletes every
  // "#sql*" file in its tmpdir, so servers sharing /tmp (tests side by side,
  // torture seeds run at once) removed each other's temporary tables and
  // failed mid-install ("Unknown table 'mysql.tmp_user_sys'").
  std::filesystem::create_directories(dir_ / "tmp");
  Process init(
      {install, "--no-defaults", "--datadir=" + (dir_ / "data").string(), "--tmpdir=" + (dir_ / "tmp").string(),
       "--user=root", "--auth-root-authentication-method=normal", "--skip-test-db"},
      dir_ / "install.out", dir_ / "install.err");
  auto rc = init.wait(std::chrono::seconds(120));
  if (!rc || *rc != 0)
    throw std::runtime_error("mariadb-install-db failed: " + read_file(dir_ / "install.err") +
                             read_file(dir_ / "install.out"));
  if (rsync_as_nobody()) {
    // A joining Galera node receives its state by rsync, whose daemon drops
    // root for nobody: the data directory must be open to it (and what the
    // server creates later, see start()).
    namespace fs = std::filesystem;
    fs::permissions(dir_.path(), fs::perms::all);
    for (const auto& e : fs::recursive_directory_iterator(dir_ / "data")) fs::permissions(e.path(), fs::perms::all);
    fs::permissions(dir_ / "data", fs::perms::all);
  }
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

bool MariaDbServer::rsync_as_nobody() const { return ::geteuid() == 0 && galera(); }

std::vector<std::string> MariaDbServer::server_args() const {
  const std::string mariadbd = find_binary({"/usr/sbin/mariadbd", "/usr/sbin/mysqld"});
  std::vector<std::string> args{mariadbd,
                                "--no-defaults",
                                "--datadir=" + (dir_ / "data").string(),
                                "--tmpdir=" + (dir_ / "tmp").string(),
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
  return args;
}

bool MariaDbServer::galera() const {
  return std::find(extra_args_.begin(), extra_args_.end(), "--wsrep-on=ON") != extra_args_.end();
}

std::string MariaDbServer::recover_galera_position() const {
  std::vector<std::string> args = server_args();
  const auto log = dir_ / "recover.err";
  args.push_back("--wsrep-recover");
  args.push_back("--log-error=" + log.string());
  Process recovery(args, dir_ / "recover.out", dir_ / "recover.stderr");
  if (recovery.wait(std::chrono::seconds(60)) != 0)
    throw std::runtime_error("mariadbd --wsrep-recover failed: " + read_file(log) + recovery.err());
  static const std::regex position(R"(WSREP: Recovered position: ([0-9a-f-]+:-?[0-9]+))");
  const std::string text = read_file(log);
  std::smatch last;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), position); it != std::sregex_iterator(); ++it)
    last = *it;
  if (last.empty()) throw std::runtime_error("mariadbd --wsrep-recover printed no position: " + text);
  return last[1].str();
}

void MariaDbServer::start() {
  std::vector<std::string> args = server_args();
  if (!start_position_.empty()) args.push_back("--wsrep-start-position=" + start_position_);
  std::map<std::string, std::string> env;
  if (rsync_as_nobody()) env = {{"UMASK", "0666"}, {"UMASK_DIR", "0777"}};  // the modes of new files, directories
  server_ = std::make_unique<Process>(args, dir_ / "server.out", dir_ / "server.err", env);
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
  // A Galera node killed mid-write saved no position (seqno -1) and would ask
  // for a full copy (SST) from a busy donor. As the service unit does
  // (galera_recovery), read its last committed position from InnoDB first:
  // it rejoins with only the missing write sets (IST).
  if (galera()) start_position_ = recover_galera_position();
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

std::vector<std::string> MariaDbServer::replication_args(int server_id) {
  return {"--server-id=" + std::to_string(server_id), "--log-bin=mysql-bin", "--binlog-format=ROW",
          "--log-slave-updates", "--relay-log=relay-bin"};
}

std::vector<std::string> MariaDbServer::galera_args(size_t index, const std::vector<int>& gcomm_ports, bool bootstrap) {
  std::string members;
  for (int p : gcomm_ports) members += (members.empty() ? "" : ",") + std::string("127.0.0.1:") + std::to_string(p);
  const std::string me = "127.0.0.1:" + std::to_string(gcomm_ports.at(index));
  std::vector<std::string> args{
      "--wsrep-on=ON",
      "--wsrep-provider=/usr/lib/galera/libgalera_smm.so",
      "--wsrep-cluster-name=idemsink-test",
      "--wsrep-cluster-address=gcomm://" + (bootstrap ? std::string() : members),
      "--wsrep-node-name=node" + std::to_string(index + 1),
      "--wsrep-node-address=" + me,
      "--wsrep-provider-options=gmcast.listen_addr=tcp://" + me + ";ist.recv_addr=127.0.0.1:" +
          std::to_string(free_port()) + ";gcache.size=64M;evs.suspect_timeout=PT3S;evs.inactive_timeout=PT6S",
      "--wsrep-sst-method=rsync",
      "--wsrep-sst-receive-address=127.0.0.1:" + std::to_string(free_port()),
      "--binlog-format=ROW",
      "--default-storage-engine=InnoDB",
      "--innodb-autoinc-lock-mode=2",
  };
  if (bootstrap) args.push_back("--wsrep-new-cluster");
  return args;
}

void MariaDbServer::execute(const std::string& sql) const {
  db::Connection c(root_over_socket());
  c.execute(sql);
}

void MariaDbServer::replicate_from(const MariaDbServer& primary, bool semi_sync) {
  if (semi_sync) {
    // Never falls back to asynchronous (the timeout is long): every commit the
    // primary acknowledges has reached this replica.
    primary.execute("SET GLOBAL rpl_semi_sync_master_enabled = ON, rpl_semi_sync_master_timeout = 600000");
    execute("SET GLOBAL rpl_semi_sync_slave_enabled = ON");
  }
  execute("CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = " + std::to_string(primary.port()) +
          ", MASTER_USER = 'root', MASTER_PASSWORD = '', MASTER_USE_GTID = slave_pos");
  execute("START SLAVE");
  db::Connection c(root_over_socket());
  wait_until(
      [&] {
        auto rows = c.query("SHOW SLAVE STATUS");
        // Slave_IO_Running and Slave_SQL_Running are columns 10 and 11.
        return !rows.empty() && rows[0].size() > 11 && rows[0][10].value_or("") == "Yes" &&
               rows[0][11].value_or("") == "Yes";
      },
      std::chrono::seconds(30), "replication to start", std::chrono::milliseconds(50));
}

void MariaDbServer::promote(bool apply_received) {
  db::Connection c(root_over_socket());
  if (apply_received) {
    // The primary is gone: nothing more arrives. Wait until the SQL thread
    // has applied what the relay log holds.
    c.execute("STOP SLAVE IO_THREAD");
    wait_until(
        [&] {
          return c.query(
                      "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE LIKE "
                      "'%read all relay log%'")
                     .at(0)
                     .at(0)
                     .value_or("0") != "0";
        },
        std::chrono::seconds(60), "the relay log to be applied", std::chrono::milliseconds(100));
  }
  c.execute("STOP SLAVE");
  c.execute("RESET SLAVE ALL");
  c.execute("SET GLOBAL read_only = OFF");
}

void MariaDbServer::catch_up_with(const MariaDbServer& primary) const {
  db::Connection on_primary(primary.root_over_socket());
  const std::string pos = on_primary.query("SELECT @@gtid_binlog_pos").at(0).at(0).value_or("");
  db::Connection c(root_over_socket());
  if (c.query("SELECT MASTER_GTID_WAIT(" + c.quote(pos) + ", 60)").at(0).at(0).value_or("-1") != "0")
    throw std::runtime_error("the replica did not reach the primary's position " + pos + " within 60s");
}

void MariaDbServer::lag_by(int delay_s) {
  execute("STOP SLAVE");
  execute("CHANGE MASTER TO MASTER_DELAY = " + std::to_string(delay_s));
  execute("START SLAVE");
}

std::unique_ptr<db::Connection> MariaDbServer::connect(const std::string& name) const {
  return std::make_unique<db::Connection>(database(name));
}

}  // namespace idemsink::devkit
