#include "plugins/http/templates.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <set>
#include <stdexcept>
#include <string_view>

#include "plugins/common/remote.h"

namespace idemsink::plugins::http {

using json = nlohmann::json;
namespace mustache = kainjow::mustache;

/// One {{tag}} of a template, as the checks see it.
struct Tag {
  size_t begin = 0, end = 0;  // [begin, end) in the text
  bool raw = false;           // {{{name}}} or {{& name}}
  char sigil = 0;             // '#', '^', '/', '!', '>', '=' or 0 for a variable
  std::string name;
  int depth = 0;  // sections around it
};

namespace {

/// The names a template may start from; below value, json and headers any path.
const std::set<std::string> kRoots = {"value", "json",      "value_json", "key",          "biz_key", "idem_token",
                                      "topic", "partition", "offset",     "timestamp_ms", "attempt", "headers"};
/// What a reconcile look-up cannot use: the reconciler knows the record's
/// key, value and token, not the headers or the call that is asked about.
const std::set<std::string> kNotInLookups = {"headers", "attempt"};

/// Longest text a template may render: a section over a large list must not
/// take the host's memory.
constexpr size_t kMaxRendered = 1 << 20;

std::string percent_encode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

/// Empty and dot segments of a URL's path: a record that adds one (an
/// empty or ".." field) would name another resource (the collection, its
/// parent), so such a request is refused instead.
size_t odd_segments(std::string_view url) {
  const std::string_view path = url.substr(0, url.find('?'));
  size_t n = 0;
  for (size_t at = 1; at <= path.size();) {
    const size_t slash = std::min(path.find('/', at), path.size());
    const std::string_view seg = path.substr(at, slash - at);
    n += seg.empty() || seg == "." || seg == "..";
    at = slash + 1;
  }
  return n;
}

/// The text of a JSON string without its quotes.
std::string json_string_content(const std::string& s) {
  const std::string quoted = json(s).dump(-1, ' ', false, json::error_handler_t::replace);
  return quoted.substr(1, quoted.size() - 2);
}

std::vector<Tag> tags_of(const std::string& option, const std::string& text) {
  std::vector<Tag> out;
  int depth = 0;
  for (size_t at = text.find("{{"); at != std::string::npos; at = text.find("{{", at)) {
    Tag t;
    t.begin = at;
    const bool triple = text.compare(at, 3, "{{{") == 0;
    const size_t close = text.find(triple ? "}}}" : "}}", at + (triple ? 3 : 2));
    if (close == std::string::npos) throw std::invalid_argument(option + ": a tag is not closed");
    t.end = close + (triple ? 3 : 2);
    std::string inner = text.substr(at + (triple ? 3 : 2), close - at - (triple ? 3 : 2));
    // Trimmed as the renderer trims (std::isspace): the check must read the
    // tags the renderer will, or a name led by a line break would hide a
    // sigil from it ({{\n&x}} unescaped, {{\n=<% %>=}} new delimiters).
    auto trim = [](std::string& x) {
      while (!x.empty() && std::isspace(static_cast<unsigned char>(x.front()))) x.erase(0, 1);
      while (!x.empty() && std::isspace(static_cast<unsigned char>(x.back()))) x.pop_back();
    };
    trim(inner);
    t.raw = triple;
    if (!triple && !inner.empty() && std::string_view("#^/!>=&").find(inner[0]) != std::string_view::npos) {
      t.sigil = inner[0] == '&' ? 0 : inner[0];
      t.raw = inner[0] == '&';
      inner.erase(0, 1);
      trim(inner);
    }
    t.name = inner;
    for (unsigned char c : t.sigil == '!' || t.sigil == '=' ? std::string() : t.name)
      if (std::isspace(c) || std::iscntrl(c))
        throw std::invalid_argument(option + ": the tag {{" + t.name +
                                    "}} has a space or control character in its name");
    if (t.sigil == '/') --depth;
    t.depth = depth;
    if (t.sigil == '#' || t.sigil == '^') ++depth;
    out.push_back(std::move(t));
    at = out.back().end;
  }
  return out;
}

// The template with every tag replaced by a stand-in (Template::skeleton()).
std::string skeleton_of(const std::string& text) {
  std::string out;
  size_t last = 0;
  for (const Tag& t : tags_of("", text)) {
    out.append(text, last, t.begin - last);
    if (t.sigil == 0) out += t.raw ? "0" : "x";
    last = t.end;
  }
  out.append(text, last, std::string::npos);
  return out;
}

/// A JSON tree as Mustache data. `as_json` false (value.*): strings as
/// themselves, numbers as their text, booleans as Mustache booleans (for
/// sections), null as false. `as_json` true (json.*): every leaf as its JSON
/// text, strings quoted.
mustache::data to_data(const json& j, bool as_json) {
  switch (j.type()) {
    case json::value_t::object: {
      mustache::data d{mustache::data::type::object};
      for (const auto& [k, v] : j.items()) d.set(k, to_data(v, as_json));
      return d;
    }
    case json::value_t::array: {
      mustache::data d{mustache::data::type::list};
      for (const auto& v : j) d.push_back(to_data(v, as_json));
      return d;
    }
    default: break;
  }
  if (as_json) return mustache::data(j.dump(-1, ' ', false, json::error_handler_t::replace));
  switch (j.type()) {
    case json::value_t::string: return mustache::data(j.get<std::string>());
    case json::value_t::boolean: return mustache::data(j.get<bool>());
    case json::value_t::null: return mustache::data(false);
    default: return mustache::data(j.dump());
  }
}

}  // namespace

Template::Template(const std::string& option, const std::string& text, Escape escape, bool lookup)
    : tmpl_(text), escape_(escape) {
  if (!tmpl_.is_valid()) throw std::invalid_argument(option + ": not a valid template: " + tmpl_.error_message());
  check(option, tags_of(option, text), lookup);
  switch (escape_) {
    case Escape::Url: tmpl_.set_custom_escape(percent_encode); break;
    case Escape::Json: tmpl_.set_custom_escape(json_string_content); break;
    case Escape::Form: tmpl_.set_custom_escape(percent_encode); break;
    case Escape::None: tmpl_.set_custom_escape([](const std::string& s) { return s; }); break;
  }
  skeleton_ = skeleton_of(text);
}

std::string Template::render(const mustache::data& d) {
  std::lock_guard lock(mu_);
  std::string out;
  tmpl_.render(d, [&out](const std::string& piece) {
    if (out.size() + piece.size() > kMaxRendered)
      throw std::invalid_argument("the template renders more than " + std::to_string(kMaxRendered) + " bytes");
    out += piece;
  });
  if (escape_ == Escape::Url &&
      std::any_of(out.begin(), out.end(), [](unsigned char c) { return c <= 0x20 || c >= 0x7F; }))
    throw std::invalid_argument("the URL " + json_string_content(out.substr(0, 200)) +
                                " holds a space or control character; a request line cannot carry it");
  if (escape_ == Escape::Url && odd_segments(out) > odd_segments(skeleton_))
    throw std::invalid_argument("the URL " + out.substr(0, 200) + " has an empty or dot segment the template has not");
  return out;
}

void Template::check(const std::string& option, const std::vector<Tag>& tags, bool lookup) {
  for (const Tag& t : tags) {
    if (t.sigil == '!' || t.sigil == '/') continue;
    if (t.sigil == '>') throw std::invalid_argument(option + ": partials ({{>" + t.name + "}}) are not supported");
    if (t.sigil == '=') throw std::invalid_argument(option + ": changing the delimiters is not supported");
    const std::string root = t.name.substr(0, t.name.find('.'));
    if (t.depth == 0 && t.name != ".") {
      if (!kRoots.count(root)) {
        std::string known;
        for (const auto& r : kRoots) known += (known.empty() ? "" : ", ") + r;
        throw std::invalid_argument(option + ": {{" + t.name + "}} names no field of a record (known: " + known + ")");
      }
      if (lookup && kNotInLookups.count(root))
        throw std::invalid_argument(option + ": {{" + t.name + "}} is not known when the look-up runs (" +
                                    "the reconciler has the record's key, value and token only)");
    }
    if (t.raw && escape_ == Escape::Url)
      throw std::invalid_argument(option + ": {{{" + t.name + "}}} inserts unescaped text into a URL");
    // In JSON, text inserted as is must be JSON itself: the value's own
    // JSON, or a field of it as JSON (json.*: strings quoted).
    if (t.raw && escape_ == Escape::Json && (t.depth > 0 || (t.name != "value_json" && root != "json")))
      throw std::invalid_argument(option + ": {{{" + t.name + "}}} inserts text as is into JSON: use " + "{{{json." +
                                  (root == "value" ? t.name.substr(std::min(t.name.size(), size_t{6})) : t.name) +
                                  "}}} (a field as JSON) or {{{value_json}}}");
    if (t.sigil == 0 && t.depth == 0 && t.name == "idem_token") sends_token_ = true;
  }
}

mustache::data record_data(const sdk::Record& rec) {
  // The one walk of a record's value, for every template (call, look-up):
  // the tree is built recursively, so a value nested deeper than the JSON
  // writer can take is refused here, before anything walks it.
  if (const size_t depth = json_depth(rec.json()); depth > kMaxJsonDepth)
    throw std::invalid_argument("the record value nests " + std::to_string(depth) + " levels deep (at most " +
                                std::to_string(kMaxJsonDepth) + ")");
  const json value = order_payload(rec);
  mustache::data d;
  d.set("value", to_data(value, false));
  d.set("json", to_data(value, true));
  d.set("value_json", value.dump(-1, ' ', false, json::error_handler_t::replace));
  d.set("key", std::string(rec.key()));
  d.set("biz_key", std::string(rec.biz_key()));
  d.set("idem_token", std::string(rec.idem_token()));
  d.set("topic", std::string(rec.topic()));
  d.set("partition", std::to_string(rec.partition()));
  d.set("offset", std::to_string(rec.offset()));
  d.set("timestamp_ms", std::to_string(rec.timestamp_ms()));
  d.set("attempt", std::to_string(rec.attempt()));
  mustache::data headers;
  for (size_t i = 0; i < rec.raw()->header_count; ++i) {
    const auto& h = rec.raw()->headers[i];
    if (h.name && h.value.data && valid_utf8(std::string_view(h.value.data, h.value.len)))
      headers.set(h.name, std::string(h.value.data, h.value.len));
  }
  d.set("headers", headers);
  return d;
}

}  // namespace idemsink::plugins::http
