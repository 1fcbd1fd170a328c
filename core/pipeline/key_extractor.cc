#include "core/pipeline/key_extractor.h"

#include <simdjson.h>

namespace idemsink::pipeline {

struct KeyExtractor::Json {
  simdjson::dom::parser parser;
};

KeyExtractor::KeyExtractor(const config::RouteConfig& route)
    : KeyExtractor(route.key_source, route.key_header, route.key_json_path) {}

KeyExtractor::KeyExtractor(config::KeySource source, const std::string& header, const std::string& json_path)
    : source_(source), header_(header), json_(std::make_unique<Json>()) {
  // "order.id" -> "/order/id" (JSON pointer, with ~ and / escaped)
  std::string p = "/";
  for (char c : json_path) {
    if (c == '.')
      p += '/';
    else if (c == '~')
      p += "~0";
    else if (c == '/')
      p += "~1";
    else
      p += c;
  }
  pointer_ = json_path.empty() ? "" : p;
}

KeyExtractor::~KeyExtractor() = default;
KeyExtractor::KeyExtractor(KeyExtractor&&) noexcept = default;
KeyExtractor& KeyExtractor::operator=(KeyExtractor&&) noexcept = default;

std::variant<std::string, KeyProblem> KeyExtractor::extract(const RecordView& record) {
  const rd_kafka_message_t* msg = record.msg;
  switch (source_) {
    case config::KeySource::MessageKey:
      if (!record.key || record.key->empty()) return KeyProblem{dlq::Reason::MissingKey, "record has no key"};
      return std::string(*record.key);
    case config::KeySource::Header: {
      rd_kafka_headers_t* hdrs = nullptr;
      const void* v = nullptr;
      size_t n = 0;
      if (rd_kafka_message_headers(msg, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR ||
          rd_kafka_header_get_last(hdrs, header_.c_str(), &v, &n) != RD_KAFKA_RESP_ERR_NO_ERROR || v == nullptr ||
          n == 0)
        return KeyProblem{dlq::Reason::MissingKey, "header " + header_ + " is missing or empty"};
      return std::string(static_cast<const char*>(v), n);
    }
    case config::KeySource::JsonField: {
      if (record.value.empty()) return KeyProblem{dlq::Reason::UndecodableValue, "empty value, expected JSON"};
      // The DOM parser validates the whole value: a record the handler could
      // not decode either is refused here, not halfway through its side effect.
      simdjson::dom::element doc;
      if (auto err = json_->parser.parse(record.value.data(), record.value.size()).get(doc))
        return KeyProblem{dlq::Reason::UndecodableValue,
                          std::string("value is not JSON: ") + simdjson::error_message(err)};
      simdjson::dom::element v;
      if (doc.at_pointer(pointer_).get(v))
        return KeyProblem{dlq::Reason::MissingKey, "JSON field " + pointer_ + " not found"};
      if (v.is_string()) {
        std::string_view s = v.get_string().value_unsafe();
        if (s.empty()) return KeyProblem{dlq::Reason::MissingKey, "JSON field " + pointer_ + " is empty"};
        return std::string(s);
      }
      if (v.is_int64()) return std::to_string(v.get_int64().value_unsafe());
      if (v.is_uint64()) return std::to_string(v.get_uint64().value_unsafe());
      return KeyProblem{dlq::Reason::MissingKey, "JSON field " + pointer_ + " is not a string or integer"};
    }
  }
  return KeyProblem{dlq::Reason::MissingKey, "no key source"};
}

}  // namespace idemsink::pipeline
