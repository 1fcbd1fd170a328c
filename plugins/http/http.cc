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
#include "plugins/http/templates.h"

#ifndef IDEMSINK_HTTP_AT_MOST_ONCE
#define IDEMSINK_HTTP_AT_MOST_ONCE 0
#endif

namespace {

using namespace idemsink;
using namespace idemsink::plugins;
using idemsink::plugins::http::Escape;
using idemsink::plugins::http::record_data;
using idemsink::plugins::http::Template;
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

/// Status → meaning: exact statuses first, then classes, then the defaults:
/// 2xx ok; 409 asks the look-up (without one: uncertain, it may mean "still
/// in progress"); 408/429 retryable; 503 retryable, except at most once:
/// a gateway answers 503 for a request it already forwarded, so there only
/// with Retry-After (the service's own "not now"); other 4xx and 3xx
/// permanent; 1xx and other 5xx uncertain (the service may have acted).
class StatusTable {
 public:
  StatusTable(const std::string& text, bool has_lookup, bool at_most_once) : at_most_once_(at_most_once) {
    const std::string option = "outcomes";
    exact_[409] = has_lookup ? Meaning::Lookup : Meaning::Uncertain;
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
        written_.insert(k.status);
      } else {
        classes_[k.cls] = m;
        // A class written by the user overrides the defaults inside it.
        for (auto it = exact_.begin(); it != exact_.end();)
          it = (it->first / 100 == k.cls && !written_.count(it->first)) ? exact_.erase(it) : std::next(it);
      }
    }
  }

  Meaning of(unsigned status, bool retry_after) const {
    if (auto it = exact_.find(status); it != exact_.end()) {
      if (status == 503 && at_most_once_ && !written_.count(503) && !retry_after) return Meaning::Uncertain;
      return it->second;
    }
    if (auto it = classes_.find(status / 100); it != classes_.end()) return it->second;
    if (status >= 200 && status < 300) return Meaning::Ok;
    if (status >= 500 || status < 200) return Meaning::Uncertain;
    return Meaning::Permanent;  // 3xx (not followed) and 4xx
  }

 private:
  bool at_most_once_;
  std::map<unsigned, Meaning> exact_;
  std::map<unsigned, Meaning> classes_;
  std::set<unsigned> written_;
};

/// Where a receipt is found in an answer.
class ReceiptRule {
 public:
  /// What an answer holds at the rule's place: the receipt; an answer that
  /// was read and has none there (absent, null, "", [] or {}); or an answer
  /// that could not be read (not JSON): nobody can say.
  struct Found {
    enum class Kind { Receipt, Absent, Unreadable } kind;
    std::string receipt;
  };

  ReceiptRule() = default;
  ReceiptRule(const std::string& option, const std::string& text) {
    if (text.empty()) return;
    if (text.rfind("header:", 0) == 0) {
      header_ = text.substr(7);
      if (header_.empty()) throw std::invalid_argument(option + ": header: needs a header name");
      return;
    }
    if (text[0] != '/')
      throw std::invalid_argument(option + ": '" + text + "' is neither a JSON pointer (/a/b) nor header:NAME");
    try {
      pointer_ = json::json_pointer(text);
    } catch (const json::exception& e) {
      throw std::invalid_argument(option + ": '" + text + "' is not a JSON pointer: " + e.what());
    }
    text_ = text;
  }
  bool set() const { return !header_.empty() || !text_.empty(); }
  const std::string& text() const { return text_.empty() ? header_ : text_; }

  Found find(const HttpResult& r) const {
    using Kind = Found::Kind;
    if (!header_.empty()) {
      auto v = r.header(header_);
      return v && !v->empty() ? Found{Kind::Receipt, std::string(*v)} : Found{Kind::Absent, {}};
    }
    const json body = json::parse(r.body, nullptr, false);
    if (body.is_discarded()) return {Kind::Unreadable, {}};
    if (!body.contains(pointer_)) return {Kind::Absent, {}};
    const json& v = body[pointer_];
    if (v.is_null() || (v.is_string() && v.get<std::string>().empty()) || (v.is_array() && v.empty()) ||
        (v.is_object() && v.empty()))
      return {Kind::Absent, {}};
    return {Kind::Receipt, v.is_string() ? v.get<std::string>() : v.dump()};
  }

