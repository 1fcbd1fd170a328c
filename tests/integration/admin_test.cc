// The admin port facing a hostile network: POST needs the bearer token (or a
// loopback address), browsers' cross-site requests are refused, requests and
// connections are bounded, and nothing thrown while answering ends the host.
#define BOOST_TEST_MODULE admin
#include <utility>  // before Boost.Asio 1.74: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
#include <boost/test/unit_test.hpp>
#include <csignal>
#include <idemsink/plugin_abi.h>

#include "devkit/services.h"
#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace std::chrono_literals;
using tcp = boost::asio::ip::tcp;

namespace {

constexpr const char* kToken = "s3cret-token-for-tests";

// A host with its admin port; `listen_ip` is where it listens (so the port
// is chosen here, not by Scenario's `admin`, which listens on loopback).
struct AdminHost {
  Scenario s;
  int port = free_port();
  HostProcess* host = nullptr;
  int probe_errors = 0;  // 500s answered to the readiness probes
  AdminHost(const std::string& dbname, const std::string& listen_ip, bool with_token, const std::string& fault = "")
      : s(dbname) {
    s.topic("orders", 1);
    std::string host_lines = "admin_listen = \"" + listen_ip + ":" + std::to_string(port) + "\"\n";
    if (with_token) host_lines += "admin_token_env = \"ADMIN_TOKEN\"\n";
    std::map<std::string, std::string> env{{"ADMIN_TOKEN", kToken}};
    if (!fault.empty()) env["IDEMSINK_FAULT"] = fault;
    host = &s.host("host-a", {s.scripted("r", "orders")}, {.host_lines = host_lines, .env = env});
    wait_until(
        [&] {
          try {
            const int status = http_request(port, "GET", "/livez").first;
            probe_errors += status == 500;
            return status == 200;
          } catch (const std::exception&) {
            return false;  // not listening yet
          }
        },
        60s, "the admin port");
  }
};

// Sends raw bytes and returns everything the server answers until it closes.
std::string raw_exchange(int port, const std::string& bytes) {
  boost::asio::io_context io;
  tcp::socket s(io);
  s.connect(tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
  boost::system::error_code ec;
  // A server refusing the request may close before taking all of it: what
  // it answered is still there to read.
  boost::asio::write(s, boost::asio::buffer(bytes), ec);
  std::string out;
  char buf[4096];
  for (size_t n; (n = s.read_some(boost::asio::buffer(buf), ec)) > 0 || !ec;) out.append(buf, n);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(post_needs_the_bearer_token_and_no_origin_while_get_needs_nothing) {
  AdminHost h("admin_token", "127.0.0.1", true);
  BOOST_TEST(http_request(h.port, "GET", "/metrics").first == 200);
  BOOST_TEST(http_request(h.port, "GET", "/status").first == 200);
  BOOST_TEST(http_request(h.port, "POST", "/pause").first == 401);
  BOOST_TEST(http_request(h.port, "POST", "/pause", "", {{"Authorization", "Bearer wrong"}}).first == 401);
  BOOST_TEST(
      http_request(h.port, "POST", "/pause", "", {{"Authorization", std::string("Bearer ") + kToken + "x"}}).first ==
      401);
  BOOST_TEST(http_request(h.port, "POST", "/pause", "",
                          {{"Authorization", std::string("Bearer ") + kToken}, {"Origin", "https://evil.example"}})
                 .first == 403);
  BOOST_TEST(http_request(h.port, "GET", "/status").second.find("\"paused_by_operator\":false") != std::string::npos);
  BOOST_TEST(http_request(h.port, "POST", "/pause", "", {{"Authorization", std::string("Bearer ") + kToken}}).first ==
             200);
  BOOST_TEST(http_request(h.port, "GET", "/status").second.find("\"paused_by_operator\":true") != std::string::npos);
  BOOST_TEST(h.host->log().find(kToken) == std::string::npos);  // never logged
  BOOST_TEST(h.host->stop() == 0);
}

BOOST_AUTO_TEST_CASE(without_a_token_post_is_refused_on_a_non_loopback_address) {
  AdminHost h("admin_open", "0.0.0.0", false);
  BOOST_TEST(http_request(h.port, "GET", "/metrics").first == 200);
  const auto [status, body] = http_request(h.port, "POST", "/pause");
  BOOST_TEST(status == 403);
  BOOST_TEST(body.find("admin_token_env") != std::string::npos, body);
  BOOST_TEST(h.host->stop() == 0);
}

BOOST_AUTO_TEST_CASE(oversized_requests_and_connection_floods_are_refused_and_the_host_serves_on) {
  AdminHost h("admin_limits", "127.0.0.1", true);
  const std::string big_header =
      "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Filler: " + std::string(20000, 'a') + "\r\n\r\n";
  BOOST_TEST(raw_exchange(h.port, big_header).rfind("HTTP/1.1 431", 0) == 0u);
  // Refused on its Content-Length, before any of the body is read (sending
  // the body would race the server's close: a reset can eat the answer).
  const std::string big_body = "POST /pause HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n";
  BOOST_TEST(raw_exchange(h.port, big_body).rfind("HTTP/1.1 413", 0) == 0u);

  // 64 idle connections take every slot; the next one is closed at once.
  boost::asio::io_context io;
  std::vector<std::unique_ptr<tcp::socket>> idle;
  const tcp::endpoint ep(boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(h.port));
  for (int i = 0; i < 64; ++i) {
    idle.push_back(std::make_unique<tcp::socket>(io));
    idle.back()->connect(ep);
  }
  // Every accepted connection is registered before the next is accepted:
  // wait until the server has taken all 64 by probing with one more.
  wait_until(
      [&] {
        tcp::socket extra(io);
        extra.connect(ep);
        char c;
        boost::system::error_code ec;
        extra.read_some(boost::asio::buffer(&c, 1), ec);  // closed at once when over the cap
        return ec == boost::asio::error::eof || ec == boost::asio::error::connection_reset;
      },
      30s, "a connection over the cap to be closed at once");
  idle.clear();  // the slots come back
  wait_until(
      [&] {
        try {
          return http_request(h.port, "GET", "/metrics").first == 200;
        } catch (const std::exception&) {
          return false;
        }
      },
      30s, "the admin port to serve again");
  BOOST_TEST(h.host->running());
  BOOST_TEST(h.host->stop() == 0);
}

BOOST_AUTO_TEST_CASE(an_exception_while_answering_is_a_500_not_the_end_of_the_host) {
  AdminHost h("admin_throw", "127.0.0.1", false, "admin_throws:1");
  BOOST_TEST(h.probe_errors == 1);  // the first request answered threw
  for (int i = 0; i < 3; ++i) BOOST_TEST(http_request(h.port, "GET", "/metrics").first == 200);
  BOOST_TEST(h.host->running());
  BOOST_TEST(h.host->log().find("fault admin_throws") != std::string::npos);
  BOOST_TEST(h.host->stop() == 0);
}

// What an operator's tools expect: a version, a build gauge, a liveness
// probe, and SIGHUP that never stops the host.
BOOST_AUTO_TEST_CASE(version_build_info_liveness_and_sighup) {
  AdminHost h("admin_version", "127.0.0.1", false);
  auto [rc, out] = run_cli(h.s.dir, "version", {"--version"});
  BOOST_TEST(rc == 0);
  BOOST_TEST(out.find("idemsink 0.") == 0u, out);
  BOOST_TEST(out.find("librdkafka 2.") != std::string::npos, out);
  BOOST_TEST(out.find("MariaDB Connector/C 3.") != std::string::npos, out);
  BOOST_TEST(out.find("plugin ABI 1.") != std::string::npos, out);

  const std::string metrics = http_request(h.port, "GET", "/metrics").second;
  BOOST_TEST(metrics.find("idemsink_build_info{commit=\"") != std::string::npos, metrics);
  const std::string abi = std::to_string(IDEMSINK_ABI_MAJOR) + "." + std::to_string(IDEMSINK_ABI_MINOR);
  BOOST_TEST(metrics.find("plugin_abi=\"" + abi + "\"") != std::string::npos, metrics);
  BOOST_TEST(http_request(h.port, "GET", "/livez").first == 200);

  h.host->proc().signal(SIGHUP);
  // SIGHUP reloads the file; unchanged, it changes nothing and says so.
  wait_until([&] { return h.host->log().find("reload by signal:SIGHUP: no setting changed") != std::string::npos; },
             30s, "the SIGHUP log line");
  BOOST_TEST(
      http_request(h.port, "GET", "/metrics").second.find("idemsink_config_reloads_total{result=\"unchanged\"} 1") !=
      std::string::npos);
  BOOST_TEST(h.host->running());
  BOOST_TEST(http_request(h.port, "GET", "/livez").first == 200);
  BOOST_TEST(h.host->stop() == 0);
}

// An engine thread that stops running fails /livez, and recovers with it.
BOOST_AUTO_TEST_CASE(livez_fails_while_the_engine_thread_is_stuck) {
  AdminHost h("admin_livez", "127.0.0.1", false, "engine_stall:3");
  wait_until([&] { return http_request(h.port, "GET", "/livez").first == 503; }, 30s, "/livez to fail");
  BOOST_TEST(http_request(h.port, "GET", "/livez").second.find("engine loop has not run for") != std::string::npos);
  BOOST_TEST(http_request(h.port, "GET", "/metrics").first == 200);  // the admin thread is not the engine's
  wait_until([&] { return http_request(h.port, "GET", "/livez").first == 200; }, 30s, "/livez to recover");
  BOOST_TEST(h.host->stop() == 0);
}
