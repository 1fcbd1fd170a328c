#include "tests/torture/run.h"

#include <algorithm>
#include <thread>

namespace idemsink::torture {

std::string topic_of(const std::string& route) { return "t." + route; }

void feed(World& w, const Plan& plan, std::chrono::seconds over) {
  // Every record over the first half of the run, in plan order.
  const auto start = Clock::now();
  const size_t total = plan.records.size();
  std::map<std::string, std::vector<TestMessage>> batch;
  for (size_t i = 0; i < total; ++i) {
    const Record& r = plan.records[i];
    batch[topic_of(r.route)].push_back({r.key, r.value, {}, r.partition, r.timestamp_ms});
    if (i % 50 == 49 || i + 1 == total) {
      for (auto& [topic, msgs] : batch) {
        for (;;) {
          try {
            w.kafka_.produce(topic, msgs);
            break;
          } catch (const std::exception&) {
            // A dead mock cluster never comes back: the run ends as BACKEND DIED.
            if (w.kafka_.mock_died()) return;
            std::this_thread::sleep_for(500ms);  // a broker down: the feed waits, like an upstream would
          }
        }
      }
      batch.clear();
      std::this_thread::sleep_until(start + over * (static_cast<double>(i + 1) / static_cast<double>(total)));
    }
  }
}

void apply_fault(World& w, const FaultEvent& f, bool begin) {
  if (f.kind == Fault::RemoteOutage || f.kind == Fault::Brownout) {
    if (begin) {
      w.remote_faults_.emplace(f.detail, std::pair<int64_t, int64_t>{now_ms(), 0});
    } else {
      for (auto [it, end] = w.remote_faults_.equal_range(f.detail); it != end; ++it)
        if (it->second.second == 0) it->second.second = now_ms();
    }
  }
  switch (f.kind) {
    case Fault::HostKill:
      if (begin) {
        w.kill_host(f.target);
      } else {
        w.start_host(f.target);
      }
      break;
    case Fault::HostStop:
      if (begin) {
        w.stop_host(f.target);
      } else {
        w.start_host(f.target);
      }
      break;
    case Fault::HostJoin:
      if (begin) {
        w.start_host(100 + f.target);
      } else {
        w.stop_host(100 + f.target);
      }
      break;
    case Fault::DatabaseKill:
      if (begin) {
        MariaDbServer::shared().kill();
      } else {
        MariaDbServer::shared().restart();
      }
      break;
    case Fault::BrokerDown:
      if (begin) {
        w.kafka_.broker_down(f.target);
      } else if (auto* real = w.kafka_.real()) {
        // Not waiting for it to listen: with the others of its quorum down it
        // cannot, until they are back too (settle() waits for all).
        real->start_again(f.target);
      } else {
        w.kafka_.broker_up(f.target);
      }
      break;
    case Fault::RequestErrors:
      if (begin) {
        // What a broker failover answers each API with, a few times over.
        const std::map<std::string, std::pair<const char*, int>> kErrors = {
            {"OffsetFetch", {"COORDINATOR_LOAD_IN_PROGRESS", 30}},
            {"OffsetCommit", {"NOT_COORDINATOR", 8}},
            {"Fetch", {"NOT_LEADER_FOR_PARTITION", 6}},
            {"Produce", {"NOT_ENOUGH_REPLICAS", 8}},
            {"JoinGroup", {"COORDINATOR_NOT_AVAILABLE", 6}}};
        const auto& [err, n] = kErrors.at(f.detail);
        std::string line = "push_errors " + f.detail;
        for (int i = 0; i < n; ++i) line += std::string(" ") + err;
        w.kafka_.command(line);
      }
      break;
    case Fault::RemoteOutage: w.set_faults(f.detail, begin ? R"({"error_5xx": 1.0})" : R"({"error_5xx": 0.0})"); break;
    case Fault::Brownout:
      w.set_faults(f.detail, begin ? R"({"latency_mean_ms": 1500, "latency_p99_ms": 4000})"
                                   : R"({"latency_mean_ms": 8, "latency_p99_ms": 60})");
      break;
    case Fault::LostAnswers:
      w.set_faults(f.detail, begin ? R"({"timeout_after_apply": 0.3})" : R"({"timeout_after_apply": 0.0})");
      break;
    case Fault::DlqDown:
      w.kafka_.command("partition_leader " + topic_of(f.detail) + ".dlq 0 " + (begin ? "-1" : "1"));
      break;
    case Fault::Pause: w.cli({"route", begin ? "pause" : "resume", f.detail}); break;
    case Fault::Replay:
      if (begin) w.cli({"replay", "--route", f.detail, "--reason", "permanent"});
      break;
  }
}

// The faults stop: every part up, every route resumed, every host of the
// group running (the schedule restored most of it; a kill or a join the run
// ended in the middle of is undone here).
void settle(World& w, const Plan& plan) {
  const std::string healthy =
      R"({"error_5xx": 0, "timeout_after_apply": 0, "latency_mean_ms": 8, "latency_p99_ms": 60})";
  if (auto* real = w.kafka_.real()) real->wait_all_up(180s);
  for (const char* svc : {"waybill", "inventory", "sms"}) w.set_faults(svc, healthy);
  for (const auto& r : kRoutes) w.cli({"route", "resume", r.name});
  for (int i = 0; i < plan.opt.hosts; ++i)
    if (!w.host_running(i)) w.start_host(i);
}

void run_schedule(World& w, const Plan& plan, Clock::time_point start) {
  struct Step {
    double at_s;
    const FaultEvent* f;
    bool begin;
  };
  std::vector<Step> steps;
  for (const auto& f : plan.faults) {
    steps.push_back({f.at_s, &f, true});
    steps.push_back({f.at_s + f.duration_s, &f, false});
  }
  std::stable_sort(steps.begin(), steps.end(), [](const Step& a, const Step& b) { return a.at_s < b.at_s; });
  for (const auto& s : steps) {
    std::this_thread::sleep_until(start + std::chrono::milliseconds(static_cast<int64_t>(s.at_s * 1000)));
    try {
      apply_fault(w, *s.f, s.begin);
    } catch (const std::exception& e) {
      w.note(std::string("applying ") + fault_name(s.f->kind) + ": " + e.what());
    }
  }
}

}  // namespace idemsink::torture
