// The failure policy, decision by decision: every kind x outcome, in place
// and with retry topics, and the rules applied right after a claim.
#define BOOST_TEST_MODULE failure_policy
#include <boost/test/unit_test.hpp>

#include "core/pipeline/failure_policy.h"

using namespace idemsink;
using namespace idemsink::pipeline;
using Action = Decision::Action;
using claim::Status;
using dlq::Reason;

namespace {

config::RetryConfig in_place(int max_attempts) {
  config::RetryConfig r;
  r.max_attempts = max_attempts;
  r.backoff_initial = std::chrono::milliseconds(100);
  r.backoff_max = std::chrono::milliseconds(1000);
  return r;
}

config::RetryConfig by_topics(size_t tiers) {
  config::RetryConfig r = in_place(5);
  r.topics.assign(tiers, std::chrono::milliseconds(1000));
  return r;
}

constexpr idemsink_kind kKinds[] = {IDEMSINK_KIND_REMOTE_IDEMPOTENT, IDEMSINK_KIND_REMOTE_AT_MOST_ONCE,
                                    IDEMSINK_KIND_LOCAL_TX};

}  // namespace

BOOST_AUTO_TEST_CASE(ok_is_done_and_permanent_is_failed_for_every_kind) {
  for (auto kind : kKinds) {
    BOOST_TEST_CONTEXT("kind " << kind) {
      BOOST_TEST((decide_after_call(kind, IDEMSINK_OUTCOME_OK, 1, 0, in_place(5), false).action == Action::Done));
      const Decision perm = decide_after_call(kind, IDEMSINK_OUTCOME_PERMANENT, 1, 0, in_place(5), false);
      BOOST_TEST((perm.action == Action::End));
      BOOST_TEST((perm.status == Status::Failed));
      BOOST_TEST((perm.reason == Reason::Permanent));
    }
  }
}

BOOST_AUTO_TEST_CASE(retryable_retries_until_max_attempts_then_fails) {
  for (auto kind : kKinds) {
    BOOST_TEST_CONTEXT("kind " << kind) {
      for (uint32_t calls = 1; calls < 3; ++calls)
        BOOST_TEST((decide_after_call(kind, IDEMSINK_OUTCOME_RETRYABLE, calls, 0, in_place(3), false).action ==
                    Action::Retry));
      const Decision last = decide_after_call(kind, IDEMSINK_OUTCOME_RETRYABLE, 3, 0, in_place(3), false);
      BOOST_TEST((last.action == Action::End));
      BOOST_TEST((last.status == Status::Failed));
      BOOST_TEST((last.reason == Reason::RetriesExhausted));
    }
  }
}

BOOST_AUTO_TEST_CASE(uncertain_is_retried_with_the_same_token_except_at_most_once) {
  // Idempotent remotes de-duplicate the token; a local_tx write that did not
  // report ok was rolled back: both are retried.
  BOOST_TEST((
      decide_after_call(IDEMSINK_KIND_REMOTE_IDEMPOTENT, IDEMSINK_OUTCOME_UNCERTAIN, 1, 0, in_place(5), false).action ==
      Action::Retry));
  BOOST_TEST((decide_after_call(IDEMSINK_KIND_LOCAL_TX, IDEMSINK_OUTCOME_UNCERTAIN, 1, 0, in_place(5), false).action ==
              Action::Retry));
  // An at-most-once call that may have happened is never made again.
  const Decision d =
      decide_after_call(IDEMSINK_KIND_REMOTE_AT_MOST_ONCE, IDEMSINK_OUTCOME_UNCERTAIN, 1, 0, in_place(5), false);
  BOOST_TEST((d.action == Action::End));
  BOOST_TEST((d.status == Status::Unknown));
  BOOST_TEST((d.reason == Reason::Uncertain));
}

BOOST_AUTO_TEST_CASE(retry_topics_forward_tier_by_tier_then_fail) {
  const auto retry = by_topics(2);
  for (auto kind : {IDEMSINK_KIND_REMOTE_IDEMPOTENT, IDEMSINK_KIND_LOCAL_TX}) {
    BOOST_TEST_CONTEXT("kind " << kind) {
      // Attempts do not matter with retry topics: the tiers do.
      BOOST_TEST((decide_after_call(kind, IDEMSINK_OUTCOME_RETRYABLE, 9, 0, retry, false).action == Action::Forward));
      BOOST_TEST((decide_after_call(kind, IDEMSINK_OUTCOME_UNCERTAIN, 1, 1, retry, false).action == Action::Forward));
      const Decision last = decide_after_call(kind, IDEMSINK_OUTCOME_RETRYABLE, 1, 2, retry, false);
      BOOST_TEST((last.action == Action::End));
      BOOST_TEST((last.reason == Reason::RetriesExhausted));
    }
  }
  BOOST_TEST(
      (decide_after_call(IDEMSINK_KIND_REMOTE_AT_MOST_ONCE, IDEMSINK_OUTCOME_UNCERTAIN, 1, 0, retry, false).status ==
       Status::Unknown));
  BOOST_TEST(
      (decide_after_call(IDEMSINK_KIND_REMOTE_AT_MOST_ONCE, IDEMSINK_OUTCOME_PERMANENT, 1, 0, retry, false).status ==
       Status::Failed));
}

