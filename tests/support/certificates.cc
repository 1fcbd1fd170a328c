#include "tests/support/certificates.h"

#include <stdexcept>
#include <vector>

namespace idemsink::test {
namespace {

void openssl(const devkit::ScratchDir& dir, std::vector<std::string> args) {
  args.insert(args.begin(), "/usr/bin/openssl");
  devkit::Process p(args, dir / "openssl.out", dir / "openssl.err");
  auto rc = p.wait(std::chrono::seconds(60));
  if (!rc || *rc != 0) throw std::runtime_error("openssl failed: " + p.err());
}

}  // namespace

TestCertificates::TestCertificates() {
  for (const std::string ca : {"ca", "other-ca"})
    openssl(dir, {"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", path(ca + ".key"), "-out",
                  path(ca + ".pem"), "-days", "2", "-subj", "/CN=idemsink test " + ca});
  openssl(dir, {"req", "-newkey", "rsa:2048", "-nodes", "-keyout", path("server.key"), "-out", path("server.csr"),
                "-subj", "/CN=127.0.0.1"});
  devkit::write_file(dir / "san.cnf", "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
  openssl(dir, {"x509", "-req", "-in", path("server.csr"), "-CA", path("ca.pem"), "-CAkey", path("ca.key"),
                "-CAcreateserial", "-out", path("server.pem"), "-days", "2", "-extfile", path("san.cnf")});
  devkit::write_file(dir / "client.cnf", "extendedKeyUsage=clientAuth\n");
  for (const auto& [name, ca] : {std::pair<std::string, std::string>{"client", "ca"}, {"rogue", "other-ca"}}) {
    openssl(dir, {"req", "-newkey", "rsa:2048", "-nodes", "-keyout", path(name + ".key"), "-out", path(name + ".csr"),
                  "-subj", "/CN=idemsink " + name});
    openssl(dir, {"x509", "-req", "-in", path(name + ".csr"), "-CA", path(ca + ".pem"), "-CAkey", path(ca + ".key"),
                  "-CAcreateserial", "-out", path(name + ".pem"), "-days", "2", "-extfile", path("client.cnf")});
  }
  devkit::write_file(dir / "broker-keystore.pem", devkit::read_file(dir / "server.key") +
                                                      devkit::read_file(dir / "server.pem") +
                                                      devkit::read_file(dir / "ca.pem"));
}

}  // namespace idemsink::test
