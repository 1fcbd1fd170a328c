#include "core/pipeline/record.h"

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

}  // namespace idemsink::pipeline
