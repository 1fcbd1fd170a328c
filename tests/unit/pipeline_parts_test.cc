// The pure parts of the pipeline: admission, the key queue, the batch queue,
// the circuit breaker, a record's life, the metrics' declarations.
#define BOOST_TEST_MODULE pipeline_parts
#include <boost/test/unit_test.hpp>

#include "core/config/config.h"
#include "core/pipeline/admission.h"
#include "core/pipeline/batch_queue.h"
#include "core/pipeline/circuit_breaker.h"

#include "core/pipeline/key_queue.h"
#include "core/metrics/metrics.h"
#include "core/pipeline/rate_limiter.h"
#include "core/pipeline/record.h"
#include "core/pipeline/route_filter.h"
#include "core/pipeline/stage.h"

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <map>
#include <set>
#include <sstream>

using namespace idemsink;
using namespace idemsink::pipeline;
using dlq::Reason;

namespace {

constexpr int64_t kNow = 1'800'000'000'000;  // 2027-01-15
constexpr int64_t kDay = 86'400'000;

struct Message {
  std::string key, value;
  rd_kafka_message_t raw{};
  Message(std::string k, std::string v) : key(std::move(k)), value(std::move(v)) {
    raw.key = key.empty() ? nullptr : key.data();
    raw.key_len = key.size();
    raw.payload = value.data();
    raw.len = value.size();
  }
};

config::Config cfg() {
  return config::load_string(R"(
[kafka]
bootstrap_servers = "127.0.0.1:9092"
[database]
database = "x"
[[route]]
name = "waybill"
topic = "orders"
plugin = "/dev/null"
max_record_bytes = 100
)",
                             "test.toml");
}

}  // namespace

BOOST_AUTO_TEST_CASE(admission_refuses_in_order_and_admits_the_rest) {
  const auto c = cfg();
  const auto& route = c.routes.at(0);
  KeyExtractor ex(route);
  auto refusal = [&](const Message& m, int64_t ts) {
    auto r = admit(route, c.claim, ex, pipeline::RecordView::raw(&m.raw), ts, kNow);
    return std::holds_alternative<Refusal>(r) ? std::get<Refusal>(r).reason : Reason::Retry;
  };
  BOOST_TEST((refusal(Message("k", std::string(100, 'v')), kNow) == Reason::RecordTooLarge));
  BOOST_TEST((refusal(Message("", "v"), kNow) == Reason::MissingKey));
  BOOST_TEST((refusal(Message("k", "v"), -1) == Reason::MissingTimestamp));
  const int64_t horizon = (c.claim.retention_days - c.claim.horizon_margin_days) * kDay;
  BOOST_TEST((refusal(Message("k", "v"), kNow - horizon - 1) == Reason::BeyondReplayHorizon));
  BOOST_TEST((refusal(Message("k", "v"), kNow + c.claim.max_future_skew.count() + 1) == Reason::TimestampInFuture));
  Message ok("order-7", "v");
  auto admitted = admit(route, c.claim, ex, pipeline::RecordView::raw(&ok.raw), kNow - horizon + kDay, kNow);
  BOOST_REQUIRE(std::holds_alternative<std::string>(admitted));
  BOOST_TEST(std::get<std::string>(admitted) == "order-7");
}

BOOST_AUTO_TEST_CASE(admission_refuses_keys_longer_than_the_claim_column) {
  auto c = cfg();
  c.routes[0].max_record_bytes = 10'000;
  KeyExtractor ex(c.routes[0]);
  Message long_key(std::string(256, 'k'), "v");
  auto r = admit(c.routes[0], c.claim, ex, pipeline::RecordView::raw(&long_key.raw), kNow, kNow);
  BOOST_REQUIRE(std::holds_alternative<Refusal>(r));
  BOOST_TEST((std::get<Refusal>(r).reason == Reason::BizKeyTooLong));
}

