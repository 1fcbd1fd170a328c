#include "core/pipeline/engine.h"

#include <algorithm>
#include <future>
#include <set>
#include <thread>

#include "core/common/log.h"
#include "core/common/util.h"
#include "core/dlq/headers.h"
#include "core/pipeline/admission.h"

namespace idemsink::pipeline {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using claim::Status;
using claim::Verdict;

namespace {

// How long the producer waits for an unknown topic to appear before failing
// its records (librdkafka's topic.metadata.propagation.max.ms): the relay
// waits as long before believing a topic is missing.
std::chrono::milliseconds unknown_topic_patience(const config::KafkaConfig& k) {
  for (const auto* props : {&k.producer_properties, &k.properties})
    if (auto it = props->find("topic.metadata.propagation.max.ms"); it != props->end())
      return std::chrono::milliseconds(std::stoll(it->second));
  return 30s;
}

}  // namespace

Engine::Engine(asio::io_context& io, db::Pool& pool, const config::Config& cfg,
               std::vector<std::unique_ptr<Route>> routes, metrics::Metrics& metrics, std::string owner)
    : io_(io),
      pool_(pool),
      cfg_(cfg),
      metrics_(metrics),
      slice_(metrics.slice(cfg.database.label())),
      owner_(owner),
      store_(cfg.host.id, owner, cfg.claim.lease),
      outbox_(owner, std::max<std::chrono::milliseconds>(cfg.claim.lease, 120s)),
      routes_(std::move(routes)),
      health_(io, [this] { dispatcher_.pump(); }),
      local_tx_(
          io, pool, store_, outbox_, cfg.host.id, cfg.database.pool_size - 1, [this](uint64_t id) { return find(id); },
          [this](std::vector<LocalTxRunner::Result> results) { on_local_tx_results(std::move(results)); }),
      dispatcher_(
          io, pool, store_, cfg.host.max_in_flight, cfg.claim.lease, [this](uint64_t id) { return find(id); },
          [this](Record& r, idemsink_outcome o, std::string detail) { on_call_result(r, o, std::move(detail)); },
          [this](Record& r) {
            r.route->metrics->fenced.fetch_add(1, std::memory_order_relaxed);
            claimer_.claim(r);
          },
          [this](Route& route) { health_.want_fresh_probe(route); }, local_tx_),
      writer_(
          io, pool, cfg, store_, outbox_, [this](uint64_t id) { return find(id); },
          [this](const std::vector<OutcomeWriter::Written>& w) { on_written(w); }),
      relay_(
          io, pool, outbox_,
          [this](const std::string& route, size_t published, size_t failed) {
            // Rows of routes this host does not serve (renamed, another config) count nowhere.
            const auto it =
                std::find_if(routes_.begin(), routes_.end(), [&](const auto& r) { return r->cfg.name == route; });
            if (it == routes_.end()) return;
            metrics::RouteMetrics& m = *(*it)->metrics;
            m.dlq_published.fetch_add(published, std::memory_order_relaxed);
            m.dlq_publish_failures.fetch_add(failed, std::memory_order_relaxed);
          },
          [this](size_t refused) { slice_.dlq_set_aside.fetch_add(refused, std::memory_order_relaxed); },
          unknown_topic_patience(cfg.kafka)),
      claimer_(
          io, pool, store_, cfg, [this](uint64_t id) { return find(id); },
          [this](const Claimer::Claimed& c) { on_claimed(c); }),
      housekeeping_(io, pool, cfg, store_, outbox_, metrics, slice_),
      route_control_(io, pool, cfg.database, route_pointers(routes_)),
      commit_timer_(io),
      renew_timer_(io),
      relay_timer_(io),
      gauges_timer_(io),
      summary_timer_(io),
      moves_timer_(io) {
  // A feed per consumer group, in the order routes first name them.
  std::vector<std::pair<std::string, std::vector<Route*>>> groups;
  for (auto& r : routes_) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == r->cfg.group_id; });
    if (it == groups.end()) it = groups.insert(groups.end(), {r->cfg.group_id, {}});
    it->second.push_back(r.get());
  }
  for (auto& [group, routes] : groups) feeds_.push_back(std::make_unique<Feed>(*this, group, std::move(routes)));
}

