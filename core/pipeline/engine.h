// The pipeline engine: consumed records in, durable outcomes and committed
// offsets out.
//
//   poll batch ─▶ admission (biz_key, or refused to the DLQ) ─▶ key queue ─▶
//   batch claim ─▶ dispatcher (key-ordered, bounded in flight) ─▶ failure
//   policy ─▶ outcome writer (batched done / failed+outbox / forward) ─▶
//   partitions: commit past the durable prefix of each partition
//
// Every record ends in exactly one durable outcome: done, duplicate (its key
// was already done or dead), dead (an outbox row for the DLQ) or unknown
// (at-most-once effect that may have happened: parked and dead-lettered).
// Records of one key run one at a time in arrival order; different keys run
// in parallel. A key held by another live host is waited for, never skipped.
//
// The engine owns the records and wires the stages; each stage lives in its
// own module (admission, key_queue, claimer, dispatcher, local_tx,
// failure_policy, route_health, outcome_writer, partitions, fetch_gate;
// dlq/relay for publishing; upkeep/housekeeping beside them) and reports back
// through the engine's doors (engine_doors.h).
//
// Feeds: one per consumer group the engine's routes use (route.group_id).
// Routes of one topic are in different groups: each feed has its own
// consumer, partitions, commits, lag and fetch gate (its own bound of
// buffered records), so one route slow, held or paused never holds another
// back; the claims, calls, writes and the outbox are the engine's, shared.
// A reload adds a feed for routes of a new group and removes one whose
// routes all went, once its consumer closed; the others never notice.
//
// Threading: all engine state lives on one io_context thread. The consumers'
// poll threads, database workers and plugin threads only post to it.
// Rebalance callbacks block a poll thread (not the engine) while revoked
// partitions drain.
#pragma once

#include "core/common/asio.h"
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/claim/claim_store.h"
#include "core/claim/offsets.h"
#include "core/config/config.h"
#include "core/db/pool.h"
#include "core/dlq/outbox.h"
#include "core/dlq/relay.h"
#include "core/kafka/consumer.h"
#include "core/pipeline/claimer.h"
#include "core/pipeline/dispatcher.h"
#include "core/pipeline/fetch_gate.h"
#include "core/upkeep/housekeeping.h"
#include "core/pipeline/key_queue.h"
#include "core/pipeline/local_tx.h"
#include "core/metrics/metrics.h"
#include "core/pipeline/controls.h"
#include "core/pipeline/engine_doors.h"
#include "core/pipeline/outcome_writer.h"
#include "core/pipeline/partitions.h"
#include "core/common/periodic.h"
#include "core/pipeline/record.h"
#include "core/pipeline/remote_gate.h"
#include "core/pipeline/route_control.h"
#include "core/pipeline/route_health.h"

namespace idemsink::pipeline {

class Engine : public RemoteGate, public Controls, private EngineDoors {
 public:
  Engine(boost::asio::io_context& io, db::Pool& pool, const config::Config& cfg,
         std::vector<std::unique_ptr<Route>> routes, metrics::Metrics& metrics, std::string owner);
  ~Engine() override;

  /// What the host makes a consumer for: one per group of the engine's
  /// routes, subscribed to its topics, reporting to its listener.
  struct FeedPlan {
    std::string group;
    std::vector<std::string> topics;
    kafka::Consumer::Listener* listener;
  };
  std::vector<FeedPlan> feeds() const;
  /// Wires the consumers in (one per feed, in feeds() order) and starts the timers.
  void start(const std::vector<kafka::Consumer*>& consumers);
  /// Called once the consumer is closed: gives the DLQ relay and outstanding
  /// database writes until `deadline`, then cancels timers. Blocks the caller
  /// (not the engine thread).
  void quiesce(std::chrono::steady_clock::time_point deadline);

  /// The deployment's namespace of derived idem_tokens (claim.derived_tokens),
  /// read from the database before start().
  void set_token_namespace(std::string ns) { store_.set_token_namespace(std::move(ns)); }
  void set_claim_read(claim::ClaimRead how) { store_.set_claim_read(how); }

