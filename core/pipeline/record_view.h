// A consumed record as its route reads it: the value and key decoded to JSON
// where the route's formats say so ([route.value], [route.key_format]), as
// written otherwise; headers and position from the Kafka message.
#pragma once

#include <librdkafka/rdkafka.h>

#include <optional>
#include <string>
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
  /// The record as its route reads it: the decoded value and key's text
  /// where its formats made them, else as Kafka holds them.
  static RecordView decoded(const rd_kafka_message_t* m, const std::optional<std::string>& value_json,
                            const std::optional<std::string>& key_text) {
    RecordView v = raw(m);
    if (value_json) v.value = *value_json;
    if (key_text) v.key = *key_text;
    return v;
  }
};

}  // namespace idemsink::pipeline
