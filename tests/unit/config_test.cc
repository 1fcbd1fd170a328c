#define BOOST_TEST_MODULE config
#include <boost/test/unit_test.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/config/config.h"
#include "core/config/reload.h"
#include "core/kafka/client.h"
#include "core/kafka/consumer.h"

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

// The message of the ConfigError load_string throws for `text`.
std::string error_of(const std::string& text) {
  try {
    load_string(text, "test.toml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  BOOST_FAIL("expected a config error");
  return "";
}

// Expects load_string to throw a ConfigError whose message contains every fragment.
void expect_error(const std::string& text, std::initializer_list<std::string> fragments) {
  const std::string msg = error_of(text);
  for (const auto& f : fragments) BOOST_TEST(msg.find(f) != std::string::npos, "'" << f << "' not in: " << msg);
}

// A config whose [kafka] section ends with `kafka_tail` (lines from 3 on).
std::string with_kafka(const std::string& kafka_tail) {
  return "[kafka]\nbootstrap_servers = \"b:9092\"\n" + kafka_tail +
         "\n[database]\ndatabase = \"shop\"\n[[route]]\nname = \"a\"\ntopic = \"t\"\nplugin = \"/p.so\"\n";
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
  expect_error(kMinimal + "\n[host]\nmax_inflight = 3\n",
               {"test.toml:13:", "host.max_inflight", "unknown key in [host]"});
  expect_error("[kafak]\nx = 1\n" + kMinimal, {"test.toml:1:", "kafak", "unknown section"});
}

BOOST_AUTO_TEST_CASE(wrong_types_and_bounds_are_errors) {
  expect_error(kMinimal + "\n[host]\nmax_in_flight = \"many\"\n", {"host.max_in_flight", "expected an integer"});
  expect_error(kMinimal + "\n[host]\nmax_in_flight = 0\n", {"host.max_in_flight", "between 1 and 100000"});
  expect_error(kMinimal + "\n[claim]\nlease = 30\n", {"claim.lease", "duration"});
  expect_error(kMinimal + "\n[claim]\nlease = \"10ms\"\n", {"claim.lease", "between 1000ms"});
}

BOOST_AUTO_TEST_CASE(missing_required_keys_are_errors) {
  expect_error("[database]\ndatabase = \"x\"\n[[route]]\nname=\"a\"\ntopic=\"t\"\nplugin=\"p\"\n",
               {"kafka", "required"});
  expect_error("[kafka]\nbootstrap_servers=\"b\"\n[database]\ndatabase=\"x\"\n[[route]]\nname = \"a\"\nplugin=\"p\"\n",
               {"test.toml:5:", "route.topic", "required key is missing"});
}

BOOST_AUTO_TEST_CASE(route_rules) {
  expect_error(kMinimal + "\n[[route]]\nname = \"waybill\"\ntopic = \"other\"\nplugin = \"p.so\"\n",
               {"duplicate route name"});
  expect_error(
      kMinimal + "\n[[route]]\nname = \"sms\"\ntopic = \"orders\"\nplugin = \"p.so\"\n",
      {"test.toml:14:", "route.group_id", "routes waybill and sms both read topic \"orders\"", "keeps \"idemsink\"",
       "group_id = \"idemsink.sms\" if sms is new", "\"idemsink.waybill\" if waybill is"});
  expect_error(kMinimal + "\n[[route]]\nname = \"bad name!\"\ntopic = \"t2\"\nplugin = \"p.so\"\n", {"route.name"});
  expect_error(kMinimal + "[route.key]\nfrom = \"json\"\n", {"route.key.json", "required when from"});
  expect_error(kMinimal + "[route.key]\nfrom = \"body\"\n", {"route.key.from"});
  expect_error(kMinimal + "[route.dlq]\ntopic = \"orders\"\n", {"route.dlq.topic", "must differ"});
  expect_error(kMinimal + "[route.retry]\nbackoff_initial = \"10s\"\nbackoff_max = \"1s\"\n", {"backoff_max"});
}

// Several routes may read one topic, each in a group of its own; the one
// in kafka.group_id keeps the retry topics a topic's route always had, so
// adding a route renames nothing.
BOOST_AUTO_TEST_CASE(routes_sharing_a_topic_read_it_in_groups_of_their_own) {
  const Config c = load_string(kMinimal +
                                   "[route.retry]\ntopics = [\"1s\"]\n"
                                   "[[route]]\nname = \"sms\"\ntopic = \"orders\"\nplugin = \"/p.so\"\n"
                                   "group_id = \"idemsink.sms\"\n[route.retry]\ntopics = [\"1s\", \"1m\"]\n"
                                   "[[route]]\nname = \"ledger\"\ntopic = \"payments\"\nplugin = \"/p.so\"\n"
                                   "[route.retry]\ntopics = [\"1s\"]\n",
                               "test.toml");
  BOOST_REQUIRE(c.routes.size() == 3);
  BOOST_TEST(c.routes[0].group_id == "idemsink");
  BOOST_TEST(c.routes[1].group_id == "idemsink.sms");
  BOOST_TEST(c.routes[2].group_id == "idemsink");
  BOOST_TEST(c.routes[0].retry_topic(1) == "orders.retry.1");
  BOOST_TEST(c.routes[1].retry_topic(2) == "orders.sms.retry.2");
  BOOST_TEST(c.routes[2].retry_topic(1) == "payments.retry.1");
  // A route reads its topic and its own retry topics, never another's.
  BOOST_TEST(c.routes[1].topics() == (std::vector<std::string>{"orders", "orders.sms.retry.1", "orders.sms.retry.2"}));

  // A topic named like another route's retry stem would share retry topics.
  expect_error(kMinimal +
                   "[[route]]\nname = \"a\"\ntopic = \"orders.sms\"\nplugin = \"/p.so\"\n"
                   "[route.retry]\ntopics = [\"1s\"]\n"
                   "[[route]]\nname = \"sms\"\ntopic = \"orders\"\nplugin = \"/p.so\"\ngroup_id = \"g2\"\n"
                   "[route.retry]\ntopics = [\"1s\"]\n",
               {"route.retry.topics", "orders.sms.retry.1", "another route's"});
}

BOOST_AUTO_TEST_CASE(route_when_reads_tests_and_combinations) {
  const Config c = load_string(kMinimal + R"([route.when]
any = [{ json = "type", one_of = ["order.created", "order.paid"] },
       { all = [{ header = "source", starts_with = "shop-" }, { not = { key = true, exists = false } }] }]
)",
                               "test.toml");
  BOOST_REQUIRE(c.routes[0].when.has_value());
  const Condition& w = *c.routes[0].when;
  BOOST_TEST(static_cast<int>(w.kind) == static_cast<int>(Condition::Kind::Any));
  BOOST_REQUIRE(w.parts.size() == 2);
  BOOST_TEST(w.parts[0].name == "type");
  BOOST_TEST(w.parts[0].values.size() == 2);
  BOOST_TEST(static_cast<int>(w.parts[1].kind) == static_cast<int>(Condition::Kind::All));
  BOOST_TEST(static_cast<int>(w.parts[1].parts[1].kind) == static_cast<int>(Condition::Kind::Not));
  BOOST_TEST(static_cast<int>(w.parts[1].parts[1].parts[0].test) == static_cast<int>(Condition::Test::Absent));

  expect_error(kMinimal + "when = \"type\"\n", {"route.when", "expected a table"});
  expect_error(kMinimal + "[route.when]\njson = \"type\"\n", {"test.toml:11:", "route.when", "says one thing"});
  expect_error(kMinimal + "[route.when]\nequals = \"x\"\n", {"route.when", "names one thing"});
  expect_error(kMinimal + "[route.when]\njson = \"a..b\"\nequals = \"x\"\n", {"route.when.json", "dotted"});
  expect_error(kMinimal + "[route.when]\nheader = \"t\"\nequals = \"x\"\nexists = true\n", {"says one thing"});
  expect_error(kMinimal + "[route.when]\nall = []\n", {"route.when.all", "one or more"});
  expect_error(kMinimal + "[route.when]\nany = [{ json = \"t\", equals = 1 }]\n",
               {"route.when.any.equals", "non-empty string"});
  expect_error(kMinimal + "[route.when]\nnot = { key = false, exists = true }\n", {"route.when.not.key", "key = true"});
  expect_error(kMinimal + "[route.when]\njson = \"t\"\nequal = \"x\"\n", {"route.when.equal", "unknown key"});
  expect_error(kMinimal + "[route.when]\nall = [{ json = \"t\", equals = \"x\" }]\njson = \"u\"\n",
               {"never several at once"});
}

BOOST_AUTO_TEST_CASE(relative_plugin_paths_resolve_against_the_config_folder) {
  Config c = load_string(
      "[kafka]\nbootstrap_servers=\"b\"\n[database]\ndatabase=\"x\"\n[[route]]\nname=\"a\"\ntopic=\"t\"\nplugin=\"lib/"
      "a.so\"\n",
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
  Config c =
      load_string(kMinimal + "[route.options]\nendpoint = \"http://x\"\ntimeout = \"2s\"\npool = 8\n", "test.toml");
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
  for (const char* var :
       {"HOSTNAME", "KAFKA_PASSWORD", "IDEMSINK_DB_PASSWORD", "IDEMSINK_DEMO_ADMIN", "IDEMSINK_DEMO_KAFKA",
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

BOOST_AUTO_TEST_CASE(defaults_come_from_the_declarations) {
  // The structs carry no defaults of their own: every value below is the table's.
  Config c = load_string(kMinimal, "test.toml");
  BOOST_TEST(c.host.max_buffered_records == 20000);
  BOOST_TEST(c.host.shutdown_grace.count() == 30000);
  BOOST_TEST((c.host.log_level == idemsink::LogLevel::Info));
  BOOST_TEST(c.host.admin_listen.empty());
  BOOST_TEST(c.kafka.poll_timeout.count() == 100);
  BOOST_TEST(c.kafka.commit_interval.count() == 1000);
  BOOST_TEST(c.kafka.stall_timeout.count() == 30000);
  BOOST_TEST(c.database.host == "127.0.0.1");
  BOOST_TEST(c.database.port == 3306);
  BOOST_TEST(c.database.user == "root");
  BOOST_TEST(c.database.pool_size == 4);
  BOOST_TEST(c.database.connect_timeout.count() == 5000);
  BOOST_TEST(c.database.reconnect_backoff_max.count() == 5000);
  BOOST_TEST(c.claim.wait_recheck.count() == 1000);
  BOOST_TEST(c.claim.horizon_margin_days == 7);
  BOOST_TEST(c.claim.max_future_skew.count() == 3600000);
  BOOST_TEST(c.claim.apply_schema);
  BOOST_TEST(c.claim.max_takeovers == 5);
  BOOST_TEST(c.claim.flush_linger.count() == 5);
  BOOST_TEST(c.claim.stuck_after.count() == 600000);
  BOOST_TEST(c.claim.reconcile_interval.count() == 60000);
  const RouteConfig& r = c.routes.at(0);
  BOOST_TEST(r.concurrency == 0);
  BOOST_TEST(r.call_timeout.count() == 30000);
  BOOST_TEST(r.payload_check);
  BOOST_TEST(r.max_record_bytes == 983040);
  BOOST_TEST(r.retry.backoff_initial.count() == 200);
  BOOST_TEST(r.retry.backoff_max.count() == 30000);
  BOOST_TEST(r.retry.topics.empty());
  BOOST_TEST(r.dlq.enabled);
}

BOOST_AUTO_TEST_CASE(set_values_reach_their_fields) {
  Config c = load_string(kMinimal +
                             "concurrency = 7\ncall_timeout = \"2s\"\npayload_check = false\nmax_record_bytes = 4096\n"
                             "key = { from = \"header\", header = \"order-no\", json = \"unused\" }\n"
                             "[route.retry]\nmax_attempts = 3\nbackoff_initial = \"1s\"\nbackoff_max = \"1m\"\n"
                             "topics = [\"10s\", \"5m\"]\n[route.dlq]\nenabled = false\ntopic = \"dead\"\n"
                             "[claim]\nretention_days = 30\nhorizon_margin_days = 3\napply_schema = false\n"
                             "[host]\nmax_in_flight = 10\nadmin_listen = \"127.0.0.1:0\"\n",
                         "test.toml");
  BOOST_TEST(c.host.max_in_flight == 10);
  BOOST_TEST(c.host.admin_listen == "127.0.0.1:0");
  BOOST_TEST(c.claim.retention_days == 30);
  BOOST_TEST(c.claim.horizon_margin_days == 3);
  BOOST_TEST(!c.claim.apply_schema);
  const RouteConfig& r = c.routes.at(0);
  BOOST_TEST(r.concurrency == 7);
  BOOST_TEST(r.call_timeout.count() == 2000);
  BOOST_TEST(!r.payload_check);
  BOOST_TEST(r.max_record_bytes == 4096);
  BOOST_TEST((r.key_source == KeySource::Header));
  BOOST_TEST(r.key_header == "order-no");
  BOOST_TEST(r.key_json_path.empty());  // only the source `from` names is kept
  BOOST_TEST(r.retry.max_attempts == 3);
  BOOST_TEST(r.retry.backoff_initial.count() == 1000);
  BOOST_TEST(r.retry.backoff_max.count() == 60000);
  BOOST_REQUIRE(r.retry.topics.size() == 2u);
  BOOST_TEST(r.retry.topics[1].count() == 300000);
  BOOST_TEST(!r.dlq.enabled);
  BOOST_TEST(r.dlq.topic == "dead");
}

BOOST_AUTO_TEST_CASE(shipped_kafka_password_comes_from_the_environment) {
  // The value is taken as it is: no second expansion of what the variable holds.
  const std::string password = "pa$$w0rd-${NOT_EXPANDED}";
  ::setenv("KAFKA_PASSWORD", password.c_str(), 1);
  for (const char* var : {"HOSTNAME", "IDEMSINK_DB_PASSWORD"}) ::setenv(var, "x", 0);
  Config prod = load_file(std::string(IDEMSINK_SOURCE_DIR) + "/conf/idemsink.toml");
  BOOST_TEST(prod.kafka.properties.at("sasl.password") == password);
  BOOST_TEST(prod.kafka.properties.at("sasl.username") == "idemsink");
}

BOOST_AUTO_TEST_CASE(every_kafka_map_expands_the_environment) {
  ::setenv("IDEMSINK_TEST_CLIENT", "sink-7", 1);
  Config c = load_string(with_kafka("[kafka.properties]\n\"client.id\" = \"${IDEMSINK_TEST_CLIENT}\"\n"
                                    "[kafka.consumer]\n\"group.instance.id\" = \"${IDEMSINK_TEST_CLIENT}-c\"\n"
                                    "[kafka.producer]\n\"linger.ms\" = 5\n"
                                    "\"client.id\" = \"p-${IDEMSINK_TEST_CLIENT}\"\n"),
                         "test.toml");
  BOOST_TEST(c.kafka.properties.at("client.id") == "sink-7");
  BOOST_TEST(c.kafka.consumer_properties.at("group.instance.id") == "sink-7-c");
  BOOST_TEST(c.kafka.producer_properties.at("client.id") == "p-sink-7");
  BOOST_TEST(c.kafka.producer_properties.at("linger.ms") == "5");
  expect_error(with_kafka("[kafka.consumer]\n\"client.id\" = \"${IDEMSINK_TEST_UNSET_VAR}\"\n"),
               {"test.toml:4:", "kafka.consumer.client.id", "IDEMSINK_TEST_UNSET_VAR is not set"});
}

BOOST_AUTO_TEST_CASE(double_dollar_is_a_literal_dollar) {
  Config c = load_string(with_kafka("[kafka.properties]\n\"sasl.password\" = \"a$$b$${HOME}c$d$\"\n"), "test.toml");
  BOOST_TEST(c.kafka.properties.at("sasl.password") == "a$b${HOME}c$d$");
  Config o = load_string(kMinimal + "[route.options]\nprice = \"$$5\"\n", "test.toml");
  BOOST_TEST(o.routes[0].options.at("price").text == "$5");
}

BOOST_AUTO_TEST_CASE(expansion_errors_never_show_a_secret) {
  const std::string kafka = error_of(with_kafka("[kafka.properties]\n\"sasl.password\" = \"hunter2${oops\"\n"));
  BOOST_TEST(kafka.find("test.toml:4:") != std::string::npos, kafka);
  BOOST_TEST(kafka.find("kafka.properties.sasl.password") != std::string::npos, kafka);
  BOOST_TEST(kafka.find("unterminated") != std::string::npos, kafka);
  BOOST_TEST(kafka.find("hunter2") == std::string::npos, kafka);
  BOOST_TEST(kafka.find("oops") == std::string::npos, kafka);

  std::string text = kMinimal;
  text.replace(text.find("database = \"shop\""), 17, "database = \"shop\"\npassword = \"s3cr3t${x y}\"");
  const std::string db = error_of(text);
  BOOST_TEST(db.find("database.password") != std::string::npos, db);
  BOOST_TEST(db.find("s3cr3t") == std::string::npos, db);

  const std::string opt = error_of(kMinimal + "[route.options]\napi_token = \"tok-123${IDEMSINK_TEST_UNSET_VAR}\"\n");
  BOOST_TEST(opt.find("route.options.api_token") != std::string::npos, opt);
  BOOST_TEST(opt.find("tok-123") == std::string::npos, opt);
  BOOST_TEST(opt.find("IDEMSINK_TEST_UNSET_VAR") == std::string::npos, opt);

  // A key that is not secret-looking keeps its text in the message.
  expect_error(with_kafka("[kafka.properties]\n\"client.id\" = \"abc${oops\"\n"), {"unterminated", "abc${oops"});
}

BOOST_AUTO_TEST_CASE(rejected_kafka_properties_never_show_a_secret) {
  try {
    rd_kafka_conf_destroy(idemsink::kafka::make_conf({{"sasl.no.such.token", "hunter2-value"}}));
    BOOST_FAIL("expected librdkafka to reject the property");
  } catch (const idemsink::kafka::KafkaError& e) {
    const std::string msg = e.what();
    BOOST_TEST(msg.find("sasl.no.such.token") != std::string::npos, msg);
    BOOST_TEST(msg.find("hunter2") == std::string::npos, msg);
  }
  try {
    rd_kafka_conf_destroy(idemsink::kafka::make_conf({{"enable.auto.commit", "maybe"}}));
    BOOST_FAIL("expected librdkafka to reject the property");
  } catch (const idemsink::kafka::KafkaError& e) {
    const std::string msg = e.what();
    BOOST_TEST(msg.find("enable.auto.commit") != std::string::npos, msg);
    BOOST_TEST(msg.find("maybe") != std::string::npos, msg);  // not a secret: shown
  }
}

BOOST_AUTO_TEST_CASE(durations_that_overflow_are_errors) {
  // 213503982335d is 2^64 ms and a little more: it must not wrap into bounds.
  const std::string claim = kMinimal + "\n[claim]\nstuck_after = ";
  expect_error(claim + "\"213503982335d\"\n", {"test.toml:13:", "claim.stuck_after", "duration"});
  expect_error(claim + "\"9223372036854775808ms\"\n", {"test.toml:13:", "claim.stuck_after", "duration"});
  expect_error(claim + "\"106751991167d\"\n", {"test.toml:13:", "claim.stuck_after", "between"});  // fits, too long
}

BOOST_AUTO_TEST_CASE(admin_listen_must_be_an_address_and_a_port) {
  for (const char* ok : {"127.0.0.1:9464", "0.0.0.0:0", "127.0.0.1:65535", "[::1]:9464", "[::]:80"}) {
    Config c = load_string(kMinimal + "\n[host]\nadmin_listen = \"" + ok + "\"\n", "test.toml");
    BOOST_TEST(c.host.admin_listen == ok);
  }
  for (const char* bad : {"127.0.0.1:70000", "127.0.0.1:65536", "127.0.0.1", "127.0.0.1:", ":9464", "127.0.0.1:94x4",
                          "localhost:9464", "::1:9464", "[::1]", "127.0.0.1:-1"})
    expect_error(kMinimal + "\n[host]\nadmin_listen = \"" + bad + "\"\n", {"test.toml:13:", "host.admin_listen", bad});
}

// What the relay publishes (up to max_record_bytes of payload plus the DLQ
// headers) must fit the producer's message.max.bytes, or it never could be.
BOOST_AUTO_TEST_CASE(records_too_large_for_the_dlq_producer_are_refused_at_check_config) {
  const std::string base = R"(
[kafka]
bootstrap_servers = "127.0.0.1:9092"
[database]
database = "x"
[[route]]
name = "waybill"
topic = "orders"
plugin = "/dev/null"
)";
  BOOST_CHECK_NO_THROW(idemsink::config::load_string(base, "ok.toml"));
  try {
    idemsink::config::load_string(base + "max_record_bytes = 1048576\n", "big.toml");
    BOOST_FAIL("a 1 MiB record limit passed with the producer's 1,000,000-byte messages");
  } catch (const idemsink::config::ConfigError& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("big.toml:10:20: route.max_record_bytes:") == 0, what);
    BOOST_TEST(what.find("message.max.bytes (1000000)") != std::string::npos, what);
  }
  // Raising the producer's limit makes room.
  BOOST_CHECK_NO_THROW(idemsink::config::load_string(
      base + "max_record_bytes = 1048576\n[kafka.producer]\n\"message.max.bytes\" = \"2000000\"\n", "raised.toml"));
  // A route that publishes nothing is not limited by the producer.
  BOOST_CHECK_NO_THROW(
      idemsink::config::load_string(base + "max_record_bytes = 5000000\n[route.dlq]\nenabled = false\n", "nodlq.toml"));
}

BOOST_AUTO_TEST_CASE(database_tls_settings_are_checked_by_name) {
  // kMinimal's [database] section comes before [[route]]: TLS lines go right after its header.
  auto with_db = [](const std::string& lines) {
    std::string text = kMinimal;
    text.replace(text.find("[database]\n"), 11, "[database]\n" + lines);
    return text;
  };
  expect_error(with_db("tls_mode = \"on\"\n"), {"database.tls_mode", "disabled, preferred, required, verify"});
  expect_error(with_db("tls_mode = \"verify\"\n"), {"database.tls_mode", "needs database.tls_ca"});
  expect_error(with_db("tls_mode = \"verify\"\ntls_ca = \"/no/such/ca.pem\"\n"),
               {"database.tls_ca", "no such file: /no/such/ca.pem"});
  expect_error(with_db("tls_mode = \"required\"\ntls_cert = \"/etc/passwd\"\n"), {"tls_cert and tls_key go together"});
  expect_error(with_db("tls_ca = \"/etc/passwd\"\n"), {"database.tls_ca", "tls_mode is \"disabled\""});
  Config c = load_string(with_db("tls_mode = \"verify\"\ntls_ca = \"/etc/passwd\"\n"), "test.toml");
  BOOST_TEST((c.database.tls_mode == TlsMode::Verify));
  BOOST_TEST(c.database.tls_ca == "/etc/passwd");
}

// A setting whose value is one of a closed list takes only its choices and
// holds an enum; the error names the line, the key as the file writes it,
// the choices and the value.
BOOST_AUTO_TEST_CASE(closed_list_settings_take_only_their_choices) {
  Config d = load_string(kMinimal, "test.toml");
  BOOST_TEST((d.host.log_level == idemsink::LogLevel::Info));
  BOOST_TEST((d.host.log_format == idemsink::LogFormat::Text));
  BOOST_TEST((d.database.tls_mode == TlsMode::Disabled));
  BOOST_TEST((d.routes[0].rate_limit.scope == RateScope::Group));
  BOOST_TEST((d.routes[0].start_at == StartAt::Unset));
  BOOST_TEST((d.routes[0].order_by.on_dead == OnDead::GoOn));

  ::setenv("IDEMSINK_TEST_LOG_LEVEL", "warn", 1);
  Config c = load_string("[host]\nlog_level = \"${IDEMSINK_TEST_LOG_LEVEL}\"\nlog_format = \"json\"\n" + kMinimal +
                             "start_at = \"latest\"\nrate_limit = { rate = 10, per = \"1s\", scope = \"host\" }\n"
                             "order_by = { from = \"key\", on_dead = \"hold\" }\n"
                             "[route.database]\ntls_mode = \"required\"\n",
                         "test.toml");
  BOOST_TEST((c.host.log_level == idemsink::LogLevel::Warn));
  BOOST_TEST((c.host.log_format == idemsink::LogFormat::Json));
  const RouteConfig& r = c.routes.at(0);
  BOOST_TEST((r.start_at == StartAt::Latest));
  BOOST_TEST((r.rate_limit.scope == RateScope::Host));
  BOOST_TEST((r.order_by.on_dead == OnDead::Hold));
  BOOST_TEST(r.order_by.hold_on_dead());
  BOOST_TEST((c.database_of(r).tls_mode == TlsMode::Required));
  BOOST_TEST((c.database.tls_mode == TlsMode::Disabled));
  BOOST_TEST(choice_name(TlsMode::Required) == "required");
  // "" is start_at left unset.
  BOOST_TEST((load_string(kMinimal + "start_at = \"\"\n", "test.toml").routes[0].start_at == StartAt::Unset));

  expect_error("[host]\nlog_level = \"loud\"\n" + kMinimal,
               {"test.toml:2:13: host.log_level: must be one of trace, debug, info, warn, error; not \"loud\""});
  expect_error("[host]\nlog_format = \"xml\"\n" + kMinimal,
               {"test.toml:2:14: host.log_format: must be one of text, json; not \"xml\""});
  expect_error("[host]\nlog_level = 3\n" + kMinimal, {"test.toml:2:13: host.log_level: expected a string"});
  expect_error(kMinimal + "start_at = \"beginning\"\n",
               {"route.start_at: must be one of earliest, latest; not \"beginning\""});
  expect_error(kMinimal + "rate_limit = { rate = 10, per = \"1s\", scope = \"hosts\" }\n",
               {"route.rate_limit.scope: must be one of group, host; not \"hosts\""});
  expect_error(kMinimal + "order_by = { from = \"key\", on_dead = \"stop\" }\n",
               {"route.order_by.on_dead: must be one of go_on, hold; not \"stop\""});
  // A route's own [route.database] names its keys as the file writes them.
  expect_error(kMinimal + "[route.database]\ntls_mode = \"on\"\n",
               {"test.toml:12:12: route.database.tls_mode: must be one of disabled, preferred, required, verify; "
                "not \"on\""});
  expect_error(kMinimal + "[route.database]\nport = 0\n", {"route.database.port: must be between"});
}

BOOST_AUTO_TEST_CASE(a_route_database_inherits_what_it_does_not_set) {
  const std::string text =
      "[kafka]\nbootstrap_servers = \"b:9092\"\n[database]\nhost = \"db1\"\nport = 3307\nuser = "
      "\"app\"\npassword = \"pw\"\ndatabase = \"logistics\"\npool_size = 6\n"
      "[[route]]\nname = \"waybill\"\ntopic = \"orders\"\nplugin = \"/p.so\"\n"
      "[[route]]\nname = \"ledger\"\ntopic = \"payments\"\nplugin = \"/p.so\"\n"
      "[route.database]\nhost = \"db2\"\ndatabase = \"finance\"\n";
  Config c = load_string(text, "test.toml");
  BOOST_TEST(!c.routes[0].database.has_value());
  BOOST_TEST(&c.database_of(c.routes[0]) == &c.database);
  const DatabaseConfig& own = c.database_of(c.routes[1]);
  BOOST_TEST(own.host == "db2");
  BOOST_TEST(own.database == "finance");
  BOOST_TEST(own.port == 3307);  // inherited
  BOOST_TEST(own.user == "app");
  BOOST_TEST(own.password == "pw");
  BOOST_TEST(own.pool_size == 6);
  BOOST_TEST(own.label() == "finance@db2:3307");
  const auto slices = split_by_database(c);
  BOOST_TEST(slices.size() == 2u);
  BOOST_TEST(slices[0].database.database == "logistics");
  BOOST_TEST(slices[0].routes.size() == 1u);
  BOOST_TEST(slices[1].database.database == "finance");
  BOOST_TEST(slices[1].routes.at(0).name == "ledger");
  // One database, stated twice, is one slice.
  std::string same = text;
  same.replace(same.find("host = \"db2\"\ndatabase = \"finance\"\n"), 34, "pool_size = 8\n");
  BOOST_TEST(split_by_database(load_string(same, "test.toml")).size() == 1u);
  // Its keys are [database]'s, checked the same way.
  expect_error(text + "tls_mode = \"verify\"\n", {"route.database.tls_mode", "needs route.database.tls_ca"});
  expect_error(text + "shards = 2\n", {"route.database.shards", "unknown key"});
}

// A revocation waits up to shutdown_grace inside the rebalance callback;
// past max.poll.interval.ms the group evicts the member and rebalances again.
BOOST_AUTO_TEST_CASE(shutdown_grace_must_stay_below_the_max_poll_interval) {
  expect_error("[host]\nshutdown_grace = \"300s\"\n" + kMinimal,
               {"test.toml:2:", "host.shutdown_grace", "max.poll.interval.ms (300000ms)"});
  const Config c = load_string(
      "[host]\nshutdown_grace = \"300s\"\n[kafka]\nbootstrap_servers = \"b:9092\"\n[kafka.consumer]\n"
      "\"max.poll.interval.ms\" = \"600000\"\n[database]\ndatabase = \"shop\"\n[[route]]\nname = \"a\"\n"
      "topic = \"t\"\nplugin = \"/p.so\"\n",
      "test.toml");
  BOOST_TEST(c.host.shutdown_grace.count() == 300000);
}

// One consumer per database slice, all in one group: a static membership id
// given to all of them would make them fence each other.
BOOST_AUTO_TEST_CASE(each_slice_gets_its_own_static_membership_id) {
  const Config c = load_string(with_kafka("[kafka.consumer]\n\"group.instance.id\" = \"host-7\"\n"), "test.toml");
  BOOST_TEST(idemsink::kafka::slice_consumer_config(c.kafka, 0).consumer_properties.at("group.instance.id") ==
             "host-7");
  BOOST_TEST(idemsink::kafka::slice_consumer_config(c.kafka, 1).consumer_properties.at("group.instance.id") ==
             "host-7-1");
  BOOST_TEST(idemsink::kafka::slice_consumer_config(c.kafka, 2).consumer_properties.at("group.instance.id") ==
             "host-7-2");
  BOOST_TEST(!idemsink::kafka::slice_consumer_config(load_string(kMinimal, "t.toml").kafka, 1)
                  .consumer_properties.count("group.instance.id"));
}

// librdkafka answers NULL for the rebalance protocol at times while a
// consumer closes (its group handle is going away); the revoke callback of
// that close took it for a string and the host died of SIGSEGV on SIGTERM
// (torture seed 1, about one run in six). The configured assignor decides.
BOOST_AUTO_TEST_CASE(a_rebalance_protocol_librdkafka_cannot_report_is_the_configured_one) {
  using idemsink::kafka::cooperative_rebalance;
  BOOST_TEST(cooperative_rebalance("COOPERATIVE", false));
  BOOST_TEST(!cooperative_rebalance("EAGER", true));
  BOOST_TEST(cooperative_rebalance("NONE", true));
  BOOST_TEST(!cooperative_rebalance("NONE", false));
  BOOST_TEST(cooperative_rebalance(nullptr, true));
  BOOST_TEST(!cooperative_rebalance(nullptr, false));
}

// An empty route list means "every route" to the role check: a line whose
// list names no route (",", "a,,b", "a,") must be refused, never a grant of all.
BOOST_AUTO_TEST_CASE(a_tokens_file_route_list_that_names_no_route_is_refused) {
  const std::string file = "/tmp/idemsink_config_test_tokens_" + std::to_string(::getpid());
  for (const std::string routes : {",", "waybill,,sms", "waybill,"}) {
    std::ofstream(file) << "# name role routes secret\nolga operator " << routes << " operator-secret-0123456789\n";
    expect_error("[host]\nadmin_tokens_file = \"" + file + "\"\n" + kMinimal,
                 {"test.toml", "host.admin_tokens_file", file + ":2", "ROUTES \"" + routes + "\""});
  }
  std::ofstream(file) << "olga operator waybill operator-secret-0123456789\n";
  const Config ok = load_string("[host]\nadmin_tokens_file = \"" + file + "\"\n" + kMinimal, "test.toml");
  BOOST_REQUIRE(ok.host.admin_tokens.size() == 1u);
  BOOST_TEST(ok.host.admin_tokens[0].routes == std::vector<std::string>{"waybill"});
  std::remove(file.c_str());
}

// [kafka.oauth]: the client secret from the environment or a file only its
// owner reads, never written in; the login it is for; each mistake named
// with its file, line and key.
BOOST_AUTO_TEST_CASE(kafka_oauth_takes_its_secret_from_the_environment_or_a_private_file) {
  const std::string oauth_login = "\"security.protocol\" = \"SASL_SSL\"\n\"sasl.mechanisms\" = \"OAUTHBEARER\"\n";
  const auto with_oauth = [](const std::string& properties, const std::string& oauth) {
    return "[kafka]\nbootstrap_servers = \"b:9092\"\n[kafka.properties]\n" + properties + "[kafka.oauth]\n" + oauth +
           "[database]\ndatabase = \"shop\"\n[[route]]\nname = \"a\"\ntopic = \"t\"\nplugin = \"/p.so\"\n";
  };
  const std::string endpoint = "token_endpoint = \"https://idp.example/token\"\nclient_id = \"idemsink\"\n";
  ::setenv("TEST_KAFKA_OAUTH_SECRET", "s3cret", 1);
  const Config ok =
      load_string(with_oauth(oauth_login, endpoint + "client_secret_env = \"TEST_KAFKA_OAUTH_SECRET\"\n"), "test.toml");
  BOOST_TEST(ok.kafka.oauth.enabled());
  BOOST_TEST(ok.kafka.oauth.client_secret == "s3cret");
  BOOST_TEST(ok.kafka.oauth.timeout.count() == 10000);
  expect_error(with_oauth(oauth_login, endpoint + "client_secret_env = \"TEST_NO_SUCH_SECRET\"\n"),
               {"test.toml:", "kafka.oauth.client_secret_env", "TEST_NO_SUCH_SECRET is not set"});
  expect_error(with_oauth(oauth_login, endpoint), {"kafka.oauth.client_secret_env", "a client secret is required"});
  expect_error(
      with_oauth("\"sasl.mechanisms\" = \"PLAIN\"\n", endpoint + "client_secret_env = \"TEST_KAFKA_OAUTH_SECRET\"\n"),
      {"kafka.oauth", "needs \"sasl.mechanisms\" = \"OAUTHBEARER\""});
  expect_error(with_oauth(oauth_login, "client_id = \"x\"\n"), {"kafka.oauth.token_endpoint", "is required"});
  // A secret file others may read is refused; chmod 600 and it is taken.
  const std::string file = "/tmp/idemsink_config_test_oauth_" + std::to_string(::getpid());
  std::ofstream(file) << "from-a-file\n";
  ::chmod(file.c_str(), 0644);
  expect_error(with_oauth(oauth_login, endpoint + "client_secret_file = \"" + file + "\"\n"),
               {"kafka.oauth.client_secret_file", "mode 0644", "chmod 600"});
  ::chmod(file.c_str(), 0600);
  const Config from_file =
      load_string(with_oauth(oauth_login, endpoint + "client_secret_file = \"" + file + "\"\n"), "test.toml");
  BOOST_TEST(from_file.kafka.oauth.client_secret == "from-a-file");
  std::remove(file.c_str());
}

BOOST_AUTO_TEST_CASE(record_formats_and_their_registry) {
  setenv("IDEMSINK_TEST_REGISTRY_PASSWORD", "s3cret", 1);
  Config c = load_string(kMinimal +
                             "[route.value]\nformat = \"avro\"\n[route.key_format]\nformat = \"json\"\n"
                             "[route.schema_registry]\ntimeout = \"2s\"\n"
                             "[schema_registry]\nurl = \"https://registry.internal:8081/\"\nusername = \"idemsink\"\n"
                             "password_env = \"IDEMSINK_TEST_REGISTRY_PASSWORD\"\n",
                         "test.toml");
  const auto& r = c.routes.at(0);
  BOOST_TEST((r.value_format == Format::Avro));
  BOOST_TEST((r.key_format == Format::Json));
  BOOST_TEST(r.schema_registry.url == "https://registry.internal:8081");  // the slash dropped
  BOOST_TEST(r.schema_registry.password == "s3cret");                     // inherited
  BOOST_TEST(r.schema_registry.timeout.count() == 2000);                  // its own
  BOOST_TEST(c.schema_registry.timeout.count() == 5000);
  // The defaults: JSON values, keys as their bytes, no registry needed.
  const Config plain = load_string(kMinimal, "test.toml");
  BOOST_TEST((plain.routes.at(0).value_format == Format::Json));
  BOOST_TEST((plain.routes.at(0).key_format == Format::String));

  expect_error(kMinimal + "[route.value]\nformat = \"protobuf\"\n",
               {"test.toml:", "route.value.format", "protobuf needs a schema registry"});
  expect_error(kMinimal + "[route.value]\nformat = \"xml\"\n",
               {"route.value.format", "must be json, avro, protobuf, json_schema, string or bytes"});
  expect_error(kMinimal + "key = { from = \"json\", json = \"id\" }\n[route.value]\nformat = \"bytes\"\n",
               {"route.key.json", "the value format is bytes"});
  expect_error(kMinimal + "[route.value]\nformat = \"string\"\n[route.when]\njson = \"type\"\nequals = \"x\"\n",
               {"route.when", "a json test cannot be decided"});
  expect_error(kMinimal + "[schema_registry]\nurl = \"registry:8081\"\n",
               {"schema_registry.url", "must be an http:// or https:// URL"});
  expect_error(kMinimal + "[schema_registry]\nurl = \"http://r\"\ntoken_env = \"IDEMSINK_TEST_NO_SUCH_VARIABLE\"\n",
               {"schema_registry.token_env", "IDEMSINK_TEST_NO_SUCH_VARIABLE is not set"});
}

// What a reload may change while the host runs (config/reload.h).
namespace {

const std::string kTwoRoutes = R"([kafka]
bootstrap_servers = "127.0.0.1:9092"
group_id = "g"

[database]
database = "shop"

[host]
log_level = "info"

[[route]]
name = "waybill"
topic = "orders"
plugin = "/opt/plugins/waybill.so"
[route.retry]
max_attempts = 3
[route.options]
endpoint = "http://a"

[[route]]
name = "sms"
topic = "texts"
plugin = "/opt/plugins/sms.so"
)";

ReloadPlan plan_to(const std::string& next_text) {
  return plan_reload(load_string(kTwoRoutes, "a.toml"), kTwoRoutes, load_string(next_text, "a.toml"), next_text);
}

std::string with(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  BOOST_REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_reload_changes_routes_in_place_and_refuses_what_needs_a_restart) {
  // Comments and layout: nothing changes.
  BOOST_TEST(!plan_to("# a comment\n" + kTwoRoutes).changes_anything());

  // Options, concurrency, a filter, the log level: applied, to that route only.
  auto plan = plan_to(
      with(with(with(kTwoRoutes, "endpoint = \"http://a\"", "endpoint = \"http://b\""),
                "plugin = \"/opt/plugins/waybill.so\"", "plugin = \"/opt/plugins/waybill.so\"\nconcurrency = 4"),
           "log_level = \"info\"", "log_level = \"debug\""));
  BOOST_TEST(plan.refusal(false) == "");
  BOOST_TEST(plan.log_level_changed);
  BOOST_TEST(plan.routes_to_apply(false) == std::vector<std::string>{"waybill"});
  BOOST_TEST(plan.describe() == "changed host.log_level; route waybill: route.options.endpoint, route.concurrency");
  // Attempts, backoff, the output, a longer call_timeout: applied (the
  // reconciler reads them from the reload's snapshot). Retry topics, a
  // shorter call_timeout, the DLQ, switching the circuit off: a restart.
  const std::string sms = "plugin = \"/opt/plugins/sms.so\"";
  plan = plan_to(with(with(kTwoRoutes, "max_attempts = 3", "max_attempts = 5\nbackoff_max = \"9s\""), sms,
                      sms + "\ncall_timeout = \"60s\"\noutput = { topic = \"texts.out\" }"));
  BOOST_TEST(plan.refusal(false) == "");
  BOOST_TEST((plan.routes_to_apply(false) == std::vector<std::string>{"waybill", "sms"}));
  BOOST_TEST(plan_to(with(kTwoRoutes, sms, sms + "\ncall_timeout = \"5s\""))
                 .refusal(false)
                 .find("route sms needs a restart (route.call_timeout lowered") == 0u);
  BOOST_TEST(plan_to(with(kTwoRoutes, "max_attempts = 3", "max_attempts = 3\ntopics = [\"10s\"]")).refusal(false) ==
             "route waybill needs a restart (route.retry.topics)");
  BOOST_TEST(plan_to(with(kTwoRoutes, sms, sms + "\ndlq = { topic = \"x.dlq\" }")).refusal(false) ==
             "route sms needs a restart (route.dlq.topic)");
  BOOST_TEST(plan_to(with(kTwoRoutes, sms, sms + "\ncircuit = { enabled = false }")).refusal(false) ==
             "route sms needs a restart (route.circuit.enabled)");
  // A rate limit newly shared by the group: a restart; one per host: applied.
  BOOST_TEST(plan_to(with(kTwoRoutes, sms, sms + "\nrate_limit = { rate = 10, per = \"1s\" }"))
                 .refusal(false)
                 .find("route sms needs a restart (route.rate_limit") == 0u);
  BOOST_TEST(plan_to(with(kTwoRoutes, sms, sms + "\nrate_limit = { rate = 10, per = \"1s\", scope = \"host\" }"))
                 .refusal(false) == "");
  BOOST_TEST(plan_to(with(kTwoRoutes, "plugin = \"/opt/plugins/sms.so\"",
                          "plugin = \"/opt/plugins/sms.so\"\nwhen = { json = \"type\", equals = \"x\" }"))
                 .routes_to_apply(false) == std::vector<std::string>{"sms"});

  // Kafka, a route's topic or plugin file: a restart, naming the keys.
  BOOST_TEST(plan_to(with(kTwoRoutes, "group_id = \"g\"", "group_id = \"h\"")).refusal(true) ==
             "needs a restart (kafka.group_id)");
  BOOST_TEST(plan_to(with(kTwoRoutes, "topic = \"texts\"", "topic = \"texts2\"")).refusal(true) ==
             "route sms needs a restart (route.topic)");
  // Added or removed in a group of its own: applied; sharing a group with a
  // route that stays, or on a database no route uses: a restart.
  const std::string own_group = "[[route]]\nname = \"x\"\ntopic = \"x\"\nplugin = \"/p.so\"\ngroup_id = \"g.x\"\n";
  plan = plan_to(kTwoRoutes + own_group);
  BOOST_TEST(plan.refusal(false) == "");
  BOOST_TEST(plan.routes_of(RouteChange::Kind::Added) == std::vector<std::string>{"x"});
  BOOST_TEST(plan.describe() == "changed route x added");
  BOOST_TEST(plan_to(kTwoRoutes + "[[route]]\nname = \"x\"\ntopic = \"x\"\nplugin = \"/p.so\"\n").refusal(false) ==
             "route x is new in group g, which route(s) waybill, sms read: joining it would rebalance them; give it "
             "a group of its own (group_id = \"g.x\") or restart");
  BOOST_TEST(plan_to(kTwoRoutes + own_group + "[route.database]\ndatabase = \"other\"\n")
                 .refusal(false)
                 .find("route x is new on database other@") == 0u);
  BOOST_TEST(plan_to(kTwoRoutes.substr(0, kTwoRoutes.find("[[route]]\nname = \"sms\""))).refusal(false) ==
             "route sms is gone from group g, which route(s) waybill read on: leaving it would rebalance them; "
             "restart");
  const std::string sms_own = with(kTwoRoutes, "topic = \"texts\"", "topic = \"texts\"\ngroup_id = \"g.sms\"");
  plan = plan_reload(load_string(sms_own, "a.toml"), sms_own,
                     load_string(sms_own.substr(0, sms_own.find("[[route]]\nname = \"sms\"")), "a.toml"),
                     sms_own.substr(0, sms_own.find("[[route]]\nname = \"sms\"")));
  BOOST_TEST(plan.refusal(false) == "");
  BOOST_TEST(plan.routes_of(RouteChange::Kind::Removed) == std::vector<std::string>{"sms"});
  BOOST_TEST(plan.describe() == "changed route sms removed");

  // The biz_key's source: refused unless forced, then applied.
  plan = plan_to(with(kTwoRoutes, "topic = \"texts\"", "topic = \"texts\"\nkey = { from = \"json\", json = \"id\" }"));
  BOOST_TEST(plan.refusal(false).find("route sms: its identity changes (route.key.from, route.key.json)") == 0u,
             plan.refusal(false));
  BOOST_TEST(plan.refusal(false).find("refused unless forced") != std::string::npos);
  BOOST_TEST(plan.refusal(true) == "");
  BOOST_TEST(plan.routes_to_apply(true) == std::vector<std::string>{"sms"});
  BOOST_TEST(plan.routes_to_apply(false).empty());
  // Forced, a key change applies the route's other changes: a shorter call_timeout with it is a restart still.
  BOOST_TEST(plan_to(with(kTwoRoutes, "topic = \"texts\"",
                          "topic = \"texts\"\ncall_timeout = \"5s\"\nkey = { from = \"json\", json = \"id\" }"))
                 .refusal(true)
                 .find("route sms needs a restart (route.call_timeout lowered") == 0u);
  // A rename (same topic and group): an identity change even when forced.
  plan = plan_to(with(kTwoRoutes, "name = \"sms\"", "name = \"texts\""));
  BOOST_TEST(plan.refusal(true).find("route texts: was route sms") == 0u, plan.refusal(true));
  // A route replacing another on its topic in a group of its own: the same (its claims are empty).
  plan =
      plan_reload(load_string(sms_own, "a.toml"), sms_own,
                  load_string(with(with(sms_own, "name = \"sms\"", "name = \"texts\""), "g.sms", "g.texts"), "a.toml"),
                  with(with(sms_own, "name = \"sms\"", "name = \"texts\""), "g.sms", "g.texts"));
  BOOST_TEST(plan.refusal(true).find("route texts: was route sms (same topic)") == 0u, plan.refusal(true));
}
