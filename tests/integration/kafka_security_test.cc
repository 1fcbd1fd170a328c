// Kafka as production runs it: real brokers with security on (one KRaft
// node with a listener of each kind: TLS, mutual TLS, and SASL over TLS
// with PLAIN, SCRAM-SHA-256/512 and OAUTHBEARER; devkit/kafka_cluster.h),
// and the host against each. Per kind, a crash run: records under kill -9
// of the host, each called once, every one accounted (the audit logs in the
// same way). Then the failures a user meets: a wrong password, a refused
// token, a token endpoint that is down, a CA the host does not trust, a
// client certificate the broker refuses: each a clear line in the log and in
// /readyz, the host up and waiting. SCRAM with this librdkafka against
// Kafka 4 says why it fails (the same password logs in to Kafka 3.9), and
// the shipped config's security section logs in.
#define BOOST_TEST_MODULE kafka_security
#include <boost/test/unit_test.hpp>

#include <toml++/toml.h>

#include <algorithm>
#include <map>
#include <set>
#include <thread>

#include "devkit/services.h"
#include "tests/support/certificates.h"
#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace std::chrono_literals;
using devkit::KafkaCluster;
using Listener = KafkaCluster::Listener;

namespace {

const std::string kPlainPassword = "alice-secret";
const std::string kScramPassword = "scram-secret";
const std::string kOAuthSecret = "oauth-client-secret";

const TestCertificates& certs() {
  static const TestCertificates c;
  return c;
}

// One secured node per Kafka line ("" the project's 4.x, "3.9"), made on
// first use and shared by the cases.
std::shared_ptr<KafkaCluster> secure_kafka(const std::string& line = "") {
  static std::map<std::string, std::shared_ptr<KafkaCluster>> clusters;
  auto& c = clusters[line];
  if (!c) {
    KafkaCluster::Options o;
    o.nodes = 1;
    if (!line.empty()) o.libs = KafkaCluster::libs_dir(line);
    o.security = KafkaCluster::Security{certs().dir / "broker-keystore.pem",
                                        certs().dir / "ca.pem",
                                        {{"alice", kPlainPassword}, {"idemsink", kPlainPassword}},
                                        {{"scram-user", kScramPassword}},
                                        "kafka"};
    c = std::make_shared<KafkaCluster>(o);
  }
  return c;
}

// How a host logs in: its listener, [kafka.properties] lines, more tables.
struct Login {
  Listener listener;
  std::string properties;
  std::string tables;
  std::map<std::string, std::string> env;
};

std::string prop(const std::string& k, const std::string& v) { return "\"" + k + "\" = \"" + v + "\"\n"; }

Login tls(Listener l, const std::string& ca = "ca.pem") {
  return {l, prop("security.protocol", "SSL") + prop("ssl.ca.location", certs().path(ca)), "", {}};
}
Login mtls(const std::string& who = "client") {
  Login l = tls(Listener::Mtls);
  l.properties += prop("ssl.certificate.location", certs().path(who + ".pem")) +
                  prop("ssl.key.location", certs().path(who + ".key"));
  return l;
}
Login sasl(const std::string& mechanism, const std::string& user, const std::string& password) {
  // The password from the environment, as the shipped config takes it.
  return {Listener::SaslSsl,
          prop("security.protocol", "SASL_SSL") + prop("ssl.ca.location", certs().path("ca.pem")) +
              prop("sasl.mechanisms", mechanism) + prop("sasl.username", user) +
              prop("sasl.password", "${KAFKA_PASSWORD}"),
          "",
          {{"KAFKA_PASSWORD", password}}};
}
Login oauth(const devkit::FakeServices& idp, const std::string& secret = kOAuthSecret) {
  return {Listener::SaslSsl,
          prop("security.protocol", "SASL_SSL") + prop("ssl.ca.location", certs().path("ca.pem")) +
              prop("sasl.mechanisms", "OAUTHBEARER"),
          "[kafka.oauth]\ntoken_endpoint = \"" + idp.url() +
              "/oauth/token\"\nclient_id = \"idemsink\"\nclient_secret_env = \"KAFKA_OAUTH_SECRET\"\nscope = "
              "\"kafka\"\n",
          {{"KAFKA_OAUTH_SECRET", secret}}};
}

// The login's secret (to find in a log: never), or something no log holds.
std::string kafka_secret(const Login& login) {
  for (const auto& [k, v] : login.env) return v;
  return "\x01";
}

size_t lines_of(const std::string& log) { return static_cast<size_t>(std::count(log.begin(), log.end(), '\n')); }

Scenario::HostOptions host_options(const KafkaCluster& kafka, const Login& login, const std::string& group) {
  Scenario::HostOptions o;
  o.group = group;  // each scenario its own group and topics: the cluster is shared
  o.admin = true;
  o.bootstrap = kafka.bootstrap(login.listener);
  o.properties_lines = login.properties;
  o.tables = login.tables;
  o.env = login.env;
  return o;
}

// What /readyz says (its status and body), or nothing while the port is not up.
std::optional<std::pair<int, std::string>> readyz(int port) {
  try {
    return http_request(port, "GET", "/readyz");
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// 200 records over 2 partitions through a host logging in as `login`; the
// host is killed (SIGKILL) once a quarter are called, and started again:
// every record's key called, each with one idem_token (the remote applies
// it once; a call cut by the kill is made again with the same token), every
// committed record accounted.
void crash_run(const std::string& name, std::shared_ptr<KafkaCluster> kafka, const Login& login) {
  BOOST_TEST_CONTEXT(name) {
    Scenario s("security_" + name, kafka);
    const std::string topic = name + "_orders";
    s.topic(topic, 2).topic(topic + ".dlq", 1);
    s.kafka.produce(topic, keyed_messages(name + "-", 0, 200));
    // Four calls at a time, 20 ms each: the kill lands mid-run.
    const RouteSpec route = with_delay(s.scripted("orders", topic, "concurrency = 4\n"), "20ms");
    auto& first = s.host("h1", {route}, host_options(*kafka, login, name));
    devkit::wait_until([&] { return s.calls_per_key().size() >= 50 || !first.running(); }, 60s,
                       name + ": a quarter of the records called");
    BOOST_REQUIRE_MESSAGE(first.running(), first.log_tail());
    first.kill();
    auto& second = s.host("h1", {route}, host_options(*kafka, login, name));
    s.wait_committed(second, 120s, {topic}, name);
    const auto calls = s.calls_by_key();
    BOOST_TEST(calls.size() == 200u);
    for (const auto& [key, made] : calls) {
      std::set<std::string> tokens;
      for (const auto& cols : made) tokens.insert(cols.at(2));
      BOOST_TEST(tokens.size() == 1u, key << " called with " << tokens.size() << " tokens");
    }
    BOOST_TEST(second.stop() == 0);
    // The audit logs in as the host does: the same secrets in its environment.
    for (const auto& [k, v] : login.env) ::setenv(k.c_str(), v.c_str(), 1);
    s.audit_clean(second);
    BOOST_TEST(second.log().find(kafka_secret(login)) == std::string::npos, "a secret in the log");
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(each_listener_kind_carries_records_through_a_kill_9) {
  const auto kafka = secure_kafka();
  crash_run("ssl", kafka, tls(Listener::Ssl));
  crash_run("mtls", kafka, mtls());
  crash_run("plain", kafka, sasl("PLAIN", "alice", kPlainPassword));
  // OAUTHBEARER with the host's own tokens, each living 20 s: the run
  // outlives the first (librdkafka 2.0.2 cannot re-authenticate a
  // connection: the broker closes it at expiry, and it logs in anew).
  devkit::FakeServices idp(fake_services_binary(),
                           {"--oauth-client", "idemsink:" + kOAuthSecret, "--oauth-token-ttl", "20"});
  crash_run("oauth", kafka, oauth(idp));
  BOOST_TEST(idp.stats()["oauth"]["tokens"].get<int>() >= 2);
  // SCRAM with this librdkafka logs in to Kafka 3.9 (see below for 4.x).
  const auto kafka39 = secure_kafka("3.9");
  crash_run("scram256", kafka39, sasl("SCRAM-SHA-256", "scram-user", kScramPassword));
  crash_run("scram512", kafka39, sasl("SCRAM-SHA-512", "scram-user", kScramPassword));
}

// Each refusal a clear line in the log and in /readyz; the host neither
// exits nor spins, and a SIGTERM still ends it cleanly.
BOOST_AUTO_TEST_CASE(refused_logins_are_a_clear_line_and_the_host_waits) {
  const auto kafka = secure_kafka();
  devkit::FakeServices idp(fake_services_binary(), {"--oauth-client", "idemsink:" + kOAuthSecret});
  struct Case {
    std::string name;
    Login login;
    std::string says;  // in /readyz and in the log
  };
  const std::vector<Case> cases = {
      {"wrong_password", sasl("PLAIN", "alice", "not-the-password"), "Invalid username or password"},
      {"untrusted_ca", tls(Listener::Ssl, "other-ca.pem"), "does not chain to ssl.ca.location"},
      {"refused_certificate", mtls("rogue"), "the broker refused this client's certificate"},
      {"refused_token_client", oauth(idp, "a-wrong-secret"), "invalid_client"},
  };
  for (const auto& c : cases) BOOST_TEST_CONTEXT(c.name) {
      Scenario s("security_refused_" + c.name, kafka);
      s.topic(c.name, 1);
      auto& host = s.host("h1", {s.scripted("orders", c.name)}, host_options(*kafka, c.login, c.name));
      const int port = s.admin_port(host);
      std::string body;
      devkit::wait_until(
          [&] {
            BOOST_REQUIRE_MESSAGE(host.running(), host.log_tail());
            const auto r = readyz(port);
            if (!r) return false;
            body = r->second;
            return r->first == 503 && body.find(c.says) != std::string::npos;
          },
          60s, c.name + ": /readyz naming the refusal");
      BOOST_TEST(body.find("the cluster refused this client") != std::string::npos, body);
      BOOST_TEST(host.log().find(c.says) != std::string::npos);
      // Waiting, not spinning: librdkafka tries again with its backoff, and
      // says an identical error again only after 30 s.
      const size_t lines = lines_of(host.log());
      std::this_thread::sleep_for(5s);  // the time a spinning host would fill with lines
      BOOST_TEST(host.running());
      BOOST_TEST(lines_of(host.log()) < lines + 50);
      BOOST_TEST(host.log().find(kafka_secret(c.login)) == std::string::npos, "a secret in the log");
      BOOST_TEST(host.stop() == 0);
    }
  // A token endpoint that is down: not ready, named; the clients ask again.
  devkit::FakeServices down(fake_services_binary(), {"--oauth-client", "idemsink:" + kOAuthSecret});
  BOOST_TEST(http_request(down.port(), "POST", "/admin/oauth", R"({"down": true})").first == 200);
  Scenario s("security_refused_endpoint_down", kafka);
  s.topic("endpoint_down", 1);
  s.kafka.produce("endpoint_down", keyed_messages("down-", 0, 20));
  auto& host =
      s.host("h1", {s.scripted("orders", "endpoint_down")}, host_options(*kafka, oauth(down), "endpoint_down"));
  const int port = s.admin_port(host);
  devkit::wait_until(
      [&] {
        const auto r = readyz(port);
        return r && r->first == 503 && r->second.find("OAUTHBEARER token") != std::string::npos;
      },
      60s, "/readyz naming the token endpoint");
  BOOST_TEST((host.log().find("HTTP 503 temporarily_unavailable") != std::string::npos), host.log_tail());
  // Back: the host logs in within librdkafka's 10 s retry, and goes on.
  BOOST_TEST(http_request(down.port(), "POST", "/admin/oauth", R"({"down": false})").first == 200);
  s.wait_committed(host, 90s, {"endpoint_down"}, "endpoint_down");
  expect_each_key_called_once(s.calls_per_key(), 20);
  BOOST_TEST(host.stop() == 0);
}

// librdkafka before 2.6.1 and Kafka 4: the right SCRAM password refused.
// check-config --connect and /readyz say why and what to do; the same user
// and password log in to Kafka 3.9.
BOOST_AUTO_TEST_CASE(scram_against_kafka_4_says_why) {
  const auto kafka = secure_kafka();
  const Login scram = sasl("SCRAM-SHA-512", "scram-user", kScramPassword);
  Scenario s("security_scram_kafka4", kafka);
  s.topic("scram", 1);
  const RouteSpec route = s.scripted("orders", "scram");
  const auto config = s.dir / "check.toml";
  write_file(config, s.config("check", {route}, host_options(*kafka, scram, "scram")));
  ::setenv("KAFKA_PASSWORD", kScramPassword.c_str(), 1);
  const auto [rc, out] = run_cli(s.dir, "check4", {"check-config", "--config", config.string(), "--connect"});
  BOOST_TEST_MESSAGE("check-config --connect against Kafka 4 with SCRAM:\n" << out);
  BOOST_TEST(rc == 1, out);
  for (const char* says : {"Kafka 4.0 or later", "confluentinc/librdkafka#4895", "CVE-2024-56128",
                           "PLAIN or OAUTHBEARER", rd_kafka_version_str()})
    BOOST_TEST(out.find(says) != std::string::npos, says << " not in:\n" << out);
  auto& host = s.host("h1", {route}, host_options(*kafka, scram, "scram"));
  const int port = s.admin_port(host);
  devkit::wait_until(
      [&] {
        const auto r = readyz(port);
        return r && r->first == 503 && r->second.find("Kafka 4.0 or later") != std::string::npos;
      },
      60s, "/readyz naming the SCRAM cause");
  BOOST_TEST(host.log().find("logs in to Kafka 3.9 and earlier only") != std::string::npos);  // said at start
  BOOST_TEST(host.stop() == 0);
  // The same user and password on Kafka 3.9.
  const auto kafka39 = secure_kafka("3.9");
  write_file(config, s.config("check", {route}, host_options(*kafka39, scram, "scram")));
  const auto [rc39, out39] = run_cli(s.dir, "check39", {"check-config", "--config", config.string(), "--connect"});
  BOOST_TEST(rc39 == 0, out39);
  BOOST_TEST(out39.find("logged in to") != std::string::npos, out39);
}

// The security section of conf/idemsink.toml, as shipped, logs in to a
// broker (with the test's CA: the brokers' here is no system CA).
BOOST_AUTO_TEST_CASE(the_shipped_security_section_logs_in) {
  const auto kafka = secure_kafka();
  const toml::table shipped = toml::parse_file(std::string(IDEMSINK_SOURCE_DIR) + "/conf/idemsink.toml");
  std::string properties;
  for (const auto& [k, v] : *shipped["kafka"]["properties"].as_table())
    properties += prop(std::string(k.str()), *v.value<std::string>());
  BOOST_TEST_MESSAGE("the shipped [kafka.properties]:\n" << properties);
  Scenario s("security_shipped", kafka);
  s.topic("shipped", 1);
  Login shipped_login{Listener::SaslSsl,
                      properties + prop("ssl.ca.location", certs().path("ca.pem")),
                      "",
                      {{"KAFKA_PASSWORD", kPlainPassword}}};
  const auto config = s.dir / "shipped.toml";
  write_file(config,
             s.config("shipped", {s.scripted("orders", "shipped")}, host_options(*kafka, shipped_login, "shipped")));
  ::setenv("KAFKA_PASSWORD", kPlainPassword.c_str(), 1);
  const auto [rc, out] = run_cli(s.dir, "shipped", {"check-config", "--config", config.string(), "--connect"});
  BOOST_TEST(rc == 0, out);
  BOOST_TEST(out.find("logged in to") != std::string::npos, out);
}
