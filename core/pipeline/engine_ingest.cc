// Records in: a poll's messages taken by their routes, admitted and
// lined up by key; and a record's end, which lets the next of its key go on.
#include "core/pipeline/engine.h"

#include "core/common/log.h"
#include "core/common/util.h"
#include "core/dlq/headers.h"
#include "core/pipeline/admission.h"

namespace idemsink::pipeline {

void Engine::ingest(Feed& feed, kafka::Consumer::Batch batch) {
  const int64_t now = wall_clock_ms();
  int64_t kept = 0;  // polled records that do not become pipeline records leave the buffer here
  for (auto& msg : batch.messages) {
    std::optional<Arrival> a = take_message(feed, msg, batch.seek_generation);
    if (!a) continue;
    // A record that does not decode is the route's to dead-letter unless a
    // condition that needs no value leaves it out.
    std::optional<std::string> undecodable = std::move(a->decoded.undecodable);
    if (!route_takes(*a, *msg, undecodable)) continue;
    ++kept;
    Record& r = make_record(*a, std::move(msg));
    if (!health_.record_arrived(*a->route)) --kept;  // held for the circuit: out of the backpressure count at once
    admit_record(r, std::move(undecodable), a->decoded.value_canonical, now);
  }
  feed.gate.buffered_delta(kept - static_cast<int64_t>(batch.messages.size()));
}

std::optional<Engine::Arrival> Engine::take_message(Feed& feed, const kafka::MessagePtr& msg,
                                                    uint64_t seek_generation) {
  if (msg->err) {
    if (msg->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
      spdlog::warn("kafka: consume error on {}[{}]: {}", msg->rkt ? rd_kafka_topic_name(msg->rkt) : "?", msg->partition,
                   rd_kafka_message_errstr(msg.get()));
    return std::nullopt;
  }
  const kafka::TopicPartition tp{rd_kafka_topic_name(msg->rkt), msg->partition};
  auto part = feed.partitions.active(tp);
  auto route_it = feed.route_by_topic.find(tp.topic);
  if (!part || route_it == feed.route_by_topic.end()) return std::nullopt;  // fetched before a revoke
  Arrival a{route_it->second.route, route_it->second.tier, std::move(part), {}};
  if (a.route->decoder) {
    a.decoded = a.route->decoder->decode(
        msg->payload ? std::optional(std::string_view(static_cast<const char*>(msg->payload), msg->len)) : std::nullopt,
        msg->key ? std::optional(std::string_view(static_cast<const char*>(msg->key), msg->key_len)) : std::nullopt);
    if (a.decoded.registry != nullptr) {
      // Not the partition's next record: take() says why it is passed
      // over (and re-reads the partition after a gap); it never takes it.
      if (!feed.partitions.next_in_line(*a.part, *msg, seek_generation))
        feed.partitions.take(a.part, *msg, seek_generation, a.tier > 0);
      else
        feed.partitions.wait_for_schema(a.part, msg->offset, *a.decoded.registry, a.decoded.schema_id);
      return std::nullopt;
    }
  }
  if (!feed.partitions.take(a.part, *msg, seek_generation, a.tier > 0)) return std::nullopt;
  return a;
}

// What the route does not take comes first: another route's replayed copy,
// or a record [route.when] leaves out. It needs no key, no claim, no
// pipeline record (a retry tier's record was taken already).
bool Engine::route_takes(Arrival& a, rd_kafka_message_t& msg, std::optional<std::string>& undecodable) {
  Route& route = *a.route;
  const auto replayed_for = a.tier == 0 ? dlq::headers::replay_target(&msg) : std::nullopt;
  if (replayed_for && route.cfg.shares_topic_with(*replayed_for)) {
    skip(route, *a.part, msg.offset);
    return false;
  }
  if (route.filter && a.tier == 0 && !replayed_for && !(undecodable && route.filter->condition().needs_json())) {
    auto decided = route.filter->decide(RecordView::decoded(&msg, a.decoded.value_json, a.decoded.key_text));
    if (decided.verdict == RouteFilter::Verdict::Skip) {
      skip(route, *a.part, msg.offset);
      return false;
    }
    if (decided.verdict == RouteFilter::Verdict::Undecodable && !undecodable) undecodable = std::move(decided.why);
  }
  return true;
}

Record& Engine::make_record(Arrival& a, kafka::MessagePtr msg) {
  auto rec = std::make_unique<Record>();
  Record& r = *rec;
  r.id = next_id_++;
  r.route = a.route;
  r.tier = a.tier;
  r.part = a.part;
  r.offset = msg->offset;
  r.value_json = std::move(a.decoded.value_json);
  r.key_json = std::move(a.decoded.key_json);
  r.key_text = std::move(a.decoded.key_text);
  rd_kafka_timestamp_type_t ts_type;
  r.timestamp_ms = rd_kafka_message_timestamp(msg.get(), &ts_type);
  // Back from a retry topic: attempts continue where the last tier stopped.
  if (a.tier > 0) {
    r.calls = static_cast<uint32_t>(dlq::headers::integer(msg.get(), dlq::headers::kAttempt).value_or(0));
    r.calls_on_arrival = r.calls;
    r.uncertain_calls =
        static_cast<uint32_t>(dlq::headers::integer(msg.get(), dlq::headers::kUncertainCalls).value_or(0));
  }
  r.msg = std::move(msg);
  records_.emplace(r.id, std::move(rec));
  a.route->metrics->consumed.fetch_add(1, std::memory_order_relaxed);
  return r;
}

// The record's key (or why it has none: dead-lettered), its entity, its
// payload's hash, and its place in line.
void Engine::admit_record(Record& r, std::optional<std::string> undecodable,
                          const std::optional<std::string>& value_canonical, int64_t now) {
  Route* route = r.route;
  if (undecodable) return refuse(r, dlq::Reason::UndecodableValue, std::move(*undecodable));
  auto admitted = admit(route->cfg, cfg_.claim, route->extractor, r.view(), r.timestamp_ms, now);
  if (auto* refusal = std::get_if<Refusal>(&admitted)) return refuse(r, refusal->reason, std::move(refusal->detail));
  r.biz_key = std::move(std::get<std::string>(admitted));
  if (route->order_extractor) {
    auto entity = admit_order_key(*route->order_extractor, r.view());
    if (auto* refusal = std::get_if<Refusal>(&entity)) return refuse(r, refusal->reason, std::move(refusal->detail));
    r.order_key = std::move(std::get<std::string>(entity));
    // A first delivery lines up behind its entity's records in memory; one
    // back from a retry topic, or replayed on a route that holds on dead
    // records, keeps its place by its hold (claim/order_hold.h).
    const bool by_hold = r.tier > 0 || (route->cfg.order_by.hold_on_dead() &&
                                        dlq::headers::integer(r.msg.get(), dlq::headers::kReplayed));
    if (!by_hold) r.entity_id = route->cfg.name + '\0' + *r.order_key;
  }
  // A decoded value's hash is of its data, not of its encoding: another
  // schema version of the same data is the same payload (docs/formats.md).
  r.payload_hash = r.value_json ? payload_hash(value_canonical ? *value_canonical : *r.value_json)
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
      if (Record* n = at(*next, Stage::Waiting)) claimer_.claim(*n);
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
    if (Record* n = at(*next, Stage::Waiting)) line_up_by_key(*n);
}

}  // namespace idemsink::pipeline
