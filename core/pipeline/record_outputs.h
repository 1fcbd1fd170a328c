// What a record leaves in the database besides its claim, written in the
// transaction of its outcome: its outcome event ([route.output],
// dlq/outcome_event.h) and, on an ordered route ([route.order_by]), the hold
// that keeps its entity's later records waiting while it is unfinished
// (claim/order_hold.h).
#pragma once

#include <optional>
#include <string>

#include "core/claim/order_hold.h"
#include "core/dlq/outbox.h"
#include "core/pipeline/record.h"

namespace idemsink::pipeline {

/// The record's outcome event, if its route publishes one for `outcome`
/// (`receipt`: a done one's; `reason`: the DLQ reason of a failed or unknown one).
std::optional<dlq::Letter> event_of(const Record& r, claim::Status outcome, std::string_view receipt,
                                    std::string_view reason, const std::string& host);

/// The hold of an ordered route's record that leaves the host unfinished
/// (forwarded to a retry topic), or ends `outcome` on a route that holds its
/// entity on a dead record; none otherwise.
std::optional<claim::OrderHold> hold_of(const Record& r, claim::Status outcome);

}  // namespace idemsink::pipeline
