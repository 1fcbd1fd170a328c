#include "core/pipeline/failure_policy.h"

#include <algorithm>
#include <cmath>

namespace idemsink::pipeline {

using Action = Decision::Action;
using claim::Status;
using dlq::Reason;

Decision decide_on_claim(idemsink_kind kind, const claim::ClaimResult& claim, int max_takeovers) {
  const bool at_most_once = kind == IDEMSINK_KIND_REMOTE_AT_MOST_ONCE;
  if (claim.taken_over && claim.takeovers >= static_cast<uint32_t>(max_takeovers)) {
    const std::string why = "claim was taken over from a vanished owner " + std::to_string(claim.takeovers) +
                            " times (claim.max_takeovers): the record may be killing its host";
    // An at-most-once record carries a call mark: without one, no call ever started.
    if (at_most_once && !claim.maybe_called && claim.uncertain_calls == 0)
      return {Action::End, Status::Failed, Reason::CrashLoop, why + "; it was never called"};
    return {Action::End, Status::Unknown, Reason::CrashLoop, why + ", and a call may have gone out"};
  }
  if (at_most_once && claim.uncertain_calls > 0)
    return {Action::End, Status::Unknown, Reason::MaybeApplied,
            "an earlier claim's call may have sent it; an at-most-once handler is never called twice"};
  // The call mark is written before every at-most-once call and kept through
  // releases: a row without it was certainly never sent, whoever held it.
  if (at_most_once && claim.maybe_called)
    return {Action::End, Status::Unknown, Reason::OwnerVanished,
            "a call may have started under an owner that vanished; the effect may or may not have happened and an "
            "at-most-once handler is never called twice"};
  return {Action::Proceed};
}

Decision decide_after_call(idemsink_kind kind, idemsink_outcome outcome, uint32_t calls, size_t tier,
                           const config::RetryConfig& retry, bool maybe_applied) {
  // The end of a record that would fail: unknown if the effect may have happened.
  auto fail = [maybe_applied](Reason reason) -> Decision {
    if (maybe_applied) return {Action::End, Status::Unknown, Reason::MaybeApplied};
    return {Action::End, Status::Failed, reason};
  };
  switch (outcome) {
    case IDEMSINK_OUTCOME_OK: return {Action::Done};
    case IDEMSINK_OUTCOME_PERMANENT: return fail(Reason::Permanent);
    case IDEMSINK_OUTCOME_UNCERTAIN:
      // The call may have been applied: an at-most-once effect is never
      // called again. Idempotent remotes de-duplicate the same token, and a
      // local_tx write that did not report ok was rolled back.
      if (kind == IDEMSINK_KIND_REMOTE_AT_MOST_ONCE) return {Action::End, Status::Unknown, Reason::Uncertain};
      break;
    case IDEMSINK_OUTCOME_RETRYABLE: break;
  }
  const bool by_topic = !retry.topics.empty();
  if (by_topic ? tier >= retry.topics.size() : calls >= static_cast<uint32_t>(retry.max_attempts))
    return fail(Reason::RetriesExhausted);
  return {by_topic ? Action::Forward : Action::Retry};
}

std::chrono::milliseconds backoff(const config::RetryConfig& retry, uint32_t calls, std::mt19937_64& rng) {
  const double exp = static_cast<double>(retry.backoff_initial.count()) * std::pow(2.0, calls - 1.0);
  const auto cap = static_cast<int64_t>(std::min<double>(exp, static_cast<double>(retry.backoff_max.count())));
  return std::chrono::milliseconds(std::uniform_int_distribution<int64_t>(0, cap)(rng));
}

}  // namespace idemsink::pipeline
