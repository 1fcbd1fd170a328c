// Named crash points for crash-window tests.
//
// IDEMSINK_FAULT="point:N[,point:N]" makes the host SIGKILL itself the N-th
// time execution passes `point` (N counts from 1). Points in the pipeline:
//   after_claim_commit  claim rows committed, handler not yet called (cut A→B)
//   after_handler_ok    handler reported OK, claim not yet marked done (B→C)
//   after_mark_done     claim marked done, offset not yet committed
//   in_local_tx         local_tx business write done, transaction not committed
//   before_outbox_stamp the broker acknowledged outbox rows (dead letters,
//                       events), their published stamps not yet written
// and points that inject a fault instead of killing (checked with once()):
//   lost_connection_after_claim_write
//                       the N-th claim write (insert or takeover) commits but
//                       its answer is lost: the job is re-run
//   drop_fetch          the N-th record polled, and every later one of its
//                       partition, vanish until that partition is sought
//                       (a consumer that silently stops delivering)
//   seek_fails          the N-th seek of a partition fails without seeking
//                       (librdkafka answers "Erroneous state" to a seek right
//                       after an assignment, at times)
//   admin_throws        the N-th admin request throws while being answered
//   engine_stall        the N-th engine heartbeat blocks the engine thread for
//                       15 s (a handler that never returns): /livez must fail
//   slow_start          `run` waits 2 s before loading its plugins (a signal
//                       that arrives while the host starts)
//   command_while_closing
//                       the N-th revoke callback of a closing consumer sends
//                       it a fetch command, as the engine does at any time
//   close_hangs         the N-th consumer close waits until 7 s past the
//                       shutdown deadline before it starts (a close that
//                       hangs in librdkafka)
//   fetch_command_overtakes_start
//                       after the N-th assignment, seeks fail until librdkafka
//                       starts a partition's fetcher (seen in its debug log:
//                       the consumer's `debug` must include "topic"); that
//                       start then waits while the engine's resume of the
//                       partition is applied (the fetch gate resumes every
//                       newly assigned partition)
//   rebalance_protocol_unreported
//                       the N-th rebalance callback finds the group's protocol
//                       unreported (librdkafka answers NULL at times while a
//                       consumer closes)
// Without the variable every check is one relaxed load of a null pointer.
//
// Sync points are for tests that run core code in their own process (the
// claim store against a real MariaDB): a test sets a function on a named
// point to interleave two threads at an exact step, deterministically.
// Unset, a sync point is one relaxed load.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace idemsink::fault {

/// Reads IDEMSINK_FAULT once; throws std::invalid_argument if malformed.
void init_from_env();

/// Counts one pass of `point` and SIGKILLs the process on the armed pass.
void hit(std::string_view point);

/// Counts one pass of `point`; true on the armed pass only.
bool once(std::string_view point);

/// Runs the function set for sync point `name`, if any (on the passing thread).
void sync_point(std::string_view name);
/// Sets (or, with an empty function, clears) the function of a sync point.
void set_sync_point(const std::string& name, std::function<void()> fn);

}  // namespace idemsink::fault
