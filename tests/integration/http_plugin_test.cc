// The shipped http plugin. First loaded as the host loads it (dlopen, the
// descriptor's option checks) against the real fake services: requests
// built from templates, the token where the options put it, the status
// table, receipts, 409 answered from the look-up, the reconcile look-up's
// answers, options refused with their name. Then under hosts: three routes
// written as options only (an idempotent API, one answering replays with
// 409, a gateway without idempotency) through kill -9 and timeouts after
// applying; and check-config naming the file and line of a bad option.
#define BOOST_TEST_MODULE http_plugin
#include <boost/test/unit_test.hpp>
#include <idemsink/testing.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "core/plugin/plugin.h"
#include "devkit/services.h"
#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace std::chrono_literals;
using devkit::FakeServices;
using devkit::http_request;
using sdk::testing::FakeHost;
using sdk::testing::PluginInstance;
using sdk::testing::RecordBuilder;
using sdk::testing::RecordingCompletion;
using json = nlohmann::json;

namespace {

struct Loaded {
  std::shared_ptr<plugin::Library> lib;
  const idemsink_plugin& desc() const { return lib->descriptor(); }
};

Loaded load(const std::string& name) { return {plugin::Library::load(test::shipped_plugin(name))}; }

/// Calls invoke (or reconcile) once and waits for its one report.
struct Call {
  idemsink_outcome outcome;
  std::string detail;
};
Call call(PluginInstance& p, RecordBuilder& rec, bool reconcile = false) {
  RecordingCompletion done;
  if (reconcile)
    p.reconcile(rec, done);
  else
    p.invoke(rec, done);
  BOOST_REQUIRE(done.wait(10s));
  BOOST_TEST(done.reports() == 1u);
  return {*done.outcome(), done.detail()};
}

std::string create_error(const Loaded& l, const PluginInstance::OptionValues& options) {
  FakeHost host;
  try {
    PluginInstance p(l.desc(), host, options);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

RecordBuilder order(const std::string& id, const std::string& token, const std::string& value) {
  RecordBuilder r;
  r.route("r").topic("orders").partition(3).offset(41).biz_key(id).idem_token(token).value(value);
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_waybill_call_written_as_options_creates_one_waybill_per_token) {
  FakeServices services(test::fake_services_binary());
  const auto http = load("http");
  BOOST_TEST(std::string(plugin::kind_name(http.lib->kind())) == "remote_idempotent");
  FakeHost host;
  PluginInstance p(http.desc(), host,
                   {{"endpoint", services.url()},
                    {"path", "/waybills"},
                    {"body", R"({"order_id": "{{biz_key}}", "order": {{{value_json}}}, "city": "{{value.to.city}}"})"},
                    {"receipt", "/waybill_no"},
                    {"lookup_path", "/waybills/by-key/{{idem_token}}"}});
  auto rec = order("O-1", "tok-1", R"({"to": {"city": "Zhengzhou \"East\""}, "qty": 2})");
  const Call first = call(p, rec);
  BOOST_TEST((first.outcome == IDEMSINK_OUTCOME_OK));
  BOOST_TEST(first.detail.rfind("WB", 0) == 0, first.detail);
  // The same token again (a retry after a timeout): the same waybill, no new one.
  const Call again = call(p, rec);
  BOOST_TEST(again.detail == first.detail);
  const auto stats = services.stats();
  BOOST_TEST(stats["waybill"]["applied"].get<int>() == 1);
  BOOST_TEST(stats["waybill"]["requests"].get<int>() == 2);
  // The reconcile look-up finds it by token; an unknown token certainly did not happen.
  BOOST_TEST(call(p, rec, true).detail == first.detail);
  auto never = order("O-2", "tok-never-sent", "{}");
  BOOST_TEST((call(p, never, true).outcome == IDEMSINK_OUTCOME_PERMANENT));
}

BOOST_AUTO_TEST_CASE(the_status_table_decides_and_retry_after_is_reported) {
  FakeServices services(test::fake_services_binary());
  const auto http = load("http");
  FakeHost host;
  PluginInstance p(http.desc(), host,
                   {{"endpoint", services.url()},
                    {"path", "/waybills"},
                    {"body", R"({"order_id": "{{biz_key}}"})"},
                    {"receipt", "/waybill_no"}});
  auto rejected = order("REJECT-1", "t-r", "{}");
  BOOST_TEST((call(p, rejected).outcome == IDEMSINK_OUTCOME_PERMANENT));  // 422
  auto down = order("DOWN-1", "t-d", "{}");
  const Call unavailable = call(p, down);
  BOOST_TEST((unavailable.outcome == IDEMSINK_OUTCOME_RETRYABLE));  // 503: not processed
  // Its Retry-After: 1 asks the host for a pause (the detail convention of plugin_abi.h).
  BOOST_TEST(unavailable.detail.rfind("retry-after=1000ms: ", 0) == 0, unavailable.detail);
  auto missing = order("O-3", "t-m", "{}");
  PluginInstance wrong_path(
      http.desc(), host,
      {{"endpoint", services.url()}, {"path", "/no/such/{{biz_key}}"}, {"outcomes", "404=retryable"}});
  BOOST_TEST((call(wrong_path, missing).outcome == IDEMSINK_OUTCOME_RETRYABLE));  // overridden
  // Classes override the defaults inside them; an exact status beats its class.
  PluginInstance strict(http.desc(), host,
                        {{"endpoint", services.url()},
                         {"path", "/waybills"},
                         {"body", R"({"order_id": "{{biz_key}}"})"},
                         {"outcomes", "5xx=uncertain 4xx=retryable 422=permanent"}});
  BOOST_TEST((call(strict, down).outcome == IDEMSINK_OUTCOME_UNCERTAIN));      // 503 inside 5xx now
  BOOST_TEST((call(strict, rejected).outcome == IDEMSINK_OUTCOME_PERMANENT));  // 422 exact
  // Not a JSON body once filled in: refused before sending.
  PluginInstance raw(http.desc(), host,
                     {{"endpoint", services.url()},
                      {"path", "/waybills"},
                      {"body", R"({"skus": [{{#value.items}}"{{.}}"{{/value.items}}]})"}});
  auto broken = order("O-4", "t-b", R"({"items": ["a", "b"]})");
  const Call refused = call(raw, broken);
  BOOST_TEST((refused.outcome == IDEMSINK_OUTCOME_PERMANENT));
  BOOST_TEST(refused.detail.find("not JSON") != std::string::npos, refused.detail);
  BOOST_TEST(services.stats()["waybill"]["requests"].get<int>() == 4);  // REJECT-1 and DOWN-1, twice each
}

BOOST_AUTO_TEST_CASE(a_409_for_a_replayed_token_is_answered_from_the_look_up) {
  FakeServices services(test::fake_services_binary());
  const auto http = load("http");
  FakeHost host;
  PluginInstance p(http.desc(), host,
                   {{"endpoint", services.url()},
                    {"path", "/payments"},
                    {"body", R"({"order_id": "{{biz_key}}", "amount": {{{json.amount}}}})"},
                    {"receipt", "/payment/id"},
                    {"lookup_path", "/payments/by-key/{{idem_token}}"}});
  auto pay = order("P-1", "pay-tok-1", R"({"amount": 1250})");
  const Call first = call(p, pay);
  BOOST_TEST((first.outcome == IDEMSINK_OUTCOME_OK));
  BOOST_TEST(first.detail.rfind("PAY", 0) == 0, first.detail);
  const Call replay = call(p, pay);  // the API answers 409 without the receipt
  BOOST_TEST((replay.outcome == IDEMSINK_OUTCOME_OK));
  BOOST_TEST(replay.detail == first.detail);
  BOOST_TEST(services.stats()["payment"]["applied"].get<int>() == 1);
  // Without a look-up, 409 may mean "still in progress": uncertain (for an
  // idempotent route, called again with the same token).
  PluginInstance bare(http.desc(), host,
                      {{"endpoint", services.url()},
                       {"path", "/payments"},
                       {"body", R"({"order_id": "{{biz_key}}"})"},
                       {"receipt", "/payment/id"}});
  const Call bare_replay = call(bare, pay);
  BOOST_TEST((bare_replay.outcome == IDEMSINK_OUTCOME_UNCERTAIN));
  BOOST_TEST(bare_replay.detail.find("HTTP 409") != std::string::npos, bare_replay.detail);
}

BOOST_AUTO_TEST_CASE(the_at_most_once_kind_asks_the_gateway_by_token) {
  FakeServices services(test::fake_services_binary());
  const auto http = load("http_at_most_once");
  BOOST_TEST(std::string(plugin::kind_name(http.lib->kind())) == "remote_at_most_once");
  FakeHost host;
  PluginInstance p(http.desc(), host,
                   {{"endpoint", services.url()},
                    {"path", "/sms/send"},
                    {"token_header", ""},
                    {"body", R"({"client_ref": "{{idem_token}}", "order_id": "{{biz_key}}", "to": "{{value.phone}}",
                                 "text": "Order {{biz_key}} shipped"})"},
                    {"receipt", "/message_id"},
                    {"lookup_path", "/sms/messages?client_ref={{idem_token}}"},
                    {"lookup_receipt", "/messages/0"},
                    {"lookup_not_found", "404 empty"}});
  auto unsent = order("S-1", "sms/tok 1", R"({"phone": "+86 138"})");
  BOOST_TEST((call(p, unsent, true).outcome == IDEMSINK_OUTCOME_PERMANENT));  // messages: [] — never sent
  const Call sent = call(p, unsent);
  BOOST_TEST((sent.outcome == IDEMSINK_OUTCOME_OK));
  const Call asked = call(p, unsent, true);  // the token percent-encoded in the query
  BOOST_TEST((asked.outcome == IDEMSINK_OUTCOME_OK));
  BOOST_TEST(asked.detail == sent.detail);
}