BOOST_AUTO_TEST_CASE(key_queue_runs_one_record_per_key_in_arrival_order) {
  KeyQueue q;
  BOOST_TEST(q.push("a", 1));
  BOOST_TEST(!q.push("a", 2));
  BOOST_TEST(!q.push("a", 3));
  BOOST_TEST(q.push("b", 4));  // other keys run in parallel
  BOOST_TEST(q.keys() == 2u);
  // A record behind the first leaves without promoting anyone (dropped on revoke).
  BOOST_TEST(!q.remove("a", 2).has_value());
  BOOST_TEST(*q.remove("a", 1) == 3u);  // the first finishes: the next in line goes
  BOOST_TEST(!q.remove("a", 3).has_value());
  BOOST_TEST(!q.remove("b", 4).has_value());
  BOOST_TEST(q.keys() == 0u);
  BOOST_TEST(!q.remove("gone", 9).has_value());
}

BOOST_AUTO_TEST_CASE(batch_queue_bounds_jobs_and_batches) {
  BatchQueue<int> q(2);
  BOOST_TEST(q.take(10).empty());
  for (int i = 0; i < 5; ++i) q.push(i);
  BOOST_TEST(q.schedule());
  BOOST_TEST(!q.schedule());  // one flush scheduled at a time
  q.flushing();
  auto a = q.take(2);
  auto b = q.take(2);
  BOOST_TEST(a == std::vector<int>({0, 1}));
  BOOST_TEST(b == std::vector<int>({2, 3}));
  BOOST_TEST(q.take(2).empty());  // both job slots taken
  BOOST_TEST(q.jobs() == 2);
  q.job_done();
  BOOST_TEST(q.take(2) == std::vector<int>({4}));
  q.job_done();
  q.job_done();
  BOOST_TEST(q.idle());
}

namespace {
config::CircuitConfig circuit_cfg() {
  config::CircuitConfig c;
  c.enabled = true;
  c.window = 10;
  c.failure_percent = 80;
  c.min_calls = 5;
  c.probe_initial = std::chrono::milliseconds(100);
  c.probe_max = std::chrono::milliseconds(350);
  return c;
}
}  // namespace

BOOST_AUTO_TEST_CASE(circuit_opens_at_the_failure_share_of_the_window_only) {
  const auto c = circuit_cfg();
  CircuitBreaker cb(c);
  using Change = CircuitBreaker::Change;
  // Fewer than min_calls: never opens, however bad.
  for (uint64_t id = 1; id <= 4; ++id) BOOST_TEST((cb.on_result(id, true) == Change::None));
  // 4 of 5 failed, the 5th healthy: 80% opens.
  BOOST_TEST((cb.on_result(5, false) == Change::Opened));

  CircuitBreaker healthy(c);
  // Two of every three calls failing (at most 7 of any 10) keeps it closed for good.
  for (uint64_t id = 1; id <= 200; ++id) BOOST_TEST((healthy.on_result(id, id % 3 != 1) == Change::None));
  BOOST_TEST(healthy.closed());
  BOOST_TEST(healthy.admit(999));
}

BOOST_AUTO_TEST_CASE(circuit_probes_once_backs_off_and_closes_on_a_healthy_probe) {
  const auto c = circuit_cfg();
  CircuitBreaker cb(c);
  using Change = CircuitBreaker::Change;
  for (uint64_t id = 1; id <= 4; ++id) cb.on_result(id, true);
  BOOST_TEST((cb.on_result(5, true) == Change::Opened));
  BOOST_TEST(cb.probe_wait().count() == 100);
  BOOST_TEST(!cb.admit(6));
  // A call that began before the circuit opened decides nothing.
  BOOST_TEST((cb.on_result(3, false) == Change::None));
  BOOST_TEST(!cb.closed());
  cb.probe_due();
  BOOST_TEST(cb.admit(7));   // the probe
  BOOST_TEST(cb.admit(7));   // asked again for the same record
  BOOST_TEST(!cb.admit(8));  // one probe at a time
  BOOST_TEST((cb.on_result(7, true) == Change::ProbeFailed));
  BOOST_TEST(cb.probe_wait().count() == 200);
  cb.probe_due();
  BOOST_TEST(cb.admit(8));
  cb.call_abandoned(8);  // its claim was taken over: never called
  BOOST_TEST(cb.admit(9));
  BOOST_TEST((cb.on_result(9, true) == Change::ProbeFailed));
  BOOST_TEST(cb.probe_wait().count() == 350);  // capped
  cb.probe_due();
  BOOST_TEST(cb.admit(10));
  BOOST_TEST((cb.on_result(10, false) == Change::Closed));
  BOOST_TEST(cb.closed());
  // A fresh window after closing: one failure does not re-open it.
  BOOST_TEST((cb.on_result(11, true) == Change::None));
}

