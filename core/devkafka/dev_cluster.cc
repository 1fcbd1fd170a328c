#include "core/devkafka/dev_cluster.h"

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "core/common/asio.h"
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>

#include "core/common/log.h"
#include "core/kafka/client.h"
#include "core/kafka/consumer.h"

namespace idemsink::devkafka {
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
      {"Produce", 0},      {"Fetch", 1},       {"ListOffsets", 2},      {"Metadata", 3},
      {"OffsetCommit", 8}, {"OffsetFetch", 9}, {"FindCoordinator", 10}, {"JoinGroup", 11},
      {"Heartbeat", 12},   {"LeaveGroup", 13}, {"SyncGroup", 14},       {"InitProducerId", 22}};
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

// ---- transaction markers, written with a hand-made Produce request
//
// The mock cluster of librdkafka 2.0 writes no transaction markers, yet a
// real cluster's partitions are full of them (one per transaction), and a
// consumer never returns them: offsets with no record. This appends
// committed-transaction control records to a partition, so tests meet the
// holes a real cluster has.

uint32_t crc32c(const std::string& data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

template <class T>
void put_be(std::string& out, T v) {
  for (int i = sizeof(T) - 1; i >= 0; --i)
    out.push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xFF));
}

void put_varint(std::string& out, int64_t v) {
  uint64_t z = (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);  // zigzag
  while (z >= 0x80) {
    out.push_back(static_cast<char>((z & 0x7F) | 0x80));
    z >>= 7;
  }
  out.push_back(static_cast<char>(z));
}

// A v2 record batch of `count` COMMIT control records.
std::string control_batch(int count) {
  std::string records;
  for (int i = 0; i < count; ++i) {
    std::string rec;
    rec.push_back(0);    // attributes
    put_varint(rec, 0);  // timestamp delta
    put_varint(rec, i);  // offset delta
    std::string key;
    put_be<int16_t>(key, 0);  // control record version
    put_be<int16_t>(key, 1);  // type: COMMIT
    put_varint(rec, static_cast<int64_t>(key.size()));
    rec += key;
    std::string value;
    put_be<int16_t>(value, 0);  // version
    put_be<int32_t>(value, 0);  // coordinator epoch
    put_varint(rec, static_cast<int64_t>(value.size()));
    rec += value;
    put_varint(rec, 0);  // headers
    put_varint(records, static_cast<int64_t>(rec.size()));
    records += rec;
  }
  const int64_t now =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  std::string tail;             // attributes .. records: what the CRC covers
  put_be<int16_t>(tail, 0x30);  // transactional | control
  put_be<int32_t>(tail, count - 1);
  put_be<int64_t>(tail, now);
  put_be<int64_t>(tail, now);
  put_be<int64_t>(tail, 1);   // producer id
  put_be<int16_t>(tail, 0);   // producer epoch
  put_be<int32_t>(tail, -1);  // base sequence
  put_be<int32_t>(tail, count);
  tail += records;
  std::string batch;
  put_be<int64_t>(batch, 0);                                              // base offset
  put_be<int32_t>(batch, static_cast<int32_t>(4 + 1 + 4 + tail.size()));  // batch length
  put_be<int32_t>(batch, -1);                                             // partition leader epoch
  batch.push_back(2);                                                     // magic
  put_be<uint32_t>(batch, crc32c(tail));
  return batch + tail;
}

