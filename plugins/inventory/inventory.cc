// inventory: reserves stock for an order over RPC (remote_idempotent).
// The idem_token is the request_id the inventory service de-duplicates on.
#include "plugins/common/remote.h"

namespace {

using namespace idemsink;
using namespace idemsink::plugins;

constexpr idemsink_option_decl kOptions[] = {IDEMSINK_REMOTE_OPTIONS("http://127.0.0.1:8080")};

class Inventory {
 public:
  Inventory(const sdk::Host& host, const sdk::Options& o) : host_(host), http_(client_options(o)) {}

  void invoke(const sdk::Record& rec, sdk::Completion done) {
    if (auto why = unsendable(rec)) return done.permanent(*why);
    std::string body = "{\"request_id\":" + json_string(rec.idem_token()) +
                       ",\"order_id\":" + json_string(rec.biz_key()) + ",\"order\":" + order_json(rec) + "}";
    http_.request("POST", "/inventory/reserve", std::move(body), {}, send_by(rec),
                  guarded_call(host_, rec, std::move(done), [](const sdk::SharedCompletion& done, const HttpResult& r) {
                    report(done, r, "reservation_id");
                  }));
  }

  void reconcile(const sdk::Record& rec, sdk::Completion done) {
    lookup_receipt(host_, http_, rec, "/inventory/reservations/" + std::string(rec.idem_token()), "reservation_id",
                   "no reservation was made with this request id", std::move(done));
  }

 private:
  sdk::Host host_;
  HttpClient http_;
};

}  // namespace

IDEMSINK_PLUGIN(Inventory, .name = "inventory", .version = "1.0.0",
                .description = "reserves stock; the idem_token is the request_id",
                .kind = IDEMSINK_KIND_REMOTE_IDEMPOTENT, .options = kOptions)
