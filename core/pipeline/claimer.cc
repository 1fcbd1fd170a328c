#include "core/pipeline/claimer.h"

#include "core/pipeline/engine_doors.h"

#include <span>

#include "core/common/fault.h"
#include "core/common/log.h"
#include "core/db/isolate.h"

namespace idemsink::pipeline {

namespace asio = boost::asio;

namespace {
constexpr int kMaxClaimJobs = 2;
}

Claimer::Claimer(asio::io_context& io, db::Pool& pool, claim::ClaimStore& store, const config::Config& cfg,
                 EngineDoors& doors)
    : io_(io), pool_(pool), store_(store), cfg_(cfg), doors_(doors), queue_(kMaxClaimJobs), recheck_(io) {}

void Claimer::start() {
  recheck_.start(cfg_.claim.wait_recheck, [this] {
    for (uint64_t id : std::exchange(waiting_, {}))
      if (Record* r = doors_.at(id, Stage::Busy)) claim(*r);
  });
}

void Claimer::stop() { recheck_.stop(); }

void Claimer::claim(Record& r) {
  r.move_to(Stage::Claim);
  queue_.push(r.id);
  if (queue_.schedule())
    asio::post(io_, [this] {
      queue_.flushing();
      flush();
    });
}

void Claimer::claim_later(Record& r) {
  r.move_to(Stage::Busy);
  waiting_.push_back(r.id);
}

void Claimer::flush() {
  const size_t batch_max = static_cast<size_t>(cfg_.kafka.max_poll_records);
  for (auto ids = queue_.take(batch_max); !ids.empty(); ids = queue_.take(batch_max)) {
    std::vector<uint64_t> live;
    std::vector<claim::ClaimRequest> reqs;
    for (uint64_t id : ids) {
      Record* r = doors_.at(id, Stage::Claim);
      if (r == nullptr) continue;  // ended meanwhile (revoked)
      r->move_to(Stage::Claiming);
      live.push_back(id);
      claim::ClaimRequest q;
      q.key = claim::RowKey{r->route->cfg.name, r->biz_key, claim::bucket_of(r->timestamp_ms)};
      q.payload_hash = r->payload_hash;
      q.check_payload = r->route->cfg.payload_check;
      q.source() = r->source();
      q.order_key = r->order_key;
      q.hold_on_dead = r->route->cfg.order_by.hold_on_dead();
      reqs.push_back(std::move(q));
    }
    if (live.empty()) {
      queue_.job_done();
      continue;
    }
    run_job(std::move(live), std::move(reqs));
  }
}

void Claimer::run_job(std::vector<uint64_t> ids, std::vector<claim::ClaimRequest> reqs) {
  // Kept across re-runs of the job: a re-run recognises what it wrote.
  auto memory = std::make_shared<claim::ClaimJobMemory>();
  const auto sent = std::chrono::steady_clock::now();
  pool_.submit(
      "claim batch",
      [this, ids, reqs = std::move(reqs), memory, sent](db::Connection& c) {
        Claimed out;
        out.ids = ids;
        out.sent = sent;
        out.results.resize(reqs.size());
        auto rejected = db::write_isolating(c, reqs.size(), [&](size_t first, size_t n) {
          auto part = store_.claim(c, std::span(reqs).subspan(first, n), *memory);
          std::move(part.begin(), part.end(), out.results.begin() + static_cast<long>(first));
        });
        fault::hit("after_claim_commit");
        for (const auto& r : rejected) out.refused[ids[r.index]] = r.error.what();
        asio::post(io_, [this, out = std::move(out)] {
          queue_.job_done();
          doors_.on_claimed(out);
          flush();
        });
      },
      [this, ids](const db::DbError& e) {
        // Nothing claimed: the records wait and are claimed again later.
        spdlog::error("claim batch of {} record(s) gave up ({}); they are claimed again in {}ms", ids.size(), e.what(),
                      cfg_.claim.wait_recheck.count());
        asio::post(io_, [this, ids] {
          queue_.job_done();
          for (uint64_t id : ids)
            if (Record* r = doors_.at(id, Stage::Claiming)) claim_later(*r);
          flush();
        });
      });
}

}  // namespace idemsink::pipeline
