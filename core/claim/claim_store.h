// The claim/dedup state machine, in the business MariaDB.
//
// One row per (namespace, biz_key): who may run the side effect of that key,
// with which idempotency token, and what came of it.
//
//   (none) ──insert──▶ pending ──mark_done──────────────▶ done      (terminal)
//                        │  ▲  ──mark_terminal(failed)───▶ failed    (terminal)
//                        │  │  ──mark_terminal(unknown)──▶ unknown   (terminal in the pipeline)
//                        └──┘ takeover: lease expired, released, or our own
//                             host restarted; attempt+1 fences the old owner
//
// Reconciliation, the only exits from unknown and from a stuck pending row
// (pending, nobody's lease, untouched for claim.stuck_after):
//
//   unknown / stuck ──resolve_applied──▶ done     the remote says it happened
//   unknown ──resolve_not_applied──▶ failed        it never happened, and the record had its attempts
//   unknown ──take_for_redrive──▶ unknown, leased to us, attempt+1
//           ──record_redrive───▶ done | failed | unknown (lease cleared)
//   unknown / stuck ──resolve_by_operator──▶ done | failed
//
// Rules (seed 000): every transition is one conditional statement, never
// SELECT-then-write; terminal rows never change; done/failed/unknown require
// owner AND attempt to match, so a zombie whose claim was taken over cannot
// finish. The idem_token is generated before the first call, committed with
// the claim row, and reused on every retry, restart and takeover.
//
// Batching: a whole poll is claimed with one read plus one multi-row
// INSERT IGNORE ... RETURNING (plus, rarely, one takeover UPDATE and one
// re-read); completions are marked in one UPDATE per group. All methods run
// on a pool worker's connection and are safe to re-run after a lost
// connection.
//
// Partitioning: rows live in monthly partitions keyed by `bucket`, the first
// day of the month of the record's Kafka timestamp. A redelivered record has
// the same timestamp, so it always meets its own row, across month ends too.
// A different record with the same biz_key may land in another bucket; the
// row the key directory names governs, and the read step finds it there
// (ClaimRead).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/common/source.h"
#include "core/db/connection.h"