// Sends one Produce v3 request of the control batch to `broker`; returns its
// partition error code.
int16_t produce_control(const std::string& broker, const std::string& topic, int32_t partition, int count) {
  boost::asio::io_context io;
  tcp::socket sock(io);
  const auto colon = broker.rfind(':');
  sock.connect(tcp::endpoint(boost::asio::ip::make_address(broker.substr(0, colon)),
                             static_cast<unsigned short>(std::stoi(broker.substr(colon + 1)))));
  std::string body;
  put_be<int16_t>(body, 0);  // api key: Produce
  put_be<int16_t>(body, 3);  // api version
  put_be<int32_t>(body, 1);  // correlation id
  put_be<int16_t>(body, 9);
  body += "dev-kafka";        // client id
  put_be<int16_t>(body, -1);  // transactional id: null
  put_be<int16_t>(body, -1);  // acks: all
  put_be<int32_t>(body, 10000);
  put_be<int32_t>(body, 1);  // topics
  put_be<int16_t>(body, static_cast<int16_t>(topic.size()));
  body += topic;
  put_be<int32_t>(body, 1);  // partitions
  put_be<int32_t>(body, partition);
  const std::string batch = control_batch(count);
  put_be<int32_t>(body, static_cast<int32_t>(batch.size()));
  body += batch;
  std::string req;
  put_be<int32_t>(req, static_cast<int32_t>(body.size()));
  boost::asio::write(sock, boost::asio::buffer(req + body));
  unsigned char size_buf[4];
  boost::asio::read(sock, boost::asio::buffer(size_buf));
  const uint32_t size = (uint32_t{size_buf[0]} << 24) | (uint32_t{size_buf[1]} << 16) | (uint32_t{size_buf[2]} << 8) |
                        uint32_t{size_buf[3]};
  std::string resp(size, '\0');
  boost::asio::read(sock, boost::asio::buffer(resp));
  // correlation id, #topics, topic name, #partitions, partition, error code
  const size_t at = 4 + 4 + 2 + topic.size() + 4 + 4;
  if (resp.size() < at + 2) throw std::runtime_error("short Produce response");
  return static_cast<int16_t>((static_cast<unsigned char>(resp[at]) << 8) | static_cast<unsigned char>(resp[at + 1]));
}

// The control port's commands: each reads its arguments from the rest of the
// line and answers "ok" or "error <what>".
std::string answer(rd_kafka_resp_err_t err) { return err ? std::string("error ") + rd_kafka_err2name(err) : "ok"; }

std::string create_topic(rd_kafka_mock_cluster_t* mc, std::istream& in) {
  std::string name;
  int parts = 0;
  if (!(in >> name >> parts) || parts < 1) return "error usage: create_topic NAME PARTITIONS";
  return answer(rd_kafka_mock_topic_create(mc, name.c_str(), parts, 1));
}

std::string broker_down(rd_kafka_mock_cluster_t* mc, std::istream& in) {
  int id = 0;
  if (!(in >> id)) return "error usage: broker_down ID";
  return answer(rd_kafka_mock_broker_set_down(mc, id));
}

std::string broker_up(rd_kafka_mock_cluster_t* mc, std::istream& in) {
  int id = 0;
  if (!(in >> id)) return "error usage: broker_up ID";
  return answer(rd_kafka_mock_broker_set_up(mc, id));
}

std::string partition_leader(rd_kafka_mock_cluster_t* mc, std::istream& in) {
  std::string name;
  int partition = 0, broker = 0;
  if (!(in >> name >> partition >> broker)) return "error usage: partition_leader TOPIC PARTITION BROKER (-1: none)";
  return answer(rd_kafka_mock_partition_set_leader(mc, name.c_str(), partition, broker));
}

std::string rtt(rd_kafka_mock_cluster_t* mc, std::istream& in) {
  int id = 0, ms = 0;
  if (!(in >> id >> ms)) return "error usage: rtt ID MS";
  return answer(rd_kafka_mock_broker_set_rtt(mc, id, ms));
}

