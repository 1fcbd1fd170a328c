// The pipeline engine: consumed records in, durable outcomes and committed
// offsets out.
//
//   poll batch ─▶ decode + biz_key ─▶ batch claim ─▶ handler (key-ordered,
//   bounded in flight) ─▶ batched done / failed+outbox ─▶ offset tracker ─▶
//   commit past the durable prefix of each partition
//
// Every record ends in exactly one durable outcome: done, duplicate (its key
// was already done or dead), dead (an outbox row for the DLQ) or unknown
// (at-most-once effect that may have happened: parked and dead-lettered).
// Records of one key run one at a time in arrival order; different keys run
// in parallel. A key held by another live host is waited for, never skipped.
//
// Threading: all engine state lives on one io_context thread. The consumer's
// poll thread, database workers and plugin threads only post to it. Rebalance
// callbacks block the poll thread (not the engine) while revoked partitions
// drain.
#pragma once

#include <utility>  // before Boost.Asio 1.74: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
#include <chrono>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/claim/claim_store.h"
#include "core/claim/dlq_outbox.h"
#include "core/config/config.h"
#include "core/db/pool.h"
#include "core/kafka/consumer.h"
#include "core/kafka/producer.h"
#include "core/pipeline/fetch_gate.h"
#include "core/pipeline/key_extractor.h"
#include "core/pipeline/metrics.h"
#include "core/pipeline/offset_tracker.h"
#include "core/plugin/plugin.h"

namespace idemsink::pipeline {

/// A route with its loaded handler.
struct Route {
  config::RouteConfig cfg;
  std::unique_ptr<plugin::Instance> handler;
  KeyExtractor extractor;
  RouteMetrics* metrics = nullptr;
  // Engine state:
  int in_flight = 0;
  std::deque<uint64_t> ready;     // claimed records waiting for a call slot
  std::vector<uint64_t> tx_batch; // local_tx records waiting for an apply job
  int tx_jobs = 0;
  bool tx_flush_scheduled = false;
};

class Engine : public kafka::Consumer::Listener {
 public:
  Engine(boost::asio::io_context& io, db::Pool& pool, const config::Config& cfg,
         std::vector<std::unique_ptr<Route>> routes, Metrics& metrics, std::string owner);
  ~Engine() override;

  /// Wires the consumer and DLQ producer in and starts the timers.
  void start(kafka::Consumer* consumer);
  /// Called once the consumer is closed: publishes what it can of the DLQ
  /// outbox, commits nothing more, cancels timers. Blocks the caller (not the
  /// engine thread) until done or `deadline`.
  void quiesce(std::chrono::steady_clock::time_point deadline);

  /// Each route's handler, by route name (for the reconciler).
  std::map<std::string, plugin::Instance*> handlers() const;

  /// Operator pause/resume (admin API): stops fetching, keeps the group.
  void set_operator_pause(bool paused);
  bool operator_paused() const { return gate_.operator_paused(); }

  /// Delivery report of the DLQ producer (producer thread).
  void on_dlq_delivery(uint64_t outbox_id, rd_kafka_resp_err_t err);
  /// How to make the DLQ producer; called at start and again after a fatal
  /// producer error (an idempotent producer cannot continue after one).
  using ProducerFactory = std::function<std::unique_ptr<kafka::Producer>()>;
  void set_producer_factory(ProducerFactory f);

  // kafka::Consumer::Listener (poll thread)
  void on_messages(kafka::Consumer::Batch batch) override;
  void on_gap(const kafka::Consumer::Gap& gap) override;
  void on_stall(const kafka::TopicPartition& tp, int64_t from, int64_t end) override;
  void on_assigned(const std::vector<kafka::TopicPartitionOffset>& starts) override;
  std::vector<kafka::TopicPartitionOffset> on_revoking(const std::vector<kafka::TopicPartition>& tps,
                                                       bool lost) override;
  void on_commit_result(rd_kafka_resp_err_t err, const std::vector<kafka::TopicPartitionOffset>& offsets) override;

 private:
  enum class Stage {
    Waiting,        // behind an earlier record of the same key
    Claim,          // queued for the next claim batch
    Claiming,       // in a claim job
    Busy,           // key held by another live host; re-checked periodically
    Ready,          // claim held; waiting for a call slot
    Calling,        // handler call (or local_tx apply job) in progress
    Backoff,        // retry scheduled
    Finishing,      // done / failed / unknown being written
    DeadLettering,  // refused before any claim; outbox row being written
  };
  struct Partition;
  struct Record;
  struct Terminal {
    uint64_t id;
    claim::Status status;
    std::string reason;
  };
  struct RevokeWaiter;