namespace idemsink::claim {

enum class Status : int { Pending = 1, Done = 2, Failed = 3, Unknown = 4 };
const char* to_string(Status s);
/// SQL: "<alias>status = N", N from the enum (never a literal in a statement).
std::string sql_status_is(Status s, std::string_view alias = "");
/// SQL for tables that follow a claim (the DLQ outbox's held letters):
/// whether the claim whose idem_token is in `token_column` is unknown.
std::string sql_claim_is_unknown(std::string_view token_column);

/// Whether `s` can be an idem_token (ASCII letters, digits and '-', at most
/// 36): anything else names no claim, and is never put to the database.
bool plausible_token(std::string_view s);

/// Identity of one claim row.
struct RowKey {
  std::string ns;
  std::string biz_key;
  std::string bucket;  // "YYYY-MM-01"
  bool operator==(const RowKey&) const = default;
};

/// How a claim read finds the row of a key: through the key directory (one
/// dive there, one into the month it names), or in every month's partition
/// (a claim table of an earlier version, until `idemsink schema migrate`
/// has filled its directory in: schema.h key_directory_complete).
enum class ClaimRead { AllMonths, KeyDirectory };

/// First day of the UTC month of a Kafka timestamp, as "YYYY-MM-01".
std::string bucket_of(int64_t timestamp_ms);

struct ClaimRequest : Source {
  RowKey key;                // bucket from the record timestamp
  std::string payload_hash;  // 16 bytes
  bool check_payload = true;
  /// [route.order_by]: the record's entity. It is not claimed while an
  /// earlier record of the entity is unfinished (order_hold.h).
  std::optional<std::string> order_key;
  bool hold_on_dead = false;  // the route's on_dead = "hold"
};

enum class Verdict {
  Owned,        ///< we hold the claim: run the handler with (attempt, idem_token)
  Done,         ///< already done: idempotent hit
  Terminal,     ///< already failed or unknown: it was dead-lettered before
  Conflict,     ///< same key already claimed with a different payload
  Busy,         ///< pending under another live owner: wait and check again
  NoPartition,  ///< the record's month has no partition (the table ran out): nothing was written
  Held,         ///< an earlier record of its entity is unfinished (order_hold.h): nothing was written; wait
};
const char* to_string(Verdict v);

struct ClaimResult {
  Verdict verdict = Verdict::Busy;
  RowKey row;  // the governing row (its bucket may differ from the request's)
  Status status = Status::Pending;
  uint32_t attempt = 0;  // claim epoch after this claim
  std::string idem_token;
  std::string receipt;      // for Done
  bool taken_over = false;  // Owned by taking over an existing pending row
  uint32_t takeovers = 0;   // times the row was taken from an owner that had not released it
  /// Calls under earlier claims whose outcome was uncertain: the effect may
  /// already have happened.
  uint32_t uncertain_calls = 0;
  /// The previous owner did not release the row (crashed, or its lease ran
  /// out): a call may have been made under it.
  bool previous_owner_vanished = false;
  /// An at-most-once call of this row may have started and its outcome was
  /// never learnt (the mark written before every at-most-once call).
  bool maybe_called = false;
};

/// A completion to record: the claim epoch we hold and what happened.
struct Outcome {
  RowKey row;
  uint32_t attempt = 0;
  uint32_t calls = 0;            // handler calls made for this record
  uint32_t uncertain_calls = 0;  // of them, with an uncertain outcome (kept across releases)
  std::string receipt;           // done
  std::string error;             // failed / unknown
};

/// What a claim job wrote before its connection was lost, so that a re-run
/// of the same job recognises its own rows instead of taking them over (a
/// takeover would fence nothing but itself, count a takeover, and park an
/// at-most-once record as unknown without a call). Owned by the job, kept
/// across its re-runs.
struct ClaimJobMemory {
  struct Takeover {
    uint32_t from_attempt;
    bool owner_was_set;  // the previous owner had not released the row
  };
  std::map<std::string, std::string> tokens;  // "ns\0biz_key" -> idem_token this job inserts with
  std::map<std::string, Takeover> takeovers;  // "ns\0biz_key" -> takeover this job attempted
};

/// A claim row as the reconciler and the console read it: its key, state,
/// attempts, token and where its record came from. Unsettled and Settled
/// add what each reading needs; the reconciler's candidates hold one.
struct ClaimFacts : Source {
  RowKey row;
  Status status = Status::Pending;
  uint32_t attempt = 0;
  uint32_t calls = 0;
  std::string idem_token;

  ClaimFacts& facts() { return *this; }
  const ClaimFacts& facts() const { return *this; }
};

class ClaimStore {
 public:
  /// `owner` is "<host id>#<run id>"; claims held by any earlier run of the
  /// same host id may be taken over at once.
  ClaimStore(std::string host_id, std::string owner, std::chrono::milliseconds lease);

  const std::string& owner() const { return owner_; }

  /// Derive new claims' idem_tokens from (namespace, biz_key) in this UUID
  /// namespace (claim.derived_tokens); "" draws them at random. Set before
  /// the first claim.
  void set_token_namespace(std::string ns) { token_namespace_ = std::move(ns); }
  /// How claim reads find a key's row: through the key directory, as a claim
  /// table of this version allows; the host sets all months at start when
  /// the database does not say its directory is complete (an older table),
  /// and back once it does. Safe to change while claims run.
  void set_claim_read(ClaimRead how) { claim_read_.store(how); }
  ClaimRead claim_read() const { return claim_read_.load(); }
  /// The token a new claim of this key gets.
  std::string new_token(const std::string& ns, const std::string& biz_key) const;

