// What the admin port may do to an engine, from its own threads: pause and
// resume the engine's fetching, or one route's, and read the routes'
// pauses. The admin port sees the engine through this alone.
#pragma once

#include <string>
#include <vector>

namespace idemsink::pipeline {

/// A route's operator pause as this host applies it (route_control.h).
struct RoutePause {
  std::string route;
  std::string topic;
  bool paused = false;
  std::string changed_by;  // who paused or resumed it last
  std::string changed_at;  // when (database time)
  bool circuit_open = false;
};

class Controls {
 public:
  /// Operator pause or resume of the whole engine: it stops fetching and
  /// keeps its consumer groups.
  virtual void set_operator_pause(bool paused) = 0;
  virtual bool operator_paused() const = 0;
  /// Each route's operator pause.
  virtual std::vector<RoutePause> route_pauses() const = 0;
  /// A route's pause or resume the operator API stored: applied here at
  /// once, on the other hosts within their next read of it.
  virtual void route_pause_stored(const std::string& route, bool paused, const std::string& by) = 0;

 protected:
  virtual ~Controls() = default;
};

}  // namespace idemsink::pipeline
