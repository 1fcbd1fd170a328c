// The consumer's partitions as streams of records: what the poll thread
// admits of each, the holes and stalls it reports, and the fetch commands
// (pause, resume, seek) the engine sends, applied on the poll thread. The
// group side is in consumer.cc (commits, offsets) and consumer_rebalance.cc
// (assignment).
#include <cstring>

#include "core/common/fault.h"
#include "core/common/log.h"
#include "core/kafka/consumer.h"
#include "core/kafka/watermarks.h"
#include "core/kafka/librdkafka_fixes.h"

namespace idemsink::kafka {
namespace {

constexpr auto kStreamCheckEvery = std::chrono::milliseconds(200);
constexpr int kSeekTimeoutMs = 10000;

}  // namespace

bool Consumer::admit(rd_kafka_message_t* m) {
  if (m->err) return true;  // the listener logs consume errors
  const TopicPartition tp{rd_kafka_topic_name(m->rkt), m->partition};
  auto it = streams_.find(tp);
  if (it == streams_.end()) return true;  // not (or no longer) assigned: the listener drops it
  Stream& s = it->second;
  note_fetcher_started(tp, s);
  // Until a seek we asked for has happened, the stream is not the one we want.
  if (s.pending_seek || s.dropping) return false;
  if (fault::once("drop_fetch")) {
    spdlog::warn("fault drop_fetch: records of {}[{}] from offset {} vanish until the partition is sought", tp.topic,
                 tp.partition, m->offset);
    s.dropping = true;
    return false;
  }
  const int64_t offset = m->offset;
  if (s.rereading_from) {
    // The first record of the re-read settles the gap.
    const int64_t from = *s.rereading_from;
    s.rereading_from.reset();
    if (offset > from) {
      flush();
      report_hole(tp, from, offset);
    } else if (offset == from && s.gap_end > from) {
      spdlog::warn("kafka: {}[{}]: the first read jumped from offset {} to {}; the re-read delivered them", tp.topic,
                   tp.partition, from, s.gap_end);
      flush();
      listener_.on_gap({tp, from, s.gap_end, false});
    }
  } else if (s.next && offset > *s.next) {
    // A jump: re-read from the expected offset before believing it.
    s.gap_end = offset;
    s.rereading_from = *s.next;
    seek_stream(tp, s, *s.next);
    return false;
  }
  if (!s.next || offset >= *s.next) s.next = offset + 1;
  s.last_progress = std::chrono::steady_clock::now();
  return true;
}

void Consumer::report_hole(const TopicPartition& tp, int64_t from, int64_t to) {
  // Offsets below the partition's log start were deleted by retention,
  // whatever they held. The log start comes with every fetch response: the
  // one that delivered the record after the hole is recent enough. On a
  // topic that only compacts, a record below the log start was superseded
  // by a later one of its key: an ordinary hole.
  int64_t low = -1, high = -1;
  if (rd_kafka_get_watermark_offsets(rk_.get(), tp.topic.c_str(), tp.partition, &low, &high) !=
          RD_KAFKA_RESP_ERR_NO_ERROR ||
      (low > from && !deletes_by_retention(tp.topic)))
    low = -1;
  listener_.on_gap({tp, from, to, true, low});
}

bool Consumer::deletes_by_retention(const std::string& topic) {
  if (auto it = cleanup_deletes_.find(topic); it != cleanup_deletes_.end()) return it->second;
  // The topic's cleanup.policy, asked once (rare: only for a hole below the
  // log start). Unknown counts as "delete": a loss is reported, never hidden.
  bool deletes = true;
  rd_kafka_ConfigResource_t* res = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, topic.c_str());
  rd_kafka_queue_t* q = rd_kafka_queue_new(rk_.get());
  rd_kafka_DescribeConfigs(rk_.get(), &res, 1, nullptr, q);
  if (rd_kafka_event_t* ev = rd_kafka_queue_poll(q, 5000)) {
    if (const rd_kafka_DescribeConfigs_result_t* result = rd_kafka_event_DescribeConfigs_result(ev);
        result && !rd_kafka_event_error(ev)) {
      size_t n = 0;
      const rd_kafka_ConfigResource_t** resources = rd_kafka_DescribeConfigs_result_resources(result, &n);
      for (size_t i = 0; i < n; ++i) {
        size_t m = 0;
        const rd_kafka_ConfigEntry_t** entries = rd_kafka_ConfigResource_configs(resources[i], &m);
        for (size_t j = 0; j < m; ++j)
          if (std::strcmp(rd_kafka_ConfigEntry_name(entries[j]), "cleanup.policy") == 0 &&
              rd_kafka_ConfigEntry_value(entries[j]) != nullptr) {
            deletes = std::strstr(rd_kafka_ConfigEntry_value(entries[j]), "delete") != nullptr;
            cleanup_deletes_[topic] = deletes;
          }
      }
    }
    rd_kafka_event_destroy(ev);
  }
  rd_kafka_queue_destroy(q);
  rd_kafka_ConfigResource_destroy(res);
  return deletes;
}

