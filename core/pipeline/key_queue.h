// Per-key arrival order: records of one key run one at a time, in the order
// they were consumed; different keys run in parallel. The engine keeps one
// queue by biz_key (per route) and one by entity ([route.order_by]); a record
// of an ordered route runs when it is first in both lines. Pure bookkeeping
// of record ids; the engine decides what "run" means.
#pragma once

#include <boost/container/small_vector.hpp>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>

namespace idemsink::pipeline {

class KeyQueue {
 public:
  /// Appends a record to its key's line; true if it is first in line.
  bool push(const std::string& key, uint64_t id);
  /// Removes a record from its key's line (done, or dropped on revoke);
  /// returns the record that has just become first in line, if any.
  std::optional<uint64_t> remove(const std::string& key, uint64_t id);
  /// Whether the record is first in its key's line.
  bool first(const std::string& key, uint64_t id) const;
  /// The records in the key's line, first first (empty when none).
  std::span<const uint64_t> line(const std::string& key) const;
  /// Keys with at least one record in line.
  size_t keys() const { return lines_.size(); }

 private:
  // Most keys have one record in line at a time: a line of one or two
  // records is kept inline, no allocation (a std::deque allocated 576 bytes
  // for each). Removal scans the line, as it did.
  std::unordered_map<std::string, boost::container::small_vector<uint64_t, 2>> lines_;
};

}  // namespace idemsink::pipeline
