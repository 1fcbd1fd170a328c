// The DLQ producer: idempotent (enable.idempotence=true, acks=all), so
// librdkafka's internal retries never write a record twice, and without a
// delivery deadline (message.timeout.ms=0 unless configured), so a record is
// never reported failed after the broker may have appended it. Delivery
// reports arrive on the producer's own poll thread.
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/config/config.h"
#include "core/kafka/client.h"
#include "core/kafka/login.h"

namespace idemsink::kafka {

struct OutHeader {
  std::string name;
  std::optional<std::string> value;
};

struct OutRecord {
  std::string topic;
  std::optional<std::string> key;
  std::optional<std::string> value;
  std::vector<OutHeader> headers;
  int64_t timestamp_ms = 0;
  uint64_t id = 0;  // handed back in the delivery report
};

/// Why a topic can take no record.
struct TopicRefusal {
  std::string why;
  /// The cluster does not know the topic (it may yet appear: a topic created
  /// moments ago has not reached every broker); otherwise it never will
  /// (not authorised, an invalid name).
  bool unknown_topic = false;
};

class Producer {
 public:
  using DeliveryFn = std::function<void(uint64_t id, rd_kafka_resp_err_t err)>;

  Producer(const config::KafkaConfig& cfg, DeliveryFn on_delivery);
  ~Producer();
  Producer(const Producer&) = delete;
  Producer& operator=(const Producer&) = delete;

  /// Enqueues one record; a local failure (queue full, unknown topic) is
  /// reported through the delivery callback like a remote one.
  void produce(const OutRecord& rec);
  /// Waits for outstanding deliveries up to `timeout_ms`.
  void flush(int timeout_ms);
  /// Why `topic` can never take a record (it does not exist, is not
  /// authorised, its name is invalid), asked of the cluster; nullopt when it
  /// can, or when the answer is only temporary. Blocks up to `timeout_ms`;
  /// thread-safe. A record sent to such a topic would wait forever, since
  /// records have no delivery deadline.
  std::optional<TopicRefusal> topic_refused(const std::string& topic, int timeout_ms);
  /// True once librdkafka raised a fatal (idempotence) error: the instance
  /// must be replaced.
  bool fatal() const { return fatal_.load(); }

 private:
  static void dr_cb(rd_kafka_t*, const rd_kafka_message_t* msg, void* opaque);
  static void error_cb(rd_kafka_t* rk, int err, const char* reason, void* opaque);

  DeliveryFn on_delivery_;
  LoginSettings login_;  // what a refused login means (login.h)
  HandlePtr rk_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> fatal_{false};
  std::thread poller_;
};

}  // namespace idemsink::kafka
