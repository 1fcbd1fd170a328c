// idemsink-torture: a randomized fault checker. From a seed it draws a
// workload (every kind of route at once, duplicates, poison, values the
// database refuses, records the remote refuses for themselves, timestamps on
// both sides of a month end and beyond the replay horizon) and a schedule of
// overlapping faults (hosts killed, stopped, joining and leaving; MariaDB
// killed; brokers down; request errors; remote outages, brownouts and
// answers lost after applying; the DLQ unavailable; operator pauses and
// replays), runs them on real servers (MariaDB, the mock or a real Kafka,
// the fake services, `idemsink run` hosts), lets the system settle, and
// checks by counting what every user relies on:
//
//   progress   everything committed and every claim settled within a bound
//              after the last fault (else a wedge, with what did not move)
//   once       no effect twice: each remote's own counter per order, ledger
//              entries per order, SMS sent at most once
//   accounted  every produced record accounted for (`idemsink audit`), and in
//              its expected class: done, or dead with the expected reason
//   letters    every dead letter published (repeats only after a SIGKILL)
//   events     every outcome's event published ([route.output] on every
//              route), none for an outcome that is not (repeats only after
//              a SIGKILL)
//   clean      no crash, abort, sanitizer report or "bug:" line (a record
//              stepping outside its life, pipeline/stage.cc) in a log;
//              SIGTERM exits 0
//
// A violation prints the seed and the one command that replays it; exit 1.
// scripts/torture runs many seeds.
#include <boost/program_options.hpp>
#include <filesystem>
#include <iostream>
#include <thread>

#include "devkit/process.h"
#include "tests/support/host_fixture.h"
#include "tests/torture/faults.h"
#include "tests/torture/invariants.h"
#include "tests/torture/run.h"

namespace po = boost::program_options;
using namespace idemsink::torture;

int main(int argc, char** argv) {
  Options opt;
  po::options_description desc("idemsink-torture options");
  int64_t duration = 60;
  desc.add_options()("help,h", "show this help")("seed", po::value<uint64_t>(&opt.seed)->default_value(1),
                                                 "draws the workload and the faults")(
      "duration", po::value<int64_t>(&duration)->default_value(60), "seconds of faults and load")(
      "hosts", po::value<int>(&opt.hosts)->default_value(2), "hosts in the group")(
      "kafka", po::value<std::string>(&opt.kafka)->default_value("mock"), "mock or real")(
      "keep", "keep the scratch directory (logs, data) even when the run passes");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc;
      return 0;
    }
    po::notify(vm);
    if (opt.kafka != "mock" && opt.kafka != "real") throw po::error("--kafka takes mock or real");
    if (opt.hosts < 1 || duration < 10) throw po::error("--hosts >= 1 and --duration >= 10");
  } catch (const po::error& e) {
    std::cerr << "idemsink-torture: " << e.what() << "\n";
    return 2;
  }
  opt.duration = std::chrono::seconds(duration);
  opt.keep = vm.count("keep") > 0;
  ::setenv("IDEMSINK_TEST_KAFKA", opt.kafka.c_str(), 1);
  const std::string replay = "idemsink-torture --seed " + std::to_string(opt.seed) + " --duration " +
                             std::to_string(duration) + " --hosts " + std::to_string(opt.hosts) + " --kafka " +
                             opt.kafka;

  const Plan plan = draw(opt);
  std::cout << describe(plan) << std::flush;
  Verdict v;
  std::filesystem::path kept;
  try {
    ScratchDir dir("torture-" + std::to_string(opt.seed));
    // A run that throws (a server gone, a query refused) keeps its logs too.
    try {
      World w(plan, dir);
      const auto start = Clock::now();
      std::thread feeder([&] { feed(w, plan, opt.duration / 2); });
      run_schedule(w, plan, start);
      feeder.join();
      std::this_thread::sleep_until(start + opt.duration);
      settle(w, plan);
      check_progress(w, v, 180s);
      if (v.backend_died) throw std::runtime_error("the mock cluster's process ended");
      for (int i : w.host_indexes()) w.stop_host(i);
      auto [rc, out] = run_cli(dir, "audit", {"audit", "--config", w.config_file().string()});
      if (rc != 0) v.fail("accounted", "idemsink audit: " + out.substr(out.size() > 2000 ? out.size() - 2000 : 0));
      check_once(w, v);
      check_classes(w, plan, v);
      check_letters(w, v);
      check_events(w, v);
      check_logs(w, v);
      v.figures["host kills"] = std::to_string(w.kills_);
    } catch (const std::exception& e) {
      if (!v.backend_died) v.fail("run", e.what());
    }
    // The logs outlive the scratch directory when they explain something.
    if (!v.failed.empty() || v.backend_died || opt.keep) {
      kept = std::filesystem::temp_directory_path() /
             ("idemsink-torture-seed" + std::to_string(opt.seed) + "-" + std::to_string(::getpid()));
      std::filesystem::copy(dir.path(), kept, std::filesystem::copy_options::recursive);
    }
  } catch (const std::exception& e) {
    v.fail("run", e.what());
  }
  std::cout << "invariants: progress, once, accounted, letters, events, clean\n";
  for (const auto& [k, f] : v.figures) std::cout << "  " << k << ": " << f << "\n";
  if (v.backend_died && v.failed.empty()) {
    // Exit 2: not a verdict on idemsink; scripts/torture counts these apart.
    std::cout << "verdict: BACKEND DIED (seed " << opt.seed
              << "): the mock Kafka cluster's process ended: " << *v.backend_died << "\n";
    if (!kept.empty()) std::cout << "logs: " << kept.string() << "\n";
    std::cout << "replay: " << replay << "\n";
    return 2;
  }
  if (v.failed.empty()) {
    std::cout << "verdict: PASS (seed " << opt.seed << ")" << (kept.empty() ? "" : ", logs in " + kept.string())
              << "\n";
    return 0;
  }
  std::cout << "verdict: VIOLATION (seed " << opt.seed << ")\n";
  for (const auto& [inv, what] : v.failed) std::cout << "  " << inv << ": " << what << "\n";
  if (!kept.empty()) std::cout << "logs: " << kept.string() << "\n";
  std::cout << "replay: " << replay << "\n";
  return 1;
}
