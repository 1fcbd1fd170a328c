#include "devkit/services.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>  // before Boost.Asio 1.74: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <algorithm>

namespace idemsink::devkit {

namespace beast = boost::beast;
namespace http = beast::http;

DevKafka::DevKafka(const std::string& idemsink_binary, std::vector<std::string> extra_args) : dir_("kafka") {
  std::vector<std::string> argv{idemsink_binary, "dev-kafka"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  proc_ = std::make_unique<Process>(argv, dir_ / "out", dir_ / "err");
  wait_until([&] { return read_file(dir_ / "out").find('\n') != std::string::npos || !proc_->running(); },
             std::chrono::seconds(30), "dev-kafka to print its address");
  const std::string line = read_file(dir_ / "out");
  const auto b = line.find("bootstrap="), c = line.find(" control=127.0.0.1:");
  if (b == std::string::npos || c == std::string::npos)
    throw std::runtime_error("dev-kafka did not start: " + line + read_file(dir_ / "err"));
  bootstrap_ = line.substr(b + 10, c - b - 10);
  const int control_port = std::stoi(line.substr(c + 19));
  control_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(control_port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (::connect(control_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    throw std::runtime_error("cannot connect to dev-kafka's control port");
}

DevKafka::~DevKafka() {
  if (control_fd_ >= 0) ::close(control_fd_);
}

void DevKafka::command(const std::string& line) {
  const std::string out = line + "\n";
  if (::write(control_fd_, out.data(), out.size()) != static_cast<ssize_t>(out.size()))
    throw std::runtime_error("dev-kafka control write failed");
  std::string reply;
  char ch;
  while (::read(control_fd_, &ch, 1) == 1 && ch != '\n') reply.push_back(ch);
  if (reply != "ok") throw std::runtime_error("dev-kafka: '" + line + "' -> " + reply);
}

FakeServices::FakeServices(const std::string& binary, std::vector<std::string> flags) : dir_("fake-services") {
  std::vector<std::string> argv{binary, "--listen", "127.0.0.1:0"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  proc_ = std::make_unique<Process>(argv, dir_ / "out", dir_ / "err");
  wait_until([&] { return read_file(dir_ / "out").find('\n') != std::string::npos || !proc_->running(); },
             std::chrono::seconds(10), "fake services to listen");
  const std::string line = read_file(dir_ / "out");
  const auto colon = line.rfind(':');
  if (line.rfind("listening on ", 0) != 0 || colon == std::string::npos)
    throw std::runtime_error("fake services did not start: " + line + read_file(dir_ / "err"));
  port_ = std::stoi(line.substr(line.find(':') + 1));
  if (std::find(flags.begin(), flags.end(), "--tls-cert") != flags.end()) {
    wait_until([&] { return read_file(dir_ / "out").find("tls listening on ") != std::string::npos; },
               std::chrono::seconds(10), "fake services to listen for HTTPS");
    const std::string out = read_file(dir_ / "out");
    const std::string tls_line = out.substr(out.find("tls listening on "));
    tls_port_ = std::stoi(tls_line.substr(tls_line.find(':') + 1));
  }
}

void FakeServices::reset() { http_request(port_, "POST", "/admin/reset"); }

nlohmann::json FakeServices::stats() {
  return nlohmann::json::parse(http_request(port_, "GET", "/stats?detail=1").second);
}

std::set<std::string> FakeServices::applied(const std::string& service) {
  std::set<std::string> out;
  const nlohmann::json all = stats();  // the range below must not outlive it
  for (const auto& [order, n] : all[service]["per_order"].items())
    if (n.get<int>() > 0) out.insert(order);
  return out;
}

std::pair<int, std::string> http_request(int port, const std::string& method, const std::string& target,
                                         const std::string& body,
                                         const std::vector<std::pair<std::string, std::string>>& headers) {
  boost::asio::io_context io;
  beast::tcp_stream stream(io);
  stream.expires_after(std::chrono::seconds(30));
  stream.connect(
      boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
  http::request<http::string_body> req(http::string_to_verb(method), target, 11);
  req.set(http::field::host, "127.0.0.1");
  for (const auto& [name, value] : headers) req.set(name, value);
  req.body() = body;
  req.prepare_payload();
  http::write(stream, req);
  beast::flat_buffer buf;
  http::response<http::string_body> res;
  http::read(stream, buf, res);
  return {res.result_int(), res.body()};
}

}  // namespace idemsink::devkit