// Answers that may hide an effect are never taken for "not applied".
BOOST_AUTO_TEST_CASE(answers_that_may_hide_an_effect_stay_uncertain) {
  FakeServices services(fake_services_binary());
  FakeHost host;
  const auto at_most_once = load("http_at_most_once");
  const auto idempotent = load("http");
  auto rec = order("U-1", "tok-u", "{}");
  // A 503 without Retry-After: a gateway may have forwarded the request.
  PluginInstance sms(
      at_most_once.desc(), host,
      {{"endpoint", services.url()}, {"path", "/scripted/503"}, {"body", R"({"ref": "{{idem_token}}"})"}});
  BOOST_TEST((call(sms, rec).outcome == IDEMSINK_OUTCOME_UNCERTAIN));
  PluginInstance waybill(idempotent.desc(), host, {{"endpoint", services.url()}, {"path", "/scripted/503"}});
  BOOST_TEST((call(waybill, rec).outcome == IDEMSINK_OUTCOME_RETRYABLE));  // the same token may go again
  // A look-up answering 200 with a page that is not JSON cannot tell, even
  // with 'empty' meaning "not sent".
  PluginInstance lookup(at_most_once.desc(), host,
                        {{"endpoint", services.url()},
                         {"path", "/sms/send"},
                         {"receipt", "/message_id"},
                         {"lookup_path", "/scripted/html"},
                         {"lookup_receipt", "/messages/0"},
                         {"lookup_not_found", "404 empty"}});
  BOOST_TEST((call(lookup, rec, true).outcome == IDEMSINK_OUTCOME_RETRYABLE));
  // A record whose URL would name another resource is refused before sending.
  PluginInstance by_id(idempotent.desc(), host, {{"endpoint", services.url()}, {"path", "/scripted/200/{{value.id}}"}});
  for (const char* id : {R"({"id": ".."})", R"({"id": ""})", "{}"}) {
    auto dotted = order("U-2", "tok-d", id);
    const Call c = call(by_id, dotted);
    BOOST_TEST((c.outcome == IDEMSINK_OUTCOME_PERMANENT), id);
    BOOST_TEST(c.detail.find("empty or dot segment") != std::string::npos, c.detail);
  }
  // A template that would render without bound is cut at 1 MiB: refused, not sent.
  PluginInstance huge(idempotent.desc(), host,
                      {{"endpoint", services.url()},
                       {"path", "/scripted/200"},
                       {"content_type", "text/plain"},
                       {"body", "{{#value.items}}{{{value_json}}}{{/value.items}}"}});
  std::string items = "[";
  for (int i = 0; i < 2000; ++i) items += (i ? ",\"" : "\"") + std::string(100, 'x') + "\"";
  auto big = order("U-3", "tok-b", R"({"items": )" + items + "]}");
  const Call cut = call(huge, big);
  BOOST_TEST((cut.outcome == IDEMSINK_OUTCOME_PERMANENT));
  BOOST_TEST(cut.detail.find("renders more than") != std::string::npos, cut.detail);
}