void Consumer::seek_stream(const TopicPartition& tp, Stream& s, int64_t offset) {
  s.dropping = false;
  s.last_progress = std::chrono::steady_clock::now();
  if (seek_now(tp, offset)) {
    s.pending_seek.reset();
    note_fetcher_started(tp, s);
  } else {
    s.pending_seek = offset;  // retried by check_streams(); records are refused meanwhile
  }
}

void Consumer::check_streams() {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_stream_check_ || streams_.empty()) return;
  next_stream_check_ = now + kStreamCheckEvery;
  std::vector<TopicPartition> tps;
  for (auto& [tp, s] : streams_) {
    if (s.pending_seek) seek_stream(tp, s, *s.pending_seek);
    if (s.next && !s.pending_seek) tps.push_back(tp);
  }
  if (!tps.empty()) {
    auto list = to_list(tps);
    if (rd_kafka_position(rk_.get(), list.get()) == RD_KAFKA_RESP_ERR_NO_ERROR) {
      // The position moves with every record returned to us and with every
      // transaction marker the library consumed silently. Beyond the next
      // expected offset without a record means offsets we never saw.
      for (int i = 0; i < list->cnt; ++i) {
        const int64_t pos = list->elems[i].offset;
        if (pos < 0) continue;  // unknown, e.g. right after a seek
        const TopicPartition tp{list->elems[i].topic, list->elems[i].partition};
        Stream& s = streams_[tp];
        if (s.dropping) continue;
        if (s.rereading_from) {
          if (pos > *s.rereading_from) {
            const int64_t from = *s.rereading_from;
            s.rereading_from.reset();
            s.next = pos;
            s.last_progress = now;
            report_hole(tp, from, pos);
          }
        } else if (pos > *s.next) {
          s.gap_end = pos;
          s.rereading_from = *s.next;
          seek_stream(tp, s, *s.next);
        }
      }
    }
  }
  check_stalls(now);
  ask_unknown_watermarks(now);
}

void Consumer::check_stalls(std::chrono::steady_clock::time_point now) {
  // A partition that should be fetching and is behind, yet receives
  // nothing: the fetch was lost. Asked of the broker (the last stable
  // offset under read_committed: an open transaction is no stall), then
  // read again from where the partition stands. One sought to its beginning
  // that has not had its first record owes everything from its log start.
  // (A partition holding nothing but transaction markers looks the same: it
  // is sought again, and reported stalled, each stall_timeout; nothing is
  // lost or read twice.)
  for (auto& [tp, s] : streams_) {
    if (paused_.count(tp) || now - s.last_progress < cfg_.stall_timeout) continue;
    if (!s.next && !s.from_beginning) continue;  // sought to the end: nothing is owed yet
    s.last_progress = now;
    kafka::Watermarks marks;  // a query that keeps its deadline: the leader may be the broker that is down
    if (query_watermarks(rk_.get(), tp.topic, tp.partition, 2000, marks) != RD_KAFKA_RESP_ERR_NO_ERROR) continue;
    const int64_t low = marks.low, high = marks.high;
    const int64_t from = s.next ? *s.next : low;
    if (high <= from) continue;
    spdlog::error(
        "kafka: {}[{}] is stalled: {} record(s) between offset {} and the end of the partition ({}), none "
        "received for {}ms although fetching is on; reading it again from {}",
        tp.topic, tp.partition, high - from, from, high, cfg_.stall_timeout.count(),
        s.next ? std::to_string(from) : "its beginning");
    listener_.on_stall(tp, from, high);
    s.rereading_from.reset();
    seek_stream(tp, s, s.next ? from : RD_KAFKA_OFFSET_BEGINNING);
  }
}

void Consumer::wake() {
  std::lock_guard lk(commands_mu_);
  if (!closing_) rd_kafka_queue_yield(queue_);
}

void Consumer::on_poll_thread(std::function<void(rd_kafka_t*)> job) {
  enqueue(Command{Command::Kind::Run, {}, 0, std::move(job)});
}

void Consumer::enqueue(Command c) {
  {
    std::lock_guard lk(commands_mu_);
    commands_.push_back(std::move(c));
  }
  wake();
}

void Consumer::apply_commands() {
  std::vector<Command> cmds;
  {
    std::lock_guard lk(commands_mu_);
    cmds.swap(commands_);
  }
  for (auto& c : cmds) {
    switch (c.kind) {
      case Command::Kind::Pause: set_fetching(c.tps, false); break;
      case Command::Kind::Resume: set_fetching(c.tps, true); break;
      case Command::Kind::Seek: {
        ++seeks_applied_;
        const TopicPartition& tp = c.tps.front();
        auto it = streams_.find(tp);
        if (it == streams_.end()) break;  // revoked meanwhile
        // A logical offset (the beginning, the end): the first record sets where it stands.
        Stream sought = c.offset >= 0 ? Stream{c.offset} : Stream{};
        sought.from_beginning = c.offset == RD_KAFKA_OFFSET_BEGINNING;
        sought.fetcher_started = it->second.fetcher_started;
        sought.deferred_fetching = it->second.deferred_fetching;
        it->second = sought;
        seek_stream(tp, it->second, c.offset);
        break;
      }
      case Command::Kind::Run: c.job(rk_.get()); break;
    }
  }
}

