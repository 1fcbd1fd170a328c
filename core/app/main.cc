// idemsink command line.
//
// Exit codes: 0 success, 1 runtime failure, 2 bad usage, config or plugin.
#include <boost/program_options.hpp>
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "core/app/build_info.h"
#include "core/app/commands.h"
#include "core/app/crash_report.h"
#include "core/app/host.h"
#include "core/common/fault.h"
#include "core/common/log.h"
#include "core/config/config.h"
#include "core/db/connection.h"
#include "core/kafka/client.h"
#include "core/offline/replay.h"
#include "core/plugin/plugin.h"

namespace po = boost::program_options;
using namespace idemsink;

namespace {

constexpr const char* kUsage = R"(usage: idemsink COMMAND [options]

commands:
  run --config FILE            consume and apply side effects until SIGTERM
  check-config --config FILE [--connect]   validate the config and load every plugin (and log in to Kafka)
  schema print|apply|migrate --config FILE
                               print or apply the claim, outbox and plugin DDL;
                               migrate: an older claim table to the current layout, online
  plugin-info FILE.so          show a plugin's name, kind, ABI and options
  reconcile --config FILE [--list | --check | --ask | --resolve TOKEN --as done|failed]
                               inspect and settle unknown or stuck claims; run plugin checks
  audit --config FILE          prove every committed offset is accounted for
  outbox --config FILE [--list | --retry ID | --discard ID] [--database LABEL]
                               outbox rows (dead letters, outcome events) Kafka refused for good:
                               list, publish again, drop (also as `dlq`)
  order-holds [release KEY] --config FILE [--route R] [--note TEXT]
                               entities held by an unfinished earlier record ([route.order_by]): list, release
  route pause|resume NAME --config FILE | route list --config FILE
                               pause or resume one route on every host of the group (kept across restarts)
  route rewind NAME --config FILE (--to-time T | --to-offset TOPIC:PART:OFFSET...) [--note TEXT]
  route skip NAME --config FILE --to-offset TOPIC:PART:OFFSET... --note TEXT
                               move a route's offsets on every host: read again (claims answer) or pass over
  replay --config FILE --route R [--reason REASON] [--since TIME] [--key K] [--dry-run] [--note TEXT]
                               re-open dead (failed) claims and drive their records again
  operator-log --config FILE [--route R] [--limit N]
                               what operators did (console, API, CLI), newest first, as JSON lines
  reload --config FILE [--force] [--note TEXT]
                               the host on this machine reads its config file again and applies what may
                               change while it runs (also SIGHUP, POST /api/v1/host/reload)
  dev-kafka [--brokers N] [--topic NAME:PARTITIONS]... [--control-port P]
                               run an embedded Kafka (librdkafka mock cluster)
  config-reference             print the configuration reference (Markdown)
  --version                    version, commit, librdkafka, Connector/C and plugin ABI versions


run `idemsink COMMAND --help` for a command's options)";

// A command about one database, run against each database the routes use
// (one, unless a route has its own [route.database]); the worst exit code wins.
int each_database(const config::Config& cfg, const std::function<int(const config::Config&)>& command) {
  const auto slices = config::split_by_database(cfg);
  int rc = 0;
  for (const auto& slice : slices) {
    if (slices.size() > 1) std::cout << "database " << slice.database.label() << ":\n";
    rc = std::max(rc, command(slice));
  }
  return rc;
}

// A command about one item (a token, an outbox id) that lives in one of the
// databases: done by the first that has it.
int first_database(const config::Config& cfg, const std::function<int(const config::Config&)>& command) {
  for (const auto& slice : config::split_by_database(cfg))
    if (command(slice) == 0) return 0;
  return 1;
}

// ---------------------------------------------------------------- the commands

// One command of the CLI: its usage line, its options (beside --help) and
// what it does with them.
struct Command {
  const char* name;
  const char* usage;  // after "usage: idemsink "
  void (*declare)(po::options_description& options, po::positional_options_description& positional);
  int (*run)(const po::variables_map& vm);
};

void config_option(po::options_description& o) {
  o.add_options()("config,c", po::value<std::string>()->required(), "config file (TOML)");
}

// The config the command names, with logging set up as it says.
config::Config load_config(const po::variables_map& vm, bool host_log_file = false) {
  config::Config cfg = config::load_file(vm["config"].as<std::string>());
  init_logging(cfg.host.log_level, cfg.host.log_format, host_log_file ? cfg.host.log_file : "");
  if (host_log_file) app::set_crash_report_file(cfg.host.log_file);
  return cfg;
}

// run, check-config, audit: the config alone.
void declare_config_only(po::options_description& o, po::positional_options_description&) { config_option(o); }

int run_host_command(const po::variables_map& vm) { return app::run(load_config(vm, true)); }
void declare_check_config(po::options_description& o, po::positional_options_description&) {
  config_option(o);
  o.add_options()("connect", "also log in to the Kafka cluster as the host would (exit 1 when it cannot)");
}
int check_config_command(const po::variables_map& vm) {
  return app::check_config(load_config(vm), vm.count("connect") != 0);
}
int audit_command(const po::variables_map& vm) { return each_database(load_config(vm), app::audit); }

void declare_schema(po::options_description& o, po::positional_options_description& pos) {
  config_option(o);
  o.add_options()("action", po::value<std::string>()->required(), "print, apply or migrate");
  pos.add("action", 1);
}
int schema_command(const po::variables_map& vm) {
  const std::string action = vm["action"].as<std::string>();
  if (action != "print" && action != "apply" && action != "migrate")
    throw po::error("schema action must be print, apply or migrate, not " + action);
  return each_database(load_config(vm), [&](const config::Config& c) { return app::schema(c, action); });
}

void declare_reconcile(po::options_description& o, po::positional_options_description&) {
  config_option(o);
  o.add_options()("list", "list unknown and stuck claims (the default)")(
      "check", "run every plugin's reconciliation checks (e.g. a biz_key credited twice); exit 1 on a problem")(
      "ask", "ask the plugins' reconcile hooks about unknown and stuck claims and settle what they can tell")(
      "resolve", po::value<std::string>(), "idem_token of an unknown or stuck claim to settle by hand")(
      "as", po::value<std::string>(), "done or failed, with --resolve")(
      "note", po::value<std::string>()->default_value("no note"), "why, stored with --resolve");
}
int reconcile_command(const po::variables_map& vm) {
  const config::Config cfg = load_config(vm);
  if (vm.count("check")) return each_database(cfg, app::reconcile_check);
  if (vm.count("ask")) return each_database(cfg, app::reconcile_ask);
  if (vm.count("resolve")) {
    if (!vm.count("as")) throw po::error("--resolve needs --as done|failed");
    return first_database(cfg, [&](const config::Config& c) {
      return app::reconcile_resolve(c, vm["resolve"].as<std::string>(), vm["as"].as<std::string>(),
                                    vm["note"].as<std::string>());
    });
  }
  return each_database(cfg, app::reconcile_list);
}

void declare_replay(po::options_description& o, po::positional_options_description&) {
  config_option(o);
  o.add_options()("route", po::value<std::string>()->required(), "the route whose failed claims to replay")(
      "reason", po::value<std::string>(), "only dead letters with this idemsink.reason (e.g. retries_exhausted)")(
      "since", po::value<std::string>(),
      "only claims that failed since: a duration back (\"2h\") or a UTC time (\"2026-11-30 14:00\")")(
      "key", po::value<std::string>(), "only this biz_key")("dry-run", "list what would be replayed; change nothing")(
      "note", po::value<std::string>()->default_value("no note"), "why, in the operator log");
}
int replay_command(const po::variables_map& vm) {
  const config::Config cfg = load_config(vm);
  operate::ReplayRequest r;
  r.route = vm["route"].as<std::string>();
  if (!cfg.route_by_name(r.route)) throw po::error("--route " + r.route + ": no such route in the config");
  if (vm.count("reason")) r.reason = vm["reason"].as<std::string>();
  if (vm.count("since")) {
    r.since = vm["since"].as<std::string>();
    try {
      offline::since_expression(*r.since);
    } catch (const std::invalid_argument& e) {
      throw po::error(e.what());
    }
  }
  if (vm.count("key")) r.key = vm["key"].as<std::string>();
  r.dry_run = vm.count("dry-run") != 0;
  return app::replay(cfg, r, vm["note"].as<std::string>());
}

void declare_plugin_info(po::options_description& o, po::positional_options_description& pos) {
  o.add_options()("file", po::value<std::string>()->required(), "plugin .so");
  pos.add("file", 1);
}
int plugin_info_command(const po::variables_map& vm) {
  std::cout << plugin::Library::load(vm["file"].as<std::string>())->info();
  return 0;
}

void declare_route(po::options_description& o, po::positional_options_description& pos) {
  config_option(o);
  o.add_options()("action", po::value<std::string>()->required(), "pause, resume, list, rewind or skip")(
      "name", po::value<std::string>(), "the route, as [[route]] name says")(
      "by", po::value<std::string>(), "who, stored with the change (default: cli:$USER on this machine)")(
      "note", po::value<std::string>()->default_value("no note"), "why, in the operator log (a skip must say)")(
      "to-time", po::value<std::string>(),
      "rewind: every partition to its first record stamped then or later (\"1h\" ago, or a UTC time)")(
      "to-offset", po::value<std::vector<std::string>>()->composing(),
      "rewind or skip: TOPIC:PARTITION:OFFSET, repeatable")("wait", po::value<int>()->default_value(30),
                                                            "seconds to wait for the hosts to apply a rewind or skip");
  pos.add("action", 1).add("name", 1);
}
int route_command(const po::variables_map& vm) {
  const std::string action = vm["action"].as<std::string>();
  if (action != "pause" && action != "resume" && action != "list" && action != "rewind" && action != "skip")
    throw po::error("route action must be pause, resume, list, rewind or skip, not " + action);
  const config::Config cfg = load_config(vm);
  if (action == "list") return app::route_list(cfg);
  if (!vm.count("name")) throw po::error("route " + action + " needs the route's name");
  const std::string by = vm.count("by") ? vm["by"].as<std::string>() : "";
  if (action == "rewind" || action == "skip") {
    const config::RouteConfig* route = cfg.route_by_name(vm["name"].as<std::string>());
    if (route == nullptr) throw po::error("no route named " + vm["name"].as<std::string>());
    offline::MoveAsk ask;
    ask.route = route->name;
    ask.kind = action == "skip" ? claim::OffsetMove::Kind::Skip : claim::OffsetMove::Kind::Rewind;
    if (vm.count("to-time")) {
      if (ask.kind == claim::OffsetMove::Kind::Skip)
        throw po::error("skip takes --to-offset: a skip passes over records, named one partition at a time");
      ask.to_time_ms = offline::point_in_time_ms(vm["to-time"].as<std::string>());
    }
    if (vm.count("to-offset"))
      for (const auto& t : vm["to-offset"].as<std::vector<std::string>>())
        ask.to_offsets.push_back(offline::partition_offset(t, route->topic));
    if (ask.to_time_ms.has_value() == !ask.to_offsets.empty())
      throw po::error("route " + action + " needs --to-time or --to-offset (one of them)");
    const std::string note = vm["note"].as<std::string>();
    if (ask.kind == claim::OffsetMove::Kind::Skip && (vm["note"].defaulted() || note.empty()))
      throw po::error("a skip passes over records: say why with --note");
    return app::route_move(cfg, ask, by, note, std::chrono::seconds(vm["wait"].as<int>()));
  }
  return app::route_pause(cfg, vm["name"].as<std::string>(), action == "pause", by, vm["note"].as<std::string>());
}

void declare_dlq(po::options_description& o, po::positional_options_description&) {
  config_option(o);
  o.add_options()("list", "list outbox rows Kafka refused for good (the default)")(
      "retry", po::value<uint64_t>(), "outbox id: publish it again (after raising a limit or creating a topic)")(
      "discard", po::value<uint64_t>(), "outbox id: drop it from the publishing queue (the row stays, stamped)")(
      "note", po::value<std::string>()->default_value("no note"), "why, stored with --discard and in the operator log")(
      "database", po::value<std::string>(),
      "with --retry or --discard when routes use several databases: the one of the id, as --list names it");
}
int dlq_command(const po::variables_map& vm) {
  const config::Config cfg = load_config(vm);
  if (!vm.count("retry") && !vm.count("discard")) return each_database(cfg, app::dlq_list);
  // Outbox ids are per database: with several, the operator names which.
  const auto slices = config::split_by_database(cfg);
  const config::Config* slice = &slices.front();
  if (slices.size() > 1) {
    std::string labels;
    for (const auto& s : slices) labels += " " + s.database.label();
    if (!vm.count("database")) throw po::error("routes use several databases: name one with --database:" + labels);
    slice = nullptr;
    for (const auto& s : slices)
      if (s.database.label() == vm["database"].as<std::string>()) slice = &s;
    if (slice == nullptr) throw po::error("--database " + vm["database"].as<std::string>() + ": not one of" + labels);
  }
  if (vm.count("retry")) return app::dlq_retry(*slice, vm["retry"].as<uint64_t>(), vm["note"].as<std::string>());
  return app::dlq_discard(*slice, vm["discard"].as<uint64_t>(), vm["note"].as<std::string>());
}

void declare_order_holds(po::options_description& o, po::positional_options_description& p) {
  config_option(o);
  o.add_options()("action", po::value<std::string>()->default_value("list"), "list | release")(
      "order-key", po::value<std::string>(), "with release: the entity to let go on")(
      "route", po::value<std::string>(), "the route (required with release)")(
      "note", po::value<std::string>()->default_value("no note"), "why, in the operator log");
  p.add("action", 1).add("order-key", 1);
}
int order_holds_command(const po::variables_map& vm) {
  const config::Config cfg = load_config(vm);
  const std::string action = vm["action"].as<std::string>();
  const std::string route = vm.count("route") ? vm["route"].as<std::string>() : "";
  if (action == "list") return app::order_holds_list(cfg, route);
  if (action != "release") throw po::error("unknown action '" + action + "': list or release");
  if (route.empty() || !vm.count("order-key")) throw po::error("release needs an order key and --route");
  return app::order_holds_release(cfg, route, vm["order-key"].as<std::string>(), vm["note"].as<std::string>());
}

void declare_operator_log(po::options_description& o, po::positional_options_description&) {
  config_option(o);
  o.add_options()("route", po::value<std::string>(), "only this route's actions")(
      "limit", po::value<size_t>()->default_value(1000), "the newest this many");
}
int operator_log_command(const po::variables_map& vm) {
  const config::Config cfg = load_config(vm);
  return app::operator_log(cfg, vm.count("route") ? vm["route"].as<std::string>() : "", vm["limit"].as<size_t>());
}

void declare_reload(po::options_description& o, po::positional_options_description&) {
  config_option(o);
  o.add_options()("force",
                  "also apply a change of a route's biz_key source ([route.key]): records already claimed run again "
                  "under their new keys")("note", po::value<std::string>()->default_value("idemsink reload"),
                                          "why, in the operator log")(
      "url", po::value<std::string>(), "the host's admin port, http(s)://HOST:PORT (default: host.admin_listen)");
}
int reload_command(const po::variables_map& vm) {
  const config::Config cfg = load_config(vm);
  return app::reload_host(cfg, vm.count("url") ? vm["url"].as<std::string>() : "", vm.count("force") > 0,
                          vm["note"].as<std::string>());
}

void declare_dev_kafka(po::options_description& o, po::positional_options_description&) {
  o.add_options()("brokers", po::value<int>()->default_value(1), "number of brokers")(
      "topic", po::value<std::vector<std::string>>()->composing(), "NAME:PARTITIONS, repeatable")(
      "control-port", po::value<int>()->default_value(0), "control channel port (0 = any)");
}
int dev_kafka_command(const po::variables_map& vm) {
  return app::dev_kafka(vm["brokers"].as<int>(),
                        vm.count("topic") ? vm["topic"].as<std::vector<std::string>>() : std::vector<std::string>{},
                        vm["control-port"].as<int>());
}

void declare_nothing(po::options_description&, po::positional_options_description&) {}
int config_reference_command(const po::variables_map&) {
  std::cout << config::reference_markdown();
  return 0;
}

const Command kCommands[] = {
    {"run", "run --config FILE", declare_config_only, run_host_command},
    {"check-config", "check-config --config FILE [--connect]", declare_check_config, check_config_command},
    {"audit", "audit --config FILE", declare_config_only, audit_command},
    {"schema", "schema print|apply|migrate --config FILE", declare_schema, schema_command},
    {"reconcile", "reconcile --config FILE [--list | --check | --ask | --resolve TOKEN --as done|failed [--note TEXT]]",
     declare_reconcile, reconcile_command},
    {"replay", "replay --config FILE --route R [--reason REASON] [--since TIME] [--key K] [--dry-run]", declare_replay,
     replay_command},
    {"plugin-info", "plugin-info FILE.so", declare_plugin_info, plugin_info_command},
    {"route",
     "route pause|resume NAME --config FILE [--by WHO]\n       idemsink route list --config FILE\n       idemsink "
     "route rewind NAME --config FILE (--to-time T | --to-offset TOPIC:PART:OFFSET...) [--note TEXT]\n       "
     "idemsink route skip NAME --config FILE --to-offset TOPIC:PART:OFFSET... --note TEXT",
     declare_route, route_command},
    {"outbox", "outbox --config FILE [--list | --retry ID | --discard ID [--note TEXT]] [--database LABEL]",
     declare_dlq, dlq_command},
    {"dlq", "dlq (the earlier name of outbox) --config FILE [--list | --retry ID | --discard ID [--note TEXT]]",
     declare_dlq, dlq_command},
    {"order-holds",
     "order-holds [list] --config FILE [--route R]\n       idemsink order-holds release KEY --route R --config FILE "
     "[--note TEXT]",
     declare_order_holds, order_holds_command},
    {"operator-log", "operator-log --config FILE [--route R] [--limit N]", declare_operator_log, operator_log_command},
    {"reload", "reload --config FILE [--force] [--note TEXT] [--url http(s)://HOST:PORT]", declare_reload,
     reload_command},
    {"dev-kafka", "dev-kafka [--brokers N] [--topic NAME:PARTITIONS]... [--control-port P]", declare_dev_kafka,
     dev_kafka_command},
    {"config-reference", "config-reference", declare_nothing, config_reference_command},
};

// Parses the command's options (printing its usage on --help) and runs it.
int dispatch(const std::string& cmd, const std::vector<std::string>& args) {
  const auto it =
      std::find_if(std::begin(kCommands), std::end(kCommands), [&](const Command& c) { return cmd == c.name; });
  if (it == std::end(kCommands)) {
    std::cerr << "idemsink: unknown command '" << cmd << "'\n\n" << kUsage << "\n";
    return 2;
  }
  po::options_description options("options");
  options.add_options()("help,h", "show this help");
  po::positional_options_description positional;
  it->declare(options, positional);
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(options).positional(positional).run(), vm);
  if (vm.count("help")) {
    std::cout << "usage: idemsink " << it->usage << "\n\n" << options;
    return 0;
  }
  po::notify(vm);
  return it->run(vm);
}

}  // namespace

int main(int argc, char** argv) {
  // A SIGTERM while the host starts (config, plugins) waits for run_host to drain.
  if (argc >= 2 && std::string(argv[1]) == "run") app::block_stop_signals();
  app::install_crash_report();
  init_logging(LogLevel::Info);
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cout << kUsage << "\n";
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "--version" || cmd == "version") {
    std::cout << app::version_text();
    return 0;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    fault::init_from_env();
    return dispatch(cmd, args);
  } catch (const po::error& e) {
    std::cerr << "idemsink " << cmd << ": " << e.what() << "\n";
    return 2;
  } catch (const config::ConfigError& e) {
    std::cerr << "idemsink: config error: " << e.what() << "\n";
    return 2;
  } catch (const plugin::LoadError& e) {
    std::cerr << "idemsink: " << e.what() << "\n";
    return 2;
  } catch (const db::DbError& e) {
    std::cerr << "idemsink: database: " << e.what() << "\n";
    return 1;
  } catch (const kafka::KafkaError& e) {
    std::cerr << "idemsink: kafka: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "idemsink: " << e.what() << "\n";
    return 1;
  }
}
