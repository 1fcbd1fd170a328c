#include "tests/torture/faults.h"

#include <algorithm>
#include <ctime>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

namespace idemsink::torture {

const std::vector<RouteDef> kRoutes = {
    {"waybill", "waybill"},
    {"inventory", "inventory", true, true},
    {"sms", "sms"},
    {"ledger", "ledger", false, false, true},
};

const char* fault_name(Fault f) {
  switch (f) {
    case Fault::HostKill: return "host kill -9";
    case Fault::HostStop: return "host SIGTERM";
    case Fault::HostJoin: return "host joins";
    case Fault::DatabaseKill: return "MariaDB kill -9";
    case Fault::BrokerDown: return "broker down";
    case Fault::RequestErrors: return "request errors";
    case Fault::RemoteOutage: return "remote outage";
    case Fault::Brownout: return "remote brownout";
    case Fault::LostAnswers: return "answers lost after applying";
    case Fault::DlqDown: return "DLQ partition leaderless";
    case Fault::Pause: return "operator pause";
    case Fault::Replay: return "operator replay";
  }
  return "?";
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {

// The first millisecond of the current UTC month.
int64_t month_start_ms() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  tm.tm_mday = 1;
  tm.tm_hour = tm.tm_min = tm.tm_sec = 0;
  return static_cast<int64_t>(timegm(&tm)) * 1000;
}

std::string order_value(const std::string& order, const std::string& account, std::mt19937_64& rng) {
  return nlohmann::json{{"order_id", order},
                        {"account", account},
                        {"amount", 10 + static_cast<double>(rng() % 9000) / 100},
                        {"phone", "+86138" + std::to_string(10000000 + rng() % 89999999)},
                        {"sku", "SKU-" + std::to_string(rng() % 300)},
                        {"qty", 1 + static_cast<int>(rng() % 3)}}
      .dump();
}

}  // namespace

Plan draw(const Options& opt) {
  Plan plan;
  plan.opt = opt;
  std::mt19937_64 rng(opt.seed);
  auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  plan.partitions = 2 + static_cast<int>(rng() % 3);
  const int orders =
      150 + static_cast<int>(rng() % 150) * static_cast<int>(std::max<int64_t>(1, opt.duration.count() / 60));
  const std::string tag = "S" + std::to_string(opt.seed);
  for (const auto& r : kRoutes) {
    std::vector<Record> firsts;
    for (int i = 0; i < orders; ++i) {
      std::string order = tag + "-" + r.name + "-" + std::to_string(i);
      Record rec{r.name, order, "", "", static_cast<int32_t>(rng() % plan.partitions), 0, Expect::Done, ""};
      std::string account = "acct-" + std::to_string(rng() % 97);
      const double kind = std::uniform_real_distribution<double>(0, 1)(rng);
      if (kind < 0.03 && r.remote) {
        rec.order = "REJECT-" + order;  // the remote refuses it for itself, every time
        rec.expect = Expect::Dead;
        rec.reason = "permanent";
      } else if (kind < 0.05 && r.remote) {
        rec.order = "DOWN-" + order;  // 503 forever: attempts run out
        rec.expect = Expect::Dead;
        rec.reason = "retries_exhausted";
      } else if (kind < 0.07 && r.name == "ledger") {
        account = std::string(70, 'x');  // longer than the ledger's account column
        rec.expect = Expect::Dead;
        rec.reason = "db_rejected";
      } else if (kind < 0.09) {
        // Either side of the month end: each record meets its own claim row.
        rec.timestamp_ms = month_start_ms() + (chance(0.5) ? -1 - static_cast<int64_t>(rng() % 60000)
                                                           : static_cast<int64_t>(rng() % 60000));
      } else if (kind < 0.10) {
        rec.timestamp_ms = now_ms() - int64_t{100} * 86'400'000;  // older than retention minus the margin
        rec.expect = Expect::Dead;
        rec.reason = "beyond_replay_horizon";
      }
      rec.key = rec.order;
      rec.value = order_value(rec.order, account, rng);
      plan.records.push_back(rec);
      firsts.push_back(rec);
    }
    // Duplicates: the same order again, later, on the same or another partition
    // (under another Kafka key: the biz_key is the order id in the value).
    for (int i = 0; i < orders / 8; ++i) {
      Record dup = firsts[rng() % firsts.size()];
      dup.expect = Expect::Duplicate;
      if (chance(0.5)) {
        dup.key = "resent-" + dup.key;
        dup.partition = static_cast<int32_t>(rng() % plan.partitions);
      }
      plan.records.insert(plan.records.begin() + static_cast<long>(rng() % plan.records.size()), dup);
    }
    // Poison: the DLQ, never a crash or a stall.
    const std::vector<std::pair<std::string, std::string>> poison = {
        {"\xff\xfe not json at all", "undecodable_value"},
        {"{\"note\":\"no order id\"}", "missing_key"},
        {"{\"order_id\":\"" + tag + "-big\",\"pad\":\"" + std::string(6000, 'p') + "\"}", "record_too_large"},
        {std::string(300, '[') + std::string(300, ']'), "undecodable_value"},
    };
    for (const auto& [value, reason] : poison)
      if (chance(0.8))
        plan.records.push_back(
            {r.name, "", "poison", value, static_cast<int32_t>(rng() % plan.partitions), 0, Expect::Dead, reason});
  }

  // Faults: overlapping, over the first 80% of the run.
  const double span = static_cast<double>(opt.duration.count()) * 0.8;
  std::vector<Fault> kinds = {Fault::HostKill,   Fault::HostStop,     Fault::HostJoin, Fault::DatabaseKill,
                              Fault::BrokerDown, Fault::RemoteOutage, Fault::Brownout, Fault::LostAnswers,
                              Fault::Pause,      Fault::Replay};
  if (opt.kafka == "mock") {
    kinds.push_back(Fault::RequestErrors);
    kinds.push_back(Fault::DlqDown);
  }
  const int n = 4 + static_cast<int>(rng() % 6) + static_cast<int>(opt.duration.count() / 30);
  const std::vector<std::string> services = {"waybill", "inventory", "sms"};
  const std::vector<std::string> apis = {"OffsetFetch", "OffsetCommit", "Fetch", "Produce", "JoinGroup"};
  for (int i = 0; i < n; ++i) {
    FaultEvent f{std::uniform_real_distribution<double>(2, span)(rng), 2 + static_cast<double>(rng() % 12),
                 kinds[rng() % kinds.size()]};
    f.target = static_cast<int>(rng() % static_cast<uint64_t>(opt.hosts));
    switch (f.kind) {
      case Fault::BrokerDown: f.target = 1 + static_cast<int>(rng() % 3); break;
      case Fault::RemoteOutage:
      case Fault::Brownout:
      case Fault::LostAnswers: f.detail = services[rng() % services.size()]; break;
      case Fault::RequestErrors: f.detail = apis[rng() % apis.size()]; break;
      case Fault::Pause: f.detail = kRoutes[rng() % kRoutes.size()].name; break;
      case Fault::Replay: f.detail = services[rng() % 2]; break;  // waybill or inventory: their rejections
      case Fault::DlqDown: f.detail = kRoutes[rng() % kRoutes.size()].name; break;
      default: break;
    }
    plan.faults.push_back(f);
  }
  std::sort(plan.faults.begin(), plan.faults.end(), [](const auto& a, const auto& b) { return a.at_s < b.at_s; });
  return plan;
}

std::string describe(const Plan& p) {
  std::ostringstream os;
  std::map<std::string, int> by_class;
  for (const auto& r : p.records)
    ++by_class[r.expect == Expect::Done ? "good" : r.expect == Expect::Duplicate ? "duplicate" : "dead:" + r.reason];
  os << "seed " << p.opt.seed << ", " << p.opt.duration.count() << "s, " << p.opt.hosts << " host(s), kafka "
     << p.opt.kafka << ", " << p.partitions << " partitions per topic, " << p.records.size() << " records:";
  for (const auto& [c, n] : by_class) os << " " << c << " " << n;
  std::map<std::string, int> drawn;
  for (const auto& f : p.faults) {
    std::string name = fault_name(f.kind);
    std::replace(name.begin(), name.end(), ' ', '_');
    ++drawn[name];
  }
  os << "\ndrawn:";
  for (const auto& [name, n] : drawn) os << " " << name << "=" << n;
  os << "\nschedule:\n";
  for (const auto& f : p.faults)
    os << "  " << std::fixed << std::setprecision(1) << std::setw(6) << f.at_s << "s +" << f.duration_s << "s  "
       << fault_name(f.kind) << (f.detail.empty() ? "" : " " + f.detail)
       << (f.kind == Fault::HostKill || f.kind == Fault::HostStop ? " host-" + std::to_string(f.target) : "")
       << (f.kind == Fault::BrokerDown ? " broker " + std::to_string(f.target) : "") << "\n";
  return os.str();
}

}  // namespace idemsink::torture
