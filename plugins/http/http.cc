// http: a remote call described by route options, no code of the user's.
//
// The request (method, path, body) is built from Mustache templates over the
// record; the idem_token goes out as a header or inside the body; the answer
// becomes an outcome through a status table; the receipt is a JSON pointer
// into the answer (or a header); an optional look-up by token settles what
// the core parks as unknown. Built twice from this file: libidemsink_http.so
// (remote_idempotent: the service honours the token, the core may call again)
// and libidemsink_http_at_most_once.so (the core never calls twice; an
// uncertain answer is parked and asked about).
//
// Delivery semantics stay the core's: this plugin only says, per answer,
// whether the effect happened (ok), certainly did not (permanent, retryable)
// or may have (uncertain). Anything decided before sending (a body that is
// not JSON, a value nested too deep) is permanent: it was never sent.
#include <kainjow/mustache.hpp>

#include <charconv>
#include <map>
#include <mutex>
#include <regex>
#include <set>

#include "plugins/common/remote.h"

#ifndef IDEMSINK_HTTP_AT_MOST_ONCE
#define IDEMSINK_HTTP_AT_MOST_ONCE 0
#endif

namespace {

using namespace idemsink;
using namespace idemsink::plugins;
using json = nlohmann::json;
namespace mustache = kainjow::mustache;

constexpr idemsink_option_decl kOptions[] = {
    IDEMSINK_REMOTE_OPTIONS("http://127.0.0.1:8080"),
    {"method", IDEMSINK_OPTION_STRING, "POST", "HTTP method of the call"},
    {"path", IDEMSINK_OPTION_STRING, nullptr,
     "request target, a template: /orders/{{biz_key}} ({{name}} is percent-encoded, {{{name}}} inserted as is)"},
    {"body", IDEMSINK_OPTION_STRING, "",
     "request body, a template; JSON-escaped in JSON bodies; empty: the record value as it is"},
    {"content_type", IDEMSINK_OPTION_STRING, "application/json",
     "Content-Type of the body; a JSON type makes the body checked as JSON before sending"},
    {"token_header", IDEMSINK_OPTION_STRING, "Idempotency-Key",
     "header carrying the idem_token; empty when the templates put {{idem_token}} elsewhere"},
    {"outcomes", IDEMSINK_OPTION_STRING, "",
     "overrides of the status table, e.g. \"409=lookup 423=retryable 5xx=uncertain\" "
     "(ok, permanent, retryable, uncertain, lookup)"},
    {"receipt", IDEMSINK_OPTION_STRING, "",
     "where the receipt is: a JSON pointer into the answer (/data/id) or header:NAME; empty: none"},
    {"lookup_path", IDEMSINK_OPTION_STRING, "",
     "GET target asking whether the call happened, a template (/orders/by-key/{{idem_token}}); empty: no look-up"},
    {"lookup_receipt", IDEMSINK_OPTION_STRING, "",
     "JSON pointer to the receipt in the look-up's answer; empty: the same as receipt"},
    {"lookup_not_found", IDEMSINK_OPTION_STRING, "404",
     "look-up answers meaning \"certainly not applied\": statuses, and 'empty' for a 2xx without the receipt"},
};

// --- templates -------------------------------------------------------------

/// Where a template's text lands, which decides how {{name}} is escaped.
enum class Escape { Url, Json, None };

/// The names a template may start from; below value and headers any path.
const std::set<std::string> kRoots = {"value",     "value_json", "key",     "biz_key", "idem_token",
                                      "topic",     "partition",  "offset",  "timestamp_ms",
                                      "attempt",   "headers"};

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

/// The text of a JSON string without its quotes.
std::string json_string_content(const std::string& s) {
  const std::string quoted = json(s).dump(-1, ' ', false, json::error_handler_t::replace);
  return quoted.substr(1, quoted.size() - 2);
}

/// A compiled template. Mustache: no code, no files (partials and custom
/// delimiters are refused), output bounded by the template times the record.
class Template {
 public:
  Template(const std::string& option, const std::string& text, Escape escape)
      : text_(text), tmpl_(text), escape_(escape) {
    if (!tmpl_.is_valid()) throw std::invalid_argument(option + ": not a valid template: " + tmpl_.error_message());
    check_names(option);
    switch (escape_) {
      case Escape::Url: tmpl_.set_custom_escape(percent_encode); break;
      case Escape::Json: tmpl_.set_custom_escape(json_string_content); break;
      case Escape::None: tmpl_.set_custom_escape([](const std::string& s) { return s; }); break;
    }
  }

