// Unit test of hello_handler: no host, database or Kafka. The plugin source
// is compiled into this executable and driven through its descriptor with
// the fakes of idemsink/testing.h. Copy it along with the template; any test
// framework works the same way, this one needs none.
#include <idemsink/testing.h>

#include <cstdio>
#include <stdexcept>
#include <string>

namespace t = idemsink::sdk::testing;

namespace {

int failures = 0;

// Not assert(): Release builds define NDEBUG.
#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                                   \
    }                                                                               \
  } while (0)

void declares_a_local_tx_handler_with_its_table_and_check() {
  t::FakeHost host;
  t::PluginInstance hello(t::compiled_in_descriptor(), host);
  CHECK(hello.kind() == IDEMSINK_KIND_LOCAL_TX);
  CHECK(std::string(hello.descriptor().name) == "hello");
  CHECK(hello.descriptor().schema_count == 1);
  CHECK(hello.descriptor().check_count == 1);
  CHECK(host.logged("ready to say hello"));  // the declared default
}

void greets_the_biz_key_inside_the_transaction() {
  t::FakeHost host;
  t::PluginInstance hello(t::compiled_in_descriptor(), host, {{"greeting", "hi"}});
  t::RecordBuilder rec;
  rec.biz_key("person-7").idem_token("6f9619ff-8b86-4d01-b42d-00c04fc964ff");
  t::FakeTx tx;
  t::RecordingCompletion done;
  hello.apply(rec, tx, done);

  CHECK(done.reports() == 1);
  CHECK(done.outcome() == IDEMSINK_OUTCOME_OK);
  CHECK(done.detail() == "hi");
  CHECK(tx.calls().size() == 1);
  if (tx.calls().size() != 1) return;
  const t::FakeTx::Call& insert = tx.calls()[0];
  CHECK(!insert.query);
  CHECK(insert.sql.starts_with("INSERT INTO hello_greetings"));
  CHECK(insert.params.size() == 3);
  if (insert.params.size() != 3) return;
  CHECK(insert.params[0].type == IDEMSINK_SQL_BLOB && insert.params[0].bytes == "person-7");
  CHECK(insert.params[1].type == IDEMSINK_SQL_TEXT && insert.params[1].bytes == "hi person-7");
  CHECK(insert.params[2].bytes == "6f9619ff-8b86-4d01-b42d-00c04fc964ff");
}

void rejects_a_biz_key_too_long_for_its_column_without_writing() {
  t::FakeHost host;
  t::PluginInstance hello(t::compiled_in_descriptor(), host);
  t::RecordBuilder rec;
  rec.biz_key(std::string(256, 'k'));
  t::FakeTx tx;
  t::RecordingCompletion done;
  hello.apply(rec, tx, done);
  CHECK(done.reports() == 1);
  CHECK(done.outcome() == IDEMSINK_OUTCOME_PERMANENT);
  CHECK(tx.calls().empty());
}

// A failed INSERT throws out of apply(); the SDK reports it for the handler,
// and the host rolls the write back and retries.
void a_failed_insert_is_reported_as_uncertain() {
  t::FakeHost host;
  t::PluginInstance hello(t::compiled_in_descriptor(), host);
  t::RecordBuilder rec;
  rec.biz_key("person-8");
  t::FakeTx tx;
  tx.then(t::FakeTx::fails(1213, "Deadlock found when trying to get lock"));
  t::RecordingCompletion done;
  hello.apply(rec, tx, done);
  CHECK(done.reports() == 1);
  CHECK(done.outcome() == IDEMSINK_OUTCOME_UNCERTAIN);
  CHECK(done.detail().find("Deadlock found") != std::string::npos);
}

void unknown_options_are_refused_like_the_host_does() {
  t::FakeHost host;
  bool refused = false;
  try {
    t::PluginInstance hello(t::compiled_in_descriptor(), host, {{"colour", "red"}});
  } catch (const std::invalid_argument&) {
    refused = true;
  }
  CHECK(refused);
}

}  // namespace

int main() {
  declares_a_local_tx_handler_with_its_table_and_check();
  greets_the_biz_key_inside_the_transaction();
  rejects_a_biz_key_too_long_for_its_column_without_writing();
  a_failed_insert_is_reported_as_uncertain();
  unknown_options_are_refused_like_the_host_does();
  if (failures != 0) {
    std::fprintf(stderr, "hello_handler_test: %d check(s) failed\n", failures);
    return 1;
  }
  std::printf("hello_handler_test: all checks passed\n");
  return 0;
}
