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

Source Record::source() const { return Source{part->tp.topic, part->tp.partition, offset}; }

idemsink_record abi_record(const Record& r, std::vector<idemsink_header>& headers) {
  headers.clear();
  rd_kafka_headers_t* hdrs = nullptr;
  if (rd_kafka_message_headers(r.msg.get(), &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
    const char* name;
    const void* value;
    size_t size;
    for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; ++i)
      headers.push_back({name, {static_cast<const char*>(value), value ? size : 0}});
  }
  idemsink_record rec{};
  rec.struct_size = sizeof rec;
  rec.route = r.route->cfg.name.c_str();
  rec.topic = r.part->tp.topic.c_str();
  rec.partition = r.part->tp.partition;
  rec.offset = r.offset;
  rec.timestamp_ms = r.timestamp_ms;
  rec.key = {static_cast<const char*>(r.msg->key), r.msg->key_len};
  rec.value = {static_cast<const char*>(r.msg->payload), r.msg->len};
  rec.biz_key = {r.biz_key.data(), r.biz_key.size()};
  rec.headers = headers.data();
  rec.header_count = headers.size();
  rec.idem_token = r.token.c_str();
  rec.attempt = r.calls;
  rec.timeout_ms = r.route->cfg.call_timeout.count();
  if (r.value_json)
    rec.value_json = {r.value_json->data(), r.value_json->size()};
  else if (r.route->cfg.value_format == config::Format::Json)
    rec.value_json = rec.value;
  if (r.key_json) rec.key_json = {r.key_json->data(), r.key_json->size()};
  return rec;
}
}  // namespace idemsink::pipeline
