// A throwaway PKI for TLS tests, made by openssl: a CA, a server certificate
// it signed for 127.0.0.1 (and localhost), and a second, unrelated CA.
#pragma once

#include <string>

#include "devkit/process.h"

namespace idemsink::test {

struct TestCertificates {
  TestCertificates();
  /// ca.pem, ca.key, server.pem, server.key, other-ca.pem
  std::string path(const std::string& name) const { return (dir / name).string(); }
  devkit::ScratchDir dir{"certs"};
};

}  // namespace idemsink::test