Engine::Feed::Feed(Engine& e, std::string g, std::vector<Route*> rs)
    : engine(e),
      group(std::move(g)),
      routes(std::move(rs)),
      gate(static_cast<size_t>(e.cfg_.host.max_buffered_records)),
      offsets(group, e.cfg_.host.id),
      partitions(e.io_, e.cfg_, e.metrics_, gate, e.pool_, offsets, [&] {
        std::vector<const config::RouteConfig*> cfgs;
        for (Route* r : routes) cfgs.push_back(&r->cfg);
        return cfgs;
      }()) {
  std::set<std::string> release_topics;
  for (Route* r : routes) {
    r->gate = &gate;
    route_by_topic[r->cfg.topic] = {r, 0};
    for (size_t tier = 1; tier <= r->cfg.retry.topics.size(); ++tier) {
      route_by_topic[r->cfg.retry_topic(tier)] = {r, tier};
      // An ordered route's records wait for its retry tiers' records: those
      // must come in even when the waiting ones fill the buffer.
      if (r->cfg.order_by.enabled()) release_topics.insert(r->cfg.retry_topic(tier));
    }
  }
  gate.exempt_from_backpressure(std::move(release_topics));
}

void Engine::Feed::on_stall(const kafka::TopicPartition& tp, int64_t, int64_t) {
  asio::post(engine.io_, [this, tp] { partitions.stalled(tp); });
}

void Engine::Feed::on_commit_result(rd_kafka_resp_err_t err, const std::vector<kafka::TopicPartitionOffset>& offsets) {
  asio::post(engine.io_, [this, err, offsets] { partitions.commit_result(err, offsets); });
}

std::vector<Engine::FeedPlan> Engine::feeds() const {
  std::vector<FeedPlan> out;
  for (const auto& f : feeds_) {
    std::vector<std::string> topics;
    for (const auto& [topic, tr] : f->route_by_topic) topics.push_back(topic);
    out.push_back({f->group, std::move(topics), f.get()});
  }
  return out;
}

Engine::Feed& Engine::feed_of(const Route& route) {
  for (auto& f : feeds_)
    if (&f->gate == route.gate) return *f;
  throw std::logic_error("route " + route.cfg.name + " has no feed");
}

Engine::FeedPlan Engine::add_routes(std::vector<std::unique_ptr<Route>> routes) {
  const std::string group = routes.at(0)->cfg.group_id;
  for (const auto& f : feeds_)
    if (f->group == group) throw std::logic_error("add_routes: group " + group + " has a feed already");
  std::vector<Route*> added;
  for (auto& r : routes) {
    // Added back while a call of its removed self is still out: that call's
    // deadline stands, so the reconciler never takes it for one never sent.
    for (const auto& old : removed_routes_)
      if (old->cfg.name == r->cfg.name && old->live > 0 && old->cfg.call_timeout > r->cfg.call_timeout) {
        spdlog::warn("route {}: call_timeout stays {}ms while a call of the route as it was removed is out",
                     r->cfg.name, old->cfg.call_timeout.count());
        r->cfg.call_timeout = old->cfg.call_timeout;
      }
    added.push_back(r.get());
    routes_.push_back(std::move(r));
  }
  auto made = std::make_unique<Feed>(*this, group, added);
  Feed& feed = *made;
  {
    // The host's pause reaches the new feed too, however the two cross.
    std::lock_guard lk(feeds_mu_);
    feed.gate.set_operator_pause(operator_paused_);
    feeds_.push_back(std::move(made));
  }
  for (Route* r : added) {
    route_control_.add(r);
    housekeeping_.add_route(r->cfg, *r->metrics);
  }
  std::vector<std::string> topics;
  for (const auto& [topic, tr] : feed.route_by_topic) topics.push_back(topic);
  return {group, std::move(topics), &feed};
}

void Engine::attach_feed(const std::string& group, kafka::Consumer* consumer) {
  for (auto& f : feeds_)
    if (f->group == group) {
      f->consumer = consumer;
      f->gate.attach(consumer);
      f->partitions.attach(consumer);
      return;
    }
  throw std::logic_error("attach_feed: no feed of group " + group);
}

void Engine::remove_feed(const std::string& group) {
  auto feed = std::find_if(feeds_.begin(), feeds_.end(), [&](const auto& f) { return f->group == group; });
  if (feed == feeds_.end()) throw std::logic_error("remove_feed: no feed of group " + group);
  for (Route* r : (*feed)->routes) {
    route_control_.remove(r->cfg.name);
    health_.stop(*r);
    ++r->reloads;  // a change still waiting for its jobs is dropped
    r->held_for_reload = false;
    // Its instance goes with its last call (a record holds the one it called).
    if (r->live == 0) r->handler.reset();
    auto it = std::find_if(routes_.begin(), routes_.end(), [&](const auto& own) { return own.get() == r; });
    removed_routes_.push_back(std::move(*it));
    routes_.erase(it);
  }
  // Its consumer is closed and may be destroyed: nothing of the feed may
  // reach it any more (a store in flight commits nowhere).
  (*feed)->gate.attach(nullptr);
  (*feed)->partitions.attach(nullptr);
  {
    std::lock_guard lk(feeds_mu_);
    removed_feeds_.push_back(std::move(*feed));
    feeds_.erase(feed);
  }
  update_rate_shares();
}

