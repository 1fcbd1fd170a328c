#include "core/dlq/relay.h"

#include <algorithm>

#include "core/common/fault.h"
#include "core/common/log.h"
#include "core/dlq/headers.h"

namespace idemsink::dlq {

namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {

const char* purpose_name(Purpose p) {
  switch (p) {
    case Purpose::DeadLetter: return "dead letter";
    case Purpose::Forward: return "forward to a retry topic";
    case Purpose::Replay: return "replay";
    case Purpose::Lost: return "lost offsets";
    case Purpose::EventDone:
    case Purpose::EventFailed:
    case Purpose::EventUnknown: return "outcome event";
  }
  return "?";
}

bool unknown_topic(rd_kafka_resp_err_t err) {
  return err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART || err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
}

}  // namespace

Relay::Relay(asio::io_context& io, db::Pool& pool, const Outbox& outbox, Listener& listener,
             std::chrono::milliseconds unknown_topic_patience)
    : io_(io), pool_(pool), outbox_(outbox), listener_(listener), unknown_topic_patience_(unknown_topic_patience) {}

void Relay::set_producer_factory(ProducerFactory f) {
  producer_factory_ = std::move(f);
  producer_ = producer_factory_();
}

bool Relay::idle() const {
  return !taking_ && !stamping_ && in_flight_.empty() && to_stamp_.empty() && to_set_aside_.empty();
}

std::vector<uint64_t> Relay::in_flight_ids() const {
  std::vector<uint64_t> ids;
  ids.reserve(in_flight_.size());
  for (const auto& [id, f] : in_flight_) ids.push_back(id);
  return ids;
}

void Relay::kick() {
  if (producer_ == nullptr) return;
  if (taking_) {
    again_ = true;
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  if (now < not_before_) return;
  // Rows waiting longer than kStuckAfter (a partition without a leader) do
  // not hold back the others; past kMaxStuckPerTopic they hold back their
  // own topic only.
  size_t young = 0;
  uint64_t young_bytes = 0;
  std::map<std::string, size_t> stuck;
  for (const auto& [id, f] : in_flight_) {
    if (now - f.since < kStuckAfter) {
      ++young;
      young_bytes += f.bytes;
    } else {
      ++stuck[f.topic];
    }
  }
  capped_ = young >= kMaxInFlight || young_bytes >= kByteBudget || in_flight_.size() >= kHardCap;
  if (capped_) return;
  taking_ = true;
  again_ = false;
  // Rows in flight or delivered but not yet stamped are not taken again:
  // that would publish them twice.
  std::vector<uint64_t> exclude = in_flight_ids();
  for (uint64_t id : to_stamp_) exclude.push_back(id);
  for (const auto& [id, why] : to_set_aside_) exclude.push_back(id);
  exclude.insert(exclude.end(), settling_.begin(), settling_.end());
  // A missing topic's rows are looked at again every kTopicCheckMs only.
  std::vector<std::string> skip_topics;
  for (const auto& [topic, m] : missing_topics_)
    if (now < m.next_check) skip_topics.push_back(topic);
  for (const auto& [topic, n] : stuck)
    if (n >= kMaxStuckPerTopic) skip_topics.push_back(topic);
  const size_t limit = std::min({kBatch, kMaxInFlight - young, kHardCap - in_flight_.size()});
  const uint64_t budget = kByteBudget - young_bytes;
  pool_.submit("dlq relay take", [this, producer = producer_, exclude = std::move(exclude),
                                  skip_topics = std::move(skip_topics), limit, budget](db::Connection& c) {
    Taken t;
    t.letters = outbox_.take(c, limit, budget, exclude, skip_topics);
    t.rows = t.letters.size();
    t.limit = limit;
    // A record sent to a topic that can never take it would wait forever
    // (no delivery deadline): the cluster is asked first.
    for (const auto& d : t.letters) {
      if (d.topic.empty() || t.known_topics.count(d.topic) || t.refusals.count(d.topic)) continue;
      if (auto refusal = producer->topic_refused(d.topic, kTopicCheckMs)) {
        t.refusals[d.topic] = std::move(*refusal);
      } else {
        t.known_topics.insert(d.topic);
      }
    }
    asio::post(io_, [this, t = std::move(t)]() mutable { on_taken(std::move(t)); });
  });
}

kafka::OutRecord Relay::record_of(const Letter& d) const {
  kafka::OutRecord rec;
  rec.topic = d.topic;
  rec.key = d.key;
  rec.value = d.value;
  rec.timestamp_ms = d.timestamp_ms;
  rec.id = d.id;
  for (const auto& h : d.headers) rec.headers.push_back({h.name, h.value});
  auto add = [&](const char* name, const std::string& v) { rec.headers.push_back({name, v}); };
  if (is_event(d.purpose)) {
    // An event is not a copy of a record: its own headers, and the row's id.
    add(headers::kOutboxId, std::to_string(d.id));
    return rec;
  }
  add(headers::kSourceTopic, d.src_topic);
  add(headers::kSourcePartition, std::to_string(d.src_partition));
  add(headers::kSourceOffset, std::to_string(d.src_offset));
  add(headers::kRoute, d.route);
  add(headers::kReason, d.reason);
  add(headers::kError, d.error);
  add(headers::kAttempt, std::to_string(d.calls));
  if (!d.idem_token.empty()) add(headers::kIdemToken, d.idem_token);
  if (d.biz_key) add(headers::kBizKey, *d.biz_key);
  add(headers::kFirstFailureMs, std::to_string(d.first_failure_ms));
  add(headers::kLastFailureMs, std::to_string(d.last_failure_ms));
  add(headers::kHost, d.host);
  add(headers::kOutboxId, std::to_string(d.id));
  return rec;
}

void Relay::note_missing(const std::string& topic, const std::string& why) {
  const auto now = std::chrono::steady_clock::now();
  auto [it, fresh] = missing_topics_.try_emplace(topic, MissingTopic{now, now, now, why});
  it->second.next_check = now + std::chrono::milliseconds(kTopicCheckMs);
  it->second.why = why;
  if (fresh)
    spdlog::warn(
        "outbox: topic {} is unknown to the cluster ({}); its rows wait (a topic created moments ago "
        "may not have reached every broker yet)",
        topic, why);
}

bool Relay::patience_over(const std::string& topic) const {
  auto it = missing_topics_.find(topic);
  return it != missing_topics_.end() && std::chrono::steady_clock::now() - it->second.since >= unknown_topic_patience_;
}

void Relay::on_taken(Taken t) {
  taking_ = false;
  if (producer_->fatal()) {
    spdlog::warn("recreating the DLQ producer after its fatal error");
    producer_ = producer_factory_();
    // What the old producer held is purged with it; a report lost on the way
    // must not keep a row in flight for good: they are all taken again.
    in_flight_.clear();
  }
  for (const auto& topic : t.known_topics)
    if (missing_topics_.erase(topic)) spdlog::info("outbox: topic {} is known now; its rows go out", topic);
  for (const auto& [topic, refusal] : t.refusals)
    if (refusal.unknown_topic) note_missing(topic, refusal.why);
  const auto now = std::chrono::steady_clock::now();
  std::map<std::string, size_t> waiting;  // unfinished records waiting for their topic, by topic
  for (auto& d : t.letters) {
    auto refused = d.topic.empty() ? t.refusals.end() : t.refusals.find(d.topic);
    if (refused != t.refusals.end()) {
      const kafka::TopicRefusal& why = refused->second;
      // A dead letter or an event to a topic that stays unknown goes to an
      // operator; a forward or a replay is a record still on its way: it waits.
      if (!why.unknown_topic || (record_finished(d.purpose) && patience_over(d.topic))) {
        spdlog::error(
            "outbox row {} ({} of route {}) can never be published ({}); set aside as unpublishable: `idemsink "
            "outbox --list` shows it, --retry or --discard settles it{}",
            d.id, purpose_name(d.purpose), d.route, why.why,
            record_finished(d.purpose) ? "" : "; its record is not finished: its claim stays pending until then");
        to_set_aside_[d.id] = why.why;
      } else if (!record_finished(d.purpose)) {
        ++waiting[d.topic];
      }
      continue;
    }
    if (d.topic.empty()) {
      to_stamp_.push_back(d.id);  // the route does not publish its dead letters: the row is the record
      continue;
    }
    const uint64_t bytes = (d.key ? d.key->size() : 0) + (d.value ? d.value->size() : 0);
    in_flight_[d.id] = InFlight{d.route, d.purpose, d.topic, bytes, now};
    producer_->produce(record_of(d));
  }
  for (const auto& [topic, n] : waiting) {
    MissingTopic& m = missing_topics_[topic];
    if (now < m.next_log) continue;
    m.next_log = now + 60s;
    spdlog::error(
        "outbox: {} record(s) on their way to retry or replay topic {} wait: the cluster does not know the topic "
        "({}); create it, and they go on; their claims stay pending meanwhile",
        n, topic, m.why);
  }
  stamp();
  // More rows wait (the take came back full), or some were written meanwhile.
  if (again_ || (t.rows > 0 && t.rows == t.limit)) kick();
}

bool Relay::refused_for_good(rd_kafka_resp_err_t err) {
  switch (err) {
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_INVALID_RECORD:
    case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION: return true;
    default: return false;
  }
}

void Relay::on_delivery(uint64_t outbox_id, rd_kafka_resp_err_t err) {
  asio::post(io_, [this, outbox_id, err] { on_delivered(outbox_id, err); });
}

void Relay::on_delivered(uint64_t outbox_id, rd_kafka_resp_err_t err) {
  auto it = in_flight_.find(outbox_id);
  if (it == in_flight_.end()) return;
  const InFlight f = std::move(it->second);
  in_flight_.erase(it);
  if (!err) {
    to_stamp_.push_back(outbox_id);
    listener_.published(f.route, 1, 0);
    failures_in_a_row_ = 0;
  } else if (unknown_topic(err)) {
    // The row stays; it is taken again once the topic is looked at again.
    listener_.published(f.route, 0, 1);
    note_missing(f.topic, rd_kafka_err2str(err));
  } else if (refused_for_good(err)) {
    spdlog::error(
        "outbox row {} ({} of route {}) can never be published ({}); set aside as unpublishable: `idemsink outbox "
        "--list` shows it, --retry or --discard settles it{}",
        outbox_id, purpose_name(f.purpose), f.route, rd_kafka_err2str(err),
        record_finished(f.purpose) ? "" : "; its record is not finished: its claim stays pending until then");
    to_set_aside_[outbox_id] = rd_kafka_err2str(err);
  } else {
    // Rare without a delivery deadline (a purge, a fatal producer): the row
    // stays and is taken again after a backoff.
    listener_.published(f.route, 0, 1);
    const auto wait = std::chrono::milliseconds(std::min<int64_t>(30'000, 500LL << std::min(failures_in_a_row_, 6)));
    if (failures_in_a_row_++ % 100 == 0)
      spdlog::warn("outbox row {} could not be published ({}); it stays in the outbox, taken again in {}ms", outbox_id,
                   rd_kafka_err2str(err), wait.count());
    not_before_ = std::chrono::steady_clock::now() + wait;
  }
  stamp();
  // New rows are taken when the engine writes some and on the relay timer;
  // a take that found the limits reached is tried again once half is back.
  if (capped_ && in_flight_.size() <= kMaxInFlight / 2) kick();
}

void Relay::stamp() {
  if (stamping_ || (to_stamp_.empty() && to_set_aside_.empty())) return;
  stamping_ = true;
  std::vector<uint64_t> published = std::exchange(to_stamp_, {});
  std::map<uint64_t, std::string> set_aside = std::exchange(to_set_aside_, {});
  settling_ = published;
  for (const auto& [id, why] : set_aside) settling_.push_back(id);
  pool_.submit("dlq relay mark",
               [this, published = std::move(published), set_aside = std::move(set_aside)](db::Connection& c) {
                 // Crash window: the broker has these rows, their stamps are
                 // not written; after a restart the relay publishes them again.
                 if (!published.empty()) fault::hit("before_outbox_stamp");
                 outbox_.mark_published(c, published);
                 for (const auto& [id, why] : set_aside) outbox_.mark_unpublishable(c, id, why);
                 asio::post(io_, [this, refused = set_aside.size()] {
                   stamping_ = false;
                   settling_.clear();
                   if (refused) listener_.set_aside(refused);
                   stamp();
                 });
               });
}

}  // namespace idemsink::dlq
