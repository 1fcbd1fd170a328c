// The group consumer: one poll thread feeding batches to a listener.
//
// Offsets are never stored or committed by librdkafka on its own
// (enable.auto.commit=false, enable.auto.offset.store=false); the pipeline
// commits explicit offsets, per partition, only past durable outcomes.
// Rebalance callbacks run on the poll thread and may block there while the
// pipeline drains the revoked partitions (bounded by host.shutdown_grace,
// which must stay below max.poll.interval.ms).
//
// Gap-free delivery: records of a partition reach the listener in offset
// order without jumps. When the next record polled is not the one expected
// (last + 1, or the group's committed offset), the partition is re-read
// from the expected offset; offsets still absent after the re-read are
// real holes (transaction markers, compacted records) and are reported with
// on_gap() before the records after them. A hole at the end of a partition
// (a trailing transaction marker) is found the same way, from the
// consumer's position. A partition that should be fetching, is behind the
// broker's end (its last stable offset) and receives nothing for
// kafka.stall_timeout is stalled: reported and read again. A seek that fails
// is retried, and the partition's records are held back until it happens.
// docs/librdkafka.md lists the library faults this guards against.
//
// Fetch control (pause, resume, seek) is applied by the poll thread between
// polls, in the order asked, so every batch can say which seeks it follows.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/config/config.h"
#include "core/kafka/client.h"
#include "core/kafka/client_health.h"

namespace idemsink::kafka {

class Consumer {
 public:
  /// Records polled together, in poll order. `seek_generation` counts the
  /// seek() calls applied before they were polled: a record of a partition
  /// sought with ticket T comes from the new position iff seek_generation >= T.
  struct Batch {
    std::vector<MessagePtr> messages;
    uint64_t seek_generation = 0;
  };

  /// Offsets [from, to) of a partition that the first read jumped over.
  struct Gap {
    TopicPartition tp;
    int64_t from = 0;
    int64_t to = 0;
    /// true: a re-read confirmed no record there (a hole the commit may pass);
    /// false: the re-read delivered records the first read had skipped.
    bool absent = false;
    /// The partition's first offset when the hole was confirmed: the offsets
    /// [from, min(to, log_start)) were deleted by retention before they were
    /// read (not a transaction marker, not compaction). -1 when unknown.
    int64_t log_start = -1;
  };

  class Listener {
   public:
    virtual ~Listener() = default;
    /// A polled batch (poll thread). Must not block for long.
    virtual void on_messages(Batch batch) = 0;
    /// A gap found and settled (poll thread), in order with on_messages.
    virtual void on_gap(const Gap& gap) = 0;
    /// A partition that should be fetching received nothing for
    /// kafka.stall_timeout although it has records from `from` to `end`; it
    /// is being read again from `from` (poll thread).
    virtual void on_stall(const TopicPartition& tp, int64_t from, int64_t end) = 0;
    /// Partitions newly assigned (poll thread, inside the rebalance), each
    /// with the offset its records start at: the group's committed offset,
    /// or RD_KAFKA_OFFSET_INVALID when there is none (or it could not be
    /// read): then auto.offset.reset places it and its first record sets the start.
    virtual void on_assigned(const std::vector<TopicPartitionOffset>& starts) = 0;
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
  /// listener) and joins the poll thread. A consumer that must not close
  /// before its first assignment (docs/librdkafka.md) keeps polling for it
  /// until `deadline`.
  void close(std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::now());

  void commit_async(const std::vector<TopicPartitionOffset>& offsets);

  /// Fetch control, applied by the poll thread before its next poll.
  void pause(const std::vector<TopicPartition>& tps);
  void resume(const std::vector<TopicPartition>& tps);
  /// Moves the fetch position, dropping what was prefetched; returns the
  /// seek's ticket (see Batch::seek_generation).
  uint64_t seek(const TopicPartitionOffset& tpo);

  /// Last known low and high watermarks of a partition (cached by librdkafka
  /// from fetches, or, before a fetch has told, asked of the brokers by the
  /// poll thread; never blocks), or nullopt if not known yet.
  struct Watermarks {
    int64_t low = 0;
    int64_t high = 0;
  };
  std::optional<Watermarks> watermarks(const TopicPartition& tp);
  /// Partitions of `topic` per the cluster's metadata (blocking), or nullopt
  /// when it does not answer.
  std::optional<int> partition_count(const std::string& topic, int timeout_ms);
  /// Runs `job` on the poll thread before its next poll, with the handle:
  /// for a question of the cluster that may wait (never on the engine
  /// thread). Dropped when the consumer closes first.
  void on_poll_thread(std::function<void(rd_kafka_t*)> job);
  /// Committed offsets of the group for these partitions (blocking; tests, audit).
  std::vector<TopicPartitionOffset> committed(const std::vector<TopicPartition>& tps, int timeout_ms);
  /// True when close() had to leave the handle to the process exit (see
  /// must_wait_first_assignment_): the process must exit without running
  /// destructors, since librdkafka's threads still run.
  bool abandoned() const { return abandoned_.load(); }

