// TLS to the business database: a scratch MariaDB that takes TCP clients only
// over TLS (require_secure_transport), with a CA and a server certificate made
// here by openssl. The host connects with verification; a wrong CA is refused
// with an error naming TLS; a plain connection is refused by the server.
#define BOOST_TEST_MODULE tls
#include <boost/test/unit_test.hpp>

#include "core/db/connection.h"
#include "devkit/mariadb_server.h"
#include "tests/support/certificates.h"
#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace idemsink::devkit;
using namespace std::chrono_literals;

namespace {

// Privileges checked, TCP only over TLS, and the application's user made to
// require it too.
struct TlsServer {
  TestCertificates certs;
  MariaDbServer server{{"--ssl-ca=" + certs.path("ca.pem"), "--ssl-cert=" + certs.path("server.pem"),
                        "--ssl-key=" + certs.path("server.key"), "--require-secure-transport=ON"},
                       true};
  TlsServer() {
    db::Connection root(server.root_over_socket());
    root.execute("CREATE USER IF NOT EXISTS 'app'@'%' IDENTIFIED BY 'app-pw' REQUIRE SSL");
    root.execute("GRANT ALL PRIVILEGES ON *.* TO 'app'@'%'");
  }
  config::DatabaseConfig app(const std::string& dbname) { return as_app(server.fresh_database(dbname)); }
  /// The same database, reached as the application's user with verification.
  config::DatabaseConfig as_app(config::DatabaseConfig cfg) {
    cfg.user = "app";
    cfg.password = "app-pw";
    cfg.tls_mode = config::TlsMode::Verify;
    cfg.tls_ca = certs.path("ca.pem");
    return cfg;
  }
};

TlsServer& tls_server() {
  static TlsServer s;
  return s;
}

}  // namespace

BOOST_AUTO_TEST_CASE(verify_mode_connects_over_tls_and_refuses_a_wrong_ca) {
  auto& s = tls_server();
  auto cfg = s.app("tls_modes");
  {
    db::Connection c(cfg);
    const auto cipher = c.query("SHOW SESSION STATUS LIKE 'Ssl_cipher'");
    BOOST_REQUIRE(cipher.size() == 1u);
    BOOST_TEST(!cipher[0][1].value_or("").empty());
  }

  auto wrong = cfg;
  wrong.tls_ca = s.certs.path("other-ca.pem");
  try {
    db::Connection c(wrong);
    BOOST_FAIL("connected although the server's certificate is not signed by tls_ca");
  } catch (const db::DbError& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("tls_mode verify") != std::string::npos, what);
    BOOST_TEST(what.find("other-ca.pem") != std::string::npos, what);
  }

  // Required: TLS without checking the certificate (any CA, or none).
  auto required = wrong;
  required.tls_mode = config::TlsMode::Required;
  BOOST_CHECK_NO_THROW(db::Connection{required});

  // Disabled: the server refuses a plain TCP client.
  auto plain = cfg;
  plain.tls_mode = config::TlsMode::Disabled;
  plain.tls_ca.clear();
  try {
    db::Connection c(plain);
    BOOST_FAIL("a plain connection was accepted although the server requires secure transport");
  } catch (const db::DbError& e) {
    const std::string what = e.what();
    BOOST_TEST(
        (what.find("insecure transport") != std::string::npos || what.find("Access denied") != std::string::npos),
        what);
  }
}

BOOST_AUTO_TEST_CASE(the_host_runs_against_a_server_that_requires_tls) {
  auto& tls = tls_server();
  Scenario s("tls_host", tls.server);
  const auto db = tls.as_app(s.db);
  s.topic("orders", 2);
  s.kafka.produce("orders", keyed_messages("t-", 0, 50, "v"));
  // The host connects as the application's user, with its password, over TLS.
  auto& host = s.host("host-a", {s.scripted("r", "orders")}, {.database = db});
  s.wait_committed(host);
  BOOST_TEST(host.stop() == 0);
  BOOST_TEST(read_call_log(s.calls_log()).size() == 50u);
  db::Connection c(db);
  BOOST_TEST(*c.query("SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Done))[0][0] == "50");
}

// The admin port over HTTPS (host.admin_tls_cert/key): the console and its
// API answer a client that trusts the CA; a plain HTTP request gets nothing.
BOOST_AUTO_TEST_CASE(the_admin_port_speaks_https_with_its_certificate) {
  TestCertificates certs;
  Scenario s("tls_admin");
  s.topic("orders", 1);
  const int port = free_port();
  write_file(s.dir / "tokens", "vera viewer * viewer-secret-0123456789\n");
  auto& host = s.host("host-a", {s.scripted("r", "orders")},
                      {.host_lines = "admin_listen = \"127.0.0.1:" + std::to_string(port) + "\"\nadmin_tls_cert = \"" +
                                     certs.path("server.pem") + "\"\nadmin_tls_key = \"" + certs.path("server.key") +
                                     "\"\nadmin_tokens_file = \"" + (s.dir / "tokens").string() + "\"\n"});
  const std::string base = "https://127.0.0.1:" + std::to_string(port);
  const auto out = s.dir / "curl.out";
  auto curl = [&](const std::string& args) {
    const int rc = std::system(("curl -s -S --max-time 10 --retry 20 --retry-connrefused --retry-delay 1 " + args +
                                " > '" + out.string() + "' 2>&1")
                                   .c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  };
  BOOST_TEST(curl("--cacert " + certs.path("ca.pem") + " -H 'Authorization: Bearer viewer-secret-0123456789' " + base +
                  "/api/v1/whoami") == 0,
             read_file(out));
  BOOST_TEST(read_file(out).find("\"role\": \"viewer\"") != std::string::npos, read_file(out));
  BOOST_TEST(curl("--cacert " + certs.path("ca.pem") + " " + base + "/") == 0);
  BOOST_TEST(read_file(out).find("idemsink console") != std::string::npos);
  // A client that does not trust the CA refuses the server; plain HTTP gets no answer.
  BOOST_TEST(curl("--cacert " + certs.path("other-ca.pem") + " " + base + "/livez") != 0);
  BOOST_TEST(http_status(port, "/livez") == -1);
  BOOST_TEST(host.stop() == 0);
}