BOOST_AUTO_TEST_CASE(circuit_disabled_never_opens) {
  auto c = circuit_cfg();
  c.enabled = false;
  CircuitBreaker cb(c);
  for (uint64_t id = 1; id <= 100; ++id) BOOST_TEST((cb.on_result(id, true) == CircuitBreaker::Change::None));
  BOOST_TEST(cb.admit(101));
}

// A record held in one outage, then again in the next (the circuit closed
// and reopened between): its wait starts over, so two outages shorter than
// max_wait never end it, one outage as long does.
BOOST_AUTO_TEST_CASE(circuit_wait_counts_per_open_period) {
  using namespace std::chrono_literals;
  const auto t0 = CircuitWait::Clock::time_point{} + 1h;
  CircuitWait wait;
  BOOST_TEST(!wait.over(1, 10s, t0));
  BOOST_TEST(!wait.over(1, 10s, t0 + 9s));
  BOOST_TEST(!wait.over(2, 10s, t0 + 12s));  // a new outage: 12 s in all, 0 s in this one
  BOOST_TEST(!wait.over(2, 10s, t0 + 21s));
  BOOST_TEST((wait.held_for(t0 + 21s) == 9s));
  BOOST_TEST(wait.over(2, 10s, t0 + 22s));
  BOOST_TEST(wait.over(2, 10s, t0 + 30s));  // stays over while the outage lasts
  BOOST_TEST(!wait.over(3, 10s, t0 + 31s));
}

namespace {
config::RateLimitConfig rate_cfg(int64_t rate, int64_t burst, config::RateScope scope) {
  config::RateLimitConfig c;
  c.rate = rate;
  c.per = std::chrono::seconds(1);
  c.burst = burst;
  c.scope = scope;
  c.max_hold = std::chrono::seconds(60);
  return c;
}
}  // namespace

BOOST_AUTO_TEST_CASE(rate_limiter_spends_its_burst_then_one_call_per_token) {
  using namespace std::chrono_literals;
  const auto t0 = RateLimiter::Clock::time_point{} + 1h;
  RateLimiter l(rate_cfg(50, 10, config::RateScope::Host), t0);
  int started = 0;
  while (l.try_call(t0)) ++started;
  BOOST_TEST(started == 10);                   // the burst
  BOOST_TEST((l.next_call(t0) == t0 + 20ms));  // 50/s: one token every 20 ms
  BOOST_TEST(!l.try_call(t0 + 19ms));
  BOOST_TEST(l.try_call(t0 + 20ms));
  // Over 10 s: 500 calls more, never more, whatever the polling.
  int later = 0;
  for (auto t = t0 + 20ms; t <= t0 + 10s + 20ms; t += 1ms)
    while (l.try_call(t)) ++later;
  BOOST_TEST(later == 500);
  // A token taken for a call that did not start goes back.
  const auto t1 = t0 + 20s;
  while (l.try_call(t1)) {
  }
  l.give_back();
  BOOST_TEST(l.try_call(t1));
  // No rate: always, unless held.
  RateLimiter free(rate_cfg(0, 0, config::RateScope::Group), t0);
  BOOST_TEST(free.try_call(t0));
  BOOST_TEST(free.rate_per_second() == 0.0);
}