  /// The cluster as this consumer sees it (statistics and errors).
  const ClientHealth& health() const { return health_; }
  const std::string& group() const { return cfg_.group_id; }

 private:
  struct Command {
    enum class Kind { Pause, Resume, Seek, Run } kind;
    std::vector<TopicPartition> tps;
    int64_t offset = 0;                    // Seek
    std::function<void(rd_kafka_t*)> job;  // Run
  };
  // The poll thread's view of one assigned partition.
  struct Stream {
    std::optional<int64_t> next;            // offset the next record must have
    std::optional<int64_t> rereading_from;  // a re-read from here is under way
    int64_t gap_end = 0;                    // where the first read jumped to
    std::optional<int64_t> pending_seek;    // a seek that failed: retried; records refused meanwhile
    // Sought to the beginning and no record yet: where it stands is unknown,
    // and what the partition holds is owed (checked for a stall all the same).
    bool from_beginning = false;
    std::chrono::steady_clock::time_point last_progress = std::chrono::steady_clock::now();
    bool dropping = false;  // test fault drop_fetch: records vanish until the next seek
    // librdkafka has started this partition's fetcher (see set_fetching);
    // until then, the pause or resume asked for meanwhile.
    bool fetcher_started = false;
    std::optional<bool> deferred_fetching;
  };

  static void rebalance_cb(rd_kafka_t* rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* parts,
                           void* opaque);
  /// The rebalance's two halves (the poll thread, inside rebalance_cb):
  /// partitions assigned, started at the group's committed offsets; or
  /// revoked (committed first) or lost.
  void assign(rd_kafka_t* rk, rd_kafka_topic_partition_list_t* parts, const std::vector<TopicPartition>& tps,
              bool cooperative);
  void revoke(rd_kafka_t* rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* parts,
              const std::vector<TopicPartition>& tps, bool cooperative);
  static void log_cb(const rd_kafka_t* rk, int level, const char* fac, const char* buf);
  static void error_cb(rd_kafka_t* rk, int err, const char* reason, void* opaque);
  static int stats_cb(rd_kafka_t* rk, char* json, size_t len, void* opaque);
  static void commit_cb(rd_kafka_t* rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* offsets,
                        void* opaque);
  void poll_loop();
  /// Poll thread: asks the brokers for the ends of assigned partitions that
  /// no fetch has told librdkafka about yet (paused from the start, a seek
  /// refused, or simply not fetched yet), so that their lag is known from
  /// the assignment on. The ask blocks the poll thread (kAskMarksWithin at
  /// most): a partition is asked after kAskMarksEvery, then less and less
  /// often while librdkafka still does not know it (up to kAskMarksAtMost).
  void ask_unknown_watermarks(std::chrono::steady_clock::time_point now);
  static constexpr auto kAskMarksEvery = std::chrono::seconds(2);
  static constexpr auto kAskMarksAtMost = std::chrono::seconds(60);
  static constexpr int kAskMarksWithin = 500;  // ms
  struct MarksAsk {
    std::chrono::steady_clock::time_point next;
    std::chrono::seconds interval = kAskMarksEvery;
  };
  std::map<TopicPartition, MarksAsk> marks_asks_;  // poll thread
  mutable std::mutex asked_marks_mu_;
  std::map<TopicPartition, Watermarks> asked_marks_;  // until librdkafka's own are known
  /// At shutdown: unsubscribes and polls until the assignment is revoked (or
  /// the close deadline), so that rd_kafka_consumer_close() revokes nothing.
  void revoke_before_close();
  /// Partitions assigned to this consumer now, or -1 if librdkafka cannot say.
  int assigned_count();
  /// Wakes the poll thread out of its wait for records; a no-op once the
  /// close has begun (see closing_).
  void wake();
  void enqueue(Command c);
  void apply_commands();
  /// Pauses (false) or resumes (true) partitions, or keeps what a partition
  /// should do until its fetcher has started.
  void set_fetching(const std::vector<TopicPartition>& tps, bool fetching);
  void note_fetcher_started(const TopicPartition& tp, Stream& s);
  /// Test fault fetch_command_overtakes_start (see log_cb).
  void resume_during_start(std::string_view line);
  /// Synchronous seek; false (logged) if it did not happen.
  bool seek_now(const TopicPartition& tp, int64_t offset);
  void seek_stream(const TopicPartition& tp, Stream& s, int64_t offset);
  /// The group's committed offsets of newly assigned partitions, read with
  /// retries (RD_KAFKA_OFFSET_INVALID: never committed).
  std::vector<TopicPartitionOffset> read_committed(const std::vector<TopicPartition>& tps);
  /// Whether a polled record goes to the listener; starts or settles a re-read.
  bool admit(rd_kafka_message_t* m);
  /// Reports a hole a re-read confirmed, with the partition's log start.
  void report_hole(const TopicPartition& tp, int64_t from, int64_t to);
  /// Whether the topic's cleanup.policy deletes old segments (cached).
  bool deletes_by_retention(const std::string& topic);
  /// Retries failed seeks, finds holes from the positions, detects stalls.
  void check_streams();
  void check_stalls(std::chrono::steady_clock::time_point now);
  /// Hands the records polled so far to the listener.
  void flush();
  void commit_sync(const std::vector<TopicPartitionOffset>& offsets);

