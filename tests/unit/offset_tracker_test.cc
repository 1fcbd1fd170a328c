#define BOOST_TEST_MODULE offset_tracker
#include <boost/test/unit_test.hpp>

#include "core/pipeline/offset_tracker.h"

using idemsink::pipeline::OffsetTracker;
using Admit = OffsetTracker::Admit;

BOOST_AUTO_TEST_CASE(empty_tracker_has_no_commit_point) {
  OffsetTracker t;
  BOOST_TEST(!t.commit_point().has_value());
}

BOOST_AUTO_TEST_CASE(the_committed_offset_is_the_commit_point_until_a_record_arrives) {
  OffsetTracker t;
  t.start_at(120);
  BOOST_TEST(*t.commit_point() == 120);
  BOOST_TEST(*t.next_expected() == 120);
  BOOST_TEST((t.add(121) == Admit::Gap));  // 120 not seen: not registered, not committable
  BOOST_TEST(*t.commit_point() == 120);
  BOOST_TEST((t.add(120) == Admit::Next));
  BOOST_TEST(*t.commit_point() == 120);
  t.complete(120);
  BOOST_TEST(*t.commit_point() == 121);
}

BOOST_AUTO_TEST_CASE(commit_point_waits_for_the_first_unresolved_record) {
  OffsetTracker t;
  for (int64_t o = 10; o < 15; ++o) BOOST_TEST((t.add(o) == Admit::Next));
  BOOST_TEST(*t.commit_point() == 10);
  BOOST_TEST(t.complete(11));
  BOOST_TEST(t.complete(13));
  BOOST_TEST(*t.commit_point() == 10);  // 10 still open: nothing past it may be committed
  BOOST_TEST(t.complete(10));
  BOOST_TEST(*t.commit_point() == 12);
  BOOST_TEST(t.complete(12));
  BOOST_TEST(*t.commit_point() == 14);
  BOOST_TEST(t.complete(14));
  BOOST_TEST(*t.commit_point() == 15);  // all durable: next offset to consume
  BOOST_TEST(t.outstanding() == 0u);
}

BOOST_AUTO_TEST_CASE(a_hole_is_not_committed_before_it_is_verified) {
  OffsetTracker t;
  t.add(5);
  BOOST_TEST((t.add(9) == Admit::Gap));  // 6..8 unexplained: maybe skipped by the consumer
  t.complete(5);
  BOOST_TEST(*t.commit_point() == 6);  // never past the hole on trust
  BOOST_TEST(*t.next_expected() == 6);
  BOOST_TEST(!t.complete(9));  // 9 was not registered
}

BOOST_AUTO_TEST_CASE(a_verified_hole_is_committed_past) {
  OffsetTracker t;
  t.add(5);
  t.skip_to(9);  // a re-read from 6 found 9 first: 6..8 are transaction markers or compacted away
  t.complete(5);
  BOOST_TEST(*t.commit_point() == 9);
  BOOST_TEST((t.add(9) == Admit::Next));
  BOOST_TEST(*t.commit_point() == 9);
  t.complete(9);
  BOOST_TEST(*t.commit_point() == 10);
  t.skip_to(12);  // a trailing marker: no record after it yet
  BOOST_TEST(*t.commit_point() == 12);
  t.skip_to(11);  // never backwards
  BOOST_TEST(*t.commit_point() == 12);
}

BOOST_AUTO_TEST_CASE(a_hole_behind_an_open_record_waits_for_it) {
  OffsetTracker t;
  t.add(1);
  t.add(2);
  t.skip_to(7);
  t.add(7);
  t.complete(2);
  t.complete(7);
  BOOST_TEST(*t.commit_point() == 1);
  t.complete(1);
  BOOST_TEST(*t.commit_point() == 8);
}

BOOST_AUTO_TEST_CASE(redelivered_or_unknown_offsets_are_refused) {
  OffsetTracker t;
  t.add(3);
  BOOST_TEST((t.add(3) == Admit::Refetch));
  BOOST_TEST((t.add(2) == Admit::Refetch));
  BOOST_TEST(!t.complete(7));
  BOOST_TEST(t.complete(3));
  BOOST_TEST(!t.complete(3));
}

BOOST_AUTO_TEST_CASE(one_stuck_record_of_200_holds_only_the_commit_point) {
  OffsetTracker t;
  for (int64_t o = 0; o < 200; ++o) t.add(o);
  for (int64_t o = 0; o < 200; ++o)
    if (o != 37) t.complete(o);
  BOOST_TEST(*t.commit_point() == 37);
  BOOST_TEST(t.outstanding() == 1u);
  t.complete(37);
  BOOST_TEST(*t.commit_point() == 200);
}

// Kafka keeps the last commit it applied: a commit the client retried can
// land after a later one and take the offset back (torture seed 12: a
// partition at its end stayed committed at 53 of 61). The late confirmation
// is believed, and the commit point is sent again.
BOOST_AUTO_TEST_CASE(a_late_commit_confirmed_below_an_earlier_one_is_sent_again) {
  using idemsink::pipeline::KafkaCommit;
  const auto t0 = KafkaCommit::Clock::now();
  KafkaCommit k;
  k.reset(19);
  BOOST_TEST(k.due(53, t0));
  k.sending(53, t0);
  BOOST_TEST(!k.due(53, t0));
  k.sending(61, t0);  // the partition reached its end
  BOOST_TEST(k.confirmed(61) == -1);
  BOOST_TEST(k.confirmed(53) == 61);                     // the retried commit of 53 landed last
  BOOST_TEST(!k.due(61, t0 + std::chrono::seconds(1)));  // an answer may still be on its way
  BOOST_TEST(k.due(61, t0 + std::chrono::seconds(6)));
  k.sending(61, t0 + std::chrono::seconds(6));
  BOOST_TEST(k.confirmed(61) == -1);
  BOOST_TEST(!k.due(61, t0 + std::chrono::seconds(20)));
}

BOOST_AUTO_TEST_CASE(a_failed_commit_is_sent_with_the_next_round) {
  using idemsink::pipeline::KafkaCommit;
  const auto t0 = KafkaCommit::Clock::now();
  KafkaCommit k;
  k.reset(-1);
  k.sending(10, t0);
  k.sending(12, t0);
  k.failed(10);  // an older round's failure: 12 is still on its way
  BOOST_TEST(!k.due(12, t0));
  k.failed(12);
  BOOST_TEST(k.due(12, t0));
}
