// Records as Kafka Connect users have them: Avro, Protobuf and JSON Schema
// values (and keys) in Confluent's wire format, written by Confluent's own
// serializers against a real schema registry (Apicurio, its
// Confluent-compatible API). Each case counts both halves of the contract:
// every effect once (the call log), every record accounted for (claimed,
// skipped or dead-lettered with its bytes as written; the audit).
#define BOOST_TEST_MODULE formats
#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>
#include <set>

#include "devkit/schema_registry.h"
#include "devkit/services.h"
#include "devkit/tcp_proxy.h"
#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace idemsink::devkit;
using namespace std::chrono_literals;

namespace {

const std::filesystem::path kSchemas = std::filesystem::path(IDEMSINK_SOURCE_DIR) / "tests/formats";

// One registry for the module: it takes seconds to start.
struct Registry {
  ScratchDir dir{"formats_registry"};
  SchemaRegistry registry{dir.path()};
};
Registry& registry() {
  static Registry r;
  return r;
}

// `objects` encoded by Confluent's serializer (tests/formats/encode_records.py),
// the schema registered under the topic's subject as producers do.
std::vector<std::string> encode(const std::string& topic, const std::string& format, const std::string& schema,
                                const std::vector<std::string>& objects, const std::string& message = "",
                                bool key = false) {
  ScratchDir work("formats_encode");
  write_file(work / "in.jsonl", [&] {
    std::string in;
    for (const auto& o : objects) in += o + "\n";
    return in;
  }());
  std::string cmd =
      std::string(IDEMSINK_BUILD_DIR) + "/format-tools/venv/bin/python3 " + (kSchemas / "encode_records.py").string() +
      " --registry " + registry().registry.url() + " --topic " + topic + " --format " + format + " --schema " +
      (kSchemas / schema).string() + (message.empty() ? "" : " --message " + message) + (key ? " --key" : "") + " < " +
      (work / "in.jsonl").string() + " > " + (work / "out.hex").string() + " 2> " + (work / "err.txt").string();
  if (std::system(cmd.c_str()) != 0)
    throw std::runtime_error("encoding failed: " + cmd + "\n" + read_file(work / "err.txt"));
  std::vector<std::string> out;
  std::istringstream lines(read_file(work / "out.hex"));
  for (std::string l; std::getline(lines, l);) out.push_back(unhex(l));
  BOOST_REQUIRE_EQUAL(out.size(), objects.size());
  return out;
}

std::string registry_table(const std::string& url) { return "[schema_registry]\nurl = \"" + url + "\"\n"; }

// What the plugin was handed as JSON, per biz_key (the call log's last column).
std::map<std::string, std::vector<nlohmann::json>> json_calls(Scenario& s) {
  std::map<std::string, std::vector<nlohmann::json>> out;
  for (const auto& [key, calls] : s.calls_by_key())
    for (const auto& cols : calls) out[key].push_back(nlohmann::json::parse(unhex(cols.at(6))));
  return out;
}

int64_t letters(Scenario& s, const std::string& route, const std::string& reason) {
  return s.scalar("SELECT COUNT(*) FROM idemsink_dlq_outbox WHERE route = '" + route + "' AND reason = '" + reason +
                  "'");
}

std::string payment(int i, const std::string& type, const std::string& extra = "") {
  return R"({"order_id": "P-)" + std::to_string(i) + R"(", "type": ")" + type + R"(", "amount": )" + std::to_string(i) +
         ".50, \"note\": " + (i % 2 ? "null" : "\"gift\"") + extra + "}";
}

}  // namespace

