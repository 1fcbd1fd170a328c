#include "tests/torture/invariants.h"

#include <set>
#include <sstream>
#include <thread>

#include "core/db/connection.h"
#include "core/dlq/outbox.h"

namespace idemsink::torture {

// Waits for progress: every topic committed to its end, no claim pending,
// the outbox drained.
void check_progress(World& w, Verdict& v, std::chrono::seconds bound) {
  std::string behind;
  const auto deadline = Clock::now() + bound;
  for (;;) {
    behind.clear();
    if ((v.backend_died = w.kafka_.mock_died())) return;
    try {
      for (const auto& t : w.topics_) {
        const auto hi = w.kafka_.high_watermarks(t, w.plan_.partitions);
        const auto c = w.kafka_.committed(w.group_, t, w.plan_.partitions);
        for (const auto& [p, h] : hi)
          if (h > 0 && c.at(p) < h)
            behind += " " + t + "[" + std::to_string(p) + "] " + std::to_string(c.at(p)) + "/" + std::to_string(h);
      }
      for (const auto* cfg : {&w.db_, &w.db2_}) {
        db::Connection c(*cfg);
        const int64_t pending = scalar(c, "SELECT COUNT(*) FROM idemsink_claim WHERE " +
                                              status_in(claim::Status::Pending, claim::Status::Unknown));
        if (pending > 0) behind += " " + std::to_string(pending) + " claim(s) pending or unknown in " + cfg->database;
        // A letter is progress too: the relay retries a leaderless DLQ
        // partition with a backoff of up to 30 s after the fault has ended.
        const int64_t unpublished =
            scalar(c, "SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE dlq_topic <> '' AND published_at IS NULL");
        if (unpublished > 0)
          behind += " " + std::to_string(unpublished) + " outbox row(s) unpublished in " + cfg->database;
      }
    } catch (const std::exception& e) {
      behind = std::string(" (") + e.what() + ")";
    }
    if (behind.empty() || Clock::now() > deadline) break;
    std::this_thread::sleep_for(1s);
  }
  if (!behind.empty())
    v.fail("progress",
           "a wedge " + std::to_string(bound.count()) + "s after the last fault:" + behind + ";" + w.dump_status());
}

void check_once(World& w, Verdict& v) {
  const auto stats = w.services_.stats();
  for (const char* svc : {"waybill", "inventory"}) {
    const int doubled = stats[svc]["double_applied"].get<int>();
    v.figures[std::string(svc) + " applied"] = std::to_string(stats[svc]["applied"].get<int>());
    if (doubled != 0) v.fail("once", std::string(svc) + ": " + std::to_string(doubled) + " order(s) applied twice");
  }
  for (const auto& [order, n] : stats["sms"]["per_order"].items())
    if (n.get<int>() > 1) v.fail("once", "sms: order " + order + " sent " + std::to_string(n.get<int>()) + " times");
  db::Connection c2(w.db2_);
  const int64_t twice =
      scalar(c2, "SELECT COUNT(*) FROM (SELECT biz_key FROM ledger_entries GROUP BY biz_key HAVING COUNT(*) > 1) d");
  if (twice != 0) v.fail("once", "ledger: " + std::to_string(twice) + " order(s) credited twice");
  v.figures["ledger credits"] = std::to_string(scalar(c2, "SELECT COUNT(*) FROM ledger_entries"));
}

void check_classes(World& w, const Plan& plan, Verdict& v) {
  const auto stats = w.services_.stats();
  // The expected outcome per (route, order): the first record of an order decides.
  std::map<std::pair<std::string, std::string>, const Record*> first;
  for (const auto& r : plan.records)
    if (!r.order.empty() && r.expect != Expect::Duplicate) first.emplace(std::pair{r.route, r.order}, &r);
  std::map<std::pair<std::string, std::string>, int> status;
  for (const auto* cfg : {&w.db_, &w.db2_}) {
    db::Connection c(*cfg);
    for (auto& row : c.query("SELECT namespace, biz_key, status FROM idemsink_claim"))
      status[{*row[0], *row[1]}] = std::stoi(*row[2]);
  }
  std::map<std::string, int> letters;  // reason -> count, all DLQ topics
  std::set<std::pair<std::string, std::string>> dead_orders;
  // Orders whose attempts all failed inside one of their remote's outages or
  // brownouts: the circuit opens only when enough different records fail
  // (records failing alone must not open it), so a thin stream's records
  // may spend their attempts on an outage and become dead letters. That is
  // the configured retry policy at work, not a loss: replayable, no effect.
  // Whatever the path: spent at once (retries_exhausted), or timed out,
  // parked unknown and settled failed by reconciliation (not_applied).
  std::set<std::pair<std::string, std::string>> spent_on_outage;
  auto in_remote_fault = [&](const std::string& service, int64_t first_ms, int64_t last_ms) {
    for (auto [it, end] = w.remote_faults_.equal_range(service); it != end; ++it) {
      const auto [begin_ms, end_ms] = it->second;
      // Calls already out when it ended fail up to the plugin's timeout (1 s)
      // later, and a busy machine records that later still: 3 s of slack.
      if (first_ms >= begin_ms && last_ms <= (end_ms == 0 ? now_ms() : end_ms + 3000)) return true;
    }
    return false;
  };
  for (const auto& r : kRoutes)
    for (const auto& m : w.kafka_.read_all(topic_of(r.name) + ".dlq", 2, 30000)) {
      ++letters[m.headers.count("idemsink.reason") ? m.headers.at("idemsink.reason") : "?"];
      // The order: its biz_key header, or (refused before a key was read) the value's order id.
      std::string order = m.headers.count("idemsink.biz_key") ? m.headers.at("idemsink.biz_key") : "";
      if (order.empty() && m.value) {
        const auto j = nlohmann::json::parse(*m.value, nullptr, false);
        if (j.is_object() && j.contains("order_id") && j["order_id"].is_string()) order = j["order_id"];
      }
      if (!order.empty()) dead_orders.insert({r.name, order});
      const auto failure_ms = [&](const char* header) {
        return m.headers.count(header) ? std::stoll(m.headers.at(header)) : int64_t{0};
      };
      const std::string reason = m.headers.count("idemsink.reason") ? m.headers.at("idemsink.reason") : "";
      if (!order.empty() && (reason == "retries_exhausted" || reason == "not_applied") &&
          in_remote_fault(r.name, failure_ms("idemsink.first_failure_ms"), failure_ms("idemsink.last_failure_ms")))
        spent_on_outage.insert({r.name, order});
    }
  int wrong = 0;
  int outage_letters = 0;
  for (const auto& [key, rec] : first) {
    const auto& [route, order] = key;
    auto it = status.find(key);
    const int st = it == status.end() ? 0 : it->second;
    std::string problem;
    if (rec->expect == Expect::Done) {
      if (route == "sms") {
        const int sent = stats["sms"]["per_order"].value(order, 0);
        if (!((st == 2 && sent == 1) || (st == 3 && sent == 0)))
          problem = "status " + std::to_string(st) + " with " + std::to_string(sent) + " send(s)";
      } else if (st == 3 && spent_on_outage.count(key)) {
        ++outage_letters;
      } else if (st != 2) {
        problem = "status " + std::to_string(st) + ", expected done";
      }
    } else if (rec->reason == "beyond_replay_horizon") {
      if (st != 0) problem = "claimed although beyond the replay horizon";
      if (!dead_orders.count(key)) problem += " no dead letter";
    } else {
      if (st != 3) problem = "status " + std::to_string(st) + ", expected failed";
      // Every failed record is published, a settlement's too (nothing ends failed unpublished).
      if (!dead_orders.count(key)) problem += " no dead letter";
      if (route == "sms" && stats["sms"]["per_order"].value(order, 0) != 0) problem += " sent";
    }
    if (!problem.empty() && ++wrong <= 10) v.fail("accounted", route + "/" + order + ": " + problem);
  }
  if (wrong > 10) v.fail("accounted", std::to_string(wrong - 10) + " more");
  int poison = 0;
  for (const auto& r : plan.records) poison += r.order.empty();
  int poison_letters = letters["undecodable_value"] + letters["missing_key"] + letters["record_too_large"];
  if (poison_letters < poison)
    v.fail("accounted", std::to_string(poison) + " poison records, " + std::to_string(poison_letters) + " letters");
  std::ostringstream os;
  for (const auto& [reason, n] : letters) os << reason << " " << n << " ";
  v.figures["dead letters"] = os.str();
  v.figures["good orders dead-lettered by an outage (attempts spent)"] = std::to_string(outage_letters);
}

void check_letters(World& w, Verdict& v) {
  for (const auto* cfg : {&w.db_, &w.db2_}) {
    db::Connection c(*cfg);
    const int64_t unpublished =
        scalar(c, "SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE " + dlq::sql_purpose_is(dlq::Purpose::DeadLetter) +
                      " AND dlq_topic <> '' AND published_at IS NULL");
    if (unpublished > 0)
      v.fail("letters", std::to_string(unpublished) + " dead letter(s) never published in " + cfg->database);
  }
  std::map<std::string, int> seen;
  for (const auto& r : kRoutes)
    for (const auto& m : w.kafka_.read_all(topic_of(r.name) + ".dlq", 2, 30000))
      ++seen[r.name + "/" + (m.headers.count("idemsink.outbox_id") ? m.headers.at("idemsink.outbox_id") : "?")];
  int repeats = 0;
  for (const auto& [id, n] : seen) repeats += n - 1;
  v.figures["letter repeats"] = std::to_string(repeats);
  if (repeats > 0 && w.kills_ == 0)
    v.fail("letters", std::to_string(repeats) + " letter(s) published twice with no host killed");
}

// Every claim's outcome has its event, and every event an outcome: a done
// claim its done event, a failed or unknown one its event; a done event only
// for a claim that is done (done never changes). Repeats (the same event id
// twice) only after a SIGKILL, as for letters.
void check_events(World& w, Verdict& v) {
  std::map<std::string, std::set<std::string>> outcomes_of;  // token -> outcomes with an event
  std::map<std::string, int> publications;                   // event id -> times published
  for (const auto& r : kRoutes)
    for (const auto& m : w.kafka_.read_all(topic_of(r.name) + ".events", 2, 30000)) {
      const auto j = nlohmann::json::parse(m.value.value_or(""), nullptr, false);
      if (!j.is_object() || !m.headers.count("idemsink.event_id")) {
        v.fail("events", r.name + ": an event that is not one (offset " + std::to_string(m.offset) + ")");
        continue;
      }
      ++publications[m.headers.at("idemsink.event_id")];
      outcomes_of[j.value("idem_token", std::string())].insert(j.value("outcome", std::string()));
    }
  int wrong = 0;
  for (const auto* cfg : {&w.db_, &w.db2_}) {
    db::Connection c(*cfg);
    for (auto& row : c.query("SELECT namespace, biz_key, status, idem_token FROM idemsink_claim")) {
      const std::string status = claim::to_string(static_cast<claim::Status>(std::stoi(*row[2])));
      const auto& seen = outcomes_of[*row[3]];
      std::string problem;
      if (status != "pending" && !seen.count(status)) problem = status + " without its event";
      if (status != "done" && seen.count("done")) problem += " a done event, yet " + status;
      if (!problem.empty() && ++wrong <= 10) v.fail("events", *row[0] + "/" + *row[1] + ": " + problem);
    }
  }
  if (wrong > 10) v.fail("events", std::to_string(wrong - 10) + " more");
  int repeats = 0;
  for (const auto& [id, n] : publications) repeats += n - 1;
  v.figures["events"] = std::to_string(publications.size()) + " (" + std::to_string(repeats) + " repeats)";
  if (repeats > 0 && w.kills_ == 0)
    v.fail("events", std::to_string(repeats) + " event(s) published twice with no host killed");
}

void check_logs(World& w, Verdict& v) {
  for (const auto& log : w.logs_) {
    const std::string text = read_file(log);
    for (const char* bad : {"AddressSanitizer", "runtime error:", "bug:", "terminate called", "Segmentation fault",
                            "Assertion", "LeakSanitizer", "ThreadSanitizer"})
      if (text.find(bad) != std::string::npos) v.fail("clean", log.filename().string() + " reports \"" + bad + "\"");
  }
  for (const auto& p : w.problems_) v.fail("clean", p);
}

}  // namespace idemsink::torture