  /// Frees the records still held (calls that outlived the shutdown grace)
  /// and with them the consumer's messages: librdkafka does not destroy a
  /// consumer while a message it handed out is alive. Once the engine
  /// thread and the database workers have stopped.
  void drop_records() { records_.clear(); }

  /// A config whose routes are the engine's as they run now, reloads
  /// applied (engine thread; the reconciler's view of them).
  std::shared_ptr<const config::Config> routes_config() const;
  /// Each route's handler, by route name (for the reconciler).
  std::map<std::string, std::shared_ptr<plugin::Instance>> handlers() const;

  /// A reload's settings for one of the engine's routes (engine thread),
  /// with the instance new calls go to (null: the route keeps its own).
  /// Its name, topics, group, formats and plugin file are the same (the
  /// reload refuses other changes: config/reload.h). Calls already out end
  /// on the instance they went to. `applied` runs on the engine thread once
  /// the settings changed: at once, or for a local_tx route once its apply
  /// jobs ended (no call of the route starts meanwhile).
  void reconfigure(config::RouteConfig next, std::shared_ptr<plugin::Instance> handler, std::function<void()> applied);

  /// Routes a reload adds, all of one group no running route reads
  /// (config/reload.h): a feed of their own, so no other group rebalances.
  /// Engine thread; the host makes the feed's consumer and attaches it.
  FeedPlan add_routes(std::vector<std::unique_ptr<Route>> routes);
  /// The consumer made for a feed add_routes planned (engine thread), before it starts.
  void attach_feed(const std::string& group, kafka::Consumer* consumer);
  /// A group whose routes a reload removed, once its consumer closed (its
  /// partitions revoked, drained and committed as at shutdown): its routes
  /// and feed leave the engine (engine thread). They are kept, not
  /// destroyed: a record whose call outlived the close still points at them.
  void remove_feed(const std::string& group);
  /// Whether a record of a removed group's feed is still in the engine (a
  /// call that outlived the close's grace): its consumer must live on.
  bool holds_records_of(const std::string& group) const;

  // Controls (the admin port's threads)
  void set_operator_pause(bool paused) override;
  bool operator_paused() const override;
  std::vector<RoutePause> route_pauses() const override { return route_control_.view(); }
  void route_pause_stored(const std::string& route, bool paused, const std::string& by) override {
    route_control_.stored(route, paused, by);
  }

  /// Operator pauses of this engine's routes (admin port, start-up).
  RouteControl& route_control() { return route_control_; }

  /// This engine's database's gauges (the reconciler of the same database reports there).
  metrics::SliceMetrics& slice() { return slice_; }

  /// The DLQ relay, for the host to give it its producer.
  dlq::Relay& relay() { return relay_; }

  // RemoteGate (engine thread): reconciliation's calls keep to the routes' budgets
  Answer try_call(const std::string& route) override;
  void hold(const std::string& route, std::chrono::milliseconds pause) override;
  void probe_answered(const std::string& route, uint64_t probe, bool healthy) override;
  void probe_abandoned(const std::string& route, uint64_t probe) override;

 private:
  struct Feed;
  /// The feed reading `route`'s topics.
  Feed& feed_of(const Route& route);
  // A feed's consumer events (its poll thread), posted to the engine thread.
  void on_messages(Feed& feed, kafka::Consumer::Batch batch);
  void on_gap(Feed& feed, const kafka::Consumer::Gap& gap);
  void on_assigned(Feed& feed, const std::vector<kafka::TopicPartitionOffset>& starts);
  std::vector<kafka::TopicPartitionOffset> on_revoking(Feed& feed, const std::vector<kafka::TopicPartition>& tps,
                                                       bool lost);

