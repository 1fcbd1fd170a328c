// Partitions assigned: where each starts (the offset stored with the
// claims, Kafka's committed one, or the end for a route that begins at the
// latest record), and the stored offsets read again after a failover.
#include <algorithm>

#include "core/common/log.h"
#include "core/kafka/watermarks.h"
#include "core/pipeline/partitions.h"

namespace idemsink::pipeline {

namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {

std::vector<std::pair<std::string, int32_t>> keys_of(const std::vector<std::shared_ptr<Partition>>& parts) {
  std::vector<std::pair<std::string, int32_t>> keys;
  keys.reserve(parts.size());
  for (const auto& p : parts) keys.emplace_back(p->tp.topic, p->tp.partition);
  return keys;
}

}  // namespace

void Partitions::assigned(const std::vector<kafka::TopicPartitionOffset>& starts) {
  rebalance_reached();
  std::vector<kafka::TopicPartition> tps;
  std::vector<std::shared_ptr<Partition>> parts;
  for (const auto& [tp, offset] : starts) {
    auto p = std::make_shared<Partition>();
    p->tp = tp;
    p->owner = this;
    p->metrics = &metrics_.partition(route_of_topic_.at(tp.topic).route, tp.topic, tp.partition);
    p->metrics->assigned.store(true);
    p->metrics->lag.store(metrics::kUnknown);  // until its ends are known (update_gauges)
    p->metrics->committed.store(offset);
    p->metrics->stalled.store(0);
    p->kafka_start = offset >= 0 ? offset : -1;
    parts_[tp] = p;
    tps.push_back(tp);
    parts.push_back(p);
  }
  gate_.assigned(tps);
  for (const auto& tp : tps) gate_.hold(tp, FetchGate::Hold::Start);
  update_gauges();
  if (parts.empty()) return;
  pool_.submit("read the stored offsets", [this, parts = std::move(parts)](db::Connection& c) {
    auto stored = offsets_.read(c, keys_of(parts));
    uint64_t none = 0;
    server_id_.compare_exchange_strong(none, c.server_id());
    asio::post(io_, [this, parts, stored = std::move(stored)] { started(parts, stored); });
  });
}

void Partitions::started(const std::vector<std::shared_ptr<Partition>>& parts,
                         const std::map<std::pair<std::string, int32_t>, int64_t>& stored) {
  for (const auto& p : parts) {
    auto it = parts_.find(p->tp);
    if (p->revoked || it == parts_.end() || it->second != p) continue;  // gone, or assigned again meanwhile
    const auto db = stored.find({p->tp.topic, p->tp.partition});
    int64_t start = p->kafka_start;
    if (db != stored.end() && (start < 0 || db->second < start)) {
      if (start >= 0) {
        // The database lost outcomes Kafka's commit counted on: read them again.
        p->lost_window_end = start;
        p->metrics->offsets_rewound.fetch_add(static_cast<uint64_t>(start - db->second), std::memory_order_relaxed);
        spdlog::warn(
            "kafka: {}[{}]: the database's offset {} is behind the group's committed {}: it lost the outcomes of "
            "{} record(s) (a failover to a replica that lacked the last commits?); reading them again from {}",
            p->tp.topic, p->tp.partition, db->second, start, start - db->second, db->second);
      }
      start = db->second;
    }
    if (start < 0 && begins_at_end(p->tp.topic)) {
      begin_latest(p);
      continue;
    }
    start_taking(*p, start);
  }
  update_gauges();
}

bool Partitions::begins_at_end(const std::string& topic) const { return latest_topics_.count(topic) > 0; }

bool Partitions::current(const std::shared_ptr<Partition>& p) const {
  auto it = parts_.find(p->tp);
  return !p->revoked && it != parts_.end() && it->second == p;
}

void Partitions::start_taking(Partition& p, int64_t start) {
  if (start >= 0) {
    // Records must start here; until one arrives this is also the
    // partition's commit point, and its lag is measured from it.
    p.tracker.start_at(start);
    // What Kafka holds (-1: nothing). When the database is ahead (a commit
    // it stored was then refused by a rebalance), the first commit round
    // brings Kafka up to it; when behind, Kafka is never moved back.
    p.kafka.reset(p.kafka_start);
  }
  p.starting = false;
  // What was fetched while the start was read was dropped: fetched again.
  rewind(p, start >= 0 ? start : RD_KAFKA_OFFSET_BEGINNING);
  gate_.release(p.tp, FetchGate::Hold::Start);
}

// Kafka's "latest" is the log's end when a consumer asks. Taken as it is, a
// host that began a partition there, took records and died before its first
// commit would leave the next owner to begin at a later end (what arrived
// between would be nobody's); and a partition added to the topic months
// later, never committed, would begin at its end too, passing over what was
// produced to it before the group's first rebalance saw it. So "latest"
// means the moment the group began the topic: each partition begins at its
// first record stamped then or later, an offset stored before a record is
// taken (a takeover begins there too, and the audit starts there).
void Partitions::begin_latest(const std::shared_ptr<Partition>& p) {
  pool_.submit(
      "read when the group began the topic",
      [this, p](db::Connection& c) {
        const auto began = offsets_.topic_began(c, p->tp.topic);
        asio::post(io_, [this, p, began] {
          if (!current(p)) return;
          begin_latest_at(p, began.value_or(wall_clock_ms()), !began.has_value());
        });
      },
      [this, p](const db::DbError& e) {
        spdlog::warn("kafka: {}[{}]: reading when the group began the topic failed ({}); the partition waits",
                     p->tp.topic, p->tp.partition, e.what());
        asio::post(io_, [this, p] { begin_latest_later(p); });
      });
}

void Partitions::begin_latest_at(const std::shared_ptr<Partition>& p, int64_t began_ms, bool first) {
  // The offset is asked of the cluster on the poll thread (the engine thread
  // never waits for it), then stored, then the partition starts.
  consumer_->on_poll_thread([this, p, began_ms, first](rd_kafka_t* rk) {
    int64_t offset = -1;
    const auto err = kafka::offset_at_time(rk, p->tp.topic, p->tp.partition, began_ms, 5000, offset);
    asio::post(io_, [this, p, began_ms, first, err, offset] {
      if (!current(p)) return;
      if (err) {
        spdlog::warn("kafka: {}[{}]: where the group begins the partition could not be asked ({}); it waits",
                     p->tp.topic, p->tp.partition, rd_kafka_err2str(err));
        begin_latest_later(p);
        return;
      }
      pool_.submit(
          "store where the group begins a partition",
          [this, p, began_ms, first, offset](db::Connection& c) {
            int64_t from = offset;
            if (!offsets_.begin_at(c, p->tp.topic, p->tp.partition, offset, began_ms)) {
              const std::pair<std::string, int32_t> key{p->tp.topic, p->tp.partition};
              const auto stored = offsets_.read(c, std::span(&key, 1));
              if (auto it = stored.find(key); it != stored.end()) from = it->second;
            }
            asio::post(io_, [this, p, first, offset, from] {
              if (!current(p)) return;
              spdlog::info("kafka: {}[{}]: nobody committed the partition; the group begins it at {} ({})", p->tp.topic,
                           p->tp.partition, from,
                           from != offset ? "stored by another member"
                           : first        ? "the log's end: the group begins the topic now"
                                          : "the first record since the group began the topic");
              start_taking(*p, from);
              update_gauges();
            });
          },
          [this, p](const db::DbError& e) {
            spdlog::warn("kafka: {}[{}]: storing where the group begins the partition failed ({}); it waits",
                         p->tp.topic, p->tp.partition, e.what());
            asio::post(io_, [this, p] { begin_latest_later(p); });
          });
    });
  });
}

void Partitions::begin_latest_later(const std::shared_ptr<Partition>& p) {
  auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::seconds(1));
  timer->async_wait([this, p, timer](boost::system::error_code ec) {
    if (!ec && current(p)) begin_latest(p);
  });
}