// Avro values: the biz_key from a field of the decoded value, [route.when] on
// another, decimals exact, optional fields as values. Records the route does
// not take are skipped; a value that is not in the wire format, one naming a
// schema the registry does not know, and one whose bytes do not decode are
// dead-lettered (undecodable_value) with their bytes as written. A re-send of
// the same payment under the schema's second version (fields reordered, an
// optional field added and left null) is a duplicate, not a conflict; one
// with another amount is a conflict.
BOOST_AUTO_TEST_CASE(avro_values_are_read_as_their_json) {
  Scenario s("formats_avro");
  s.topic("payments", 2).topic("payments.dlq", 1);
  std::vector<std::string> objects;
  for (int i = 0; i < 30; ++i) objects.push_back(payment(i, i % 3 == 2 ? "refund" : "paid"));
  const auto v1 = encode("payments", "avro", "payment_v1.avsc", objects);
  const auto v2 = encode("payments", "avro", "payment_v2.avsc",
                         {payment(0, "paid", R"(, "channel": null)"), payment(1, "paid", R"(, "channel": null)")});
  const auto conflict = encode("payments", "avro", "payment_v1.avsc",
                               {R"({"order_id": "P-3", "type": "paid", "amount": 99.50, "note": null})"});
  BOOST_REQUIRE_NE(v1[0].substr(1, 4), v2[0].substr(1, 4));  // another schema id
  std::vector<TestMessage> msgs;
  for (size_t i = 0; i < v1.size(); ++i) msgs.push_back({"k" + std::to_string(i), v1[i]});
  msgs.push_back({"k0", v2[0]});
  msgs.push_back({"k1", v2[1]});
  msgs.push_back({"k3", conflict[0]});
  const std::string not_framed = R"({"order_id": "P-99", "type": "paid"})";
  const std::string unknown_id = std::string("\0\0\x7f\xff\x01", 5) + v1[0].substr(5);
  const std::string broken = v1[4].substr(0, v1[4].size() - 3);
  msgs.push_back({"bad-1", not_framed});
  msgs.push_back({"bad-2", unknown_id});
  msgs.push_back({"bad-3", broken});
  s.kafka.produce("payments", msgs);

  auto& host = s.host("host-a",
                      {s.scripted("payments", "payments",
                                  "[route.value]\nformat = \"avro\"\n[route.key]\nfrom = \"json\"\njson = "
                                  "\"order_id\"\n[route.when]\njson = \"type\"\nequals = \"paid\"\n")},
                      {.admin = true, .tables = registry_table(registry().registry.url())});
  s.wait_committed(host, {"payments"});
  const auto calls = json_calls(s);
  BOOST_TEST(calls.size() == 20u);  // the 20 payments, none of the 10 refunds
  for (const auto& [key, list] : calls) {
    BOOST_TEST(list.size() == 1u, key << " called " << list.size() << " times");
    const int i = std::stoi(key.substr(2));
    const nlohmann::json want = {{"order_id", "P-" + std::to_string(i)},
                                 {"type", "paid"},
                                 {"amount", std::to_string(i) + ".50"},
                                 {"note", i % 2 ? nlohmann::json(nullptr) : nlohmann::json("gift")}};
    BOOST_TEST(list.front() == want, list.front().dump());
    BOOST_TEST(list.front().at("amount") == std::to_string(i) + ".50");
    BOOST_TEST(list.front().at("note") == (i % 2 ? nlohmann::json(nullptr) : nlohmann::json("gift")));
  }
  BOOST_TEST(admin_metric(s.admin_port(host), "idemsink_records_skipped_total{route=\"payments\"}") == 10);
  BOOST_TEST(admin_metric(s.admin_port(host), "idemsink_idempotent_hits_total{route=\"payments\"}") >= 2);
  BOOST_TEST(letters(s, "payments", "undecodable_value") == 3);
  BOOST_TEST(letters(s, "payments", "payload_conflict") == 1);
  // Dead letters keep the bytes as written.
  std::set<std::string> dead;
  for (const auto& m : s.kafka.read_all("payments.dlq", 1)) dead.insert(m.value.value_or(""));
  for (const auto& bytes : {not_framed, unknown_id, broken}) BOOST_TEST(dead.count(bytes) == 1u);
  // The dead-letter view (API and console) shows a letter's record as the
  // route reads it: decoded, or why it does not decode.
  auto letter = [&](int64_t id) {
    const auto [status, text] = http_request(s.admin_port(host), "GET",
                                             "/api/v1/dead-letters/" + std::to_string(id) + "?route=payments", "", {});
    BOOST_REQUIRE_EQUAL(status, 200);
    return nlohmann::json::parse(text);
  };
  const auto conflict_letter =
      letter(s.scalar("SELECT id FROM idemsink_dlq_outbox WHERE route = 'payments' AND reason = 'payload_conflict'"));
  BOOST_TEST(conflict_letter["decoded"]["value"] ==
                 nlohmann::json::parse(R"({"order_id": "P-3", "type": "paid", "amount": "99.50", "note": null})"),
             conflict_letter.dump());
  BOOST_TEST(!conflict_letter["decoded"].contains("problem"));
  for (const auto& row :
       s.connect()->query("SELECT id FROM idemsink_dlq_outbox WHERE reason = 'undecodable_value' ORDER BY id")) {
    const auto bad = letter(std::stoll(*row[0]));
    BOOST_TEST(bad["decoded"]["value"].is_null());
    BOOST_TEST(!bad["decoded"].value("problem", "").empty(), bad.dump());
  }
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}

