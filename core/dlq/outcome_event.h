// Outcome events ([route.output]): what a route did with a record, for the
// services downstream ("order O has waybill W", "account A credited").
//
// An event is an outbox row (Purpose::EventDone, EventFailed, EventUnknown)
// written in the transaction that records the outcome: the done mark (for
// local_tx, the transaction of the business write), the terminal mark with
// its dead letter, or a reconciliation's settlement. So an event exists if
// and only if its outcome does, the source offset moves past the record only
// once both are durable, and the relay publishes it like a dead letter. After
// a crash between the broker's ack and the stamp the relay publishes a row
// again: the event's `idemsink.event_id` (the claim's token, its epoch and
// the outcome) is the same both times, so a consumer drops the repeat by it;
// a record that fails, is replayed and fails again has two events (two epochs).
//
// The record published: keyed by the biz_key; the value a JSON envelope
//   {"event_id", "route", "outcome", "biz_key", "idem_token", "receipt" (JSON
//    when the receipt is JSON, else a string), "reason", "error",
//    "source": {"topic", "partition", "offset"}, "calls", "at_ms"}
// and headers idemsink.event_id, idemsink.outcome, idemsink.route,
// idemsink.outbox_id and the source record's `traceparent`, if it had one.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/common/source.h"
#include "core/claim/claim_store.h"
#include "core/config/config.h"
#include "core/dlq/outbox.h"

namespace idemsink::dlq {

/// What an event says of one record's outcome.
struct OutcomeFacts : Source {
  std::string route;
  std::string biz_key;
  std::string idem_token;
  uint32_t epoch = 0;  // the claim's attempt: the outcome was reached under it
  claim::Status outcome = claim::Status::Done;
  std::string receipt;  // done
  std::string reason;   // failed, unknown: the DLQ reason
  std::string error;
  uint32_t calls = 0;
  std::optional<std::string> traceparent;  // the source record's W3C trace context
};

/// Whether the route publishes an event for this outcome.
bool publishes_event(const config::OutputConfig& out, claim::Status outcome);

/// The event's id: the same for every publication of one claim's outcome
/// under one epoch, "<token>/<epoch>/<outcome>".
std::string event_id(std::string_view idem_token, uint32_t epoch, claim::Status outcome);

/// The outbox row of the event, by `host`.
Letter outcome_event(const config::OutputConfig& out, const OutcomeFacts& facts, const std::string& host);

/// In the caller's transaction, right after claims were settled (by
/// reconciliation or an operator): the events of the claims with these
/// tokens whose routes publish one for their new state (no traceparent: the
/// record is not at hand). Returns the events written.
size_t write_settlement_events(db::Connection& c, const config::Config& cfg, const claim::ClaimStore& store,
                               const Outbox& outbox, std::span<const std::string> idem_tokens);

}  // namespace idemsink::dlq
