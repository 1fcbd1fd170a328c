// A TCP forwarder on a loopback port, for failover tests: clients connect to
// it, it connects them to a target port, and retarget() sends new
// connections to another port and cuts the old ones, as a virtual IP or a
// proxy (MaxScale, HAProxy) does when a replica is promoted.
#pragma once

#include <memory>

namespace idemsink::devkit {

class TcpProxy {
 public:
  explicit TcpProxy(int target_port);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const;
  /// New connections go to `target_port`; the open ones are closed.
  void retarget(int target_port);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idemsink::devkit
