// The relay: publishes unpublished outbox rows (dead letters to DLQ topics,
// forwards to retry topics) and stamps them published.
//
// One cycle at a time per host, so one host never publishes a row twice: take
// up to 500 rows (ours, released, or past another host's lease), produce
// them, wait for every delivery report, stamp the delivered ones. A cycle
// whose deliveries failed backs off (capped exponential); its rows stay in
// the outbox. The producer is idempotent with no delivery deadline: while
// Kafka refuses writes the cycle waits, its rows' lease renewed.
//
// Threading: runs on the engine's io_context; delivery reports arrive on the
// producer's thread and are posted to it.
#pragma once

#include <utility>  // before Boost.Asio 1.74: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/db/pool.h"
#include "core/dlq/outbox.h"
#include "core/kafka/producer.h"

namespace idemsink::dlq {

class Relay {
 public:
  using ProducerFactory = std::function<std::unique_ptr<kafka::Producer>()>;
  /// Rows published and publish attempts failed, per route and cycle.
  using CountFn = std::function<void(const std::string& route, size_t published, size_t failed)>;

  /// Rows Kafka refused for good (set aside), per cycle.
  using UnpublishableFn = std::function<void(size_t refused)>;

  Relay(boost::asio::io_context& io, db::Pool& pool, const Outbox& outbox, CountFn count,
        UnpublishableFn unpublishable);

  /// How to make the producer; called now and again after a fatal producer
  /// error (an idempotent producer cannot continue after one).
  void set_producer_factory(ProducerFactory f);
  /// Delivery report of the producer (producer thread).
  void on_delivery(uint64_t outbox_id, rd_kafka_resp_err_t err);

  /// Starts a cycle now, or right after the running one.
  void kick();
  bool running() const { return running_; }
  /// A cycle is waiting for the broker: its rows' lease must be renewed.
  bool waiting_for_broker() const { return running_ && pending_ > 0; }

 private:
  enum class Delivery { Pending, Ok, Failed, Refused };
  static constexpr size_t kBatch = 500;
  static constexpr uint64_t kByteBudget = 32 << 20;  // keys and values held by one cycle
  static constexpr int kTopicCheckMs = 5000;

  /// Errors no retry can fix: the row is set aside.
  static bool refused_for_good(rd_kafka_resp_err_t err);
  void on_taken(std::vector<Letter> letters, size_t taken);
  void on_delivered(uint64_t outbox_id, rd_kafka_resp_err_t err);
  /// Stamps the published rows and sets the refused ones aside; starts the
  /// next cycle if more rows wait or a kick came meanwhile.
  void finish_cycle(std::vector<uint64_t> published, std::map<uint64_t, std::string> refused, bool more_waiting);
  kafka::OutRecord record_of(const Letter& d) const;

  boost::asio::io_context& io_;
  db::Pool& pool_;
  const Outbox& outbox_;
  CountFn count_;
  UnpublishableFn unpublishable_count_;
  ProducerFactory producer_factory_;
  std::shared_ptr<kafka::Producer> producer_;  // shared with the take job, which asks it about topics

  bool running_ = false;
  bool again_ = false;
  std::map<uint64_t, Delivery> outstanding_;  // outbox id -> delivery state, this cycle
  std::map<uint64_t, std::string> route_of_;  // outbox id -> route, this cycle
  size_t pending_ = 0;
  size_t taken_ = 0;
  std::string first_error_;
  std::map<uint64_t, std::string> refused_;  // outbox id -> why Kafka will never take it
  int failures_in_a_row_ = 0;
  std::chrono::steady_clock::time_point not_before_{};
};

}  // namespace idemsink::dlq
