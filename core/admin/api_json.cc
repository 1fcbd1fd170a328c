// The JSON the admin API's resources write.
#include "core/admin/api_call.h"

namespace idemsink::admin {

namespace {

std::string base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

}  // namespace

json bytes_json(const std::optional<std::string>& b) {
  if (!b) return nullptr;
  json j = {{"base64", base64(*b)}};
  if (sanitize_utf8(*b, b->size()) == *b) j["text"] = *b;
  return j;
}

json letter_json(const dlq::LetterRow& l, bool whole) {
  json j = {{"id", l.id},
            {"route", l.route},
            {"reason", l.reason},
            {"error", l.error},
            {"biz_key", l.biz_key ? json(*l.biz_key) : json(nullptr)},
            {"source", {{"topic", l.src_topic}, {"partition", l.src_partition}, {"offset", l.src_offset}}},
            {"idem_token", l.idem_token},
            {"calls", l.calls},
            {"created_at", l.created_at},
            {"state", l.state},
            {"claim_status", l.claim_status},
            {"discard_note", l.discard_note}};
  if (!whole) return j;
  j["key"] = bytes_json(l.key);
  j["value"] = bytes_json(l.value);
  j["timestamp_ms"] = l.timestamp_ms;
  j["headers"] = json::array();
  for (const auto& h : l.headers) j["headers"].push_back({{"name", h.name}, {"value", bytes_json(h.value)}});
  return j;
}

json decoded_json(const dlq::LetterRow& l, const format::RecordDecoder& decoder) {
  const auto d = decoder.decode(l.value ? std::optional<std::string_view>(*l.value) : std::nullopt,
                                l.key ? std::optional<std::string_view>(*l.key) : std::nullopt);
  auto parsed = [](const std::optional<std::string>& text) {
    json j = text ? json::parse(*text, nullptr, false) : json(nullptr);
    return j.is_discarded() ? json(nullptr) : j;  // a key that is not JSON: the problem says so
  };
  json j = {{"value", parsed(d.value_json)}, {"key", parsed(d.key_json)}};
  if (d.registry) {
    d.registry->when_cached(d.schema_id, [] {});
    j["problem"] = "schema id " + std::to_string(d.schema_id) + " is not fetched by this host yet (" +
                   (d.registry->up() ? "asked for now" : "the registry: " + d.registry->problem()) +
                   "): look again in a moment";
  } else if (d.undecodable) {
    j["problem"] = *d.undecodable;
  }
  return j;
}

const char* answer_name(idemsink_outcome o) {
  switch (o) {
    case IDEMSINK_OUTCOME_OK: return "applied";
    case IDEMSINK_OUTCOME_PERMANENT: return "not_applied";
    default: return "cannot_tell";
  }
}

}  // namespace idemsink::admin
