// Extracting a key from a consumed record, per route configuration: the
// Kafka key, a header, or a field of a JSON value. The biz_key ([route.key])
// and the ordering key ([route.order_by]) are read this way.
#pragma once

#include <librdkafka/rdkafka.h>

#include <memory>
#include <string>
#include <variant>

#include "core/config/config.h"
#include "core/dlq/reason.h"
#include "core/pipeline/record_view.h"

namespace idemsink::pipeline {

/// Why a record has no usable biz_key; becomes the DLQ reason.
struct KeyProblem {
  dlq::Reason reason;  // MissingKey or UndecodableValue
  std::string detail;
};

class KeyExtractor {
 public:
  /// The biz_key of the route's records ([route.key]).
  explicit KeyExtractor(const config::RouteConfig& route);
  KeyExtractor(config::KeySource source, const std::string& header, const std::string& json_path);
  ~KeyExtractor();
  KeyExtractor(KeyExtractor&&) noexcept;
  KeyExtractor& operator=(KeyExtractor&&) noexcept;

  std::variant<std::string, KeyProblem> extract(const RecordView& record);

 private:
  struct Json;
  config::KeySource source_;
  std::string header_;
  std::string pointer_;  // JSON pointer built from the dotted path
  std::unique_ptr<Json> json_;
};

}  // namespace idemsink::pipeline
