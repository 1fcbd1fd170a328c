#include "core/common/fault.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "core/common/log.h"

namespace idemsink::fault {
namespace {

struct Armed {
  std::mutex mu;
  std::map<std::string, std::pair<long, long>, std::less<>> points;  // name -> (hits so far, fatal hit)
};
std::atomic<Armed*> g_armed{nullptr};

struct SyncPoints {
  std::mutex mu;
  std::map<std::string, std::function<void()>, std::less<>> fns;
};
SyncPoints& sync_points() {
  static SyncPoints points;
  return points;
}
std::atomic<bool> g_sync_points_set{false};

}  // namespace

void sync_point(std::string_view name) {
  if (!g_sync_points_set.load(std::memory_order_relaxed)) return;
  std::function<void()> fn;
  {
    std::lock_guard lk(sync_points().mu);
    auto it = sync_points().fns.find(name);
    if (it == sync_points().fns.end()) return;
    fn = it->second;
  }
  fn();
}

void set_sync_point(const std::string& name, std::function<void()> fn) {
  std::lock_guard lk(sync_points().mu);
  if (fn) {
    sync_points().fns[name] = std::move(fn);
  } else {
    sync_points().fns.erase(name);
  }
  g_sync_points_set.store(!sync_points().fns.empty());
}

void init_from_env() {
  const char* spec = std::getenv("IDEMSINK_FAULT");
  if (spec == nullptr || *spec == '\0') return;
  auto* armed = new Armed;  // lives for the process: crash points are for tests
  std::string s(spec);
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(pos, end - pos);
    size_t colon = item.find(':');
    if (colon == std::string::npos || colon == 0)
      throw std::invalid_argument("IDEMSINK_FAULT: expected point:N, got '" + item + "'");
    long n = std::strtol(item.c_str() + colon + 1, nullptr, 10);
    if (n < 1) throw std::invalid_argument("IDEMSINK_FAULT: hit count must be >= 1 in '" + item + "'");
    armed->points[item.substr(0, colon)] = {0, n};
    pos = end + 1;
  }
  g_armed.store(armed);
  spdlog::warn("fault injection armed: IDEMSINK_FAULT={}", spec);
}

bool once(std::string_view point) {
  Armed* armed = g_armed.load(std::memory_order_relaxed);
  if (armed == nullptr) return false;
  std::lock_guard lk(armed->mu);
  auto it = armed->points.find(point);
  return it != armed->points.end() && ++it->second.first == it->second.second;
}

void hit(std::string_view point) {
  if (once(point)) {
    spdlog::warn("fault point {} reached: SIGKILL", point);
    spdlog::default_logger()->flush();
    ::kill(::getpid(), SIGKILL);
  }
}

}  // namespace idemsink::fault
