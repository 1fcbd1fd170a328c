#include "core/pipeline/record.h"

#include <spdlog/spdlog.h>

namespace idemsink::pipeline {

LogFields log_fields_of(const Record& r) {
  LogFields f;
  if (r.route != nullptr) f.route = r.route->cfg.name;
  if (r.part) {
    f.topic = r.part->tp.topic;
    f.partition = r.part->tp.partition;
  }
  f.offset = r.offset;
  f.biz_key = r.biz_key;
  f.idem_token = r.token;
  return f;
}

void Record::move_to(Stage to) {
  if (!allowed(stage, to)) {
    const LogScope log_scope(log_fields_of(*this));
    // Kept going as before the table existed; the fault checker and the
    // tests fail on the line.
    spdlog::error("bug: route {}: record {}@{}: {} -> {} is not a step of a record's life (core/pipeline/stage.cc)",
                  route != nullptr ? route->cfg.name : "?", part ? part->tp.topic : "?", offset, to_string(stage),
                  to_string(to));
  }
  stage = to;
}

}  // namespace idemsink::pipeline