BOOST_AUTO_TEST_CASE(rate_limiter_shares_scale_the_rate_and_holds_stop_every_call) {
  using namespace std::chrono_literals;
  const auto t0 = RateLimiter::Clock::time_point{} + 1h;
  RateLimiter l(rate_cfg(50, 0, config::RateScope::Group), t0);
  l.set_share(0.25, t0);  // one of four partitions
  BOOST_TEST(l.rate_per_second() == 12.5);
  int started = 0;
  for (auto t = t0; t < t0 + 4s; t += 1ms)
    while (l.try_call(t)) ++started;
  BOOST_TEST(started >= 50);  // 12.5 burst + 12.5/s x 4 s
  BOOST_TEST(started <= 63);
  RateLimiter host(rate_cfg(50, 0, config::RateScope::Host), t0);
  host.set_share(0.25, t0);  // per host: shares do not apply
  BOOST_TEST(host.rate_per_second() == 50.0);
  // No partitions: no calls; look again later.
  l.set_share(0, t0 + 5s);
  BOOST_TEST((l.next_call(t0 + 5s) > t0 + 5s));
  // A hold stops calls until it ends, and is capped by max_hold.
  RateLimiter h(rate_cfg(0, 0, config::RateScope::Group), t0);
  h.hold(t0 + 2s, t0);
  BOOST_TEST(!h.try_call(t0 + 1999ms));
  BOOST_TEST((h.next_call(t0 + 1s) == t0 + 2s));
  BOOST_TEST(h.try_call(t0 + 2s));
  h.hold(t0 + 1h, t0 + 2s);
  BOOST_TEST((h.held_until() == t0 + 62s));
  // The detail convention of plugin_abi.h.
  BOOST_TEST(retry_after_ms("retry-after=1500ms: HTTP 503") == 1500);
  BOOST_TEST(retry_after_ms("HTTP 503 (Retry-After: 1)") == 0);
  BOOST_TEST(retry_after_ms("retry-after=15s: x") == 0);
  BOOST_TEST(retry_after_ms("retry-after=-5ms") == 0);
}

// ---------------------------------------------------------------- a record's life

