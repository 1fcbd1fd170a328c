#include "core/pipeline/outcome_writer.h"

#include "core/pipeline/engine_doors.h"

#include "core/common/fault.h"
#include "core/db/isolate.h"
#include "core/dlq/headers.h"
#include "core/pipeline/record_outputs.h"

namespace idemsink::pipeline {

namespace asio = boost::asio;
using claim::Status;

namespace {
constexpr int kMaxJobs = 2;  // per kind of write
}

OutcomeWriter::OutcomeWriter(asio::io_context& io, db::Pool& pool, const config::Config& cfg,
                             const claim::ClaimStore& store, const dlq::Outbox& outbox, EngineDoors& doors)
    : io_(io),
      pool_(pool),
      cfg_(cfg),
      store_(store),
      outbox_(outbox),
      doors_(doors),
      done_(kMaxJobs),
      terminal_(kMaxJobs),
      dead_letters_(kMaxJobs),
      forwards_(kMaxJobs),
      linger_timer_(io) {}

bool OutcomeWriter::idle() const {
  return done_.idle() && terminal_.idle() && dead_letters_.idle() && forwards_.idle();
}

void OutcomeWriter::flush() {
  flush_done();
  flush_terminal();
  flush_dead_letters();
  flush_forwards();
}

void OutcomeWriter::done(Record& r) {
  r.move_to(Stage::Finishing);
  done_.push(r.id);
  // Completions wait a little to be marked done together, unless a poll's
  // worth is already waiting.
  if (done_.size() >= static_cast<size_t>(cfg_.kafka.max_poll_records) || cfg_.claim.flush_linger.count() == 0) {
    if (done_.schedule())
      asio::post(io_, [this] {
        done_.flushing();
        flush_done();
      });
  } else if (done_.size() == 1) {
    linger_timer_.expires_after(cfg_.claim.flush_linger);
    linger_timer_.async_wait([this](boost::system::error_code ec) {
      if (!ec) flush_done();
    });
  }
}

void OutcomeWriter::end(Record& r, Status status, dlq::Reason reason) {
  r.move_to(Stage::Finishing);
  terminal_.push(Terminal{r.id, status, reason});
  if (terminal_.schedule())
    asio::post(io_, [this] {
      terminal_.flushing();
      flush_terminal();
    });
}

void OutcomeWriter::dead_letter(Record& r) {
  r.move_to(Stage::DeadLettering);
  dead_letters_.push(r.id);
  if (dead_letters_.schedule())
    asio::post(io_, [this] {
      dead_letters_.flushing();
      flush_dead_letters();
    });
}

void OutcomeWriter::forward(Record& r) {
  r.move_to(Stage::Finishing);
  forwards_.push(r.id);
  if (forwards_.schedule())
    asio::post(io_, [this] {
      forwards_.flushing();
      flush_forwards();
    });
}

void OutcomeWriter::report(std::vector<Written> written) {
  asio::post(io_, [this, written = std::move(written)] {
    // The job slot is free again before the engine acts on the results.
    switch (written.front().kind) {
      case Kind::Done: done_.job_done(); break;
      case Kind::Ended: terminal_.job_done(); break;
      case Kind::DeadLettered: dead_letters_.job_done(); break;
      case Kind::Forwarded: forwards_.job_done(); break;
    }
    doors_.on_written(written);
    flush();
  });
}

db::Pool::GiveUp OutcomeWriter::give_up(Kind kind, std::vector<uint64_t> ids, std::vector<Status> statuses) {
  return [this, kind, ids = std::move(ids), statuses = std::move(statuses)](const db::DbError& e) {
    std::vector<Written> written;
    for (size_t i = 0; i < ids.size(); ++i)
      written.push_back({kind, ids[i], Result::GaveUp, statuses.empty() ? Status::Pending : statuses[i], e.what()});
    report(std::move(written));
  };
}

void OutcomeWriter::flush_done() {
  const size_t batch_max = static_cast<size_t>(cfg_.kafka.max_poll_records);
  for (auto ids = done_.take(batch_max); !ids.empty(); ids = done_.take(batch_max)) {
    std::vector<claim::Outcome> outcomes;
    std::vector<std::optional<dlq::Letter>> events;
    bool any_event = false;
    for (uint64_t id : ids) {
      const Record& r = *doors_.find(id);
      outcomes.push_back(r.outcome());
      events.push_back(event_of(r, Status::Done, r.receipt, "", cfg_.host.id));
      any_event = any_event || events.back().has_value();
    }
    pool_.submit(
        "mark done",
        [this, ids, outcomes = std::move(outcomes), events = std::move(events), any_event](db::Connection& c) {
          std::vector<Written> written(ids.size());
          auto rejected = db::write_isolating(c, ids.size(), [&](size_t first, size_t n) {
            // With outcome events the mark and the events commit together: an
            // event exists if and only if its record is done.
            if (any_event) c.begin();
            auto ok = store_.mark_done(c, std::span(outcomes).subspan(first, n));
            std::vector<dlq::Letter> written_events;
            for (size_t i = 0; i < n; ++i) {
              written[first + i] = {
                  Kind::Done, ids[first + i], ok[i] ? Result::Written : Result::Fenced, Status::Done, {}};
              if (ok[i] && events[first + i]) written_events.push_back(*events[first + i]);
            }
            if (any_event) {
              outbox_.insert(c, written_events);
              c.commit();
            }
          });
          for (const auto& r : rejected)
            written[r.index] = {Kind::Done, ids[r.index], Result::Rejected, Status::Done, r.error.what()};
          fault::hit("after_mark_done");
          report(std::move(written));
        },
        give_up(Kind::Done, ids));
  }
}

void OutcomeWriter::flush_terminal() {
  const size_t batch_max = static_cast<size_t>(cfg_.kafka.max_poll_records);
  for (auto terms = terminal_.take(batch_max); !terms.empty(); terms = terminal_.take(batch_max)) {
    std::vector<uint64_t> ids;
    std::vector<Status> statuses;
    std::vector<claim::Outcome> outcomes;
    std::vector<dlq::Letter> letters;
    std::vector<Beside> besides;
    for (const auto& t : terms) {
      const Record& r = *doors_.find(t.id);
      ids.push_back(t.id);
      statuses.push_back(t.status);
      outcomes.push_back(r.outcome());
      besides.push_back(
          Beside{event_of(r, t.status, "", dlq::to_string(t.reason), cfg_.host.id), hold_of(r, t.status)});
      letters.push_back(letter_of(r, t.reason));
      // An unknown that reconciliation can settle needs no person yet.
      if (t.status == Status::Unknown && r.route->handler->can_reconcile() && cfg_.claim.reconcile_interval.count() > 0)
        letters.back().hold = cfg_.claim.unknown_dlq_after;
    }
    pool_.submit(
        "mark failed/unknown",
        [this, ids, statuses, outcomes = std::move(outcomes), letters = std::move(letters),
         besides = std::move(besides)](db::Connection& c) {
          std::vector<Written> written(ids.size());
          auto rejected = db::write_isolating(c, ids.size(), [&](size_t first, size_t n) {
            // The terminal state, the outbox row, the event and the hold
            // commit together: once the offset moves past the record, its DLQ
            // entry cannot be lost.
            std::vector<claim::Outcome> failed, unknown;
            for (size_t i = first; i < first + n; ++i)
              (statuses[i] == Status::Failed ? failed : unknown).push_back(outcomes[i]);
            c.begin();
            auto ok_failed = store_.mark_terminal(c, Status::Failed, failed);
            auto ok_unknown = store_.mark_terminal(c, Status::Unknown, unknown);
            std::vector<dlq::Letter> keep;
            std::vector<claim::OrderHold> holds;
            size_t fi = 0, ui = 0;
            for (size_t i = first; i < first + n; ++i) {
              const bool ok = statuses[i] == Status::Failed ? ok_failed[fi++] : ok_unknown[ui++];
              written[i] = {Kind::Ended, ids[i], ok ? Result::Written : Result::Fenced, statuses[i], {}};
              if (!ok) continue;
              keep.push_back(letters[i]);
              if (besides[i].event) keep.push_back(*besides[i].event);
              if (besides[i].hold) holds.push_back(*besides[i].hold);
            }
            outbox_.insert(c, keep);
            claim::OrderHolds::add(c, holds);
            c.commit();
          });
          for (const auto& r : rejected)
            written[r.index] = {Kind::Ended, ids[r.index], Result::Rejected, statuses[r.index], r.error.what()};
          report(std::move(written));
        },
        give_up(Kind::Ended, ids, statuses));
  }
}

void OutcomeWriter::flush_dead_letters() {
  const size_t batch_max = static_cast<size_t>(cfg_.kafka.max_poll_records);
  for (auto ids = dead_letters_.take(batch_max); !ids.empty(); ids = dead_letters_.take(batch_max)) {
    std::vector<dlq::Letter> letters;
    for (uint64_t id : ids) {
      const Record& r = *doors_.find(id);
      letters.push_back(letter_of(r, r.refuse_reason));
    }
    pool_.submit(
        "dead-letter refused records",
        [this, ids, letters = std::move(letters)](db::Connection& c) {
          std::vector<Written> written(ids.size());
          for (size_t i = 0; i < ids.size(); ++i)
            written[i] = {Kind::DeadLettered, ids[i], Result::Written, Status::Failed, {}};
          auto rejected = db::write_isolating(
              c, ids.size(), [&](size_t first, size_t n) { outbox_.insert(c, std::span(letters).subspan(first, n)); });
          for (const auto& r : rejected)
            written[r.index] = {Kind::DeadLettered, ids[r.index], Result::Rejected, Status::Failed, r.error.what()};
          report(std::move(written));
        },
        give_up(Kind::DeadLettered, ids));
  }
}

void OutcomeWriter::flush_forwards() {
  const int64_t now = wall_clock_ms();
  for (auto ids = forwards_.take(forwards_.size()); !ids.empty(); ids = forwards_.take(forwards_.size())) {
    std::vector<claim::Outcome> releases;
    std::vector<dlq::Letter> letters;
    std::vector<std::optional<claim::OrderHold>> holds;
    for (uint64_t id : ids) {
      const Record& r = *doors_.find(id);
      const config::RouteConfig& rc = r.route->cfg;
      releases.push_back(r.outcome());
      holds.push_back(hold_of(r, Status::Pending));
      dlq::Letter d = letter_of(r, dlq::Reason::Retry);
      d.purpose = dlq::Purpose::Forward;
      d.topic = rc.retry_topic(r.tier + 1);
      d.headers.push_back({dlq::headers::kRetryDueMs, std::to_string(now + rc.retry.topics[r.tier].count())});
      d.headers.push_back({dlq::headers::kRetryTier, std::to_string(r.tier + 1)});
      if (r.tier == 0) {
        d.headers.push_back({dlq::headers::kOriginTopic, r.part->tp.topic});
        d.headers.push_back({dlq::headers::kOriginPartition, std::to_string(r.part->tp.partition)});
        d.headers.push_back({dlq::headers::kOriginOffset, std::to_string(r.offset)});
      }
      letters.push_back(std::move(d));
    }
    pool_.submit(
        "forward to retry topics",
        [this, ids, releases = std::move(releases), letters = std::move(letters),
         holds = std::move(holds)](db::Connection& c) {
          std::vector<Written> written(ids.size());
          for (size_t i = 0; i < ids.size(); ++i)
            written[i] = {Kind::Forwarded, ids[i], Result::Written, Status::Pending, {}};
          auto rejected = db::write_isolating(c, ids.size(), [&](size_t first, size_t n) {
            // The forward and its entity's hold commit together: the record's
            // later ones wait for it from the moment its offset may move on.
            std::vector<claim::OrderHold> entity_holds;
            for (size_t i = first; i < first + n; ++i)
              if (holds[i]) entity_holds.push_back(*holds[i]);
            c.begin();
            store_.release(c, std::span(releases).subspan(first, n));
            outbox_.insert(c, std::span(letters).subspan(first, n));
            claim::OrderHolds::add(c, entity_holds);
            c.commit();
          });
          for (const auto& r : rejected)
            written[r.index] = {Kind::Forwarded, ids[r.index], Result::Rejected, Status::Pending, r.error.what()};
          report(std::move(written));
        },
        give_up(Kind::Forwarded, ids));
  }
}

dlq::Letter OutcomeWriter::letter_of(const Record& r, dlq::Reason reason) const {
  dlq::Letter d;
  d.route = r.route->cfg.name;
  d.topic = r.route->cfg.dlq.enabled ? r.route->cfg.dlq.topic : "";
  if (!r.biz_key.empty()) d.biz_key = r.biz_key;
  d.reason = dlq::to_string(reason);
  d.error = r.last_error;
  d.source() = r.source();
  // The copy keeps at most route.max_record_bytes of key and value (all of
  // it but for a record refused as too large), so every outbox row fits a
  // statement and a DLQ record.
  // A record whose row the database refused once gets a copy stripped to
  // what cannot be refused: no payload, no headers but the database's error.
  const auto cap = r.db_error.empty() ? static_cast<size_t>(r.route->cfg.max_record_bytes) : 0;
  const size_t key_len = std::min(r.msg->key_len, cap);
  const size_t value_len = std::min(r.msg->len, cap - key_len);
  if (r.msg->key) d.key = std::string(static_cast<const char*>(r.msg->key), key_len);
  if (r.msg->payload) d.value = std::string(static_cast<const char*>(r.msg->payload), value_len);
  rd_kafka_headers_t* hdrs = nullptr;
  if (!r.db_error.empty()) {
    d.headers.push_back({dlq::headers::kDbError, r.db_error});
  } else if (!r.write_refused.empty()) {
    d.headers.push_back({dlq::headers::kDbError, r.write_refused});
  }
  if (r.db_error.empty() && rd_kafka_message_headers(r.msg.get(), &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
    const char* name;
    const void* value;
    size_t size;
    for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; ++i) {
      if (dlq::headers::replaced_on_republish(name)) continue;
      dlq::StoredHeader h{name, std::nullopt};
      if (value) h.value = std::string(static_cast<const char*>(value), size);
      d.headers.push_back(std::move(h));
    }
  }
  if (r.db_error.empty() && (key_len < r.msg->key_len || value_len < r.msg->len))
    d.headers.push_back({dlq::headers::kPayloadCut, std::to_string(r.msg->key_len) + "," + std::to_string(r.msg->len)});
  if (r.uncertain_calls > 0) d.headers.push_back({dlq::headers::kUncertainCalls, std::to_string(r.uncertain_calls)});
  const int64_t now = wall_clock_ms();
  d.timestamp_ms = r.timestamp_ms < 0 ? now : r.timestamp_ms;
  d.idem_token = r.token;
  d.calls = r.calls;
  d.first_failure_ms = r.first_failure_ms ? r.first_failure_ms : now;
  d.last_failure_ms = r.last_failure_ms ? r.last_failure_ms : d.first_failure_ms;
  d.host = cfg_.host.id;
  return d;
}

}  // namespace idemsink::pipeline