  // The engine and the reconciler render from their own threads; the
  // library does not promise that one template renders concurrently.
  std::string render(const mustache::data& d) {
    std::lock_guard lock(mu_);
    return tmpl_.render(d);
  }
  bool mentions(const std::string& name) const { return text_.find(name) != std::string::npos; }

  /// The template with every tag replaced by a stand-in: `{{x}}` by text,
  /// `{{{x}}}` by a JSON value, sections by nothing; a JSON body must parse
  /// then, or a record could never make a valid one.
  std::string skeleton() const {
    static const std::regex tag(R"(\{\{\{[^}]*\}\}\}|\{\{([#^/!&]?)[^}]*\}\})");
    std::string out;
    auto last = text_.cbegin();
    for (auto it = std::sregex_iterator(text_.begin(), text_.end(), tag); it != std::sregex_iterator(); ++it) {
      out.append(last, text_.cbegin() + it->position());
      const std::string m = it->str();
      const std::string kind = (*it)[1].str();
      if (m.rfind("{{{", 0) == 0 || kind == "&") out += "0";
      else if (kind.empty()) out += "x";
      last = text_.cbegin() + it->position() + it->length();
    }
    out.append(last, text_.cend());
    return out;
  }

 private:
  // Names at the top level must start from a record field; inside a section
  // they are relative to its item and cannot be checked here.
  void check_names(const std::string& option) const {
    static const std::regex tag(R"(\{\{(\{?)\s*([#^/!&>=]?)\s*([^}\s]*)\s*\}?\}\})");
    int depth = 0;
    for (auto it = std::sregex_iterator(text_.begin(), text_.end(), tag); it != std::sregex_iterator(); ++it) {
      const std::string kind = (*it)[2].str();
      const std::string name = (*it)[3].str();
      if (kind == "!") continue;
      if (kind == ">") throw std::invalid_argument(option + ": partials ({{>" + name + "}}) are not supported");
      if (kind == "=") throw std::invalid_argument(option + ": changing the delimiters is not supported");
      if (kind == "/") {
        --depth;
        continue;
      }
      if (depth == 0 && name != ".") {
        const std::string root = name.substr(0, name.find('.'));
        if (!kRoots.count(root)) {
          std::string known;
          for (const auto& r : kRoots) known += (known.empty() ? "" : ", ") + r;
          throw std::invalid_argument(option + ": {{" + name + "}} names no field of a record (known: " + known + ")");
        }
      }
      if (kind == "#" || kind == "^") ++depth;
    }
  }

