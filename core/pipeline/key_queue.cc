#include "core/pipeline/key_queue.h"

#include <algorithm>

namespace idemsink::pipeline {

bool KeyQueue::push(const std::string& key, uint64_t id) {
  auto& line = lines_[key];
  line.push_back(id);
  return line.size() == 1;
}

std::optional<uint64_t> KeyQueue::remove(const std::string& key, uint64_t id) {
  auto it = lines_.find(key);
  if (it == lines_.end()) return std::nullopt;
  auto& line = it->second;
  const bool was_first = !line.empty() && line.front() == id;
  line.erase(std::remove(line.begin(), line.end(), id), line.end());
  if (line.empty()) {
    lines_.erase(it);
    return std::nullopt;
  }
  if (was_first) return line.front();
  return std::nullopt;
}

bool KeyQueue::first(const std::string& key, uint64_t id) const {
  auto it = lines_.find(key);
  return it != lines_.end() && !it->second.empty() && it->second.front() == id;
}

std::span<const uint64_t> KeyQueue::line(const std::string& key) const {
  auto it = lines_.find(key);
  if (it == lines_.end()) return {};
  return {it->second.data(), it->second.size()};
}

}  // namespace idemsink::pipeline
