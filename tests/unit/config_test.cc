#define BOOST_TEST_MODULE config
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/config/config.h"

using namespace idemsink::config;

namespace {

const std::string kMinimal = R"([kafka]
bootstrap_servers = "127.0.0.1:9092"

[database]
database = "shop"

[[route]]
name = "waybill"
topic = "orders"
plugin = "/opt/plugins/waybill.so"
)";

// Expects load_string to throw a ConfigError whose message contains every fragment.
void expect_error(const std::string& text, std::initializer_list<std::string> fragments) {
  try {
    load_string(text, "test.toml");
    BOOST_FAIL("expected a config error");
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    for (const auto& f : fragments) BOOST_TEST(msg.find(f) != std::string::npos, "'" << f << "' not in: " << msg);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(minimal_config_gets_documented_defaults) {
  Config c = load_string(kMinimal, "test.toml");
  BOOST_TEST(c.kafka.group_id == "idemsink");
  BOOST_TEST(c.kafka.max_poll_records == 500);
  BOOST_TEST(c.host.max_in_flight == 2000);
  BOOST_TEST(!c.host.id.empty());  // hostname
  BOOST_TEST(c.claim.lease.count() == 30000);
  BOOST_TEST(c.claim.retention_days == 90);
  BOOST_REQUIRE(c.routes.size() == 1u);
  BOOST_TEST(c.routes[0].dlq.topic == "orders.dlq");
  BOOST_TEST((c.routes[0].key_source == KeySource::MessageKey));
  BOOST_TEST(c.routes[0].retry.max_attempts == 5);
}

BOOST_AUTO_TEST_CASE(unknown_keys_name_file_line_and_key) {
  expect_error(kMinimal + "\n[host]\nmax_inflight = 3\n", {"test.toml:13:", "host.max_inflight", "unknown key in [host]"});
  expect_error("[kafak]\nx = 1\n" + kMinimal, {"test.toml:1:", "kafak", "unknown section"});
}

BOOST_AUTO_TEST_CASE(wrong_types_and_bounds_are_errors) {
  expect_error(kMinimal + "\n[host]\nmax_in_flight = \"many\"\n", {"host.max_in_flight", "expected an integer"});
  expect_error(kMinimal + "\n[host]\nmax_in_flight = 0\n", {"host.max_in_flight", "between 1 and 100000"});
  expect_error(kMinimal + "\n[claim]\nlease = 30\n", {"claim.lease", "duration"});
  expect_error(kMinimal + "\n[claim]\nlease = \"10ms\"\n", {"claim.lease", "between 1000ms"});
}

BOOST_AUTO_TEST_CASE(missing_required_keys_are_errors) {
  expect_error("[database]\ndatabase = \"x\"\n[[route]]\nname=\"a\"\ntopic=\"t\"\nplugin=\"p\"\n", {"kafka", "required"});
  expect_error("[kafka]\nbootstrap_servers=\"b\"\n[database]\ndatabase=\"x\"\n[[route]]\nname = \"a\"\nplugin=\"p\"\n",
               {"test.toml:5:", "route.topic", "required key is missing"});
}

BOOST_AUTO_TEST_CASE(route_rules) {
  expect_error(kMinimal + "\n[[route]]\nname = \"waybill\"\ntopic = \"other\"\nplugin = \"p.so\"\n", {"duplicate route name"});
  expect_error(kMinimal + "\n[[route]]\nname = \"sms\"\ntopic = \"orders\"\nplugin = \"p.so\"\n", {"one route per topic"});
  expect_error(kMinimal + "\n[[route]]\nname = \"bad name!\"\ntopic = \"t2\"\nplugin = \"p.so\"\n", {"route.name"});
  expect_error(kMinimal + "[route.key]\nfrom = \"json\"\n", {"route.key.json", "required when from"});
  expect_error(kMinimal + "[route.key]\nfrom = \"body\"\n", {"route.key.from"});
  expect_error(kMinimal + "[route.dlq]\ntopic = \"orders\"\n", {"route.dlq.topic", "must differ"});
  expect_error(kMinimal + "[route.retry]\nbackoff_initial = \"10s\"\nbackoff_max = \"1s\"\n", {"backoff_max"});
}

BOOST_AUTO_TEST_CASE(relative_plugin_paths_resolve_against_the_config_folder) {
  Config c = load_string(
      "[kafka]\nbootstrap_servers=\"b\"\n[database]\ndatabase=\"x\"\n[[route]]\nname=\"a\"\ntopic=\"t\"\nplugin=\"lib/a.so\"\n",
      "test.toml");
  BOOST_TEST(c.routes[0].plugin.is_absolute());
  BOOST_TEST(c.routes[0].plugin.filename() == "a.so");
}

BOOST_AUTO_TEST_CASE(environment_variables_expand_and_missing_ones_are_errors) {
  ::setenv("IDEMSINK_TEST_BOOTSTRAP", "10.0.0.1:9092", 1);
  Config c = load_string(
      "[kafka]\nbootstrap_servers=\"${IDEMSINK_TEST_BOOTSTRAP}\"\n[database]\ndatabase=\"x\"\n"
      "[[route]]\nname=\"a\"\ntopic=\"t\"\nplugin=\"p.so\"\n",
      "test.toml");
  BOOST_TEST(c.kafka.bootstrap_servers == "10.0.0.1:9092");
  expect_error(
      "[kafka]\nbootstrap_servers=\"${IDEMSINK_TEST_UNSET_VAR}\"\n[database]\ndatabase=\"x\"\n"
      "[[route]]\nname=\"a\"\ntopic=\"t\"\nplugin=\"p.so\"\n",
      {"test.toml:2:", "IDEMSINK_TEST_UNSET_VAR is not set"});
}

BOOST_AUTO_TEST_CASE(password_comes_from_the_named_variable) {
  ::setenv("IDEMSINK_TEST_DB_PW", "s3cret", 1);
  Config c = load_string(kMinimal + "\n", "test.toml");
  BOOST_TEST(c.database.password.empty());
  std::string text = kMinimal;
  text.replace(text.find("database = \"shop\""), 17, "database = \"shop\"\npassword_env = \"IDEMSINK_TEST_DB_PW\"");
  BOOST_TEST(load_string(text, "test.toml").database.password == "s3cret");
  text.replace(text.find("IDEMSINK_TEST_DB_PW"), 19, "IDEMSINK_TEST_NO_PW");
  expect_error(text, {"database.password_env", "IDEMSINK_TEST_NO_PW is not set"});
}

BOOST_AUTO_TEST_CASE(toml_syntax_errors_carry_the_position) {
  expect_error("[kafka\nbootstrap_servers = 1", {"test.toml:1:"});
}

BOOST_AUTO_TEST_CASE(handler_options_keep_their_type_and_line) {
  Config c = load_string(kMinimal + "[route.options]\nendpoint = \"http://x\"\ntimeout = \"2s\"\npool = 8\n", "test.toml");
  const auto& opts = c.routes[0].options;
  BOOST_TEST(opts.at("endpoint").text == "http://x");
  BOOST_TEST((opts.at("pool").toml_type == OptionValue::TomlType::Integer));
  BOOST_TEST(opts.at("pool").pos.line == 14u);
}

BOOST_AUTO_TEST_CASE(reference_lists_every_section) {
  const std::string md = reference_markdown();
  for (const char* s : {"## [host]", "## [kafka]", "## [database]", "## [claim]", "## [[route]]", "`max_in_flight`",
                        "`lease`", "`retention_days`"})
    BOOST_TEST(md.find(s) != std::string::npos, s);
}

BOOST_AUTO_TEST_CASE(committed_reference_matches_the_declarations) {
  std::ifstream in(std::string(IDEMSINK_SOURCE_DIR) + "/conf/CONFIGURATION.md");
  std::stringstream committed;
  committed << in.rdbuf();
  BOOST_TEST(committed.str() == reference_markdown(),
             "conf/CONFIGURATION.md is stale: regenerate it with `idemsink config-reference > conf/CONFIGURATION.md`");
}

BOOST_AUTO_TEST_CASE(shipped_configs_load) {
  for (const char* var : {"HOSTNAME", "KAFKA_PASSWORD", "IDEMSINK_DB_PASSWORD", "IDEMSINK_DEMO_ADMIN", "IDEMSINK_DEMO_KAFKA",
                          "IDEMSINK_DEMO_DB_SOCKET", "IDEMSINK_DEMO_SERVICES", "IDEMSINK_PLUGIN_DIR"})
    ::setenv(var, "127.0.0.1:1", 0);
  const std::string dir = std::string(IDEMSINK_SOURCE_DIR) + "/conf/";
  Config prod = load_file(dir + "idemsink.toml");
  BOOST_TEST(prod.routes.size() == 4u);
  BOOST_TEST(prod.routes[2].retry.topics.size() == 2u);
  BOOST_TEST(prod.database.password == std::string(std::getenv("IDEMSINK_DB_PASSWORD")));
  Config demo = load_file(dir + "demo.toml");
  BOOST_TEST(demo.routes.size() == 4u);
}
