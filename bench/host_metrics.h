// What a benchmark reads of the host it started, from its admin endpoint's
// /metrics: the host's own counters, to the moment.
//
// A rate is timed to the last record's durable outcome (done mark written, or
// the record found a duplicate), read every 20 ms. Committed offsets are the
// wrong clock for it: they follow the outcomes by up to kafka.commit_interval
// (1 s), and reading them starts a consumer and finds the coordinator each
// time; a 6-second run timed that way moved in steps of about a second. The
// benchmarks still wait for every offset to be committed, apart, and print
// how long after the last outcome that was.
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "devkit/services.h"

namespace idemsink::bench {

/// The value of one series (name with its labels, as the host writes it) in
/// a /metrics scrape; throws if absent.
inline double metric(const std::string& scrape, const std::string& series) {
  const size_t at = scrape.find("\n" + series + " ");
  if (at == std::string::npos) throw std::runtime_error("no series " + series + " in /metrics");
  return std::stod(scrape.substr(at + series.size() + 2));
}

/// Waits until the host's admin port answers /metrics (it opens once the
/// host has read its config).
inline void wait_for_admin_port(int admin) {
  devkit::wait_until(
      [&] {
        try {
          return devkit::http_request(admin, "GET", "/metrics").first == 200;
        } catch (const std::exception&) {
          return false;  // not listening yet
        }
      },
      std::chrono::seconds(60), "the host's admin port");
}

/// Where a wait for outcomes ended: when, and the outcomes counted then.
struct Reached {
  std::chrono::steady_clock::time_point at;
  double outcomes = 0;
};

/// Polls the host's /metrics (admin port `admin`) until the sum of `series`
/// reaches `target`; returns when it did, with the sum read then. Throws
/// naming `what` after `timeout`.
inline Reached reach_outcomes(int admin, const std::vector<std::string>& series, double target,
                              std::chrono::seconds timeout, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const std::string scrape = devkit::http_request(admin, "GET", "/metrics").second;
    const auto now = std::chrono::steady_clock::now();
    double sum = 0;
    for (const auto& s : series) sum += metric(scrape, s);  // a misspelt series throws, not waits
    if (sum >= target) return {now, sum};
    if (now > deadline) throw std::runtime_error("timed out waiting for " + what);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

/// reach_outcomes(), when only the time matters.
inline std::chrono::steady_clock::time_point wait_for_outcomes(int admin, const std::vector<std::string>& series,
                                                               double target, std::chrono::seconds timeout,
                                                               const std::string& what) {
  return reach_outcomes(admin, series, target, timeout, what).at;
}

}  // namespace idemsink::bench
