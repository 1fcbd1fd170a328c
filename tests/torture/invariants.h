// idemsink-torture's invariants: once the run has settled, what every user
// relies on, counted (see torture.cc for the list). Each check adds what it
// found to the verdict.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tests/torture/faults.h"
#include "tests/torture/run.h"

namespace idemsink::torture {

struct Verdict {
  std::vector<std::pair<std::string, std::string>> failed;  // invariant, what
  // The mock cluster's own process ended (librdkafka's mock aborts on an
  // assertion of its group coordinator under some rejoins): the run says
  // nothing about idemsink and ends there.
  std::optional<std::string> backend_died;
  std::map<std::string, std::string> figures;
  void fail(const std::string& inv, const std::string& what) { failed.emplace_back(inv, what); }
};

/// progress: waits, at most `bound`, for every topic committed to its end,
/// no claim pending and the outbox drained.
void check_progress(World& w, Verdict& v, std::chrono::seconds bound);
/// once: no effect twice (each remote's counter, ledger entries, SMS sends).
void check_once(World& w, Verdict& v);
/// accounted: every produced record in its expected class.
void check_classes(World& w, const Plan& plan, Verdict& v);
/// letters: every dead letter published, repeats only after a SIGKILL.
void check_letters(World& w, Verdict& v);
/// events: every claim's outcome has its event, and every event an outcome.
void check_events(World& w, Verdict& v);
/// clean: no crash, sanitizer report or "bug:" line in a log; no problem noted.
void check_logs(World& w, Verdict& v);

}  // namespace idemsink::torture
