#include "core/pipeline/admission.h"

namespace idemsink::pipeline {

std::variant<std::string, Refusal> admit(const config::RouteConfig& route, const config::ClaimConfig& claim,
                                         KeyExtractor& extractor, const RecordView& record, int64_t timestamp_ms,
                                         int64_t now_ms) {
  using dlq::Reason;
  const int64_t size = static_cast<int64_t>(record.msg->len + record.msg->key_len);
  if (size > route.max_record_bytes)
    return Refusal{Reason::RecordTooLarge, "record is " + std::to_string(size) + " bytes, route limit " +
                                               std::to_string(route.max_record_bytes)};
  auto key = extractor.extract(record);
  if (auto* problem = std::get_if<KeyProblem>(&key)) return Refusal{problem->reason, problem->detail};
  std::string biz_key = std::move(std::get<std::string>(key));
  if (biz_key.size() > 255)
    return Refusal{Reason::BizKeyTooLong, "biz_key is " + std::to_string(biz_key.size()) + " bytes, the limit is 255"};
  if (timestamp_ms < 0)
    return Refusal{Reason::MissingTimestamp, "record has no timestamp; the claim partition cannot be chosen"};
  const int64_t horizon_days = claim.retention_days - claim.horizon_margin_days;
  if (timestamp_ms < now_ms - horizon_days * 86'400'000)
    return Refusal{Reason::BeyondReplayHorizon, "record timestamp is older than claim retention minus margin (" +
                                                    std::to_string(horizon_days) +
                                                    " days): its claim may have been dropped, so it cannot be "
                                                    "de-duplicated"};
  if (timestamp_ms > now_ms + claim.max_future_skew.count())
    return Refusal{Reason::TimestampInFuture,
                   "record timestamp is more than claim.max_future_skew ahead of this host's clock"};
  return biz_key;
}

std::variant<std::string, Refusal> admit_order_key(KeyExtractor& extractor, const RecordView& record) {
  auto key = extractor.extract(record);
  if (auto* problem = std::get_if<KeyProblem>(&key)) return Refusal{problem->reason, "order key: " + problem->detail};
  std::string order_key = std::move(std::get<std::string>(key));
  if (order_key.size() > 255)
    return Refusal{dlq::Reason::OrderKeyTooLong,
                   "order key is " + std::to_string(order_key.size()) + " bytes, the limit is 255"};
  return order_key;
}

}  // namespace idemsink::pipeline
