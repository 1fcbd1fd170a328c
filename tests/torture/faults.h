// idemsink-torture's plan: the workload (records per route, and what each
// should end as) and the schedule of faults, both drawn from the seed by
// draw(). The same seed draws the same plan.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace idemsink::torture {

struct Options {
  uint64_t seed = 1;
  std::chrono::seconds duration{60};
  int hosts = 2;
  std::string kafka = "mock";
  bool keep = false;
};

// One route of the workload, and what its records should end as.
struct RouteDef {
  std::string name;
  std::string plugin;         // shipped plugin
  bool remote = true;         // talks to the fake services
  bool retry_topics = false;  // forwards through two retry topics
  bool second_db = false;     // claims in the second database
};

extern const std::vector<RouteDef> kRoutes;

// What a produced record should end as.
enum class Expect {
  Done,      // its order's effect applied once (SMS: at most once, done iff sent)
  Dead,      // dead-lettered with `reason`, no effect
  Duplicate  // an earlier record of its order decides
};

struct Record {
  std::string route;
  std::string order;  // biz_key
  std::string key;    // Kafka key
  std::string value;
  int32_t partition;
  int64_t timestamp_ms = 0;  // 0: now
  Expect expect;
  std::string reason;  // Dead: the expected idemsink.reason (one of several for a remote refusal)
};

enum class Fault {
  HostKill,       // SIGKILL a host, start it again after `duration`
  HostStop,       // SIGTERM a host (must exit 0), start it again after `duration`
  HostJoin,       // one more host joins for `duration`, then leaves with SIGTERM
  DatabaseKill,   // SIGKILL MariaDB, restart after `duration`
  BrokerDown,     // a broker goes down for `duration`
  RequestErrors,  // injected request errors (mock only)
  RemoteOutage,   // a remote answers 503 to everything
  Brownout,       // a remote answers slower than the host's call timeout
  LostAnswers,    // a remote applies, then answers too late (timeouts after applying)
  DlqDown,        // a DLQ partition without a leader (mock only)
  Pause,          // an operator pauses a route, resumes after `duration`
  Replay,         // an operator replays a route's permanently failed records
};
const char* fault_name(Fault f);

struct FaultEvent {
  double at_s;
  double duration_s;
  Fault kind;
  int target = 0;      // host index, broker id
  std::string detail;  // service, route, API
};

struct Plan {
  Options opt;
  int partitions = 3;
  std::vector<Record> records;
  std::vector<FaultEvent> faults;
};
int64_t now_ms();

/// The workload and the faults the seed (and the run's options) draw.
Plan draw(const Options& opt);
/// The plan in a few lines: the records per class and the schedule.
std::string describe(const Plan& p);

}  // namespace idemsink::torture