// A payment API that sends 103 Early Hints before its answer (legal
// HTTP/1.1: a client must read past an interim answer it did not ask for).
// Taken for the answer, the 103 left the real one unread on a kept-alive
// connection, and the next call on it read the previous call's receipt.
BOOST_AUTO_TEST_CASE(an_interim_answer_is_read_past_and_every_receipt_is_its_own) {
  FakeServices services(fake_services_binary(), {"--faults", "payment:early_hints=1"});
  const auto http = load("http");
  FakeHost host;
  PluginInstance p(http.desc(), host,
                   {{"endpoint", services.url()},
                    {"path", "/payments"},
                    {"body", R"({"order_id": "{{biz_key}}"})"},
                    {"receipt", "/payment/id"},
                    {"lookup_path", "/payments/by-key/{{idem_token}}"},
                    {"max_connections", "1"}});
  int own = 0;
  for (int i = 0; i < 20; ++i) {
    auto pay = order("P-" + std::to_string(i), "pay-early-" + std::to_string(i), "{}");
    const Call paid = call(p, pay);
    const Call asked = call(p, pay, true);  // what the API holds for this token
    BOOST_TEST((paid.outcome == IDEMSINK_OUTCOME_OK), paid.detail);
    BOOST_TEST((asked.outcome == IDEMSINK_OUTCOME_OK), asked.detail);
    own += paid.detail == asked.detail;
  }
  BOOST_TEST(own == 20);
  BOOST_TEST(services.stats()["payment"]["applied"].get<int>() == 20);
  BOOST_TEST(services.stats()["payment"]["requests"].get<int>() == 20);
}

