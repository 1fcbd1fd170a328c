// librdkafka versions that fixed a fault the consumer works around
// (docs/librdkafka.md has the table, with the test of each). Internal to the
// kafka module.
#pragma once

namespace idemsink::kafka {

constexpr int kBatchConsumeFixed = 0x020100ff;       // batch consume skipped offsets with pause/resume
constexpr int kSeekTimeoutFixed = 0x020100ff;        // seek_partitions() read its timeout as microseconds
constexpr int kStickyCloseFixed = 0x020300ff;        // cooperative-sticky close before the first assignment aborted
constexpr int kIllegalGenerationFixed = 0x020a00ff;  // ILLEGAL_GENERATION on commit lost the assignment

}  // namespace idemsink::kafka
