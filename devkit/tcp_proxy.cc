#include "devkit/tcp_proxy.h"

#include <utility>  // before Boost.Asio 1.74: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
#include <array>
#include <atomic>
#include <list>
#include <thread>

namespace idemsink::devkit {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

// One client connection and its connection to the target, piped both ways.
struct Pipe : std::enable_shared_from_this<Pipe> {
  tcp::socket client, server;
  std::array<char, 16384> up{}, down{};
  explicit Pipe(tcp::socket c) : client(std::move(c)), server(client.get_executor()) {}
  void close() {
    boost::system::error_code ec;
    client.close(ec);
    server.close(ec);
  }
  void start(int port) {
    auto self = shared_from_this();
    server.async_connect({asio::ip::address_v4::loopback(), static_cast<unsigned short>(port)},
                         [self](boost::system::error_code ec) {
                           if (ec) return self->close();
                           self->pump(self->client, self->server, self->up);
                           self->pump(self->server, self->client, self->down);
                         });
  }
  void pump(tcp::socket& from, tcp::socket& to, std::array<char, 16384>& buf) {
    auto self = shared_from_this();
    from.async_read_some(asio::buffer(buf), [self, &from, &to, &buf](boost::system::error_code ec, size_t n) {
      if (ec) return self->close();
      asio::async_write(to, asio::buffer(buf.data(), n),
                        [self, &from, &to, &buf](boost::system::error_code ec, size_t) {
                          if (ec) return self->close();
                          self->pump(from, to, buf);
                        });
    });
  }
};

}  // namespace

struct TcpProxy::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io, {asio::ip::address_v4::loopback(), 0}};
  std::atomic<int> target;
  std::list<std::weak_ptr<Pipe>> pipes;  // io thread only
  std::thread thread;

  explicit Impl(int port) : target(port) {
    accept();
    thread = std::thread([this] { io.run(); });
  }
  void accept() {
    acceptor.async_accept([this](boost::system::error_code ec, tcp::socket s) {
      if (ec) return;
      auto pipe = std::make_shared<Pipe>(std::move(s));
      pipes.push_back(pipe);
      pipe->start(target.load());
      accept();
    });
  }
};

TcpProxy::TcpProxy(int target_port) : impl_(std::make_unique<Impl>(target_port)) {}

TcpProxy::~TcpProxy() {
  impl_->io.stop();
  impl_->thread.join();
}

int TcpProxy::port() const { return impl_->acceptor.local_endpoint().port(); }

void TcpProxy::retarget(int target_port) {
  impl_->target.store(target_port);
  asio::post(impl_->io, [impl = impl_.get()] {
    for (auto& w : impl->pipes)
      if (auto p = w.lock()) p->close();
    impl->pipes.clear();
  });
}

}  // namespace idemsink::devkit
