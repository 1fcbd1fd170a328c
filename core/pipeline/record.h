// What the pipeline holds in memory: routes, assigned partitions and the
// records between consumption and their durable outcome. All of it lives on
// the engine thread.
#pragma once

#include "core/common/source.h"
#include "core/common/asio.h"
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/claim/claim_store.h"
#include "core/common/log.h"
#include "core/common/util.h"
#include "core/config/config.h"
#include "core/dlq/reason.h"
#include "core/format/decoder.h"
#include "core/kafka/client.h"
#include "core/pipeline/circuit_breaker.h"
#include "core/pipeline/rate_limiter.h"
#include "core/pipeline/stage.h"

#include "core/pipeline/fetch_gate.h"
#include "core/pipeline/key_extractor.h"
#include "core/pipeline/record_view.h"
#include "core/pipeline/route_filter.h"
#include "core/metrics/metrics.h"
#include "core/pipeline/offset_tracker.h"
#include "core/plugin/plugin.h"

namespace idemsink::pipeline {

inline int64_t wall_clock_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// A route with its loaded handler.
struct Route {
  config::RouteConfig cfg;
  /// The instance new calls go to; a reload may replace it, and the calls
  /// out on the old one hold it (Record::handler) until they end.
  std::shared_ptr<plugin::Instance> handler;
  KeyExtractor extractor;
  metrics::RouteMetrics* metrics = nullptr;
  /// The entity's key ([route.order_by]); none: ordered by biz_key only.
  std::optional<KeyExtractor> order_extractor;
  /// Which records it takes ([route.when]); none: every record.
  std::optional<RouteFilter> filter;
  /// [route.value], [route.key_format]: the value and key decoded to JSON
  /// before anything reads them; none: read as written.
  std::optional<format::RecordDecoder> decoder;
  /// The fetch gate of the consumer (group) reading the route's topics.
  FetchGate* gate = nullptr;
  CircuitBreaker circuit{cfg.circuit};
  RateLimiter limiter{cfg.rate_limit};
  // Records of this route in the pipeline.
  int64_t live = 0;
  // Of those, records waiting for an entity's hold (route_health.h): out of
  // the host's backpressure count, bounded by order_by.max_waiting instead.
  int64_t waiting_on_hold = 0;
  bool paused_for_holds = false;
  /// A reload waits for the route's apply jobs before it changes the
  /// settings they read: meanwhile no call of the route starts.
  bool held_for_reload = false;
  /// The number of the latest reload change (Engine::reconfigure): an older
  /// one still waiting for the route's jobs gives way to it.
  uint64_t reloads = 0;
  /// What the circuit's state does to the route (route_health.h alone
  /// changes it). While the circuit is not closed the route's records leave
  /// the host's backpressure count (held for the remote, they must not pause
  /// the other routes), and the route fetches only to find a record to
  /// probe with.
  struct Health {
    std::unique_ptr<boost::asio::steady_timer> probe_timer;  // while the circuit is open
    std::chrono::steady_clock::time_point opened_at;
    bool buffer_exempt = false;
    bool topics_paused = false;
    // Every held record has been a probe (and failed) since it opened, so
    // the route fetches until a record arrives to probe with: records that
    // fail on their own are not the only probes.
    bool fetch_for_probe = false;
    // Times the circuit opened: a record's wait for it (max_wait) belongs to
    // one open period, and starts again in the next.
    uint64_t open_periods = 0;
  } health;
  /// The route's own topic and its retry topics: what stops fetching while its circuit is open.
  std::vector<std::string> topics() const { return cfg.topics(); }
};

class Partitions;

/// One assigned partition, for one assignment (a re-assignment gets a new one).
struct Partition {
  kafka::TopicPartition tp;
  Partitions* owner = nullptr;  // the partitions of the consumer it was assigned to
  metrics::PartitionMetrics* metrics = nullptr;
  OffsetTracker tracker;
  bool revoked = false;
  KafkaCommit kafka;  // the commit point as sent to Kafka and confirmed
  // Records polled before our last seek of this partition are stale.
  uint64_t seek_ticket = 0;
  // A retry-topic partition whose next record is not due yet is paused and
  // rewound to that record until this timer fires.
  std::unique_ptr<boost::asio::steady_timer> hold_timer;
  bool stalled = false;    // the consumer reported a stall; cleared by the next record
  bool moving = false;     // an operator's move is being stamped: its offsets are not stored meanwhile
  size_t in_pipeline = 0;  // records of this assignment not yet ended (a revocation waits for them)
  // Assigned, its start not decided yet: the database's offset is being read
  // (it may be behind Kafka's, if the database went back in time). Records
  // polled meanwhile are dropped, and fetched again from the start chosen.
  bool starting = true;
  int64_t kafka_start = -1;     // the group's committed offset (-1: none, or unreadable)
  int64_t first_consumed = -1;  // the first offset this host took of the partition, this assignment
  // Records below this offset were committed in Kafka on the strength of
  // outcomes the database has lost (-1: none): re-processed, and an
  // at-most-once record among them is looked up before it is sent again.
  int64_t lost_window_end = -1;
};

struct Record;
/// The fields of a log line about this record (core/common/log.h).
LogFields log_fields_of(const Record& r);

struct Record {
  uint64_t id = 0;
  kafka::MessagePtr msg;
  Route* route = nullptr;
  size_t tier = 0;  // 0: consumed from the route's topic; N: from its retry topic N
  std::shared_ptr<Partition> part;
  int64_t offset = 0;
  int64_t timestamp_ms = 0;
  // The value and key decoded to JSON (route.decoder),
  // and the key's text as the biz_key and [route.when] read it; none: read
  // as written. Dead letters keep the bytes as written.
  std::optional<std::string> value_json;
  std::optional<std::string> key_json;
  std::optional<std::string> key_text;
  Stage stage = Stage::New;  // changed only by move_to
  std::string biz_key;
  std::string key_id;  // empty: not in a key queue (refused before a key existed)
  // [route.order_by]: the record's entity. A first delivery waits in its
  // entity's line (entity_id, in memory) as well as its key's; a record back
  // from a retry topic or replayed keeps its place by its hold instead
  // (claim/order_hold.h), so entity_id stays empty.
  std::optional<std::string> order_key;
  std::string entity_id;
  bool in_key_line = false;  // in its biz_key's line (an entity's record joins it once first of its entity)
  // Waits for an entity's hold (its claim answered Held, or it waits in the
  // line of an entity whose first record does): not in the backpressure count.
  bool on_hold = false;
  std::string payload_hash;
  // The claim we hold (valid from Ready on).
  claim::RowKey row;
  uint32_t attempt = 0;
  std::string token;
  // Our lease on the claim runs at least until lease_from + claim.lease:
  // lease_from is when the statement that last set it was sent, learnt at
  // lease_known (a renewal sent after that covered the row too).
  std::chrono::steady_clock::time_point lease_from, lease_known;
  uint32_t calls = 0;
  // Calls made on earlier tiers (the retry topic's idemsink.attempt header).
  uint32_t calls_on_arrival = 0;
  // Calls that failed while the route's circuit was open, or were answered
  // with a pause (Retry-After): they do not count toward retry.max_attempts
  // (the remote was down or busy, not this record's fault).
  uint32_t uncounted_calls = 0;
  // Calls answered with a pause: uncounted only up to max_attempts, so a
  // record the remote pauses forever still ends.
  uint32_t held_calls = 0;
  // How long its failed calls have been held by the open circuit: after
  // route.circuit.max_wait of one open period they count again, so a record
  // the remote refuses for itself, probed alone on a quiet topic, still ends.
  CircuitWait circuit_wait;
  // The effect may already have happened: calls (this record's, an earlier
  // tier's or an earlier claim's) with an uncertain outcome, or a claim
  // taken over from an owner that died holding it.
  uint32_t uncertain_calls = 0;
  bool owner_died = false;
  std::string receipt;
  dlq::Reason refuse_reason = dlq::Reason::Permanent;  // DeadLettering only
  std::string last_error;
  // The database refused this record's row once (MariaDB's error): its next
  // write is stripped to what cannot be refused.
  std::string db_error;
  // The database refused the business write of a local_tx record (MariaDB's
  // error); its letter carries it, with the payload.
  std::string write_refused;
  int64_t first_failure_ms = 0;
  int64_t last_failure_ms = 0;
  uint64_t call_id = 0;
  /// The instance its call (or look-up) went to, held until the record
  /// ends: a reload's new instance takes only calls that start after it.
  std::shared_ptr<plugin::Instance> handler;
  std::chrono::steady_clock::time_point call_started;
  std::unique_ptr<boost::asio::steady_timer> timer;

  /// Plugins' error texts may hold any bytes: kept as valid UTF-8 (for the
  /// claim's text column, the DLQ header and the log), at most 1,024 bytes.
  void note_failure(std::string_view error) {
    last_error = sanitize_utf8(error, 1024);
    last_failure_ms = wall_clock_ms();
    if (first_failure_ms == 0) first_failure_ms = last_failure_ms;
  }
  /// The next step of its life (stage.h); a step not in the table is
  /// logged as a bug.
  void move_to(Stage to);
  bool maybe_applied() const { return uncertain_calls > 0 || owner_died; }
  /// The record as its route reads it (decoded where its formats say so).
  RecordView view() const { return RecordView::decoded(msg.get(), value_json, key_text); }
  claim::Outcome outcome() const { return claim::Outcome{row, attempt, calls, uncertain_calls, receipt, last_error}; }
  /// Where it came from: its partition's topic and partition, its offset.
  Source source() const;
};

/// The record as handed to a plugin; `headers` backs its header array.
idemsink_record abi_record(const Record& r, std::vector<idemsink_header>& headers);

}  // namespace idemsink::pipeline
