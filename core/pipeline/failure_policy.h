// The failure policy: what happens to a record after its claim and after
// each handler call, as a pure function of the handler kind, the outcome and
// the attempts so far. The engine carries the decisions out.
//
//   outcome     remote_idempotent          remote_at_most_once        local_tx (rolled back)
//   ok          done                       done                       done
//   retryable   retry, then exhausted      retry, then exhausted      retry, then exhausted
//   uncertain   retry (same idem_token)    unknown (never re-called)  retry (the write was rolled back)
//   permanent   failed                     failed                     failed
//
// "retry" is in place with exponential backoff and full jitter, or a forward
// to the next retry topic when the route has retry topics; "exhausted" ends
// the record failed with reason retries_exhausted.
//
// A record ends `failed` only when every call it made certainly did not
// apply the effect. If one may have (an uncertain outcome of a remote call,
// in this tier, an earlier tier or under an earlier claim, or a claim taken
// over from an owner that died holding it), what would end failed ends
// `unknown` instead (maybe_applied, or crash_loop), for reconciliation to
// ask the remote: an operator never refunds an order that shipped.
#pragma once

#include <idemsink/plugin_abi.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <string>

#include "core/claim/claim_store.h"
#include "core/config/config.h"
#include "core/dlq/reason.h"

namespace idemsink::pipeline {

struct Decision {
  enum class Action {
    Proceed,  ///< after a claim: call the handler
    Done,     ///< mark the claim done with the receipt
    Retry,    ///< call again after a backoff, in place
    Forward,  ///< release the claim and move the record to its next retry topic
    End,      ///< terminal `status` with `reason`, dead-lettered
  };
  Action action = Action::Proceed;
  claim::Status status = claim::Status::Pending;  // End: Failed or Unknown
  dlq::Reason reason = dlq::Reason::Permanent;    // End
  std::string error;                              // End after a claim: why, for the DLQ entry
};

/// After a claim was won. A record whose claim was taken over
/// claim.max_takeovers times from owners that died holding it may be what
/// kills them: it ends (crash_loop), unknown since those owners may have
/// called (failed for an at-most-once record that was never called). An
/// at-most-once record whose call mark is set (a call may have started under
/// an owner that vanished, or was released since) may have been sent: it
/// ends unknown (owner_vanished), never called again. One without the mark
/// was never sent, and is called.
Decision decide_on_claim(idemsink_kind kind, const claim::ClaimResult& claim, int max_takeovers);

/// After a handler call reported `outcome`; `calls` counts the calls made so
/// far including this one, `tier` is the retry topic the record came from
/// (0: the route's own topic), `maybe_applied` whether an earlier call (or
/// owner) may have applied the effect.
Decision decide_after_call(idemsink_kind kind, idemsink_outcome outcome, uint32_t calls, size_t tier,
                           const config::RetryConfig& retry, bool maybe_applied);

/// The wait before in-place retry number `calls`: uniform in
/// [0, min(backoff_max, backoff_initial * 2^(calls-1))].
std::chrono::milliseconds backoff(const config::RetryConfig& retry, uint32_t calls, std::mt19937_64& rng);

}  // namespace idemsink::pipeline
