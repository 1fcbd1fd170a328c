// The operator's API (/api/v1) against a running host with real dead letters
// and unknown claims: each endpoint, each role's refusals, bad input answered
// 400 saying what was wrong, and every action in the operator log. The
// console itself is driven in a browser by tests/console/console.spec.js;
// the OpenAPI document is checked against the answers by
// schemathesis (from PyPI, scripts/console-tools). Both run from this test,
// which starts the world they need.
#define BOOST_TEST_MODULE console_api
#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/admin/api.h"
#include "core/admin/console.h"
#include "core/common/util.h"
#include "devkit/services.h"
#include "tests/support/scenario.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace std::chrono_literals;
using claim::Status;
using nlohmann::json;

namespace {

const std::string kViewer = "viewer-secret-0123456789";
const std::string kOperator = "operator-secret-0123456789";  // waybill only
const std::string kAdmin = "admin-secret-0123456789";
const std::string kConsoleOperator = "console-operator-secret-0123456789";  // every route

// A host whose admin port listens beyond loopback (so reads need a token),
// with three tokens; the waybill remote down at first, so its records are
// dead-lettered; the SMS gateway answering after it sent, so texts end
// unknown (no reconcile rounds: they stay for a person).
struct World {
  Scenario s{"console_api"};
  FakeServices services{fake_services_binary(),
                        {"--faults", "waybill:error_5xx=1", "--faults", "sms:timeout_after_apply=1"}};
  int port = devkit::free_port();
  HostProcess* host = nullptr;

  World() {
    s.topic("orders", 2).topic("orders.dlq", 1).topic("texts", 1).topic("texts.dlq", 1);
    write_file(s.dir / "tokens", "# name role routes secret\nvera viewer * " + kViewer + "\nolga operator waybill " +
                                     kOperator + "\nada admin * env:CONSOLE_ADMIN_TOKEN\notto operator * " +
                                     kConsoleOperator + "\n");
    std::vector<TestMessage> orders, texts;
    for (int i = 0; i < 5; ++i)
      orders.push_back({"O-" + std::to_string(i), "{\"order_id\":\"O-" + std::to_string(i) + "\"}"});
    texts.push_back({"T-1", "{\"order_id\":\"T-1\",\"phone\":\"+8613800000000\",\"text\":\"hi\"}"});
    s.kafka.produce("orders", orders);
    s.kafka.produce("texts", texts);
    const std::string quick =
        "[route.retry]\nmax_attempts = 2\nbackoff_initial = \"10ms\"\n[route.circuit]\nenabled = false\n";
    RouteSpec waybill = shipped_route("waybill", "orders", services.url(), "1s", quick);
    RouteSpec sms = shipped_route("sms", "texts", services.url(), "500ms", quick);
    waybill.key_toml = sms.key_toml = "key = { from = \"json\", json = \"order_id\" }";
    host =
        &s.host("h1", {waybill, sms},
                Scenario::HostOptions{.host_lines = "admin_listen = \"0.0.0.0:" + std::to_string(port) +
                                                    "\"\nadmin_tokens_file = \"" + (s.dir / "tokens").string() + "\"\n",
                                      .claim_lines = "reconcile_interval = \"0s\"\n",
                                      .env = {{"CONSOLE_ADMIN_TOKEN", kAdmin}}});
    s.wait_committed(*host, {"orders", "texts"});
  }

