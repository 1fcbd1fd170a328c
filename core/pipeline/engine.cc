#include "core/pipeline/engine.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "core/common/fault.h"
#include "core/common/log.h"
#include "core/common/util.h"
#include "core/plugin/calls.h"
#include "core/plugin/tx.h"

namespace idemsink::pipeline {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using claim::Status;
using claim::Verdict;

namespace {

constexpr int kMaxClaimJobs = 2;
constexpr int kMaxFinishJobs = 2;
constexpr size_t kTxBatch = 100;
constexpr size_t kRelayBatch = 500;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Headers the host writes itself. Those of an earlier pass (a record replayed
// from a DLQ, or coming back from a retry topic) are replaced, not piled up;
// idemsink.origin.* survives so a retried record keeps its first position.
bool is_replaced_header(const char* name) {
  return std::strncmp(name, "idemsink.", 9) == 0 && std::strncmp(name, "idemsink.origin.", 16) != 0;
}

std::optional<int64_t> header_int(const rd_kafka_message_t* msg, const char* name) {
  rd_kafka_headers_t* hdrs = nullptr;
  const void* v = nullptr;
  size_t n = 0;
  if (rd_kafka_message_headers(msg, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR ||
      rd_kafka_header_get_last(hdrs, name, &v, &n) != RD_KAFKA_RESP_ERR_NO_ERROR || v == nullptr)
    return std::nullopt;
  int64_t out = 0;
  auto [p, ec] = std::from_chars(static_cast<const char*>(v), static_cast<const char*>(v) + n, out);
  if (ec != std::errc()) return std::nullopt;
  return out;
}

}  // namespace

struct Engine::Partition {
  kafka::TopicPartition tp;
  PartitionMetrics* metrics = nullptr;
  OffsetTracker tracker;
  bool revoked = false;
  int64_t last_sent = -1;  // commit point last sent to Kafka
  // Records polled before our last seek of this partition are stale.
  uint64_t seek_ticket = 0;
  // A retry-topic partition whose next record is not due yet is paused and
  // rewound to that record until this timer fires.
  std::unique_ptr<asio::steady_timer> hold_timer;
  bool stalled = false;  // the consumer reported a stall; cleared by the next record
};

struct Engine::Record {
  uint64_t id = 0;
  kafka::MessagePtr msg;
  Route* route = nullptr;
  size_t tier = 0;  // 0: consumed from the route's topic; N: from its retry topic N
  std::shared_ptr<Partition> part;
  int64_t offset = 0;
  int64_t timestamp_ms = 0;
  Stage stage = Stage::Claim;
  std::string biz_key;
  std::string key_id;  // empty: not in a key queue (refused before a key existed)
  std::string payload_hash;
  // The claim we hold (valid from Ready on).
  claim::RowKey row;
  uint32_t attempt = 0;
  std::string token;
  uint32_t calls = 0;
  std::string receipt;
  std::string refuse_reason;
  std::string last_error;
  int64_t first_failure_ms = 0;
  int64_t last_failure_ms = 0;
  uint64_t call_id = 0;
  std::chrono::steady_clock::time_point call_started;
  std::unique_ptr<asio::steady_timer> timer;

  void note_failure(std::string error) {
    last_error = std::move(error);
    last_failure_ms = now_ms();
    if (first_failure_ms == 0) first_failure_ms = last_failure_ms;
  }
};

struct Engine::RevokeWaiter {
  std::vector<kafka::TopicPartition> tps;
  std::vector<std::shared_ptr<Partition>> parts;  // this assignment's state of those partitions
  bool lost = false;
  std::promise<std::vector<kafka::TopicPartitionOffset>> promise;
  std::chrono::steady_clock::time_point deadline;
  std::unique_ptr<asio::steady_timer> timer;
};

Engine::Engine(asio::io_context& io, db::Pool& pool, const config::Config& cfg, std::vector<std::unique_ptr<Route>> routes,
               Metrics& metrics, std::string owner)
    : io_(io),
      pool_(pool),
      cfg_(cfg),
      metrics_(metrics),
      owner_(owner),
      gate_(static_cast<size_t>(cfg.host.max_buffered_records)),
      store_(cfg.host.id, owner, cfg.claim.lease),
      outbox_(owner, std::max<std::chrono::milliseconds>(cfg.claim.lease, 120s)),
      routes_(std::move(routes)),
      commit_timer_(io),
      renew_timer_(io),
      busy_timer_(io),
      linger_timer_(io),
      relay_timer_(io),
      gauges_timer_(io),
      summary_timer_(io) {
  for (auto& r : routes_) {
    route_by_topic_[r->cfg.topic] = {r.get(), 0};
    for (size_t tier = 1; tier <= r->cfg.retry.topics.size(); ++tier)
      route_by_topic_[r->cfg.retry.topic_name(r->cfg.topic, tier)] = {r.get(), tier};
  }
}

Engine::~Engine() = default;

std::map<std::string, plugin::Instance*> Engine::handlers() const {
  std::map<std::string, plugin::Instance*> out;
  for (const auto& r : routes_) out[r->cfg.name] = r->handler.get();
  return out;
}

// ---------------------------------------------------------------- plumbing

Engine::Record* Engine::find(uint64_t id) {
  auto it = records_.find(id);
  return it == records_.end() ? nullptr : it->second.get();
}

void Engine::post_once(bool& flag, std::function<void()> fn) {
  if (flag) return;
  flag = true;
  asio::post(io_, [&flag, fn = std::move(fn)] {
    flag = false;
    fn();
  });
}

void Engine::every(asio::steady_timer& t, std::chrono::milliseconds period, std::function<void()> fn) {
  t.expires_after(period);
  t.async_wait([this, &t, period, fn = std::move(fn)](boost::system::error_code ec) {
    if (ec || stopping_) return;
    fn();
    every(t, period, fn);
  });
}

void Engine::start(kafka::Consumer* consumer) {
  consumer_ = consumer;
  gate_.attach(consumer);
  every(commit_timer_, cfg_.kafka.commit_interval, [this] {
    commit_offsets();
  });
  every(renew_timer_, std::max<std::chrono::milliseconds>(cfg_.claim.lease / 3, 100ms), [this] {
    if (renew_running_) return;
    renew_running_ = true;
    // A relay cycle waiting for the broker keeps its outbox rows too.
    const bool relay_waiting = relay_running_ && relay_pending_ > 0;
    pool_.submit("renew leases", [this, relay_waiting](db::Connection& c) {
      store_.renew(c);
      if (relay_waiting) outbox_.renew(c);
      asio::post(io_, [this] { renew_running_ = false; });
    });
  });
  every(busy_timer_, cfg_.claim.wait_recheck, [this] {
    std::vector<uint64_t> busy;
    busy.swap(busy_);
    for (uint64_t id : busy)
      if (Record* r = find(id); r && r->stage == Stage::Busy) enqueue_claim(*r);
  });
  every(relay_timer_, 2s, [this] { relay_kick(); });
  every(gauges_timer_, 5s, [this] {
    update_partition_gauges();
    metrics_.buffered.store(static_cast<int64_t>(gate_.buffered()));
    metrics_.paused.store(gate_.paused_all() ? 1 : 0);
    metrics_.db_statements.store(pool_.statements());
    metrics_.db_reconnects.store(pool_.reconnects());
    metrics_.db_healthy.store(pool_.healthy() ? 1 : 0);
    if (gauges_running_) return;
    gauges_running_ = true;
    pool_.submit("gauges", [this](db::Connection& c) {
      const uint64_t pending = outbox_.pending(c);
      // The reconciler's definition: pending, nobody's lease, untouched for stuck_after.
      auto stuck = c.query("SELECT COUNT(*) FROM idemsink_claim WHERE status = 1 AND (owner IS NULL OR lease_until < "
                           "NOW(3)) AND updated_at < NOW(3) - INTERVAL " +
                           std::to_string(cfg_.claim.stuck_after.count() * 1000) + " MICROSECOND");
      asio::post(io_, [this, pending, n = std::stoll(*stuck[0][0])] {
        metrics_.dlq_pending.store(static_cast<int64_t>(pending));
        metrics_.stuck_pending.store(n);
        gauges_running_ = false;
      });
    });
  });
  every(summary_timer_, 10s, [this] {
    if (hits_since_summary_ > 0)
      spdlog::info("idempotent hits in the last 10s: {} (already-done records skipped, as designed)",
                   hits_since_summary_);
    hits_since_summary_ = 0;
  });
  relay_kick();  // rows a previous run left unpublished
}

// ---------------------------------------------------------------- ingest

void Engine::on_messages(kafka::Consumer::Batch batch) {
  // Buffered from here on: a pause must not wait for the engine thread to
  // reach these records.
  gate_.buffered_delta(static_cast<int64_t>(batch.messages.size()));
  auto shared = std::make_shared<kafka::Consumer::Batch>(std::move(batch));
  asio::post(io_, [this, shared] { ingest(std::move(*shared)); });
}

void Engine::on_gap(const kafka::Consumer::Gap& gap) {
  asio::post(io_, [this, gap] { apply_gap(gap); });
}

void Engine::apply_gap(const kafka::Consumer::Gap& gap) {
  auto it = partitions_.find(gap.tp);
  if (it == partitions_.end() || it->second->revoked) return;
  Partition& part = *it->second;
  if (!gap.absent) {
    part.metrics->skips_recovered.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // Only a hole that starts where this partition stands may be passed; one
  // found before our own seek of the partition (a retry hold) is stale.
  if (part.tracker.next_expected() != gap.from) return;
  part.tracker.skip_to(gap.to);
  part.metrics->gaps.fetch_add(1, std::memory_order_relaxed);
  spdlog::info("kafka: {}[{}] offsets {}..{} hold no records (a re-read confirmed it: transaction markers, "
               "compaction, or records deleted by retention); the commit passes them",
               gap.tp.topic, gap.tp.partition, gap.from, gap.to - 1);
}

void Engine::on_stall(const kafka::TopicPartition& tp, int64_t, int64_t) {
  asio::post(io_, [this, tp] {
    auto it = partitions_.find(tp);
    if (it == partitions_.end() || it->second->revoked || it->second->stalled) return;
    it->second->stalled = true;
    it->second->metrics->stalled.store(1);
    it->second->metrics->stalls.fetch_add(1, std::memory_order_relaxed);
  });
}

void Engine::ingest(kafka::Consumer::Batch batch) {
  // Polled records that do not become pipeline records leave the buffer here.
  int64_t kept = 0;
  const int64_t now = now_ms();
  const int64_t horizon_ms =
      now - int64_t{cfg_.claim.retention_days - cfg_.claim.horizon_margin_days} * 86'400'000;
  for (auto& msg : batch.messages) {
    if (msg->err) {
      if (msg->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
        spdlog::warn("kafka: consume error on {}[{}]: {}", msg->rkt ? rd_kafka_topic_name(msg->rkt) : "?",
                     msg->partition, rd_kafka_message_errstr(msg.get()));
      continue;
    }
    kafka::TopicPartition tp{rd_kafka_topic_name(msg->rkt), msg->partition};
    auto pit = partitions_.find(tp);
    if (pit == partitions_.end() || pit->second->revoked) continue;  // fetched before a revoke
    auto route_it = route_by_topic_.find(tp.topic);
    if (route_it == route_by_topic_.end()) continue;  // not subscribed; cannot happen
    Partition& part = *pit->second;
    if (batch.seek_generation < part.seek_ticket) continue;  // polled before our last seek of the partition
    switch (part.tracker.check(msg->offset)) {
      case OffsetTracker::Admit::Next:
        break;
      case OffsetTracker::Admit::Refetch:
        continue;
      case OffsetTracker::Admit::Gap:
        // The consumer delivers gap-free or reports the hole first; this
        // must never happen. Never commit over it: read the partition again.
        spdlog::error("kafka: {}[{}] jumped from offset {} to {} without a verified hole; re-reading from {}",
                      tp.topic, tp.partition, *part.tracker.next_expected(), msg->offset,
                      *part.tracker.next_expected());
        rewind(part, *part.tracker.next_expected());
        continue;
    }
    if (route_it->second.tier > 0) {
      const auto due = header_int(msg.get(), "idemsink.retry.due_ms");
      if (due && *due > now) {
        hold_partition(pit->second, msg->offset, *due);
        continue;
      }
    }
    part.tracker.add(msg->offset);
    if (part.stalled) {
      part.stalled = false;
      part.metrics->stalled.store(0);
      spdlog::info("kafka: {}[{}] is flowing again from offset {}", tp.topic, tp.partition, msg->offset);
    }

    auto rec = std::make_unique<Record>();
    Record& r = *rec;
    r.id = next_id_++;
    r.route = route_it->second.route;
    r.tier = route_it->second.tier;
    r.part = pit->second;
    r.offset = msg->offset;
    rd_kafka_timestamp_type_t ts_type;
    r.timestamp_ms = rd_kafka_message_timestamp(msg.get(), &ts_type);
    // Back from a retry topic: attempts continue where the last tier stopped.
    if (r.tier > 0) r.calls = static_cast<uint32_t>(header_int(msg.get(), "idemsink.attempt").value_or(0));
    r.msg = std::move(msg);
    records_.emplace(r.id, std::move(rec));
    ++kept;
    r.route->metrics->consumed.fetch_add(1, std::memory_order_relaxed);

    const config::RouteConfig& rc = r.route->cfg;
    if (static_cast<int64_t>(r.msg->len + r.msg->key_len) > rc.max_record_bytes) {
      refuse(r, "record_too_large",
             "record is " + std::to_string(r.msg->len + r.msg->key_len) + " bytes, route limit " +
                 std::to_string(rc.max_record_bytes));
      continue;
    }
    auto key = r.route->extractor.extract(r.msg.get());
    if (auto* problem = std::get_if<KeyProblem>(&key)) {
      refuse(r, problem->reason, problem->detail);
      continue;
    }
    r.biz_key = std::move(std::get<std::string>(key));
    if (r.biz_key.size() > 255) {
      refuse(r, "biz_key_too_long", "biz_key is " + std::to_string(r.biz_key.size()) + " bytes, the limit is 255");
      continue;
    }
    if (r.timestamp_ms < 0) {
      refuse(r, "missing_timestamp", "record has no timestamp; the claim partition cannot be chosen");
      continue;
    }
    if (r.timestamp_ms < horizon_ms) {
      refuse(r, "beyond_replay_horizon",
             "record timestamp is older than claim retention minus margin (" +
                 std::to_string(cfg_.claim.retention_days - cfg_.claim.horizon_margin_days) +
                 " days): its claim may have been dropped, so it cannot be de-duplicated");
      continue;
    }
    if (r.timestamp_ms > now + cfg_.claim.max_future_skew.count()) {
      refuse(r, "timestamp_in_future", "record timestamp is more than claim.max_future_skew ahead of this host's clock");
      continue;
    }
    r.payload_hash = payload_hash(std::string_view(static_cast<const char*>(r.msg->payload), r.msg->len));
    r.key_id = rc.name + '\0' + r.biz_key;
    auto& q = keys_[r.key_id];
    q.push_back(r.id);
    if (q.size() == 1) {
      enqueue_claim(r);
    } else {
      r.stage = Stage::Waiting;
    }
  }
  gate_.buffered_delta(kept - static_cast<int64_t>(batch.messages.size()));
}

void Engine::refuse(Record& r, std::string reason, std::string detail) {
  spdlog::warn("route {}: refusing {}[{}]@{}: {} ({})", r.route->cfg.name, r.part->tp.topic, r.part->tp.partition,
               r.offset, reason, detail);
  r.note_failure(std::move(detail));
  r.refuse_reason = std::move(reason);
  r.stage = Stage::DeadLettering;
  dead_letter_queue_.push_back(r.id);
  post_once(dead_letter_flush_scheduled_, [this] { flush_dead_letters(); });
}

void Engine::enqueue_claim(Record& r) {
  r.stage = Stage::Claim;
  claim_queue_.push_back(r.id);
  post_once(claim_flush_scheduled_, [this] { flush_claims(); });
}

void Engine::flush_claims() {
  const size_t batch_max = static_cast<size_t>(cfg_.kafka.max_poll_records);
  while (!claim_queue_.empty() && claim_jobs_ < kMaxClaimJobs) {
    std::vector<uint64_t> ids;
    std::vector<claim::ClaimRequest> reqs;
    while (!claim_queue_.empty() && ids.size() < batch_max) {
      const uint64_t id = claim_queue_.front();
      claim_queue_.pop_front();
      Record* r = find(id);
      if (r == nullptr || r->stage != Stage::Claim) continue;
      r->stage = Stage::Claiming;
      ids.push_back(id);
      claim::ClaimRequest q;
      q.key = claim::RowKey{r->route->cfg.name, r->biz_key, claim::bucket_of(r->timestamp_ms)};
      q.payload_hash = r->payload_hash;
      q.check_payload = r->route->cfg.payload_check;
      q.src_topic = r->part->tp.topic;
      q.src_partition = r->part->tp.partition;
      q.src_offset = r->offset;
      reqs.push_back(std::move(q));
    }
    if (ids.empty()) break;
    ++claim_jobs_;
    pool_.submit("claim batch", [this, ids = std::move(ids), reqs = std::move(reqs)](db::Connection& c) {
      auto results = store_.claim(c, reqs);
      fault::hit("after_claim_commit");
      asio::post(io_, [this, ids, results = std::move(results)] { on_claimed(ids, results); });
    });
  }
}

void Engine::on_claimed(const std::vector<uint64_t>& ids, const std::vector<claim::ClaimResult>& results) {
  --claim_jobs_;
  std::vector<claim::Outcome> to_release;
  for (size_t i = 0; i < ids.size(); ++i) {
    const claim::ClaimResult& res = results[i];
    Record* r = find(ids[i]);
    if (r == nullptr || r->part->revoked) {
      // The partition went away while we claimed: hand the claim back so the
      // next owner does not wait for our lease.
      if (res.verdict == Verdict::Owned) to_release.push_back(claim::Outcome{res.row, res.attempt, 0, {}, {}});
      if (r) drop(*r);
      continue;
    }
    RouteMetrics& m = *r->route->metrics;
    switch (res.verdict) {
      case Verdict::Owned:
        r->row = res.row;
        r->attempt = res.attempt;
        r->token = res.idem_token;
        m.claimed.fetch_add(1, std::memory_order_relaxed);
        if (res.taken_over) m.takeovers.fetch_add(1, std::memory_order_relaxed);
        if (res.taken_over && res.takeovers >= static_cast<uint32_t>(cfg_.claim.max_takeovers)) {
          fail(*r, Status::Failed, "crash_loop",
               "claim was taken over from a vanished owner " + std::to_string(res.takeovers) +
                   " times (claim.max_takeovers): the record may be killing its host");
        } else if (r->route->handler->kind() == IDEMSINK_KIND_REMOTE_AT_MOST_ONCE && res.previous_owner_vanished) {
          fail(*r, Status::Unknown, "owner_vanished",
               "the previous owner vanished while holding the claim; the effect may or may not have happened and "
               "an at-most-once handler is never called twice");
        } else {
          make_ready(*r);
        }
        break;
      case Verdict::Done:
      case Verdict::Terminal:
        m.duplicates.fetch_add(1, std::memory_order_relaxed);
        ++hits_since_summary_;
        spdlog::debug("route {}: idempotent hit for key {} ({}), offset {}", r->route->cfg.name, printable(r->biz_key),
                      claim::to_string(res.status), r->offset);
        retire(*r);
        break;
      case Verdict::Conflict:
        refuse(*r, "payload_conflict",
               "biz_key already claimed (" + std::string(claim::to_string(res.status)) +
                   ", token " + res.idem_token + ") with a different payload");
        break;
      case Verdict::Busy:
        m.busy_waits.fetch_add(1, std::memory_order_relaxed);
        r->stage = Stage::Busy;
        busy_.push_back(r->id);
        break;
    }
  }
  release_claims(std::move(to_release));
  pump();
  flush_claims();
  check_revokes();
}

// ---------------------------------------------------------------- calls

void Engine::make_ready(Record& r) {
  r.stage = Stage::Ready;
  r.route->ready.push_back(r.id);
}

void Engine::pump() {
  const int host_cap = cfg_.host.max_in_flight;
  bool progressed = true;
  while (progressed && in_flight_ < host_cap) {
    progressed = false;
    for (auto& route : routes_) {  // one per route per round: fair between routes
      const int cap = route->cfg.concurrency;
      while (!route->ready.empty() && in_flight_ < host_cap && (cap == 0 || route->in_flight < cap)) {
        const uint64_t id = route->ready.front();
        route->ready.pop_front();
        Record* r = find(id);
        if (r == nullptr || r->stage != Stage::Ready) continue;
        dispatch(*r);
        progressed = true;
        break;
      }
    }
  }
}

idemsink_record Engine::abi_record(const Record& r, std::vector<idemsink_header>& headers) const {
  headers.clear();
  rd_kafka_headers_t* hdrs = nullptr;
  if (rd_kafka_message_headers(r.msg.get(), &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
    const char* name;
    const void* value;
    size_t size;
    for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; ++i)
      headers.push_back({name, {static_cast<const char*>(value), value ? size : 0}});
  }
  idemsink_record rec{};
  rec.struct_size = sizeof rec;
  rec.route = r.route->cfg.name.c_str();
  rec.topic = r.part->tp.topic.c_str();
  rec.partition = r.part->tp.partition;
  rec.offset = r.offset;
  rec.timestamp_ms = r.timestamp_ms;
  rec.key = {static_cast<const char*>(r.msg->key), r.msg->key_len};
  rec.value = {static_cast<const char*>(r.msg->payload), r.msg->len};
  rec.biz_key = {r.biz_key.data(), r.biz_key.size()};
  rec.headers = headers.data();
  rec.header_count = headers.size();
  rec.idem_token = r.token.c_str();
  rec.attempt = r.calls;
  return rec;
}

void Engine::dispatch(Record& r) {
  Route& route = *r.route;
  r.stage = Stage::Calling;
  ++r.calls;
  ++route.in_flight;
  ++in_flight_;
  route.metrics->in_flight.fetch_add(1, std::memory_order_relaxed);
  r.call_started = std::chrono::steady_clock::now();
  if (route.handler->kind() == IDEMSINK_KIND_LOCAL_TX) {
    route.tx_batch.push_back(r.id);
    post_once(route.tx_flush_scheduled, [this, &route] { flush_local_tx(route); });
    return;
  }
  const uint64_t id = r.id;
  // The completion may arrive on any thread, before invoke returns, twice, or
  // never: the registry hands it over at most once, and only here.
  auto call_id_box = std::make_shared<std::atomic<uint64_t>>(0);
  const uint64_t call_id = plugin::CallRegistry::instance().add(
      [this, id, call_id_box](idemsink_outcome outcome, std::string detail) {
        asio::post(io_, [this, id, cid = call_id_box->load(), outcome, detail = std::move(detail)]() mutable {
          on_call_done(id, cid, outcome, std::move(detail));
        });
      },
      "route " + route.cfg.name + " offset " + std::to_string(r.offset));
  call_id_box->store(call_id);  // before invoke: only invoke hands the plugin its call_ctx
  r.call_id = call_id;
  r.timer = std::make_unique<asio::steady_timer>(io_, route.cfg.call_timeout);
  r.timer->async_wait([this, id, call_id](boost::system::error_code ec) {
    if (ec) return;
    if (!plugin::CallRegistry::instance().cancel(call_id)) return;  // completion already on its way
    Record* rec = find(id);
    if (rec == nullptr || rec->call_id != call_id) return;
    spdlog::warn("route {}: handler did not report within call_timeout for key {}; treating the call as uncertain",
                 rec->route->cfg.name, printable(rec->biz_key));
    on_call_result(*rec, IDEMSINK_OUTCOME_UNCERTAIN,
                   "no result within call_timeout " + std::to_string(rec->route->cfg.call_timeout.count()) + "ms");
  });
  std::vector<idemsink_header> headers;
  idemsink_record rec = abi_record(r, headers);
  route.handler->invoke(rec, call_id);
}

void Engine::on_call_done(uint64_t id, uint64_t call_id, idemsink_outcome outcome, std::string detail) {
  Record* r = find(id);
  if (r == nullptr || r->stage != Stage::Calling || r->call_id != call_id || call_id == 0) return;
  if (r->timer) r->timer->cancel();
  on_call_result(*r, outcome, std::move(detail));
}

void Engine::on_call_result(Record& r, idemsink_outcome outcome, std::string detail) {
  Route& route = *r.route;
  --route.in_flight;
  --in_flight_;
  route.metrics->in_flight.fetch_sub(1, std::memory_order_relaxed);
  route.metrics->handler_latency.observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - r.call_started).count());
  r.call_id = 0;
  switch (outcome) {
    case IDEMSINK_OUTCOME_OK:
      fault::hit("after_handler_ok");
      r.receipt = std::move(detail);
      r.stage = Stage::Finishing;
      done_queue_.push_back(r.id);
      if (done_queue_.size() >= static_cast<size_t>(cfg_.kafka.max_poll_records) || cfg_.claim.flush_linger.count() == 0) {
        post_once(finish_flush_scheduled_, [this] { flush_finishing(); });
      } else if (done_queue_.size() == 1) {
        linger_timer_.expires_after(cfg_.claim.flush_linger);
        linger_timer_.async_wait([this](boost::system::error_code ec) {
          if (!ec) flush_finishing();
        });
      }
      break;
    case IDEMSINK_OUTCOME_RETRYABLE:
      retry_or_fail(r, std::move(detail));
      break;
    case IDEMSINK_OUTCOME_UNCERTAIN:
      if (route.handler->kind() == IDEMSINK_KIND_REMOTE_AT_MOST_ONCE) {
        r.note_failure(detail);
        fail(r, Status::Unknown, "uncertain", std::move(detail));
      } else {
        retry_or_fail(r, std::move(detail));  // same idem_token: the remote de-duplicates
      }
      break;
    case IDEMSINK_OUTCOME_PERMANENT:
      r.note_failure(detail);
      fail(r, Status::Failed, "permanent", std::move(detail));
      break;
  }
  pump();
  check_revokes();
}

void Engine::hold_partition(const std::shared_ptr<Partition>& part, int64_t offset, int64_t due_ms) {
  gate_.hold(part->tp);
  rewind(*part, offset);
  const auto wait = std::chrono::milliseconds(std::max<int64_t>(0, due_ms - now_ms()));
  spdlog::debug("retry topic {}[{}]: record {} is due in {}ms; partition held", part->tp.topic, part->tp.partition,
                offset, wait.count());
  part->hold_timer = std::make_unique<asio::steady_timer>(io_, wait);
  part->hold_timer->async_wait([this, weak = std::weak_ptr<Partition>(part)](boost::system::error_code ec) {
    auto p = weak.lock();
    if (ec || !p || p->revoked) return;
    gate_.release(p->tp);
  });
}

void Engine::retry_or_fail(Record& r, std::string error) {
  r.note_failure(error);
  const config::RetryConfig& rc = r.route->cfg.retry;
  const bool by_topic = !rc.topics.empty();
  if (by_topic ? r.tier >= rc.topics.size() : r.calls >= static_cast<uint32_t>(rc.max_attempts)) {
    fail(r, Status::Failed, "retries_exhausted", std::move(error));
    return;
  }
  if (r.part->revoked) {
    // Not ours to retry any more: hand the claim to the partition's new owner.
    release_claims({outcome_of(r)});
    drop(r);
    return;
  }
  if (by_topic) {
    // Non-blocking retry: the record moves to the next retry topic (through
    // the outbox, so it is durable before the offset moves on) and the claim
    // is released for whoever consumes it there.
    r.route->metrics->retries.fetch_add(1, std::memory_order_relaxed);
    r.stage = Stage::Finishing;
    forward_queue_.push_back(r.id);
    post_once(forward_flush_scheduled_, [this] { flush_forwards(); });
    return;
  }
  r.route->metrics->retries.fetch_add(1, std::memory_order_relaxed);
  // Exponential backoff with full jitter, capped.
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const double exp = static_cast<double>(rc.backoff_initial.count()) * std::pow(2.0, r.calls - 1);
  const auto cap = static_cast<int64_t>(std::min<double>(exp, static_cast<double>(rc.backoff_max.count())));
  const auto wait = std::chrono::milliseconds(std::uniform_int_distribution<int64_t>(0, cap)(rng));
  spdlog::debug("route {}: key {} call {} failed ({}); retrying in {}ms", r.route->cfg.name, printable(r.biz_key),
                r.calls, error, wait.count());
  r.stage = Stage::Backoff;
  r.timer = std::make_unique<asio::steady_timer>(io_, wait);
  const uint64_t id = r.id;
  r.timer->async_wait([this, id](boost::system::error_code ec) {
    if (ec) return;
    Record* rec = find(id);
    if (rec == nullptr || rec->stage != Stage::Backoff) return;
    make_ready(*rec);
    pump();
  });
}

void Engine::flush_local_tx(Route& route) {
  const int max_jobs = std::max(1, cfg_.database.pool_size - 1);
  while (!route.tx_batch.empty() && route.tx_jobs < max_jobs) {
    const size_t n = std::min(route.tx_batch.size(), kTxBatch);
    std::vector<uint64_t> ids(route.tx_batch.begin(), route.tx_batch.begin() + static_cast<long>(n));
    route.tx_batch.erase(route.tx_batch.begin(), route.tx_batch.begin() + static_cast<long>(n));
    // The job reads the records' immutable message data from the database
    // thread. Records in stage Calling are never dropped or retired until the
    // job's result is back on this thread, so the pointers stay valid.
    std::vector<const Record*> recs;
    std::vector<claim::Outcome> outcomes;
    for (uint64_t id : ids) {
      const Record* r = find(id);
      recs.push_back(r);
      outcomes.push_back(outcome_of(*r));
    }
    ++route.tx_jobs;
    pool_.submit("local_tx apply", [this, &route, ids, recs, outcomes](db::Connection& c) {
      struct Result {
        idemsink_outcome outcome = IDEMSINK_OUTCOME_RETRYABLE;
        std::string detail;
        bool fenced = false;
      };
      std::vector<Result> results(ids.size());
      c.begin();
      const std::vector<bool> owned = store_.lock_owned(c, outcomes);
      std::vector<claim::Outcome> ok;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (!owned[i]) {
          results[i].fenced = true;
          continue;
        }
        c.execute("SAVEPOINT idemsink_record");
        idemsink_tx tx{&c};
        auto slot = std::make_shared<Result>();
        auto reported = std::make_shared<bool>(false);
        const uint64_t call_id = plugin::CallRegistry::instance().add(
            [slot, reported](idemsink_outcome o, std::string d) {
              slot->outcome = o;
              slot->detail = std::move(d);
              *reported = true;
            },
            "route " + route.cfg.name + " apply");
        std::vector<idemsink_header> headers;
        idemsink_record rec = abi_record(*recs[i], headers);
        route.handler->apply(rec, &tx, call_id);
        if (!*reported) {
          plugin::CallRegistry::instance().cancel(call_id);
          slot->outcome = IDEMSINK_OUTCOME_RETRYABLE;
          slot->detail = "apply returned without reporting a result";
        }
        if (tx.broken_code != 0) throw db::DbError(tx.broken_code, "local_tx apply: " + tx.broken_message);
        if (slot->outcome == IDEMSINK_OUTCOME_UNCERTAIN) slot->outcome = IDEMSINK_OUTCOME_RETRYABLE;  // rolled back
        if (slot->outcome == IDEMSINK_OUTCOME_OK) {
          claim::Outcome o = outcomes[i];
          o.receipt = slot->detail;
          ok.push_back(std::move(o));
        } else {
          c.execute("ROLLBACK TO SAVEPOINT idemsink_record");
        }
        results[i] = std::move(*slot);
      }
      const std::vector<bool> marked = store_.mark_done(c, ok);
      if (std::find(marked.begin(), marked.end(), false) != marked.end())
        throw db::DbError(0, "claim rows locked by this transaction could not be marked done");
      fault::hit("in_local_tx");
      c.commit();
      fault::hit("after_mark_done");
      asio::post(io_, [this, &route, ids, results = std::move(results)] {
        --route.tx_jobs;
        for (size_t i = 0; i < ids.size(); ++i) {
          Record* r = find(ids[i]);
          if (r == nullptr) continue;
          if (results[i].fenced) {
            // Done by an earlier run of this job whose reply was lost, or
            // taken over: claim again to learn which.
            --route.in_flight;
            --in_flight_;
            route.metrics->in_flight.fetch_sub(1, std::memory_order_relaxed);
            route.metrics->fenced.fetch_add(1, std::memory_order_relaxed);
            enqueue_claim(*r);
            continue;
          }
          if (results[i].outcome == IDEMSINK_OUTCOME_OK) {
            --route.in_flight;
            --in_flight_;
            route.metrics->in_flight.fetch_sub(1, std::memory_order_relaxed);
            route.metrics->handler_latency.observe(
                std::chrono::duration<double>(std::chrono::steady_clock::now() - r->call_started).count());
            r->receipt = results[i].detail;
            route.metrics->done.fetch_add(1, std::memory_order_relaxed);
            retire(*r);
          } else {
            on_call_result(*r, results[i].outcome, results[i].detail);
          }
        }
        flush_local_tx(route);
        pump();
        check_revokes();
      });
    });
  }
}

// ---------------------------------------------------------------- outcomes

claim::Outcome Engine::outcome_of(const Record& r) const {
  return claim::Outcome{r.row, r.attempt, r.calls, r.receipt, r.last_error};
}

claim::DeadLetter Engine::letter_of(const Record& r, const std::string& reason, const std::string& error) const {
  claim::DeadLetter d;
  d.route = r.route->cfg.name;
  d.dlq_topic = r.route->cfg.dlq.enabled ? r.route->cfg.dlq.topic : "";
  if (!r.biz_key.empty()) d.biz_key = r.biz_key;
  d.reason = reason;
  d.error = error;
  d.src_topic = r.part->tp.topic;
  d.src_partition = r.part->tp.partition;
  d.src_offset = r.offset;
  if (r.msg->key) d.key = std::string(static_cast<const char*>(r.msg->key), r.msg->key_len);
  if (r.msg->payload) d.value = std::string(static_cast<const char*>(r.msg->payload), r.msg->len);
  rd_kafka_headers_t* hdrs = nullptr;
  if (rd_kafka_message_headers(r.msg.get(), &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
    const char* name;
    const void* value;
    size_t size;
    for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; ++i) {
      // A record dead-lettered before (replayed from a DLQ) must not pile up
      // our headers: the new ones replace the old.
      if (is_replaced_header(name)) continue;
      claim::StoredHeader h{name, std::nullopt};
      if (value) h.value = std::string(static_cast<const char*>(value), size);
      d.headers.push_back(std::move(h));
    }
  }
  d.timestamp_ms = r.timestamp_ms < 0 ? now_ms() : r.timestamp_ms;
  d.idem_token = r.token;
  d.calls = r.calls;
  d.first_failure_ms = r.first_failure_ms ? r.first_failure_ms : now_ms();
  d.last_failure_ms = r.last_failure_ms ? r.last_failure_ms : d.first_failure_ms;
  d.host = cfg_.host.id;
  return d;
}

void Engine::fail(Record& r, Status status, std::string reason, std::string error) {
  if (r.first_failure_ms == 0) r.note_failure(error);
  r.last_error = std::move(error);
  r.stage = Stage::Finishing;
  if (status == Status::Unknown)
    spdlog::warn("route {}: key {} is unknown ({}): {}; parked for reconciliation, token {}", r.route->cfg.name,
                 printable(r.biz_key), reason, r.last_error, r.token);
  else
    spdlog::warn("route {}: key {} failed ({}): {}", r.route->cfg.name, printable(r.biz_key), reason, r.last_error);
  terminal_queue_.push_back(Terminal{r.id, status, std::move(reason)});
  post_once(finish_flush_scheduled_, [this] { flush_finishing(); });
}

void Engine::flush_finishing() {
  const size_t batch_max = static_cast<size_t>(cfg_.kafka.max_poll_records);
  while ((!done_queue_.empty() || !terminal_queue_.empty()) && finish_jobs_ < kMaxFinishJobs) {
    if (!done_queue_.empty()) {
      const size_t n = std::min(done_queue_.size(), batch_max);
      std::vector<uint64_t> ids(done_queue_.begin(), done_queue_.begin() + static_cast<long>(n));
      done_queue_.erase(done_queue_.begin(), done_queue_.begin() + static_cast<long>(n));
      std::vector<claim::Outcome> outcomes;
      for (uint64_t id : ids) outcomes.push_back(outcome_of(*find(id)));
      ++finish_jobs_;
      pool_.submit("mark done", [this, ids = std::move(ids), outcomes = std::move(outcomes)](db::Connection& c) {
        auto ok = store_.mark_done(c, outcomes);
        fault::hit("after_mark_done");
        asio::post(io_, [this, ids, ok = std::move(ok)] { on_finished(ids, ok, nullptr); });
      });
      continue;
    }
    const size_t n = std::min(terminal_queue_.size(), batch_max);
    std::vector<Terminal> terms(terminal_queue_.begin(), terminal_queue_.begin() + static_cast<long>(n));
    terminal_queue_.erase(terminal_queue_.begin(), terminal_queue_.begin() + static_cast<long>(n));
    std::vector<uint64_t> ids;
    std::vector<claim::Outcome> failed, unknown;
    std::vector<claim::DeadLetter> letters;
    for (const auto& t : terms) {
      const Record& r = *find(t.id);
      ids.push_back(t.id);
      (t.status == Status::Failed ? failed : unknown).push_back(outcome_of(r));
      letters.push_back(letter_of(r, t.reason, r.last_error));
    }
    ++finish_jobs_;
    pool_.submit("mark failed/unknown", [this, ids = std::move(ids), terms = std::move(terms), failed = std::move(failed),
                                         unknown = std::move(unknown),
                                         letters = std::move(letters)](db::Connection& c) {
      // The terminal state and the DLQ outbox row commit together: once the
      // offset moves past the record, its DLQ entry cannot be lost.
      c.begin();
      auto ok_failed = store_.mark_terminal(c, Status::Failed, failed);
      auto ok_unknown = store_.mark_terminal(c, Status::Unknown, unknown);
      std::vector<bool> ok;
      std::vector<claim::DeadLetter> keep;
      size_t fi = 0, ui = 0;
      for (size_t i = 0; i < terms.size(); ++i) {
        const bool k = terms[i].status == Status::Failed ? ok_failed[fi++] : ok_unknown[ui++];
        ok.push_back(k);
        if (k) keep.push_back(letters[i]);
      }
      outbox_.insert(c, keep);
      c.commit();
      asio::post(io_, [this, ids, ok = std::move(ok), terms] { on_finished(ids, ok, &terms); });
    });
  }
}

void Engine::on_finished(const std::vector<uint64_t>& ids, const std::vector<bool>& ok,
                         const std::vector<Terminal>* terms) {
  --finish_jobs_;
  bool any_dead = false;
  for (size_t i = 0; i < ids.size(); ++i) {
    Record* r = find(ids[i]);
    if (r == nullptr) continue;
    RouteMetrics& m = *r->route->metrics;
    if (!ok[i]) {
      // Fenced: our claim was taken over (our lease ran out or our host id
      // restarted elsewhere). Claim again: the new owner's result decides.
      m.fenced.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("route {}: claim on key {} was taken over before its outcome was recorded; re-checking",
                   r->route->cfg.name, printable(r->biz_key));
      enqueue_claim(*r);
      continue;
    }
    if (terms == nullptr) {
      m.done.fetch_add(1, std::memory_order_relaxed);
    } else {
      any_dead = true;
      ((*terms)[i].status == Status::Unknown ? m.unknown : m.dead).fetch_add(1, std::memory_order_relaxed);
    }
    retire(*r);
  }
  if (any_dead) relay_kick();
  flush_finishing();
  check_revokes();
}

void Engine::flush_dead_letters() {
  while (!dead_letter_queue_.empty() && dead_letter_jobs_ < kMaxFinishJobs) {
    const size_t n = std::min(dead_letter_queue_.size(), static_cast<size_t>(cfg_.kafka.max_poll_records));
    std::vector<uint64_t> ids(dead_letter_queue_.begin(), dead_letter_queue_.begin() + static_cast<long>(n));
    dead_letter_queue_.erase(dead_letter_queue_.begin(), dead_letter_queue_.begin() + static_cast<long>(n));
    std::vector<claim::DeadLetter> letters;
    for (uint64_t id : ids) {
      const Record& r = *find(id);
      letters.push_back(letter_of(r, r.refuse_reason, r.last_error));
    }
    ++dead_letter_jobs_;
    pool_.submit("dead-letter refused records", [this, ids = std::move(ids), letters = std::move(letters)](db::Connection& c) {
      outbox_.insert(c, letters);
      asio::post(io_, [this, ids] {
        --dead_letter_jobs_;
        for (uint64_t id : ids) {
          if (Record* r = find(id)) {
            r->route->metrics->dead.fetch_add(1, std::memory_order_relaxed);
            retire(*r);
          }
        }
        relay_kick();
        flush_dead_letters();
        check_revokes();
      });
    });
  }
}

void Engine::flush_forwards() {
  if (forward_queue_.empty()) return;
  std::vector<uint64_t> ids;
  ids.swap(forward_queue_);
  std::vector<claim::Outcome> releases;
  std::vector<claim::DeadLetter> letters;
  const int64_t now = now_ms();
  for (uint64_t id : ids) {
    const Record& r = *find(id);
    const config::RouteConfig& rc = r.route->cfg;
    releases.push_back(outcome_of(r));
    claim::DeadLetter d = letter_of(r, "retry", r.last_error);
    d.dlq_topic = rc.retry.topic_name(rc.topic, r.tier + 1);
    d.headers.push_back({"idemsink.retry.due_ms", std::to_string(now + rc.retry.topics[r.tier].count())});
    d.headers.push_back({"idemsink.retry.tier", std::to_string(r.tier + 1)});
    if (r.tier == 0) {
      d.headers.push_back({"idemsink.origin.topic", r.part->tp.topic});
      d.headers.push_back({"idemsink.origin.partition", std::to_string(r.part->tp.partition)});
      d.headers.push_back({"idemsink.origin.offset", std::to_string(r.offset)});
    }
    letters.push_back(std::move(d));
  }
  ++finish_jobs_;
  pool_.submit("forward to retry topics", [this, ids, releases = std::move(releases),
                                           letters = std::move(letters)](db::Connection& c) {
    c.begin();
    store_.release(c, releases);
    outbox_.insert(c, letters);
    c.commit();
    asio::post(io_, [this, ids] {
      --finish_jobs_;
      for (uint64_t id : ids)
        if (Record* r = find(id)) retire(*r);
      relay_kick();
      check_revokes();
    });
  });
}

void Engine::retire(Record& r) {
  r.part->tracker.complete(r.offset);
  const std::string key_id = r.key_id;
  const uint64_t id = r.id;
  records_.erase(id);  // r is gone from here on
  gate_.buffered_delta(-1);
  if (!key_id.empty()) {
    auto it = keys_.find(key_id);
    if (it != keys_.end()) {
      auto& q = it->second;
      q.erase(std::remove(q.begin(), q.end(), id), q.end());
      if (q.empty()) {
        keys_.erase(it);
      } else if (Record* next = find(q.front()); next && next->stage == Stage::Waiting) {
        enqueue_claim(*next);
      }
    }
  }
}

void Engine::drop(Record& r) {
  // Same bookkeeping as retire, without marking the offset durable: the
  // record belongs to a revoked partition and its next owner will see it.
  const std::string key_id = r.key_id;
  const uint64_t id = r.id;
  records_.erase(id);
  gate_.buffered_delta(-1);
  if (!key_id.empty()) {
    auto it = keys_.find(key_id);
    if (it != keys_.end()) {
      auto& q = it->second;
      const bool was_head = !q.empty() && q.front() == id;
      q.erase(std::remove(q.begin(), q.end(), id), q.end());
      if (q.empty()) {
        keys_.erase(it);
      } else if (was_head) {
        if (Record* next = find(q.front()); next && next->stage == Stage::Waiting) enqueue_claim(*next);
      }
    }
  }
}

void Engine::release_claims(std::vector<claim::Outcome> outcomes) {
  if (outcomes.empty()) return;
  pool_.submit("release claims", [this, outcomes = std::move(outcomes)](db::Connection& c) { store_.release(c, outcomes); });
}

// ---------------------------------------------------------------- offsets & rebalance

void Engine::commit_offsets() {
  // librdkafka < 2.10 declares the whole assignment lost when a commit meets
  // ILLEGAL_GENERATION mid-rebalance (its issue #4059). Once a commit says a
  // rebalance is in progress, wait for the rebalance callback (where
  // revoked partitions are committed anyway), but never longer than 10s.
  if (std::chrono::steady_clock::now() < commits_held_until_) return;
  std::vector<kafka::TopicPartitionOffset> offsets;
  for (auto& [tp, part] : partitions_) {
    if (part->revoked) continue;
    auto cp = part->tracker.commit_point();
    if (cp && *cp > part->last_sent) {
      offsets.push_back({tp, *cp});
      part->last_sent = *cp;
    }
  }
  if (offsets.empty() || consumer_ == nullptr) return;
  metrics_.commits.fetch_add(1, std::memory_order_relaxed);
  consumer_->commit_async(offsets);
}

void Engine::on_commit_result(rd_kafka_resp_err_t err, const std::vector<kafka::TopicPartitionOffset>& offsets) {
  if (!err) {
    for (const auto& o : offsets) metrics_.partition(o.tp.topic, o.tp.partition).committed.store(o.offset);
    return;
  }
  if (err == RD_KAFKA_RESP_ERR__NO_OFFSET) return;
  metrics_.commit_failures.fetch_add(1, std::memory_order_relaxed);
  const bool rebalancing = err == RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS;
  if (rebalancing)
    spdlog::info("kafka: offset commit deferred: the group is rebalancing");
  else
    spdlog::warn("kafka: offset commit failed: {}; it will be sent again", rd_kafka_err2str(err));
  asio::post(io_, [this, offsets, rebalancing] {
    if (rebalancing) commits_held_until_ = std::chrono::steady_clock::now() + 10s;
    for (const auto& o : offsets) {
      auto it = partitions_.find(o.tp);
      if (it != partitions_.end() && it->second->last_sent == o.offset) it->second->last_sent = -1;
    }
  });
}

void Engine::on_assigned(const std::vector<kafka::TopicPartitionOffset>& starts) {
  std::promise<void> done;
  auto fut = done.get_future();
  asio::post(io_, [&] {
    commits_held_until_ = {};  // the rebalance got this far: commits carry the new generation
    std::vector<kafka::TopicPartition> tps;
    for (const auto& [tp, offset] : starts) {
      auto p = std::make_shared<Partition>();
      p->tp = tp;
      p->metrics = &metrics_.partition(tp.topic, tp.partition);
      p->metrics->assigned.store(true);
      p->metrics->committed.store(offset);
      p->metrics->stalled.store(0);
      if (offset >= 0) {
        // Records must start here (the group's committed offset, or where
        // auto.offset.reset starts); until one arrives this is also the
        // partition's commit point, and its lag is measured from it.
        p->tracker.start_at(offset);
        p->last_sent = offset;
      }
      partitions_[tp] = p;
      tps.push_back(tp);
    }
    gate_.assigned(tps);
    update_partition_gauges();
    metrics_.assigned_partitions.store(static_cast<int64_t>(partitions_.size()));
    done.set_value();
  });
  fut.wait();
}

std::vector<kafka::TopicPartitionOffset> Engine::on_revoking(const std::vector<kafka::TopicPartition>& tps, bool lost) {
  auto waiter = std::make_unique<RevokeWaiter>();
  waiter->tps = tps;
  waiter->lost = lost;
  auto fut = waiter->promise.get_future();
  asio::post(io_, [this, w = waiter.release()]() mutable {
    std::unique_ptr<RevokeWaiter> waiter(w);
    commits_held_until_ = {};
    // Stop taking new work of these partitions at once: records not yet
    // claimed are forgotten; claims held but not called are handed back.
    std::vector<claim::Outcome> to_release;
    std::vector<uint64_t> to_drop;
    for (const auto& tp : waiter->tps) {
      auto it = partitions_.find(tp);
      if (it == partitions_.end()) continue;
      it->second->revoked = true;
      waiter->parts.push_back(it->second);
    }
    for (auto& [id, rec] : records_) {
      if (!rec->part->revoked) continue;
      switch (rec->stage) {
        case Stage::Waiting:
        case Stage::Claim:
        case Stage::Busy:
          to_drop.push_back(id);
          break;
        case Stage::Ready:
        case Stage::Backoff:
          to_release.push_back(outcome_of(*rec));
          to_drop.push_back(id);
          break;
        default:
          break;  // in a job or a call: wait for it, up to the grace period
      }
    }
    for (uint64_t id : to_drop)
      if (Record* r = find(id)) {
        if (r->timer) r->timer->cancel();
        drop(*r);
      }
    release_claims(std::move(to_release));
    waiter->deadline = std::chrono::steady_clock::now() + cfg_.host.shutdown_grace;
    waiter->timer = std::make_unique<asio::steady_timer>(io_, cfg_.host.shutdown_grace);
    waiter->timer->async_wait([this](boost::system::error_code ec) {
      if (!ec) check_revokes();
    });
    revokes_.push_back(std::move(waiter));
    flush_finishing();
    check_revokes();
  });
  return fut.get();
}

void Engine::rewind(Partition& part, int64_t offset) { part.seek_ticket = consumer_->seek({part.tp, offset}); }

void Engine::update_partition_gauges() {
  int64_t total = 0;
  for (const auto& [tp, part] : partitions_) {
    const auto w = consumer_ ? consumer_->watermarks(tp) : std::nullopt;
    if (!w) continue;
    // Before a record arrives the commit point is the group's committed
    // offset; with neither, everything Kafka still has is behind.
    const int64_t lag = std::max<int64_t>(0, w->high - part->tracker.commit_point().value_or(w->low));
    part->metrics->high_watermark.store(w->high);
    part->metrics->lag.store(lag);
    total += lag;
  }
  metrics_.lag.store(total);
}

void Engine::check_revokes() {
  if (revokes_.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  for (auto it = revokes_.begin(); it != revokes_.end();) {
    RevokeWaiter& w = **it;
    // Records of an earlier assignment of the same partition (past their
    // grace then) do not hold this revocation up.
    size_t active = 0;
    for (const auto& [id, rec] : records_)
      if (std::find(w.parts.begin(), w.parts.end(), rec->part) != w.parts.end()) ++active;
    if (active > 0 && now < w.deadline) {
      ++it;
      continue;
    }
    if (active > 0)
      spdlog::warn("kafka: {} record(s) of {} still in flight after shutdown_grace; letting the partitions go (their "
                   "claims fence any late completion)",
                   active, kafka::describe(w.tps));
    std::vector<kafka::TopicPartitionOffset> offsets;
    for (const auto& tp : w.tps) {
      auto pit = partitions_.find(tp);
      if (pit == partitions_.end()) continue;
      auto cp = pit->second->tracker.commit_point();
      if (!w.lost && cp && *cp > pit->second->last_sent) offsets.push_back({tp, *cp});
      pit->second->metrics->assigned.store(false);
      partitions_.erase(pit);
      gate_.revoked({tp});
    }
    metrics_.assigned_partitions.store(static_cast<int64_t>(partitions_.size()));
    if (w.timer) w.timer->cancel();
    w.promise.set_value(std::move(offsets));
    it = revokes_.erase(it);
  }
}

void Engine::set_operator_pause(bool paused) { gate_.set_operator_pause(paused); }

// ---------------------------------------------------------------- DLQ relay

void Engine::relay_kick() {
  if (producer_ == nullptr) return;
  if (relay_running_) {
    relay_again_ = true;
    return;
  }
  if (std::chrono::steady_clock::now() < relay_not_before_) return;
  relay_running_ = true;
  relay_again_ = false;
  pool_.submit("dlq relay take", [this](db::Connection& c) {
    auto letters = outbox_.take(c, kRelayBatch);
    asio::post(io_, [this, letters = std::move(letters)]() mutable { on_relay_taken(std::move(letters)); });
  });
}

void Engine::set_producer_factory(ProducerFactory f) {
  producer_factory_ = std::move(f);
  producer_ = producer_factory_();
}

void Engine::on_relay_taken(std::vector<claim::DeadLetter> letters) {
  relay_taken_ = letters.size();
  if (producer_->fatal()) {
    spdlog::warn("recreating the DLQ producer after its fatal error");
    producer_ = producer_factory_();
  }
  if (letters.empty()) {
    relay_running_ = false;
    if (relay_again_) relay_kick();
    return;
  }
  relay_outstanding_.clear();
  std::vector<uint64_t> disabled;
  for (const auto& d : letters) {
    if (d.dlq_topic.empty()) {  // DLQ publishing disabled for the route: the outbox row is the record
      disabled.push_back(d.id);
      continue;
    }
    relay_outstanding_[d.id] = Delivery::Pending;
  }
  relay_pending_ = relay_outstanding_.size();
  for (const auto& d : letters) {
    if (d.dlq_topic.empty()) continue;
    kafka::OutRecord rec;
    rec.topic = d.dlq_topic;
    rec.key = d.key;
    rec.value = d.value;
    rec.timestamp_ms = d.timestamp_ms;
    rec.id = d.id;
    for (const auto& h : d.headers) rec.headers.push_back({h.name, h.value});
    auto add = [&](const char* name, const std::string& v) { rec.headers.push_back({name, v}); };
    add("idemsink.source.topic", d.src_topic);
    add("idemsink.source.partition", std::to_string(d.src_partition));
    add("idemsink.source.offset", std::to_string(d.src_offset));
    add("idemsink.route", d.route);
    add("idemsink.reason", d.reason);
    add("idemsink.error", d.error);
    add("idemsink.attempt", std::to_string(d.calls));
    if (!d.idem_token.empty()) add("idemsink.idem_token", d.idem_token);
    if (d.biz_key) add("idemsink.biz_key", *d.biz_key);
    add("idemsink.first_failure_ms", std::to_string(d.first_failure_ms));
    add("idemsink.last_failure_ms", std::to_string(d.last_failure_ms));
    add("idemsink.host", d.host);
    add("idemsink.outbox_id", std::to_string(d.id));
    producer_->produce(rec);
  }
  if (relay_outstanding_.empty()) {
    pool_.submit("dlq relay mark", [this, disabled](db::Connection& c) {
      outbox_.mark_published(c, disabled);
      asio::post(io_, [this] {
        relay_running_ = false;
        relay_kick();
      });
    });
  } else if (!disabled.empty()) {
    pool_.submit("dlq relay mark", [this, disabled](db::Connection& c) { outbox_.mark_published(c, disabled); });
  }
}

void Engine::on_dlq_delivery(uint64_t outbox_id, rd_kafka_resp_err_t err) {
  asio::post(io_, [this, outbox_id, err] { on_relay_delivered(outbox_id, err); });
}

void Engine::on_relay_delivered(uint64_t outbox_id, rd_kafka_resp_err_t err) {
  auto it = relay_outstanding_.find(outbox_id);
  if (it == relay_outstanding_.end() || it->second != Delivery::Pending) return;
  if (err) {
    metrics_.dlq_publish_failures.fetch_add(1, std::memory_order_relaxed);
    if (relay_first_error_.empty()) relay_first_error_ = rd_kafka_err2str(err);
    it->second = Delivery::Failed;
  } else {
    it->second = Delivery::Ok;
  }
  if (--relay_pending_ > 0) return;
  // Every record of this cycle has its report: stamp the delivered ones.
  std::vector<uint64_t> published;
  for (const auto& [id, state] : relay_outstanding_)
    if (state == Delivery::Ok) published.push_back(id);
  const bool failures = published.size() < relay_outstanding_.size();
  metrics_.dlq_published.fetch_add(published.size(), std::memory_order_relaxed);
  relay_failures_in_a_row_ = failures ? relay_failures_in_a_row_ + 1 : 0;
  if (failures) {
    const auto wait = std::chrono::milliseconds(std::min<int64_t>(30'000, 500LL << std::min(relay_failures_in_a_row_, 6)));
    relay_not_before_ = std::chrono::steady_clock::now() + wait;
    spdlog::warn("DLQ publish failed for {} of {} outbox rows ({}); they stay in the outbox, next attempt in {}ms",
                 relay_outstanding_.size() - published.size(), relay_outstanding_.size(), relay_first_error_,
                 wait.count());
  }
  relay_first_error_.clear();
  relay_outstanding_.clear();
  pool_.submit("dlq relay mark", [this, published = std::move(published)](db::Connection& c) {
    outbox_.mark_published(c, published);
    asio::post(io_, [this] {
      relay_running_ = false;
      if (relay_again_ || relay_taken_ == kRelayBatch) relay_kick();
    });
  });
}

// ---------------------------------------------------------------- shutdown

void Engine::quiesce(std::chrono::steady_clock::time_point deadline) {
  // The consumer is closed: every partition was revoked and drained. Give the
  // DLQ relay one more cycle and outstanding database writes until the deadline.
  asio::post(io_, [this] { relay_kick(); });
  for (;;) {
    std::promise<bool> idle;
    auto fut = idle.get_future();
    asio::post(io_, [&] {
      idle.set_value(!relay_running_ && finish_jobs_ == 0 && dead_letter_jobs_ == 0 && claim_jobs_ == 0);
    });
    if (fut.get() || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(20ms);
  }
  std::promise<void> stopped;
  auto fut = stopped.get_future();
  asio::post(io_, [&] {
    stopping_ = true;
    for (auto* t : {&commit_timer_, &renew_timer_, &busy_timer_, &linger_timer_, &relay_timer_, &gauges_timer_,
                    &summary_timer_})
      t->cancel();
    for (auto& [id, rec] : records_)
      if (rec->timer) rec->timer->cancel();
    stopped.set_value();
  });
  fut.wait();
}

}  // namespace idemsink::pipeline