// Protobuf values whose schema imports another (a registry reference) and a
// well-known type, the record naming its message by index (not the file's
// first); JSON Schema values beside them; the biz_key from an Avro key.
BOOST_AUTO_TEST_CASE(protobuf_values_json_schema_values_and_avro_keys) {
  Scenario s("formats_protobuf");
  s.topic("shipments", 2).topic("tickets", 1);
  std::vector<std::string> shipments, keys, tickets;
  for (int i = 0; i < 12; ++i) {
    shipments.push_back(R"({"shipment_id": "S-)" + std::to_string(i) +
                        R"(", "to": {"city": "Hangzhou"}, "cod": {"currency": "CNY", "cents": )" +
                        std::to_string(1000 + i) +
                        R"(}, "ready_at": "2026-12-06T08:00:00Z", "parcels": [{"sku": "A"}]})");
    keys.push_back(R"({"shipment_id": "S-)" + std::to_string(i) + R"("})");
    tickets.push_back(R"({"ticket": "T-)" + std::to_string(i) + R"(", "seats": )" + std::to_string(i % 4) + "}");
  }
  const auto values = encode("shipments", "protobuf", "shipment.proto", shipments, "Shipment");
  const auto key_bytes = encode("shipments", "avro", "order_key.avsc", keys, "", true);
  const auto ticket_bytes = encode("tickets", "json_schema", "ticket.schema.json", tickets);
  std::vector<TestMessage> ship_msgs, ticket_msgs;
  for (size_t i = 0; i < values.size(); ++i) ship_msgs.push_back({key_bytes[i], values[i]});
  for (size_t i = 0; i < ticket_bytes.size(); ++i) ticket_msgs.push_back({"t" + std::to_string(i), ticket_bytes[i]});
  s.kafka.produce("shipments", ship_msgs);
  s.kafka.produce("tickets", ticket_msgs);

  auto& host = s.host(
      "host-a",
      {s.scripted("shipments", "shipments",
                  "[route.value]\nformat = \"protobuf\"\n[route.key_format]\nformat = \"avro\"\n[route.when]\njson = "
                  "\"to.city\"\nequals = \"Hangzhou\"\n"),
       s.scripted("tickets", "tickets",
                  "[route.value]\nformat = \"json_schema\"\n[route.key]\nfrom = \"json\"\njson = \"ticket\"\n")},
      {.tables = registry_table(registry().registry.url())});
  s.wait_committed(host, {"shipments", "tickets"});
  const auto calls = json_calls(s);
  for (int i = 0; i < 12; ++i) {
    const std::string shipment_key = R"({"shipment_id":"S-)" + std::to_string(i) + R"("})";
    BOOST_REQUIRE_MESSAGE(calls.count(shipment_key) == 1, shipment_key << " not called");
    BOOST_TEST(calls.at(shipment_key).size() == 1u);
    const auto& got = calls.at(shipment_key).front();
    BOOST_TEST(got.at("cod").at("cents") == std::to_string(1000 + i));  // int64 as protobuf's JSON writes it
    BOOST_TEST(got.at("ready_at") == "2026-12-06T08:00:00Z");
    BOOST_TEST(got.at("parcels").at(0).at("sku") == "A");
    const std::string ticket = "T-" + std::to_string(i);
    BOOST_REQUIRE_MESSAGE(calls.count(ticket) == 1, ticket << " not called");
    BOOST_TEST(calls.at(ticket).front() == nlohmann::json::parse(tickets[i]));
  }
  BOOST_TEST(calls.size() == 24u);
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}