// The look-up walks the record's value too (its template data): a value
// nested too deep is refused there as before a call, "cannot tell", and the
// host (here: the test process) lives.
BOOST_AUTO_TEST_CASE(a_value_nested_too_deep_is_refused_by_the_look_up_too) {
  FakeServices services(fake_services_binary());
  const auto http = load("http_at_most_once");
  FakeHost host;
  PluginInstance p(http.desc(), host,
                   {{"endpoint", services.url()},
                    {"path", "/sms/send"},
                    {"receipt", "/message_id"},
                    {"lookup_path", "/sms/messages?client_ref={{idem_token}}"},
                    {"lookup_receipt", "/messages/0"}});
  auto deep = order("D-1", "tok-deep", std::string(200000, '[') + std::string(200000, ']'));
  const Call asked = call(p, deep, true);
  BOOST_TEST((asked.outcome == IDEMSINK_OUTCOME_RETRYABLE));
  BOOST_TEST(asked.detail.find("200000 levels") != std::string::npos, asked.detail);
  const Call sent = call(p, deep);
  BOOST_TEST((sent.outcome == IDEMSINK_OUTCOME_PERMANENT));
  BOOST_TEST(services.stats()["sms"]["requests"].get<int>() == 0);
}

// A call waiting for a connection past the host's deadline is reported not
// sent, and never sent later: by then the host took it for uncertain, and
// may have asked the gateway, been told "never sent", and sent it again.
BOOST_AUTO_TEST_CASE(a_call_not_on_the_wire_by_its_deadline_is_never_sent) {
  FakeServices services(fake_services_binary(), {"--faults", "sms:latency_mean_ms=1500,latency_p99_ms=1501"});
  const auto http = load("http_at_most_once");
  FakeHost host;
  PluginInstance p(http.desc(), host,
                   {{"endpoint", services.url()},
                    {"path", "/sms/send"},
                    {"body", R"({"client_ref": "{{idem_token}}", "order_id": "{{biz_key}}"})"},
                    {"token_header", ""},
                    {"receipt", "/message_id"},
                    {"timeout", "10s"},
                    {"max_connections", "1"}});
  auto first = order("Q-1", "tok-q1", "{}");
  auto second = order("Q-2", "tok-q2", "{}");
  first.timeout_ms(1000);
  second.timeout_ms(1000);
  RecordingCompletion first_done, second_done;
  p.invoke(first, first_done);
  p.invoke(second, second_done);  // waits for the one connection
  BOOST_REQUIRE(second_done.wait(5s));
  BOOST_TEST((*second_done.outcome() == IDEMSINK_OUTCOME_RETRYABLE));
  BOOST_TEST(second_done.detail().find("before the call's deadline") != std::string::npos, second_done.detail());
  BOOST_REQUIRE(first_done.wait(10s));  // the connection comes free: the abandoned call stays unsent
  BOOST_TEST((*first_done.outcome() == IDEMSINK_OUTCOME_OK), first_done.detail());
  // One more call on the freed connection shows it was not taken by the abandoned one.
  auto third = order("Q-3", "tok-q3", "{}");
  BOOST_TEST((call(p, third).outcome == IDEMSINK_OUTCOME_OK));
  BOOST_TEST(services.stats()["sms"]["per_order"].value("Q-2", 0) == 0);
  BOOST_TEST(services.stats()["sms"]["requests"].get<int>() == 2);
}

// The template check reads tags as the renderer does: a name led by a line
// break hides no sigil from it; and a request line never carries a space or
// a control character, whatever a record holds.
BOOST_AUTO_TEST_CASE(a_template_cannot_put_raw_text_or_line_breaks_in_the_request_line) {
  const auto http = load("http");
  for (const std::string& path : {std::string("/o/{{#value.ids}}{{\n&.}}{{/value.ids}}"),
                                  std::string("/o/{{#value.ids}}{{\n=<% %>=}}<%& . %>{{/value.ids}}"),
                                  std::string("/o/{{value. id}}"), std::string("/o /{{biz_key}}")}) {
    const std::string why = create_error(http, {{"endpoint", "http://127.0.0.1:1"}, {"path", path}});
    BOOST_TEST(!why.empty(), path);
  }
  FakeServices services(fake_services_binary());
  FakeHost host;
  PluginInstance p(http.desc(), host, {{"endpoint", services.url()}, {"path", "/scripted/200/{{value.to}}"}});
  auto smuggled = order("R-1", "tok-r", R"({"to": "x HTTP/1.1\r\nX-Forwarded-User: admin\r\n\r\nDELETE /accounts/1"})");
  const Call c = call(p, smuggled);  // percent-encoded: one request, its own
  BOOST_TEST((c.outcome == IDEMSINK_OUTCOME_OK), c.detail);
}

