#include "core/kafka/watermarks.h"

#include <chrono>

namespace idemsink::kafka {
namespace {

// One end: ListOffsets with the "timestamp" RD_KAFKA_OFFSET_BEGINNING or
// RD_KAFKA_OFFSET_END, which the broker answers with the log's start or end.
rd_kafka_resp_err_t query_end(rd_kafka_t* rk, const std::string& topic, int32_t partition, int64_t which,
                              int timeout_ms, int64_t& offset) {
  rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(list, topic.c_str(), partition)->offset = which;
  rd_kafka_resp_err_t err = rd_kafka_offsets_for_times(rk, list, timeout_ms);
  if (!err) err = list->elems[0].err;
  if (!err) offset = list->elems[0].offset;
  rd_kafka_topic_partition_list_destroy(list);
  return err;
}

}  // namespace

rd_kafka_resp_err_t query_watermarks(rd_kafka_t* rk, const std::string& topic, int32_t partition, int timeout_ms,
                                     Watermarks& out) {
  const auto start = std::chrono::steady_clock::now();
  if (auto err = query_end(rk, topic, partition, RD_KAFKA_OFFSET_END, timeout_ms, out.high)) return err;
  const auto spent =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
  const int left = timeout_ms - static_cast<int>(spent);
  if (left <= 0) return RD_KAFKA_RESP_ERR__TIMED_OUT;
  return query_end(rk, topic, partition, RD_KAFKA_OFFSET_BEGINNING, left, out.low);
}

rd_kafka_resp_err_t offset_at_time(rd_kafka_t* rk, const std::string& topic, int32_t partition, int64_t time_ms,
                                   int timeout_ms, int64_t& offset) {
  const auto start = std::chrono::steady_clock::now();
  if (auto err = query_end(rk, topic, partition, time_ms, timeout_ms, offset)) return err;
  if (offset >= 0) return RD_KAFKA_RESP_ERR_NO_ERROR;
  // No record stamped so late: the log's end, as an offset.
  const auto spent =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
  const int left = timeout_ms - static_cast<int>(spent);
  if (left <= 0) return RD_KAFKA_RESP_ERR__TIMED_OUT;
  return query_end(rk, topic, partition, RD_KAFKA_OFFSET_END, left, offset);
}

std::map<std::pair<std::string, int32_t>, Watermarks> query_watermarks(
    rd_kafka_t* rk, const std::vector<std::pair<std::string, int32_t>>& partitions, int timeout_ms) {
  std::map<std::pair<std::string, int32_t>, Watermarks> out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  // One request per end for every partition: ends[0] the log's end, ends[1] its start.
  std::map<std::pair<std::string, int32_t>, std::pair<int64_t, int64_t>> ends;
  for (const int64_t which : {RD_KAFKA_OFFSET_END, RD_KAFKA_OFFSET_BEGINNING}) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return out;
    rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(static_cast<int>(partitions.size()));
    for (const auto& [topic, partition] : partitions)
      rd_kafka_topic_partition_list_add(list, topic.c_str(), partition)->offset = which;
    // A leader that did not answer in time fails the call; the partitions
    // answered are kept (one not answered still holds its negative ask).
    (void)rd_kafka_offsets_for_times(rk, list, static_cast<int>(left));
    for (int i = 0; i < list->cnt; ++i) {
      const auto& e = list->elems[i];
      if (e.err || e.offset < 0) continue;
      auto& [high, low] = ends.try_emplace({e.topic, e.partition}, -1, -1).first->second;
      (which == RD_KAFKA_OFFSET_END ? high : low) = e.offset;
    }
    rd_kafka_topic_partition_list_destroy(list);
  }
  for (const auto& [tp, e] : ends)
    if (e.first >= 0 && e.second >= 0) out[tp] = Watermarks{e.second, e.first};
  return out;
}

}  // namespace idemsink::kafka
