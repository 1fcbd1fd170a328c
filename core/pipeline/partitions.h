// The partitions assigned to this host: their offset trackers and commits,
// holds and re-reads, verified holes and stalls, lag, and revocation.
//
// Starts: a newly assigned partition is held until the database's own offset
// for it (claim/offsets.h) is read, then starts from the lower of that and
// the group's committed offset: a database that went back in time (a promoted
// replica lacking the last commits) has its lost window read again.
//
// Commits: every kafka.commit_interval, each partition whose commit point
// moved is written to the database, then committed to Kafka
// (asynchronously): Kafka's offset never runs ahead of the database's. On
// revocation the partition stops taking new records at once; its records
// already in a job or a call get
// host.shutdown_grace to finish, then its commit point is returned to the
// rebalance callback, which commits it before letting the partition go.
//
// Engine thread only (the rebalance callbacks block the poll thread, not
// this one).
#pragma once

#include "core/common/asio.h"
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <vector>

#include "core/config/config.h"
#include "core/claim/offset_moves.h"
#include "core/claim/offsets.h"
#include "core/db/pool.h"
#include "core/kafka/consumer.h"
#include "core/pipeline/fetch_gate.h"
#include "core/metrics/metrics.h"
#include "core/pipeline/record.h"

namespace idemsink::pipeline {

class Partitions {
 public:
  /// The partitions of one consumer (group): `routes` are the routes whose
  /// topics it reads, one route per topic.
  Partitions(boost::asio::io_context& io, const config::Config& cfg, metrics::Metrics& metrics, FetchGate& gate,
             db::Pool& pool, const claim::OffsetStore& offsets, const std::vector<const config::RouteConfig*>& routes);

  void attach(kafka::Consumer* consumer) { consumer_ = consumer; }

  /// How many partitions of these topics are assigned and not being revoked.
  size_t active_of(const std::vector<std::string>& topics) const;
  /// The partition's state if it is assigned and not being revoked.
  std::shared_ptr<Partition> active(const kafka::TopicPartition& tp) const;

  /// Partitions newly assigned, with the group's committed offsets: each is
  /// held until the database's offset is read, then starts from the lower.
  void assigned(const std::vector<kafka::TopicPartitionOffset>& starts);
  /// Stops the partitions taking new records; returns their state.
  std::vector<std::shared_ptr<Partition>> begin_revoke(const std::vector<kafka::TopicPartition>& tps);
  /// Answers `done` with the offsets to commit once no record of `parts` is
  /// left, or host.shutdown_grace has passed (nothing when `lost`).
  void await_drained(std::vector<kafka::TopicPartition> tps, std::vector<std::shared_ptr<Partition>> parts, bool lost,
                     std::promise<std::vector<kafka::TopicPartitionOffset>> done);
  /// A record of `part` reached its outcome or was dropped.
  void record_ended(Partition& part);

  /// Whether a polled record of `part` enters the pipeline: the next offset
  /// of the partition, not polled before our last seek of it, and (on a
  /// retry topic) due. Otherwise it is skipped: a refetch, a stale record,
  /// or a record not due yet (the partition is held until it is).
  bool take(const std::shared_ptr<Partition>& part, const rd_kafka_message_t& msg, uint64_t seek_generation,
            bool retry_topic);

  /// Whether `msg` is the record `part` takes next (take()'s checks, without
  /// taking it).
  bool next_in_line(const Partition& part, const rd_kafka_message_t& msg, uint64_t seek_generation) const;
  /// The record at `offset` needs schema `id`, which `registry` has not
  /// given yet: the partition holds, rewound to it, until the registry
  /// answers (records after it were dropped and are fetched again).
  void wait_for_schema(const std::shared_ptr<Partition>& part, int64_t offset, format::Registry& registry, int32_t id);

  /// Offsets Kafka deleted by retention before this group read them: no
  /// outcome will ever exist for them. The commit point stays at `from`
  /// until the loss is recorded (Engine), then passes it.
  struct Lost {
    std::shared_ptr<Partition> part;
    int64_t from = 0;
    int64_t to = 0;  // exclusive
  };
  /// A hole a re-read confirmed: the commit may pass it; a part of it below
  /// the partition's log start comes back as Lost, to be recorded first.
  std::optional<Lost> hole(const kafka::Consumer::Gap& gap);
  void stalled(const kafka::TopicPartition& tp);
  /// The partition's records are taken from `offset` on, with a new tracker
  /// (a failover's re-read, an operator's move); Kafka is taken to hold
  /// `kafka_holds` (-1: unknown, so the commit goes to `offset`).
  void read_on_from(Partition& p, int64_t offset, int64_t kafka_holds);
  /// Reads the partition again from `offset`; records polled before are stale.
  void rewind(Partition& part, int64_t offset);
  /// A retry-topic partition whose record at `offset` is due at `due_ms`:
  /// paused and rewound to it until then.
  void hold(const std::shared_ptr<Partition>& part, int64_t offset, int64_t due_ms);