 private:
  json::json_pointer pointer_;
  std::string text_;
  std::string header_;
};

/// The meaning of `r` in a short text for last_error, with Retry-After when
/// the service sent one.
std::string explain(const HttpResult& r) {
  std::string s = describe(r);
  if (auto after = r.header("Retry-After")) s += " (Retry-After: " + std::string(*after) + ")";
  return s;
}

/// When reading an answer throws: a 2xx is applied, a failure before
/// sending is not, anything else may be.
idemsink_outcome on_unreadable(const HttpResult& r) {
  if (r.failure == HttpResult::Failure::BeforeSend) return IDEMSINK_OUTCOME_RETRYABLE;
  if (r.failure == HttpResult::Failure::None && r.status >= 200 && r.status < 300) return IDEMSINK_OUTCOME_OK;
  return IDEMSINK_OUTCOME_UNCERTAIN;
}

// --- the handler -----------------------------------------------------------

class Http {
 public:
  Http(const sdk::Host& host, const sdk::Options& o)
      : host_(host),
        method_(o.str("method")),
        path_("path", o.str("path"), Escape::Url),
        content_type_(o.str("content_type")),
        body_(o.str("body").empty() ? std::nullopt
                                    : std::optional<Template>(std::in_place, "body", o.str("body"), body_escape())),
        token_header_(o.str("token_header")),
        lookup_(o.str("lookup_path").empty()
                    ? std::nullopt
                    : std::optional<Template>(std::in_place, "lookup_path", o.str("lookup_path"), Escape::Url, true)),
        table_(o.str("outcomes"), lookup_.has_value(), kAtMostOnce),
        receipt_("receipt", o.str("receipt")),
        lookup_receipt_(o.str("lookup_receipt").empty() ? receipt_
                                                        : ReceiptRule("lookup_receipt", o.str("lookup_receipt"))),
        http_(client_options(o)) {
    static const std::set<std::string> methods = {"POST", "PUT", "PATCH", "DELETE", "GET"};
    if (!methods.count(method_))
      throw std::invalid_argument("method: '" + method_ + "' is not one of POST, PUT, PATCH, DELETE, GET");
    if (o.str("path").empty() || o.str("path")[0] != '/') throw std::invalid_argument("path: must start with /");
    if (lookup_ && o.str("lookup_path")[0] != '/') throw std::invalid_argument("lookup_path: must start with /");
    for (const auto& [option, t] :
         {std::pair<const char*, const Template*>{"path", &path_}, {"lookup_path", lookup_ ? &*lookup_ : nullptr}})
      if (t && std::any_of(t->skeleton().begin(), t->skeleton().end(),
                           [](unsigned char c) { return c <= 0x20 || c >= 0x7F; }))
        throw std::invalid_argument(std::string(option) + ": holds a space or control character (percent-encode it)");
    if (body_ && body_escape() == Escape::Json && json::parse(body_->skeleton(), nullptr, false).is_discarded())
      throw std::invalid_argument(
          "body: is not JSON once filled in ({{name}} inserts escaped text: quote it; {{{json.name}}} inserts a "
          "field as JSON, {{{value_json}}} the whole value)");
    if (!token_header_.empty() && !valid_header_name(token_header_))
      throw std::invalid_argument("token_header: '" + token_header_ + "' is not a header name");
    if (!valid_header_value(content_type_))
      throw std::invalid_argument("content_type: holds a line break or control character");
    if (token_header_.empty() && !path_.sends_token() && !(body_ && body_->sends_token()))
      throw std::invalid_argument(
          "token_header: is empty and no template sends {{idem_token}} (outside sections): the service could not "
          "tell a retry from a new call");
    for (const auto& entry : words_of(o.str("lookup_not_found"))) {
      if (entry == "empty") {
        not_found_empty_ = true;
        continue;
      }
      const StatusKey k = parse_status("lookup_not_found", entry);
      if (k.status == 0 || k.status < 300)
        throw std::invalid_argument("lookup_not_found: '" + entry +
                                    "': list the statuses (3xx-5xx) that mean \"never applied\", and 'empty'");
      not_found_.insert(k.status);
    }
    // A look-up needs to tell "found" from "an empty answer": by a receipt.
    if (lookup_ && !lookup_receipt_.set())
      throw std::invalid_argument(
          "lookup_path: needs a receipt pointer (receipt or lookup_receipt) to tell a found call from an empty answer");
  }

