// The plugin author's path end to end: install idemsink, build the template
// plugin and its unit test out of tree with find_package(idemsink) +
// idemsink_add_plugin, run the unit test, look at the plugin with `idemsink
// plugin-info`, and run it in the installed host.
#define BOOST_TEST_MODULE out_of_tree
#include <boost/test/unit_test.hpp>
#include <signal.h>

#include <idemsink/plugin_abi.h>

#include <set>

#include "tests/support/host_fixture.h"
#include "devkit/mariadb_server.h"
#include "tests/support/test_kafka.h"

using namespace idemsink;
using namespace idemsink::test;
using namespace idemsink::devkit;
using namespace std::chrono_literals;

namespace {

std::string run(const ScratchDir& dir, const std::string& name, const std::vector<std::string>& argv, int expect = 0) {
  Process p(argv, dir / (name + ".out"), dir / (name + ".err"));
  auto rc = p.wait(600s);
  BOOST_REQUIRE_MESSAGE(rc.has_value(), name << " did not finish");
  BOOST_REQUIRE_MESSAGE(*rc == expect, name << " exited " << *rc << ":\n" << p.out() << p.err());
  return p.out() + p.err();
}

}  // namespace

BOOST_AUTO_TEST_CASE(template_plugin_builds_against_the_installed_sdk_and_runs_in_the_host) {
  ScratchDir dir("out-of-tree");
  const auto prefix = (dir / "prefix").string();
  run(dir, "install", {CMAKE_COMMAND, "--install", IDEMSINK_BUILD_DIR, "--prefix", prefix});
  BOOST_TEST(std::filesystem::exists(prefix + "/include/idemsink/plugin_abi.h"));
  BOOST_TEST(std::filesystem::exists(prefix + "/include/idemsink/testing/fake_tx.h"));  // testing.h includes it
  BOOST_TEST(std::filesystem::exists(prefix + "/lib/cmake/idemsink/idemsinkConfig.cmake"));

  const auto build = (dir / "hello-build").string();
  run(dir, "configure",
      {CMAKE_COMMAND, "-S", std::string(IDEMSINK_SOURCE_DIR) + "/examples/hello_handler", "-B", build,
       "-DCMAKE_PREFIX_PATH=" + prefix, "-DCMAKE_BUILD_TYPE=Release"});
  run(dir, "build", {CMAKE_COMMAND, "--build", build});
  const std::string so = build + "/hello_handler.so";
  BOOST_REQUIRE(std::filesystem::exists(so));
  // Its unit test, built with the plugin from the installed <idemsink/testing.h>.
  run(dir, "unit-test", {build + "/hello_handler_test"});

  const std::string installed = prefix + "/bin/idemsink";
  const std::string info = run(dir, "plugin-info", {installed, "plugin-info", so});
  // Built against the installed header: this tree's ABI version.
  const std::string abi =
      "abi:         v" + std::to_string(IDEMSINK_ABI_MAJOR) + "." + std::to_string(IDEMSINK_ABI_MINOR);
  for (const std::string s : {"name:        hello", "kind:        local_tx", abi.c_str(),
                              "greeting (string, default hello)", "greeted_twice"})
    BOOST_TEST(info.find(s) != std::string::npos, "'" << s << "' not in:\n" << info);

  // And it runs: 300 records, a third of them repeats, each key greeted once.
  auto db = MariaDbServer::shared().fresh_database("out_of_tree");
  TestKafka kafka;
  kafka.create_topic("people", 2);
  std::vector<TestMessage> msgs;
  std::set<std::string> keys;
  for (int i = 0; i < 300; ++i) {
    const std::string k = "person-" + std::to_string(i % 200);
    keys.insert(k);
    msgs.push_back({k, "{}"});
  }
  kafka.produce("people", msgs);
  const std::string config =
      base_config(kafka, db, "host-a", "g") + route_config({"hello", "people", so, "", {{"greeting", "\"你好\""}}});
  write_file(dir / "hello.toml", config);
  Process host({installed, "run", "--config", (dir / "hello.toml").string()}, dir / "host.out", dir / "host.log");
  auto hi = kafka.high_watermarks("people", 2);
  wait_until(
      [&] {
        if (!host.running()) throw std::runtime_error("host exited:\n" + host.err());
        auto c = kafka.committed("g", "people", 2);
        return c[0] >= hi[0] && c[1] >= hi[1];
      },
      60s, "the installed host to process everything");
  host.signal(SIGTERM);
  BOOST_TEST(host.wait(60s).value_or(-1) == 0);
  auto conn = MariaDbServer::shared().connect("out_of_tree");
  BOOST_TEST(std::stoul(*conn->query("SELECT COUNT(*) FROM hello_greetings")[0][0]) == keys.size());
  BOOST_TEST(*conn->query("SELECT greeting FROM hello_greetings WHERE biz_key = 'person-7'")[0][0] == "你好 person-7");
  BOOST_TEST(host.err().find("ready to say 你好") != std::string::npos);
  run(dir, "check", {installed, "reconcile", "--check", "--config", (dir / "hello.toml").string()});
}