  std::pair<int, json> call(const std::string& method, const std::string& target, const std::string& token,
                            const json& body = nullptr) {
    std::vector<std::pair<std::string, std::string>> headers;
    if (!token.empty()) headers.push_back({"Authorization", "Bearer " + token});
    if (!body.is_null()) headers.push_back({"Content-Type", "application/json"});
    const auto [status, text] =
        http_request(port, method, "/api/v1" + target, body.is_null() ? "" : body.dump(), headers);
    return {status, json::parse(text, nullptr, false)};
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(the_api_serves_each_role_refuses_the_rest_and_logs_every_action) {
  World w;
  // Reads: a viewer token at least (the port is not on loopback).
  BOOST_TEST(w.call("GET", "/routes", "").first == 401);
  BOOST_TEST(w.call("GET", "/routes", "wrong-secret-0123456789").first == 401);
  auto [st, routes] = w.call("GET", "/routes", kViewer);
  BOOST_REQUIRE(st == 200);
  BOOST_TEST(routes.size() == 2u);
  BOOST_TEST(w.call("GET", "/whoami", kOperator).second["routes"] == json::array({"waybill"}));
  BOOST_TEST(w.call("GET", "/routes/waybill", kViewer).second["partitions"].size() == 2u);
  BOOST_TEST(w.call("GET", "/routes/nope", kViewer).first == 404);
  BOOST_TEST(w.call("GET", "/partitions", kViewer).second["partitions"].size() >= 3u);
  BOOST_TEST(w.call("GET", "/openapi.json", "").first == 200);  // the document is public

  // The dead letters the remote's outage made: one per order.
  auto [ls, letters] = w.call("GET", "/dead-letters?route=waybill", kViewer);
  BOOST_REQUIRE(ls == 200);
  BOOST_REQUIRE(letters["letters"].size() == 5u);
  const json first = letters["letters"][0];
  BOOST_TEST(first["reason"] == "retries_exhausted");
  BOOST_TEST(first["claim_status"] == "failed");
  const auto [ds, letter] =
      w.call("GET", "/dead-letters/" + std::to_string(first["id"].get<uint64_t>()) + "?route=waybill", kViewer);
  BOOST_TEST(ds == 200);
  BOOST_TEST(letter["value"]["text"].get<std::string>().find("order_id") != std::string::npos);
  BOOST_TEST(w.call("GET", "/dead-letters?reason=retries_exhausted&limit=2", kViewer).second["letters"].size() == 2u);
  BOOST_TEST(w.call("GET", "/dead-letters?key=O-3", kViewer).second["letters"].size() == 1u);

  // Bad input: 400, saying what.
  const auto [b1, e1] = w.call("GET", "/dead-letters?limit=many", kViewer);
  BOOST_TEST(b1 == 400);
  BOOST_TEST(e1["error"].get<std::string>().find("limit") != std::string::npos);
  BOOST_TEST(w.call("GET", "/dead-letters?since=yesterday", kViewer).first == 400);
  BOOST_TEST(w.call("GET", "/dead-letters/abc", kViewer).first == 400);
  BOOST_TEST(w.call("GET", "/dead-letters/999999", kViewer).first == 404);
  BOOST_TEST(w.call("POST", "/dead-letters/replay", kAdmin, json{{"dry_run", true}}).second["error"] ==
             "route is required");
  BOOST_TEST(w.call("POST", "/dead-letters/replay", kAdmin, json{{"route", "waybill"}, {"ids", "1"}}).first == 400);
  const auto [b2, e2] = w.call("POST", "/dead-letters/replay", kAdmin, json{{"route", "waybill"}});
  BOOST_TEST(b2 == 400);
  BOOST_TEST(e2["error"] == "note is required");
  BOOST_TEST(w.call("POST", "/routes/waybill/pause", kAdmin, json{{"note", "  "}}).first == 400);

  // A page whose name was re-bound to this address names its own host: refused.
  BOOST_TEST(
      http_request(w.port, "GET", "/api/v1/routes", "",
                   {{"Authorization", "Bearer " + kViewer}, {"Host", "rebind.example:" + std::to_string(w.port)}})
          .first == 403);
  BOOST_TEST(
      http_request(
          w.port, "POST", "/api/v1/host/pause", R"({"note":"x"})",
          {{"Authorization", "Bearer " + kAdmin}, {"Origin", "http://rebind.example"}, {"Host", "rebind.example"}})
          .first == 403);

  // Roles: a viewer acts on nothing, an operator only on its routes.
  const json note = {{"note", "the carrier's API is back"}};
  BOOST_TEST(w.call("POST", "/routes/waybill/pause", kViewer, note).first == 403);
  BOOST_TEST(w.call("POST", "/routes/texts/pause", kOperator, note).first == 404);  // no such route
  BOOST_TEST(w.call("POST", "/routes/sms/pause", kOperator, note).first == 403);
  BOOST_TEST(w.call("POST", "/routes/waybill/pause", kOperator, note).first == 200);
  BOOST_TEST(w.call("GET", "/routes/waybill", kViewer).second["paused"] == true);
  BOOST_TEST(w.call("POST", "/routes/waybill/resume", kOperator, note).first == 200);
  // The host's pause is an admin's; the old endpoints are the API's, logged too.
  BOOST_TEST(w.call("POST", "/host/pause", kOperator, note).first == 403);
  BOOST_TEST(w.call("POST", "/host/pause", kAdmin, note).first == 200);
  BOOST_TEST(http_request(w.port, "POST", "/resume", "", {{"Authorization", "Bearer " + kAdmin}}).first == 200);
  BOOST_TEST(
      http_request(w.port, "POST", "/routes/waybill/pause", "", {{"Authorization", "Bearer " + kViewer}}).first == 403);
  const std::string id = std::to_string(first["id"].get<uint64_t>());
  BOOST_TEST(
      w.call("POST", "/dead-letters/replay", kViewer, json{{"route", "waybill"}, {"ids", {first["id"]}}, {"note", "x"}})
          .first == 403);
  BOOST_TEST(w.call("POST", "/dead-letters/" + id + "/discard", kViewer, note).first == 403);

  // The remote is fixed: a dry run, then the replay for real; the record is done.
  http_request(w.services.port(), "POST", "/admin/faults/waybill", R"({"error_5xx": 0})");
  const auto [dr, dry] = w.call("POST", "/dead-letters/replay", kOperator,
                                json{{"route", "waybill"}, {"ids", {first["id"]}}, {"dry_run", true}});
  BOOST_TEST(dr == 200);
  BOOST_TEST(dry["detail"]["replayed"] == 1);
  BOOST_TEST(w.call("GET", "/dead-letters/" + id, kViewer).second["claim_status"] ==
             "failed");  // a dry run changed nothing
  const auto [rr, real] = w.call("POST", "/dead-letters/replay", kOperator,
                                 json{{"route", "waybill"}, {"ids", {first["id"]}}, {"note", "carrier fixed"}});
  BOOST_TEST(rr == 200, real.dump());
  for (int i = 0; i < 300 && w.call("GET", "/dead-letters/" + id, kViewer).second["claim_status"] != "done"; ++i)
    std::this_thread::sleep_for(100ms);
  BOOST_TEST(w.call("GET", "/dead-letters/" + id, kViewer).second["claim_status"] == "done");
  // Another one discarded: it leaves the list.
  const std::string other = std::to_string(letters["letters"][1]["id"].get<uint64_t>());
  BOOST_TEST(w.call("POST", "/dead-letters/" + other + "/discard", kOperator, note).first == 200);
  BOOST_TEST(w.call("POST", "/dead-letters/" + other + "/discard", kOperator, note).first == 409);
  BOOST_TEST(w.call("GET", "/dead-letters?route=waybill", kViewer).second["letters"].size() == 4u);

  // The unknown text: the claim, and what the gateway's hook says now.
  auto [us, unknowns] = w.call("GET", "/unknowns", kViewer);
  BOOST_REQUIRE(unknowns["unknowns"].size() == 1u);
  const std::string token = unknowns["unknowns"][0]["idem_token"];
  const auto [gs, unknown] = w.call("GET", "/unknowns/" + token, kViewer);
  BOOST_TEST(gs == 200);
  BOOST_TEST(unknown["status"] == "unknown");
  // Asking makes the host call the remote: an operator's, of the route.
  BOOST_TEST(unknown["hook"]["answer"] == "not_asked", unknown.dump());
  BOOST_TEST(w.call("GET", "/unknowns/" + token, kOperator).second["hook"]["answer"] == "not_asked");  // waybill's
  const json asked = w.call("GET", "/unknowns/" + token, kConsoleOperator).second;
  BOOST_TEST(asked["hook"]["answer"] == "applied", asked.dump());  // the gateway did send it
  BOOST_TEST(w.call("POST", "/unknowns/" + token + "/resolve", kOperator, json{{"as", "done"}, {"note", "x"}}).first ==
             403);
  BOOST_TEST(w.call("POST", "/unknowns/" + token + "/resolve", kAdmin, json{{"as", "maybe"}, {"note", "x"}}).first ==
             400);
  BOOST_TEST(w.call("POST", "/unknowns/nope/resolve", kAdmin, json{{"as", "done"}, {"note", "x"}}).first == 404);
  BOOST_TEST(w.call("POST", "/unknowns/" + token + "/resolve", kAdmin,
                    json{{"as", "done"}, {"note", "the gateway's log shows it sent"}})
                 .first == 200);
  BOOST_TEST(w.s.scalar("SELECT COUNT(*) FROM idemsink_claim WHERE " + sql_status_is(Status::Unknown)) == 0);

  // Every action in the operator log, with who, what and the note.
  const json log = w.call("GET", "/operator-log", kViewer).second["actions"];
  std::map<std::string, int> actions;
  for (const auto& a : log) ++actions[a["action"].get<std::string>()];
  BOOST_TEST(actions["route.pause"] == 1);
  BOOST_TEST(actions["route.resume"] == 1);
  BOOST_TEST(actions["letters.replay"] == 1);  // the dry run is not an action
  BOOST_TEST(actions["letters.discard"] == 1);
  BOOST_TEST(actions["unknown.resolve"] == 1);
  BOOST_TEST(actions["host.pause"] == 1);
  BOOST_TEST(actions["host.resume"] == 1);
  BOOST_TEST(log[0]["who"] == "ada");
  BOOST_TEST(log[0]["note"] == "the gateway's log shows it sent");
  // The CLI reads the same log (its config names the same tokens file).
  ::setenv("CONSOLE_ADMIN_TOKEN", kAdmin.c_str(), 1);
  const auto [rc, out] = run_cli(w.s.dir, "oplog", {"operator-log", "--config", w.host->config_path().string()});
  BOOST_TEST(rc == 0);
  BOOST_TEST(out.find("\"action\":\"letters.discard\"") != std::string::npos, out);
  BOOST_TEST(w.host->log().find(kViewer) == std::string::npos);  // secrets never logged
  BOOST_TEST(w.host->stop() == 0);
}

namespace {

// Runs a command of the console's tools to its end; its output goes to `log`.
int run_tool(const std::string& command, const std::filesystem::path& log) {
  const int rc = std::system((command + " > '" + log.string() + "' 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace

// The router answers exactly what openapi.json documents: every path and
// method there has its endpoint, and no endpoint is missing from it.
BOOST_AUTO_TEST_CASE(the_router_answers_what_openapi_json_documents) {
  std::set<std::pair<std::string, std::string>> documented, routed;
  const auto doc = nlohmann::json::parse(admin::openapi_document());
  for (const auto& [path, ops] : doc.at("paths").items())
    for (const auto& [method, op] : ops.items()) {
      std::string upper = method;
      for (auto& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
      documented.insert({upper, path});
    }
  for (const auto& [method, path] : admin::Api::endpoints()) {
    BOOST_TEST(routed.insert({std::string(method), std::string(path)}).second, "routed twice: " << path);
  }
  BOOST_TEST(documented.size() == 23u);
  for (const auto& e : documented)
    BOOST_TEST(routed.count(e) == 1u, "documented, not routed: " << e.first << " " << e.second);
  for (const auto& e : routed)
    BOOST_TEST(documented.count(e) == 1u, "routed, not documented: " << e.first << " " << e.second);
}

// The OpenAPI document against the answers (schemathesis: generated requests
// to every operation, each answer's status, content type and body checked
// against the document), then the console in headless Chromium.
BOOST_AUTO_TEST_CASE(the_openapi_document_matches_the_answers_and_the_console_works_in_a_browser) {
  const std::filesystem::path tools = IDEMSINK_CONSOLE_TOOLS;
  BOOST_REQUIRE_MESSAGE(std::filesystem::exists(tools / "venv/bin/schemathesis") &&
                            std::filesystem::exists(tools / "node_modules/playwright-core"),
                        "the console's test tools are missing in " << tools << ": run scripts/install-deps");
  World w;
  const std::string url = "http://127.0.0.1:" + std::to_string(w.port);
  // A viewer's token: every read answered, every action refused, as documented.
  const auto st_log = w.s.dir / "schemathesis.log";
  const int st =
      run_tool((tools / "venv/bin/schemathesis").string() + " run " + url + "/api/v1/openapi.json --base-url " + url +
                   "/api/v1 -H 'Authorization: Bearer " + kViewer +
                   "' --hypothesis-max-examples 15 --hypothesis-seed 1 --hypothesis-derandomize "
                   "-c not_a_server_error -c status_code_conformance -c content_type_conformance "
                   "-c response_schema_conformance --no-color",
               st_log);
  BOOST_TEST(st == 0, "schemathesis found answers that do not match the OpenAPI document:\n" << read_file(st_log));

  // The browser: the remote fixed, a letter to replay and an unknown to settle.
  http_request(w.services.port(), "POST", "/admin/faults/waybill", R"({"error_5xx": 0})");
  const auto letters = json::parse(w.call("GET", "/dead-letters?route=waybill&limit=1", kViewer).second.dump());
  BOOST_REQUIRE(letters["letters"].size() == 1u);
  const std::filesystem::path shots = std::filesystem::path(IDEMSINK_BUILD_DIR) / "tests/console-screenshots";
  std::filesystem::remove_all(shots);
  std::filesystem::create_directories(shots);
  const auto node_log = w.s.dir / "console.log";
  const int node =
      run_tool("CONSOLE_TOOLS='" + tools.string() + "' CONSOLE_URL='" + url + "' VIEWER_TOKEN='" + kViewer +
                   "' OPERATOR_TOKEN='" + kConsoleOperator + "' LETTER_KEY='" +
                   letters["letters"][0]["biz_key"].get<std::string>() + "' UNKNOWN_KEY='T-1' SCREENSHOTS='" +
                   shots.string() + "' node " + IDEMSINK_SOURCE_DIR + "/tests/console/console.spec.js",
               node_log);
  BOOST_TEST(node == 0, "the console test failed:\n" << read_file(node_log));
  BOOST_TEST_MESSAGE(read_file(node_log));
  BOOST_TEST(w.s.scalar("SELECT COUNT(*) FROM idemsink_operator_log WHERE who = 'otto'") == 2);  // replay, resolve
  BOOST_TEST(w.host->stop() == 0);
}
