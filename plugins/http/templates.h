// The HTTP plugin's templates: Mustache over one record, escaped for where
// the text lands (a URL, a JSON body, a form), checked when the route is
// loaded so that no record can make an invalid request out of a valid
// template. No code, no files: partials and custom delimiters are refused.
#pragma once

#include <kainjow/mustache.hpp>

#include <mutex>
#include <string>
#include <vector>

#include <idemsink/sdk.h>

namespace idemsink::plugins::http {

/// Where a template's text lands, which decides how {{name}} is escaped.
enum class Escape { Url, Json, Form, None };

struct Tag;

/// A compiled template; output capped at 1 MiB (a section over a large list
/// must not take the host's memory).
class Template {
 public:
  /// Throws std::invalid_argument naming `option` when the text is not a
  /// template this plugin can fill for every record (`lookup`: for the
  /// reconciler, which has the record's key, value and token only).
  Template(const std::string& option, const std::string& text, Escape escape, bool lookup = false);

  /// Throws std::invalid_argument when the record makes no valid text
  /// (a dot segment in a URL, more than the cap).
  std::string render(const kainjow::mustache::data& d);
  /// Whether {{idem_token}} is sent whatever the record (a top-level variable).
  bool sends_token() const { return sends_token_; }
  /// The template with every tag replaced by a stand-in: `{{x}}` by text,
  /// `{{{x}}}` by a JSON value, sections by nothing; a JSON body must parse
  /// then, or a record could never make a valid one.
  const std::string& skeleton() const { return skeleton_; }

 private:
  void check(const std::string& option, const std::vector<Tag>& tags, bool lookup);

  // The engine and the reconciler render from their own threads; the
  // library does not promise that one template renders concurrently.
  std::mutex mu_;
  kainjow::mustache::mustache tmpl_;
  Escape escape_;
  bool sends_token_ = false;
  std::string skeleton_;
};

/// What the templates see of one record: value.* (the value's fields as
/// text), json.* (as JSON), value_json, key, biz_key, idem_token, topic,
/// partition, offset, timestamp_ms, attempt, headers.*.
kainjow::mustache::data record_data(const sdk::Record& rec);

}  // namespace idemsink::plugins::http