  static std::vector<Route*> route_pointers(const std::vector<std::unique_ptr<Route>>& routes);
  // EngineDoors (engine thread): what the stages report; each door in its
  // place below.
  Record* find(uint64_t id) final;
  void on_fenced(Record& r) final;
  void on_probe_wanted(Route& route) final;
  void on_calls_may_start() final;
  // records
  void ingest(Feed& feed, kafka::Consumer::Batch batch);
  /// A polled message its partition took, on its way to a record.
  struct Arrival {
    Route* route;
    size_t tier;  // 0: the route's own topic; N: its retry topic N
    std::shared_ptr<Partition> part;
    format::DecodedRecord decoded;
  };
  /// The message taken by its route's partition (decoded, when the route
  /// decodes): none when it is not the record's turn yet, or not a record.
  std::optional<Arrival> take_message(Feed& feed, const kafka::MessagePtr& msg, uint64_t seek_generation);
  /// False when the route does not take it (skipped); `undecodable` may
  /// learn why its condition could not tell.
  bool route_takes(Arrival& a, rd_kafka_message_t& msg, std::optional<std::string>& undecodable);
  Record& make_record(Arrival& a, kafka::MessagePtr msg);
  void admit_record(Record& r, std::optional<std::string> undecodable,
                    const std::optional<std::string>& value_canonical, int64_t now);
  /// A record its route does not take ([route.when]): its outcome, skipped.
  void skip(Route& route, Partition& part, int64_t offset);
  /// A record reached its outcome (`durable`) or is dropped with its
  /// partition; the next record of its key may go on.
  void end_record(Record& r, bool durable);
  /// The record (first of its entity, or of none) joins its biz_key's line;
  /// first there, it goes on to its claim.
  void line_up_by_key(Record& r);
  /// A record of the entity is gone: the next one lines up by key.
  void next_of_entity(const std::string& entity_id, uint64_t id);
  // claims
  void on_claimed(const Claimer::Claimed& claimed) final;
  /// A record's claim answered Held (its entity waits for a hold), or no
  /// longer does: it and the records behind it in its entity's line wait
  /// for the hold, out of the backpressure count (route_health.h), or not.
  void set_entity_on_hold(Record& r, bool held);
  /// The claim is ours: the record goes on to its call (or ends, or is looked up first).
  void on_owned(Record& r, const claim::ClaimResult& res, std::chrono::steady_clock::time_point sent);
  void claim_without_partition(std::vector<uint64_t> ids);
  /// Dead-letters a record before (or instead of) a claim.
  void refuse(Record& r, dlq::Reason reason, std::string detail);
  void release_claims(std::vector<claim::Outcome> outcomes);
  /// An at-most-once record that may have been sent although the database
  /// has no mark of it (in a window a failover lost, or called by this host
  /// before its claim was lost): its remote is asked before any call;
  /// called only on a clear "never sent".
  void look_up_before_call(Record& r);
  void looked_up(uint64_t id, idemsink_outcome outcome, std::string detail);
  // after a call, and after a write
  void on_call_result(Record& r, idemsink_outcome outcome, std::string detail) final;
  void on_local_tx_results(std::vector<LocalTxRunner::Result> results) final;
  /// Ends a record failed or unknown, dead-lettered.
  void end(Record& r, claim::Status status, dlq::Reason reason, std::string error);
  /// A record whose partition is being revoked, between calls: its claim is
  /// released for the new owner and the record ends here (true).
  bool hand_back_if_revoked(Record& r);
  /// Calls `r` again after its backoff, or after `after`.
  void retry_later(Record& r, std::optional<std::chrono::milliseconds> after = std::nullopt);
  /// A retryable answer asking for a pause (Retry-After): holds the route
  /// (a record's first such answer) or the record.
  void hold(Record& r, int64_t ms, std::string detail);
  /// Pauses below this are no pause: a plain retryable outcome.
  static constexpr int64_t kMinHoldMs = 100;
  /// Each group-limited route's share: the part of its partitions this host owns.
  void update_rate_shares();
  void on_written(const std::vector<OutcomeWriter::Written>& written) final;
  /// The database refused a record's row: end it another way.
  void written_rejected(Record& r, OutcomeWriter::Kind kind, const std::string& error);
  /// Gives up on recording a record: its claim is handed back, its offset not committed.
  void let_go(Record& r, OutcomeWriter::Kind kind, const std::string& error);
  void refresh_gauges();
  /// Offsets Kafka deleted before they were read: on record, then committed past.
  void record_lost(Feed& feed, Partitions::Lost lost);