BOOST_AUTO_TEST_CASE(a_record_that_may_have_been_applied_never_ends_failed) {
  for (auto kind : kKinds) {
    BOOST_TEST_CONTEXT("kind " << kind) {
      // Out of attempts, or rejected, after a call that may have applied it.
      for (auto d : {decide_after_call(kind, IDEMSINK_OUTCOME_RETRYABLE, 5, 0, in_place(5), true),
                     decide_after_call(kind, IDEMSINK_OUTCOME_PERMANENT, 2, 0, in_place(5), true),
                     decide_after_call(kind, IDEMSINK_OUTCOME_RETRYABLE, 1, 2, by_topics(2), true)}) {
        BOOST_TEST((d.action == Action::End));
        BOOST_TEST((d.status == Status::Unknown));
        BOOST_TEST((d.reason == Reason::MaybeApplied));
      }
      // Retries go on as before, and ok is done.
      BOOST_TEST(
          (decide_after_call(kind, IDEMSINK_OUTCOME_RETRYABLE, 1, 0, in_place(5), true).action == Action::Retry));
      BOOST_TEST((decide_after_call(kind, IDEMSINK_OUTCOME_OK, 5, 0, in_place(5), true).action == Action::Done));
    }
  }
}

BOOST_AUTO_TEST_CASE(after_a_claim_crash_loops_and_maybe_called_records_park_as_unknown) {
  claim::ClaimResult fresh;
  fresh.verdict = claim::Verdict::Owned;
  for (auto kind : kKinds) BOOST_TEST((decide_on_claim(kind, fresh, 5).action == Action::Proceed));

  // Taken from an owner that died before the call mark: never sent, so called.
  claim::ClaimResult taken = fresh;
  taken.taken_over = true;
  taken.previous_owner_vanished = true;
  taken.takeovers = 4;
  for (auto kind : kKinds) BOOST_TEST((decide_on_claim(kind, taken, 5).action == Action::Proceed));

  // The mark is set: the call may have gone out. Whether the owner vanished
  // or released the row since (a revocation during the takeover) is the same.
  for (bool vanished_owner : {true, false}) {
    claim::ClaimResult marked = taken;
    marked.previous_owner_vanished = vanished_owner;
    marked.maybe_called = true;
    BOOST_TEST((decide_on_claim(IDEMSINK_KIND_REMOTE_IDEMPOTENT, marked, 5).action == Action::Proceed));
    const Decision vanished = decide_on_claim(IDEMSINK_KIND_REMOTE_AT_MOST_ONCE, marked, 5);
    BOOST_TEST((vanished.status == Status::Unknown));
    BOOST_TEST((vanished.reason == Reason::OwnerVanished));
  }

  taken.takeovers = 5;
  for (auto kind : kKinds) {
    // The dead owners may have called: reconciliation asks the remote...
    claim::ClaimResult marked = taken;
    marked.maybe_called = true;
    const Decision loop = decide_on_claim(kind, marked, 5);
    BOOST_TEST((loop.status == Status::Unknown));
    BOOST_TEST((loop.reason == Reason::CrashLoop));
    BOOST_TEST(loop.error.find("5 times") != std::string::npos);
  }
  // ...unless the record is at-most-once and no call ever started.
  const Decision never_called = decide_on_claim(IDEMSINK_KIND_REMOTE_AT_MOST_ONCE, taken, 5);
  BOOST_TEST((never_called.status == Status::Failed));
  BOOST_TEST((never_called.reason == Reason::CrashLoop));

  // Released cleanly (revoke, shutdown, forward): no call was outstanding.
  claim::ClaimResult released = fresh;
  released.taken_over = true;
  released.takeovers = 0;
  BOOST_TEST((decide_on_claim(IDEMSINK_KIND_REMOTE_AT_MOST_ONCE, released, 5).action == Action::Proceed));
}

BOOST_AUTO_TEST_CASE(backoff_is_full_jitter_under_a_doubling_cap) {
  std::mt19937_64 rng(42);
  const auto retry = in_place(10);
  for (uint32_t calls = 1; calls <= 6; ++calls) {
    const int64_t cap = std::min<int64_t>(1000, 100LL << (calls - 1));
    int64_t seen_max = 0;
    for (int i = 0; i < 2000; ++i) {
      const auto w = backoff(retry, calls, rng).count();
      BOOST_TEST(w >= 0);
      BOOST_TEST(w <= cap);
      seen_max = std::max(seen_max, w);
    }
    BOOST_TEST(seen_max > cap * 9 / 10, "jitter should span [0, " << cap << "]");
  }
}
