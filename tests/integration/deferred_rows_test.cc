// The SDK's batched writes (Tx::insert_row, Tx::upsert_row) through the
// host's tx_write_row, written by plugin::DeferredRows on a real MariaDB: the
// rows land as queued, in few statements, bound rather than spliced, and
// concurrent batches over the same keys do not deadlock.
#define BOOST_TEST_MODULE deferred_rows
#include <idemsink/sdk.h>
#include <mysqld_error.h>

#include <boost/test/unit_test.hpp>
#include <thread>

#include "core/plugin/tx.h"
#include "devkit/mariadb_server.h"

using namespace idemsink;
using devkit::MariaDbServer;

namespace {

idemsink_host_api host_api() {
  idemsink_host_api api{};
  api.struct_size = sizeof api;
  plugin::install_tx_api(api);
  return api;
}

int64_t scalar(db::Connection& c, const std::string& sql) { return std::stoll(*c.query(sql).at(0).at(0)); }

struct Tables {
  std::unique_ptr<db::Connection> c;
  explicit Tables(const std::string& name) {
    MariaDbServer::shared().fresh_database(name);
    c = MariaDbServer::shared().connect(name);
    c->execute(
        "CREATE TABLE entries (id BIGINT AUTO_INCREMENT PRIMARY KEY, account VARCHAR(16) NOT NULL, cents BIGINT NOT "
        "NULL, note VARBINARY(64) NULL)");
    c->execute(
        "CREATE TABLE balances (account VARCHAR(16) PRIMARY KEY, cents BIGINT NOT NULL, last_note VARCHAR(32) NULL)");
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(queued_rows_are_written_per_shape_in_few_statements) {
  Tables t("deferred_rows_basic");
  const idemsink_host_api api = host_api();
  idemsink_tx tx{t.c.get()};
  sdk::Tx sql(&api, &tx);
  for (int i = 0; i < 300; ++i) {
    const std::string account = "a" + std::to_string(i % 7);
    // A value with a quote, a NUL and a backslash: bound, so written as is.
    sql.insert_row(
        "entries",
        {{"account", account}, {"cents", i}, {"note", sdk::SqlParam::blob(std::string("x'\0\\", 4) + account)}});
    sql.upsert_row("balances", {{"account", account}},
                   {sdk::Tx::add("cents", i), sdk::Tx::set("last_note", "n" + std::to_string(i))});
  }
  sql.insert_row("entries", {{"cents", 5}, {"account", "other-order"}});  // another shape: its own statement
  BOOST_TEST(tx.statements == 0u);                                        // queued, nothing sent
  const uint64_t before = t.c->statements_sent();
  t.c->begin();
  tx.rows.write(*t.c);
  t.c->commit();
  // 300 rows: 128 + 128 + 32 + 8 + 4 per shape, and the lone row.
  BOOST_TEST(t.c->statements_sent() - before == 2u + 5 + 5 + 1);
  BOOST_TEST(scalar(*t.c, "SELECT COUNT(*) FROM entries") == 301);
  BOOST_TEST(scalar(*t.c, "SELECT SUM(cents) FROM entries WHERE account LIKE 'a%'") == 299 * 300 / 2);
  BOOST_TEST(scalar(*t.c, "SELECT COUNT(*) FROM entries WHERE note = CONCAT('x\\'', CHAR(0), '\\\\', account)") == 300);
  BOOST_TEST(scalar(*t.c, "SELECT COUNT(*) FROM balances") == 7);
  BOOST_TEST(scalar(*t.c,
                    "SELECT COUNT(*) FROM balances b WHERE cents = (SELECT SUM(cents) FROM entries e WHERE e.account = "
                    "b.account)") == 7);
  // SET keeps the last value in record order: account a0's last record is 294.
  BOOST_TEST(*t.c->query("SELECT last_note FROM balances WHERE account = 'a0'").at(0).at(0) == "n294");
}

BOOST_AUTO_TEST_CASE(a_malformed_row_is_refused_by_name_and_queues_nothing) {
  Tables t("deferred_rows_malformed");
  const idemsink_host_api api = host_api();
  idemsink_tx tx{t.c.get()};
  sdk::Tx sql(&api, &tx);
  auto refused = [&](auto&& write, const std::string& why) {
    try {
      write();
      BOOST_ERROR("not refused: " << why);
    } catch (const sdk::SqlError& e) {
      BOOST_TEST(std::string(e.what()).find(why) != std::string::npos, e.what());
    }
  };
  refused([&] { sql.insert_row("entries; DROP TABLE entries", {{"cents", 1}}); }, "table name is not an identifier");
  refused([&] { sql.insert_row("entries", {{"cents` = 1 --", 1}}); }, "column name is not an identifier");
  refused([&] { sql.insert_row("entries", {{"x.cents", 1}}); }, "column name is not an identifier");
  refused([&] { sql.insert_row("entries", {{"cents", 1}, {"cents", 2}}); }, "column named twice");
  refused([&] { sql.insert_row("entries", {}); }, "a row needs columns");
  refused([&] { sql.upsert_row("balances", {}, {sdk::Tx::add("cents", 1)}); }, "an upsert needs between 1");
  BOOST_TEST(tx.rows.empty());
  // The record that queued them ends db_rejected unless it still reports ok.
  BOOST_TEST(tx.refused_code == static_cast<unsigned>(ER_WRONG_ARGUMENTS));
  BOOST_TEST(tx.refused_message.find("table name is not an identifier") != std::string::npos, tx.refused_message);
  sql.insert_row(("deferred_rows_malformed.entries"), {{"account", "db-qualified"}, {"cents", 1}});
  sql.upsert_row("balances", {{"account", "only-key"}, {"cents", 0}}, {});  // ensures the row exists
  t.c->begin();
  tx.rows.write(*t.c);
  t.c->commit();
  BOOST_TEST(scalar(*t.c, "SELECT COUNT(*) FROM entries") == 1);
  BOOST_TEST(scalar(*t.c, "SELECT COUNT(*) FROM balances") == 1);
}

BOOST_AUTO_TEST_CASE(a_value_the_server_refuses_fails_the_write_as_data) {
  Tables t("deferred_rows_refused");
  const idemsink_host_api api = host_api();
  idemsink_tx tx{t.c.get()};
  sdk::Tx sql(&api, &tx);
  sql.insert_row("entries", {{"account", "fine"}, {"cents", 1}});
  sql.insert_row("entries", {{"account", std::string(40, 'a')}, {"cents", 2}});  // VARCHAR(16)
  t.c->begin();
  try {
    tx.rows.write(*t.c);
    BOOST_ERROR("a 40-character account was written into VARCHAR(16)");
  } catch (const db::DbError& e) {
    BOOST_TEST(e.code() == static_cast<unsigned>(ER_DATA_TOO_LONG), e.what());
    BOOST_TEST((e.error_class() == db::ErrorClass::Data));
  }
  t.c->rollback_quietly();
  BOOST_TEST(scalar(*t.c, "SELECT COUNT(*) FROM entries") == 0);
  // A row larger than the server takes in one statement: refused as it is queued.
  const std::string huge(t.c->max_packet(), 'x');
  try {
    sql.insert_row("entries", {{"account", "big"}, {"note", sdk::SqlParam::blob(huge)}});
    BOOST_ERROR("a row above max_allowed_packet was queued");
  } catch (const sdk::SqlError& e) {
    BOOST_TEST(e.code() == ER_NET_PACKET_TOO_LARGE, e.what());
  }
  BOOST_TEST(tx.refused_code == static_cast<unsigned>(ER_NET_PACKET_TOO_LARGE));
}

// Two connections upsert the same 60 accounts in opposite record orders,
// 30 batches each, at once. Written in record order, each would hold the
// rows the other needs next (MariaDB's 1213 deadlock); in key order, one
// waits for the other and both commit every batch.
BOOST_AUTO_TEST_CASE(concurrent_upserts_of_the_same_keys_do_not_deadlock) {
  Tables t("deferred_rows_order");
  const idemsink_host_api api = host_api();
  std::atomic<int> deadlocks = 0;
  auto writer = [&](bool reversed) {
    auto c = MariaDbServer::shared().connect("deferred_rows_order");
    for (int batch = 0; batch < 30; ++batch) {
      idemsink_tx tx{c.get()};
      sdk::Tx sql(&api, &tx);
      for (int i = 0; i < 60; ++i) {
        const int k = reversed ? 59 - i : i;
        sql.upsert_row("balances", {{"account", "acct-" + std::to_string(100 + k)}}, {sdk::Tx::add("cents", 1)});
      }
      try {
        c->begin();
        tx.rows.write(*c);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));  // hold the locks a while
        c->commit();
      } catch (const db::DbError& e) {
        c->rollback_quietly();
        if (e.code() == ER_LOCK_DEADLOCK)
          ++deadlocks;
        else
          throw;
      }
    }
  };
  std::thread a(writer, false), b(writer, true);
  a.join();
  b.join();
  BOOST_TEST(deadlocks.load() == 0);
  BOOST_TEST(scalar(*t.c, "SELECT COUNT(*) FROM balances") == 60);
  BOOST_TEST(scalar(*t.c, "SELECT SUM(cents) FROM balances") == 2 * 30 * 60);
}
