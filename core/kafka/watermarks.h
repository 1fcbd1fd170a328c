// Where a partition's log starts and ends, asked of its leader under a
// deadline that holds. librdkafka's rd_kafka_query_watermark_offsets waits
// for ever when the leader cannot be reached (fixed in 2.3.0; Debian 12 has
// 2.0.2): the host's stall check would hang its consumer thread while a
// broker is down, the very moment it runs. The same ListOffsets request made
// through rd_kafka_offsets_for_times keeps its timeout.
#pragma once

#include <librdkafka/rdkafka.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace idemsink::kafka {

struct Watermarks {
  int64_t low = 0;   // the log's start
  int64_t high = 0;  // its end (the last stable offset for a read_committed client)
};

/// Both ends of `topic`[`partition`] within `timeout_ms` in all; an error
/// (ERR__TIMED_OUT when the leader did not answer in time) otherwise.
rd_kafka_resp_err_t query_watermarks(rd_kafka_t* rk, const std::string& topic, int32_t partition, int timeout_ms,
                                     Watermarks& out);

/// The first offset of `topic`[`partition`] whose record is stamped at or
/// after `time_ms`, or the log's end when none is yet, within `timeout_ms`.
rd_kafka_resp_err_t offset_at_time(rd_kafka_t* rk, const std::string& topic, int32_t partition, int64_t time_ms,
                                   int timeout_ms, int64_t& offset);

/// Both ends of many partitions, asked together within `timeout_ms` in
/// all: those whose leaders answered in time.
std::map<std::pair<std::string, int32_t>, Watermarks> query_watermarks(
    rd_kafka_t* rk, const std::vector<std::pair<std::string, int32_t>>& partitions, int timeout_ms);

}  // namespace idemsink::kafka
