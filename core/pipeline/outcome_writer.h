// Outcomes made durable, in batches: one statement marks a group of records
// done; failed and unknown records get their terminal mark and their outbox
// row in one transaction; refused records get only an outbox row; records
// moving to a retry topic have their claim released and their outbox row
// written in one transaction. Once written, a record's offset may be
// committed: its outcome can no longer be lost.
#pragma once

#include <utility>  // before Boost.Asio 1.74: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
#include <functional>
#include <string>
#include <vector>

#include "core/claim/claim_store.h"
#include "core/config/config.h"
#include "core/db/pool.h"
#include "core/dlq/outbox.h"
#include "core/pipeline/batch_queue.h"
#include "core/pipeline/record.h"

namespace idemsink::pipeline {

class OutcomeWriter {
 public:
  enum class Kind { Done, Ended, DeadLettered, Forwarded };
  struct Written {
    Kind kind;
    uint64_t id;
    /// false: the claim was taken over meanwhile (fenced) and nothing was
    /// written for this record; its new owner's outcome decides.
    bool ok;
    claim::Status status;  // Ended
  };
  using FindFn = std::function<Record*(uint64_t id)>;
  /// The records of one job, written (engine thread).
  using WrittenFn = std::function<void(const std::vector<Written>&)>;

  OutcomeWriter(boost::asio::io_context& io, db::Pool& pool, const config::Config& cfg, const claim::ClaimStore& store,
                const dlq::Outbox& outbox, FindFn find, WrittenFn on_written);

  /// The handler applied the effect: mark done (batched, after claim.flush_linger).
  void done(Record& r);
  /// Terminal failed or unknown, dead-lettered with `reason`.
  void end(Record& r, claim::Status status, dlq::Reason reason);
  /// Refused before any claim: only the dead letter.
  void dead_letter(Record& r);
  /// On to the next retry topic: claim released, record forwarded.
  void forward(Record& r);

  /// Starts jobs for whatever waits (e.g. before a revocation's deadline).
  void flush();
  bool idle() const;

 private:
  struct Terminal {
    uint64_t id;
    claim::Status status;
    dlq::Reason reason;
  };
  void flush_done();
  void flush_terminal();
  void flush_dead_letters();
  void flush_forwards();
  dlq::Letter letter_of(const Record& r, dlq::Reason reason) const;

  boost::asio::io_context& io_;
  db::Pool& pool_;
  const config::Config& cfg_;
  const claim::ClaimStore& store_;
  const dlq::Outbox& outbox_;
  FindFn find_;
  WrittenFn on_written_;
  BatchQueue<uint64_t> done_;
  BatchQueue<Terminal> terminal_;
  BatchQueue<uint64_t> dead_letters_;
  BatchQueue<uint64_t> forwards_;
  boost::asio::steady_timer linger_timer_;
};

}  // namespace idemsink::pipeline
