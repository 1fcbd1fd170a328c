// The consumer's side of a rebalance: partitions assigned (with the
// group's committed offsets read for them) or revoked and lost, handed to
// the listener on the poll thread, and the revocation before a close.
#include <cstring>

#include "core/common/fault.h"
#include "core/common/log.h"
#include "core/kafka/consumer.h"
#include "core/kafka/librdkafka_fixes.h"

namespace idemsink::kafka {
namespace {

// Reading the committed offsets at assignment: each try, and in all. Inside
// the rebalance callback, so well below max.poll.interval.ms.
constexpr int kCommittedReadTimeoutMs = 5000;
constexpr auto kCommittedReadFor = std::chrono::seconds(30);
// The committed offset could not be read (read_committed()).
constexpr int64_t kStartUnknown = -9999;  // no librdkafka logical offset

}  // namespace

void Consumer::revoke_before_close() {
  // The assignment is given back while the group still runs, by
  // unsubscribing and polling: rebalance_cb revokes it here (drain, commit,
  // unassign), and the close that follows has nothing left to revoke. A
  // revoke served inside rd_kafka_consumer_close() can wait for ever in
  // librdkafka 2.0: when the group terminates meanwhile (this member dropped
  // by a rebalance while it drained), the unassign the callback sends is
  // purged unanswered, and the host never exits (seen as a SIGTERM'd host
  // hanging, torture seed 8). Records still arriving belong to partitions
  // being revoked: dropped, their offsets were never committed.
  if (assigned_count() <= 0) return;
  if (auto err = rd_kafka_unsubscribe(rk_.get())) {
    spdlog::warn("kafka: unsubscribe before close failed ({}); the close revokes", rd_kafka_err2str(err));
    return;
  }
  while (std::chrono::steady_clock::now() < close_deadline_) {
    if (rd_kafka_message_t* m = rd_kafka_consume_queue(queue_, 100)) rd_kafka_message_destroy(m);
    if (assigned_count() == 0) return;
  }
  spdlog::warn("kafka: partitions still assigned at the shutdown deadline; the close revokes them");
}

void Consumer::rebalance_cb(rd_kafka_t* rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* parts,
                            void* opaque) {
  auto* self = static_cast<Consumer*>(opaque);
  const char* protocol = fault::once("rebalance_protocol_unreported") ? nullptr : rd_kafka_rebalance_protocol(rk);
  const bool cooperative = cooperative_rebalance(protocol, self->configured_cooperative_);
  const auto tps = from_list(parts);
  self->flush();  // records polled before the rebalance reach the listener before it
  if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS)
    self->assign(rk, parts, tps, cooperative);
  else
    self->revoke(rk, err, parts, tps, cooperative);
}

void Consumer::assign(rd_kafka_t* rk, rd_kafka_topic_partition_list_t* parts, const std::vector<TopicPartition>& tps,
                      bool cooperative) {
  spdlog::info("kafka: assigned {}{}", describe(tps), cooperative ? " (incremental)" : "");
  if (fault::once("fetch_command_overtakes_start")) holding_fetch_start_.store(true);
  // The group's committed offsets: where each partition's records must
  // start, and its lag until the first record arrives.
  std::vector<TopicPartitionOffset> committed = read_committed(tps);
  // A partition the group never committed starts where auto.offset.reset
  // puts it, found by librdkafka: its first record sets the start. (Asking
  // the broker here would block the rebalance on a partition whose leader
  // just died.)
  for (auto& c : committed) {
    Stream s;
    if (c.offset >= 0) s.next = c.offset;
    streams_[c.tp] = s;
    paused_.erase(c.tp);
  }
  // Fetching starts exactly where the pipeline expects it; a partition
  // whose start is unknown is left to librdkafka (which reads the commit
  // itself), and its first record sets the start.
  for (int i = 0; i < parts->cnt; ++i)
    for (const auto& c : committed)
      if (c.tp.topic == parts->elems[i].topic && c.tp.partition == parts->elems[i].partition)
        parts->elems[i].offset = c.offset >= 0 ? c.offset : RD_KAFKA_OFFSET_INVALID;
  for (auto& c : committed)
    if (c.offset < 0) c.offset = RD_KAFKA_OFFSET_INVALID;
  listener_.on_assigned(committed);
  if (cooperative) {
    if (rd_kafka_error_t* e = rd_kafka_incremental_assign(rk, parts)) {
      spdlog::error("kafka incremental assign failed: {}", rd_kafka_error_string(e));
      rd_kafka_error_destroy(e);
    }
  } else if (auto e = rd_kafka_assign(rk, parts)) {
    spdlog::error("kafka assign failed: {}", rd_kafka_err2str(e));
  }
  if (stop_.load()) {
    // Assigned while shutting down (see must_wait_first_assignment_):
    // take nothing new; the close right after revokes them again. (Not
    // through set_fetching: this pause may cancel a fetcher start, which
    // is what is wanted here, and stopping an unstarted fetcher is fine.)
    rd_kafka_pause_partitions(rk, parts);
    for (const auto& tp : tps) paused_.insert(tp);
  }
  first_rebalance_seen_.store(true);
}

