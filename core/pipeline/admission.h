// Admission: whether a consumed record may be claimed at all, and under
// which biz_key. A refused record goes straight to the DLQ with the reason
// (poison input never stalls or crashes the pipeline). Pure: no I/O.
#pragma once

#include <librdkafka/rdkafka.h>

#include <cstdint>
#include <string>
#include <variant>

#include "core/config/config.h"
#include "core/dlq/reason.h"
#include "core/pipeline/key_extractor.h"

namespace idemsink::pipeline {

struct Refusal {
  dlq::Reason reason;
  std::string detail;
};

/// The biz_key of `record`, or why the route refuses it. The checks, in order:
/// size, key, key length, timestamp present, within the replay horizon
/// (claim rows older than retention may be dropped, so such a record could
/// not be de-duplicated), not too far in the future.
std::variant<std::string, Refusal> admit(const config::RouteConfig& route, const config::ClaimConfig& claim,
                                         KeyExtractor& extractor, const RecordView& record, int64_t timestamp_ms,
                                         int64_t now_ms);

/// The entity of `record` on a route with [route.order_by], or why the route
/// refuses it (no ordering key, or one above 255 bytes).
std::variant<std::string, Refusal> admit_order_key(KeyExtractor& extractor, const RecordView& record);

}  // namespace idemsink::pipeline
