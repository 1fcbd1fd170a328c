// A fixed set of worker threads, one MariaDB connection each, running jobs
// from one FIFO queue. The pipeline never blocks on the database: it submits
// a job and the job posts its result back.
//
// Delivery semantics: a job that fails with a database error is re-run from
// the start on a fresh connection after a capped exponential backoff, until
// it succeeds or the pool stops. Jobs are therefore written to be re-runnable:
// every state change they make is conditional (CAS) and transactions are
// rolled back by a lost connection. Nothing is dropped because the database
// went away; the work waits for it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/config/config.h"
#include "core/db/connection.h"

namespace idemsink::db {

class Pool {
 public:
  using Job = std::function<void(Connection&)>;

  Pool(config::DatabaseConfig cfg, int threads);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  /// Queues a job. `name` labels it in error logs.
  void submit(std::string name, Job job);

  /// Runs a job on the calling thread with a temporary connection; used at
  /// start-up (schema) and by CLI commands. Throws DbError.
  static void run_once(const config::DatabaseConfig& cfg, const Job& job);

  /// Lets queued jobs finish until `deadline`, then abandons the rest and joins.
  void stop(std::chrono::steady_clock::time_point deadline);

  size_t queued() const;
  uint64_t statements() const { return statements_.load(); }
  uint64_t reconnects() const { return reconnects_.load(); }
  uint64_t job_failures() const { return job_failures_.load(); }
  /// False while some worker is failing to reach the database.
  bool healthy() const { return unhealthy_workers_.load() == 0; }

 private:
  struct Item {
    std::string name;
    Job job;
  };
  void worker(int index);

  config::DatabaseConfig cfg_;
  mutable std::mutex mu_;
  std::condition_variable cv_;       // work queued, or stopping
  std::condition_variable idle_cv_;  // a job finished (stop() waits for idle)
  std::deque<Item> queue_;
  int active_ = 0;
  bool stopping_ = false;
  bool abandon_ = false;
  std::vector<std::thread> threads_;
  std::atomic<uint64_t> statements_{0};
  std::atomic<uint64_t> reconnects_{0};
  std::atomic<uint64_t> job_failures_{0};
  std::atomic<int> unhealthy_workers_{0};
};

}  // namespace idemsink::db