void Consumer::revoke(rd_kafka_t* rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* parts,
                      const std::vector<TopicPartition>& tps, bool cooperative) {
  const bool lost = err != RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS || rd_kafka_assignment_lost(rk);
  spdlog::info("kafka: {} {}", lost ? "lost" : "revoking", describe(tps));
  // Test fault: a fetch command (the engine pausing a partition) reaches a
  // consumer that is closing.
  if (stop_.load() && fault::once("command_while_closing")) {
    spdlog::warn("kafka: fault command_while_closing: pausing {} as the consumer closes", describe(tps));
    pause(tps);
  }
  auto offsets = listener_.on_revoking(tps, lost);
  for (const auto& tp : tps) {
    streams_.erase(tp);
    paused_.erase(tp);
  }
  if (!lost && !offsets.empty()) commit_sync(offsets);
  if (cooperative) {
    if (rd_kafka_error_t* e = rd_kafka_incremental_unassign(rk, parts)) {
      spdlog::error("kafka incremental unassign failed: {}", rd_kafka_error_string(e));
      rd_kafka_error_destroy(e);
    }
  } else {
    rd_kafka_assign(rk, nullptr);
  }
}

bool cooperative_rebalance(const char* reported_protocol, bool configured_cooperative) {
  if (reported_protocol == nullptr) return configured_cooperative;
  if (std::strcmp(reported_protocol, "COOPERATIVE") == 0) return true;
  if (std::strcmp(reported_protocol, "EAGER") == 0) return false;
  return configured_cooperative;  // "NONE": not in a group at this moment
}

std::vector<TopicPartitionOffset> Consumer::read_committed(const std::vector<TopicPartition>& tps) {
  // A partition whose committed offset is not known must not be started on a
  // guess: taken for "no commit", auto.offset.reset would skip what was
  // produced since the last commit (latest) or re-read the whole log
  // (earliest). The read is retried (the coordinator may be loading, as
  // during a broker failover) for up to kCommittedReadFor; a partition still
  // unknown then is marked kStartUnknown.
  std::vector<TopicPartitionOffset> out;
  for (const auto& tp : tps) out.push_back({tp, kStartUnknown});
  if (tps.empty()) return out;
  const auto give_up_at = std::chrono::steady_clock::now() + kCommittedReadFor;
  std::string last_error;
  for (int attempt = 1;; ++attempt) {
    auto list = to_list(tps);
    const rd_kafka_resp_err_t e = rd_kafka_committed(rk_.get(), list.get(), kCommittedReadTimeoutMs);
    bool all_known = !e;
    if (!e) {
      for (int i = 0; i < list->cnt; ++i) {
        if (list->elems[i].err) {
          all_known = false;
          last_error = rd_kafka_err2str(list->elems[i].err);
          continue;
        }
        for (auto& o : out)
          if (o.tp.topic == list->elems[i].topic && o.tp.partition == list->elems[i].partition)
            o.offset = list->elems[i].offset;  // RD_KAFKA_OFFSET_INVALID: the group never committed it
      }
    } else {
      last_error = rd_kafka_err2str(e);
    }
    if (all_known) {
      if (attempt > 1)
        spdlog::info("kafka: the committed offsets of {} read after {} attempts", describe(tps), attempt);
      return out;
    }
    if (std::chrono::steady_clock::now() >= give_up_at || stop_.load()) break;
    spdlog::warn("kafka: reading the committed offsets of {} failed ({}); retrying (attempt {})", describe(tps),
                 last_error, attempt);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(200 * attempt, 2000)));
  }
  std::vector<TopicPartition> unknown;
  for (const auto& o : out)
    if (o.offset == kStartUnknown) unknown.push_back(o.tp);
  spdlog::error(
      "kafka: the committed offsets of {} could not be read for {}s ({}); librdkafka reads them itself and "
      "their first records set the start",
      describe(unknown), std::chrono::duration_cast<std::chrono::seconds>(kCommittedReadFor).count(), last_error);
  return out;
}

}  // namespace idemsink::kafka
