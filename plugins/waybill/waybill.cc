// waybill: creates a logistics waybill per order (remote_idempotent).
//
// The idem_token goes out as the Idempotency-Key header: a retry after a
// timeout, a restart or a takeover sends the same key, and the logistics API
// answers with the waybill it already created instead of a second one.
#include "plugins/common/remote.h"

namespace {

using namespace idemsink;
using namespace idemsink::plugins;

constexpr idemsink_option_decl kOptions[] = {IDEMSINK_REMOTE_OPTIONS("http://127.0.0.1:8080")};

class Waybill {
 public:
  Waybill(const sdk::Host& host, const sdk::Options& o) : host_(host), http_(client_options(o)) {}

  void invoke(const sdk::Record& rec, sdk::Completion done) {
    if (auto why = unsendable(rec)) return done.permanent(*why);
    std::string body = "{\"order_id\":" + json_string(rec.biz_key()) + ",\"order\":" + order_json(rec) + "}";
    http_.request(
        "POST", "/waybills", std::move(body), {{"Idempotency-Key", std::string(rec.idem_token())}}, send_by(rec),
        guarded_call(host_, rec, std::move(done),
                     [](const sdk::SharedCompletion& done, const HttpResult& r) { report(done, r, "waybill_no"); }));
  }

  // Did a waybill with this idempotency key get created?
  void reconcile(const sdk::Record& rec, sdk::Completion done) {
    lookup_receipt(host_, http_, rec, "/waybills/by-key/" + std::string(rec.idem_token()), "waybill_no",
                   "no waybill was created with this key", std::move(done));
  }

 private:
  sdk::Host host_;
  HttpClient http_;
};

}  // namespace

IDEMSINK_PLUGIN(Waybill, .name = "waybill", .version = "1.0.0",
                .description = "creates a logistics waybill; the idem_token is the Idempotency-Key",
                .kind = IDEMSINK_KIND_REMOTE_IDEMPOTENT, .options = kOptions)
