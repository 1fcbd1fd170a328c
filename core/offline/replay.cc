#include "core/offline/replay.h"

#include <array>
#include <charconv>
#include <chrono>
#include <regex>
#include <stdexcept>
#include <vector>

#include "core/claim/claim_store.h"
#include "core/claim/order_hold.h"
#include "core/common/util.h"
#include "core/dlq/headers.h"
#include "core/dlq/outbox.h"

namespace idemsink::offline {

namespace {

constexpr size_t kPage = 500;

// What a page of replay candidates reads: the failed claim and its latest
// dead letter, column by column.
enum Column : size_t {
  kBizKey,
  kBucket,
  kToken,
  kClaimTopic,
  kClaimPartition,
  kClaimOffset,
  kLetterId,
  kReason,
  kSrcTopic,
  kSrcPartition,
  kSrcOffset,
  kMsgKey,
  kMsgValue,
  kMsgHeaders,
  kMsgTimestamp,
  kColumns
};
constexpr std::array<std::string_view, kColumns> kSelect = {"c.biz_key",
                                                            "DATE_FORMAT(c.bucket, '%Y-%m-%d')",
                                                            "c.idem_token",
                                                            "c.src_topic",
                                                            "c.src_partition",
                                                            "c.src_offset",
                                                            "o.id",
                                                            "o.reason",
                                                            "o.src_topic",
                                                            "o.src_partition",
                                                            "o.src_offset",
                                                            "o.msg_key",
                                                            "o.msg_value",
                                                            "o.msg_headers",
                                                            "o.msg_timestamp"};

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
Candidate read_candidate(const db::Row& r, const config::Config& cfg, const std::string& route, int64_t now_ms) {
  Candidate cand;
  cand.row = {route, *r[kBizKey], *r[kBucket]};
  cand.token = *r[kToken];
  cand.src = *r[kClaimTopic] + "[" + *r[kClaimPartition] + "]@" + *r[kClaimOffset];
  if (!r[kLetterId]) {
    cand.why_not = "its dead letter is no longer in the outbox (claim.outbox_retention)";
    return cand;
  }
  cand.letter_id = std::stoull(*r[kLetterId]);
  dlq::Letter d;
  d.headers = dlq::decode_headers(r[kMsgHeaders].value_or(""));
  for (const auto& h : d.headers) {
    if (h.name == dlq::headers::kPayloadCut) cand.why_not = "its dead letter kept only part of the payload";
    if (h.name == dlq::headers::kDbError)
      cand.why_not = "its dead letter was stored without the payload (the database refused it)";
  }
  d.src_topic = *r[kSrcTopic];
  d.src_partition = std::stoi(*r[kSrcPartition]);
  d.src_offset = std::stoll(*r[kSrcOffset]);
  d.key = r[kMsgKey];
  d.value = r[kMsgValue];
  d.timestamp_ms = std::stoll(*r[kMsgTimestamp]);
  // The copy carries the original timestamp so that it lands on this claim
  // row; one the host would refuse, or that maps elsewhere, would leave the
  // row re-opened with nothing coming to finish it.
  const int64_t horizon_days = cfg.claim.retention_days - cfg.claim.horizon_margin_days;
  if (claim::bucket_of(d.timestamp_ms) != cand.row.bucket)
    cand.why_not = "its dead letter's timestamp does not map to its claim row (month " + cand.row.bucket + ")";
  else if (d.timestamp_ms < now_ms - horizon_days * 86'400'000)
    cand.why_not = "older than the replay horizon (" + std::to_string(horizon_days) +
                   " days): a host would refuse it as beyond_replay_horizon";
  cand.letter = std::move(d);
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

  std::string where =
      "c.namespace = " + db::Connection::hex(route->name) + " AND " + claim::sql_status_is(claim::Status::Failed, "c.");
  if (filter.key) where += " AND c.biz_key = " + db::Connection::hex(*filter.key);
  if (filter.since) where += " AND c.updated_at >= " + *filter.since;
  // The latest dead letter of each claim (a replayed record dead again has a newer one).
  const std::string letter =
      "(SELECT MAX(o2.id) FROM idemsink_dlq_outbox o2 WHERE o2.idem_token = c.idem_token AND o2.route = c.namespace "
      "AND " +
      dlq::sql_purpose_is(dlq::Purpose::DeadLetter, "o2.") + ")";
  if (filter.reason) where += " AND o.reason = " + c.quote(*filter.reason);
  // A letter an operator discarded needs nothing more.
  where += " AND o.discarded_at IS NULL";
  if (!filter.letter_ids.empty()) {
    std::string ids;
    for (uint64_t id : filter.letter_ids) ids += (ids.empty() ? "" : ", ") + std::to_string(id);
    where += " AND o.id IN (" + ids + ")";
  }
  std::string select = "SELECT ";
  for (size_t i = 0; i < kSelect.size(); ++i) select += (i ? ", " : "") + std::string(kSelect[i]);

  ReplayReport report;
  const int64_t now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  std::string after_key, after_bucket;  // keyset paging over the primary key
  for (;;) {
    std::string page_where = where;
    if (!after_key.empty())
      page_where += " AND (c.biz_key, c.bucket) > (" + db::Connection::hex(after_key) + ", DATE'" + after_bucket + "')";
    const auto rows = c.query(select + " FROM idemsink_claim c LEFT JOIN idemsink_dlq_outbox o ON o.id = " + letter +
                              " WHERE " + page_where + " ORDER BY c.biz_key, c.bucket LIMIT " + std::to_string(kPage));
    for (const auto& r : rows) {
      ++report.matched;
      Candidate cand = read_candidate(r, cfg, route->name, now_ms);
      after_key = cand.row.biz_key;
      after_bucket = cand.row.bucket;
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