  /// Claims a batch. Requests must have distinct (ns, biz_key). `memory`
  /// belongs to the job and survives its re-runs.
  std::vector<ClaimResult> claim(db::Connection& c, std::span<const ClaimRequest> reqs, ClaimJobMemory& memory) const;
  /// Same, for a one-off claim (no re-runs to recognise).
  std::vector<ClaimResult> claim(db::Connection& c, std::span<const ClaimRequest> reqs) const {
    ClaimJobMemory fresh;
    return claim(c, reqs, fresh);
  }

  /// Marks pending rows we own as done, in one statement. Returns, per
  /// outcome, whether this call (or an earlier run of it) made the row done
  /// under our claim; false means we were fenced: someone else holds or
  /// finished the row, and the caller must claim it again to learn its state.
  std::vector<bool> mark_done(db::Connection& c, std::span<const Outcome> outcomes) const;

  /// Marks them done only if every one is still pending, ours and at its
  /// epoch, in one statement: this statement changed them all, or the caller
  /// rolls back (one was taken over, or finished by an earlier run of the
  /// caller's job). In a transaction that applied their effects, this is
  /// the fence without locking the claims first.
  bool mark_all_done(db::Connection& c, std::span<const Outcome> outcomes) const;

  /// Same for failed / unknown (terminal with last_error).
  std::vector<bool> mark_terminal(db::Connection& c, Status status, std::span<const Outcome> outcomes) const;

  /// Locks the rows of these outcomes that we still own (SELECT ... FOR
  /// UPDATE inside the caller's transaction); returns which ones.
  std::vector<bool> lock_owned(db::Connection& c, std::span<const Outcome> outcomes) const;

  /// Gives up claims we hold but are not calling (revocation, shutdown, a
  /// forward to a retry topic): owner and lease are cleared so the next owner
  /// may proceed at once. Uncertain calls made so far stay recorded in the
  /// row, and so does a call mark unless this claim made calls and every one
  /// of them certainly did not apply (`calls` > 0, `uncertain_calls` 0): a
  /// mark left by an owner that vanished outlives any release.
  void release(db::Connection& c, std::span<const Outcome> outcomes) const;

  /// Confirms, right before their calls, that we still hold these claims
  /// (owner and attempt unchanged) and extends their leases; with
  /// `mark_calling` it also writes the call mark (at-most-once routes: a
  /// takeover then knows the call may have gone out, and never calls again).
  /// One statement for the whole wave. Returns, per outcome, whether the
  /// claim is ours: only those may be called.
  std::vector<bool> confirm_calls(db::Connection& c, std::span<const Outcome> outcomes, bool mark_calling) const;

  /// Extends the lease of every pending row we own. Returns rows touched.
  uint64_t renew(db::Connection& c) const;

  /// Pending rows nobody holds (no owner, or the lease ran out) untouched for
  /// `stuck_after`, all hosts: records that will not come back on their own.
  uint64_t count_stuck(db::Connection& c, std::chrono::milliseconds stuck_after) const;

  /// Re-reads the current state of rows (tests, reconcile).
  std::vector<ClaimResult> read(db::Connection& c, std::span<const RowKey> keys) const;

  // ---- reconciliation

