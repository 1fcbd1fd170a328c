#include "core/dlq/headers.h"

#include <charconv>

namespace idemsink::dlq::headers {

bool replaced_on_republish(std::string_view name) {
  // Where a record first came from, and how often an operator replayed it,
  // stay with it.
  return name.starts_with("idemsink.") && !name.starts_with("idemsink.origin.") && name != kReplayed;
}

std::optional<std::string_view> text(const rd_kafka_message_t* msg, const char* name) {
  rd_kafka_headers_t* hdrs = nullptr;
  const void* v = nullptr;
  size_t n = 0;
  if (rd_kafka_message_headers(msg, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR ||
      rd_kafka_header_get_last(hdrs, name, &v, &n) != RD_KAFKA_RESP_ERR_NO_ERROR || v == nullptr)
    return std::nullopt;
  return std::string_view(static_cast<const char*>(v), n);
}

std::optional<int64_t> integer(const rd_kafka_message_t* msg, const char* name) {
  const auto t = text(msg, name);
  if (!t) return std::nullopt;
  int64_t out = 0;
  auto [p, ec] = std::from_chars(t->data(), t->data() + t->size(), out);
  if (ec != std::errc() || p != t->data() + t->size()) return std::nullopt;
  return out;
}

std::optional<std::string_view> replay_target(const rd_kafka_message_t* msg) {
  if (!text(msg, kReplayed)) return std::nullopt;
  return text(msg, kRoute);
}

}  // namespace idemsink::dlq::headers
