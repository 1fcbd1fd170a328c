// Calls: claimed records wait in their route's ready queue for a call slot
// (host.max_in_flight in all, route.concurrency per route; routes take turns),
// then their handler is invoked asynchronously with a deadline
// (route.call_timeout). Thousands of calls in flight need no threads: the
// plugin reports through a call id, on any thread, and the report is posted
// back here. local_tx records go to the LocalTxRunner instead.
#pragma once

#include <utility>  // before Boost.Asio 1.74: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/pipeline/local_tx.h"
#include "core/pipeline/record.h"

namespace idemsink::pipeline {

class Dispatcher {
 public:
  using FindFn = std::function<Record*(uint64_t id)>;
  /// A call's result (or its deadline passing, as uncertain), on the engine
  /// thread; the call's slot is already free.
  using ResultFn = std::function<void(Record&, idemsink_outcome, std::string detail)>;

  Dispatcher(boost::asio::io_context& io, int max_in_flight, FindFn find, ResultFn on_result, LocalTxRunner& local_tx);

  /// Queues a claimed record for a call slot.
  void make_ready(Record& r);
  /// Starts calls while slots are free.
  void pump();
  /// Frees the slot of a call that ended (reported, timed out, or fenced).
  void end_call(Record& r, bool observe_latency = true);

  /// The record as handed to a plugin; `headers` backs its header array.
  static idemsink_record abi_record(const Record& r, std::vector<idemsink_header>& headers);

 private:
  struct Lane {
    int in_flight = 0;
    std::deque<uint64_t> ready;
  };
  void dispatch(Record& r);
  void on_call_done(uint64_t id, uint64_t call_id, idemsink_outcome outcome, std::string detail);

  boost::asio::io_context& io_;
  const int max_in_flight_;
  FindFn find_;
  ResultFn on_result_;
  LocalTxRunner& local_tx_;
  std::map<Route*, Lane> lanes_;  // ordered: routes take turns in a stable order
  int in_flight_ = 0;
};

}  // namespace idemsink::pipeline
