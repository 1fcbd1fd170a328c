// What a Kafka client knows of its cluster, for /readyz and /metrics:
// librdkafka's statistics (statistics.interval.ms: broker states and round
// trips, the group's state and rebalances, the fetch queue) and the errors its
// error callback reported (all brokers down, authentication refused).
//
// Written by the client's poll thread (where librdkafka serves both
// callbacks), read by the admin thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "core/kafka/login.h"

namespace idemsink::kafka {

class ClientHealth {
 public:
  struct Broker {
    bool up = false;           // librdkafka's broker state is UP
    double rtt_seconds = 0.0;  // average round trip over the last statistics interval
  };
  struct Snapshot {
    bool stats_seen = false;                // at least one statistics report arrived
    std::map<std::string, Broker> brokers;  // "host:port/id"; bootstrap-only entries left out
    std::string group_state;                // librdkafka's cgrp state ("up" once joined), empty without a group
    std::string join_state;                 // "steady" once the assignment is settled
    int64_t rebalances = 0;
    int64_t fetch_queue_messages = 0;
    std::string error;  // the last fatal-for-readiness error (all brokers down, authentication), or empty
  };

  /// The client's security settings, which say what a refused login means.
  void set_login(LoginSettings login);
  /// statistics.interval.ms = 0: no report will come, so readiness leaves Kafka out.
  void statistics_disabled();
  /// A statistics JSON report (the stats callback). Malformed input is
  /// ignored (logged once): metrics are not worth a crash.
  void on_statistics(std::string_view json);
  /// The error callback: ALL_BROKERS_DOWN and a refused login (credentials,
  /// token, either side's certificate: login.h) make the client not ready
  /// until a broker is seen up again.
  void on_error(int err, const std::string& reason);

  Snapshot snapshot() const;
  /// Empty when the client can talk to its cluster; otherwise why not.
  std::string problem() const;

 private:
  mutable std::mutex mu_;
  Snapshot s_;
  bool parse_error_logged_ = false;
  bool stats_enabled_ = true;
  bool auth_error_ = false;  // s_.error is a refused login (or TLS), not an outage
  LoginSettings login_;
};

}  // namespace idemsink::kafka