bool Engine::holds_records_of(const std::string& group) const {
  for (const auto& f : removed_feeds_)
    if (f->group == group)
      for (const auto& [id, rec] : records_)
        if (rec->part->owner == &f->partitions) return true;
  return false;
}

void Engine::set_operator_pause(bool paused) {
  std::lock_guard lk(feeds_mu_);
  operator_paused_ = paused;
  for (auto& f : feeds_) f->gate.set_operator_pause(paused);
}

bool Engine::operator_paused() const {
  std::lock_guard lk(feeds_mu_);
  return operator_paused_;
}

Engine::~Engine() = default;

std::vector<Route*> Engine::route_pointers(const std::vector<std::unique_ptr<Route>>& routes) {
  std::vector<Route*> out;
  for (const auto& r : routes) out.push_back(r.get());
  return out;
}

std::shared_ptr<const config::Config> Engine::routes_config() const {
  auto out = std::make_shared<config::Config>(cfg_);
  out->routes.clear();
  for (const auto& r : routes_) out->routes.push_back(r->cfg);
  return out;
}

std::map<std::string, std::shared_ptr<plugin::Instance>> Engine::handlers() const {
  std::map<std::string, std::shared_ptr<plugin::Instance>> out;
  for (const auto& r : routes_) out[r->cfg.name] = r->handler;
  return out;
}

Record* Engine::find(uint64_t id) {
  auto it = records_.find(id);
  return it == records_.end() ? nullptr : it->second.get();
}

// ---------------------------------------------------------------- timers

void Engine::start(const std::vector<kafka::Consumer*>& consumers) {
  for (size_t i = 0; i < feeds_.size(); ++i) {
    feeds_[i]->consumer = consumers.at(i);
    feeds_[i]->gate.attach(consumers[i]);
    feeds_[i]->partitions.attach(consumers[i]);
  }
  // A failover to a replica may have lost the last outcomes: re-read them.
  pool_.on_server_changed([this](uint64_t, uint64_t) {
    asio::post(io_, [this] {
      for (auto& f : feeds_) f->partitions.recheck_stored();
    });
  });
  commit_timer_.start(cfg_.kafka.commit_interval, [this] {
    for (auto& f : feeds_) f->partitions.commit();
  });
  renew_timer_.start(std::max<std::chrono::milliseconds>(cfg_.claim.lease / 3, 100ms), [this] {
    if (renew_running_) return;
    renew_running_ = true;
    // Outbox rows in flight (waiting for the broker) keep their lease too.
    const std::vector<uint64_t> relay_in_flight = relay_.in_flight_ids();
    const auto sent = std::chrono::steady_clock::now();
    pool_.submit("renew leases", [this, relay_in_flight, sent](db::Connection& c) {
      store_.renew(c);
      outbox_.renew(c, relay_in_flight);
      asio::post(io_, [this, sent] {
        renew_running_ = false;
        // Every claim known before the renewal was sent is leased from then on
        // (dispatch checks it: no call on a lease that may have run out).
        for (auto& [id, rec] : records_)
          if (rec->lease_known <= sent && rec->lease_from < sent) rec->lease_from = sent;
      });
    });
  });
  relay_timer_.start(2s, [this] { relay_.kick(); });
  gauges_timer_.start(5s, [this] { refresh_gauges(); });
  moves_timer_.start(kMovesEvery, [this] { apply_offset_moves(); });
  summary_timer_.start(10s, [this] {
    if (hits_since_summary_ > 0)
      spdlog::info("idempotent hits in the last 10s: {} (already-done records skipped, as designed)",
                   hits_since_summary_);
    hits_since_summary_ = 0;
  });
  claimer_.start();
  housekeeping_.start();
  route_control_.start();
  relay_.kick();  // rows a previous run left unpublished
}

