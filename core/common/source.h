// Where a record came from: its topic, partition and offset, as the claim
// row, the outbox row, the outcome event and the reconciler each keep them.
// The structs that carry a record's origin derive from it, so the three
// travel together: `to.source() = from.source()`.
#pragma once

#include <cstdint>
#include <string>

namespace idemsink {

struct Source {
  std::string src_topic;
  int32_t src_partition = 0;
  int64_t src_offset = 0;

  Source& source() { return *this; }
  const Source& source() const { return *this; }
};

}  // namespace idemsink
