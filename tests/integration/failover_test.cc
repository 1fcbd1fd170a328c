// The claim database fails over. A primary with an asynchronous replica that
// applies what it receives 8 s late is killed mid-run and the
// replica promoted: it lacks the last seconds of claims, call marks, done
// rows and ledger credits, while Kafka holds offsets committed on their
// strength. Two hosts run an idempotent remote (waybill), an at-most-once
// one with a reconcile hook (SMS) and a local_tx ledger, and reach the
// database through a proxy that moves to the replica. Counted after: every
// order applied once at each remote (its own counter), each ledger credit
// exactly once, no SMS sent twice, every record accounted for, the rewound
// window logged and counted. Then the same on semi-synchronous replication:
// nothing lost, no rewind.
#define BOOST_TEST_MODULE failover
#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "devkit/mariadb_server.h"
#include "devkit/services.h"
#include "devkit/tcp_proxy.h"
#include "tests/support/host_fixture.h"
#include "tests/support/test_kafka.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace idemsink::devkit;
using namespace std::chrono_literals;

namespace {

constexpr int kOrders = 1500;
const std::vector<std::string> kRoutes = {"waybill", "sms", "ledger"};

std::vector<TestMessage> orders(int from, int to) {
  std::vector<TestMessage> out;
  for (int i = from; i < to; ++i) {
    const std::string id = "F" + std::to_string(i);
    out.push_back({id, nlohmann::json{{"order_id", id},
                                      {"account", "acct-" + std::to_string(i % 40)},
                                      {"amount", 10.5},
                                      {"phone", "+86138" + std::to_string(10000000 + i)}}
                           .dump()});
  }
  return out;
}

// What both scenarios run: the fake remotes, the topics, the hosts' routes
// (waybill, SMS, ledger) and, at the end, the counts.
struct Rig {
  FakeServices services{fake_services_binary(),
                        {"--faults", "waybill:latency_mean_ms=5,latency_p99_ms=30", "--faults",
                         "sms:latency_mean_ms=5,latency_p99_ms=30"}};
  TestKafka kafka;
  ScratchDir dir{"failover"};
  int partitions;

  explicit Rig(int partitions) : partitions(partitions) {
    for (const auto& r : kRoutes) {
      kafka.create_topic(r, partitions);
      kafka.create_topic(r + ".dlq", 1);
    }
  }

  std::string host_config(const config::DatabaseConfig& db, const std::string& id, const std::string& host_lines = "") {
    std::string cfg = base_config(kafka, db, id, "g", host_lines);
    cfg.replace(cfg.find("[claim]\n"), 8, "[claim]\nreconcile_interval = \"1s\"\nreconcile_after = \"2s\"\n");
    for (const auto& r : kRoutes) {
      RouteSpec spec{
          r, r, shipped_plugin(r), "key = { from = \"json\", json = \"order_id\" }", {}, "call_timeout = \"5s\"\n"};
      if (r != "ledger") spec.options = {{"endpoint", "\"" + services.url() + "\""}, {"timeout", "\"1s\""}};
      cfg += route_config(spec);
    }
    return cfg;
  }

  void produce(int from, int to) {
    for (const auto& r : kRoutes) kafka.produce(r, orders(from, to));
  }

  // Every topic committed to its end, every claim on `conn` settled.
  void settle(HostProcess& host, db::Connection& conn) {
    std::vector<std::pair<std::string, int>> topics;
    for (const auto& r : kRoutes) topics.push_back({r, partitions});
    wait_committed(kafka, "g", topics, host, 240s);
    wait_until(
        [&] {
          return scalar(conn, "SELECT COUNT(*) FROM idemsink_claim WHERE " +
                                  status_in(claim::Status::Pending, claim::Status::Unknown)) == 0;
        },
        120s, "every claim settled");
  }

