// noop_handler: a remote_idempotent plugin that reports ok at once, inside
// invoke. With it, a benchmark measures the host and the database alone.
#include <idemsink/sdk.h>

namespace {

class Noop {
 public:
  Noop(const idemsink::sdk::Host&, const idemsink::sdk::Options&) {}
  void invoke(const idemsink::sdk::Record&, idemsink::sdk::Completion done) {
    done.report(IDEMSINK_OUTCOME_OK, "noop");
  }
};

}  // namespace

IDEMSINK_PLUGIN(Noop, .name = "noop", .version = "1.0.0", .description = "reports ok at once (benchmarks)",
                .kind = IDEMSINK_KIND_REMOTE_IDEMPOTENT)