void Engine::refresh_gauges() {
  double lag = 0;
  int64_t buffered = 0, assigned = 0;
  bool paused = false;
  for (auto& f : feeds_) {
    lag += f->partitions.update_gauges();
    buffered += static_cast<int64_t>(f->gate.buffered());
    assigned += static_cast<int64_t>(f->partitions.assigned());
    paused = paused || f->gate.paused_all();
  }
  slice_.lag.store(lag);
  slice_.buffered.store(buffered);
  slice_.assigned_partitions.store(assigned);
  slice_.paused.store(paused ? 1 : 0);
  slice_.db_statements.store(pool_.statements());
  slice_.db_reconnects.store(pool_.reconnects());
  slice_.db_healthy.store(pool_.healthy() ? 1 : 0);
  slice_.db_jobs_failing.store(pool_.failing_jobs());
  slice_.set_db_job_failures(pool_.failures_by_job(), pool_.last_job_error());
}

// ---------------------------------------------------------------- consumer events

void Engine::on_messages(Feed& feed, kafka::Consumer::Batch batch) {
  // Buffered from here on: a pause must not wait for the engine thread to
  // reach these records.
  feed.gate.buffered_delta(static_cast<int64_t>(batch.messages.size()));
  auto shared = std::make_shared<kafka::Consumer::Batch>(std::move(batch));
  asio::post(io_, [this, &feed, shared] { ingest(feed, std::move(*shared)); });
}

void Engine::on_gap(Feed& feed, const kafka::Consumer::Gap& gap) {
  asio::post(io_, [this, &feed, gap] {
    if (auto lost = feed.partitions.hole(gap)) record_lost(feed, std::move(*lost));
  });
}

void Engine::record_lost(Feed& feed, Partitions::Lost lost) {
  // Written like a dead letter (an outbox row, never published), so the loss
  // is on record before the commit passes it; the range's first offset
  // stands for it in the partition's commit point until then.
  auto it = feed.route_by_topic.find(lost.part->tp.topic);
  if (it == feed.route_by_topic.end()) return;
  dlq::Letter d;
  d.purpose = dlq::Purpose::Lost;
  d.route = it->second.route->cfg.name;
  d.reason = dlq::to_string(dlq::Reason::DeletedByRetention);
  d.error = "offsets " + std::to_string(lost.from) + ".." + std::to_string(lost.to - 1) +
            " deleted by retention before the group read them";
  d.src_topic = lost.part->tp.topic;
  d.src_partition = lost.part->tp.partition;
  d.src_offset = lost.from;
  d.headers.push_back({dlq::headers::kLostTo, std::to_string(lost.to)});
  d.timestamp_ms = d.first_failure_ms = d.last_failure_ms = wall_clock_ms();
  d.host = cfg_.host.id;
  pool_.submit("record offsets lost to retention",
               [this, &feed, d = std::move(d), lost = std::move(lost)](db::Connection& c) mutable {
                 outbox_.insert(c, std::span<const dlq::Letter>(&d, 1));
                 asio::post(io_, [&feed, lost = std::move(lost)] {
                   lost.part->tracker.complete(lost.from);
                   feed.partitions.record_ended(*lost.part);
                 });
               });
}

void Engine::on_assigned(Feed& feed, const std::vector<kafka::TopicPartitionOffset>& starts) {
  // Group-shared rate limits need each topic's size; asked here, on the poll
  // thread, which the rebalance blocks anyway (the engine thread never waits
  // for the cluster).
  std::set<std::string> topics;
  for (Route* route : feed.routes)
    if (route->limiter.limited() && route->cfg.rate_limit.scope == "group")
      for (const auto& topic : route->topics()) topics.insert(topic);
  std::map<std::string, int> sizes;
  for (const auto& topic : topics)
    if (auto n = feed.consumer->partition_count(topic, 5000)) sizes[topic] = *n;
  std::promise<void> done;
  auto fut = done.get_future();
  asio::post(io_, [&] {
    for (const auto& [topic, n] : sizes) topic_sizes_[topic] = n;
    feed.partitions.assigned(starts);
    update_rate_shares();
    done.set_value();
  });
  fut.wait();
}

