// ledger: credits an account in the business database (local_tx).
//
// Seed 003: the claim and the business write commit in one transaction, so
// a crash leaves either both or neither, and a redelivery finds the claim
// done and writes nothing. The table deliberately has no unique key on
// biz_key (real ledgers hold reversals and corrections too); the
// duplicate_credits check is the reconciliation query that would catch a
// double credit, run by `idemsink reconcile --check`.
#include <idemsink/sdk.h>

#include <cmath>
#include <nlohmann/json.hpp>

namespace {

using namespace idemsink;

constexpr idemsink_option_decl kOptions[] = {
    {"account_field", IDEMSINK_OPTION_STRING, "account", "dotted path of the account id in the JSON value"},
    {"amount_field", IDEMSINK_OPTION_STRING, "amount",
     "dotted path of the amount (a decimal number) in the JSON value"},
    {"entry_type", IDEMSINK_OPTION_STRING, "PAY_CREDIT", "entry type written with every credit"},
};

constexpr const char* kSchema[] = {
    "CREATE TABLE IF NOT EXISTS ledger_entries ("
    " id BIGINT AUTO_INCREMENT PRIMARY KEY,"
    " biz_key VARBINARY(255) NOT NULL,"
    " entry_type VARCHAR(32) NOT NULL,"
    " account VARCHAR(64) NOT NULL,"
    " amount_cents BIGINT NOT NULL,"
    " idem_token CHAR(36) NOT NULL,"
    " created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),"
    " KEY idx_biz_key (biz_key, entry_type),"
    " KEY idx_created (created_at)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
    "CREATE TABLE IF NOT EXISTS ledger_balances ("
    " account VARCHAR(64) PRIMARY KEY,"
    " balance_cents BIGINT NOT NULL,"
    " updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3)"
    ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
};

constexpr idemsink_check kChecks[] = {
    {"duplicate_credits",
     "SELECT biz_key, entry_type, COUNT(*) AS credits, SUM(amount_cents) AS total_cents FROM ledger_entries "
     "GROUP BY biz_key, entry_type HAVING COUNT(*) > 1",
     "a biz_key credited more than once: money paid twice"},
};

const nlohmann::json* at_path(const nlohmann::json& j, const std::string& path) {
  const nlohmann::json* cur = &j;
  size_t pos = 0;
  while (pos <= path.size()) {
    const size_t dot = std::min(path.find('.', pos), path.size());
    const std::string part = path.substr(pos, dot - pos);
    if (!cur->is_object() || !cur->contains(part)) return nullptr;
    cur = &(*cur)[part];
    pos = dot + 1;
  }
  return cur;
}

class Ledger {
 public:
  Ledger(const sdk::Host&, const sdk::Options& o)
      : account_field_(o.str("account_field")),
        amount_field_(o.str("amount_field")),
        entry_type_(o.str("entry_type")) {}

  void apply(const sdk::Record& rec, sdk::Tx& tx, sdk::Completion done) {
    auto j = nlohmann::json::parse(rec.json(), nullptr, false);
    if (j.is_discarded()) return done.permanent("value is not JSON");
    const auto* account = at_path(j, account_field_);
    const auto* amount = at_path(j, amount_field_);
    if (!account || !account->is_string() || account->get<std::string>().empty())
      return done.permanent("no account at " + account_field_);
    if (!amount || !amount->is_number()) return done.permanent("no numeric amount at " + amount_field_);
    const double value = amount->get<double>();
    if (!(value > 0) || value > 1e12) return done.permanent("amount must be positive, got " + amount->dump());
    const int64_t cents = std::llround(value * 100);
    const std::string& acct = account->get_ref<const std::string&>();
    // Queued, not executed: the host writes the batch's entries in one
    // INSERT and its balances in one upsert in account order (concurrent
    // batches then lock balances in one order and never deadlock), both in
    // the claim's transaction, and only for records reported ok.
    tx.insert_row("ledger_entries", {{"biz_key", sdk::SqlParam::blob(rec.biz_key())},
                                     {"entry_type", entry_type_},
                                     {"account", acct},
                                     {"amount_cents", cents},
                                     {"idem_token", rec.idem_token()}});
    tx.upsert_row("ledger_balances", {{"account", acct}}, {sdk::Tx::add("balance_cents", cents)});
    done.ok("credited " + acct + " " + std::to_string(cents) + " cents");
  }

 private:
  std::string account_field_;
  std::string amount_field_;
  std::string entry_type_;
};

}  // namespace

IDEMSINK_PLUGIN(Ledger, .name = "ledger", .version = "1.0.0",
                .description = "credits a ledger account in the claim's own transaction",
                .kind = IDEMSINK_KIND_LOCAL_TX, .options = kOptions, .schema = kSchema, .checks = kChecks)
