// hello_handler: the smallest useful idemsink plugin, and a template.
//
// For every record it writes one greeting row into the business database.
// It is a local_tx handler: the row commits in the same transaction that
// marks the record's claim done, so each biz_key is greeted exactly once,
// however often the record is redelivered. Copy this folder to start a
// plugin of your own (see sdk/README.md for the remote kinds).
#include <idemsink/sdk.h>

namespace {

using namespace idemsink;

// Options the host validates before create(): name, type, default, doc.
constexpr idemsink_option_decl kOptions[] = {
    {"greeting", IDEMSINK_OPTION_STRING, "hello", "word written before the biz_key"},
};

// Tables the plugin needs; `idemsink schema apply` (or start-up) creates them.
constexpr const char* kSchema[] = {
    "CREATE TABLE IF NOT EXISTS hello_greetings ("
    " id BIGINT AUTO_INCREMENT PRIMARY KEY,"
    " biz_key VARBINARY(255) NOT NULL,"
    " greeting VARCHAR(300) NOT NULL,"
    " idem_token CHAR(36) NOT NULL,"
    " KEY (biz_key)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"};

// A query returning one row per problem: `idemsink reconcile --check` runs it.
constexpr idemsink_check kChecks[] = {
    {"greeted_twice", "SELECT biz_key, COUNT(*) FROM hello_greetings GROUP BY biz_key HAVING COUNT(*) > 1",
     "a key greeted more than once"},
};

class Hello {
 public:
  Hello(const sdk::Host& host, const sdk::Options& options) : greeting_(options.str("greeting")) {
    host.info("ready to say " + greeting_);
  }

  // Runs inside the host's transaction; report before returning. Anything
  // but ok rolls the write back. A thrown exception is reported for you.
  void apply(const sdk::Record& rec, sdk::Tx& tx, sdk::Completion done) {
    if (rec.biz_key().size() > 255) return done.permanent("biz_key too long to greet");
    tx.execute("INSERT INTO hello_greetings (biz_key, greeting, idem_token) VALUES (?, ?, ?)",
               {sdk::SqlParam::blob(rec.biz_key()), sdk::SqlParam(greeting_ + " " + std::string(rec.biz_key())),
                sdk::SqlParam(rec.idem_token())});
    done.ok(greeting_);
  }

 private:
  std::string greeting_;
};

}  // namespace

IDEMSINK_PLUGIN(Hello, .name = "hello", .version = "1.0.0", .description = "greets every biz_key exactly once",
                .kind = IDEMSINK_KIND_LOCAL_TX, .options = kOptions, .schema = kSchema, .checks = kChecks)