namespace {

const std::vector<Stage> kAllStages = {Stage::New,     Stage::Waiting, Stage::Claim,      Stage::Claiming,
                                       Stage::Busy,    Stage::Ready,   Stage::Confirming, Stage::LookingUp,
                                       Stage::Calling, Stage::Backoff, Stage::Finishing,  Stage::DeadLettering};

// The stages reachable from `from` by steps of the table.
std::set<Stage> reachable(Stage from) {
  std::set<Stage> seen{from};
  std::vector<Stage> todo{from};
  while (!todo.empty()) {
    const Stage at = todo.back();
    todo.pop_back();
    for (size_t i = 0; i < kLifeSteps; ++i)
      if (kLife[i].from == at && seen.insert(kLife[i].to).second) todo.push_back(kLife[i].to);
  }
  return seen;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_stage_is_reached_from_new_and_every_stage_can_reach_an_end) {
  const auto from_new = reachable(Stage::New);
  for (Stage s : kAllStages) {
    BOOST_TEST(from_new.count(s) == 1u, to_string(s) << " is never reached");
    // Every record can still end durably: its outcome written, or its letter.
    const auto onward = reachable(s);
    BOOST_TEST((onward.count(Stage::Finishing) + onward.count(Stage::DeadLettering)) > 0u,
               to_string(s) << " cannot reach an end");
    BOOST_TEST(to_string(s) != "?");
  }
}

BOOST_AUTO_TEST_CASE(each_step_is_listed_once_with_its_cause) {
  std::set<std::pair<Stage, Stage>> steps;
  for (size_t i = 0; i < kLifeSteps; ++i) {
    const Step& st = kLife[i];
    BOOST_TEST(steps.insert({st.from, st.to}).second, to_string(st.from) << " -> " << to_string(st.to) << " twice");
    BOOST_TEST(!st.why.empty());
    BOOST_TEST(allowed(st.from, st.to));
  }
  BOOST_TEST(steps.size() == kLifeSteps);
}

BOOST_AUTO_TEST_CASE(the_steps_that_would_break_the_contract_are_not_in_the_table) {
  // A call only from a held claim; an outcome only after a call, a claim
  // decision or a look-up; nothing comes back from being written but a
  // takeover (claimed again) or a refused row; nothing is new twice.
  BOOST_TEST(!allowed(Stage::New, Stage::Calling));
  BOOST_TEST(!allowed(Stage::Claim, Stage::Calling));
  BOOST_TEST(!allowed(Stage::Claiming, Stage::Calling));
  BOOST_TEST(!allowed(Stage::Busy, Stage::Ready));
  BOOST_TEST(!allowed(Stage::Waiting, Stage::Ready));
  BOOST_TEST(!allowed(Stage::Ready, Stage::Finishing));
  BOOST_TEST(!allowed(Stage::Backoff, Stage::Calling));
  BOOST_TEST(!allowed(Stage::Finishing, Stage::Ready));
  BOOST_TEST(!allowed(Stage::Finishing, Stage::Calling));
  BOOST_TEST(!allowed(Stage::DeadLettering, Stage::Claim));
  BOOST_TEST(!allowed(Stage::LookingUp, Stage::Calling));
  for (Stage s : kAllStages) BOOST_TEST(!allowed(s, Stage::New), to_string(s) << " -> new");
}

BOOST_AUTO_TEST_CASE(a_step_outside_the_table_is_logged_as_a_bug_and_taken) {
  std::ostringstream log;
  auto logger = std::make_shared<spdlog::logger>("stage_test", std::make_shared<spdlog::sinks::ostream_sink_mt>(log));
  const auto before = spdlog::default_logger();
  spdlog::set_default_logger(logger);
  Record r;
  r.move_to(Stage::Claim);
  r.move_to(Stage::Claiming);
  BOOST_TEST(log.str().empty());
  r.move_to(Stage::Calling);  // a call without a claim
  spdlog::set_default_logger(before);
  BOOST_TEST(log.str().find("bug:") != std::string::npos, log.str());
  BOOST_TEST(log.str().find("claiming -> calling") != std::string::npos, log.str());
  BOOST_TEST((r.stage == Stage::Calling));  // behaviour as before the table: the caller decides
}

BOOST_AUTO_TEST_CASE(every_declared_series_is_rendered_once_with_its_type_and_help) {
  metrics::Metrics m;
  m.route("waybill").done.store(7);
  m.route("waybill").rate_limit.store(2.5);
  m.partition("waybill", "orders", 3).assigned.store(true);
  m.partition("waybill", "orders", 4);  // revoked: its counters only
  m.slice("shop@127.0.0.1:3306");
  const std::string text = m.prometheus();
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  struct Declared {
    std::string name, type, help, series;
  };
  std::vector<Declared> declared;
  auto declare = [&](const char* name, const char* type, const char* help, const std::string& labels) {
    declared.push_back({name, type, help, name + labels});
  };
#define ROUTE(field, T, initial, type, name, help) declare(name, #type, help, "{route=\"waybill\"} ");
#define PARTITION(field, T, initial, type, name, help) \
  declare(name, #type, help, "{route=\"waybill\",topic=\"orders\",partition=\"3\"} ");
#define SLICE(field, T, initial, type, name, help) declare(name, #type, help, " ");
  IDEMSINK_ROUTE_METRICS(ROUTE)
  IDEMSINK_PARTITION_METRICS(PARTITION)
  IDEMSINK_SLICE_METRICS(SLICE)
#undef ROUTE
#undef PARTITION
#undef SLICE
  std::set<std::string> names;
  for (const auto& d : declared) {
    BOOST_TEST(names.insert(d.name).second, d.name << " declared twice");
    BOOST_TEST(d.name.rfind("idemsink_", 0) == 0, d.name);
    BOOST_TEST((d.type == "counter") == (d.name.size() > 6 && d.name.substr(d.name.size() - 6) == "_total"),
               d.name << " is a " << d.type);
    BOOST_TEST(count("# HELP " + d.name + " " + d.help + "\n") == 1u, d.name);
    BOOST_TEST(count("# TYPE " + d.name + " " + d.type + "\n") == 1u, d.name);
    BOOST_TEST(count("\n" + d.series) == 1u, d.series);
  }
  BOOST_TEST(count("\nidemsink_records_done_total{route=\"waybill\"} 7\n") == 1u);
  BOOST_TEST(count("\nidemsink_route_rate_limit{route=\"waybill\"} 2.5\n") == 1u);
  BOOST_TEST(count("\nidemsink_partition_committed_offset{route=\"waybill\",topic=\"orders\",partition=\"3\"} -1\n") ==
             1u);
  // A revoked partition keeps its counters, not its gauges.
  BOOST_TEST(count("\nidemsink_offset_gaps_total{route=\"waybill\",topic=\"orders\",partition=\"4\"} 0\n") == 1u);
  BOOST_TEST(count("\nidemsink_partition_lag{route=\"waybill\",topic=\"orders\",partition=\"4\"}") == 0u);
  BOOST_TEST(count("\nidemsink_db_healthy 1\n") == 1u);
}

// [route.when] decides from the record alone. Headers need a message
// librdkafka made; the real-Kafka mixed-topic test covers them.
BOOST_AUTO_TEST_CASE(route_filter_takes_skips_and_refuses_what_it_cannot_read) {
  const auto when = [](const std::string& condition) {
    auto c = config::load_string(R"([kafka]
bootstrap_servers = "b"
[database]
database = "x"
[[route]]
name = "waybill"
topic = "orders"
plugin = "/dev/null"
[route.when]
)" + condition,
                                 "test.toml");
    return RouteFilter(*c.routes.at(0).when);
  };
  using V = RouteFilter::Verdict;
  auto verdict = [](RouteFilter& f, const std::string& key, const std::string& value) {
    Message m(key, value);
    return f.decide(pipeline::RecordView::raw(&m.raw)).verdict;
  };

  auto type = when("json = \"event.type\"\none_of = [\"order.created\", \"order.paid\"]\n");
  BOOST_TEST((verdict(type, "k", R"({"event":{"type":"order.paid"}})") == V::Take));
  BOOST_TEST((verdict(type, "k", R"({"event":{"type":"order.shipped"}})") == V::Skip));
  BOOST_TEST((verdict(type, "k", R"({"event":{"kind":"order.paid"}})") == V::Skip));
  BOOST_TEST((verdict(type, "k", R"({"event":"order.paid"})") == V::Skip));
  BOOST_TEST((verdict(type, "k", R"({"event":{"type":["order.paid"]}})") == V::Skip));
  BOOST_TEST((verdict(type, "k", R"([1,2])") == V::Skip));
  // The route cannot tell: dead-lettered, never skipped in silence.
  BOOST_TEST((verdict(type, "k", "order.paid") == V::Undecodable));
  BOOST_TEST((verdict(type, "k", "") == V::Undecodable));
  BOOST_TEST((verdict(type, "k", R"({"event":{"type":"order.paid")") == V::Undecodable));
  Message broken("k", "{\"event\": tru}");
  const auto why = type.decide(pipeline::RecordView::raw(&broken.raw)).why;
  BOOST_TEST(why.find("not JSON") != std::string::npos, why);
  BOOST_TEST(why.find("event.type") != std::string::npos, why);

  // Numbers and booleans compare as their JSON text.
  auto amount = when("any = [{ json = \"amount\", equals = \"100\" }, { json = \"vip\", equals = \"true\" }]\n");
  BOOST_TEST((verdict(amount, "k", R"({"amount":100})") == V::Take));
  BOOST_TEST((verdict(amount, "k", R"({"amount":"100"})") == V::Take));
  BOOST_TEST((verdict(amount, "k", R"({"amount":1000,"vip":true})") == V::Take));
  BOOST_TEST((verdict(amount, "k", R"({"amount":1000,"vip":false})") == V::Skip));

  // Exists tells a null field from an absent one.
  auto has_coupon = when("json = \"coupon\"\nexists = true\n");
  BOOST_TEST((verdict(has_coupon, "k", R"({"coupon":null})") == V::Take));
  BOOST_TEST((verdict(has_coupon, "k", R"({"cupon":1})") == V::Skip));

  // A key test never parses the value, so a non-JSON value is no obstacle.
  auto key = when("all = [{ key = true, starts_with = \"cn-\" }, { not = { key = true, equals = \"cn-test\" } }]\n");
  BOOST_TEST((verdict(key, "cn-42", "not json") == V::Take));
  BOOST_TEST((verdict(key, "cn-test", "not json") == V::Skip));
  BOOST_TEST((verdict(key, "us-42", "not json") == V::Skip));
  BOOST_TEST((verdict(key, "", "not json") == V::Skip));
  auto keyless = when("key = true\nexists = false\n");
  BOOST_TEST((verdict(keyless, "", "v") == V::Take));
  BOOST_TEST((verdict(keyless, "k", "v") == V::Skip));
}
