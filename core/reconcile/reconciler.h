// Reconciliation of claims the pipeline could not finish by itself:
//
//   unknown   an at-most-once call that may or may not have happened
//   stuck     pending, nobody's lease, untouched for claim.stuck_after: the
//             record will not come back on its own (offsets reset, topic gone)
//
// For each, the route's plugin is asked through its reconcile hook whether
// the effect happened (by idem_token):
//   applied            -> the row becomes done with the receipt
//   not applied        -> an unknown row is re-driven once (same token, the
//                         payload kept in the DLQ outbox) while it stays
//                         `unknown` under a lease, then becomes done, failed
//                         (rejected, or refused with its attempts spent) or
//                         stays unknown; one that has spent its attempts
//                         becomes failed instead. A record's attempts are the
//                         route's retry.max_attempts; an idempotent route's
//                         record gets as many again from reconciliation (the
//                         remote de-duplicates the token: re-sending is
//                         safe), so attempts spent on an outage do not make
//                         a dead letter of a record the remote never saw.
//                         A crash_loop record is never re-driven (it may be
//                         what kills its hosts), nor a maybe_applied one of an
//                         at-most-once route. A stuck row is left for its
//                         record or an operator (logged)
//   cannot tell        -> left as it is, counted, asked again after the others
//
// Failed is a dead record like any other: its held DLQ row is published at
// once with reason not_applied (or the re-drive's), never stamped away.
// Look-ups and re-drives keep to what the route's calls keep to (RemoteGate):
// its rate limit, the pause its remote asked for, its open circuit (then the
// row waits for a later round); an answer asking for a pause holds the
// route and is never counted as an attempt.
//
// An unknown row is asked about only claim.reconcile_after after its newest
// call began (a re-drive is a call too), so a call still on its way is never
// taken for one that did not happen. A settled unknown's DLQ row, held back
// since it went unknown (dlq/outbox.h), is stamped and never published; one
// still undecided after claim.unknown_dlq_after is published by the relay.
// Every change is a conditional statement on (status, attempt), so hosts
// reconciling the same row at once cannot both act on it.
#pragma once

#include "core/common/asio.h"
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/claim/claim_store.h"
#include "core/dlq/outbox.h"
#include "core/config/config.h"
#include "core/db/pool.h"
#include "core/metrics/metrics.h"
#include "core/pipeline/remote_gate.h"
#include "core/plugin/plugin.h"

namespace idemsink::reconcile {

/// "N examined, N done, N failed, N undecided, N stuck left"
struct ReconcileSummary;
std::string describe(const ReconcileSummary& s);

struct ReconcileSummary {
  size_t examined = 0;
  size_t applied = 0;        // resolved done
  size_t redriven_done = 0;  // not applied, re-driven, now done
  size_t failed = 0;         // re-driven and rejected for good
  size_t undecided = 0;      // the plugin could not tell, or the re-drive was uncertain again
  size_t left_stuck = 0;     // stuck pending, not applied: waits for its record or an operator
  size_t deferred = 0;       // not asked this round: the route's circuit is open, or its limit left no room
};

class Reconciler {
 public:
  Reconciler(boost::asio::io_context& io, db::Pool& pool, const config::Config& cfg,
             std::map<std::string, std::shared_ptr<plugin::Instance>> handlers, pipeline::RemoteGate& gate,
             metrics::SliceMetrics* metrics, std::string owner);

  static constexpr size_t kRoundLimit = 500;
  /// One round over up to `limit` candidates; `done` runs on the io thread.
  void run_once(std::function<void(ReconcileSummary)> done, size_t limit = kRoundLimit);
  /// The same from any thread, over one route's claims only (an operator's
  /// "ask again"); a round already running answers with nothing examined.
  void run_once_on_engine(std::function<void(ReconcileSummary)> done, std::string route);
  /// A round after `first_delay`, then every claim.reconcile_interval (at
  /// once again after a full round) until stop(). Off when the interval is 0.
  void start(std::chrono::milliseconds first_delay);
  void stop();

  /// What the route's reconcile hook says now of one claim, settling
  /// nothing (the console shows it beside an unknown): `answered` runs on
  /// the engine thread, within the route's call_timeout. `key`/`value`: the
  /// record as its dead letter kept it. False if the route has no hook.
  /// A reload's routes (engine thread): `routes`, a config whose routes are
  /// the slice's, and each one's instance. Calls from now on go to them; a
  /// round under way ends on the set it began with.
  void set_routes(std::shared_ptr<const config::Config> routes,
                  const std::map<std::string, std::shared_ptr<plugin::Instance>>& handlers);

  bool ask_hook(const claim::ClaimStore::Settled& claim, std::optional<std::string> key,
                std::optional<std::string> value, int64_t timestamp_ms,
                std::function<void(idemsink_outcome, std::string)> answered);

 private:
  struct Candidate;  // candidate.h
  class Round;       // one run_once(), in its steps (round.cc)
  /// The round run_once() starts (round.cc, where a Round is complete).
  void begin_round(std::function<void(ReconcileSummary)> done, size_t limit);

  boost::asio::io_context& io_;
  db::Pool& pool_;
  const config::Config& cfg_;                     // the host's settings; routes_ has the routes
  std::shared_ptr<const config::Config> routes_;  // engine thread; a round keeps its own
  /// Routes whose plugin can reconcile (engine thread; a round keeps its own;
  /// ask_hook looks a route up from an API thread under hook_mu_).
  std::map<std::string, std::shared_ptr<plugin::Instance>> handlers_;
  std::mutex hook_mu_;
  pipeline::RemoteGate& gate_;
  metrics::SliceMetrics* metrics_;
  claim::ClaimStore store_;
  dlq::Outbox outbox_;  // the outcome events of settled claims ([route.output])
  boost::asio::steady_timer timer_;
  bool running_ = false;
  bool stopped_ = false;
  std::string only_route_;  // this round's route, when an operator asked for one
};

}  // namespace idemsink::reconcile
