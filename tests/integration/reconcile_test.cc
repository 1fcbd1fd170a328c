// Reconciliation against a real MariaDB and the shipped plugins on the fake
// services, without a host: unknown claims are made as the pipeline makes
// them (claimed, marked unknown, their dead letter held), then one round is
// run. What a round settles and how: a record the remote never saw is
// re-driven on an idempotent route, whatever its attempts; a failed
// settlement is a dead letter published like any other. And that its calls
// keep to the route's gate: the limiter's waits, an open circuit (left for a
// later round), a pause the remote asked for (never counted as an attempt).
#define BOOST_TEST_MODULE reconcile
#include <boost/test/unit_test.hpp>

#include <future>
#include <map>
#include <thread>

#include "core/claim/claim_store.h"
#include "core/claim/schema.h"
#include "core/common/util.h"
#include "core/config/config.h"
#include "core/db/pool.h"
#include "core/dlq/outbox.h"
#include "core/operate/actions.h"
#include "core/operate/operator_log.h"
#include "core/reconcile/reconciler.h"
#include "core/plugin/plugin.h"
#include "devkit/mariadb_server.h"
#include "devkit/services.h"
#include "tests/support/test_kafka.h"

using namespace idemsink;
using namespace std::chrono_literals;
using claim::Status;
using pipeline::RemoteGate;

namespace {

/// A gate answering from a script per route, and recording every question.
struct ScriptedGate : RemoteGate {
  std::map<std::string, std::vector<Pass>> script;  // answers in order; Go once it runs out
  std::map<std::string, int> asked;
  std::map<std::string, std::chrono::milliseconds> holds;
  Answer try_call(const std::string& route) override {
    const int n = asked[route]++;
    auto& s = script[route];
    const Pass p = n < static_cast<int>(s.size()) ? s[static_cast<size_t>(n)] : Pass::Go;
    return {p, std::chrono::steady_clock::now() + 20ms};
  }
  void hold(const std::string& route, std::chrono::milliseconds pause) override { holds[route] = pause; }
  void probe_answered(const std::string&, uint64_t, bool) override {}
  void probe_abandoned(const std::string&, uint64_t) override {}
};

// Two routes on the fake services: waybills through the configured http
// plugin (idempotent; DOWN- orders answered 503 with Retry-After), texts
// through the shipped sms plugin (at most once).
struct World {
  devkit::FakeServices services{test::fake_services_binary()};
  config::DatabaseConfig db;
  config::Config cfg;
  std::unique_ptr<db::Connection> conn;
  claim::ClaimStore pipeline_store{"host-a", "host-a#1", 30s};
  dlq::Outbox outbox{"host-a#1", 30s};
  std::map<std::string, std::shared_ptr<plugin::Instance>> handlers;
  int64_t next_offset = 0;

  explicit World(const std::string& name) : db(devkit::MariaDbServer::shared().fresh_database(name)) {
    cfg = config::load_string(
        "[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n"
        "[database]\nhost = \"" +
            db.host + "\"\nport = " + std::to_string(db.port) + "\nuser = \"" + db.user + "\"\ndatabase = \"" +
            db.database +
            "\"\n[claim]\nreconcile_after = \"1ms\"\n"
            "[[route]]\nname = \"waybill\"\ntopic = \"orders\"\nplugin = \"" +
            test::shipped_plugin("http") + "\"\n[route.retry]\nmax_attempts = 2\n[route.options]\nendpoint = \"" +
            services.url() +
            "\"\npath = \"/waybills\"\nbody = '{\"order_id\": \"{{biz_key}}\"}'\nreceipt = \"/waybill_no\"\n"
            "lookup_path = \"/waybills/by-key/{{idem_token}}\"\n"
            "[[route]]\nname = \"sms\"\ntopic = \"texts\"\nplugin = \"" +
            test::shipped_plugin("sms") + "\"\n[route.retry]\nmax_attempts = 2\n[route.options]\nendpoint = \"" +
            services.url() + "\"\n",
        "reconcile_test.toml");
    conn = std::make_unique<db::Connection>(db);
    claim::apply_schema(*conn, std::chrono::system_clock::now(), {});
    conn->execute(dlq::Outbox::schema());
    conn->execute(operate::OperatorLog::schema());
    for (const auto& route : cfg.routes) {
      handlers[route.name] = std::make_shared<plugin::Instance>(plugin::Library::load(route.plugin), route);
    }
  }

