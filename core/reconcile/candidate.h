// Private to reconcile/: a claim the reconciler looks at (reconciler.cc's
// ask_hook, round.cc's rounds) and the record its plugin is handed.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "core/common/source.h"
#include "core/claim/claim_store.h"
#include "core/config/config.h"
#include "core/plugin/plugin.h"
#include "core/reconcile/reconciler.h"
#include <idemsink/plugin_abi.h>

namespace idemsink::reconcile {

struct Reconciler::Candidate : claim::ClaimFacts {
  std::optional<std::string> key, value;  // from the DLQ outbox, when the record went there
  std::string reason;                     // of its newest outbox row
  int64_t timestamp_ms = 0;
  // filled in by the rounds
  idemsink_outcome answer = IDEMSINK_OUTCOME_RETRYABLE;
  std::string detail;
  bool deferred = false;  // not asked: the route's circuit was open, or its budget left no room
  // The instance its look-up or re-drive went to, held until the round ends
  // (a reload may give the route a new one meanwhile).
  std::shared_ptr<plugin::Instance> handler;
};

// The record handed to reconcile/invoke: what the claim row and the outbox
// still know about it.
template <class C>
inline idemsink_record record_of(const C& c, const config::RouteConfig& route, uint32_t attempt) {
  idemsink_record r{};
  r.struct_size = sizeof r;
  r.route = route.name.c_str();
  r.topic = c.src_topic.c_str();
  r.partition = c.src_partition;
  r.offset = c.src_offset;
  r.timestamp_ms = c.timestamp_ms;
  if (c.key) r.key = {c.key->data(), c.key->size()};
  if (c.value) r.value = {c.value->data(), c.value->size()};
  r.biz_key = {c.row.biz_key.data(), c.row.biz_key.size()};
  r.idem_token = c.idem_token.c_str();
  r.attempt = attempt;
  r.timeout_ms = route.call_timeout.count();
  return r;
}

}  // namespace idemsink::reconcile