  std::string text_;
  std::mutex mu_;
  mustache::mustache tmpl_;
  Escape escape_;
};

/// A JSON tree as Mustache data: objects, lists, strings (numbers and
/// booleans as their JSON text, null as nothing).
mustache::data to_data(const json& j) {
  switch (j.type()) {
    case json::value_t::object: {
      mustache::data d{mustache::data::type::object};
      for (const auto& [k, v] : j.items()) d.set(k, to_data(v));
      return d;
    }
    case json::value_t::array: {
      mustache::data d{mustache::data::type::list};
      for (const auto& v : j) d.push_back(to_data(v));
      return d;
    }
    case json::value_t::string: return mustache::data(j.get<std::string>());
    case json::value_t::null: return mustache::data(std::string());
    default: return mustache::data(j.dump());
  }
}

/// What the templates see of one record.
mustache::data record_data(const sdk::Record& rec) {
  const json value = order_payload(rec);
  mustache::data d;
  d.set("value", to_data(value));
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

// --- answers ---------------------------------------------------------------

/// What an answer means. Lookup: ask the look-up before deciding (409
/// "already done" from a service that does not repeat the first answer).
enum class Meaning { Ok, Permanent, Retryable, Uncertain, Lookup };

Meaning parse_meaning(const std::string& option, const std::string& word) {
  static const std::map<std::string, Meaning> words = {{"ok", Meaning::Ok},
                                                       {"permanent", Meaning::Permanent},
                                                       {"retryable", Meaning::Retryable},
                                                       {"uncertain", Meaning::Uncertain},
                                                       {"lookup", Meaning::Lookup}};
  auto it = words.find(word);
  if (it == words.end())
    throw std::invalid_argument(option + ": unknown outcome '" + word +
                                "' (ok, permanent, retryable, uncertain, lookup)");
  return it->second;
}

/// One status (e.g. 409) or a class of them (4xx), as written in a table.
struct StatusKey {
  unsigned status = 0;  // exact status, or 0 for a class
  unsigned cls = 0;     // 1..5 for "Nxx"
};

StatusKey parse_status(const std::string& option, const std::string& s) {
  if (s.size() == 3 && s[0] >= '1' && s[0] <= '5' && s.substr(1) == "xx") return {0, unsigned(s[0] - '0')};
  unsigned v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < 100 || v > 599)
    throw std::invalid_argument(option + ": '" + s + "' is neither a status (100-599) nor a class such as 4xx");
  return {v, 0};
}

std::vector<std::string> words_of(const std::string& s) {
  std::vector<std::string> out;
  std::string w;
  for (char c : s + " ") {
    if (c == ' ' || c == ',' || c == '\t') {
      if (!w.empty()) out.push_back(std::move(w));
      w.clear();
    } else {
      w += c;
    }
  }
  return out;
}

/// Status → meaning: exact statuses first, then classes, then the defaults
/// (2xx ok; 409 lookup or ok; 408/429/503 retryable; other 4xx permanent;
/// other 5xx uncertain: the service may have acted before failing).
class StatusTable {
 public:
  StatusTable(const std::string& text, bool has_lookup) {
    const std::string option = "outcomes";
    exact_[409] = has_lookup ? Meaning::Lookup : Meaning::Ok;
    for (unsigned s : {408u, 429u, 503u}) exact_[s] = Meaning::Retryable;
    for (const auto& entry : words_of(text)) {
      const auto eq = entry.find('=');
      if (eq == std::string::npos) throw std::invalid_argument(option + ": '" + entry + "' is not STATUS=OUTCOME");
      const StatusKey k = parse_status(option, entry.substr(0, eq));
      const Meaning m = parse_meaning(option, entry.substr(eq + 1));
      if (m == Meaning::Lookup && !has_lookup)
        throw std::invalid_argument(option + ": '" + entry + "' asks the look-up, but lookup_path is not set");
      if (k.status) {
        exact_[k.status] = m;
      } else {
        classes_[k.cls] = m;
        // A class written by the user overrides the defaults inside it.
        for (auto it = exact_.begin(); it != exact_.end();)
          it = (it->first / 100 == k.cls && !written_.count(it->first)) ? exact_.erase(it) : std::next(it);
      }
      if (k.status) written_.insert(k.status);
    }
  }

  Meaning of(unsigned status) const {
    if (auto it = exact_.find(status); it != exact_.end()) return it->second;
    if (auto it = classes_.find(status / 100); it != classes_.end()) return it->second;
    if (status >= 200 && status < 300) return Meaning::Ok;
    if (status >= 500) return Meaning::Uncertain;
    return Meaning::Permanent;  // 1xx, 3xx (not followed) and 4xx
  }

 private:
  std::map<unsigned, Meaning> exact_;
  std::map<unsigned, Meaning> classes_;
  std::set<unsigned> written_;
};

/// Where a receipt is found in an answer.
class ReceiptRule {
 public:
  ReceiptRule() = default;
  ReceiptRule(const std::string& option, const std::string& text) {
    if (text.empty()) return;
    if (text.rfind("header:", 0) == 0) {
      header_ = text.substr(7);
      if (header_.empty()) throw std::invalid_argument(option + ": header: needs a header name");
      return;
    }
    if (text[0] != '/') throw std::invalid_argument(option + ": '" + text + "' is neither a JSON pointer (/a/b) nor header:NAME");
    try {
      pointer_ = json::json_pointer(text);
    } catch (const json::exception& e) {
      throw std::invalid_argument(option + ": '" + text + "' is not a JSON pointer: " + e.what());
    }
    text_ = text;
  }
  bool set() const { return !header_.empty() || !text_.empty(); }
  const std::string& text() const { return text_.empty() ? header_ : text_; }

  /// The receipt in `r`, or nothing when the answer does not carry one (an
  /// absent, null or empty value).
  std::optional<std::string> find(const HttpResult& r) const {
    if (!header_.empty()) {
      auto v = r.header(header_);
      return v && !v->empty() ? std::optional<std::string>(std::string(*v)) : std::nullopt;
    }
    const json body = json::parse(r.body, nullptr, false);
    if (body.is_discarded() || !body.contains(pointer_)) return std::nullopt;
    const json& v = body[pointer_];
    if (v.is_null() || (v.is_string() && v.get<std::string>().empty()) || (v.is_array() && v.empty()) ||
        (v.is_object() && v.empty()))
      return std::nullopt;
    return v.is_string() ? v.get<std::string>() : v.dump();
  }