// A service behind OAuth 2.0 client credentials: the plugin fetches a token
// from the token endpoint, sends it with every call, keeps it until shortly
// before it expires, and fetches a new one once when the service answers
// 401 (here: every token revoked mid-run, as if it had expired early). Every
// order applied once; the secret never in an answer's detail or the log.
BOOST_AUTO_TEST_CASE(oauth_client_credentials_are_fetched_kept_and_renewed_on_a_401) {
  FakeServices services(fake_services_binary(), {"--oauth-client", "plugins:plugin-secret", "--require-oauth"});
  ::setenv("TEST_OAUTH_SECRET", "plugin-secret", 1);
  ::setenv("TEST_OAUTH_WRONG", "not-the-secret", 1);
  const auto waybill = load("waybill");
  FakeHost host;
  const auto options = [&](const std::string& secret_env) {
    return PluginInstance::OptionValues{{"endpoint", services.url()},
                                        {"oauth_token_url", services.url() + "/oauth/token"},
                                        {"oauth_client_id", "plugins"},
                                        {"oauth_client_secret_env", secret_env},
                                        {"oauth_scope", "waybills"}};
  };
  PluginInstance p(waybill.desc(), host, options("TEST_OAUTH_SECRET"));
  for (int i = 0; i < 40; ++i) {
    if (i == 20) BOOST_TEST(http_request(services.port(), "POST", "/admin/oauth", R"({"revoke": true})").first == 200);
    auto rec = order("OA-" + std::to_string(i), "oa-tok-" + std::to_string(i), "{}");
    const Call c = call(p, rec);
    BOOST_TEST((c.outcome == IDEMSINK_OUTCOME_OK), c.detail);
  }
  const auto stats = services.stats();
  BOOST_TEST(stats["waybill"]["applied"].get<int>() == 40);
  BOOST_TEST(stats["waybill"]["double_applied"].get<int>() == 0);
  BOOST_TEST(stats["oauth"]["tokens"].get<int>() == 2);        // one, then one after the revocation
  BOOST_TEST(stats["oauth"]["unauthorized"].get<int>() == 1);  // the one call that met it, sent again
  // A client the endpoint refuses: never sent, retryable, the secret nowhere.
  PluginInstance wrong(waybill.desc(), host, options("TEST_OAUTH_WRONG"));
  auto rec = order("OA-X", "oa-tok-x", "{}");
  const Call refused = call(wrong, rec);
  BOOST_TEST((refused.outcome == IDEMSINK_OUTCOME_RETRYABLE));
  BOOST_TEST(refused.detail.find("invalid_client") != std::string::npos, refused.detail);
  BOOST_TEST(refused.detail.find("not-the-secret") == std::string::npos);
  for (const auto& line : host.logs())
    for (const char* secret : {"plugin-secret", "not-the-secret"})
      BOOST_TEST(line.text.find(secret) == std::string::npos, line.text);
  BOOST_TEST(services.stats()["waybill"]["applied"].get<int>() == 40);
  // Options: a secret only from the environment or a file, never written in.
  BOOST_TEST(create_error(waybill, {{"endpoint", services.url()}, {"oauth_client_id", "x"}}).find("oauth_token_url") !=
             std::string::npos);
  BOOST_TEST(create_error(waybill, {{"endpoint", services.url()},
                                    {"oauth_token_url", services.url() + "/oauth/token"},
                                    {"oauth_client_id", "x"},
                                    {"oauth_client_secret_env", "NO_SUCH_VARIABLE_SET"}})
                 .find("NO_SUCH_VARIABLE_SET is not set") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(bad_options_are_refused_naming_the_option) {
  const auto http = load("http");
  const auto refused = [&](PluginInstance::OptionValues o, const std::string& option, const std::string& why) {
    o.emplace("endpoint", "http://127.0.0.1:1");
    if (!o.count("path")) o.emplace("path", "/x");
    const std::string e = create_error(http, o);
    BOOST_TEST(e.find(option + ": ") != std::string::npos, e);
    BOOST_TEST(e.find(why) != std::string::npos, e);
  };
  refused({{"path", "/x/{{value.id}}/{{bizkey}}"}}, "path", "{{bizkey}} names no field of a record");
  refused({{"path", "x"}}, "path", "must start with /");
  refused({{"body", R"({"id": {{biz_key}}})"}}, "body", "is not JSON once filled in");
  refused({{"body", R"({"n": {{{value.n}}}})"}}, "body", "use {{{json.n}}}");  // a string would inject JSON
  refused({{"path", "/x/{{{biz_key}}}"}}, "path", "inserts unescaped text into a URL");
  refused({{"body", "{{=<% %>=}}<% biz_key %>"}}, "body", "changing the delimiters");
  refused({{"token_header", ""}, {"body", R"({"a": "{{! idem_token }}"})"}}, "token_header", "could not tell");
  refused({{"lookup_path", "/l/{{headers.trace}}"}, {"receipt", "/id"}}, "lookup_path", "not known when the look-up");
  refused({{"lookup_path", "/l/{{idem_token}}"}}, "lookup_path", "needs a receipt pointer");
  refused({{"lookup_path", "/l/{{idem_token}}"}, {"receipt", "/id"}, {"lookup_not_found", "200"}}, "lookup_not_found",
          "never applied");
  refused({{"body", "{{#value.items}}"}}, "body", "not a valid template");
  refused({{"body", "{{> other}}"}}, "body", "partials");
  refused({{"outcomes", "409=maybe"}}, "outcomes", "unknown outcome 'maybe'");
  refused({{"outcomes", "40x=ok"}}, "outcomes", "neither a status");
  refused({{"outcomes", "409=lookup"}}, "outcomes", "lookup_path is not set");
  refused({{"receipt", "waybill_no"}}, "receipt", "neither a JSON pointer");
  refused({{"receipt", "/a~2b"}}, "receipt", "is not a JSON pointer");
  refused({{"token_header", ""}}, "token_header", "could not tell a retry from a new call");
  refused({{"method", "FETCH"}}, "method", "not one of");

  // Inside a section, names are the item's own.
  BOOST_TEST(create_error(http, {{"endpoint", "http://127.0.0.1:1"},
                                 {"path", "/x"},
                                 {"body", R"({"skus": [{{#value.items}}"{{sku}}",{{/value.items}} "end"]})"}})
                 .empty());
}

namespace {

/// The three routes of the shipped configuration's http examples, as a
/// user writes them (TOML literal strings: the templates hold quotes).
std::vector<RouteSpec> http_routes(const FakeServices& services) {
  const std::string key = "key = { from = \"json\", json = \"order_id\" }";
  const std::string endpoint = "\"" + services.url() + "\"";
  RouteSpec waybill{"waybill",
                    "orders.waybill",
                    shipped_plugin("http"),
                    key,
                    {{"endpoint", endpoint},
                     {"timeout", "\"300ms\""},
                     {"path", "'/waybills'"},
                     {"body", R"('{"order_id": "{{biz_key}}", "order": {{{value_json}}}}')"},
                     {"receipt", "'/waybill_no'"},
                     {"lookup_path", "'/waybills/by-key/{{idem_token}}'"}},
                    "call_timeout = \"5s\""};
  RouteSpec payment{"payment",
                    "orders.payment",
                    shipped_plugin("http"),
                    key,
                    {{"endpoint", endpoint},
                     {"timeout", "\"300ms\""},
                     {"path", "'/payments'"},
                     {"body", R"('{"order_id": "{{biz_key}}", "amount": {{{json.amount}}}}')"},
                     {"receipt", "'/payment/id'"},
                     {"lookup_path", "'/payments/by-key/{{idem_token}}'"}},
                    "call_timeout = \"5s\""};
  RouteSpec sms{
      "sms",
      "orders.sms",
      shipped_plugin("http_at_most_once"),
      key,
      {{"endpoint", endpoint},
       {"timeout", "\"300ms\""},
       {"path", "'/sms/send'"},
       {"token_header", "''"},
       {"body",
        R"('{"client_ref": "{{idem_token}}", "order_id": "{{biz_key}}", "to": "{{value.phone}}", "text": "shipped"}')"},
       {"receipt", "'/message_id'"},
       {"lookup_path", "'/sms/messages?client_ref={{idem_token}}'"},
       {"lookup_receipt", "'/messages/0'"},
       {"lookup_not_found", "'404 empty'"}},
      "call_timeout = \"5s\""};
  return {waybill, payment, sms};
}

}  // namespace

// Two hosts, 1,200 orders on each of three routes (a quarter re-sent), four
// kill -9 and answers held back after applying: each effect once on the
// idempotent routes (replays answered from the token, 409s from the look-up),
// at most once on the gateway, every record done, and done exactly when applied.
BOOST_AUTO_TEST_CASE(three_configured_routes_through_kill_9_apply_each_effect_once) {
  FakeServices services(fake_services_binary(),
                        {"--seed", "7", "--hold", "1500", "--faults",
                         "waybill:latency_mean_ms=10,latency_p99_ms=80,timeout_after_apply=0.03", "--faults",
                         "payment:latency_mean_ms=10,latency_p99_ms=80,timeout_after_apply=0.03", "--faults",
                         "sms:latency_mean_ms=10,latency_p99_ms=80,timeout_after_apply=0.03"});
  Scenario s("http_routes");
  for (const char* t : {"orders.waybill", "orders.payment", "orders.sms"})
    s.topic(t, 4).topic(std::string(t) + ".dlq", 1);
  std::set<std::string> orders;
  std::vector<TestMessage> msgs;
  for (int i = 0; i < 1200; ++i) {
    const int n = i % 4 == 3 ? i - 2 : i;  // a quarter re-sent, the same payload
    const std::string id = "H" + std::to_string(n);
    orders.insert(id);
    msgs.push_back({id, R"({"order_id": ")" + id + R"(", "amount": )" + std::to_string(100 + n) +
                            R"(, "phone": "+86-138-)" + id + "\"}"});
  }
  for (const char* t : {"orders.waybill", "orders.payment", "orders.sms"}) s.kafka.produce(t, msgs);
  const auto routes = http_routes(services);
  const Scenario::HostOptions opt{.host_lines = "max_in_flight = 100\n",
                                  .claim_lines = "reconcile_interval = \"1s\"\nreconcile_after = \"2s\"\n"};
  std::map<std::string, HostProcess*> hosts;
  auto start = [&](const std::string& id) { hosts[id] = &s.host(id, routes, opt); };
  start("host-a");
  start("host-b");
  auto conn = s.connect();
  for (int kill = 0; kill < 4; ++kill) {
    const int64_t target = 600 * (kill + 1);
    wait_until(
        [&] {
          try {
            return scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE " +
                                     status_is_not(claim::Status::Pending)) >= target;
          } catch (const db::DbError&) {
            return false;  // the tables not made yet
          }
        },
        120s, "progress before kill " + std::to_string(kill + 1));
    const std::string victim = kill % 2 == 0 ? "host-a" : "host-b";
    hosts[victim]->kill();
    start(victim);
  }
  s.wait_committed(*hosts["host-a"], 180s);
  wait_until(
      [&] {
        return scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE " +
                                 status_in(claim::Status::Pending, claim::Status::Unknown)) == 0;
      },
      120s, "every claim settled");
  for (auto& [id, h] : hosts) BOOST_TEST(h->stop() == 0);

  const auto stats = services.stats();
  for (const char* service : {"waybill", "payment", "sms"}) {
    const auto& st = stats[service];
    BOOST_TEST_MESSAGE(service << ": " << st["applied"].get<int>() << " applied for " << orders.size() << " orders, "
                               << st["double_applied"].get<int>() << " twice, " << st["requests"].get<int>()
                               << " requests, " << st["timeouts_after_apply"].get<int>() << " answers held back");
    BOOST_TEST(st["double_applied"].get<int>() == 0, service);
    BOOST_TEST(st["timeouts_after_apply"].get<int>() > 0, service);  // the faults happened
  }
  // The idempotent routes applied every order; the gateway sent at most once,
  // and a record is done exactly when its text went out.
  BOOST_TEST(stats["waybill"]["applied"].get<size_t>() == orders.size());
  BOOST_TEST(stats["payment"]["applied"].get<size_t>() == orders.size());
  BOOST_TEST(scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim") == static_cast<int64_t>(3 * orders.size()));
  BOOST_TEST(scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE " + status_is_not(claim::Status::Done) +
                               " AND namespace IN ('waybill', 'payment')") == 0);
  const auto sent = services.applied("sms");
  for (const auto& r : conn->query("SELECT biz_key, status FROM idemsink_claim WHERE namespace = 'sms'"))
    BOOST_TEST((*r[1] == "2") == (sent.count(*r[0]) == 1), *r[0] << " status " << *r[1]);
  // The receipts are the services' own: a 409 answered from the look-up too.
  BOOST_TEST(
      scalar(*conn, "SELECT COUNT(*) FROM idemsink_claim WHERE namespace = 'payment' AND receipt NOT LIKE 'PAY%'") ==
      0);
  BOOST_TEST(stats["payment"]["requests"].get<size_t>() > orders.size());  // replays, answered 409
  // Texts whose answer never came went unknown and the look-up settled them:
  // nothing a person must see reached a DLQ.
  const int64_t settled = scalar(*conn,
                                 "SELECT COUNT(*) FROM idemsink_claim WHERE namespace = 'sms' AND (last_error LIKE "
                                 "'reconciled:%' OR last_error LIKE 're-driven after reconcile%')");
  BOOST_TEST_MESSAGE("sms: " << settled << " unknown(s) settled by the look-up");
  BOOST_TEST(settled > 0);
  for (const char* t : {"orders.waybill.dlq", "orders.payment.dlq", "orders.sms.dlq"})
    BOOST_TEST(s.kafka.read_all(t, 1).size() == 0u, t);
  s.audit_clean(*hosts["host-a"]);
}

