#include "core/pipeline/record_outputs.h"

#include <algorithm>

#include "core/dlq/headers.h"
#include "core/dlq/outcome_event.h"

namespace idemsink::pipeline {
namespace {

// An event carries the plugin's receipt whole, up to this much (the claim
// column keeps 1,024 bytes).
constexpr size_t kMaxEventReceipt = 64 * 1024;

std::optional<std::string> last_header(const Record& r, const char* name) {
  rd_kafka_headers_t* hdrs = nullptr;
  const void* v = nullptr;
  size_t n = 0;
  if (rd_kafka_message_headers(r.msg.get(), &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR ||
      rd_kafka_header_get_last(hdrs, name, &v, &n) != RD_KAFKA_RESP_ERR_NO_ERROR || v == nullptr)
    return std::nullopt;
  return std::string(static_cast<const char*>(v), n);
}

}  // namespace

std::optional<dlq::Letter> event_of(const Record& r, claim::Status outcome, std::string_view receipt,
                                    std::string_view reason, const std::string& host) {
  const config::OutputConfig& out = r.route->cfg.output;
  if (!dlq::publishes_event(out, outcome)) return std::nullopt;
  dlq::OutcomeFacts f;
  f.route = r.route->cfg.name;
  f.biz_key = r.biz_key;
  f.idem_token = r.token;
  f.epoch = r.attempt;
  f.outcome = outcome;
  f.receipt = receipt.substr(0, std::min(receipt.size(), kMaxEventReceipt));
  f.reason = std::string(reason);
  f.error = r.last_error;
  f.source() = r.source();
  f.calls = r.calls;
  f.traceparent = last_header(r, dlq::headers::kTraceparent);
  return dlq::outcome_event(out, f, host);
}

std::optional<claim::OrderHold> hold_of(const Record& r, claim::Status outcome) {
  if (!r.order_key) return std::nullopt;
  const bool dead = outcome == claim::Status::Failed || outcome == claim::Status::Unknown;
  if (outcome != claim::Status::Pending && !(dead && r.route->cfg.order_by.hold_on_dead())) return std::nullopt;
  claim::OrderHold h{r.row, *r.order_key, r.part->tp.topic, r.part->tp.partition, r.offset};
  // Back from a retry topic or replayed: where the record was first consumed.
  if (auto topic = last_header(r, dlq::headers::kOriginTopic)) {
    const auto partition = dlq::headers::integer(r.msg.get(), dlq::headers::kOriginPartition);
    const auto offset = dlq::headers::integer(r.msg.get(), dlq::headers::kOriginOffset);
    if (partition && offset) {
      h.origin_topic = *topic;
      h.origin_partition = static_cast<int32_t>(*partition);
      h.origin_offset = *offset;
    }
  }
  return h;
}

}  // namespace idemsink::pipeline