 private:
  json::json_pointer pointer_;
  std::string text_;
  std::string header_;
};

/// The pause a Retry-After header asks for (delta-seconds; an HTTP-date is
/// not honoured: clocks differ, and the table's retry applies).
std::optional<std::chrono::milliseconds> retry_after(const HttpResult& r) {
  const auto v = r.header("Retry-After");
  if (!v) return std::nullopt;
  int64_t s = 0;
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), s);
  if (ec != std::errc() || p != v->data() + v->size() || s < 0) return std::nullopt;
  return std::chrono::seconds(s);
}

/// The meaning of `r` in a short text for last_error, with Retry-After when
/// the service sent one.
std::string explain(const HttpResult& r) {
  std::string s = describe(r);
  if (auto after = r.header("Retry-After")) s += " (Retry-After: " + std::string(*after) + ")";
  return s;
}

// --- the handler -----------------------------------------------------------

class Http {
 public:
  Http(const sdk::Host& host, const sdk::Options& o)
      : host_(host),
        http_(client_options(o)),
        method_(o.str("method")),
        path_("path", o.str("path"), Escape::Url),
        body_(o.str("body").empty() ? std::nullopt
                                    : std::optional<Template>(std::in_place, "body", o.str("body"), body_escape(o))),
        json_body_(is_json_type(o.str("content_type"))),
        content_type_(o.str("content_type")),
        token_header_(o.str("token_header")),
        lookup_(o.str("lookup_path").empty()
                    ? std::nullopt
                    : std::optional<Template>(std::in_place, "lookup_path", o.str("lookup_path"), Escape::Url)),
        table_(o.str("outcomes"), lookup_.has_value()),
        receipt_("receipt", o.str("receipt")),
        lookup_receipt_(o.str("lookup_receipt").empty() ? receipt_
                                                        : ReceiptRule("lookup_receipt", o.str("lookup_receipt"))) {
    static const std::set<std::string> methods = {"POST", "PUT", "PATCH", "DELETE", "GET"};
    if (!methods.count(method_)) throw std::invalid_argument("method: '" + method_ + "' is not one of POST, PUT, PATCH, DELETE, GET");
    if (o.str("path").empty() || o.str("path")[0] != '/') throw std::invalid_argument("path: must start with /");
    if (lookup_ && o.str("lookup_path")[0] != '/') throw std::invalid_argument("lookup_path: must start with /");
    if (body_ && json_body_) {
      const json probe = json::parse(body_->skeleton(), nullptr, false);
      if (probe.is_discarded())
        throw std::invalid_argument(
            "body: is not JSON once filled in ({{name}} inserts escaped text: quote it; {{{name}}} inserts as is, "
            "e.g. {{{value_json}}})");
    }
    if (token_header_.find_first_of(": \r\n") != std::string::npos)
      throw std::invalid_argument("token_header: '" + token_header_ + "' is not a header name");
    const bool token_in_templates = path_.mentions("idem_token") || (body_ && body_->mentions("idem_token"));
    if (token_header_.empty() && !token_in_templates)
      throw std::invalid_argument(
          "token_header: is empty and no template sends {{idem_token}}: the service could not tell a retry from a "
          "new call");
    for (const auto& entry : words_of(o.str("lookup_not_found"))) {
      if (entry == "empty")
        not_found_empty_ = true;
      else
        not_found_.insert(parse_status("lookup_not_found", entry).status);
    }
    if (not_found_empty_ && !lookup_receipt_.set())
      throw std::invalid_argument("lookup_not_found: 'empty' needs a receipt pointer (receipt or lookup_receipt)");
  }

  void invoke(const sdk::Record& rec, sdk::Completion done) {
    if (auto why = unsendable(rec)) return done.permanent(*why);
    mustache::data d = record_data(rec);
    std::string body = body_ ? body_->render(d) : std::string(rec.value());
    if (json_body_ && body_ && json::parse(body, nullptr, false).is_discarded())
      return done.permanent("the body built for this record is not JSON: " + body.substr(0, 200));
    HttpClient::Headers headers{{"Content-Type", content_type_}};
    if (!token_header_.empty()) headers.emplace_back(token_header_, std::string(rec.idem_token()));
    // The look-up target is rendered now: the record does not outlive invoke().
    std::string lookup = lookup_ ? lookup_->render(d) : std::string();
    http_.request(method_, path_.render(d), std::move(body), std::move(headers),
                  guarded_call(host_, rec, std::move(done),
                               [this, lookup = std::move(lookup)](const sdk::SharedCompletion& done,
                                                                  const HttpResult& r) { answer(done, r, lookup); }));
  }