void Engine::update_rate_shares() {
  const auto now = std::chrono::steady_clock::now();
  for (const auto& route : routes_) {
    if (!route->limiter.limited() || route->cfg.rate_limit.scope != "group") continue;
    const auto topics = route->topics();
    int total = 0;
    bool known = true;
    for (const auto& t : topics) {
      auto it = topic_sizes_.find(t);
      if (it == topic_sizes_.end()) {
        known = false;
        break;
      }
      total += it->second;
    }
    const size_t owned = feed_of(*route).partitions.active_of(topics);
    // Sizes unknown (the cluster did not answer): the last share stands
    // (at first the whole rate), until an assignment reads them.
    if (!known || total == 0) {
      spdlog::warn("route {}: the partition counts of its topics are unknown; its rate limit share stays {:.2f}",
                   route->cfg.name, route->limiter.share());
      continue;
    }
    const double share = static_cast<double>(owned) / total;
    if (share != route->limiter.share())
      spdlog::info("route {}: this host owns {} of the route's {} partitions: {:.1f} of its {} calls per {}ms",
                   route->cfg.name, owned, total, route->cfg.rate_limit.rate * share, route->cfg.rate_limit.rate,
                   route->cfg.rate_limit.per.count());
    route->limiter.set_share(share, now);
    route->metrics->rate_limit.store(route->limiter.rate_per_second(), std::memory_order_relaxed);
  }
}

std::vector<kafka::TopicPartitionOffset> Engine::on_revoking(Feed& feed, const std::vector<kafka::TopicPartition>& tps,
                                                             bool lost) {
  auto done = std::make_shared<std::promise<std::vector<kafka::TopicPartitionOffset>>>();
  auto fut = done->get_future();
  asio::post(io_, [this, &feed, tps, lost, done] {
    // Stop taking new work of these partitions at once: records not yet
    // claimed are forgotten; claims held but not called are handed back.
    auto parts = feed.partitions.begin_revoke(tps);
    update_rate_shares();
    std::vector<claim::Outcome> to_release;
    std::vector<uint64_t> to_drop;
    for (auto& [id, rec] : records_) {
      if (!rec->part->revoked) continue;
      switch (rec->stage) {
        case Stage::Waiting:
        case Stage::Claim:
        case Stage::Busy: to_drop.push_back(id); break;
        case Stage::Ready:
        case Stage::Backoff:
          to_release.push_back(rec->outcome());
          to_drop.push_back(id);
          break;
        default: break;  // in a job or a call: wait for it, up to the grace period
      }
    }
    for (uint64_t id : to_drop)
      if (Record* r = find(id)) end_record(*r, false);
    // The places kept by records let go in these partitions: read again by
    // the next owner, their entities' other records may go on.
    for (const auto& part : parts)
      if (auto kept = kept_places_.extract(part.get()))
        for (const auto& [entity_id, id] : kept.mapped()) next_of_entity(entity_id, id);
    release_claims(std::move(to_release));
    writer_.flush();
    feed.partitions.await_drained(tps, std::move(parts), lost, std::move(*done));
  });
  return fut.get();
}

// ---------------------------------------------------------------- records