  /// A claim the pipeline cannot finish by itself.
  struct Unsettled : ClaimFacts {  // status: Unknown, or Pending when stuck
    std::string last_error;
    std::string updated_at;
  };
  /// A route to reconcile, and how old its newest call must be before an
  /// unknown row of it may be asked about (0: at once).
  struct Namespace {
    std::string ns;
    std::chrono::milliseconds reconcile_after{0};
  };
  /// Unknown claims (only those no re-drive holds, unless `include_leased`)
  /// and stuck pending ones, of `namespaces` (all when empty, at any age),
  /// oldest first.
  std::vector<Unsettled> unsettled(db::Connection& c, std::span<const Namespace> namespaces,
                                   std::chrono::milliseconds stuck_after, size_t limit, bool include_leased) const;
  /// Unknown rows the hook could not settle this round go to the back of the
  /// queue (updated_at), so the next round asks about others first.
  void note_undecided(db::Connection& c, std::span<const Outcome> rows) const;
  /// The effect happened: an unknown or stuck row at `attempt` becomes done
  /// with the receipt. False if the row moved on meanwhile.
  bool resolve_applied(db::Connection& c, const RowKey& row, uint32_t attempt, std::string_view receipt) const;
  /// The effect certainly did not happen: an unknown row at `attempt` that
  /// nobody holds becomes failed. False if the row moved on meanwhile.
  bool resolve_not_applied(db::Connection& c, const RowKey& row, uint32_t attempt, std::string_view why) const;
  /// Takes an unknown row at `attempt` that nobody holds for one re-drive:
  /// attempt+1, owned by us, leased for `hold`, call mark written (the call
  /// starts next); it stays unknown meanwhile.
  bool take_for_redrive(db::Connection& c, const RowKey& row, uint32_t attempt, std::chrono::milliseconds hold) const;
  enum class RedriveResult {
    Applied,    ///< done with the receipt
    Rejected,   ///< failed for good
    Undecided,  ///< stays unknown, for the next round
  };
  /// Records a re-drive under the epoch take_for_redrive gave us. False if
  /// our lease ran out and another host took the row (its result counts).
  bool record_redrive(db::Connection& c, const RowKey& row, uint32_t taken_attempt, uint32_t calls,
                      RedriveResult result, std::string_view detail) const;
  /// An operator replays a failed row (`idemsink replay`): it becomes pending
  /// again, released (no owner, no lease), with the same idem_token and its
  /// counters reset, so the next host to read its record claims it like a
  /// fresh one. Only from failed, and only once when two replays race: false
  /// if the row is no longer failed with this token.
  bool reopen_failed(db::Connection& c, const RowKey& row, std::string_view idem_token, std::string_view note) const;
  /// An operator's decision (done or failed) for the unknown or stuck row
  /// with this token, unless a re-drive holds it: the re-drive's result is
  /// the truth (an effect it applies must not be recorded failed, one it is
  /// refused must not be recorded done).
  struct OperatorResolution {
    bool resolved = false;
    /// Not resolved because a re-drive holds the row: "<owner> until <time>".
    std::optional<std::string> redrive;
  };
  OperatorResolution resolve_by_operator(db::Connection& c, std::string_view idem_token, Status as,
                                         std::string_view note) const;

  /// A claim as its outcome event tells it (dlq/outcome_event.h).
  struct Settled : ClaimFacts {
    std::string receipt;
    std::string last_error;
  };
  /// The claims with these tokens, read in the caller's transaction right
  /// after a settlement wrote them.
  std::vector<Settled> read_settled(db::Connection& c, std::span<const std::string> idem_tokens) const;

 private:
  class Job;  // one claim() in its steps (claim_job.cc)
  std::string lease_expr() const;
  std::vector<bool> finish(db::Connection& c, Status status, std::span<const Outcome> outcomes) const;
  /// finish's one UPDATE; returns the rows it changed.
  uint64_t finish_ours(db::Connection& c, Status status, std::span<const Outcome> outcomes) const;

  std::string host_id_;
  std::string owner_;
  std::chrono::milliseconds lease_;
  std::string token_namespace_;
  std::atomic<ClaimRead> claim_read_{ClaimRead::KeyDirectory};
};

/// Reads for the operator's views, here so that the claim table's SQL
/// stays in claim/.
/// Claims in `status`, counted per namespace (route).
std::map<std::string, int64_t> count_by_route(db::Connection& c, Status status);
/// Of `keys`, those with a claim of namespace `ns` past pending (done,
/// failed or unknown) in any month partition, looked up by primary key (the
/// audit).
std::set<std::string> keys_past_pending(db::Connection& c, const std::string& ns, const std::set<std::string>& keys);

}  // namespace idemsink::claim
