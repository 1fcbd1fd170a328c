#include "core/offline/audit.h"

#include <librdkafka/rdkafka.h>

#include <map>
#include <set>

#include "core/claim/claim_store.h"
#include "core/claim/offset_moves.h"
#include "core/claim/offsets.h"
#include "core/db/connection.h"
#include "core/dlq/headers.h"
#include "core/dlq/letters.h"
#include "core/dlq/outbox.h"
#include "core/format/decoder.h"
#include "core/kafka/client.h"
#include "core/kafka/consumer.h"
#include "core/kafka/oauth.h"
#include "core/kafka/watermarks.h"
#include "core/offline/reader.h"
#include "core/pipeline/key_extractor.h"
#include "core/pipeline/route_filter.h"

namespace idemsink::offline {
namespace {

using db::Connection;

struct Seen {
  int64_t offset;
  std::optional<std::string> biz_key;  // nullopt: no key could be extracted
  bool skipped = false;                // the route does not take it ([route.when])
};

constexpr size_t kPage = 1000;  // records accounted per pair of statements

// Accounts for one page of records of one partition. The claim lookup is by
// primary key (namespace, biz_key) across every month partition.
void account(Connection& c, const std::string& route, PartitionAudit& pa, const std::vector<Seen>& seen) {
  std::vector<int64_t> offsets;
  for (const auto& s : seen) offsets.push_back(s.offset);
  const std::set<int64_t> in_outbox = dlq::offsets_in_outbox(c, route, pa.topic, pa.partition, offsets);
  std::set<std::string> keys;
  for (const auto& s : seen)
    if (s.biz_key) keys.insert(*s.biz_key);
  const std::set<std::string> terminal = claim::keys_past_pending(c, route, keys);
  for (const auto& s : seen) {
    ++pa.consumed;
    if (s.skipped) {
      ++pa.skipped;
    } else if (in_outbox.count(s.offset)) {
      ++pa.by_outbox;
    } else if (s.biz_key && terminal.count(*s.biz_key)) {
      ++pa.by_claim;
    } else if (pa.skipped_by_operator(s.offset)) {
      ++pa.by_operator_skip;
    } else {
      pa.missing.push_back(s.offset);
    }
  }
}

// "3, 7..12, 40": consecutive offsets as ranges.
std::string ranges(const std::vector<int64_t>& offsets, size_t max_ranges) {
  std::string out;
  size_t n = 0;
  for (size_t i = 0; i < offsets.size();) {
    size_t j = i;
    while (j + 1 < offsets.size() && offsets[j + 1] == offsets[j] + 1) ++j;
    if (n++ == max_ranges) return out + ", ...";
    out += (out.empty() ? "" : ", ") + std::to_string(offsets[i]) +
           (j > i ? ".." + std::to_string(offsets[j]) : std::string());
    i = j + 1;
  }
  return out;
}

// The group's committed offset of each of the `parts` partitions of `topic`.
kafka::PartitionListPtr committed_offsets(rd_kafka_t* group, const std::string& topic, int parts) {
  kafka::PartitionListPtr committed(rd_kafka_topic_partition_list_new(parts));
  for (int p = 0; p < parts; ++p) rd_kafka_topic_partition_list_add(committed.get(), topic.c_str(), p);
  if (auto err = rd_kafka_committed(group, committed.get(), 10000))
    throw kafka::KafkaError("committed offsets of " + topic + ": " + rd_kafka_err2str(err));
  return committed;
}

// One partition's entry, with the span to read: from its low watermark (or
// where the group began it, when that is later) up to `committed`.
PartitionAudit partition_span(rd_kafka_t* group, const std::string& route, const std::string& topic, int p,
                              int64_t committed, const std::map<std::pair<std::string, int32_t>, int64_t>& began) {
  PartitionAudit pa;
  pa.route = route;
  pa.topic = topic;
  pa.partition = p;
  pa.committed = std::max<int64_t>(0, committed);
  kafka::Watermarks marks;
  if (auto err = kafka::query_watermarks(group, topic, p, 10000, marks))
    throw kafka::KafkaError("watermarks of " + topic + "[" + std::to_string(p) + "]: " + rd_kafka_err2str(err));
  pa.low = marks.low;
  if (auto b = began.find({topic, p}); b != began.end()) pa.low = std::max(pa.low, b->second);
  return pa;
}

// The partition's ranges no record of it accounts for: what retention
// deleted first, and what an operator skipped (offset moves).
void note_lost_and_skipped(Connection& db, const config::RouteConfig& route, const std::string& topic, int p,
                           PartitionAudit& pa) {
  // Ranges the host found deleted before it read them (outbox purpose 4).
  for (const auto& range : dlq::lost_ranges(db, route.name, topic, p))
    pa.lost.push_back({range.from, range.to, "noted by host " + range.host + " at " + range.noted_at});
  if (topic == route.topic)
    for (const auto& m : claim::OffsetMoves::skips(db, route.group_id, topic, p))
      pa.operator_skips.push_back({*m.from, m.to,
                                   "skip #" + std::to_string(m.id) + " by " + m.requested_by + ", applied by " +
                                       m.applied_by + " at " + m.applied_at + ": " + m.note});
}

// One record below the committed offset as the host takes it: skipped by
// the route, or the key it claims (nullopt: none could be extracted).
Seen seen_as_the_host_takes_it(const rd_kafka_message_t* msg, const config::RouteConfig& route,
                               pipeline::KeyExtractor& extractor, pipeline::RouteFilter* filter,
                               const format::RecordDecoder* decoder, const std::string& topic) {
  // Decided as the host decides it (from the record alone, decoded as
  // the route's formats say); a retry tier's records were taken already.
  pipeline::RecordView view = pipeline::RecordView::raw(msg);
  format::DecodedRecord decoded;
  if (decoder) {
    decoded = decoder->decode_now(view.msg->payload ? std::optional(view.value) : std::nullopt, view.key);
    if (decoded.value_json) view.value = *decoded.value_json;
    if (decoded.key_text) view.key = *decoded.key_text;
  }
  const auto replayed_for = topic == route.topic ? dlq::headers::replay_target(msg) : std::nullopt;
  const bool filter_decides = filter && !replayed_for && !(decoded.undecodable && filter->condition().needs_json());
  const bool skipped =
      topic == route.topic &&
      (replayed_for ? route.shares_topic_with(*replayed_for)
                    : filter_decides && filter->decide(view).verdict == pipeline::RouteFilter::Verdict::Skip);
  if (skipped) return {msg->offset, std::nullopt, true};
  auto key = extractor.extract(view);
  if (decoded.undecodable) key = pipeline::KeyProblem{dlq::Reason::UndecodableValue, *decoded.undecodable};
  return {msg->offset,
          std::holds_alternative<std::string>(key) ? std::optional(std::get<std::string>(key)) : std::nullopt};
}

// Reads the partitions in `index` (assigned to `reader`) until each is at
// its committed offset or its end, accounting for their records a page at
// a time in the report's entries `index` names.
void read_and_account(rd_kafka_t* reader, Connection& db, const config::RouteConfig& route,
                      pipeline::KeyExtractor& extractor, pipeline::RouteFilter* filter,
                      const format::RecordDecoder* decoder, const std::string& topic, size_t first,
                      std::map<int32_t, size_t>& index, AuditReport& report) {
  std::map<int32_t, std::vector<Seen>> pages;
  auto flush = [&](int32_t p) {
    auto& page = pages[p];
    if (!page.empty()) account(db, route.name, report.partitions[first + static_cast<size_t>(p)], page);
    page.clear();
  };
  while (!index.empty()) {
    rd_kafka_message_t* m = rd_kafka_consumer_poll(reader, 10000);
    if (m == nullptr) throw kafka::KafkaError("audit: no records from " + topic + " for 10s while reading");
    kafka::MessagePtr msg(m);
    if (msg->err && msg->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
      throw kafka::KafkaError(std::string("audit: ") + rd_kafka_message_errstr(msg.get()));
    auto it = index.find(msg->partition);
    if (it == index.end()) continue;
    const PartitionAudit& pa = report.partitions[it->second];
    if (!msg->err && msg->offset < pa.committed) {
      Seen seen = seen_as_the_host_takes_it(msg.get(), route, extractor, filter, decoder, topic);
      pages[msg->partition].push_back(std::move(seen));
      if (pages[msg->partition].size() == kPage) flush(msg->partition);
    }
    // Done with the partition at its committed offset (or its end).
    if (msg->err || msg->offset + 1 >= pa.committed) {
      flush(msg->partition);
      index.erase(it);
    }
  }
}

// Reads every partition of `topic` from its low watermark (or where the
// group began it, when it began at the log's end) up to the group's
// committed offset, all partitions at once, and accounts for each record.
void audit_topic(rd_kafka_t* group, rd_kafka_t* reader, Connection& db, const config::RouteConfig& route,
                 pipeline::KeyExtractor& extractor, pipeline::RouteFilter* filter, const format::RecordDecoder* decoder,
                 const std::string& topic, const std::map<std::pair<std::string, int32_t>, int64_t>& began,
                 AuditReport& report) {
  const int parts = partition_count(group, topic);
  if (parts == 0) return;
  const kafka::PartitionListPtr committed = committed_offsets(group, topic, parts);
  const size_t first = report.partitions.size();
  kafka::PartitionListPtr assign(rd_kafka_topic_partition_list_new(parts));
  std::map<int32_t, size_t> index;  // partition -> report entry still being read
  for (int p = 0; p < parts; ++p) {
    PartitionAudit pa = partition_span(group, route.name, topic, p, committed->elems[p].offset, began);
    if (pa.committed > pa.low) {
      rd_kafka_topic_partition_list_add(assign.get(), topic.c_str(), p)->offset = pa.low;
      index[p] = first + static_cast<size_t>(p);
    }
    note_lost_and_skipped(db, route, topic, p, pa);
    report.partitions.push_back(std::move(pa));
  }
  if (index.empty()) return;
  rd_kafka_assign(reader, assign.get());
  read_and_account(reader, db, route, extractor, filter, decoder, topic, first, index, report);
  rd_kafka_assign(reader, nullptr);
}

}  // namespace

bool AuditReport::ok() const {
  for (const auto& p : partitions)
    if (!p.missing.empty() || !p.lost.empty()) return false;
  return true;
}

void AuditReport::print(std::ostream& os) const {
  int64_t consumed = 0, missing = 0, lost = 0;
  for (const auto& p : partitions) {
    os << p.route << ": " << p.topic << "[" << p.partition << "] offsets " << p.low << ".." << p.committed << ": "
       << p.consumed << " records, " << p.by_claim << " by claim, " << p.by_outbox << " by DLQ outbox";
    if (p.skipped > 0) os << ", " << p.skipped << " skipped (not taken by the route)";
    if (p.by_operator_skip > 0) os << ", " << p.by_operator_skip << " skipped by an operator";
    if (!p.missing.empty()) os << ", " << p.missing.size() << " UNACCOUNTED at offsets " << ranges(p.missing, 20);
    os << "\n";
    for (const auto& s : p.operator_skips)
      os << p.topic << "[" << p.partition << "] offsets " << s.from << ".." << s.to - 1 << ": passed over by "
         << s.noted << "\n";
    for (const auto& l : p.lost) {
      os << p.topic << "[" << p.partition << "] offsets " << l.from << ".." << l.to - 1 << ": " << l.to - l.from
         << " record(s) LOST: deleted by retention before the group read them (" << l.noted << ")\n";
      lost += l.to - l.from;
    }
    consumed += p.consumed;
    missing += static_cast<int64_t>(p.missing.size());
  }
  os << (missing == 0 && lost == 0 ? "audit ok: " : "audit FAILED: ") << consumed << " committed records, " << missing
     << " unaccounted";
  if (lost > 0) os << ", " << lost << " lost to retention before they were read";
  os << "\n";
}

AuditReport audit(const config::Config& cfg) {
  AuditReport report;
  auto reader = consumer_handle(cfg, cfg.kafka.group_id + ".audit");  // assigns partitions, never commits
  Connection db(cfg.database);
  struct Group {
    kafka::HandlePtr handle;  // reads the group's commits, never joins
    std::map<std::pair<std::string, int32_t>, int64_t> began;
  };
  std::map<std::string, Group> groups;  // each route's
  format::Registries registries;        // for routes whose records are in a registry's format
  for (const auto& route : cfg.routes) {
    auto& group = groups[route.group_id];
    if (!group.handle) {
      group.handle = consumer_handle(cfg, route.group_id);
      group.began = claim::OffsetStore(route.group_id, cfg.host.id).first_offsets(db);
    }
    pipeline::KeyExtractor extractor(route);
    std::optional<pipeline::RouteFilter> filter;
    if (route.when) filter.emplace(*route.when);
    std::optional<format::RecordDecoder> decoder;
    if (format::RecordDecoder::needed(route)) decoder.emplace(route, registries.for_route(route));
    for (const auto& topic : route.topics())
      audit_topic(group.handle.get(), reader.get(), db, route, extractor, filter ? &*filter : nullptr,
                  decoder ? &*decoder : nullptr, topic, group.began, report);
  }
  return report;
}

}  // namespace idemsink::offline
