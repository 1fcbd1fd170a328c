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

const Step kLife[] = {
    // Admission (Engine::ingest)
    {New, Claim, "admitted, its key free"},
    {New, Waiting, "admitted behind an earlier record of its key"},
    {New, DeadLettering, "refused at admission (poison, no key, too large, too old)"},
    {Waiting, Claim, "the earlier record of its key ended"},
    // The claim (Claimer, Engine::on_claimed)
    {Claim, Claiming, "taken into a claim batch"},
    {Claiming, Ready, "claim owned"},
    {Claiming, LookingUp, "owned, at-most-once, and maybe sent before the database lost its outcome"},
    {Claiming, Busy,
     "its key held by another live host, an earlier record of its entity unfinished, no claim partition yet, or the "
     "batch failed"},
    {Claiming, Finishing, "the claim decides its end (unknown after too many takeovers)"},
    {Claiming, DeadLettering, "its claim refused (by the database, a payload conflict, no claim partition)"},
    {Busy, Claim, "re-checked, or its claim partition created"},
    {Busy, Busy, "its claim partition could not be created: re-checked later"},
    // Before the call (Dispatcher)
    {Ready, Confirming, "a call slot taken; the claim confirmed (and an at-most-once call marked) first"},
    {Ready, Calling, "a call slot taken"},
    {Confirming, Calling, "confirmed"},
    {Confirming, Ready, "the confirmation failed: not called"},
    {Confirming, Claim, "taken over before its call: claimed again to learn the outcome"},
    {LookingUp, Ready, "certainly never sent"},
    {LookingUp, Finishing, "sent before (done), or the remote cannot tell (unknown)"},
    // After the call (Engine::on_call_result, the local_tx runner)
    {Calling, Finishing, "done, failed, unknown or forwarded to a retry topic"},
    {Calling, Backoff, "failed: called again after its backoff or the pause asked for"},
    {Calling, Ready, "held: the circuit is open, or the remote paused the route"},
    {Calling, Claim, "local_tx fenced: claimed again to learn the outcome"},
    {Backoff, Ready, "its backoff is over"},
    // Its outcome written (OutcomeWriter, Engine::on_written)
    {Finishing, Finishing, "its row refused: written another way"},
    {Finishing, Claim, "taken over before its outcome was recorded: claimed again"},
    {DeadLettering, DeadLettering, "its row refused: written stripped"},
};
const size_t kLifeSteps = std::size(kLife);

bool allowed(Stage from, Stage to) {
  return std::any_of(kLife, kLife + kLifeSteps, [&](const Step& s) { return s.from == from && s.to == to; });
}

}  // namespace idemsink::pipeline