  /// An unknown claim as the pipeline leaves it: `calls` made, its dead
  /// letter (the payload a re-drive sends) held for reconciliation.
  std::string unknown(const std::string& route, const std::string& key, uint32_t calls, const std::string& reason) {
    claim::ClaimRequest r;
    r.key = claim::RowKey{route, key, claim::bucket_of(1794000000000LL)};
    r.payload_hash = payload_hash("p");
    r.src_topic = route == "sms" ? "texts" : "orders";
    r.src_offset = next_offset++;  // one record per position, as in a topic
    const auto res = pipeline_store.claim(*conn, std::vector{r});
    BOOST_REQUIRE(res[0].verdict == claim::Verdict::Owned);
    BOOST_REQUIRE(pipeline_store.mark_terminal(
        *conn, Status::Unknown, std::vector{claim::Outcome{res[0].row, res[0].attempt, calls, 1, {}, "timeout"}})[0]);
    dlq::Letter l;
    l.route = route;
    l.topic = r.src_topic + ".dlq";
    l.biz_key = key;
    l.reason = reason;
    l.error = "timeout";
    l.src_topic = r.src_topic;
    l.src_offset = r.src_offset;
    l.key = key;
    l.value = "{\"order_id\": \"" + key + "\", \"phone\": \"+86 138\"}";
    l.idem_token = res[0].idem_token;
    l.calls = calls;
    l.host = "host-a";
    l.hold = 1h;
    outbox.insert(*conn, std::vector{l});
    // Its call began long enough ago to be asked about (claim.reconcile_after).
    conn->execute("UPDATE idemsink_claim SET updated_at = updated_at - INTERVAL 1 SECOND");
    return res[0].idem_token;
  }

  /// One reconcile round through `gate`.
  reconcile::ReconcileSummary round(RemoteGate& gate) {
    boost::asio::io_context io;
    auto work = boost::asio::make_work_guard(io);
    db::Pool pool(db, 2);
    reconcile::Reconciler reconciler(io, pool, cfg, handlers, gate, nullptr, "host-r#1");
    reconcile::ReconcileSummary summary;
    reconciler.run_once([&](reconcile::ReconcileSummary s) {
      summary = s;
      io.stop();
    });
    io.run();
    pool.stop(std::chrono::steady_clock::now() + 10s);
    return summary;
  }

  int64_t scalar(const std::string& sql) { return std::stoll(*conn->query(sql).at(0).at(0)); }
  std::string status_of(const std::string& token) {
    return claim::to_string(
        static_cast<Status>(scalar("SELECT status FROM idemsink_claim WHERE idem_token = '" + token + "'")));
  }
};

}  // namespace

// A waybill whose attempts ran out in an outage, on calls that timed out
// (so unknown, maybe_applied), and that the API never saw: its token is
// safe to send again on an idempotent route, so it is re-driven and done,
// never failed and never a letter held back from the DLQ (the fault
// checker's seed 3373: 16 good orders failed and absent from the DLQ).
BOOST_AUTO_TEST_CASE(a_record_the_remote_never_saw_is_re_driven_on_an_idempotent_route) {
  World w("reconcile_idempotent_redrive");
  const std::string token = w.unknown("waybill", "W-1", 2, "maybe_applied");
  ScriptedGate gate;
  const auto s = w.round(gate);
  BOOST_TEST(s.redriven_done == 1u);
  BOOST_TEST(w.status_of(token) == "done");
  BOOST_TEST(w.services.stats()["waybill"]["applied"].get<int>() == 1);
  // Done: its held letter is stamped, never published.
  BOOST_TEST(w.scalar("SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE published_at IS NOT NULL AND publish_error "
                      "LIKE 'settled by reconciliation%'") == 1);
}

