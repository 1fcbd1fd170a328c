// The group consumer: one poll thread feeding batches to a listener.
//
// Offsets are never stored or committed by librdkafka on its own
// (enable.auto.commit=false, enable.auto.offset.store=false); the pipeline
// commits explicit offsets, per partition, only past durable outcomes.
// Rebalance callbacks run on the poll thread and may block there while the
// pipeline drains the revoked partitions (bounded by host.shutdown_grace,
// which must stay below max.poll.interval.ms).
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/config/config.h"
#include "core/kafka/client.h"

namespace idemsink::kafka {

class Consumer {
 public:
  class Listener {
   public:
    virtual ~Listener() = default;
    /// A polled batch (poll thread). Must not block for long.
    virtual void on_messages(std::vector<MessagePtr> batch) = 0;
    /// Partitions newly assigned (poll thread, inside the rebalance).
    virtual void on_assigned(const std::vector<TopicPartition>& tps) = 0;
    /// Partitions being taken away (poll thread, inside the rebalance): block
    /// until their in-flight work is drained or the grace period passed, and
    /// return the offsets to commit before they go. `lost` means the group
    /// already gave them to someone else: nothing may be committed.
    virtual std::vector<TopicPartitionOffset> on_revoking(const std::vector<TopicPartition>& tps, bool lost) = 0;
    /// Result of a commit (librdkafka thread).
    virtual void on_commit_result(rd_kafka_resp_err_t err, const std::vector<TopicPartitionOffset>& offsets) = 0;
  };

  Consumer(const config::KafkaConfig& cfg, std::vector<std::string> topics, Listener& listener);
  ~Consumer();
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;

  /// Subscribes and starts the poll thread.
  void start();
  /// Stops polling, closes the consumer (revoking everything through the
  /// listener) and joins the poll thread.
  void close();

  void commit_async(const std::vector<TopicPartitionOffset>& offsets);
  void pause(const std::vector<TopicPartition>& tps);
  /// Moves the fetch position (asynchronously) and drops what was prefetched.
  void seek(const TopicPartitionOffset& tpo);
  void resume(const std::vector<TopicPartition>& tps);
  std::vector<TopicPartition> assignment();
  /// Last known high watermark of a partition (cached by librdkafka from
  /// fetches; never blocks), or nullopt if not known yet.
  std::optional<int64_t> high_watermark(const TopicPartition& tp);
  /// Committed offsets of the group for these partitions (blocking; tests, audit).
  std::vector<TopicPartitionOffset> committed(const std::vector<TopicPartition>& tps, int timeout_ms);

 private:
  static void rebalance_cb(rd_kafka_t* rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* parts,
                           void* opaque);
  static void commit_cb(rd_kafka_t* rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* offsets,
                        void* opaque);
  void poll_loop();
  void commit_sync(const std::vector<TopicPartitionOffset>& offsets);

  config::KafkaConfig cfg_;
  std::vector<std::string> topics_;
  Listener& listener_;
  HandlePtr rk_;
  rd_kafka_queue_t* queue_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread poller_;
};

/// librdkafka's own log lines, routed into the host log.
void route_librdkafka_logs(rd_kafka_conf_t* conf);

}  // namespace idemsink::kafka