void Consumer::set_fetching(const std::vector<TopicPartition>& tps, bool fetching) {
  // librdkafka starts a newly assigned partition's fetcher by taking a new
  // version of the partition, then queueing the start. A pause or resume
  // queued in between raises the version again whether or not it changes
  // anything, and the start, now outdated, is dropped: the partition is
  // never read (docs/librdkafka.md). A seek cannot do this (refused before
  // the start, it leaves the version alone). So until a partition shows its
  // fetcher started (a seek succeeded, or a record came), what it should do
  // is kept here and told to librdkafka then (note_fetcher_started).
  std::vector<TopicPartition> now;
  for (const auto& tp : tps) {
    if (fetching)
      paused_.erase(tp);
    else
      paused_.insert(tp);
    auto it = streams_.find(tp);
    if (it != streams_.end() && !it->second.fetcher_started)
      it->second.deferred_fetching = fetching;
    else
      now.push_back(tp);
  }
  if (now.empty()) return;
  auto list = to_list(now);
  in_fetch_call_.store(true);
  // Both wait until librdkafka's main thread has carried them out.
  if (fetching)
    rd_kafka_resume_partitions(rk_.get(), list.get());
  else
    rd_kafka_pause_partitions(rk_.get(), list.get());
  in_fetch_call_.store(false);
  if (!fetching) return;
  // A resumed partition waits for the fetcher's next wake-up (up to a
  // second in librdkafka 2.0); a seek to where it stands wakes it now.
  rd_kafka_position(rk_.get(), list.get());
  for (int i = 0; i < list->cnt; ++i) {
    auto it = streams_.find({list->elems[i].topic, list->elems[i].partition});
    if (it == streams_.end()) continue;
    it->second.last_progress = std::chrono::steady_clock::now();
    const Stream& s = it->second;
    if (list->elems[i].offset >= 0 && s.next && !s.rereading_from && !s.pending_seek) seek_now(it->first, *s.next);
  }
}

void Consumer::note_fetcher_started(const TopicPartition& tp, Stream& s) {
  if (s.fetcher_started) return;
  s.fetcher_started = true;
  if (!s.deferred_fetching) return;
  const bool fetching = *s.deferred_fetching;
  s.deferred_fetching.reset();
  set_fetching({tp}, fetching);
}

bool Consumer::seek_now(const TopicPartition& tp, int64_t offset) {
  auto list = to_list(std::vector<TopicPartitionOffset>{{tp, offset}});
  // Synchronous, so nothing polled afterwards predates it and the position
  // read afterwards is the new one. See kSeekTimeoutFixed: older versions
  // read the timeout in microseconds.
  const int timeout = rd_kafka_version() < kSeekTimeoutFixed ? kSeekTimeoutMs * 1000 : kSeekTimeoutMs;
  std::string problem;
  rd_kafka_error_t* e = nullptr;
  if (fault::once("seek_fails")) {
    problem = "Local: Erroneous state (fault seek_fails)";
  } else if (holding_fetch_start_.load()) {
    // Test fault fetch_command_overtakes_start: librdkafka's main thread
    // will be held, and a seek waits for it.
    problem = "Local: Timed out (fault fetch_command_overtakes_start)";
  } else {
    e = rd_kafka_seek_partitions(rk_.get(), list.get(), timeout);
  }
  if (e) {
    problem = rd_kafka_error_string(e);
    rd_kafka_error_destroy(e);
  } else if (problem.empty() && list->elems[0].err) {
    problem = rd_kafka_err2str(list->elems[0].err);
  }
  if (problem.empty()) return true;
  spdlog::warn("kafka: seek {}[{}] to {} failed: {}; its records are held back until a seek succeeds", tp.topic,
               tp.partition, offset, problem);
  return false;
}

void Consumer::pause(const std::vector<TopicPartition>& tps) {
  if (!tps.empty()) enqueue({Command::Kind::Pause, tps});
}

void Consumer::resume(const std::vector<TopicPartition>& tps) {
  if (!tps.empty()) enqueue({Command::Kind::Resume, tps});
}

uint64_t Consumer::seek(const TopicPartitionOffset& tpo) {
  uint64_t ticket = 0;
  {
    std::lock_guard lk(commands_mu_);
    commands_.push_back({Command::Kind::Seek, {tpo.tp}, tpo.offset});
    ticket = ++seeks_requested_;
  }
  wake();
  return ticket;
}

}  // namespace idemsink::kafka
