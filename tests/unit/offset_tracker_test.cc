#define BOOST_TEST_MODULE offset_tracker
#include <boost/test/unit_test.hpp>

#include "core/pipeline/offset_tracker.h"

using idemsink::pipeline::OffsetTracker;

BOOST_AUTO_TEST_CASE(empty_tracker_has_no_commit_point) {
  OffsetTracker t;
  BOOST_TEST(!t.commit_point().has_value());
}

BOOST_AUTO_TEST_CASE(commit_point_waits_for_the_first_unresolved_record) {
  OffsetTracker t;
  for (int64_t o = 10; o < 15; ++o) BOOST_TEST(t.add(o));
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

BOOST_AUTO_TEST_CASE(offset_gaps_from_compaction_or_transactions_are_skipped) {
  OffsetTracker t;
  t.add(5);
  t.add(9);  // 6..8 were control records or compacted away
  t.complete(5);
  BOOST_TEST(*t.commit_point() == 9);
  t.complete(9);
  BOOST_TEST(*t.commit_point() == 10);
}

BOOST_AUTO_TEST_CASE(redelivered_or_unknown_offsets_are_refused) {
  OffsetTracker t;
  t.add(3);
  BOOST_TEST(!t.add(3));
  BOOST_TEST(!t.add(2));
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