  // Both halves, counted once the hosts stopped: every order applied once at
  // each remote (its own counter), each SMS sent at most once and done
  // exactly when sent, each ledger credit once, every record accounted for.
  void check_each_effect_once(db::Connection& conn, HostProcess& host, const std::string& name) {
    const auto stats = services.stats();
    BOOST_TEST(stats["waybill"]["double_applied"].get<int>() == 0);
    BOOST_TEST(stats["waybill"]["orders"].get<int>() == kOrders);
    for (const auto& [order, n] : stats["sms"]["per_order"].items()) BOOST_TEST(n.get<int>() <= 1, order);
    for (const auto& r : conn.query("SELECT biz_key, status FROM idemsink_claim WHERE namespace = 'sms'")) {
      const bool sent = stats["sms"]["per_order"].value(*r[0], 0) == 1;
      BOOST_TEST((*r[1] == "2") == sent, *r[0] << " status " << *r[1]);
    }
    BOOST_TEST(scalar(conn, "SELECT COUNT(*) FROM ledger_entries") == kOrders);
    BOOST_TEST(scalar(conn, "SELECT COUNT(DISTINCT biz_key) FROM ledger_entries") == kOrders);
    auto [rc, out] = audit(dir, host);
    BOOST_TEST(rc == 0, out);
    BOOST_TEST_MESSAGE(name << ": waybill applied " << stats["waybill"]["applied"].get<int>() << ", sms sent "
                            << stats["sms"]["applied"].get<int>() << ", ledger credits "
                            << scalar(conn, "SELECT COUNT(*) FROM ledger_entries"));
  }
};

// Runs the scenario; `semi_sync` chooses the replication. Returns the
// records the hosts counted as rewound (idemsink_offsets_rewound_total).
int64_t failover(const std::string& name, bool semi_sync) {
  MariaDbServer primary(MariaDbServer::replication_args(1));
  MariaDbServer replica(MariaDbServer::replication_args(2));
  replica.replicate_from(primary, semi_sync);
  primary.fresh_database(name);
  TcpProxy proxy(primary.port());
  auto db = primary.database(name);
  db.port = proxy.port();
  Rig rig(4);
  const std::vector<int> admin{free_port(), free_port()};
  const auto admin_line = [&](int i) { return "admin_listen = \"127.0.0.1:" + std::to_string(admin[i]) + "\"\n"; };
  HostProcess a(rig.dir, "host-a", rig.host_config(db, "host-a", admin_line(0)));
  HostProcess b(rig.dir, "host-b", rig.host_config(db, "host-b", admin_line(1)));
  // The replica has the schema the hosts made (the core's and the ledger
  // plugin's tables); from now on it lags (async).
  for (int port : admin) wait_until([&] { return http_status(port, "/readyz") == 200; }, 60s, "the hosts ready");
  replica.catch_up_with(primary);
  if (!semi_sync) replica.lag_by(8);
  // Half the orders; the primary dies as soon as Kafka's commits cover a
  // third of them on every route: commits the asynchronous replica, applying
  // 8 s late, has not seen the outcomes of.
  rig.produce(0, kOrders / 2);
  const auto committed_total = [&](const std::string& topic) {
    int64_t n = 0;
    for (const auto& [p, o] : rig.kafka.committed("g", topic, rig.partitions)) n += std::max<int64_t>(o, 0);
    return n;
  };
  wait_until(
      [&] {
        for (const auto& r : kRoutes)
          if (committed_total(r) < kOrders / 3) return false;
        return true;
      },
      120s, "a third of the orders committed on every route");
  primary.kill();
  replica.promote(semi_sync);
  proxy.retarget(replica.port());
  rig.produce(kOrders / 2, kOrders);
  auto conn = replica.connect(name);
  rig.settle(a, *conn);
  int64_t rewound = 0;
  for (int port : admin) {
    const auto [status, body] = http_request(port, "GET", "/metrics");
    for (size_t at = body.find("\nidemsink_offsets_rewound_total{"); at != std::string::npos;
         at = body.find("\nidemsink_offsets_rewound_total{", at + 1))
      rewound += std::stoll(body.substr(body.find("} ", at) + 2));
  }
  BOOST_TEST(a.stop() == 0);
  BOOST_TEST(b.stop() == 0);
  rig.check_each_effect_once(*conn, a, name + " (rewound " + std::to_string(rewound) + ")");
  return rewound;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_promoted_replica_that_lost_the_last_seconds_applies_nothing_twice_and_loses_nothing) {
  BOOST_TEST(failover("failover_async", false) > 0);  // the replica lagged: a window was lost and read again
}

BOOST_AUTO_TEST_CASE(semi_synchronous_replication_loses_nothing_and_rewinds_nothing) {
  BOOST_TEST(failover("failover_semi_sync", true) == 0);
}

// A 3-node Galera cluster, three hosts each writing through its own node;
// one node is killed mid-run and rejoins. Certification conflicts (two hosts
// claiming one key through two nodes) are re-run like deadlocks; nothing
// committed is lost, so nothing is rewound: each effect once.
BOOST_AUTO_TEST_CASE(three_hosts_on_three_galera_nodes_one_node_killed_apply_each_effect_once) {
  const std::vector<int> gcomm{free_port(), free_port(), free_port()};
  std::vector<std::unique_ptr<MariaDbServer>> nodes;
  nodes.push_back(std::make_unique<MariaDbServer>(MariaDbServer::galera_args(0, gcomm, true)));
  for (size_t i = 1; i < 3; ++i)
    nodes.push_back(std::make_unique<MariaDbServer>(MariaDbServer::galera_args(i, gcomm, false)));
  const std::string name = "failover_galera";
  nodes[0]->fresh_database(name);
  Rig rig(6);
  std::vector<std::unique_ptr<HostProcess>> hosts;
  for (size_t i = 0; i < 3; ++i) {
    const std::string id = "host-" + std::to_string(i);
    hosts.push_back(std::make_unique<HostProcess>(rig.dir, id, rig.host_config(nodes[i]->database(name), id)));
  }
  for (int batch = 0; batch < 10; ++batch) {
    rig.produce(batch * kOrders / 10, (batch + 1) * kOrders / 10);
    std::this_thread::sleep_for(500ms);
    if (batch == 4) nodes[1]->kill();
    if (batch == 7) nodes[1]->restart();
  }
  auto conn = nodes[0]->connect(name);
  rig.settle(*hosts[0], *conn);
  for (auto& h : hosts) BOOST_TEST(h->stop() == 0);
  rig.check_each_effect_once(*conn, *hosts[0], "galera");
}
