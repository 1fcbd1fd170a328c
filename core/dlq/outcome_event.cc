#include "core/dlq/outcome_event.h"

#include <chrono>
#include <nlohmann/json.hpp>

#include "core/dlq/headers.h"

namespace idemsink::dlq {
namespace {

using claim::Status;

Purpose purpose_of(Status outcome) {
  switch (outcome) {
    case Status::Done: return Purpose::EventDone;
    case Status::Failed: return Purpose::EventFailed;
    default: return Purpose::EventUnknown;
  }
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string envelope(const OutcomeFacts& f, const std::string& id, int64_t at_ms) {
  nlohmann::json j;
  j["event_id"] = id;
  j["route"] = f.route;
  j["outcome"] = claim::to_string(f.outcome);
  j["biz_key"] = f.biz_key;
  j["idem_token"] = f.idem_token;
  if (f.outcome == Status::Done) {
    // A receipt that is JSON (an API's answer) stays JSON; anything else is text.
    if (nlohmann::json::accept(f.receipt))
      j["receipt"] = nlohmann::json::parse(f.receipt);
    else
      j["receipt"] = f.receipt;
  } else {
    j["reason"] = f.reason;
    j["error"] = f.error;
  }
  j["source"] = {{"topic", f.src_topic}, {"partition", f.src_partition}, {"offset", f.src_offset}};
  j["calls"] = f.calls;
  j["at_ms"] = at_ms;
  // Keys may hold any bytes: text that is not UTF-8 is replaced, never refused.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

bool publishes_event(const config::OutputConfig& out, Status outcome) {
  if (!out.enabled()) return false;
  switch (outcome) {
    case Status::Done: return true;
    case Status::Failed: return out.include_failed;
    case Status::Unknown: return out.include_unknown;
    case Status::Pending: return false;
  }
  return false;
}

std::string event_id(std::string_view idem_token, uint32_t epoch, Status outcome) {
  return std::string(idem_token) + "/" + std::to_string(epoch) + "/" + claim::to_string(outcome);
}

Letter outcome_event(const config::OutputConfig& out, const OutcomeFacts& f, const std::string& host) {
  const int64_t at = now_ms();
  const std::string id = event_id(f.idem_token, f.epoch, f.outcome);
  Letter d;
  d.purpose = purpose_of(f.outcome);
  d.route = f.route;
  d.topic = out.topic;
  d.biz_key = f.biz_key;
  d.reason = f.outcome == Status::Done ? "done" : f.reason;
  d.error = f.error;
  d.source() = f.source();
  d.key = f.biz_key;
  d.value = envelope(f, id, at);
  d.headers = {{headers::kEventId, id}, {headers::kOutcome, claim::to_string(f.outcome)}, {headers::kRoute, f.route}};
  if (f.traceparent) d.headers.push_back({headers::kTraceparent, *f.traceparent});
  d.timestamp_ms = at;
  d.idem_token = f.idem_token;
  d.calls = f.calls;
  d.first_failure_ms = at;
  d.last_failure_ms = at;
  d.host = host;
  d.event_id = id;
  return d;
}

size_t write_settlement_events(db::Connection& c, const config::Config& cfg, const claim::ClaimStore& store,
                               const Outbox& outbox, std::span<const std::string> idem_tokens) {
  std::vector<Letter> events;
  for (const auto& s : store.read_settled(c, idem_tokens)) {
    const config::RouteConfig* route = cfg.route_by_name(s.row.ns);
    if (route == nullptr || !publishes_event(route->output, s.status)) continue;
    OutcomeFacts f;
    f.route = s.row.ns;
    f.biz_key = s.row.biz_key;
    f.idem_token = s.idem_token;
    f.epoch = s.attempt;
    f.outcome = s.status;
    f.receipt = s.receipt;
    f.reason = "settled";
    f.error = s.last_error;
    f.source() = s.source();
    f.calls = s.calls;
    events.push_back(outcome_event(route->output, f, cfg.host.id));
  }
  outbox.insert(c, events);
  return events.size();
}

}  // namespace idemsink::dlq
