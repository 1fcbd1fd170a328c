// The biz_key of a record from its JSON value (route key = { from = "json" })
// and from its Kafka key: any bytes give a key or a refusal, never a crash.
#include <librdkafka/rdkafka.h>

#include <cstdint>
#include <map>
#include <string>
#include <variant>

#include "core/pipeline/key_extractor.h"

namespace {

idemsink::pipeline::KeyExtractor& extractor(idemsink::config::KeySource source, const std::string& path) {
  static std::map<std::string, idemsink::pipeline::KeyExtractor> all;
  auto it = all.find(path);
  if (it == all.end()) {
    idemsink::config::RouteConfig route;
    route.key_source = source;
    route.key_json_path = path;
    it = all.emplace(path, idemsink::pipeline::KeyExtractor(route)).first;
  }
  return it->second;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rd_kafka_message_t msg{};
  msg.payload = const_cast<uint8_t*>(data);
  msg.len = size;
  msg.key = const_cast<uint8_t*>(data);
  msg.key_len = size;
  using idemsink::config::KeySource;
  for (const char* path : {"order.id", "id", "a.b.c.d"}) {
    auto r = extractor(KeySource::JsonField, path).extract(idemsink::pipeline::RecordView::raw(&msg));
    if (auto* key = std::get_if<std::string>(&r); key && key->empty()) __builtin_trap();
  }
  (void)extractor(KeySource::MessageKey, "").extract(idemsink::pipeline::RecordView::raw(&msg));
  return 0;
}
