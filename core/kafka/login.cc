#include "core/kafka/login.h"

#include <cctype>
#include <mutex>
#include <thread>

#include "core/kafka/client.h"
#include "core/kafka/oauth.h"

namespace idemsink::kafka {
namespace {

// librdkafka sends SCRAM's client nonce twice in its final message before
// 2.6.1 (its #4895); Kafka 4.0 checks the nonce strictly (CVE-2024-56128)
// and refuses the login as if the password were wrong. Kafka 3.9 accepts it.
constexpr int kScramNonceFixed = 0x020601ff;

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string scram_cause() {
  return std::string("if the broker is Kafka 4.0 or later, this happens with the right password too: librdkafka ") +
         rd_kafka_version_str() +
         " (before 2.6.1) sends SCRAM's client nonce twice (confluentinc/librdkafka#4895), which Kafka 4 refuses "
         "(CVE-2024-56128); Kafka 3.9 and earlier accept it. Ways out: SASL PLAIN or OAUTHBEARER over TLS "
         "(\"security.protocol\" = \"SASL_SSL\"), mutual TLS, or librdkafka 2.6.1 or later";
}

}  // namespace

LoginSettings LoginSettings::of(const std::map<std::string, std::string>& properties) {
  const auto get = [&](const char* name) {
    auto it = properties.find(name);
    return it == properties.end() ? std::string() : it->second;
  };
  LoginSettings s;
  s.protocol = lower(get("security.protocol"));
  if (s.protocol.empty()) s.protocol = "plaintext";
  s.mechanism = get("sasl.mechanisms").empty() ? get("sasl.mechanism") : get("sasl.mechanisms");
  for (auto& c : s.mechanism) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (s.protocol.rfind("sasl", 0) != 0) s.mechanism.clear();
  s.ca = get("ssl.ca.location");
  return s;
}

std::optional<std::string> login_refusal(rd_kafka_resp_err_t err, std::string_view reason, const LoginSettings& s) {
  std::string what(reason);
  switch (err) {
    case RD_KAFKA_RESP_ERR__AUTHENTICATION:
    case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
      if (s.mechanism.rfind("SCRAM", 0) == 0 && rd_kafka_version() < kScramNonceFixed) what += " -- " + scram_cause();
      return what;
    case RD_KAFKA_RESP_ERR__SSL:
      if (what.find("certificate verify failed") != std::string::npos)
        what += " -- the broker's certificate does not chain to " +
                (s.ca.empty() ? std::string("the system's CAs") : "ssl.ca.location (" + s.ca + ")");
      return what;
    case RD_KAFKA_RESP_ERR__TRANSPORT:
      // A TLS alert from the broker after the handshake (TLS 1.3): it
      // refused the client's certificate, or wanted one.
      if (what.find("alert") != std::string::npos && what.find("SSL") != std::string::npos)
        return what + " -- the broker refused this client's certificate (ssl.certificate.location), or wants one";
      return std::nullopt;
    default: return std::nullopt;
  }
}

std::optional<std::string> login_caveat(const LoginSettings& s) {
  if (s.mechanism.rfind("SCRAM", 0) != 0 || rd_kafka_version() >= kScramNonceFixed) return std::nullopt;
  return s.mechanism + " with librdkafka " + rd_kafka_version_str() +
         " logs in to Kafka 3.9 and earlier only: Kafka 4.0 and later refuse it even with the right password "
         "(librdkafka before 2.6.1 sends SCRAM's client nonce twice, confluentinc/librdkafka#4895; Kafka 4 checks "
         "it, CVE-2024-56128). With Kafka 4 use SASL PLAIN or OAUTHBEARER over TLS, mutual TLS, or librdkafka 2.6.1 "
         "or later";
}

namespace {

// What the error callback reported last, for check_connection.
struct Errors {
  LoginSettings login;
  std::mutex mu;
  std::string last;
  bool refused = false;
};

void note_error(rd_kafka_t*, int err, const char* reason, void* opaque) {
  auto* e = static_cast<Errors*>(opaque);
  const auto code = static_cast<rd_kafka_resp_err_t>(err);
  const auto refusal = login_refusal(code, reason, e->login);
  std::lock_guard lk(e->mu);
  if (e->refused && !refusal) return;  // "all brokers down" after a refused login: the login is the cause
  e->refused = refusal.has_value();
  e->last = std::string(rd_kafka_err2name(code)) + ": " + (refusal ? *refusal : std::string(reason));
}

}  // namespace

ConnectCheck check_connection(const config::KafkaConfig& cfg, std::chrono::milliseconds timeout) {
  std::map<std::string, std::string> props;
  for (const auto& [k, v] : cfg.properties) props[k] = v;
  for (const auto& [k, v] : cfg.consumer_properties) props[k] = v;
  props["bootstrap.servers"] = cfg.bootstrap_servers;
  props["log_level"] = "0";  // the errors come through note_error
  Errors errors;
  errors.login = LoginSettings::of(props);
  rd_kafka_conf_t* conf = make_conf(props);
  rd_kafka_conf_set_error_cb(conf, &note_error);
  rd_kafka_conf_set_opaque(conf, &errors);
  oauth::prepare(conf, cfg);
  char err[512];
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (rk == nullptr) {
    rd_kafka_conf_destroy(conf);
    return {false, std::string("cannot create a Kafka client: ") + err};
  }
  HandlePtr handle(rk);
  oauth::attach(rk, cfg);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    rd_kafka_poll(rk, 0);  // serves the error callback
    const rd_kafka_metadata_t* md = nullptr;
    if (rd_kafka_metadata(rk, 0, nullptr, &md, 1000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
      const int brokers = md->broker_cnt;
      rd_kafka_metadata_destroy(md);
      return {true, "logged in to " + cfg.bootstrap_servers + " (" + errors.login.protocol +
                        (errors.login.mechanism.empty() ? "" : " " + errors.login.mechanism) +
                        "): " + std::to_string(brokers) + " broker(s)"};
    }
    std::lock_guard lk(errors.mu);
    if (errors.refused) break;  // a refused login does not turn into a success by waiting
  }
  rd_kafka_poll(rk, 0);
  std::lock_guard lk(errors.mu);
  return {false, "cannot reach " + cfg.bootstrap_servers + " within " + std::to_string(timeout.count() / 1000) +
                     "s: " + (errors.last.empty() ? "no answer" : errors.last)};
}

}  // namespace idemsink::kafka
