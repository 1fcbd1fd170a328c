// Pins the layout of every struct in plugin_abi.h to the ABI version the
// header declares. A plugin built against one header runs in a host built
// against another, so a field that moves or changes size without a version
// bump corrupts memory with no error at load; this test makes it fail here.
//
// The expected numbers are written by hand from the header, not computed, so
// changing a struct means recording its new layout under a new version.
#define BOOST_TEST_MODULE abi_layout
#include <boost/test/unit_test.hpp>

#include <idemsink/plugin_abi.h>

#include <cstddef>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

// One field ("struct.field"), or a whole struct ("struct", offset 0).
struct Slot {
  std::string name;
  size_t offset;
  size_t size;
};
using Layout = std::vector<Slot>;
using Version = std::pair<int, int>;  // (major, minor)

#define WHOLE(S) \
  Slot { #S, 0, sizeof(S) }
#define FIELD(S, f) \
  Slot { #S "." #f, offsetof(S, f), sizeof(S::f) }

Layout compiled_layout() {
  return {
      WHOLE(idemsink_option_decl),
      FIELD(idemsink_option_decl, name),
      FIELD(idemsink_option_decl, type),
      FIELD(idemsink_option_decl, default_value),
      FIELD(idemsink_option_decl, doc),

      WHOLE(idemsink_check),
      FIELD(idemsink_check, name),
      FIELD(idemsink_check, sql),
      FIELD(idemsink_check, doc),

      WHOLE(idemsink_option),
      FIELD(idemsink_option, name),
      FIELD(idemsink_option, value),

      WHOLE(idemsink_bytes),
      FIELD(idemsink_bytes, data),
      FIELD(idemsink_bytes, len),

      WHOLE(idemsink_header),
      FIELD(idemsink_header, name),
      FIELD(idemsink_header, value),

      WHOLE(idemsink_record),
      FIELD(idemsink_record, struct_size),
      FIELD(idemsink_record, route),
      FIELD(idemsink_record, topic),
      FIELD(idemsink_record, partition),
      FIELD(idemsink_record, offset),
      FIELD(idemsink_record, timestamp_ms),
      FIELD(idemsink_record, key),
      FIELD(idemsink_record, value),
      FIELD(idemsink_record, biz_key),
      FIELD(idemsink_record, headers),
      FIELD(idemsink_record, header_count),
      FIELD(idemsink_record, idem_token),
      FIELD(idemsink_record, attempt),
      FIELD(idemsink_record, timeout_ms),
      FIELD(idemsink_record, value_json),
      FIELD(idemsink_record, key_json),

      WHOLE(idemsink_sql_param),
      FIELD(idemsink_sql_param, type),
      FIELD(idemsink_sql_param, i),
      FIELD(idemsink_sql_param, d),
      FIELD(idemsink_sql_param, bytes),

      WHOLE(idemsink_host_api),
      FIELD(idemsink_host_api, struct_size),
      FIELD(idemsink_host_api, host_ctx),
      FIELD(idemsink_host_api, log),
      FIELD(idemsink_host_api, tx_execute),
      FIELD(idemsink_host_api, tx_query),
      FIELD(idemsink_host_api, tx_write_row),

      WHOLE(idemsink_row),
      FIELD(idemsink_row, struct_size),
      FIELD(idemsink_row, kind),
      FIELD(idemsink_row, table),
      FIELD(idemsink_row, columns),
      FIELD(idemsink_row, values),
      FIELD(idemsink_row, column_count),
      FIELD(idemsink_row, key_count),
      FIELD(idemsink_row, updates),

      WHOLE(idemsink_plugin),
      FIELD(idemsink_plugin, struct_size),
      FIELD(idemsink_plugin, abi_major),
      FIELD(idemsink_plugin, abi_minor),
      FIELD(idemsink_plugin, name),
      FIELD(idemsink_plugin, version),
      FIELD(idemsink_plugin, description),
      FIELD(idemsink_plugin, kind),
      FIELD(idemsink_plugin, options),
      FIELD(idemsink_plugin, option_count),
      FIELD(idemsink_plugin, schema),
      FIELD(idemsink_plugin, schema_count),
      FIELD(idemsink_plugin, checks),
      FIELD(idemsink_plugin, check_count),
      FIELD(idemsink_plugin, create),
      FIELD(idemsink_plugin, destroy),
      FIELD(idemsink_plugin, invoke),
      FIELD(idemsink_plugin, apply),
      FIELD(idemsink_plugin, reconcile),
  };
}

#undef WHOLE
#undef FIELD

// Every released layout on x86-64 (LP64): pointers, size_t, int64_t and
// double take 8 bytes aligned to 8; enums, int32_t and uint32_t 4 aligned to
// 4; uint16_t 2. A new minor records the whole layout again: it may only
// append fields to the structs that carry a struct_size.
const std::map<Version, Layout> kReleased = {
    {{1, 0},
     {
         {"idemsink_option_decl", 0, 32},
         {"idemsink_option_decl.name", 0, 8},
         {"idemsink_option_decl.type", 8, 4},  // then 4 bytes of padding
         {"idemsink_option_decl.default_value", 16, 8},
         {"idemsink_option_decl.doc", 24, 8},

         {"idemsink_check", 0, 24},
         {"idemsink_check.name", 0, 8},
         {"idemsink_check.sql", 8, 8},
         {"idemsink_check.doc", 16, 8},

         {"idemsink_option", 0, 16},
         {"idemsink_option.name", 0, 8},
         {"idemsink_option.value", 8, 8},

         {"idemsink_bytes", 0, 16},
         {"idemsink_bytes.data", 0, 8},
         {"idemsink_bytes.len", 8, 8},

         {"idemsink_header", 0, 24},
         {"idemsink_header.name", 0, 8},
         {"idemsink_header.value", 8, 16},

         {"idemsink_record", 0, 128},
         {"idemsink_record.struct_size", 0, 4},  // then 4 bytes of padding
         {"idemsink_record.route", 8, 8},
         {"idemsink_record.topic", 16, 8},
         {"idemsink_record.partition", 24, 4},  // then 4 bytes of padding
         {"idemsink_record.offset", 32, 8},
         {"idemsink_record.timestamp_ms", 40, 8},
         {"idemsink_record.key", 48, 16},
         {"idemsink_record.value", 64, 16},
         {"idemsink_record.biz_key", 80, 16},
         {"idemsink_record.headers", 96, 8},
         {"idemsink_record.header_count", 104, 8},
         {"idemsink_record.idem_token", 112, 8},
         {"idemsink_record.attempt", 120, 4},  // then 4 bytes of tail padding

         {"idemsink_sql_param", 0, 40},
         {"idemsink_sql_param.type", 0, 4},  // then 4 bytes of padding
         {"idemsink_sql_param.i", 8, 8},
         {"idemsink_sql_param.d", 16, 8},
         {"idemsink_sql_param.bytes", 24, 16},

         {"idemsink_host_api", 0, 40},
         {"idemsink_host_api.struct_size", 0, 4},  // then 4 bytes of padding
         {"idemsink_host_api.host_ctx", 8, 8},
         {"idemsink_host_api.log", 16, 8},
         {"idemsink_host_api.tx_execute", 24, 8},
         {"idemsink_host_api.tx_query", 32, 8},

         {"idemsink_plugin", 0, 128},
         {"idemsink_plugin.struct_size", 0, 4},
         {"idemsink_plugin.abi_major", 4, 2},
         {"idemsink_plugin.abi_minor", 6, 2},
         {"idemsink_plugin.name", 8, 8},
         {"idemsink_plugin.version", 16, 8},
         {"idemsink_plugin.description", 24, 8},
         {"idemsink_plugin.kind", 32, 4},  // then 4 bytes of padding
         {"idemsink_plugin.options", 40, 8},
         {"idemsink_plugin.option_count", 48, 8},
         {"idemsink_plugin.schema", 56, 8},
         {"idemsink_plugin.schema_count", 64, 8},
         {"idemsink_plugin.checks", 72, 8},
         {"idemsink_plugin.check_count", 80, 8},
         {"idemsink_plugin.create", 88, 8},
         {"idemsink_plugin.destroy", 96, 8},
         {"idemsink_plugin.invoke", 104, 8},
         {"idemsink_plugin.apply", 112, 8},
         {"idemsink_plugin.reconcile", 120, 8},
     }},
    {{1, 1},
     {
         {"idemsink_option_decl", 0, 32},
         {"idemsink_option_decl.name", 0, 8},
         {"idemsink_option_decl.type", 8, 4},  // then 4 bytes of padding
         {"idemsink_option_decl.default_value", 16, 8},
         {"idemsink_option_decl.doc", 24, 8},

         {"idemsink_check", 0, 24},
         {"idemsink_check.name", 0, 8},
         {"idemsink_check.sql", 8, 8},
         {"idemsink_check.doc", 16, 8},

         {"idemsink_option", 0, 16},
         {"idemsink_option.name", 0, 8},
         {"idemsink_option.value", 8, 8},

         {"idemsink_bytes", 0, 16},
         {"idemsink_bytes.data", 0, 8},
         {"idemsink_bytes.len", 8, 8},

         {"idemsink_header", 0, 24},
         {"idemsink_header.name", 0, 8},
         {"idemsink_header.value", 8, 16},

         {"idemsink_record", 0, 136},
         {"idemsink_record.struct_size", 0, 4},  // then 4 bytes of padding
         {"idemsink_record.route", 8, 8},
         {"idemsink_record.topic", 16, 8},
         {"idemsink_record.partition", 24, 4},  // then 4 bytes of padding
         {"idemsink_record.offset", 32, 8},
         {"idemsink_record.timestamp_ms", 40, 8},
         {"idemsink_record.key", 48, 16},
         {"idemsink_record.value", 64, 16},
         {"idemsink_record.biz_key", 80, 16},
         {"idemsink_record.headers", 96, 8},
         {"idemsink_record.header_count", 104, 8},
         {"idemsink_record.idem_token", 112, 8},
         {"idemsink_record.attempt", 120, 4},  // then 4 bytes of padding
         {"idemsink_record.timeout_ms", 128, 8},

         {"idemsink_sql_param", 0, 40},
         {"idemsink_sql_param.type", 0, 4},  // then 4 bytes of padding
         {"idemsink_sql_param.i", 8, 8},
         {"idemsink_sql_param.d", 16, 8},
         {"idemsink_sql_param.bytes", 24, 16},

         {"idemsink_host_api", 0, 40},
         {"idemsink_host_api.struct_size", 0, 4},  // then 4 bytes of padding
         {"idemsink_host_api.host_ctx", 8, 8},
         {"idemsink_host_api.log", 16, 8},
         {"idemsink_host_api.tx_execute", 24, 8},
         {"idemsink_host_api.tx_query", 32, 8},

         {"idemsink_plugin", 0, 128},
         {"idemsink_plugin.struct_size", 0, 4},
         {"idemsink_plugin.abi_major", 4, 2},
         {"idemsink_plugin.abi_minor", 6, 2},
         {"idemsink_plugin.name", 8, 8},
         {"idemsink_plugin.version", 16, 8},
         {"idemsink_plugin.description", 24, 8},
         {"idemsink_plugin.kind", 32, 4},  // then 4 bytes of padding
         {"idemsink_plugin.options", 40, 8},
         {"idemsink_plugin.option_count", 48, 8},
         {"idemsink_plugin.schema", 56, 8},
         {"idemsink_plugin.schema_count", 64, 8},
         {"idemsink_plugin.checks", 72, 8},
         {"idemsink_plugin.check_count", 80, 8},
         {"idemsink_plugin.create", 88, 8},
         {"idemsink_plugin.destroy", 96, 8},
         {"idemsink_plugin.invoke", 104, 8},
         {"idemsink_plugin.apply", 112, 8},
         {"idemsink_plugin.reconcile", 120, 8},
     }},
    {{1, 2},
     {
         {"idemsink_option_decl", 0, 32},
         {"idemsink_option_decl.name", 0, 8},
         {"idemsink_option_decl.type", 8, 4},  // then 4 bytes of padding
         {"idemsink_option_decl.default_value", 16, 8},
         {"idemsink_option_decl.doc", 24, 8},

         {"idemsink_check", 0, 24},
         {"idemsink_check.name", 0, 8},
         {"idemsink_check.sql", 8, 8},
         {"idemsink_check.doc", 16, 8},

         {"idemsink_option", 0, 16},
         {"idemsink_option.name", 0, 8},
         {"idemsink_option.value", 8, 8},

         {"idemsink_bytes", 0, 16},
         {"idemsink_bytes.data", 0, 8},
         {"idemsink_bytes.len", 8, 8},

         {"idemsink_header", 0, 24},
         {"idemsink_header.name", 0, 8},
         {"idemsink_header.value", 8, 16},

         {"idemsink_record", 0, 168},
         {"idemsink_record.struct_size", 0, 4},  // then 4 bytes of padding
         {"idemsink_record.route", 8, 8},
         {"idemsink_record.topic", 16, 8},
         {"idemsink_record.partition", 24, 4},  // then 4 bytes of padding
         {"idemsink_record.offset", 32, 8},
         {"idemsink_record.timestamp_ms", 40, 8},
         {"idemsink_record.key", 48, 16},
         {"idemsink_record.value", 64, 16},
         {"idemsink_record.biz_key", 80, 16},
         {"idemsink_record.headers", 96, 8},
         {"idemsink_record.header_count", 104, 8},
         {"idemsink_record.idem_token", 112, 8},
         {"idemsink_record.attempt", 120, 4},  // then 4 bytes of padding
         {"idemsink_record.timeout_ms", 128, 8},
         {"idemsink_record.value_json", 136, 16},
         {"idemsink_record.key_json", 152, 16},

         {"idemsink_sql_param", 0, 40},
         {"idemsink_sql_param.type", 0, 4},  // then 4 bytes of padding
         {"idemsink_sql_param.i", 8, 8},
         {"idemsink_sql_param.d", 16, 8},
         {"idemsink_sql_param.bytes", 24, 16},

         {"idemsink_host_api", 0, 40},
         {"idemsink_host_api.struct_size", 0, 4},  // then 4 bytes of padding
         {"idemsink_host_api.host_ctx", 8, 8},
         {"idemsink_host_api.log", 16, 8},
         {"idemsink_host_api.tx_execute", 24, 8},
         {"idemsink_host_api.tx_query", 32, 8},

         {"idemsink_plugin", 0, 128},
         {"idemsink_plugin.struct_size", 0, 4},
         {"idemsink_plugin.abi_major", 4, 2},
         {"idemsink_plugin.abi_minor", 6, 2},
         {"idemsink_plugin.name", 8, 8},
         {"idemsink_plugin.version", 16, 8},
         {"idemsink_plugin.description", 24, 8},
         {"idemsink_plugin.kind", 32, 4},  // then 4 bytes of padding
         {"idemsink_plugin.options", 40, 8},
         {"idemsink_plugin.option_count", 48, 8},
         {"idemsink_plugin.schema", 56, 8},
         {"idemsink_plugin.schema_count", 64, 8},
         {"idemsink_plugin.checks", 72, 8},
         {"idemsink_plugin.check_count", 80, 8},
         {"idemsink_plugin.create", 88, 8},
         {"idemsink_plugin.destroy", 96, 8},
         {"idemsink_plugin.invoke", 104, 8},
         {"idemsink_plugin.apply", 112, 8},
         {"idemsink_plugin.reconcile", 120, 8},
     }},
    {{1, 3},
     {
         {"idemsink_option_decl", 0, 32},
         {"idemsink_option_decl.name", 0, 8},
         {"idemsink_option_decl.type", 8, 4},  // then 4 bytes of padding
         {"idemsink_option_decl.default_value", 16, 8},
         {"idemsink_option_decl.doc", 24, 8},

         {"idemsink_check", 0, 24},
         {"idemsink_check.name", 0, 8},
         {"idemsink_check.sql", 8, 8},
         {"idemsink_check.doc", 16, 8},

         {"idemsink_option", 0, 16},
         {"idemsink_option.name", 0, 8},
         {"idemsink_option.value", 8, 8},

         {"idemsink_bytes", 0, 16},
         {"idemsink_bytes.data", 0, 8},
         {"idemsink_bytes.len", 8, 8},

         {"idemsink_header", 0, 24},
         {"idemsink_header.name", 0, 8},
         {"idemsink_header.value", 8, 16},

         {"idemsink_record", 0, 168},
         {"idemsink_record.struct_size", 0, 4},  // then 4 bytes of padding
         {"idemsink_record.route", 8, 8},
         {"idemsink_record.topic", 16, 8},
         {"idemsink_record.partition", 24, 4},  // then 4 bytes of padding
         {"idemsink_record.offset", 32, 8},
         {"idemsink_record.timestamp_ms", 40, 8},
         {"idemsink_record.key", 48, 16},
         {"idemsink_record.value", 64, 16},
         {"idemsink_record.biz_key", 80, 16},
         {"idemsink_record.headers", 96, 8},
         {"idemsink_record.header_count", 104, 8},
         {"idemsink_record.idem_token", 112, 8},
         {"idemsink_record.attempt", 120, 4},  // then 4 bytes of padding
         {"idemsink_record.timeout_ms", 128, 8},
         {"idemsink_record.value_json", 136, 16},
         {"idemsink_record.key_json", 152, 16},

         {"idemsink_sql_param", 0, 40},
         {"idemsink_sql_param.type", 0, 4},  // then 4 bytes of padding
         {"idemsink_sql_param.i", 8, 8},
         {"idemsink_sql_param.d", 16, 8},
         {"idemsink_sql_param.bytes", 24, 16},

         {"idemsink_host_api", 0, 48},
         {"idemsink_host_api.struct_size", 0, 4},  // then 4 bytes of padding
         {"idemsink_host_api.host_ctx", 8, 8},
         {"idemsink_host_api.log", 16, 8},
         {"idemsink_host_api.tx_execute", 24, 8},
         {"idemsink_host_api.tx_query", 32, 8},
         {"idemsink_host_api.tx_write_row", 40, 8},

         {"idemsink_row", 0, 56},
         {"idemsink_row.struct_size", 0, 4},
         {"idemsink_row.kind", 4, 4},
         {"idemsink_row.table", 8, 8},
         {"idemsink_row.columns", 16, 8},
         {"idemsink_row.values", 24, 8},
         {"idemsink_row.column_count", 32, 8},
         {"idemsink_row.key_count", 40, 8},
         {"idemsink_row.updates", 48, 8},

         {"idemsink_plugin", 0, 128},
         {"idemsink_plugin.struct_size", 0, 4},
         {"idemsink_plugin.abi_major", 4, 2},
         {"idemsink_plugin.abi_minor", 6, 2},
         {"idemsink_plugin.name", 8, 8},
         {"idemsink_plugin.version", 16, 8},
         {"idemsink_plugin.description", 24, 8},
         {"idemsink_plugin.kind", 32, 4},  // then 4 bytes of padding
         {"idemsink_plugin.options", 40, 8},
         {"idemsink_plugin.option_count", 48, 8},
         {"idemsink_plugin.schema", 56, 8},
         {"idemsink_plugin.schema_count", 64, 8},
         {"idemsink_plugin.checks", 72, 8},
         {"idemsink_plugin.check_count", 80, 8},
         {"idemsink_plugin.create", 88, 8},
         {"idemsink_plugin.destroy", 96, 8},
         {"idemsink_plugin.invoke", 104, 8},
         {"idemsink_plugin.apply", 112, 8},
         {"idemsink_plugin.reconcile", 120, 8},
     }},
};

std::map<std::string, Slot> by_name(const Layout& layout) {
  std::map<std::string, Slot> out;
  for (const auto& s : layout) out.emplace(s.name, s);
  return out;
}

std::string describe(const Slot& s) { return "offset " + std::to_string(s.offset) + " size " + std::to_string(s.size); }

// Every difference between the recorded and the compiled layout, one per line.
std::string differences(const Layout& recorded, const Layout& compiled) {
  const auto want = by_name(recorded);
  const auto have = by_name(compiled);
  std::ostringstream os;
  for (const auto& [name, w] : want) {
    auto it = have.find(name);
    if (it == have.end())
      os << "  " << name << ": recorded (" << describe(w) << ") but not in the test's list\n";
    else if (it->second.offset != w.offset || it->second.size != w.size)
      os << "  " << name << ": recorded " << describe(w) << ", compiled " << describe(it->second) << "\n";
  }
  for (const auto& [name, h] : have)
    if (!want.count(name)) os << "  " << name << ": compiled (" << describe(h) << ") but not recorded\n";
  return os.str();
}

#if defined(__x86_64__) && defined(__LP64__)
constexpr bool kRecordedPlatform = true;
#else
constexpr bool kRecordedPlatform = false;
#endif

}  // namespace

BOOST_AUTO_TEST_CASE(structs_match_the_layout_recorded_for_this_abi_version,
                     *boost::unit_test::enable_if<kRecordedPlatform>()) {
  const Version current{IDEMSINK_ABI_MAJOR, IDEMSINK_ABI_MINOR};
  auto it = kReleased.find(current);
  BOOST_REQUIRE_MESSAGE(it != kReleased.end(), "no layout recorded for ABI v" << current.first << "." << current.second
                                                                              << ": record it in kReleased");
  const std::string diff = differences(it->second, compiled_layout());
  BOOST_TEST(diff.empty(), "layout changed without an ABI version bump (header says v" << current.first << "."
                                                                                       << current.second << "):\n"
                                                                                       << diff);
}

// Within one major a plugin built against an older minor must keep working:
// its fields stay where they were, arrays' element structs (no struct_size)
// keep their size, and the others may only grow.
BOOST_AUTO_TEST_CASE(older_minors_of_this_major_are_a_prefix_of_the_current_layout,
                     *boost::unit_test::enable_if<kRecordedPlatform>()) {
  const auto compiled = by_name(compiled_layout());
  for (const auto& [version, layout] : kReleased) {
    if (version.first != IDEMSINK_ABI_MAJOR || version.second >= IDEMSINK_ABI_MINOR) continue;
    const auto old = by_name(layout);
    for (const auto& [name, w] : old) {
      auto it = compiled.find(name);
      BOOST_TEST_CONTEXT("v" << version.first << "." << version.second << " " << name) {
        BOOST_TEST_REQUIRE((it != compiled.end()), "removed within ABI major " << IDEMSINK_ABI_MAJOR);
        const bool whole_struct = name.find('.') == std::string::npos;
        if (whole_struct && old.count(name + ".struct_size")) {
          BOOST_TEST(it->second.size >= w.size, "an appendable struct shrank");
        } else {
          BOOST_TEST(it->second.offset == w.offset, "moved within ABI major " << IDEMSINK_ABI_MAJOR);
          BOOST_TEST(it->second.size == w.size, "resized within ABI major " << IDEMSINK_ABI_MAJOR);
        }
      }
    }
  }
}