void Partitions::recheck_stored() {
  if (rechecking_) return;
  std::vector<std::shared_ptr<Partition>> parts;
  for (const auto& [tp, p] : parts_)
    if (!p->revoked && !p->starting) parts.push_back(p);
  if (parts.empty()) return;
  rechecking_ = true;
  pool_.submit("re-read the stored offsets", [this, parts = std::move(parts)](db::Connection& c) {
    auto stored = offsets_.read(c, keys_of(parts));
    server_id_.store(c.server_id());  // the server the offsets are stored on from now on
    asio::post(io_, [this, parts, stored = std::move(stored)] {
      rechecking_ = false;
      for (const auto& p : parts) {
        auto it = parts_.find(p->tp);
        if (p->revoked || it == parts_.end() || it->second != p) continue;
        const auto db = stored.find({p->tp.topic, p->tp.partition});
        // Against everything this host has read, not only what Kafka
        // confirmed: outcomes made durable after the last stored offset (a
        // ledger credit, a letter) may be missing on the new server too, and
        // the commit point would otherwise pass them.
        const auto read_to = p->tracker.next_expected();
        if (!read_to) continue;
        const int64_t read_end = *read_to;
        // No row at all: the new server lacks even the first store of this
        // partition (a deployment younger than the replica's lag). What this
        // host took since its assignment is read again; outcomes of records
        // before that, by earlier owners, cannot be told lost from here.
        const int64_t from = db != stored.end() ? db->second : p->first_consumed;
        if (from < 0 || from >= read_end) continue;
        if (db == stored.end())
          spdlog::warn(
              "kafka: {}[{}]: after the failover the database has no stored offset for the partition; "
              "reading again from {}, the first record this host took of it",
              p->tp.topic, p->tp.partition, from);
        // Everything this host has read may have had a claim (and a call
        // mark) there: at-most-once records up to it are looked up first.
        p->lost_window_end = read_end;
        // Counted as lost: what Kafka had confirmed on the strength of
        // outcomes the new server lacks. The rest is re-read to be sure.
        const int64_t lost = p->kafka.acked > from ? p->kafka.acked - from : 0;
        p->metrics->offsets_rewound.fetch_add(static_cast<uint64_t>(lost), std::memory_order_relaxed);
        if (lost > 0)
          spdlog::warn(
              "kafka: {}[{}]: after the failover the database's offset is {}, behind the {} committed: it lost the "
              "outcomes of {} record(s); reading them again from {}",
              p->tp.topic, p->tp.partition, from, p->kafka.acked, lost, from);
        else
          spdlog::info(
              "kafka: {}[{}]: after the failover reading again from the database's offset {} the {} record(s) this "
              "host read since (their outcomes may be missing on the new server)",
              p->tp.topic, p->tp.partition, from, read_end - from);
        read_on_from(*p, from, from);
      }
    });
  });
}

}  // namespace idemsink::pipeline