  void invoke(const sdk::Record& rec, sdk::Completion done) {
    // Taken first: rendering a large template takes time of its own.
    const HttpClient::SendBy deadline = send_by(rec);
    // Decided before sending: a record that makes no valid request is
    // refused, never "maybe sent".
    if (auto why = unsendable(rec)) return done.permanent(*why);
    std::string target, body, lookup;
    try {
      mustache::data d = record_data(rec);
      target = path_.render(d);
      body = body_ ? body_->render(d) : std::string(rec.json());
      // The look-up target is rendered now: the record does not outlive invoke().
      if (lookup_) lookup = lookup_->render(d);
    } catch (const std::invalid_argument& e) {
      return done.permanent(std::string("the request built for this record is refused: ") + e.what());
    }
    if (body_ && body_escape() == Escape::Json && json::parse(body, nullptr, false).is_discarded())
      return done.permanent("the body built for this record is not JSON: " + body.substr(0, 200));
    HttpClient::Headers headers{{"Content-Type", content_type_}};
    if (!token_header_.empty()) headers.emplace_back(token_header_, std::string(rec.idem_token()));
    // The look-up after a 409 belongs to the same call: the same deadline.
    http_.request(
        method_, target, std::move(body), std::move(headers), deadline,
        guarded(
            host_, rec, sdk::SharedCompletion(std::move(done)),
            [this, lookup = std::move(lookup), deadline](const sdk::SharedCompletion& done, const HttpResult& r) {
              answer(done, r, lookup, deadline);
            },
            on_unreadable));
  }

  // Did the call with this token happen? Without a look-up nobody can say
  // here: the row waits for a person (idemsink resolve).
  void reconcile(const sdk::Record& rec, sdk::Completion done) {
    if (!lookup_) return done.retryable("no lookup_path configured for this route: settle it with idemsink resolve");
    const HttpClient::SendBy deadline = send_by(rec);
    std::string target;
    try {
      // record_data refuses a value nested too deep to walk: "cannot tell",
      // the host alive (the look-up runs on the engine thread).
      target = lookup_->render(record_data(rec));
    } catch (const std::invalid_argument& e) {
      return done.retryable(std::string("cannot build the look-up for this record: ") + e.what());
    }
    ask(rec, target, deadline, std::move(done));
  }

 private:
  static constexpr bool kAtMostOnce = IDEMSINK_HTTP_AT_MOST_ONCE != 0;

  Escape body_escape() const {
    if (content_type_.find("json") != std::string::npos) return Escape::Json;
    if (content_type_.find("x-www-form-urlencoded") != std::string::npos) return Escape::Form;
    return Escape::None;
  }