  config::KafkaConfig cfg_;
  std::vector<std::string> topics_;
  Listener& listener_;
  ClientHealth health_;
  LoginSettings login_;  // what a refused login means (login.h)
  HandlePtr rk_;
  rd_kafka_queue_t* queue_ = nullptr;
  bool must_wait_first_assignment_ = false;  // librdkafka < 2.3 with cooperative-sticky
  bool configured_cooperative_ = false;      // partition.assignment.strategy is cooperative-sticky
  std::atomic<bool> stop_{false};
  std::atomic<bool> abandoned_{false};
  std::atomic<bool> first_rebalance_seen_{false};
  std::chrono::steady_clock::time_point close_deadline_{};
  std::thread poller_;

  std::mutex commands_mu_;
  std::vector<Command> commands_;
  uint64_t seeks_requested_ = 0;  // under commands_mu_
  // Test fault fetch_command_overtakes_start: armed, and whether the poll
  // thread is in a librdkafka pause or resume.
  std::atomic<bool> holding_fetch_start_{false};
  std::atomic<bool> in_fetch_call_{false};
  // Set (under commands_mu_) just before rd_kafka_consumer_close(): from then
  // on nobody yields the consumer queue. The close serves that queue while it
  // waits for the group to terminate, and a yield ends its wait early; the
  // group's final answer then goes to a queue nobody reads and the handle's
  // destruction waits for it forever (librdkafka 2.0.2). Commands arriving
  // meanwhile are moot: nothing is fetched any more.
  bool closing_ = false;

  // Poll thread only.
  Batch batch_;
  uint64_t seeks_applied_ = 0;
  std::map<TopicPartition, Stream> streams_;
  std::map<std::string, bool> cleanup_deletes_;  // topic -> cleanup.policy has "delete"
  std::set<TopicPartition> paused_;              // as asked (see set_fetching)
  std::chrono::steady_clock::time_point next_stream_check_{};
};

/// The consumer settings of a host's `slice`-th database slice (one consumer
/// per database, all in one group): a static membership id
/// (`group.instance.id`) is the configured one for the first slice and gets
/// "-<slice>" appended for the others, since two members with one static id
/// fence each other out of the group.
config::KafkaConfig slice_consumer_config(const config::KafkaConfig& cfg, size_t slice);

/// librdkafka's own log lines, routed into the host log.
void route_librdkafka_logs(rd_kafka_conf_t* conf);

/// Whether a rebalance hands partitions over incrementally
/// (incremental_assign/unassign) or eagerly (assign): as librdkafka reports
/// the group's protocol ("COOPERATIVE" or "EAGER"), or, where it reports
/// none ("NONE", or NULL: it does so at times while the consumer closes),
/// as the configured assignor makes it (all of a group's assignors share
/// one protocol).
bool cooperative_rebalance(const char* reported_protocol, bool configured_cooperative);

/// One line naming the linked librdkafka and the workarounds in force.
std::string library_workarounds(const config::KafkaConfig& cfg);

}  // namespace idemsink::kafka
