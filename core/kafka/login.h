// What a refused login to the cluster means, said so that a person can act
// on it: the errors librdkafka reports sorted into the cluster refusing this
// client (credentials, token, certificate; the broker's certificate not
// trusted) and the rest, each refusal with what is known of its cause.
#pragma once

#include <librdkafka/rdkafka.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "core/config/config.h"

namespace idemsink::kafka {

/// The security settings of a client, from its librdkafka properties.
struct LoginSettings {
  std::string protocol;   // security.protocol, lower case ("plaintext" when unset)
  std::string mechanism;  // sasl.mechanisms, upper case ("" without SASL)
  std::string ca;         // ssl.ca.location ("" : the system's CAs)
  static LoginSettings of(const std::map<std::string, std::string>& properties);
};

/// When error `err` (`reason`, as librdkafka said it) means the cluster
/// refused this client's login or TLS handshake: what to show, the cause
/// named where it can be. Otherwise nothing (an outage, a transport error).
std::optional<std::string> login_refusal(rd_kafka_resp_err_t err, std::string_view reason, const LoginSettings& s);

/// What the host says at start of these settings with the librdkafka it
/// runs (SCRAM before 2.6.1 cannot log in to Kafka 4), or nothing.
std::optional<std::string> login_caveat(const LoginSettings& s);

/// `check-config --connect`: logs in to the cluster as the host's consumer
/// would (its properties, [kafka.oauth]) and asks for its metadata, within
/// `timeout`. `ok` with the brokers seen, or why not (a refused login named
/// as login_refusal names it).
struct ConnectCheck {
  bool ok = false;
  std::string message;
};
ConnectCheck check_connection(const config::KafkaConfig& cfg, std::chrono::milliseconds timeout);

}  // namespace idemsink::kafka
