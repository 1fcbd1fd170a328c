// Outcomes made durable, in batches: one statement marks a group of records
// done; failed and unknown records get their terminal mark and their outbox
// row in one transaction; refused records get only an outbox row; records
// moving to a retry topic have their claim released and their outbox row
// written in one transaction. Once written, a record's offset may be
// committed: its outcome can no longer be lost.
//
// A row the database refuses (ErrorClass::Data) never stops its batch: the
// batch is split until that row is alone, the others are written, and the
// record comes back as Rejected for the engine to end it another way. A job
// failing unexpectedly for longer than database.job_give_up_after comes back
// as GaveUp: its records are let go, never left wedged.
#pragma once

#include "core/common/asio.h"
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/claim/claim_store.h"
#include "core/claim/order_hold.h"
#include "core/config/config.h"
#include "core/db/pool.h"
#include "core/dlq/outbox.h"
#include "core/pipeline/batch_queue.h"
#include "core/pipeline/record.h"

namespace idemsink::pipeline {

class EngineDoors;

class OutcomeWriter {
 public:
  enum class Kind { Done, Ended, DeadLettered, Forwarded };
  enum class Result {
    Written,   ///< durable
    Fenced,    ///< the claim was taken over meanwhile: nothing written; its new owner's outcome decides
    Rejected,  ///< the database refused this record's row (`error`): nothing written
    GaveUp,    ///< the job kept failing unexpectedly (`error`): nothing written
  };
  struct Written {
    Kind kind;
    uint64_t id;
    Result result;
    claim::Status status;  // Ended
    std::string error;     // Rejected, GaveUp
  };
  /// The records of each job, written, go to `doors.on_written`.
  OutcomeWriter(boost::asio::io_context& io, db::Pool& pool, const config::Config& cfg, const claim::ClaimStore& store,
                const dlq::Outbox& outbox, EngineDoors& doors);

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
  /// What a terminal record leaves besides its dead letter (record_outputs.h).
  struct Beside {
    std::optional<dlq::Letter> event;
    std::optional<claim::OrderHold> hold;
  };
  void flush_done();
  void flush_terminal();
  void flush_dead_letters();
  void flush_forwards();
  dlq::Letter letter_of(const Record& r, dlq::Reason reason) const;
  /// Hands a job's results to the engine (posted to the engine thread).
  void report(std::vector<Written> written);
  /// Give-up handler of a job over `ids` (`terms` for terminal jobs).
  db::Pool::GiveUp give_up(Kind kind, std::vector<uint64_t> ids, std::vector<claim::Status> statuses = {});

  boost::asio::io_context& io_;
  db::Pool& pool_;
  const config::Config& cfg_;
  const claim::ClaimStore& store_;
  const dlq::Outbox& outbox_;
  EngineDoors& doors_;
  BatchQueue<uint64_t> done_;
  BatchQueue<Terminal> terminal_;
  BatchQueue<uint64_t> dead_letters_;
  BatchQueue<uint64_t> forwards_;
  boost::asio::steady_timer linger_timer_;
};

}  // namespace idemsink::pipeline