void Engine::ingest(Feed& feed, kafka::Consumer::Batch batch) {
  const int64_t now = wall_clock_ms();
  int64_t kept = 0;  // polled records that do not become pipeline records leave the buffer here
  for (auto& msg : batch.messages) {
    if (msg->err) {
      if (msg->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
        spdlog::warn("kafka: consume error on {}[{}]: {}", msg->rkt ? rd_kafka_topic_name(msg->rkt) : "?",
                     msg->partition, rd_kafka_message_errstr(msg.get()));
      continue;
    }
    const kafka::TopicPartition tp{rd_kafka_topic_name(msg->rkt), msg->partition};
    auto part = feed.partitions.active(tp);
    auto route_it = feed.route_by_topic.find(tp.topic);
    if (!part || route_it == feed.route_by_topic.end()) continue;  // fetched before a revoke
    const auto [route, tier] = route_it->second;
    format::DecodedRecord decoded;
    if (route->decoder) {
      decoded = route->decoder->decode(
          msg->payload ? std::optional(std::string_view(static_cast<const char*>(msg->payload), msg->len))
                       : std::nullopt,
          msg->key ? std::optional(std::string_view(static_cast<const char*>(msg->key), msg->key_len)) : std::nullopt);
      if (decoded.registry != nullptr) {
        // Not the partition's next record: take() says why it is passed
        // over (and re-reads the partition after a gap); it never takes it.
        if (!feed.partitions.next_in_line(*part, *msg, batch.seek_generation))
          feed.partitions.take(part, *msg, batch.seek_generation, tier > 0);
        else
          feed.partitions.wait_for_schema(part, msg->offset, *decoded.registry, decoded.schema_id);
        continue;
      }
    }
    if (!feed.partitions.take(part, *msg, batch.seek_generation, tier > 0)) continue;
    RecordView view = RecordView::raw(msg.get());
    if (decoded.value_json) view.value = *decoded.value_json;
    if (decoded.key_text) view.key = *decoded.key_text;
    // What the route does not take comes first: another route's replayed
    // copy, or a record [route.when] leaves out. It needs no key, no claim,
    // no pipeline record (a retry tier's record was taken already). A record
    // that does not decode is the route's to dead-letter unless a condition
    // that needs no value leaves it out.
    std::optional<std::string> undecodable = std::move(decoded.undecodable);
    const auto replayed_for = tier == 0 ? dlq::headers::replay_target(msg.get()) : std::nullopt;
    if (replayed_for && route->cfg.shares_topic_with(*replayed_for)) {
      skip(*route, *part, msg->offset);
      continue;
    }
    if (route->filter && tier == 0 && !replayed_for && !(undecodable && route->filter->condition().needs_json())) {
      auto decided = route->filter->decide(view);
      if (decided.verdict == RouteFilter::Verdict::Skip) {
        skip(*route, *part, msg->offset);
        continue;
      }
      if (decided.verdict == RouteFilter::Verdict::Undecodable && !undecodable) undecodable = std::move(decided.why);
    }
    ++kept;

    auto rec = std::make_unique<Record>();
    Record& r = *rec;
    r.id = next_id_++;
    r.route = route;
    r.tier = tier;
    r.part = part;
    r.offset = msg->offset;
    r.value_json = std::move(decoded.value_json);
    r.key_json = std::move(decoded.key_json);
    r.key_text = std::move(decoded.key_text);
    rd_kafka_timestamp_type_t ts_type;
    r.timestamp_ms = rd_kafka_message_timestamp(msg.get(), &ts_type);
    // Back from a retry topic: attempts continue where the last tier stopped.
    if (tier > 0) {
      r.calls = static_cast<uint32_t>(dlq::headers::integer(msg.get(), dlq::headers::kAttempt).value_or(0));
      r.calls_on_arrival = r.calls;
      r.uncertain_calls =
          static_cast<uint32_t>(dlq::headers::integer(msg.get(), dlq::headers::kUncertainCalls).value_or(0));
    }
    r.msg = std::move(msg);
    records_.emplace(r.id, std::move(rec));
    route->metrics->consumed.fetch_add(1, std::memory_order_relaxed);
    if (!health_.record_arrived(*route)) --kept;  // held for the circuit: out of the backpressure count at once

    if (undecodable) {
      refuse(r, dlq::Reason::UndecodableValue, std::move(*undecodable));
      continue;
    }
    auto admitted = admit(route->cfg, cfg_.claim, route->extractor, r.view(), r.timestamp_ms, now);
    if (auto* refusal = std::get_if<Refusal>(&admitted)) {
      refuse(r, refusal->reason, std::move(refusal->detail));
      continue;
    }
    r.biz_key = std::move(std::get<std::string>(admitted));
    if (route->order_extractor) {
      auto entity = admit_order_key(*route->order_extractor, r.view());
      if (auto* refusal = std::get_if<Refusal>(&entity)) {
        refuse(r, refusal->reason, std::move(refusal->detail));
        continue;
      }
      r.order_key = std::move(std::get<std::string>(entity));
      // A first delivery lines up behind its entity's records in memory; one
      // back from a retry topic, or replayed on a route that holds on dead
      // records, keeps its place by its hold (claim/order_hold.h).
      const bool by_hold = tier > 0 || (route->cfg.order_by.hold_on_dead() &&
                                        dlq::headers::integer(r.msg.get(), dlq::headers::kReplayed));
      if (!by_hold) r.entity_id = route->cfg.name + '\0' + *r.order_key;
    }
    // A decoded value's hash is of its data, not of its encoding: another
    // schema version of the same data is the same payload (docs/formats.md).
    r.payload_hash = r.value_json
                         ? payload_hash(decoded.value_canonical ? *decoded.value_canonical : *r.value_json)
                         : payload_hash(std::string_view(static_cast<const char*>(r.msg->payload), r.msg->len));
    r.key_id = route->cfg.name + '\0' + r.biz_key;
    // An entity's records line up by entity first, and only its first joins
    // its biz_key's line: a record must never wait in a key's line behind one
    // that waits for it (a retry copy behind a duplicate of itself, which
    // waits behind a record held by that very copy's hold).
    if (r.entity_id.empty() || entities_.push(r.entity_id, r.id)) {
      line_up_by_key(r);
    } else {
      r.move_to(Stage::Waiting);
      // Behind an entity's record that waits for a hold: waits for it too.
      if (const Record* first = find(entities_.line(r.entity_id).front()); first && first->on_hold)
        health_.put_on_hold(r);
    }
  }
  feed.gate.buffered_delta(kept - static_cast<int64_t>(batch.messages.size()));
}

void Engine::skip(Route& route, Partition& part, int64_t offset) {
  // Its outcome: skipped, durable as it is (the condition decides the same
  // on every read), its offset committed; the audit accounts it so too. It
  // never enters the pipeline, so it neither holds a place in the buffer nor
  // counts as a record an open circuit's probe could use.
  route.metrics->consumed.fetch_add(1, std::memory_order_relaxed);
  route.metrics->skipped.fetch_add(1, std::memory_order_relaxed);
  part.tracker.complete(offset);
  part.owner->record_ended(part);
}

void Engine::end_record(Record& r, bool durable) {
  if (durable) r.part->tracker.complete(r.offset);
  if (r.timer) r.timer->cancel();
  const std::shared_ptr<Partition> part = r.part;
  const std::string key_id = r.key_id;
  const std::string entity_id = r.entity_id;
  const bool in_key_line = r.in_key_line;
  // A record let go before its outcome was durable (durable == false while
  // its partition stays ours) keeps its entity's place: the records behind
  // it wait until the partition is revoked and read again in order.
  const bool keep_place = !durable && !entity_id.empty() && !part->revoked;
  const uint64_t id = r.id;
  Route& route = *r.route;
  const bool on_hold = r.on_hold;
  records_.erase(id);  // r is gone from here on
  health_.record_left(route, on_hold);
  if (in_key_line)
    if (auto next = keys_.remove(key_id, id))
      if (Record* n = find(*next); n && n->stage == Stage::Waiting) claimer_.claim(*n);
  if (keep_place) {
    kept_places_[part.get()].emplace_back(entity_id, id);
  } else if (!entity_id.empty()) {
    next_of_entity(entity_id, id);
  }
  part->owner->record_ended(*part);
}

void Engine::line_up_by_key(Record& r) {
  r.in_key_line = true;
  if (keys_.push(r.key_id, r.id)) {
    claimer_.claim(r);
  } else if (r.stage != Stage::Waiting) {
    r.move_to(Stage::Waiting);
  }
}

void Engine::next_of_entity(const std::string& entity_id, uint64_t id) {
  if (auto next = entities_.remove(entity_id, id))
    if (Record* n = find(*next); n && n->stage == Stage::Waiting) line_up_by_key(*n);
}

// ---------------------------------------------------------------- shutdown

void Engine::quiesce(std::chrono::steady_clock::time_point deadline) {
  // The consumer is closed: every partition was revoked and drained. Give the
  // DLQ relay one more cycle and outstanding database writes until the deadline.
  asio::post(io_, [this] { relay_.kick(); });
  for (;;) {
    std::promise<bool> idle;
    auto fut = idle.get_future();
    asio::post(io_, [&] { idle.set_value(relay_.idle() && writer_.idle() && !claimer_.jobs_running()); });
    if (fut.get() || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(20ms);
  }
  std::promise<void> stopped;
  auto fut = stopped.get_future();
  asio::post(io_, [&] {
    claimer_.stop();
    housekeeping_.stop();
    route_control_.stop();
    for (auto* t : {&commit_timer_, &renew_timer_, &relay_timer_, &gauges_timer_, &summary_timer_, &moves_timer_})
      t->stop();
    for (auto& [id, rec] : records_)
      if (rec->timer) rec->timer->cancel();
    dispatcher_.stop();
    for (auto& route : routes_) health_.stop(*route);
    stopped.set_value();
  });
  fut.wait();
}

// ---------------------------------------------------------------- the gate

Route* Engine::route_named(const std::string& name) {
  for (auto& r : routes_)
    if (r->cfg.name == name) return r.get();
  return nullptr;
}

void Engine::apply_offset_moves() {
  if (moves_reading_) return;
  moves_reading_ = true;
  std::vector<std::string> groups;
  for (const auto& f : feeds_) groups.push_back(f->group);
  pool_.submit(
      "read operators' offset moves",
      [this, groups](db::Connection& c) {
        std::vector<claim::OffsetMove> moves;
        for (const auto& g : groups)
          for (auto& m : claim::OffsetMoves::pending(c, g)) moves.push_back(std::move(m));
        asio::post(io_, [this, moves = std::move(moves)] {
          moves_reading_ = false;
          for (const auto& m : moves)
            for (auto& f : feeds_)
              if (f->group == m.group) f->partitions.move(m, owner_);
        });
      },
      [this](const db::DbError&) { asio::post(io_, [this] { moves_reading_ = false; }); });
}

void Engine::reconfigure(config::RouteConfig next, std::shared_ptr<plugin::Instance> handler,
                         std::function<void()> applied) {
  Route* route = route_named(next.name);
  if (route == nullptr) {  // gone meanwhile (a reload that failed part way): nothing to change
    spdlog::error("reload: route {} does not run here; its change is not applied", next.name);
    return applied();
  }
  // A local_tx route's settings are read by its apply jobs on database
  // workers: its calls stop starting, its jobs end, then they change.
  route->held_for_reload = true;
  const uint64_t number = ++route->reloads;
  auto change = [this, route, number, next = std::move(next), handler = std::move(handler),
                 applied = std::move(applied)]() mutable {
    // A later reload's change, waiting too, carries the whole route as its
    // file has it: this older one gives way (or the route was removed).
    if (route->reloads != number) return applied();
    const auto now = std::chrono::steady_clock::now();
    // Only the fields a reload may change (config/reload.h): the route's
    // name and topics are read by the admin port's threads meanwhile.
    config::RouteConfig& cfg = route->cfg;
    cfg.options = std::move(next.options);
    cfg.concurrency = next.concurrency;
    cfg.payload_check = next.payload_check;
    cfg.max_record_bytes = next.max_record_bytes;
    cfg.circuit = next.circuit;
    cfg.rate_limit = next.rate_limit;
    cfg.when = std::move(next.when);
    // Never lower (config/reload.cc): a call out under the longer deadline
    // must keep it, and the dispatcher's deadlines their call order.
    cfg.call_timeout = std::max(cfg.call_timeout, next.call_timeout);
    cfg.retry.max_attempts = next.retry.max_attempts;
    cfg.retry.backoff_initial = next.retry.backoff_initial;
    cfg.retry.backoff_max = next.retry.backoff_max;
    cfg.output = std::move(next.output);
    cfg.key_source = next.key_source;  // forced only
    cfg.key_header = std::move(next.key_header);
    cfg.key_json_path = std::move(next.key_json_path);
    route->filter.reset();
    if (cfg.when) route->filter.emplace(*cfg.when);
    route->extractor = KeyExtractor(cfg);
    route->circuit.set_config(cfg.circuit);
    route->limiter.set_config(cfg.rate_limit, now);
    if (handler) route->handler = std::move(handler);
    route->held_for_reload = false;
    update_rate_shares();
    dispatcher_.pump();
    applied();
  };
  when_idle(*route, std::move(change));
}

void Engine::when_idle(Route& route, std::function<void()> then) {
  if (!local_tx_.busy(route)) return then();
  // Its jobs end within a transaction's time: a short poll, never for long.
  auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(5));
  timer->async_wait([this, &route, timer, then = std::move(then)](boost::system::error_code ec) mutable {
    if (!ec) when_idle(route, std::move(then));
  });
}

RemoteGate::Answer Engine::try_call(const std::string& name) {
  Route* route = route_named(name);
  if (route == nullptr) return {Pass::Closed};  // removed by a reload: a round that began before waits
  // The route's budget as the dispatcher takes it, then the circuit: a
  // remote that is down is not called, but for the probe once it is due and
  // no record of the route has taken it (a route whose records all ended
  // unknown has none left to probe with: without this, nothing would ever
  // close its circuit, nor settle them).
  const auto now = std::chrono::steady_clock::now();
  if (!route->circuit.closed() && !route->circuit.probe_wanted()) return {Pass::Closed};
  if (!route->limiter.try_call(now)) return {Pass::Wait, route->limiter.next_call(now)};
  if (route->circuit.closed()) return {};
  const uint64_t probe = next_probe_id_++;
  route->circuit.admit(probe);
  return {Pass::Go, {}, probe};
}

void Engine::hold(const std::string& name, std::chrono::milliseconds pause) {
  if (Route* route = route_named(name)) health_.hold_route(*route, pause, "a reconcile call");
}

void Engine::probe_answered(const std::string& name, uint64_t probe, bool healthy) {
  if (Route* route = route_named(name)) {
    health_.note(*route, probe, !healthy, "a reconcile call");
    dispatcher_.pump();
  }
}

void Engine::probe_abandoned(const std::string& name, uint64_t probe) {
  if (Route* route = route_named(name)) route->circuit.call_abandoned(probe);
}

}  // namespace idemsink::pipeline