// An at-most-once text out of attempts that the gateway never sent is
// settled failed, and failed is a dead letter like any other: its held
// letter is published now, reason not_applied.
BOOST_AUTO_TEST_CASE(a_failed_settlement_publishes_its_dead_letter) {
  World w("reconcile_failed_published");
  const std::string token = w.unknown("sms", "S-1", 2, "maybe_applied");
  ScriptedGate gate;
  const auto s = w.round(gate);
  BOOST_TEST(s.failed == 1u);
  BOOST_TEST(w.status_of(token) == "failed");
  BOOST_TEST(w.scalar("SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE held_until IS NULL AND published_at IS NULL "
                      "AND reason = 'not_applied' AND idem_token = '" +
                      token + "'") == 1);
  BOOST_TEST(w.services.stats()["sms"]["requests"].get<int>() == 0);  // never sent again
}

// An operator's "failed" is a settlement too: the held letter is published
// (never stamped away), and "done" stamps it.
BOOST_AUTO_TEST_CASE(an_operators_failed_resolution_publishes_the_held_letter) {
  World w("reconcile_operator_failed");
  const std::string failed = w.unknown("sms", "S-3", 1, "uncertain");
  const std::string done = w.unknown("sms", "S-4", 1, "uncertain");
  const operate::Actor olga{"olga", "operator"};
  BOOST_TEST(operate::resolve(*w.conn, w.cfg, olga, failed, "failed", "the gateway never sent it").ok);
  BOOST_TEST(operate::resolve(*w.conn, w.cfg, olga, done, "done", "the gateway's log shows it").ok);
  BOOST_TEST(w.scalar("SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE held_until IS NULL AND published_at IS NULL "
                      "AND reason = 'not_applied' AND idem_token = '" +
                      failed + "'") == 1);
  BOOST_TEST(w.scalar("SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE published_at IS NOT NULL AND idem_token = '" +
                      done + "'") == 1);
}

// Look-ups and re-drives keep to the route's gate: a wait is waited out, an
// open circuit leaves the row to a later round (nothing asked, nothing
// sent), and a re-drive answered with a pause holds the route and is not
// counted: the row stays unknown with its calls as they were.
BOOST_AUTO_TEST_CASE(reconcile_calls_keep_to_the_routes_gate) {
  World w("reconcile_gate");
  const std::string waybill = w.unknown("waybill", "W-2", 1, "uncertain");
  const std::string paused = w.unknown("waybill", "DOWN-1", 1, "uncertain");
  const std::string text = w.unknown("sms", "S-2", 1, "uncertain");
  ScriptedGate gate;
  gate.script["waybill"] = {RemoteGate::Pass::Wait, RemoteGate::Pass::Wait};
  gate.script["sms"] = {RemoteGate::Pass::Closed};
  const auto s = w.round(gate);
  BOOST_TEST(s.deferred == 1u);  // the text: its route's circuit is open
  BOOST_TEST(w.status_of(text) == "unknown");
  BOOST_TEST(w.status_of(waybill) == "done");  // waited out, then looked up, re-driven
  BOOST_TEST(gate.asked["waybill"] == 6);      // 2 waits, 2 look-ups, 2 re-drives
  BOOST_TEST(w.status_of(paused) == "unknown");
  BOOST_TEST(gate.holds["waybill"] == 1000ms);  // the 503's Retry-After: 1
  BOOST_TEST(w.scalar("SELECT calls FROM idemsink_claim WHERE idem_token = '" + paused + "'") == 1);
  BOOST_TEST(w.services.stats()["sms"]["requests"].get<int>() == 0);
}