BOOST_AUTO_TEST_CASE(check_config_names_the_file_and_line_of_a_bad_option) {
  FakeServices services(fake_services_binary());
  Scenario s("http_check_config");
  auto routes = http_routes(services);
  routes[1].options["body"] = R"('{"order_id": {{biz_key}}}')";
  routes[2].options["outcomes"] = "'5xx=later'";
  const auto file = s.dir / "bad.toml";
  for (size_t bad : {1u, 2u}) {
    std::vector<RouteSpec> one{routes[0], routes[bad]};
    const std::string text = s.config("checker", one);
    write_file(file, text);
    const auto [rc, out] = run_cli(s.dir, "check-" + std::to_string(bad), {"check-config", "--config", file.string()});
    BOOST_TEST(rc == 2, out);
    const std::string option = bad == 1 ? "body" : "outcomes";
    // The line of that option in the file.
    size_t line = 1;
    const size_t at = text.find(option + " = ", text.find("name = \"" + routes[bad].name + "\""));
    for (size_t i = 0; i < at; ++i) line += text[i] == '\n';
    const std::string where = file.string() + ":" + std::to_string(line) + ":";
    BOOST_TEST(out.find(where) != std::string::npos, out);
    BOOST_TEST(out.find("route.options." + option + ": ") != std::string::npos, out);
    BOOST_TEST(out.find(bad == 1 ? "is not JSON once filled in" : "unknown outcome 'later'") != std::string::npos, out);
  }
  write_file(file, s.config("checker", http_routes(services)));
  const auto [rc, out] = run_cli(s.dir, "check-good", {"check-config", "--config", file.string()});
  BOOST_TEST(rc == 0, out);
  BOOST_TEST(out.find("route sms: orders.sms -> http_at_most_once 1.0.0 (remote_at_most_once)") != std::string::npos,
             out);
}

