// What a local_tx handler may run inside the claim transaction: data
// statements only. Anything that could end the transaction early would let
// the effect commit without its claim, and be applied again on a re-run.
#define BOOST_TEST_MODULE local_tx_guard
#include <boost/test/unit_test.hpp>

#include "core/plugin/tx.h"

using idemsink::plugin::refused_in_claim_tx;

BOOST_AUTO_TEST_CASE(data_statements_run_after_any_comments) {
  for (const char* sql :
       {"INSERT INTO t VALUES (?)", "  update t SET a = 1", "DELETE FROM t", "REPLACE INTO t VALUES (1)",
        "SELECT a FROM t FOR UPDATE", "/* audit */ INSERT INTO t VALUES (1)", "-- why\nUPDATE t SET a = 2",
        "# why\n\tSELECT 1", "/*a*//*b*/ insert into t values (1)"})
    BOOST_TEST(refused_in_claim_tx(sql).empty(), sql);
}

BOOST_AUTO_TEST_CASE(anything_that_could_end_the_transaction_is_refused_by_name) {
  for (const char* sql : {"COMMIT",
                          "/*x*/COMMIT",
                          "-- c\nROLLBACK",
                          "BEGIN",
                          "START TRANSACTION",
                          "SAVEPOINT s",
                          "RELEASE SAVEPOINT s",
                          "SET autocommit = 1",
                          "LOCK TABLES t WRITE",
                          "XA START 'x'",
                          "CREATE TABLE x (a INT)",
                          "ALTER TABLE t ADD COLUMN b INT",
                          "DROP TABLE t",
                          "TRUNCATE t",
                          "CALL proc()",
                          "DO 1",
                          "(SELECT 1)",
                          "/*!COMMIT*/",
                          "/*M!100000 COMMIT */",
                          "/*!50000 INSERT INTO t VALUES (1) */",
                          "/* never closed INSERT",
                          "-- only a comment",
                          ""}) {
    const std::string why = refused_in_claim_tx(sql);
    BOOST_TEST(!why.empty(), sql);
  }
  const std::string why = refused_in_claim_tx("/*x*/COMMIT");
  BOOST_TEST(why.find("refused: \"/*x*/COMMIT\"") != std::string::npos, why);
}
