// Test handler of kind local_tx: inserts one row per application into
// test_effects inside the host's claim transaction. The table has no unique
// key on purpose: a double application would show up as two rows. Keys
// ending in an even byte queue their row (Tx::insert_row, written by the
// host at the end of the batch), the others execute it at once: every batch
// mixes the two ways.
//   perm-...     permanent rejection (the insert is rolled back)
//   retryN-...   retryable for the first N calls
#include <idemsink/sdk.h>

namespace {

using idemsink::sdk::Completion;
using idemsink::sdk::Record;
using idemsink::sdk::SqlParam;

constexpr const char* kSchema[] = {
    "CREATE TABLE IF NOT EXISTS test_effects ("
    " id BIGINT AUTO_INCREMENT PRIMARY KEY,"
    " route VARCHAR(64) NOT NULL,"
    " biz_key VARBINARY(255) NOT NULL,"
    " idem_token CHAR(36) NOT NULL,"
    " attempt INT NOT NULL,"
    " KEY (biz_key)) ENGINE=InnoDB"};

class LocalTx {
 public:
  LocalTx(const idemsink::sdk::Host&, const idemsink::sdk::Options&) {}

  void apply(const Record& rec, idemsink::sdk::Tx& tx, Completion done) {
    const std::string_view key = rec.biz_key();
    const SqlParam attempt(static_cast<int64_t>(rec.attempt()));
    if (!key.empty() && key.back() % 2 == 0)
      tx.insert_row("test_effects", {{"route", SqlParam(rec.route())},
                                     {"biz_key", SqlParam::blob(key)},
                                     {"idem_token", SqlParam(rec.idem_token())},
                                     {"attempt", attempt}});
    else
      tx.execute("INSERT INTO test_effects (route, biz_key, idem_token, attempt) VALUES (?, ?, ?, ?)",
                 {SqlParam(rec.route()), SqlParam::blob(key), SqlParam(rec.idem_token()), attempt});
    if (key.starts_with("perm-")) return done.permanent("scripted rejection");
    if (key.starts_with("retry")) {
      int n = 0;
      for (size_t i = 5; i < key.size() && key[i] >= '0' && key[i] <= '9'; ++i) n = n * 10 + (key[i] - '0');
      if (static_cast<int>(rec.attempt()) <= n) return done.retryable("scripted retry");
    }
    done.ok("row");
  }
};

}  // namespace

IDEMSINK_PLUGIN(LocalTx, .name = "test_local_tx", .version = "1.0.0", .description = "local_tx test handler",
                .kind = IDEMSINK_KIND_LOCAL_TX, .schema = kSchema)