// The registry cut off mid-run: records needing a schema the host has not
// fetched (a second schema version) wait: nothing called, nothing
// dead-lettered, the commit does not move, /readyz and
// idemsink_schema_registry_up say so. The host is killed (SIGKILL) while
// they wait and started again with the registry still away; once it
// answers, every record runs, none twice, none lost.
BOOST_AUTO_TEST_CASE(records_wait_while_the_registry_is_unreachable) {
  Scenario s("formats_outage");
  s.topic("payments", 2);
  std::vector<std::string> first, second;
  for (int i = 0; i < 40; ++i) first.push_back(payment(i, "paid"));
  for (int i = 40; i < 80; ++i) second.push_back(payment(i, "paid", R"(, "channel": "app")"));
  const auto v1 = encode("payments", "avro", "payment_v1.avsc", first);
  const auto v2 = encode("payments", "avro", "payment_v2.avsc", second);
  auto messages = [](const std::vector<std::string>& values, int from) {
    std::vector<TestMessage> out;
    for (size_t i = 0; i < values.size(); ++i) out.push_back({"k" + std::to_string(from + i), values[i]});
    return out;
  };

  const int registry_port = std::stoi(registry().registry.url().substr(17));
  TcpProxy proxy(registry_port);
  const std::string via_proxy = "http://127.0.0.1:" + std::to_string(proxy.port()) + "/apis/ccompat/v7";
  const auto route = s.scripted(
      "payments", "payments", "[route.value]\nformat = \"avro\"\n[route.key]\nfrom = \"json\"\njson = \"order_id\"\n");
  const Scenario::HostOptions options{.admin = true, .tables = registry_table(via_proxy) + "timeout = \"1s\"\n"};
  auto* host = &s.host("host-a", {route}, options);
  s.kafka.produce("payments", messages(v1, 0));
  s.wait_committed(*host, {"payments"});
  BOOST_TEST(s.calls_by_key().size() == 40u);

  proxy.retarget(free_port());  // nothing listens there: every connection is refused
  s.kafka.produce("payments", messages(v2, 40));
  int admin = s.admin_port(*host);
  const std::string up = "idemsink_schema_registry_up{url=\"" + via_proxy + "\"}";
  wait_until([&] { return admin_metric(admin, up) == 0; }, 60s, "the registry reported down");
  BOOST_TEST(http_status(admin, "/readyz") == 503);
  std::this_thread::sleep_for(3s);  // a while down: nothing of the second version may move
  BOOST_TEST(s.calls_by_key().size() == 40u);
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_dlq_outbox") == 0);
  const auto held = s.kafka.committed("g", "payments", 2);
  host->kill();
  host = &s.host("host-a", {route}, options);
  admin = s.admin_port(*host);
  wait_until([&] { return admin_metric(admin, up) == 0; }, 60s, "the registry reported down after the restart");
  std::this_thread::sleep_for(2s);
  BOOST_TEST(s.calls_by_key().size() == 40u);
  BOOST_TEST((s.kafka.committed("g", "payments", 2) == held));

  proxy.retarget(registry_port);
  s.wait_committed(*host, {"payments"});
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_dlq_outbox") == 0);
  const auto calls = s.calls_by_key();
  BOOST_TEST(calls.size() == 80u);
  for (const auto& [key, list] : calls) BOOST_TEST(list.size() == 1u, key);
  BOOST_TEST(admin_metric(admin, up) == 1);
  BOOST_TEST(host->stop() == 0);
  s.audit_clean(*host);
}