namespace {

RouteSpec limited_waybill(const FakeServices& services, const std::string& lines) {
  RouteSpec r{"waybill",
              "orders.waybill",
              shipped_plugin("http"),
              "key = { from = \"json\", json = \"order_id\" }",
              {{"endpoint", "\"" + services.url() + "\""},
               {"path", "'/waybills'"},
               {"body", R"('{"order_id": "{{biz_key}}"}')"},
               {"receipt", "'/waybill_no'"}},
              lines};
  return r;
}

std::vector<TestMessage> orders_of(int n) {
  std::vector<TestMessage> msgs;
  for (int i = 0; i < n; ++i)
    msgs.push_back({"L" + std::to_string(i), R"({"order_id": "L)" + std::to_string(i) + "\"}"});
  return msgs;
}

int64_t waybill_requests(FakeServices& services) { return services.stats()["waybill"]["requests"].get<int64_t>(); }

}  // namespace

// Two hosts share 50 calls/s (each takes its partitions' share: 25/s) with
// 3,300 orders waiting: over a minute the API sees 50/s within 10%.
BOOST_AUTO_TEST_CASE(a_limit_shared_by_two_hosts_holds_within_10_percent_over_a_minute) {
  FakeServices services(fake_services_binary());
  Scenario s("http_rate_limit");
  s.topic("orders.waybill", 4).topic("orders.waybill.dlq", 1);
  const auto route = limited_waybill(services, "[route.rate_limit]\nrate = 50\n");
  Scenario::HostOptions opt;
  opt.admin = true;
  auto& a = s.host("host-a", {route}, opt);
  auto& b = s.host("host-b", {route}, opt);
  for (HostProcess* h : {&a, &b})
    wait_until([&] { return admin_metric(s.admin_port(*h), "idemsink_route_rate_limit{route=\"waybill\"}") == 25; },
               60s, "each host's share: 2 of 4 partitions, 25 calls/s");
  s.kafka.produce("orders.waybill", orders_of(3300));
  wait_until([&] { return waybill_requests(services) >= 50; }, 60s, "the calls begun");
  const int64_t before = waybill_requests(services);
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(60s);  // the measurement window itself
  const int64_t calls = waybill_requests(services) - before;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double rate = static_cast<double>(calls) / seconds;
  BOOST_TEST_MESSAGE("rate limit 50/s shared by two hosts: " << calls << " calls in " << seconds << " s = " << rate
                                                             << "/s");
  BOOST_TEST(rate >= 45.0);
  BOOST_TEST(rate <= 55.0);
  BOOST_TEST(admin_metric(s.admin_port(a), "idemsink_route_rate_limit_waits_total{route=\"waybill\"}") > 0);
  s.wait_committed(a, 120s);
  BOOST_TEST(services.stats()["waybill"]["applied"].get<int>() == 3300);
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Done)) == 3300);
  BOOST_TEST(a.stop() == 0);
  BOOST_TEST(b.stop() == 0);
  s.audit_clean(a);
}

