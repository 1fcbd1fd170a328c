#include "core/pipeline/stage.h"

#include <algorithm>

namespace idemsink::pipeline {

std::string_view to_string(Stage s) {
  switch (s) {
    case Stage::New: return "new";
    case Stage::Waiting: return "waiting";
    case Stage::Claim: return "claim";
    case Stage::Claiming: return "claiming";
    case Stage::Busy: return "busy";
    case Stage::Ready: return "ready";
    case Stage::Confirming: return "confirming";
    case Stage::LookingUp: return "looking-up";
    case Stage::Calling: return "calling";
    case Stage::Backoff: return "backoff";
    case Stage::Finishing: return "finishing";
    case Stage::DeadLettering: return "dead-lettering";
  }
  return "?";
}

using enum Stage;

// Each row ends with the function that takes the step: the engine's doors
// (engine_doors.h), what they call, and the stages they hand the record to.
const Step kLife[] = {
    // Admission (Engine::ingest)
    {New, Claim, "admitted, its key free"},                          // `line_up_by_key()`
    {New, Waiting, "admitted behind an earlier record of its key"},  // `line_up_by_key()`, `ingest()` (its entity)
    {New, DeadLettering, "refused at admission (poison, no key, too large, too old)"},  // `refuse()`
    {Waiting, Claim, "the earlier record of its key ended"},  // `end_record()`, `next_of_entity()`
    // The claim (Claimer, Engine::on_claimed)
    {Claim, Claiming, "taken into a claim batch"},  // Claimer's `flush()`
    {Claiming, Ready, "claim owned"},               // `on_claimed()`, `on_owned()`
    {Claiming, LookingUp,
     "owned, at-most-once, and maybe sent before the database lost its outcome"},  // `look_up_before_call()`
    {Claiming, Busy,
     "its key held by another live host, an earlier record of its entity unfinished, no claim partition yet, or the "
     "batch failed"},  // `on_claimed()`, `claim_without_partition()`, Claimer's `run_job()`
    {Claiming, Finishing, "the claim decides its end (unknown after too many takeovers)"},  // `on_owned()`
    {Claiming, DeadLettering,
     "its claim refused (by the database, a payload conflict, no claim partition)"},  // `on_claimed()`,
                                                                                      // `claim_without_partition()`
    {Busy, Claim, "re-checked, or its claim partition created"},  // Claimer's `start()`, `claim_without_partition()`
    {Busy, Busy, "its claim partition could not be created: re-checked later"},  // `claim_without_partition()`
    // Before the call (Dispatcher)
    {Ready, Confirming,
     "a call slot taken; the claim confirmed (and an at-most-once call marked) first"},     // Dispatcher's `pump()`
    {Ready, Calling, "a call slot taken"},                                                  // `dispatch()`
    {Confirming, Calling, "confirmed"},                                                     // `confirmed()`
    {Confirming, Ready, "the confirmation failed: not called"},                             // `flush_confirmations()`
    {Confirming, Claim, "taken over before its call: claimed again to learn the outcome"},  // `on_fenced()`
    {LookingUp, Ready, "certainly never sent"},                                             // `looked_up()`
    {LookingUp, Finishing, "sent before (done), or the remote cannot tell (unknown)"},      // `looked_up()`
    // After the call (Engine::on_call_result, the local_tx runner)
    {Calling, Finishing,
     "done, failed, unknown or forwarded to a retry topic"},  // `on_call_result()`, `on_local_tx_results()`
    {Calling, Backoff, "failed: called again after its backoff or the pause asked for"},  // `retry_later()`
    {Calling, Ready, "held: the circuit is open, or the remote paused the route"},  // `on_call_result()`, `hold()`
    {Calling, Claim, "local_tx fenced: claimed again to learn the outcome"},        // `on_local_tx_results()`
    {Backoff, Ready, "its backoff is over"},                                        // `retry_later()`
    // Its outcome written (OutcomeWriter, Engine::on_written)
    {Finishing, Finishing, "its row refused: written another way"},                   // `written_rejected()`
    {Finishing, Claim, "taken over before its outcome was recorded: claimed again"},  // `on_written()`
    {DeadLettering, DeadLettering, "its row refused: written stripped"},              // `written_rejected()`
};
const size_t kLifeSteps = std::size(kLife);

bool allowed(Stage from, Stage to) {
  return std::any_of(kLife, kLife + kLifeSteps, [&](const Step& s) { return s.from == from && s.to == to; });
}

}  // namespace idemsink::pipeline
