// Order per entity ([route.order_by]), kept in the database: idemsink_order_hold.
//
// In memory the engine calls the records of one entity one at a time, in
// the order it consumed them (pipeline/key_queue.h). What memory cannot keep
// is a record that left the host unfinished: forwarded to a retry topic (its
// claim released, its source offset committed), or ended failed or unknown on
// a route that holds an entity on a dead record (`on_dead = "hold"`). Such a
// record gets a hold row, written in the transaction that forwards or ends it,
// and the hold is live while its claim says the record is not finished:
//
//   live   claim pending (backing off in a retry tier, or replayed), or failed
//          / unknown when the route holds on dead records
//   stale  claim done, or dead on a route that goes on; or the claim row is
//          gone (its month dropped): housekeeping deletes it
//
// A later record of the entity, on any host and after any restart or
// rebalance, is not claimed while a live hold of another record of its
// entity exists (claim Verdict::Held): it waits, uncommitted, and is asked
// again every claim.wait_recheck. A record with a hold of its own (back from
// a retry topic, or replayed) waits only for holds older than its own, so
// holds are served in the order they were made and never wait on each other
// in a circle. Records of one entity in different source partitions have no
// order between them (Kafka gives none); the holds still serialise them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/claim/claim_store.h"
#include "core/db/connection.h"

namespace idemsink::claim {

/// One record of an ordered route leaving the host unfinished.
struct OrderHold {
  RowKey claim;           // the record's claim row
  std::string order_key;  // its entity
  std::string origin_topic;
  int32_t origin_partition = 0;
  int64_t origin_offset = 0;
};

/// A record of an ordered route asking whether it may be claimed.
struct OrderAsk {
  std::string ns;
  std::string order_key;
  std::string biz_key;
  bool hold_on_dead = false;  // the route's on_dead = "hold"
};

/// A live hold, as `idemsink order-holds` lists it.
struct ListedHold {
  uint64_t id = 0;
  std::string ns;
  std::string order_key;
  std::string biz_key;
  Status status = Status::Pending;  // its claim's
  std::string origin;               // "topic[partition]@offset"
  std::string since;
};

class OrderHolds {
 public:
  static const char* schema();

  /// Writes holds in the caller's transaction; one per claim (a record
  /// forwarded again keeps its first hold, and with it its place).
  static void add(db::Connection& c, std::span<const OrderHold> holds);

  /// Per ask: whether a live hold of another record of its entity comes
  /// before it (older than its own hold, or any when it has none).
  static std::vector<bool> blocked(db::Connection& c, std::span<const OrderAsk> asks);

  /// Deletes up to `batch` holds that hold nothing any more (claim done or
  /// gone, or dead on a route not in `hold_on_dead`). Returns rows deleted.
  static uint64_t purge_stale(db::Connection& c, std::span<const std::string> hold_on_dead, size_t batch);

  /// Live holds, oldest first (`ns` empty: every route).
  static std::vector<ListedHold> list(db::Connection& c, const std::string& ns,
                                      std::span<const std::string> hold_on_dead, size_t limit);

  /// Live holds per route (namespace), all hosts.
  static std::map<std::string, uint64_t> live_by_route(db::Connection& c, std::span<const std::string> hold_on_dead);

  /// The hold of one claim goes (a replay on a route that goes on past dead records).
  static void release_claim(db::Connection& c, const RowKey& claim);

  /// An operator lets an entity go on: its holds are deleted. Returns rows deleted.
  static uint64_t release(db::Connection& c, const std::string& ns, const std::string& order_key);
};

}  // namespace idemsink::claim
