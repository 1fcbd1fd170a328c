// The engine's doors: what a record's stages report back to the engine, one
// function per event, all on the engine thread. The stages (claimer,
// dispatcher, local_tx, outcome_writer, route_health) hold the engine as
// this interface and reach no further into it; `kLife` in stage.cc names the
// function that takes each step of a record's life (a door, or what a door
// hands the record to), so the table is the map of the loop.
//
// A report can outlive its record (a partition revoked meanwhile, a call
// past its deadline): a door looks the record up with `at()`, by its id and
// the stage the report is for, before acting.
#pragma once

#include <idemsink/plugin_abi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/pipeline/claimer.h"
#include "core/pipeline/local_tx.h"
#include "core/pipeline/outcome_writer.h"
#include "core/pipeline/record.h"

namespace idemsink::pipeline {

class EngineDoors {
 public:
  /// The record of an id, or null once it has ended.
  virtual Record* find(uint64_t id) = 0;
  /// The record of an id if it is still at `stage`: a report for a record
  /// that has moved on (or ended) finds nothing.
  Record* at(uint64_t id, Stage stage) {
    Record* r = find(id);
    return r != nullptr && r->stage == stage ? r : nullptr;
  }
  /// A claim job answered (Claimer): each record owned, done before, held
  /// by another host, or refused by the database.
  virtual void on_claimed(const Claimer::Claimed& claimed) = 0;
  /// A call's result, or its deadline passing as uncertain (Dispatcher); its
  /// slot is already free.
  virtual void on_call_result(Record& r, idemsink_outcome outcome, std::string detail) = 0;
  /// The record's claim was taken over before its call (Dispatcher's
  /// confirmation): it was not called, and is claimed again.
  virtual void on_fenced(Record& r) = 0;
  /// Every record a half-open route holds has been its probe already
  /// (Dispatcher): the route wants a fresh record to probe with.
  virtual void on_probe_wanted(Route& route) = 0;
  /// An apply job of a local_tx route ended (LocalTxRunner): each record
  /// committed with its done mark, fenced, refused, or not applied.
  virtual void on_local_tx_results(std::vector<LocalTxRunner::Result> results) = 0;
  /// A write job ended (OutcomeWriter): each record's outcome durable,
  /// fenced, refused, or given up.
  virtual void on_written(const std::vector<OutcomeWriter::Written>& written) = 0;
  /// A route's probe fell due (RouteHealth): calls may start.
  virtual void on_calls_may_start() = 0;

 protected:
  virtual ~EngineDoors() = default;
};

}  // namespace idemsink::pipeline
