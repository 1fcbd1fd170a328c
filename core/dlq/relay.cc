#include "core/dlq/relay.h"

#include <algorithm>

#include "core/common/log.h"
#include "core/dlq/headers.h"

namespace idemsink::dlq {

namespace asio = boost::asio;

Relay::Relay(asio::io_context& io, db::Pool& pool, const Outbox& outbox, CountFn count, UnpublishableFn unpublishable)
    : io_(io), pool_(pool), outbox_(outbox), count_(std::move(count)), unpublishable_count_(std::move(unpublishable)) {}

void Relay::set_producer_factory(ProducerFactory f) {
  producer_factory_ = std::move(f);
  producer_ = producer_factory_();
}

void Relay::kick() {
  if (producer_ == nullptr) return;
  if (running_) {
    again_ = true;
    return;
  }
  if (std::chrono::steady_clock::now() < not_before_) return;
  running_ = true;
  again_ = false;
  pool_.submit("dlq relay take", [this, producer = producer_](db::Connection& c) {
    auto letters = outbox_.take(c, kBatch, kByteBudget);
    // A topic that can never take a record would hold its rows, and the
    // cycle, forever (no delivery deadline): its rows are set aside first.
    std::map<std::string, std::optional<std::string>> refused_topics;
    for (const auto& d : letters)
      if (!d.topic.empty() && !refused_topics.count(d.topic))
        refused_topics[d.topic] = producer->topic_refused(d.topic, kTopicCheckMs);
    std::vector<Letter> kept;
    size_t set_aside = 0;
    for (auto& d : letters) {
      const auto& why = d.topic.empty() ? std::nullopt : refused_topics[d.topic];
      if (!why) {
        kept.push_back(std::move(d));
        continue;
      }
      spdlog::error(
          "DLQ outbox row {} can never be published ({}); set aside as unpublishable: `idemsink dlq "
          "--list` shows it, --retry or --discard settles it",
          d.id, *why);
      outbox_.mark_unpublishable(c, d.id, *why);
      ++set_aside;
    }
    asio::post(io_, [this, kept = std::move(kept), set_aside, taken = letters.size()]() mutable {
      if (set_aside) unpublishable_count_(set_aside);
      on_taken(std::move(kept), taken);
    });
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

void Relay::on_taken(std::vector<Letter> letters, size_t taken) {
  taken_ = taken;
  if (producer_->fatal()) {
    spdlog::warn("recreating the DLQ producer after its fatal error");
    producer_ = producer_factory_();
  }
  if (letters.empty()) {
    running_ = false;
    if (again_ || taken > 0) kick();  // rows set aside: the ones after them wait
    return;
  }
  outstanding_.clear();
  route_of_.clear();
  std::vector<uint64_t> unpublished_by_design;  // the route does not publish its dead letters: the row is the record
  for (const auto& d : letters) {
    if (d.topic.empty()) {
      unpublished_by_design.push_back(d.id);
    } else {
      outstanding_[d.id] = Delivery::Pending;
      route_of_[d.id] = d.route;
    }
  }
  pending_ = outstanding_.size();
  for (const auto& d : letters)
    if (!d.topic.empty()) producer_->produce(record_of(d));
  if (outstanding_.empty()) {
    finish_cycle(std::move(unpublished_by_design), {}, true);
  } else if (!unpublished_by_design.empty()) {
    pool_.submit("dlq relay mark",
                 [this, ids = std::move(unpublished_by_design)](db::Connection& c) { outbox_.mark_published(c, ids); });
  }
}

bool Relay::refused_for_good(rd_kafka_resp_err_t err) {
  switch (err) {
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_INVALID_RECORD:
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
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
  auto it = outstanding_.find(outbox_id);
  if (it == outstanding_.end() || it->second != Delivery::Pending) return;
  if (!err) {
    it->second = Delivery::Ok;
  } else if (refused_for_good(err)) {
    it->second = Delivery::Refused;
    refused_[outbox_id] = rd_kafka_err2str(err);
  } else {
    if (first_error_.empty()) first_error_ = rd_kafka_err2str(err);
    it->second = Delivery::Failed;
  }
  if (--pending_ > 0) return;
  // Every record of this cycle has its report: stamp the delivered ones.
  std::vector<uint64_t> published;
  for (const auto& [id, state] : outstanding_)
    if (state == Delivery::Ok) published.push_back(id);
  size_t failed = 0;
  std::map<std::string, std::pair<size_t, size_t>> by_route;  // published, failed
  for (const auto& [id, state] : outstanding_) {
    failed += state == Delivery::Failed;
    auto& n = by_route[route_of_[id]];
    n.first += state == Delivery::Ok;
    n.second += state == Delivery::Failed;
  }
  for (const auto& [route, n] : by_route) count_(route, n.first, n.second);
  failures_in_a_row_ = failed > 0 ? failures_in_a_row_ + 1 : 0;
  if (failed > 0) {
    const auto wait = std::chrono::milliseconds(std::min<int64_t>(30'000, 500LL << std::min(failures_in_a_row_, 6)));
    not_before_ = std::chrono::steady_clock::now() + wait;
    spdlog::warn("DLQ publish failed for {} of {} outbox rows ({}); they stay in the outbox, next attempt in {}ms",
                 failed, outstanding_.size(), first_error_, wait.count());
  }
  first_error_.clear();
  outstanding_.clear();
  // Set aside, so the rows after them flow; an operator decides (`idemsink dlq`).
  for (const auto& [id, why] : refused_)
    spdlog::error(
        "DLQ outbox row {} can never be published ({}); set aside as unpublishable: `idemsink dlq --list` "
        "shows it, --retry or --discard settles it",
        id, why);
  unpublishable_count_(refused_.size());
  finish_cycle(std::move(published), std::exchange(refused_, {}), taken_ == kBatch);
}

void Relay::finish_cycle(std::vector<uint64_t> published, std::map<uint64_t, std::string> refused, bool more_waiting) {
  pool_.submit("dlq relay mark",
               [this, published = std::move(published), refused = std::move(refused), more_waiting](db::Connection& c) {
                 outbox_.mark_published(c, published);
                 for (const auto& [id, why] : refused) outbox_.mark_unpublishable(c, id, why);
                 asio::post(io_, [this, more_waiting] {
                   running_ = false;
                   if (more_waiting || again_) kick();
                 });
               });
}

}  // namespace idemsink::dlq
