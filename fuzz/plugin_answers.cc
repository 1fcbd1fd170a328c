// What the shipped remote plugins read from the outside: a record's value
// and key (refused or carried, never a throw), a service's answer body (a
// result is always reported), and the `headers` option.
#include <idemsink/testing.h>

#include <cstdint>
#include <string>

#include "plugins/common/remote.h"

using namespace idemsink;
using namespace idemsink::plugins;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  sdk::testing::RecordBuilder rec;
  rec.route("r").biz_key(in.substr(0, 64)).value(in);
  if (!unsendable(rec.record())) (void)nlohmann::json{{"order", order_payload(rec.record())}}.dump();

  static sdk::testing::FakeHost host;
  for (unsigned status : {200u, 404u, 503u}) {
    sdk::testing::RecordingCompletion done;
    const HttpResult answer{HttpResult::Failure::None, status, in, ""};
    guarded_call(host.host(), rec.record(), done.completion(),
                 [](const sdk::SharedCompletion& d, const HttpResult& r) { report(d, r, "waybill_no"); })(answer);
    if (done.reports() != 1) __builtin_trap();
  }
  try {
    (void)parse_headers(in);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
