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

}  // namespace idemsink::kafka
