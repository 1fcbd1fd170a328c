#include "core/offline/replay.h"

#include <charconv>
#include <chrono>
#include <regex>
#include <stdexcept>
#include <vector>

#include "core/claim/claim_store.h"
#include "core/claim/order_hold.h"
#include "core/common/util.h"
#include "core/dlq/headers.h"
#include "core/dlq/letters.h"
#include "core/dlq/outbox.h"

namespace idemsink::offline {

namespace {

constexpr size_t kPage = 500;

struct Candidate {
  claim::RowKey row;
  std::string token;
  std::string src;                    // "topic[partition]@offset" of the claim's record
  std::optional<dlq::Letter> letter;  // its latest dead letter, if the outbox still has it
  uint64_t letter_id = 0;
  std::string why_not;
};

// One failed claim of the route and what its dead letter allows: why_not
// says why it cannot be replayed.
Candidate read_candidate(dlq::FailedClaim f, const config::Config& cfg, int64_t now_ms) {
  Candidate cand;
  cand.row = std::move(f.row);
  cand.token = std::move(f.token);
  cand.src = std::move(f.src);
  if (!f.letter) {
    cand.why_not = "its dead letter is no longer in the outbox (claim.outbox_retention)";
    return cand;
  }
  cand.letter_id = f.letter_id;
  dlq::Letter& d = *f.letter;
  for (const auto& h : d.headers) {
    if (h.name == dlq::headers::kPayloadCut) cand.why_not = "its dead letter kept only part of the payload";
    if (h.name == dlq::headers::kDbError)
      cand.why_not = "its dead letter was stored without the payload (the database refused it)";
  }
  // The copy carries the original timestamp so that it lands on this claim
  // row; one the host would refuse, or that maps elsewhere, would leave the
  // row re-opened with nothing coming to finish it.
  const int64_t horizon_days = cfg.claim.retention_days - cfg.claim.horizon_margin_days;
  if (claim::bucket_of(d.timestamp_ms) != cand.row.bucket)
    cand.why_not = "its dead letter's timestamp does not map to its claim row (month " + cand.row.bucket + ")";
  else if (d.timestamp_ms < now_ms - horizon_days * 86'400'000)
    cand.why_not = "older than the replay horizon (" + std::to_string(horizon_days) +
                   " days): a host would refuse it as beyond_replay_horizon";
  cand.letter = std::move(f.letter);
  return cand;
}

// The letter's headers for its next pass: the replay count goes up by one,
// earlier idemsink.* headers are replaced by the relay's own. Returns the
// new count.
uint64_t count_replay(dlq::Letter& d) {
  uint64_t replayed = 1;
  std::vector<dlq::StoredHeader> kept;
  for (auto& h : d.headers) {
    if (h.name == dlq::headers::kReplayed) {
      const std::string v = h.value.value_or("");
      uint64_t n = 0;
      if (auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
          ec == std::errc() && p == v.data() + v.size())
        replayed = n + 1;
      continue;
    }
    if (h.name.starts_with("idemsink.")) continue;
    kept.push_back(std::move(h));
  }
  kept.push_back({dlq::headers::kReplayed, std::to_string(replayed)});
  d.headers = std::move(kept);
  return replayed;
}

// The claim re-opened and its copy queued for the source topic, in one
// transaction; false if another replay or a host changed the row first. On
// an ordered route that goes on past dead records, an old hold of the claim
// (from a retry topic it went through) would hold its entity again once the
// claim is pending: it goes, and the copy takes its place among its entity's
// records as they arrive. A route that holds on dead keeps the hold: the
// copy runs before the records it holds (docs/outputs.md).
bool reopen_and_queue(db::Connection& c, const claim::ClaimStore& store, const dlq::Outbox& outbox,
                      const config::RouteConfig& route, const Candidate& cand, const dlq::Letter& copy,
                      const decltype(ReplayFilter::in_transaction)& in_transaction) {
  c.begin();
  try {
    const bool ours = store.reopen_failed(c, cand.row, cand.token, copy.error);
    if (ours) outbox.insert_replay(c, copy);
    if (ours && in_transaction) in_transaction(c, cand.row.biz_key, cand.token, cand.letter_id);
    if (ours && route.order_by.enabled() && !route.order_by.hold_on_dead())
      claim::OrderHolds::release_claim(c, cand.row);
    c.commit();
    return ours;
  } catch (...) {
    c.rollback_quietly();
    throw;
  }
}

}  // namespace

std::string since_expression(const std::string& text) {
  constexpr int64_t kTenYearsMs = 10LL * 366 * 86'400'000;
  if (auto d = parse_duration(text); d && d->count() <= kTenYearsMs)
    return "NOW(3) - INTERVAL " + std::to_string(d->count() * 1000) + " MICROSECOND";
  static const std::regex time(R"((\d{4})-(\d{2})-(\d{2})( (\d{2}):(\d{2})(:(\d{2}))?)?)");
  std::smatch m;
  const auto in = [&](int group, int lo, int hi) {
    return !m[group].matched || (std::stoi(m[group]) >= lo && std::stoi(m[group]) <= hi);
  };
  if (std::regex_match(text, m, time) && in(2, 1, 12) && in(3, 1, 31) && in(5, 0, 23) && in(6, 0, 59) && in(8, 0, 59))
    return "TIMESTAMP'" + text + (text.size() == 10 ? " 00:00:00" : "") + "'";
  throw std::invalid_argument("--since \"" + text +
                              "\": expected a duration back from now (\"30m\", \"2h\", \"7d\") or a UTC time "
                              "(\"2026-11-30\", \"2026-11-30 14:05:00\")");
}

ReplayReport replay(db::Connection& c, const config::Config& cfg, const ReplayFilter& filter, std::ostream& out) {
  const config::RouteConfig* route = cfg.route_by_name(filter.route);
  if (route == nullptr)
    throw std::invalid_argument("--route " + filter.route + ": no such route in " + cfg.file.string());
  const claim::ClaimStore store(cfg.host.id, cfg.host.id + "#replay", cfg.claim.lease);
  // Lease 0: any running host's relay may publish the rows at once.
  const dlq::Outbox outbox(cfg.host.id + "#replay-" + random_uuid().substr(0, 8), std::chrono::milliseconds(0));

  const dlq::FailedQuery query{route->name, filter.reason, filter.since, filter.key, filter.letter_ids};

  ReplayReport report;
  const int64_t now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  std::optional<claim::RowKey> after;  // keyset paging over the primary key
  for (;;) {
    auto rows = dlq::failed_claims(c, query, after, kPage);
    for (auto& f : rows) {
      ++report.matched;
      Candidate cand = read_candidate(std::move(f), cfg, now_ms);
      after = cand.row;
      if (!cand.why_not.empty()) {
        ++report.not_replayable;
        out << "  not replayed: key " << printable(cand.row.biz_key) << " (source " << cand.src << "): " << cand.why_not
            << "\n";
        continue;
      }
      dlq::Letter& d = *cand.letter;
      const uint64_t replayed = count_replay(d);
      if (filter.dry_run) {
        ++report.replayed;
        out << "  would replay: key " << printable(cand.row.biz_key) << " (source " << cand.src << ", replay #"
            << replayed << ")\n";
        continue;
      }
      d.purpose = dlq::Purpose::Replay;
      d.route = route->name;
      d.topic = route->topic;
      d.biz_key = cand.row.biz_key;
      d.reason = "replay";
      d.error = "replayed by an operator (replay #" + std::to_string(replayed) + ")";
      d.idem_token = cand.token;
      d.calls = 0;
      d.first_failure_ms = d.last_failure_ms = now_ms;
      d.host = cfg.host.id + " (idemsink replay)";
      if (reopen_and_queue(c, store, outbox, *route, cand, d, filter.in_transaction)) {
        ++report.replayed;
      } else {
        ++report.taken_by_other;
      }
    }
    if (rows.size() < kPage) break;
  }
  return report;
}

}  // namespace idemsink::offline
