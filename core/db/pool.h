// A fixed set of worker threads, one MariaDB connection each, running jobs
// from one FIFO queue. The pipeline never blocks on the database: it submits
// a job and the job posts its result back.
//
// Delivery semantics, by the class of the error (connection.h):
//   connection lost   reconnect and re-run the job, for as long as it takes:
//                     an outage is waited out, nothing is dropped
//   transient         (deadlock, lock wait) re-run at once
//   data              the statement refuses a row: re-running it as is fails
//                     again, so a job with a give-up handler is handed the
//                     error at once (it isolates the row); others back off
//   anything else     back off and re-run for database.job_give_up_after,
//                     then hand the error to the give-up handler (if any)
// Jobs are therefore written to be re-runnable: every state change they make
// is conditional (CAS) and transactions are rolled back by a lost connection.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/config/config.h"
#include "core/db/connection.h"

namespace idemsink::db {

class Pool {
 public:
  using Job = std::function<void(Connection&)>;
  /// Called on the worker thread when a job gives up (see above).
  using GiveUp = std::function<void(const DbError&)>;

  Pool(config::DatabaseConfig cfg, int threads);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  /// Called (on a worker thread) when a new connection reaches another
  /// server than the pool's connections so far (@@server_id): a failover.
  using ServerChanged = std::function<void(uint64_t from, uint64_t to)>;
  void on_server_changed(ServerChanged fn);

  /// Queues a job. `name` labels it in error logs and metrics.
  void submit(std::string name, Job job, GiveUp give_up = nullptr);

  /// Runs a job on the calling thread with a temporary connection; used at
  /// start-up (schema) and by CLI commands. Throws DbError.
  static void run_once(const config::DatabaseConfig& cfg, const Job& job);

  /// Lets queued jobs finish until `deadline`, then abandons the rest and joins.
  void stop(std::chrono::steady_clock::time_point deadline);

  size_t queued() const;
  uint64_t statements() const { return statements_.load(); }
  uint64_t reconnects() const { return reconnects_.load(); }
  uint64_t job_failures() const { return job_failures_.load(); }
  /// Failed runs of jobs, by job name and error class ("connection_lost",
  /// "transient", "data", "unexpected").
  std::map<std::pair<std::string, std::string>, uint64_t> failures_by_job() const;
  /// False while some worker is failing to reach the database.
  bool healthy() const { return unhealthy_workers_.load() == 0; }
  /// Jobs failing for another reason than the connection right now, and the
  /// last such error ("" when none).
  int failing_jobs() const { return failing_jobs_.load(); }
  std::string last_job_error() const;

 private:
  struct Item {
    std::string name;
    Job job;
    GiveUp give_up;
  };
  // What one job's failures are counted in while it retries.
  struct Trouble {
    bool unreachable = false;  // counted in unhealthy_workers_
    bool failing = false;      // counted in failing_jobs_
    std::chrono::steady_clock::time_point failing_since{};
  };
  enum class AfterFailure { RunAgain, BackOff, GaveUp };
  void count_failure(const std::string& job, ErrorClass cls, const std::string& error);
  void note_server(uint64_t id);
  void worker(int index);
  std::optional<Item> next_item();
  void run_job(int index, Item& item, std::unique_ptr<Connection>& conn, std::mt19937& rng);
  std::optional<DbError> run_once(Item& item, std::unique_ptr<Connection>& conn, int attempt);
  AfterFailure on_failure(int index, Item& item, const DbError& error, int attempt, Trouble& trouble,
                          std::unique_ptr<Connection>& conn);
  bool back_off(int attempt, std::mt19937& rng);

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
  std::atomic<int> failing_jobs_{0};
  std::map<std::pair<std::string, std::string>, uint64_t> failures_;  // under mu_
  std::string last_job_error_;                                        // under mu_
  uint64_t server_id_ = 0;                                            // under mu_: the server seen last
  ServerChanged on_server_changed_;                                   // under mu_
};

}  // namespace idemsink::db
