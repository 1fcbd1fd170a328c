// [route.when]: whether a route takes a record, decided from the record
// alone (its key, headers and JSON value), so every host and every re-read
// decides the same. A record not taken is skipped: an outcome of its own,
// counted (idemsink_records_skipped_total), its offset committed, accounted
// by the audit; no claim is made. A record whose value a JSON test needs
// and cannot read is no "not taken": the route cannot tell, so it is
// dead-lettered (undecodable_value), never skipped in silence.
#pragma once

#include <librdkafka/rdkafka.h>

#include <memory>
#include <string>

#include "core/config/config.h"
#include "core/pipeline/record_view.h"

namespace idemsink::pipeline {

class RouteFilter {
 public:
  explicit RouteFilter(config::Condition condition);
  ~RouteFilter();
  RouteFilter(RouteFilter&&) noexcept;

  enum class Verdict { Take, Skip, Undecodable };
  struct Result {
    Verdict verdict;
    std::string why;  // Undecodable: what the value is not
  };
  Result decide(const RecordView& record);

  const config::Condition& condition() const { return condition_; }

 private:
  struct Json;
  config::Condition condition_;
  std::unique_ptr<Json> json_;
};

}  // namespace idemsink::pipeline
