// The loader refuses every broken plugin with a message naming the file and
// the reason, and accepts the well-formed ones.
#define BOOST_TEST_MODULE abi_loader
#include <boost/test/unit_test.hpp>

#include "core/config/config.h"
#include "core/plugin/calls.h"
#include "core/plugin/plugin.h"
#include "tests/support/test_kafka.h"
#include "devkit/process.h"

using namespace idemsink;
using idemsink::test::test_plugin_dir;

namespace {

std::string fixture(const std::string& name) { return test_plugin_dir() + "/" + name + ".so"; }

void expect_refused(const std::string& path, std::initializer_list<std::string> fragments) {
  try {
    plugin::Library::load(path);
    BOOST_FAIL("expected " << path << " to be refused");
  } catch (const plugin::LoadError& e) {
    const std::string msg = e.what();
    BOOST_TEST(msg.find(path) != std::string::npos, "message does not name the file: " << msg);
    for (const auto& f : fragments) BOOST_TEST(msg.find(f) != std::string::npos, "'" << f << "' not in: " << msg);
  }
}

config::RouteConfig route_with(std::map<std::string, std::pair<config::OptionValue::TomlType, std::string>> opts) {
  config::RouteConfig r;
  r.name = "r";
  r.pos = {"test.toml", 3, 1};
  uint32_t line = 10;
  for (auto& [k, v] : opts) r.options[k] = config::OptionValue{v.first, v.second, {"test.toml", line++, 1}};
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(missing_file) { expect_refused("/nonexistent/plugin.so", {"file not found"}); }

BOOST_AUTO_TEST_CASE(file_that_is_not_a_shared_library) {
  idemsink::devkit::ScratchDir dir("abi");
  idemsink::devkit::write_file(dir / "garbage.so", "this is not an ELF file\n");
  expect_refused((dir / "garbage.so").string(), {"not a loadable shared library"});
}

BOOST_AUTO_TEST_CASE(shared_library_without_the_entry_symbol) {
  expect_refused(fixture("not_a_plugin"), {"not an idemsink plugin", "idemsink_plugin_entry_v1"});
}

BOOST_AUTO_TEST_CASE(plugin_built_for_another_abi_major) {
  expect_refused(fixture("abi_v2_entry"), {"built for plugin ABI v2", "supports v1"});
  expect_refused(fixture("abi_major_mismatch"), {"descriptor says ABI v2"});
}

BOOST_AUTO_TEST_CASE(plugin_built_for_a_newer_minor) {
  expect_refused(fixture("abi_newer_minor"), {"newer than this host", "upgrade the host"});
}

BOOST_AUTO_TEST_CASE(bad_descriptors) {
  expect_refused(fixture("null_descriptor"), {"returned NULL"});
  expect_refused(fixture("descriptor_too_small"), {"descriptor too small", "struct_size 16"});
  expect_refused(fixture("missing_invoke"), {"requires an invoke callback"});
  expect_refused(fixture("missing_create"), {"no create callback"});
  expect_refused(fixture("local_tx_without_apply"), {"local_tx requires an apply callback"});
  expect_refused(fixture("invalid_kind"), {"invalid kind 7"});
  expect_refused(fixture("bad_option_default"), {"option timeout has default \"soon\", which is not a duration"});
}

BOOST_AUTO_TEST_CASE(well_formed_plugins_load_with_their_declarations) {
  auto lib = plugin::Library::load(fixture("scripted_idempotent"));
  BOOST_TEST(lib->name() == "scripted");
  BOOST_TEST((lib->kind() == IDEMSINK_KIND_REMOTE_IDEMPOTENT));
  BOOST_TEST(lib->options().size() == 2u);
  BOOST_TEST(lib->info().find("log (string, required)") != std::string::npos);
  auto tx = plugin::Library::load(fixture("test_local_tx"));
  BOOST_TEST((tx->kind() == IDEMSINK_KIND_LOCAL_TX));
  BOOST_TEST(tx->schema().size() == 1u);
}

BOOST_AUTO_TEST_CASE(options_are_checked_against_declarations) {
  using T = config::OptionValue::TomlType;
  auto lib = plugin::Library::load(fixture("scripted_idempotent"));
  auto resolved =
      plugin::resolve_options(*lib, route_with({{"log", {T::String, "/tmp/x"}}, {"delay", {T::String, "2s"}}}));
  BOOST_TEST(resolved.size() == 2u);
  BOOST_TEST(resolved[1].second == "2000");  // durations reach the plugin in milliseconds
  auto defaults = plugin::resolve_options(*lib, route_with({{"log", {T::String, "/tmp/x"}}}));
  BOOST_TEST(defaults[1].second == "0");  // declared defaults too
  auto expect = [&](std::map<std::string, std::pair<T, std::string>> opts, std::string fragment) {
    try {
      plugin::resolve_options(*lib, route_with(opts));
      BOOST_FAIL("expected an option error");
    } catch (const config::ConfigError& e) {
      BOOST_TEST(std::string(e.what()).find(fragment) != std::string::npos, e.what());
      BOOST_TEST(std::string(e.what()).find("test.toml:") != std::string::npos, e.what());
    }
  };
  expect({{"delay", {T::String, "1s"}}}, "route.options.log: required");
  expect({{"log", {T::String, "x"}}, {"colour", {T::String, "red"}}}, "unknown option for plugin scripted");
  expect({{"log", {T::Integer, "5"}}}, "expected a string");
  expect({{"log", {T::String, "x"}}, {"delay", {T::String, "soon"}}}, "expected a duration");
}

BOOST_AUTO_TEST_CASE(create_failure_carries_the_plugin_message) {
  auto lib = plugin::Library::load(fixture("create_fails"));
  try {
    plugin::Instance inst(lib, route_with({}));
    BOOST_FAIL("expected create to fail");
  } catch (const plugin::LoadError& e) {
    BOOST_TEST(std::string(e.what()).find("endpoint is unreachable") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_CASE(an_exception_out_of_a_raw_plugin_ends_the_call_not_the_host) {
  auto lib = plugin::Library::load(fixture("throws_from_invoke"));
  plugin::Instance inst(lib, route_with({}));
  auto& reg = plugin::CallRegistry::instance();
  std::vector<std::pair<idemsink_outcome, std::string>> seen;
  const uint64_t id = reg.add([&](uint64_t, idemsink_outcome o, std::string d) { seen.emplace_back(o, d); }, "test");
  idemsink_record rec{};
  rec.struct_size = sizeof rec;
  rec.route = "r";
  rec.biz_key = {"k", 1};
  inst.invoke(rec, id);  // throws inside: caught at the boundary
  BOOST_REQUIRE(seen.size() == 1u);
  BOOST_TEST((seen[0].first == IDEMSINK_OUTCOME_UNCERTAIN));
  BOOST_TEST(seen[0].second == "plugin threw from invoke: boom");

  // A report made before the throw stands.
  const uint64_t reported =
      reg.add([&](uint64_t, idemsink_outcome o, std::string d) { seen.emplace_back(o, d); }, "test");
  rec.biz_key = {"reported-1", 10};
  inst.invoke(rec, reported);
  BOOST_REQUIRE(seen.size() == 2u);
  BOOST_TEST((seen[1].first == IDEMSINK_OUTCOME_OK));
}

BOOST_AUTO_TEST_CASE(a_second_completion_is_ignored) {
  using T = config::OptionValue::TomlType;
  auto lib = plugin::Library::load(fixture("double_complete"));
  plugin::Instance inst(lib, route_with({{"log", {T::String, ""}}}));
  int calls = 0;
  idemsink_outcome seen{};
  auto& reg = plugin::CallRegistry::instance();
  const uint64_t before = reg.stray_completions();
  const uint64_t id = reg.add([&](uint64_t, idemsink_outcome o, std::string) { ++calls, seen = o; }, "test");
  idemsink_record rec{};
  rec.struct_size = sizeof rec;
  rec.biz_key = {"k", 1};
  inst.invoke(rec, id);
  BOOST_TEST(calls == 1);
  BOOST_TEST((seen == IDEMSINK_OUTCOME_OK));
  BOOST_TEST(reg.stray_completions() == before + 1);

  const uint64_t bad = reg.add([&](uint64_t, idemsink_outcome o, std::string) { ++calls, seen = o; }, "test");
  rec.biz_key = {"bad-1", 5};
  inst.invoke(rec, bad);
  BOOST_TEST(calls == 2);
  BOOST_TEST((seen == IDEMSINK_OUTCOME_UNCERTAIN));  // an invalid outcome is never taken as success
}