  // Did the call with this token happen? Without a look-up nobody can say
  // here: the row waits for a person (idemsink resolve).
  void reconcile(const sdk::Record& rec, sdk::Completion done) {
    if (!lookup_) return done.retryable("no lookup_path configured for this route: settle it with idemsink resolve");
    mustache::data d = record_data(rec);
    ask(rec, lookup_->render(d), std::move(done));
  }

 private:
  static Escape body_escape(const sdk::Options& o) { return is_json_type(o.str("content_type")) ? Escape::Json : Escape::None; }
  static bool is_json_type(const std::string& t) { return t.find("json") != std::string::npos; }

  void answer(const sdk::SharedCompletion& done, const HttpResult& r, const std::string& lookup) {
    if (r.failure != HttpResult::Failure::None) return done.report(classify(r), explain(r));
    switch (table_.of(r.status)) {
      case Meaning::Ok: return done.ok(receipt_of(r));
      case Meaning::Permanent: return done.permanent(explain(r));
      case Meaning::Retryable:
        if (auto pause = retry_after(r)) return done.retry_after(*pause, explain(r));
        return done.retryable(explain(r));
      case Meaning::Uncertain: return done.uncertain(explain(r));
      case Meaning::Lookup:
        // "Already done" without the first answer: the look-up has the
        // receipt; if it cannot tell, the call stays uncertain.
        return ask_after(done, lookup, explain(r));
    }
  }

  std::string receipt_of(const HttpResult& r) const {
    if (!receipt_.set()) return "HTTP " + std::to_string(r.status);
    if (auto v = receipt_.find(r)) return *v;
    // The service answered as success: the effect happened, only the
    // receipt is missing.
    return "no receipt at " + receipt_.text() + " in the answer: " + r.body.substr(0, 200);
  }

  /// The look-up after an answer meaning "already done": found → ok; else
  /// uncertain (the service said it was done; nothing here contradicts it
  /// for sure).
  void ask_after(const sdk::SharedCompletion& done, const std::string& target, const std::string& first) {
    http_.request("GET", target, "", {}, [this, done, first](HttpResult r) {
      try {
        if (auto found = found_in(r)) return done.ok(*found);
        done.uncertain(first + "; look-up: " + explain(r));
      } catch (const std::exception& e) {
        done.uncertain(first + "; look-up unreadable: " + e.what());
      }
    });
  }

  /// The reconcile question: found → ok (receipt), certainly not applied →
  /// permanent, anything else → cannot tell now.
  void ask(const sdk::Record& rec, const std::string& target, sdk::Completion done) {
    http_.request("GET", target, "", {},
                  guarded_question(host_, rec, std::move(done),
                          [this](const sdk::SharedCompletion& done, const HttpResult& r) {
                            if (r.failure == HttpResult::Failure::None && (not_found_.count(r.status) ||
                                                                           (not_found_empty_ && ok_status(r) &&
                                                                            !lookup_receipt_.find(r))))
                              return done.permanent("the service has no call with this token: " + explain(r));
                            if (auto found = found_in(r)) return done.ok(*found);
                            done.retryable("the look-up cannot tell: " + explain(r));
                          }));
  }

  static bool ok_status(const HttpResult& r) { return r.status >= 200 && r.status < 300; }

  /// The receipt of a look-up answer that says "found".
  std::optional<std::string> found_in(const HttpResult& r) const {
    if (r.failure != HttpResult::Failure::None || !ok_status(r)) return std::nullopt;
    if (!lookup_receipt_.set()) return "HTTP " + std::to_string(r.status);
    return lookup_receipt_.find(r);
  }

  sdk::Host host_;
  HttpClient http_;
  std::string method_;
  Template path_;
  std::optional<Template> body_;
  bool json_body_;
  std::string content_type_;
  std::string token_header_;
  std::optional<Template> lookup_;
  StatusTable table_;
  ReceiptRule receipt_;
  ReceiptRule lookup_receipt_;
  std::set<unsigned> not_found_;
  bool not_found_empty_ = false;
};

}  // namespace

#if IDEMSINK_HTTP_AT_MOST_ONCE
IDEMSINK_PLUGIN(Http, .name = "http_at_most_once", .version = "1.0.0",
                .description = "a configured HTTP call to a service without idempotency (at most once)",
                .kind = IDEMSINK_KIND_REMOTE_AT_MOST_ONCE, .options = kOptions)
#else
IDEMSINK_PLUGIN(Http, .name = "http", .version = "1.0.0",
                .description = "a configured HTTP call; the service honours the idem_token (exactly once)",
                .kind = IDEMSINK_KIND_REMOTE_IDEMPOTENT, .options = kOptions)
#endif
