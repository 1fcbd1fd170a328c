// A throwaway PKI for TLS tests, made by openssl: a CA, a server certificate
// it signed for 127.0.0.1 (and localhost), a client certificate it signed, a
// second, unrelated CA and a client certificate that one signed (a "rogue"
// a broker asking for client certificates refuses).
#pragma once

#include <string>

#include "devkit/process.h"

namespace idemsink::test {

struct TestCertificates {
  TestCertificates();
  /// ca.pem, ca.key, server.pem, server.key, other-ca.pem, client.pem,
  /// client.key, rogue.pem, rogue.key, and broker-keystore.pem (server.key,
  /// server.pem and ca.pem in one file, as Kafka's PEM keystore wants them)
  std::string path(const std::string& name) const { return (dir / name).string(); }
  devkit::ScratchDir dir{"certs"};
};

}  // namespace idemsink::test
