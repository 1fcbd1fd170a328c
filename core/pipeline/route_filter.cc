#include "core/pipeline/route_filter.h"

#include <simdjson.h>

#include <optional>
#include <string_view>

namespace idemsink::pipeline {

using config::Condition;

struct RouteFilter::Json {
  simdjson::dom::parser parser;
};

namespace {

// A field's value as a test compares it: a string as itself, a number or
// boolean as its JSON text; nothing for an object, array or null (no text
// equals them), and nothing when the field is absent.
struct Field {
  bool present = false;
  std::optional<std::string> text;
};

Field json_field(simdjson::dom::element doc, const std::string& dotted) {
  simdjson::dom::element at = doc;
  size_t from = 0;
  for (;;) {
    const size_t dot = dotted.find('.', from);
    const std::string_view name(dotted.data() + from, (dot == std::string::npos ? dotted.size() : dot) - from);
    simdjson::dom::object obj;
    if (at.get_object().get(obj)) return {};
    if (obj.at_key(name).get(at)) return {};
    if (dot == std::string::npos) break;
    from = dot + 1;
  }
  Field f{true, std::nullopt};
  if (at.is_string()) {
    f.text = std::string(at.get_string().value_unsafe());
  } else if (at.is_int64() || at.is_uint64() || at.is_double() || at.is_bool()) {
    f.text = simdjson::minify(at);
  }
  return f;
}

Field header_field(const rd_kafka_message_t* msg, const std::string& name) {
  rd_kafka_headers_t* hdrs = nullptr;
  const void* v = nullptr;
  size_t n = 0;
  if (rd_kafka_message_headers(msg, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR ||
      rd_kafka_header_get_last(hdrs, name.c_str(), &v, &n) != RD_KAFKA_RESP_ERR_NO_ERROR)
    return {};
  return {true, v ? std::optional(std::string(static_cast<const char*>(v), n)) : std::nullopt};
}

Field key_field(const RecordView& record) {
  if (!record.key) return {};
  return {true, std::string(*record.key)};
}

bool passes(const Condition& c, const Field& f) {
  switch (c.test) {
    case Condition::Test::Exists: return f.present;
    case Condition::Test::Absent: return !f.present;
    case Condition::Test::Equals: return f.text && *f.text == c.values.front();
    case Condition::Test::StartsWith: return f.text && f.text->starts_with(c.values.front());
    case Condition::Test::OneOf:
      for (const auto& v : c.values)
        if (f.text && *f.text == v) return true;
      return false;
  }
  return false;
}

bool holds(const Condition& c, const RecordView& record, simdjson::dom::element doc) {
  switch (c.kind) {
    case Condition::Kind::All:
      for (const auto& p : c.parts)
        if (!holds(p, record, doc)) return false;
      return true;
    case Condition::Kind::Any:
      for (const auto& p : c.parts)
        if (holds(p, record, doc)) return true;
      return false;
    case Condition::Kind::Not: return !holds(c.parts.front(), record, doc);
    case Condition::Kind::Test: break;
  }
  switch (c.subject) {
    case Condition::Subject::Json: return passes(c, json_field(doc, c.name));
    case Condition::Subject::Header: return passes(c, header_field(record.msg, c.name));
    case Condition::Subject::Key: return passes(c, key_field(record));
  }
  return false;
}

}  // namespace

RouteFilter::RouteFilter(Condition condition) : condition_(std::move(condition)), json_(std::make_unique<Json>()) {}
RouteFilter::~RouteFilter() = default;
RouteFilter::RouteFilter(RouteFilter&&) noexcept = default;

RouteFilter::Result RouteFilter::decide(const RecordView& record) {
  simdjson::dom::element doc;
  if (condition_.needs_json()) {
    if (record.value.empty())
      return {Verdict::Undecodable, "empty value; [route.when] (" + condition_.describe() + ") needs it as JSON"};
    if (auto err = json_->parser.parse(record.value.data(), record.value.size()).get(doc))
      return {Verdict::Undecodable, std::string("value is not JSON (") + simdjson::error_message(err) +
                                        "); [route.when] (" + condition_.describe() + ") needs it as JSON"};
  }
  return {holds(condition_, record, doc) ? Verdict::Take : Verdict::Skip, {}};
}

}  // namespace idemsink::pipeline
