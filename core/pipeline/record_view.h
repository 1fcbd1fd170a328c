// A consumed record as its route reads it: the value and key decoded to JSON
// where the route's formats say so ([route.value], [route.key_format]), as
// written otherwise; headers and position from the Kafka message.
#pragma once

#include <librdkafka/rdkafka.h>

#include <optional>
#include <string_view>

namespace idemsink::pipeline {

struct RecordView {
  const rd_kafka_message_t* msg = nullptr;
  std::string_view value;
  std::optional<std::string_view> key;  // none: the record has no key

  /// The record as Kafka holds it (no decoding).
  static RecordView raw(const rd_kafka_message_t* m) {
    RecordView v;
    v.msg = m;
    if (m->payload != nullptr) v.value = {static_cast<const char*>(m->payload), m->len};
    if (m->key != nullptr) v.key = std::string_view(static_cast<const char*>(m->key), m->key_len);
    return v;
  }
};

}  // namespace idemsink::pipeline
