// Claims records in batches: one claim job per up to kafka.max_poll_records
// records, two jobs at most in flight, each re-run on a fresh connection
// after a lost one (remembering what it wrote, so that a re-run reads its
// own rows as its own). A row the database refuses for its data is isolated
// (the batch is split around it) and reported apart; the other rows are
// claimed. Records whose key another live host holds wait here and are
// claimed again every claim.wait_recheck.
//
// What a claim result means for a record (run, duplicate, refuse, wait) is
// the engine's: this module only moves records to and from the claim table.
#pragma once

#include "core/common/asio.h"
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/claim/claim_store.h"
#include "core/config/config.h"
#include "core/db/pool.h"
#include "core/pipeline/batch_queue.h"
#include "core/common/periodic.h"
#include "core/pipeline/record.h"

namespace idemsink::pipeline {

class EngineDoors;

class Claimer {
 public:
  struct Claimed {
    std::vector<uint64_t> ids;                   // records of the job, in request order
    std::vector<claim::ClaimResult> results;     // one per id
    std::map<uint64_t, std::string> refused;     // ids whose row the database refused, with its error
    std::chrono::steady_clock::time_point sent;  // when the job was submitted: every lease it set runs from later
  };
  /// Reports through `doors.on_claimed`.
  Claimer(boost::asio::io_context& io, db::Pool& pool, claim::ClaimStore& store, const config::Config& cfg,
          EngineDoors& doors);

  void start();
  void stop();

  /// Claims the record with the next batch (stage Claim, then Claiming).
  void claim(Record& r);
  /// Claims it again after claim.wait_recheck (stage Busy).
  void claim_later(Record& r);
  /// Sends what waits, as far as job slots allow.
  void flush();
  bool jobs_running() const { return queue_.jobs() > 0; }

 private:
  void run_job(std::vector<uint64_t> ids, std::vector<claim::ClaimRequest> reqs);

  boost::asio::io_context& io_;
  db::Pool& pool_;
  claim::ClaimStore& store_;
  const config::Config& cfg_;
  EngineDoors& doors_;
  BatchQueue<uint64_t> queue_;
  std::vector<uint64_t> waiting_;  // stage Busy: claimed again on the recheck timer
  Periodic recheck_;
};

}  // namespace idemsink::pipeline
