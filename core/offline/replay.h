// `idemsink replay`: an operator sends dead records of a route back through
// it once the cause is fixed (the remote was down, a permanent rejection was
// a bug on the other side).
//
// For each failed claim that matches, in one transaction: the claim goes
// back to pending and released, with the SAME idem_token (a remote that saw
// an earlier attempt recognises the retry), and an outbox row (purpose
// replay) carries the record's payload from its latest dead letter to the
// route's source topic, with its original timestamp (so it lands in the same
// claim row) and `idemsink.replayed` = N. The relay of any running host
// publishes it; the host that reads it claims the re-opened row and drives
// it like a fresh record. If it fails again it is dead-lettered again, with
// the header. The claim update only moves a row that is still failed with
// that token, so two replays racing re-open (and queue) each record once.
//
// Unknown claims are not replayed: their effect may have happened, and
// reconciliation is their path. A record whose dead letter no longer holds
// its payload (purged after claim.outbox_retention, cut because it was too
// large, or stripped because the database refused it), or whose copy would
// not come back to its claim row (older than the replay horizon, a
// timestamp of another month), is listed with its source position and left
// as it is. The source topic must keep producer timestamps (CreateTime, the
// default): under LogAppendTime the copy would be stamped anew.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/db/connection.h"

namespace idemsink::offline {

struct ReplayFilter {
  std::string route;
  std::optional<std::string> reason;  // the dead letter's idemsink.reason
  std::optional<std::string> since;   // SQL expression: claims failed at or after this
  std::optional<std::string> key;     // one biz_key
  std::vector<uint64_t> letter_ids;   // only the claims whose latest dead letter is one of these
  bool dry_run = false;
  /// Runs in the transaction that re-opens each record (the operator log's
  /// entry): its biz_key, idem_token and dead letter's outbox id.
  std::function<void(db::Connection&, const std::string& biz_key, const std::string& token, uint64_t letter_id)>
      in_transaction;
};

struct ReplayReport {
  uint64_t matched = 0;         // failed claims that match the filter
  uint64_t replayed = 0;        // re-opened and queued to the source topic
  uint64_t not_replayable = 0;  // left as they are (listed): no payload, or it would not reach its claim row
  uint64_t taken_by_other = 0;  // no longer failed when we got to them (another replay, a host)
};

/// `--since`: a duration back from now ("30m", "2h", "7d") or a UTC time
/// ("2026-11-30", "2026-11-30 14:05:00"); as a SQL expression. Throws
/// std::invalid_argument.
std::string since_expression(const std::string& text);

/// Runs a replay against the route's database; prints one line per record
/// not replayed and per record replayed when `out_each`.
ReplayReport replay(db::Connection& c, const config::Config& cfg, const ReplayFilter& filter, std::ostream& out);

}  // namespace idemsink::offline
