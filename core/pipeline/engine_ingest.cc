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

}  // namespace idemsink::pipeline
