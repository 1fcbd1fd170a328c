#include "core/pipeline/partitions.h"

#include <algorithm>

#include "core/common/log.h"
#include "core/dlq/headers.h"
#include "core/kafka/watermarks.h"

namespace idemsink::pipeline {

namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {
// How long a revocation waits for its offsets to reach the database.
constexpr auto kStoreOnRevokeFor = std::chrono::seconds(5);

}  // namespace

Partitions::Partitions(asio::io_context& io, const config::Config& cfg, metrics::Metrics& metrics, FetchGate& gate,
                       db::Pool& pool, const claim::OffsetStore& offsets,
                       const std::vector<const config::RouteConfig*>& routes)
    : io_(io), cfg_(cfg), metrics_(metrics), gate_(gate), pool_(pool), offsets_(offsets) {
  bool consumer_latest = false;
  for (const auto* props : {&cfg.kafka.properties, &cfg.kafka.consumer_properties})
    if (auto it = props->find("auto.offset.reset"); it != props->end())
      consumer_latest = it->second == "latest" || it->second == "largest" || it->second == "end";
  for (const config::RouteConfig* rc : routes) {
    if (rc->start_at == config::StartAt::Unset ? consumer_latest : rc->start_at == config::StartAt::Latest)
      latest_topics_.insert(rc->topic);
    for (const auto& topic : rc->topics()) route_of_topic_[topic] = TopicOf{rc->name, &metrics.route(rc->name)};
  }
}

void Partitions::count_commit(const std::vector<kafka::TopicPartitionOffset>& offsets, bool failed) {
  std::set<metrics::RouteMetrics*> routes;
  for (const auto& o : offsets)
    if (auto it = route_of_topic_.find(o.tp.topic); it != route_of_topic_.end()) routes.insert(it->second.metrics);
  for (metrics::RouteMetrics* m : routes)
    (failed ? m->commit_failures : m->commits).fetch_add(1, std::memory_order_relaxed);
}

size_t Partitions::active_of(const std::vector<std::string>& topics) const {
  size_t n = 0;
  for (const auto& [tp, p] : parts_)
    n += !p->revoked && std::find(topics.begin(), topics.end(), tp.topic) != topics.end();
  return n;
}

std::shared_ptr<Partition> Partitions::active(const kafka::TopicPartition& tp) const {
  auto it = parts_.find(tp);
  if (it == parts_.end() || it->second->revoked) return nullptr;
  return it->second;
}

void Partitions::store(std::vector<kafka::TopicPartitionOffset> offsets, std::function<void(bool)> then) {
  std::vector<claim::StoredOffset> rows;
  for (const auto& o : offsets) rows.push_back({o.tp.topic, o.tp.partition, o.offset});
  pool_.submit(
      "store offsets",
      [this, rows = std::move(rows), then](db::Connection& c) {
        // Computed against the server the partitions read their start from:
        // on another one (a failover), writing them would hide what it lost.
        const uint64_t known = server_id_.load();
        if (known != 0 && c.server_id() != known) {
          asio::post(io_, [this, then] {
            then(false);
            recheck_stored();
          });
          return;
        }
        offsets_.write(c, rows);
        asio::post(io_, [then] { then(true); });
      },
      [this, then](const db::DbError& e) {
        spdlog::error("storing offsets in the database gave up: {}", e.what());
        asio::post(io_, [then] { then(false); });
      });
}

std::vector<std::shared_ptr<Partition>> Partitions::begin_revoke(const std::vector<kafka::TopicPartition>& tps) {
  rebalance_reached();
  std::vector<std::shared_ptr<Partition>> out;
  for (const auto& tp : tps) {
    auto it = parts_.find(tp);
    if (it == parts_.end()) continue;
    it->second->revoked = true;
    out.push_back(it->second);
  }
  return out;
}

void Partitions::await_drained(std::vector<kafka::TopicPartition> tps, std::vector<std::shared_ptr<Partition>> parts,
                               bool lost, std::promise<std::vector<kafka::TopicPartitionOffset>> done) {
  auto d = std::make_unique<Drain>();
  d->tps = std::move(tps);
  d->parts = std::move(parts);
  d->lost = lost;
  d->done = std::move(done);
  d->deadline = std::chrono::steady_clock::now() + cfg_.host.shutdown_grace;
  d->timer = std::make_unique<asio::steady_timer>(io_, cfg_.host.shutdown_grace);
  d->timer->async_wait([this](boost::system::error_code ec) {
    if (!ec) check_drains();
  });
  drains_.push_back(std::move(d));
  check_drains();
}

void Partitions::record_ended(Partition& part) {
  --part.in_pipeline;
  if (part.revoked && part.in_pipeline == 0) check_drains();
}

void Partitions::store_on_revoke(std::promise<std::vector<kafka::TopicPartitionOffset>> done,
                                 std::vector<kafka::TopicPartitionOffset> offsets,
                                 std::vector<kafka::TopicPartition> tps) {
  // The database first, as for every commit. If it does not answer in
  // time (it is down), nothing is committed: the next owner reads again
  // from the older commit and finds duplicates, never a gap.
  struct Answer {
    std::promise<std::vector<kafka::TopicPartitionOffset>> promise;
    bool given = false;
    asio::steady_timer timer;
    explicit Answer(asio::io_context& io) : timer(io) {}
  };
  auto answer = std::make_shared<Answer>(io_);
  answer->promise = std::move(done);
  answer->timer.expires_after(kStoreOnRevokeFor);
  answer->timer.async_wait([answer, tps](boost::system::error_code ec) {
    if (ec || answer->given) return;
    answer->given = true;
    spdlog::warn("kafka: the offsets of {} could not be stored in the database in time; not committed on revoke",
                 kafka::describe(tps));
    answer->promise.set_value({});
  });
  store(offsets, [answer, offsets](bool stored) {
    if (answer->given) return;
    answer->given = true;
    answer->timer.cancel();
    answer->promise.set_value(stored ? offsets : std::vector<kafka::TopicPartitionOffset>{});
  });
}

void Partitions::check_drains() {
  const auto now = std::chrono::steady_clock::now();
  for (auto it = drains_.begin(); it != drains_.end();) {
    Drain& d = **it;
    // Records of an earlier assignment of the same partition (past their
    // grace then) do not hold this revocation up.
    size_t active = 0;
    for (const auto& p : d.parts) active += p->in_pipeline + (p->moving ? 1 : 0);
    if (active > 0 && now < d.deadline) {
      ++it;
      continue;
    }
    if (active > 0)
      spdlog::warn(
          "kafka: {} record(s) of {} still in flight after shutdown_grace; letting the partitions go (their "
          "claims fence any late completion)",
          active, kafka::describe(d.tps));
    std::vector<kafka::TopicPartitionOffset> offsets;
    for (const auto& p : d.parts) {
      auto cp = p->tracker.commit_point();
      // Against what Kafka confirmed: an asynchronous commit still on its way
      // may yet fail with the rebalance.
      if (!d.lost && cp && *cp > p->kafka.acked) offsets.push_back({p->tp, *cp});
      auto pit = parts_.find(p->tp);
      if (pit == parts_.end() || pit->second != p) continue;  // assigned again meanwhile
      p->metrics->assigned.store(false);
      parts_.erase(pit);
      gate_.revoked({p->tp});
    }
    if (d.timer) d.timer->cancel();
    if (offsets.empty())
      d.done.set_value({});
    else
      store_on_revoke(std::move(d.done), std::move(offsets), d.tps);
    it = drains_.erase(it);
  }
}

bool Partitions::next_in_line(const Partition& part, const rd_kafka_message_t& msg, uint64_t seek_generation) const {
  return !part.starting && seek_generation >= part.seek_ticket &&
         part.tracker.check(msg.offset) == OffsetTracker::Admit::Next;
}

void Partitions::wait_for_schema(const std::shared_ptr<Partition>& part, int64_t offset, format::Registry& registry,
                                 int32_t id) {
  gate_.hold(part->tp, FetchGate::Hold::Schema);
  rewind(*part, offset);
  spdlog::info("{}[{}]: record {} needs schema id {} from the registry; the partition waits for it", part->tp.topic,
               part->tp.partition, offset, id);
  // Answered on the registry's thread, once the schema is known (or known
  // to be unknown: the record is then dead-lettered when read again).
  registry.when_cached(id, [this, weak = std::weak_ptr<Partition>(part)] {
    asio::post(io_, [this, weak] {
      auto p = weak.lock();
      if (p && current(p)) gate_.release(p->tp, FetchGate::Hold::Schema);
    });
  });
}

bool Partitions::take(const std::shared_ptr<Partition>& part, const rd_kafka_message_t& msg, uint64_t seek_generation,
                      bool retry_topic) {
  if (part->starting) return false;                       // fetched again once the start is known
  if (seek_generation < part->seek_ticket) return false;  // polled before our last seek of the partition
  switch (part->tracker.check(msg.offset)) {
    case OffsetTracker::Admit::Next: break;
    case OffsetTracker::Admit::Refetch: return false;
    case OffsetTracker::Admit::Gap:
      // The consumer delivers gap-free or reports the hole first; this must
      // never happen. Never commit over it: read the partition again.
      spdlog::error("kafka: {}[{}] jumped from offset {} to {} without a verified hole; re-reading it", part->tp.topic,
                    part->tp.partition, *part->tracker.next_expected(), msg.offset);
      rewind(*part, *part->tracker.next_expected());
      return false;
  }
  if (retry_topic) {
    const auto due = dlq::headers::integer(&msg, dlq::headers::kRetryDueMs);
    if (due && *due > wall_clock_ms()) {
      hold(part, msg.offset, *due);
      return false;
    }
  }
  part->tracker.add(msg.offset);
  if (part->first_consumed < 0) part->first_consumed = msg.offset;
  ++part->in_pipeline;
  if (part->stalled) {
    part->stalled = false;
    part->metrics->stalled.store(0);
    spdlog::info("kafka: {}[{}] is flowing again from offset {}", part->tp.topic, part->tp.partition, msg.offset);
  }
  return true;
}

std::optional<Partitions::Lost> Partitions::hole(const kafka::Consumer::Gap& gap) {
  auto part = active(gap.tp);
  if (!part) return std::nullopt;
  if (!gap.absent) {
    part->metrics->skips_recovered.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  // Only a hole that starts where this partition stands may be passed; one
  // found before our own seek of the partition (a retry hold) is stale.
  if (part->tracker.next_expected() != gap.from) return std::nullopt;
  if (gap.log_start > gap.from) {
    // Never a silent skip: the first offset stands for the range, not
    // durable until the loss is recorded, so the commit waits for that.
    const int64_t lost_to = std::min(gap.to, gap.log_start);
    part->tracker.add(gap.from);
    part->tracker.skip_to(gap.to);
    ++part->in_pipeline;  // a revocation waits for the record of the loss too
    part->metrics->lost_to_retention.fetch_add(static_cast<uint64_t>(lost_to - gap.from), std::memory_order_relaxed);
    spdlog::error(
        "kafka: {}[{}] offsets {}..{} were deleted by retention before this group read them: {} record(s) the "
        "pipeline never saw (no outcome exists for them); recorded for `idemsink audit`; the partition goes on from "
        "offset {}",
        gap.tp.topic, gap.tp.partition, gap.from, lost_to - 1, lost_to - gap.from, gap.to);
    return Lost{part, gap.from, lost_to};
  }
  part->tracker.skip_to(gap.to);
  part->metrics->gaps.fetch_add(1, std::memory_order_relaxed);
  spdlog::info(
      "kafka: {}[{}] offsets {}..{} hold no records (a re-read confirmed it: transaction markers or "
      "compaction); the commit passes them",
      gap.tp.topic, gap.tp.partition, gap.from, gap.to - 1);
  return std::nullopt;
}

void Partitions::stalled(const kafka::TopicPartition& tp) {
  auto part = active(tp);
  if (!part || part->stalled) return;
  part->stalled = true;
  part->metrics->stalled.store(1);
  part->metrics->stalls.fetch_add(1, std::memory_order_relaxed);
}

void Partitions::move(const claim::OffsetMove& m, const std::string& host) {
  const auto it = parts_.find({m.topic, m.partition});
  if (it == parts_.end()) return;  // not ours: its owner moves it
  const std::shared_ptr<Partition> p = it->second;
  if (p->revoked || p->starting || p->moving || storing_ || rechecking_) return;
  const auto commit_point = p->tracker.commit_point();
  const auto read_to = p->tracker.next_expected();
  if (!commit_point || !read_to) return;
  const int64_t from = *commit_point;
  const bool back = m.kind == claim::OffsetMove::Kind::Rewind;
  // A rewind never passes the commit point (a record below it, waiting
  // for a retry, must keep it) and never moves forward; a skip never moves
  // back. A skip that does not move passes over nothing: its range is empty.
  const int64_t target = back ? std::min(m.to, from) : m.to;
  const bool moves = back ? target < *read_to : target > *read_to;
  const int64_t stamped_from = !back && !moves ? target : from;
  p->moving = true;  // no offset of it is stored, and a revocation waits, until the move is settled
  pool_.submit(
      "apply an operator's offset move",
      [this, p, m, target, stamped_from, moves, back, host](db::Connection& c) {
        // Against the server the partitions read their start from, as store() does.
        const uint64_t known = server_id_.load();
        if (known != 0 && c.server_id() != known) {
          asio::post(io_, [this, p] {
            settle_move(*p);
            recheck_stored();
          });
          return;
        }
        c.begin();
        const bool ours = claim::OffsetMoves::mark_applied(c, m, stamped_from, host);
        // Lowered with the stamp: a host dying before its next commit still reads again.
        if (ours && moves && back) offsets_.write(c, std::vector<claim::StoredOffset>{{m.topic, m.partition, target}});
        c.commit();
        asio::post(io_, [this, p, m, target, stamped_from, moves, ours] {
          // Even while being revoked: its drain waited, and commits where it moved.
          const auto held = parts_.find(p->tp);
          if (ours && held != parts_.end() && held->second == p) {
            if (!moves) {
              spdlog::info("route {}: {}[{}]: {} #{} to {} by {}: already at {}, not moved", m.route, m.topic,
                           m.partition, claim::to_string(m.kind), m.id, m.to, m.requested_by, stamped_from);
            } else {
              spdlog::warn("route {}: {}[{}]: {} #{} by {} ({}): from {} to {}", m.route, m.topic, m.partition,
                           claim::to_string(m.kind), m.id, m.requested_by, m.note, stamped_from, target);
              read_on_from(*p, target, -1);  // Kafka's offset unknown: the commit goes to the target
            }
          }
          settle_move(*p);
        });
      },
      [this, p](const db::DbError& e) {
        spdlog::warn("kafka: {}[{}]: an operator's offset move was not stamped ({}); tried again next round",
                     p->tp.topic, p->tp.partition, e.what());
        asio::post(io_, [this, p] { settle_move(*p); });
      });
}

void Partitions::settle_move(Partition& p) {
  p.moving = false;
  check_drains();
}

void Partitions::read_on_from(Partition& p, int64_t offset, int64_t kafka_holds) {
  // Records still in the pipeline finish against the old tracker's offsets
  // (unknown to the new one: ignored); their copies read again meet their claims.
  p.tracker = OffsetTracker{};
  p.tracker.start_at(offset);
  p.kafka.reset(kafka_holds);
  rewind(p, offset);
}

void Partitions::rewind(Partition& part, int64_t offset) { part.seek_ticket = consumer_->seek({part.tp, offset}); }

void Partitions::hold(const std::shared_ptr<Partition>& part, int64_t offset, int64_t due_ms) {
  gate_.hold(part->tp, FetchGate::Hold::NotDue);
  rewind(*part, offset);
  const auto wait = std::chrono::milliseconds(std::max<int64_t>(0, due_ms - wall_clock_ms()));
  spdlog::debug("retry topic {}[{}]: record {} is due in {}ms; partition held", part->tp.topic, part->tp.partition,
                offset, wait.count());
  part->hold_timer = std::make_unique<asio::steady_timer>(io_, wait);
  part->hold_timer->async_wait([this, weak = std::weak_ptr<Partition>(part)](boost::system::error_code ec) {
    auto p = weak.lock();
    if (ec || !p || p->revoked) return;
    gate_.release(p->tp, FetchGate::Hold::NotDue);
  });
}

void Partitions::commit() {
  // librdkafka < 2.10 declares the whole assignment lost when a commit meets
  // ILLEGAL_GENERATION mid-rebalance (docs/librdkafka.md). Once a commit says
  // a rebalance is in progress, wait for the rebalance callback (where
  // revoked partitions are committed anyway), but never longer than 10s.
  if (std::chrono::steady_clock::now() < commits_held_until_ || consumer_ == nullptr || rechecking_) return;
  std::vector<kafka::TopicPartitionOffset> offsets;
  const auto now = std::chrono::steady_clock::now();
  for (auto& [tp, part] : parts_) {
    if (part->revoked || part->moving) continue;
    auto cp = part->tracker.commit_point();
    // A commit whose result never came back, failed without saying so for
    // this partition, or was overtaken by a late one is sent again: the
    // commit must reach the end.
    if (cp && part->kafka.due(*cp, now)) {
      offsets.push_back({tp, *cp});
      part->kafka.sending(*cp, now);
    }
  }
  if (offsets.empty()) return;
  // The database first: Kafka's commit never runs ahead of the offsets kept
  // with the outcomes. One write at a time; a round while it waits sends
  // its offsets again with the next (kafka.failed below).
  if (storing_) {
    for (const auto& o : offsets)
      if (auto it = parts_.find(o.tp); it != parts_.end()) it->second->kafka.failed(o.offset);
    return;
  }
  storing_ = true;
  store(offsets, [this, offsets](bool stored) {
    storing_ = false;
    if (!stored || consumer_ == nullptr) {
      for (const auto& o : offsets)
        if (auto it = parts_.find(o.tp); it != parts_.end())
          it->second->kafka.failed(o.offset);  // sent again by a later round
      return;
    }
    count_commit(offsets, false);
    consumer_->commit_async(offsets);
  });
}

void Partitions::commit_result(rd_kafka_resp_err_t err, const std::vector<kafka::TopicPartitionOffset>& offsets) {
  if (!err) {
    for (const auto& o : offsets) {
      if (auto route = route_of_topic_.find(o.tp.topic); route != route_of_topic_.end())
        metrics_.partition(route->second.route, o.tp.topic, o.tp.partition).committed.store(o.offset);
      auto it = parts_.find(o.tp);
      if (it == parts_.end()) continue;
      if (const int64_t before = it->second->kafka.confirmed(o.offset); before >= 0)
        spdlog::warn("kafka: {}[{}]: a late commit took the group's offset back to {} from {}; committing again",
                     o.tp.topic, o.tp.partition, o.offset, before);
    }
    return;
  }
  if (err == RD_KAFKA_RESP_ERR__NO_OFFSET) return;
  count_commit(offsets, true);
  const bool rebalancing = err == RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS;
  if (rebalancing)
    spdlog::info("kafka: offset commit deferred: the group is rebalancing");
  else
    spdlog::warn("kafka: offset commit failed: {}; it will be sent again", rd_kafka_err2str(err));
  if (rebalancing) commits_held_until_ = std::chrono::steady_clock::now() + 10s;
  for (const auto& o : offsets) {
    if (auto it = parts_.find(o.tp); it != parts_.end()) it->second->kafka.failed(o.offset);
  }
}

double Partitions::update_gauges() {
  double total = 0;
  for (const auto& [tp, part] : parts_) {
    part->metrics->fetching.store(gate_.fetching(tp) ? 1 : 0);
    part->metrics->in_pipeline.store(static_cast<int64_t>(part->in_pipeline));
    const auto w = consumer_ ? consumer_->watermarks(tp) : std::nullopt;
    // Not known yet (no fetch answered, and the brokers not asked yet):
    // unknown, never 0, which would read "caught up" while records wait.
    double lag = metrics::kUnknown;
    if (w) {
      // Before a record arrives the commit point is the group's committed
      // offset; with neither, everything Kafka still has is behind.
      lag = static_cast<double>(std::max<int64_t>(0, w->high - part->tracker.commit_point().value_or(w->low)));
      part->metrics->high_watermark.store(w->high);
    }
    part->metrics->lag.store(lag);
    total += lag;
  }
  return total;
}

}  // namespace idemsink::pipeline
