// claim_bench: the claim path's cost per 200-record poll, against the naive
// per-message dedup of seed 002 (SELECT, then INSERT, then UPDATE when done),
// both on the same scratch MariaDB in the same run. Prints statements and
// milliseconds per batch and the ratio; absolute times depend on the machine.
#include <chrono>
#include <iomanip>
#include <iostream>

#include "core/claim/claim_store.h"
#include "core/claim/schema.h"
#include "core/common/util.h"
#include "devkit/mariadb_server.h"

using namespace idemsink;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  const int batches = argc > 1 ? std::stoi(argv[1]) : 40;
  const int per_batch = 200;
  auto& server = devkit::MariaDbServer::shared();
  db::Connection c(server.fresh_database("claim_bench"));
  claim::apply_schema(c, std::chrono::system_clock::now(), {});
  c.execute("CREATE TABLE naive_dedup (msg_id VARCHAR(64) PRIMARY KEY, status TINYINT NOT NULL) ENGINE=InnoDB");
  claim::ClaimStore store("bench", "bench#1", std::chrono::seconds(30));
  const int64_t now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();

  struct Result {
    uint64_t statements = 0;
    double ms = 0;
  };
  // idemsink: one claim batch (read + INSERT IGNORE ... RETURNING) and one
  // done batch per poll; then the same poll redelivered (one read).
  auto ours = [&](bool redelivery, const std::string& prefix) {
    Result r;
    for (int b = 0; b < batches; ++b) {
      std::vector<claim::ClaimRequest> reqs;
      for (int i = 0; i < per_batch; ++i) {
        claim::ClaimRequest q;
        q.key = {"waybill", prefix + std::to_string(b * per_batch + i), claim::bucket_of(now_ms)};
        q.payload_hash = payload_hash("p");
        q.src_topic = "orders";
        reqs.push_back(std::move(q));
      }
      const uint64_t s0 = c.statements_sent();
      const auto t0 = Clock::now();
      auto res = store.claim(c, reqs);
      if (!redelivery) {
        std::vector<claim::Outcome> outs;
        for (const auto& x : res) outs.push_back({x.row, x.attempt, 1, 0, "R", {}});
        store.mark_done(c, outs);
      }
      r.ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      r.statements += c.statements_sent() - s0;
    }
    return r;
  };
  // Seed 002's loop: per message SELECT; if absent INSERT; UPDATE when done.
  auto naive = [&](const std::string& prefix) {
    Result r;
    for (int b = 0; b < batches; ++b) {
      const uint64_t s0 = c.statements_sent();
      const auto t0 = Clock::now();
      for (int i = 0; i < per_batch; ++i) {
        const std::string id = c.quote(prefix + std::to_string(b * per_batch + i));
        if (!c.query("SELECT status FROM naive_dedup WHERE msg_id = " + id).empty()) continue;
        c.execute("INSERT INTO naive_dedup (msg_id, status) VALUES (" + id + ", 1)");
        c.execute("UPDATE naive_dedup SET status = 2 WHERE msg_id = " + id);
      }
      r.ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      r.statements += c.statements_sent() - s0;
    }
    return r;
  };

  const Result base_new = naive("n-"), base_dup = naive("n-");
  const Result new_poll = ours(false, "o-"), dup_poll = ours(true, "o-");
  auto row = [&](const char* what, const Result& base, const Result& mine) {
    std::cout << std::left << std::setw(26) << what << std::right << std::setw(10) << base.statements / batches
              << std::setw(10) << mine.statements / batches << std::setw(12) << std::fixed << std::setprecision(1)
              << base.ms / batches << std::setw(12) << mine.ms / batches << std::setw(10) << std::setprecision(1)
              << base.ms / mine.ms << "x\n";
  };
  std::cout << "claim_bench: " << batches << " polls of " << per_batch
            << " records, MariaDB on loopback, innodb_flush_log_at_trx_commit=1\n"
            << std::left << std::setw(26) << "per poll" << std::right << std::setw(10) << "naive st" << std::setw(10)
            << "ours st" << std::setw(12) << "naive ms" << std::setw(12) << "ours ms" << std::setw(10) << "speed-up\n";
  row("new records (claim+done)", base_new, new_poll);
  row("redelivered poll", base_dup, dup_poll);
  return 0;
}