  void answer(const sdk::SharedCompletion& done, const HttpResult& r, const std::string& lookup,
              HttpClient::SendBy deadline) {
    if (r.failure != HttpResult::Failure::None) return done.report(classify(r), explain(r));
    const auto pause = retry_after(r);
    switch (table_.of(r.status, pause.has_value())) {
      case Meaning::Ok: return done.ok(receipt_of(r));
      case Meaning::Permanent: return done.permanent(explain(r));
      case Meaning::Retryable:
        // A pause under a second is no pause: a plain retry, with backoff.
        if (pause && *pause >= std::chrono::seconds(1)) return done.retry_after(*pause, explain(r));
        return done.retryable(explain(r));
      case Meaning::Uncertain: return done.uncertain(explain(r));
      case Meaning::Lookup:
        // "Already done" without the first answer (or "in progress"): the
        // look-up has the receipt; if it cannot tell, the call stays uncertain.
        return ask_after(done, lookup, explain(r), deadline);
    }
  }

  std::string receipt_of(const HttpResult& r) const {
    if (!receipt_.set()) return "HTTP " + std::to_string(r.status);
    const auto found = receipt_.find(r);
    if (found.kind == ReceiptRule::Found::Kind::Receipt) return found.receipt;
    // The service answered as success: the effect happened, only the
    // receipt is missing.
    return "no receipt at " + receipt_.text() + " in the answer: " + r.body.substr(0, 200);
  }

  /// The look-up after an answer that says "already done": found → ok;
  /// anything else → uncertain (nothing here says for sure it was not done).
  void ask_after(const sdk::SharedCompletion& done, const std::string& target, const std::string& first,
                 HttpClient::SendBy deadline) {
    http_.request("GET", target, "", {}, deadline, [this, done, first](HttpResult r) {
      try {
        if (auto found = found_in(r)) return done.ok(*found);
        done.uncertain(first + "; look-up: " + explain(r));
      } catch (const std::exception& e) {
        done.uncertain(first + "; look-up unreadable: " + e.what());
      }
    });
  }

  /// The reconcile question: found → ok (receipt); certainly not applied
  /// (a not-found status, or with 'empty' an answer read and empty) →
  /// permanent; anything else, an unreadable answer included → cannot tell.
  void ask(const sdk::Record& rec, const std::string& target, HttpClient::SendBy deadline, sdk::Completion done) {
    http_.request(
        "GET", target, "", {}, deadline,
        guarded_question(host_, rec, std::move(done), [this](const sdk::SharedCompletion& done, const HttpResult& r) {
          if (r.failure == HttpResult::Failure::None) {
            if (not_found_.count(r.status))
              return done.permanent("the service has no call with this token: " + explain(r));
            if (not_found_empty_ && ok_status(r) && lookup_receipt_.find(r).kind == ReceiptRule::Found::Kind::Absent)
              return done.permanent("the service's answer holds no call with this token: " + explain(r));
          }
          if (auto found = found_in(r)) return done.ok(*found);
          // A pause asked for holds the route's look-ups too (never counted).
          if (const auto pause = retry_after(r); pause && *pause >= std::chrono::seconds(1))
            return done.retry_after(*pause, "the look-up cannot tell: " + explain(r));
          done.retryable("the look-up cannot tell: " + explain(r));
        }));
  }

  static bool ok_status(const HttpResult& r) { return r.status >= 200 && r.status < 300; }

  /// The receipt of a look-up answer that says "found".
  std::optional<std::string> found_in(const HttpResult& r) const {
    if (r.failure != HttpResult::Failure::None || !ok_status(r)) return std::nullopt;
    const auto found = lookup_receipt_.find(r);
    if (found.kind != ReceiptRule::Found::Kind::Receipt) return std::nullopt;
    return found.receipt;
  }

  sdk::Host host_;
  std::string method_;
  Template path_;
  std::string content_type_;
  std::optional<Template> body_;
  std::string token_header_;
  std::optional<Template> lookup_;
  StatusTable table_;
  ReceiptRule receipt_;
  ReceiptRule lookup_receipt_;
  std::set<unsigned> not_found_;
  bool not_found_empty_ = false;
  // Last: destroyed first, so its thread (and the answers it still reports,
  // calls abandoned at shutdown included) stops before the rules it reads.
  HttpClient http_;
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
