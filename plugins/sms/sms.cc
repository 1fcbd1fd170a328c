// sms: sends a text through a gateway that has no idempotency key
// (remote_at_most_once). Every call sends, so the core never calls twice:
// an uncertain outcome (timeout after sending) becomes `unknown`. The token
// still goes out as client_ref, which the gateway stores; reconcile() asks
// the gateway whether a message with that reference was sent.
#include "plugins/common/remote.h"

namespace {

using namespace idemsink;
using namespace idemsink::plugins;

constexpr idemsink_option_decl kOptions[] = {
    IDEMSINK_REMOTE_OPTIONS("http://127.0.0.1:8080"),
    {"text", IDEMSINK_OPTION_STRING, "Your order {order_id} is on its way.",
     "message text; {order_id} is replaced by the biz_key"},
    {"phone_field", IDEMSINK_OPTION_STRING, "phone", "field of the JSON value holding the phone number"},
};

class Sms {
 public:
  Sms(const sdk::Host& host, const sdk::Options& o)
      : host_(host), http_(client_options(o)), text_(o.str("text")), phone_field_(o.str("phone_field")) {}

  void invoke(const sdk::Record& rec, sdk::Completion done) {
    // Decided before sending: a record that cannot be sent is refused, never
    // "maybe sent".
    if (auto why = unsendable(rec)) return done.permanent(*why);
    const std::string order(rec.biz_key());
    std::string text = text_;
    if (auto pos = text.find("{order_id}"); pos != std::string::npos) text.replace(pos, 10, order);
    const auto payload = order_payload(rec);
    const std::string phone = payload.is_object() && payload.contains(phone_field_) && payload[phone_field_].is_string()
                                  ? payload[phone_field_].get<std::string>()
                                  : "";
    nlohmann::json body{
        {"client_ref", std::string(rec.idem_token())}, {"order_id", order}, {"to", phone}, {"text", text}};
    http_.request("POST", "/sms/send", body.dump(), {}, send_by(rec),
                  guarded_call(host_, rec, std::move(done), [](const sdk::SharedCompletion& done, const HttpResult& r) {
                    report(done, r, "message_id");
                  }));
  }

  void reconcile(const sdk::Record& rec, sdk::Completion done) {
    http_.request(
        "GET", "/sms/messages?client_ref=" + std::string(rec.idem_token()), "", {}, send_by(rec),
        guarded_question(host_, rec, std::move(done), [](const sdk::SharedCompletion& done, const HttpResult& r) {
          if (classify(r) != IDEMSINK_OUTCOME_OK) return done.retryable(describe(r));
          auto j = nlohmann::json::parse(r.body, nullptr, false);
          if (j.is_discarded() || !j.contains("messages") || !j["messages"].is_array())
            return done.retryable("unreadable gateway answer: " + r.body.substr(0, 200));
          if (j["messages"].empty()) return done.permanent("the gateway never sent this message");
          // Sent: the first message id is the receipt (any JSON value the gateway uses).
          const auto& first = j["messages"][0];
          done.ok(first.is_string() ? first.get<std::string>() : first.dump());
        }));
  }

 private:
  sdk::Host host_;
  HttpClient http_;
  std::string text_;
  std::string phone_field_;
};

}  // namespace

IDEMSINK_PLUGIN(Sms, .name = "sms", .version = "1.0.0",
                .description = "sends an SMS through a gateway without idempotency (at most once)",
                .kind = IDEMSINK_KIND_REMOTE_AT_MOST_ONCE, .options = kOptions)
