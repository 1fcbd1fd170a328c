// SASL/OAUTHBEARER with tokens the host fetches itself ([kafka.oauth]):
// OAuth 2.0 client credentials (RFC 6749 4.4) against a token endpoint.
// librdkafka 2.0.2 as Debian builds it has no OIDC of its own (no libcurl).
//
// librdkafka asks for a token when a client starts and again at 80% of the
// last one's life. It asks on its background thread (the client's SASL
// queue is forwarded there), so a slow endpoint never holds a poll thread.
// One token serves every client of the process while more than half of its
// life is left. An endpoint that fails is told to librdkafka
// (rd_kafka_oauthbearer_set_token_failure): its error callback reports it,
// /readyz with it, and it asks again 10 s later; the host neither exits nor
// spins. The client secret goes into the request's Authorization header
// and nowhere else.
#pragma once

#include <librdkafka/rdkafka.h>

#include <cstdint>
#include <string>

#include "core/config/config.h"

namespace idemsink::kafka::oauth {

/// A client's configuration readied for the host's tokens, when the config
/// has [kafka.oauth]; nothing otherwise. Call attach() on the client made.
void prepare(rd_kafka_conf_t* conf, const config::KafkaConfig& cfg);
/// Right after rd_kafka_new() of a configuration prepare() readied.
void attach(rd_kafka_t* rk, const config::KafkaConfig& cfg);

struct Token {
  std::string value;
  int64_t expires_ms = 0;  // Unix ms
  std::string principal;
};

/// One request to the token endpoint; throws std::runtime_error naming the
/// endpoint and what went wrong (never the secret).
Token fetch(const config::OAuthConfig& cfg);

}  // namespace idemsink::kafka::oauth