// The API answers every call 503 with Retry-After: 1 for five seconds. The
// route holds its calls a second each time (one call in flight: about five
// calls, not a retry storm), the calls spend no attempts (max_attempts 3:
// nothing is dead-lettered), and every order is applied once after.
BOOST_AUTO_TEST_CASE(retry_after_holds_the_route_without_spending_attempts) {
  FakeServices services(fake_services_binary());
  Scenario s("http_retry_after");
  s.topic("orders.waybill", 2).topic("orders.waybill.dlq", 1);
  const auto route = limited_waybill(services,
                                     "concurrency = 1\n[route.retry]\nmax_attempts = 3\n"
                                     "[route.circuit]\nenabled = false\n");
  Scenario::HostOptions opt;
  opt.admin = true;
  auto& host = s.host("host-a", {route}, opt);
  BOOST_TEST(http_request(services.port(), "POST", "/admin/faults/waybill", R"({"error_5xx": 1})").first == 200);
  s.kafka.produce("orders.waybill", orders_of(20));
  wait_until([&] { return waybill_requests(services) >= 1; }, 60s, "the first call");
  wait_until([&] { return admin_metric(s.admin_port(host), "idemsink_route_held{route=\"waybill\"}") == 1; }, 10s,
             "the route held");
  const int64_t first = waybill_requests(services);
  std::this_thread::sleep_for(5s);  // the outage's length
  const int64_t during = waybill_requests(services) - first;
  BOOST_TEST_MESSAGE("503 with Retry-After: 1 for 5 s: " << during << " calls");
  BOOST_TEST(during >= 3);
  BOOST_TEST(during <= 7);
  BOOST_TEST(admin_metric(s.admin_port(host), "idemsink_route_holds_total{route=\"waybill\"}") >= 3);
  BOOST_TEST(http_request(services.port(), "POST", "/admin/faults/waybill", R"({"error_5xx": 0})").first == 200);
  s.wait_committed(host, 60s);
  BOOST_TEST(services.stats()["waybill"]["applied"].get<int>() == 20);
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Done)) == 20);
  BOOST_TEST(s.kafka.read_all("orders.waybill.dlq", 1).size() == 0u);
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}
