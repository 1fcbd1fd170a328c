// The relay: publishes unpublished outbox rows (dead letters to DLQ topics,
// forwards to retry topics, replays to source topics) and stamps them
// published.
//
// Rows flow one by one, not in cycles: a take job leases up to 500 rows
// (ours, released, or past another host's lease) that are not in flight
// already, they are produced, and each delivery report stamps its row (in
// batches). So a (topic, partition) that cannot take a record (no leader, a
// broker down) holds back only its own records: the others are delivered
// and stamped, and new rows are taken while they wait, up to kMaxInFlight
// rows or kByteBudget bytes in flight. A row waiting longer than kStuckAfter
// leaves that count; kMaxStuckPerTopic such rows stop the taking of their
// topic's rows only (no delivery deadline: they may wait for good), and
// kHardCap bounds them all. The producer is idempotent with no
// delivery deadline (a finite one could expire on a record the broker did
// append, and the relay would publish it again); only the rows in flight have
// their lease renewed, so a row this host wrote but cannot send is taken by
// another host once its lease runs out.
//
// Topics that cannot take records: an unknown topic is believed unknown only
// after kafka.producer `topic.metadata.propagation.max.ms` (30 s by default)
// of saying so (a topic created moments ago has not reached every broker
// yet); meanwhile its rows wait. Then a dead letter is set aside as
// unpublishable for an operator (`idemsink outbox`), while a forward or a replay
// carries a record that is not finished: it is never set aside for a missing
// topic but waits, logged as an error every minute, and goes as soon as the
// topic exists. Refusals no retry can fix (too large, not authorised) set any
// row aside, loudly.
//
// Threading: runs on the engine's io_context; delivery reports arrive on the
// producer's thread and are posted to it.
#pragma once

#include "core/common/asio.h"
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/db/pool.h"
#include "core/dlq/outbox.h"
#include "core/kafka/producer.h"

namespace idemsink::dlq {

class Relay {
 public:
  using ProducerFactory = std::function<std::unique_ptr<kafka::Producer>()>;
  /// What the relay counts, on its io_context's thread.
  class Listener {
   public:
    /// Rows of `route` published, and publish attempts that failed.
    virtual void published(const std::string& route, size_t published, size_t failed) = 0;
    /// Rows Kafka refused for good, set aside as unpublishable.
    virtual void set_aside(size_t refused) = 0;

   protected:
    virtual ~Listener() = default;
  };

  Relay(boost::asio::io_context& io, db::Pool& pool, const Outbox& outbox, Listener& listener,
        std::chrono::milliseconds unknown_topic_patience);

  /// How to make the producer; called now and again after a fatal producer
  /// error (an idempotent producer cannot continue after one).
  void set_producer_factory(ProducerFactory f);
  /// Delivery report of the producer (producer thread).
  void on_delivery(uint64_t outbox_id, rd_kafka_resp_err_t err);

  /// Takes more rows now, or right after the running take.
  void kick();
  /// Nothing taken, in flight or waiting to be stamped.
  bool idle() const;
  /// The rows in flight: their lease must be renewed.
  std::vector<uint64_t> in_flight_ids() const;

 private:
  static constexpr size_t kBatch = 500;
  static constexpr size_t kMaxInFlight = 5000;       // rows in flight, not yet stuck
  static constexpr uint64_t kByteBudget = 32 << 20;  // their keys and values
  static constexpr auto kStuckAfter = std::chrono::seconds(10);
  static constexpr size_t kMaxStuckPerTopic = 1000;
  static constexpr size_t kHardCap = 20000;  // rows in flight, stuck or not
  static constexpr int kTopicCheckMs = 5000;

  struct InFlight {
    std::string route;
    Purpose purpose;
    std::string topic;
    uint64_t bytes;
    std::chrono::steady_clock::time_point since;
  };
  // A topic the cluster says it does not know.
  struct MissingTopic {
    std::chrono::steady_clock::time_point since;
    std::chrono::steady_clock::time_point next_check;
    std::chrono::steady_clock::time_point next_log{};
    std::string why;
  };
  /// What the take job learnt.
  struct Taken {
    std::vector<Letter> letters;
    std::map<std::string, kafka::TopicRefusal> refusals;  // topics the cluster refuses, and why
    std::set<std::string> known_topics;                   // asked and found
    size_t rows = 0;                                      // rows the query returned
    size_t limit = 0;                                     // rows it asked for
  };

  /// Errors no retry can fix.
  static bool refused_for_good(rd_kafka_resp_err_t err);
  void on_taken(Taken taken);
  void on_delivered(uint64_t outbox_id, rd_kafka_resp_err_t err);
  /// The cluster does not know `topic` (said `why`): its rows wait, or are
  /// set aside once the patience ran out (dead letters only).
  void note_missing(const std::string& topic, const std::string& why);
  bool patience_over(const std::string& topic) const;
  /// Writes the stamps and set-asides gathered so far.
  void stamp();
  kafka::OutRecord record_of(const Letter& d) const;

  boost::asio::io_context& io_;
  db::Pool& pool_;
  const Outbox& outbox_;
  Listener& listener_;
  const std::chrono::milliseconds unknown_topic_patience_;
  ProducerFactory producer_factory_;
  std::shared_ptr<kafka::Producer> producer_;  // shared with the take job, which asks it about topics

  bool taking_ = false;
  bool again_ = false;
  bool capped_ = false;  // the last kick found the in-flight limits reached
  std::map<uint64_t, InFlight> in_flight_;
  std::map<std::string, MissingTopic> missing_topics_;
  std::vector<uint64_t> to_stamp_;
  std::map<uint64_t, std::string> to_set_aside_;  // outbox id -> why Kafka will never take it
  std::vector<uint64_t> settling_;                // handed to the running stamp job
  bool stamping_ = false;
  int failures_in_a_row_ = 0;
  std::chrono::steady_clock::time_point not_before_{};
};

}  // namespace idemsink::dlq