  // ingest and claims
  void ingest(kafka::Consumer::Batch batch);
  void apply_gap(const kafka::Consumer::Gap& gap);
  void refuse(Record& r, std::string reason, std::string detail);
  void enqueue_claim(Record& r);
  void flush_claims();
  void on_claimed(const std::vector<uint64_t>& ids, const std::vector<claim::ClaimResult>& results);
  // calls
  void make_ready(Record& r);
  void pump();
  void dispatch(Record& r);
  void on_call_done(uint64_t id, uint64_t call_id, idemsink_outcome outcome, std::string detail);
  void on_call_result(Record& r, idemsink_outcome outcome, std::string detail);
  void retry_or_fail(Record& r, std::string error);
  void flush_forwards();
  void hold_partition(const std::shared_ptr<Partition>& part, int64_t offset, int64_t due_ms);
  void flush_local_tx(Route& route);
  // outcomes
  void fail(Record& r, claim::Status status, std::string reason, std::string error);
  void flush_finishing();
  void on_finished(const std::vector<uint64_t>& ids, const std::vector<bool>& ok, const std::vector<Terminal>* terms);
  void flush_dead_letters();
  void retire(Record& r);
  void drop(Record& r);
  void release_claims(std::vector<claim::Outcome> outcomes);
  // offsets, rebalance, backpressure
  void commit_offsets();
  void rewind(Partition& part, int64_t offset);
  void update_partition_gauges();
  void check_revokes();
  // DLQ relay
  void relay_kick();
  void on_relay_taken(std::vector<claim::DeadLetter> letters);
  void on_relay_delivered(uint64_t outbox_id, rd_kafka_resp_err_t err);
  // timers
  void every(boost::asio::steady_timer& t, std::chrono::milliseconds period, std::function<void()> fn);
  void post_once(bool& flag, std::function<void()> fn);

  Record* find(uint64_t id);
  claim::Outcome outcome_of(const Record& r) const;
  claim::DeadLetter letter_of(const Record& r, const std::string& reason, const std::string& error) const;
  idemsink_record abi_record(const Record& r, std::vector<idemsink_header>& headers) const;

  boost::asio::io_context& io_;
  db::Pool& pool_;
  const config::Config& cfg_;
  Metrics& metrics_;
  std::string owner_;
  FetchGate gate_;
  claim::ClaimStore store_;
  claim::DlqOutbox outbox_;
  kafka::Consumer* consumer_ = nullptr;
  ProducerFactory producer_factory_;
  std::unique_ptr<kafka::Producer> producer_;

  std::vector<std::unique_ptr<Route>> routes_;
  struct TopicRoute {
    Route* route;
    size_t tier;  // 0: the route's own topic; N: its retry topic N
  };
  std::map<std::string, TopicRoute> route_by_topic_;
  std::map<kafka::TopicPartition, std::shared_ptr<Partition>> partitions_;
  std::unordered_map<uint64_t, std::unique_ptr<Record>> records_;
  std::unordered_map<std::string, std::deque<uint64_t>> keys_;  // "ns\0biz_key" -> arrival order
  uint64_t next_id_ = 1;

  std::deque<uint64_t> claim_queue_;
  std::vector<uint64_t> busy_;
  std::vector<uint64_t> done_queue_;
  std::vector<Terminal> terminal_queue_;
  std::vector<uint64_t> dead_letter_queue_;
  std::vector<uint64_t> forward_queue_;  // to their next retry topic
  int claim_jobs_ = 0;
  int finish_jobs_ = 0;
  int dead_letter_jobs_ = 0;
  int in_flight_ = 0;
  bool claim_flush_scheduled_ = false;
  bool finish_flush_scheduled_ = false;
  bool dead_letter_flush_scheduled_ = false;
  bool forward_flush_scheduled_ = false;
  bool renew_running_ = false;
  bool gauges_running_ = false;

  std::vector<std::unique_ptr<RevokeWaiter>> revokes_;
  std::chrono::steady_clock::time_point commits_held_until_{};
  bool stopping_ = false;

  // DLQ relay: one cycle at a time, so one host never publishes a row twice.
  bool relay_running_ = false;
  bool relay_again_ = false;
  enum class Delivery { Pending, Ok, Failed };
  std::map<uint64_t, Delivery> relay_outstanding_;  // outbox id -> delivery state, this cycle
  size_t relay_pending_ = 0;
  std::string relay_first_error_;
  size_t relay_taken_ = 0;
  int relay_failures_in_a_row_ = 0;
  std::chrono::steady_clock::time_point relay_not_before_{};

  uint64_t hits_since_summary_ = 0;

  boost::asio::steady_timer commit_timer_;
  boost::asio::steady_timer renew_timer_;
  boost::asio::steady_timer busy_timer_;
  boost::asio::steady_timer linger_timer_;
  boost::asio::steady_timer relay_timer_;
  boost::asio::steady_timer gauges_timer_;
  boost::asio::steady_timer summary_timer_;
};

}  // namespace idemsink::pipeline