  boost::asio::io_context& io_;
  db::Pool& pool_;
  const config::Config& cfg_;
  metrics::Metrics& metrics_;
  metrics::SliceMetrics& slice_;  // this engine's database
  std::string owner_;
  claim::ClaimStore store_;
  dlq::Outbox outbox_;
  std::vector<std::unique_ptr<Route>> routes_;
  /// Changed on the engine thread; the admin port's pause walks it too (feeds_mu_).
  std::vector<std::unique_ptr<Feed>> feeds_;
  mutable std::mutex feeds_mu_;
  bool operator_paused_ = false;  // feeds_mu_
  // What a reload removed: records past the close's grace may point at them.
  std::vector<std::unique_ptr<Route>> removed_routes_;
  std::vector<std::unique_ptr<Feed>> removed_feeds_;

  std::unordered_map<uint64_t, std::unique_ptr<Record>> records_;
  uint64_t next_id_ = 1;
  KeyQueue keys_;      // records of one biz_key, per route
  KeyQueue entities_;  // first deliveries of one entity, per ordered route ([route.order_by])
  /// Entity places kept by records let go uncommitted, per partition, until it is revoked.
  std::map<const Partition*, std::vector<std::pair<std::string, uint64_t>>> kept_places_;
  std::mt19937_64 rng_{std::random_device{}()};

  RouteHealth health_;
  LocalTxRunner local_tx_;
  Dispatcher dispatcher_;
  OutcomeWriter writer_;
  /// The relay's counts, into the routes' and the slice's metrics.
  struct RelayCounts : dlq::Relay::Listener {
    explicit RelayCounts(Engine& e) : engine(e) {}
    void published(const std::string& route, size_t published, size_t failed) override;
    void set_aside(size_t refused) override;
    Engine& engine;
  };
  RelayCounts relay_counts_;
  dlq::Relay relay_;
  Claimer claimer_;
  upkeep::Housekeeping housekeeping_;
  RouteControl route_control_;
  std::map<std::string, int> topic_sizes_;  // partitions per topic, for the rate limits' shares

  Route* route_named(const std::string& name);
  /// Applies the operators' offset moves of the partitions this host owns.
  void apply_offset_moves();
  /// Runs `then` once no apply job of the route is queued or running.
  void when_idle(Route& route, std::function<void()> then);
  /// Ids of the probes reconciliation's calls make, apart from records' ids.
  uint64_t next_probe_id_ = uint64_t{1} << 62;

  bool renew_running_ = false;
  uint64_t hits_since_summary_ = 0;

  Periodic commit_timer_;
  Periodic renew_timer_;
  Periodic relay_timer_;
  Periodic gauges_timer_;
  Periodic summary_timer_;
  /// Operators' offset moves (claim/offset_moves.h) are looked for this often.
  static constexpr std::chrono::seconds kMovesEvery{2};
  Periodic moves_timer_;
  bool moves_reading_ = false;
};

/// One consumer group's part of an engine (the file's comment): its consumer
/// and where its events go, its partitions, which of them fetch, and the
/// routes whose topics it reads (one route per topic).
struct Engine::Feed : kafka::Consumer::Listener {
  Feed(Engine& engine, std::string group, std::vector<Route*> routes);

  Engine& engine;
  const std::string group;
  std::vector<Route*> routes;
  struct TopicRoute {
    Route* route;
    size_t tier;  // 0: the route's own topic; N: its retry topic N
  };
  std::map<std::string, TopicRoute> route_by_topic;
  FetchGate gate;
  claim::OffsetStore offsets;
  Partitions partitions;
  kafka::Consumer* consumer = nullptr;

  // kafka::Consumer::Listener (the consumer's poll thread)
  void on_messages(kafka::Consumer::Batch batch) override { engine.on_messages(*this, std::move(batch)); }
  void on_gap(const kafka::Consumer::Gap& gap) override { engine.on_gap(*this, gap); }
  void on_stall(const kafka::TopicPartition& tp, int64_t from, int64_t end) override;
  void on_assigned(const std::vector<kafka::TopicPartitionOffset>& starts) override {
    engine.on_assigned(*this, starts);
  }
  std::vector<kafka::TopicPartitionOffset> on_revoking(const std::vector<kafka::TopicPartition>& tps,
                                                       bool lost) override {
    return engine.on_revoking(*this, tps, lost);
  }
  void on_commit_result(rd_kafka_resp_err_t err, const std::vector<kafka::TopicPartitionOffset>& offsets) override;
};

}  // namespace idemsink::pipeline
