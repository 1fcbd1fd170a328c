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
      health_(io, *this),
      local_tx_(io, pool, store_, outbox_, cfg.host.id, cfg.database.pool_size - 1, *this),
      dispatcher_(io, pool, store_, cfg.host.max_in_flight, cfg.claim.lease, *this, local_tx_),
      writer_(io, pool, cfg, store_, outbox_, *this),
      relay_counts_(*this),
      relay_(io, pool, outbox_, relay_counts_, unknown_topic_patience(cfg.kafka)),
      claimer_(io, pool, store_, cfg, *this),
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

void Engine::RelayCounts::published(const std::string& route, size_t published, size_t failed) {
  // Rows of routes this host does not serve (renamed, another config) count nowhere.
  const Route* r = engine.route_named(route);
  if (r == nullptr) return;
  metrics::RouteMetrics& m = *r->metrics;
  m.dlq_published.fetch_add(published, std::memory_order_relaxed);
  m.dlq_publish_failures.fetch_add(failed, std::memory_order_relaxed);
}

void Engine::RelayCounts::set_aside(size_t refused) {
  engine.slice_.dlq_set_aside.fetch_add(refused, std::memory_order_relaxed);
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

std::vector<Route*> Engine::route_pointers(const std::vector<std::unique_ptr<Route>>& routes) {
  std::vector<Route*> out;
  for (const auto& r : routes) out.push_back(r.get());
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
  // The statement count is read after the lag was computed and stored
  // before it: a scrape that reads the lag caught up (the lag comes first in
  // /metrics) reads the statements of the outcomes it counts, all but the
  // last job's few, which its worker adds just after posting the results.
  slice_.db_statements.store(pool_.statements());
  slice_.lag.store(lag);
  slice_.buffered.store(buffered);
  slice_.assigned_partitions.store(assigned);
  slice_.paused.store(paused ? 1 : 0);
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
    if (route->limiter.limited() && route->cfg.rate_limit.scope == config::RateScope::Group)
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
    if (!route->limiter.limited() || route->cfg.rate_limit.scope != config::RateScope::Group) continue;
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