// Avro, Protobuf (a nested message, an import, a well-known type) and JSON
// Schema routes killed (SIGKILL) at each named cut of the claim's life: after
// the claim commit (A), after the effect (B), after the done mark (C). Every
// record ends done with one effect: calls repeated after a kill carry the
// same token (the remote applies a token once), never another.
BOOST_AUTO_TEST_CASE(avro_protobuf_and_json_schema_routes_through_kill_9) {
  Scenario s("formats_kills");
  s.topic("payments", 2).topic("shipments", 2).topic("tickets", 2);
  constexpr int kRecords = 300;
  std::vector<std::string> payments, shipments, tickets;
  for (int i = 0; i < kRecords; ++i) {
    payments.push_back(payment(i, "paid"));
    shipments.push_back(R"({"shipment_id": "S-)" + std::to_string(i) +
                        R"(", "to": {"city": "Hangzhou"}, "cod": {"currency": "CNY", "cents": )" +
                        std::to_string(1000 + i) + R"(}, "ready_at": "2026-12-06T08:00:00.250Z"})");
    tickets.push_back(R"({"ticket": "T-)" + std::to_string(i) + R"(", "seats": )" + std::to_string(i % 4) + "}");
  }
  const auto shipment_bytes = encode("shipments-k", "protobuf", "shipment.proto", shipments, "Shipment");
  const auto ticket_bytes = encode("tickets-k", "json_schema", "ticket.schema.json", tickets);
  const auto payment_bytes = encode("payments-k", "avro", "payment_v1.avsc", payments);
  std::vector<TestMessage> pay_msgs, ship_msgs, ticket_msgs;
  for (int i = 0; i < kRecords; ++i) {
    pay_msgs.push_back({"p" + std::to_string(i), payment_bytes[static_cast<size_t>(i)]});
    ship_msgs.push_back({"s" + std::to_string(i), shipment_bytes[static_cast<size_t>(i)]});
    ticket_msgs.push_back({"t" + std::to_string(i), ticket_bytes[static_cast<size_t>(i)]});
  }
  s.kafka.produce("payments", pay_msgs);
  s.kafka.produce("shipments", ship_msgs);
  s.kafka.produce("tickets", ticket_msgs);
  const std::vector<RouteSpec> routes = {
      with_delay(s.scripted("payments", "payments",
                            "[route.value]\nformat = \"avro\"\n[route.key]\nfrom = \"json\"\njson = \"order_id\"\n"),
                 "2ms"),
      with_delay(s.scripted("shipments", "shipments",
                            "[route.value]\nformat = \"protobuf\"\n[route.key]\nfrom = \"json\"\njson = "
                            "\"shipment_id\"\n"),
                 "2ms"),
      with_delay(
          s.scripted("tickets", "tickets",
                     "[route.value]\nformat = \"json_schema\"\n[route.key]\nfrom = \"json\"\njson = \"ticket\"\n"),
          "2ms")};
  const std::string tables = registry_table(registry().registry.url());
  // Early in each run (claims and done marks are written in batches: their
  // counts are of batches), so every run has records left to kill it.
  for (const std::string fault : {"after_handler_ok:20", "after_claim_commit:2", "after_mark_done:2"}) {
    auto& crashing = s.host("host-a", routes, {.tables = tables, .env = {{"IDEMSINK_FAULT", fault}}});
    const auto rc = crashing.proc().wait(120s);
    BOOST_REQUIRE_MESSAGE(rc && *rc == -9, "the fault " << fault << " did not kill the host\n" << crashing.log());
  }
  auto& host = s.host("host-a", routes, {.tables = tables});
  s.wait_committed(host, {"payments", "shipments", "tickets"});

  const auto calls = s.calls_by_key();
  BOOST_TEST(calls.size() == static_cast<size_t>(3 * kRecords));
  size_t repeated = 0;
  for (const auto& [key, list] : calls) {
    std::set<std::string> tokens;
    for (const auto& cols : list) tokens.insert(cols.at(2));
    BOOST_TEST(tokens.size() == 1u, key << ": " << tokens.size() << " effects");
    repeated += list.size() - 1;
    const auto value = nlohmann::json::parse(unhex(list.front().at(6)));
    if (key.rfind("P-", 0) == 0) {
      BOOST_TEST(value.at("amount") == key.substr(2) + ".50");
    } else if (key.rfind("S-", 0) == 0) {
      BOOST_TEST(value.at("cod").at("cents") == std::to_string(1000 + std::stoi(key.substr(2))));
      BOOST_TEST(value.at("ready_at") == "2026-12-06T08:00:00.250Z");
    } else {
      BOOST_TEST(value.at("seats") == std::stoi(key.substr(2)) % 4);
    }
  }
  BOOST_TEST_MESSAGE(repeated << " calls repeated with their token after the kills");
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(claim::Status::Done)) ==
             3 * kRecords);
  BOOST_TEST(s.scalar("SELECT COUNT(*) FROM idemsink_dlq_outbox") == 0);
  BOOST_TEST(host.stop() == 0);
  s.audit_clean(host);
}
