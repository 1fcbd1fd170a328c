// Calls: claimed records wait in their route's ready queue for a call slot
// (host.max_in_flight in all, route.concurrency per route; routes take turns)
// and for their route's budget (route.rate_limit, Retry-After holds),
// then their handler is invoked asynchronously with a deadline
// (route.call_timeout). Thousands of calls in flight need no threads: the
// plugin reports through a call id, on any thread, and the report is handed
// back here, many reports to one wake-up of the engine thread. Deadlines are
// kept per route in call order (one timeout per route), checked by one
// timer per route, at most 10 times a second: no timer per call. local_tx
// records go to the LocalTxRunner instead.
//
// Before a remote call goes out, the claim is confirmed in the database when
// it must be: always for an at-most-once route (the same statement writes the
// call mark, so a host taking the claim over knows the call may have gone
// out), and for any route when our lease is not known to be fresh (renewals
// have been failing: another host may own the record by now). One statement
// per wave of calls; a record found taken over is not called.
#pragma once

#include "core/common/asio.h"
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/claim/claim_store.h"
#include "core/db/pool.h"
#include "core/pipeline/batch_queue.h"
#include "core/pipeline/local_tx.h"
#include "core/pipeline/record.h"

namespace idemsink::pipeline {

class EngineDoors;

class Dispatcher {
 public:
  /// Reports through `doors`: a call's result, a record fenced before its
  /// call, a half-open route wanting a fresh probe.
  Dispatcher(boost::asio::io_context& io, db::Pool& pool, const claim::ClaimStore& store, int max_in_flight,
             std::chrono::milliseconds lease, EngineDoors& doors, LocalTxRunner& local_tx);

  /// Queues a claimed record for a call slot.
  void make_ready(Record& r);
  /// Starts calls while slots are free.
  void pump();
  /// Shutdown: no deadline ends a call, no wake-up pumps, from now on.
  void stop();
  /// Frees the slot of a call that ended (reported or timed out), or, with
  /// `observe_latency` false, of one that never went out (fenced, not confirmed).
  void end_call(Record& r, bool observe_latency = true);

 private:
  struct Deadline {
    std::chrono::steady_clock::time_point at;
    uint64_t id;
    uint64_t call_id;
  };
  struct Lane {
    int in_flight = 0;
    std::deque<uint64_t> ready;
    uint64_t probe_chosen_in = 0;                     // the circuit's probe round the probe was last picked in
    std::unique_ptr<boost::asio::steady_timer> wake;  // when the route's budget allows the next call
    bool wake_armed = false;
    // Calls' deadlines in the order they went out (the route's one
    // call_timeout keeps them sorted); an entry stays after its call ended
    // and is dropped when its time comes.
    std::deque<Deadline> deadlines;
    std::unique_ptr<boost::asio::steady_timer> deadline_timer;
    bool deadline_armed = false;
  };
  /// A plugin's report, as handed over from the thread it came on.
  struct Report {
    uint64_t id;
    uint64_t call_id;
    idemsink_outcome outcome;
    std::string detail;
  };
  /// The route may not call before `at` (rate limit, hold): pump then.
  void wake_at(Route& route, Lane& lane, std::chrono::steady_clock::time_point at);
  /// Half-open: puts the held record tried the fewest times first in the
  /// lane, to be the probe; asks for fetching when none is fresh.
  void choose_probe(Route& route, Lane& lane);
  bool needs_confirmation(const Record& r) const;
  void take_slot(Record& r);
  void flush_confirmations();
  void confirmed(const std::vector<uint64_t>& ids, const std::vector<bool>& ours,
                 std::chrono::steady_clock::time_point sent);
  void dispatch(Record& r);
  /// Any thread: queues a report; the first of a batch wakes the engine thread.
  void hand_over(Report report);
  void on_call_done(uint64_t id, uint64_t call_id, idemsink_outcome outcome, std::string detail);
  void arm_deadlines(Lane& lane, std::chrono::steady_clock::time_point not_before);
  void check_deadlines(Lane& lane);

  boost::asio::io_context& io_;
  db::Pool& pool_;
  const claim::ClaimStore& store_;
  const int max_in_flight_;
  const std::chrono::milliseconds lease_;
  EngineDoors& doors_;
  LocalTxRunner& local_tx_;
  std::map<Route*, Lane> lanes_;  // ordered: routes take turns in a stable order
  int in_flight_ = 0;
  BatchQueue<uint64_t> confirmations_;
  boost::asio::steady_timer confirm_retry_;
  std::mutex reports_mu_;
  std::vector<Report> reports_;  // handed over, not yet taken by the engine thread
  bool reports_posted_ = false;
};

}  // namespace idemsink::pipeline