  /// An operator's move of one of these partitions (claim/offset_moves.h),
  /// applied when the partition is ours and settled (not starting, revoked
  /// or with offsets being stored; else a later round tries again). Stamped
  /// in the database with where the partition was (a rewind also lowers the
  /// stored offset in that transaction: a host dying right after still
  /// reads again), then the partition reads on from the target, and its
  /// commit goes there. Records in flight finish; a rewind's records meet
  /// their claims. `host` stamps it.
  void move(const claim::OffsetMove& m, const std::string& host);

  /// Commits every partition whose commit point moved: to the database,
  /// then, once that is durable, to Kafka.
  void commit();
  /// Another database server answers (a failover): each partition whose
  /// stored offset there is behind what this host has read is read again
  /// from it (those outcomes may be lost); commits wait until that is
  /// settled, so a loss is never written over.
  void recheck_stored();
  void commit_result(rd_kafka_resp_err_t err, const std::vector<kafka::TopicPartitionOffset>& offsets);
  /// The group's rebalance reached us: commits carry the new generation.
  void rebalance_reached() { commits_held_until_ = {}; }

  /// The partitions' gauges; returns their lag summed (NaN while one's is unknown).
  double update_gauges();
  /// Partitions assigned now, being revoked or not.
  size_t assigned() const { return parts_.size(); }

 private:
  /// A commit sent (or failed) counts once for each route it carries offsets of.
  void count_commit(const std::vector<kafka::TopicPartitionOffset>& offsets, bool failed);
  struct Drain {
    std::vector<kafka::TopicPartition> tps;
    std::vector<std::shared_ptr<Partition>> parts;  // this assignment's state of those partitions
    bool lost = false;
    std::promise<std::vector<kafka::TopicPartitionOffset>> done;
    std::chrono::steady_clock::time_point deadline;
    std::unique_ptr<boost::asio::steady_timer> timer;
  };
  void check_drains();
  /// A drained revocation's offsets stored in the database, then handed to
  /// `done` to commit; none if the database does not answer in time.
  void store_on_revoke(std::promise<std::vector<kafka::TopicPartitionOffset>> done,
                       std::vector<kafka::TopicPartitionOffset> offsets, std::vector<kafka::TopicPartition> tps);
  /// An operator's move of `p` is settled (applied, or to be tried again).
  void settle_move(Partition& p);
  /// The database's offsets of newly assigned partitions are known: each
  /// starts, from the database's offset if it is behind Kafka's.
  void started(const std::vector<std::shared_ptr<Partition>>& parts,
               const std::map<std::pair<std::string, int32_t>, int64_t>& stored);
  /// Writes offsets to the database, then calls `then(true)` on the engine
  /// thread; `then(false)` if they were not written (another server answers
  /// since the partitions started, or the job gave up).
  void store(std::vector<kafka::TopicPartitionOffset> offsets, std::function<void(bool)> then);
  /// Whether a partition of `topic` nobody committed begins at the end: a
  /// route's source topic with start_at "latest" (or, unset, the consumer's
  /// auto.offset.reset). A retry topic always begins at its start: its
  /// records are the route's own.
  bool begins_at_end(const std::string& topic) const;
  /// A partition nobody committed, of a topic that begins at the end: it
  /// begins at the first record stamped at or after the moment the group
  /// began the topic (now, for the first partition), stored before a record
  /// is taken. Held, and tried again, until that is done.
  void begin_latest(const std::shared_ptr<Partition>& p);
  void begin_latest_at(const std::shared_ptr<Partition>& p, int64_t began_ms, bool first);
  void begin_latest_later(const std::shared_ptr<Partition>& p);
  /// Whether the partition state is still the one assigned (not revoked, not
  /// assigned again meanwhile).
  bool current(const std::shared_ptr<Partition>& p) const;
  /// Starts taking the partition's records at `start` (-1: its log's start)
  /// and lets it fetch.
  void start_taking(Partition& p, int64_t start);

  boost::asio::io_context& io_;
  const config::Config& cfg_;
  metrics::Metrics& metrics_;
  struct TopicOf {
    std::string route;
    metrics::RouteMetrics* metrics;
  };
  std::map<std::string, TopicOf> route_of_topic_;  // the route of each topic (own and retry topics)
  FetchGate& gate_;
  db::Pool& pool_;
  const claim::OffsetStore& offsets_;
  bool storing_ = false;     // a commit's database write is under way
  bool rechecking_ = false;  // after a failover: commits wait for recheck_stored()
  // The server (@@server_id) the stored offsets were read from; written from
  // pool workers, hence atomic.
  std::atomic<uint64_t> server_id_{0};
  std::set<std::string> latest_topics_;  // source topics whose uncommitted partitions begin at the end
  kafka::Consumer* consumer_ = nullptr;
  std::map<kafka::TopicPartition, std::shared_ptr<Partition>> parts_;
  std::vector<std::unique_ptr<Drain>> drains_;
  std::chrono::steady_clock::time_point commits_held_until_{};
};

}  // namespace idemsink::pipeline
