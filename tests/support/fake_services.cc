#include "tests/support/fake_services.h"

#include <utility>  // before Boost.Asio 1.74: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace idemsink::test {

namespace beast = boost::beast;
namespace http = beast::http;

std::string shipped_plugin(const std::string& name) {
  return std::string(IDEMSINK_PLUGIN_DIR) + "/libidemsink_" + name + ".so";
}

FakeServices::FakeServices(std::vector<std::string> flags) : dir_("fake-services") {
  std::vector<std::string> argv{IDEMSINK_FAKE_SERVICES, "--listen", "127.0.0.1:0"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  proc_ = std::make_unique<Process>(argv, dir_ / "out", dir_ / "err");
  wait_until([&] { return read_file(dir_ / "out").find('\n') != std::string::npos || !proc_->running(); },
             std::chrono::seconds(10), "fake services to listen");
  const std::string line = read_file(dir_ / "out");
  const auto colon = line.rfind(':');
  if (line.rfind("listening on ", 0) != 0 || colon == std::string::npos)
    throw std::runtime_error("fake services did not start: " + line + read_file(dir_ / "err"));
  port_ = std::stoi(line.substr(colon + 1));
}

std::pair<int, std::string> FakeServices::request(const std::string& method, const std::string& target,
                                                  const std::string& body) {
  boost::asio::io_context io;
  beast::tcp_stream stream(io);
  stream.connect(boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"),
                                                static_cast<unsigned short>(port_)));
  http::request<http::string_body> req(http::string_to_verb(method), target, 11);
  req.set(http::field::host, "127.0.0.1");
  req.body() = body;
  req.prepare_payload();
  http::write(stream, req);
  beast::flat_buffer buf;
  http::response<http::string_body> res;
  http::read(stream, buf, res);
  return {res.result_int(), res.body()};
}

nlohmann::json FakeServices::stats() { return nlohmann::json::parse(request("GET", "/stats?detail=1").second); }

}  // namespace idemsink::test
