// A record's life: where it can be, and every step it may take. Pure data:
// each change of a record's stage goes through Record::move_to, which checks
// it against this table; a step not in it is a bug (logged "bug:", and the
// fault checker fails on it), never a silent overwrite.
//
//   New ─┬─▶ Waiting ─▶ Claim ─▶ Claiming ─┬─▶ Ready ─┬─▶ Confirming ─┬─▶ Calling
//        ├─▶ Claim                         │          └─▶ Calling     ├─▶ Ready (not confirmed)
//        └─▶ DeadLettering                 │                          └─▶ Claim (taken over)
//                                          ├─▶ LookingUp ─▶ Ready | Finishing
//                                          ├─▶ Busy ─▶ Claim | Busy
//                                          ├─▶ Finishing
//                                          └─▶ DeadLettering
//   Calling ─┬─▶ Finishing (done, failed, unknown, forwarded)
//            ├─▶ Backoff ─▶ Ready
//            ├─▶ Ready (held by the circuit or a remote's pause)
//            └─▶ Claim (taken over: claimed again to learn the outcome)
//   Finishing ─▶ Finishing (its row refused: written another way) | Claim (taken over first)
//   DeadLettering ─▶ DeadLettering (its row refused: written stripped)
//
// A record leaves the pipeline from any stage (Engine::end_record): durable
// once its outcome is written or decided, or handed back when its partition
// is revoked or its outcome cannot be recorded.
#pragma once

#include <cstddef>
#include <string_view>

namespace idemsink::pipeline {

/// Where a record is in its life; exactly one owner acts on it per stage.
enum class Stage {
  New,            // polled: not yet admitted or refused
  Waiting,        // behind an earlier record of the same key
  Claim,          // queued for the next claim batch
  Claiming,       // in a claim job
  Busy,           // key held by another live host (or no claim partition yet); re-checked periodically
  Ready,          // claim held; waiting for a call slot
  Confirming,     // call slot taken; claim being confirmed (and an at-most-once call marked) before the call
  LookingUp,      // at-most-once, in a window the database lost: the remote is asked whether it was sent
  Calling,        // handler call (or local_tx apply job) in progress
  Backoff,        // retry scheduled
  Finishing,      // done / failed / unknown / forward being written
  DeadLettering,  // refused before any claim; outbox row being written
};

std::string_view to_string(Stage s);

/// One step of a record's life, and what makes it.
struct Step {
  Stage from;
  Stage to;
  std::string_view why;
};

/// Every step a record may take.
extern const Step kLife[];
extern const size_t kLifeSteps;

/// Whether `from` → `to` is a step of a record's life.
bool allowed(Stage from, Stage to);

}  // namespace idemsink::pipeline
