#include "core/kafka/dev_cluster.h"

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <utility>  // before Boost.Asio 1.74: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>

#include "core/common/log.h"
#include "core/kafka/client.h"
#include "core/kafka/consumer.h"

namespace idemsink::kafka {
namespace {

using boost::asio::ip::tcp;

bool parse_error(const std::string& s, rd_kafka_resp_err_t& out) {
  char* end = nullptr;
  long n = std::strtol(s.c_str(), &end, 10);
  if (end && *end == '\0' && !s.empty()) {
    out = static_cast<rd_kafka_resp_err_t>(n);
    return true;
  }
  const struct rd_kafka_err_desc* descs = nullptr;
  size_t cnt = 0;
  rd_kafka_get_err_descs(&descs, &cnt);
  for (size_t i = 0; i < cnt; ++i) {
    if (descs[i].name && s == descs[i].name) {
      out = descs[i].code;
      return true;
    }
  }
  return false;
}

bool parse_api_key(const std::string& s, int16_t& out) {
  static const std::map<std::string, int16_t> kNames{
      {"Produce", 0},     {"Fetch", 1},         {"ListOffsets", 2}, {"Metadata", 3},     {"OffsetCommit", 8},
      {"OffsetFetch", 9}, {"FindCoordinator", 10}, {"JoinGroup", 11}, {"Heartbeat", 12}, {"LeaveGroup", 13},
      {"SyncGroup", 14},  {"InitProducerId", 22}};
  auto it = kNames.find(s);
  if (it != kNames.end()) {
    out = it->second;
    return true;
  }
  char* end = nullptr;
  long n = std::strtol(s.c_str(), &end, 10);
  if (end && *end == '\0' && !s.empty() && n >= 0 && n < 100) {
    out = static_cast<int16_t>(n);
    return true;
  }
  return false;
}

std::string execute(rd_kafka_mock_cluster_t* mc, const std::string& line, bool& shutdown) {
  std::istringstream in(line);
  std::string cmd;
  in >> cmd;
  auto check = [](rd_kafka_resp_err_t err) {
    return err ? std::string("error ") + rd_kafka_err2name(err) : std::string("ok");
  };
  if (cmd == "ping") return "ok";
  if (cmd == "shutdown") {
    shutdown = true;
    return "ok";
  }
  if (cmd == "create_topic") {
    std::string name;
    int parts = 0;
    if (!(in >> name >> parts) || parts < 1) return "error usage: create_topic NAME PARTITIONS";
    return check(rd_kafka_mock_topic_create(mc, name.c_str(), parts, 1));
  }
  if (cmd == "broker_down" || cmd == "broker_up") {
    int id = 0;
    if (!(in >> id)) return "error usage: " + cmd + " ID";
    return check(cmd == "broker_down" ? rd_kafka_mock_broker_set_down(mc, id) : rd_kafka_mock_broker_set_up(mc, id));
  }
  if (cmd == "rtt") {
    int id = 0, ms = 0;
    if (!(in >> id >> ms)) return "error usage: rtt ID MS";
    return check(rd_kafka_mock_broker_set_rtt(mc, id, ms));
  }
  if (cmd == "push_errors") {
    std::string key_s, e;
    int16_t key = 0;
    if (!(in >> key_s) || !parse_api_key(key_s, key)) return "error usage: push_errors APIKEY ERR [ERR...]";
    std::vector<rd_kafka_resp_err_t> errs;
    while (in >> e) {
      rd_kafka_resp_err_t err;
      if (!parse_error(e, err)) return "error unknown error name " + e;
      errs.push_back(err);
    }
    if (errs.empty()) return "error usage: push_errors APIKEY ERR [ERR...]";
    rd_kafka_mock_push_request_errors_array(mc, key, errs.size(), errs.data());
    return "ok";
  }
  if (cmd == "clear_errors") {
    std::string key_s;
    int16_t key = 0;
    if (!(in >> key_s) || !parse_api_key(key_s, key)) return "error usage: clear_errors APIKEY";
    rd_kafka_mock_clear_request_errors(mc, key);
    return "ok";
  }
  if (cmd == "topic_error") {
    std::string name, e;
    rd_kafka_resp_err_t err;
    if (!(in >> name >> e) || !parse_error(e, err)) return "error usage: topic_error NAME ERR";
    rd_kafka_mock_topic_set_error(mc, name.c_str(), err);
    return "ok";
  }
  return "error unknown command " + cmd;
}

}  // namespace

int run_dev_cluster(const DevClusterOptions& opt) {
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  route_librdkafka_logs(conf);
  char err[512];
  HandlePtr rk(rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err));
  if (!rk) {
    spdlog::error("dev-kafka: cannot create handle: {}", err);
    return 1;
  }
  rd_kafka_mock_cluster_t* mc = rd_kafka_mock_cluster_new(rk.get(), opt.brokers);
  if (mc == nullptr) {
    spdlog::error("dev-kafka: cannot create the mock cluster");
    return 1;
  }
  for (const auto& [name, parts] : opt.topics) {
    if (auto e = rd_kafka_mock_topic_create(mc, name.c_str(), parts, 1)) {
      spdlog::error("dev-kafka: cannot create topic {}: {}", name, rd_kafka_err2str(e));
      return 1;
    }
  }

  boost::asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"),
                                           static_cast<unsigned short>(opt.control_port)));
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  bool shutdown = false;
  signals.async_wait([&](auto, int) {
    shutdown = true;
    io.stop();
  });

  std::printf("bootstrap=%s control=127.0.0.1:%u\n", rd_kafka_mock_cluster_bootstraps(mc),
              static_cast<unsigned>(acceptor.local_endpoint().port()));
  std::fflush(stdout);
  spdlog::info("dev-kafka: {} broker(s) at {}", opt.brokers, rd_kafka_mock_cluster_bootstraps(mc));

  // One control client at a time is plenty; commands are quick.
  std::function<void()> accept_next = [&] {
    auto sock = std::make_shared<tcp::socket>(io);
    acceptor.async_accept(*sock, [&, sock](boost::system::error_code ec) {
      if (ec) return;
      auto buf = std::make_shared<boost::asio::streambuf>();
      auto read_line = std::make_shared<std::function<void()>>();
      *read_line = [&, sock, buf, read_line] {
        boost::asio::async_read_until(*sock, *buf, '\n', [&, sock, buf, read_line](boost::system::error_code rec,
                                                                                    size_t) {
          if (rec) return;
          std::istream is(buf.get());
          std::string line;
          std::getline(is, line);
          if (!line.empty() && line.back() == '\r') line.pop_back();
          auto reply = std::make_shared<std::string>(execute(mc, line, shutdown) + "\n");
          boost::asio::async_write(*sock, boost::asio::buffer(*reply), [&, sock, reply, read_line](auto wec, size_t) {
            if (shutdown) io.stop();
            if (!wec) (*read_line)();
          });
        });
      };
      (*read_line)();
      accept_next();
    });
  };
  accept_next();
  io.run();
  rd_kafka_mock_cluster_destroy(mc);
  return 0;
}

}  // namespace idemsink::kafka