std::string push_errors(rd_kafka_mock_cluster_t* mc, std::istream& in) {
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

std::string clear_errors(rd_kafka_mock_cluster_t* mc, std::istream& in) {
  std::string key_s;
  int16_t key = 0;
  if (!(in >> key_s) || !parse_api_key(key_s, key)) return "error usage: clear_errors APIKEY";
  rd_kafka_mock_clear_request_errors(mc, key);
  return "ok";
}

std::string topic_error(rd_kafka_mock_cluster_t* mc, std::istream& in) {
  std::string name, e;
  rd_kafka_resp_err_t err;
  if (!(in >> name >> e) || !parse_error(e, err)) return "error usage: topic_error NAME ERR";
  rd_kafka_mock_topic_set_error(mc, name.c_str(), err);
  return "ok";
}

std::string control_records(rd_kafka_mock_cluster_t* mc, std::istream& in) {
  std::string name;
  int partition = 0, count = 0;
  if (!(in >> name >> partition >> count) || count < 1) return "error usage: control_records TOPIC PARTITION COUNT";
  // Only the partition's leader takes it: try each broker.
  std::istringstream brokers(rd_kafka_mock_cluster_bootstraps(mc));
  std::string broker, last = "no broker";
  while (std::getline(brokers, broker, ',')) {
    try {
      const int16_t code = produce_control(broker, name, partition, count);
      if (code == 0) return "ok";
      last = rd_kafka_err2name(static_cast<rd_kafka_resp_err_t>(code));
    } catch (const std::exception& e) {
      last = e.what();
    }
  }
  return "error " + last;
}

using Command = std::string (*)(rd_kafka_mock_cluster_t*, std::istream&);
const std::map<std::string, Command, std::less<>> kCommands = {{"create_topic", create_topic},
                                                               {"broker_down", broker_down},
                                                               {"broker_up", broker_up},
                                                               {"partition_leader", partition_leader},
                                                               {"rtt", rtt},
                                                               {"push_errors", push_errors},
                                                               {"clear_errors", clear_errors},
                                                               {"topic_error", topic_error},
                                                               {"control_records", control_records}};

std::string execute(rd_kafka_mock_cluster_t* mc, const std::string& line, bool& shutdown) {
  std::istringstream in(line);
  std::string cmd;
  in >> cmd;
  if (cmd == "ping") return "ok";
  if (cmd == "shutdown") {
    shutdown = true;
    return "ok";
  }
  const auto it = kCommands.find(cmd);
  if (it == kCommands.end()) return "error unknown command " + cmd;
  return it->second(mc, in);
}

// Runs `io`: answers the control clients' commands until a shutdown (the
// command, or a signal) stops it.
void serve_control(boost::asio::io_context& io, tcp::acceptor& acceptor, rd_kafka_mock_cluster_t* mc, bool& shutdown) {
  // Every connected control client is served, side by side on this one
  // thread: a command is quick, so none waits long behind another's.
  std::function<void()> accept_next = [&] {
    auto sock = std::make_shared<tcp::socket>(io);
    acceptor.async_accept(*sock, [&, sock](boost::system::error_code ec) {
      if (ec) return;
      auto buf = std::make_shared<boost::asio::streambuf>();
      auto read_line = std::make_shared<std::function<void()>>();
      *read_line = [&, sock, buf, read_line] {
        boost::asio::async_read_until(*sock, *buf, '\n',
                                      [&, sock, buf, read_line](boost::system::error_code rec, size_t) {
                                        if (rec) return;
                                        std::istream is(buf.get());
                                        std::string line;
                                        std::getline(is, line);
                                        if (!line.empty() && line.back() == '\r') line.pop_back();
                                        auto reply = std::make_shared<std::string>(execute(mc, line, shutdown) + "\n");
                                        boost::asio::async_write(*sock, boost::asio::buffer(*reply),
                                                                 [&, sock, reply, read_line](auto wec, size_t) {
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
}

}  // namespace

int run_dev_cluster(const DevClusterOptions& opt) {
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  kafka::route_librdkafka_logs(conf);
  char err[512];
  kafka::HandlePtr rk(rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err));
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
  tcp::acceptor acceptor(
      io, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(opt.control_port)));
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

  serve_control(io, acceptor, mc, shutdown);
  rd_kafka_mock_cluster_destroy(mc);
  return 0;
}

}  // namespace idemsink::devkafka
