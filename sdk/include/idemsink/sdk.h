// idemsink plugin SDK: a header-only C++20 layer over plugin_abi.h.
//
// A plugin author writes one class and one macro:
//
//   class Waybill {
//    public:
//     Waybill(const idemsink::sdk::Host& host, const idemsink::sdk::Options& opts);
//     void invoke(const idemsink::sdk::Record& rec, idemsink::sdk::Completion done);
//   };
//   IDEMSINK_PLUGIN(Waybill, .name = "waybill", .version = "1.0.0",
//                   .description = "...", .kind = IDEMSINK_KIND_REMOTE_IDEMPOTENT,
//                   .options = kWaybillOptions);
//
// Remote kinds implement invoke() (and optionally reconcile()); local_tx
// implements apply(const Record&, Tx&, Completion). Every exception is caught
// at the ABI boundary: a throwing constructor fails create() with its message,
// a throwing invoke/apply reports UNCERTAIN (the core then retries an
// idempotent call with the same token, and parks an at-most-once call as
// `unknown`: it cannot know whether the throw happened before or after the
// effect).
#pragma once

#include <idemsink/plugin_abi.h>

#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idemsink::sdk {

namespace detail {
inline void copy_message(char* buf, size_t cap, std::string_view msg) {
  if (buf == nullptr || cap == 0) return;
  const size_t n = msg.size() < cap - 1 ? msg.size() : cap - 1;
  std::memcpy(buf, msg.data(), n);
  buf[n] = '\0';
}
inline std::string_view view(idemsink_bytes b) { return b.data ? std::string_view(b.data, b.len) : std::string_view(); }
/// The detail of a retryable outcome asking for a pause: "retry-after=<N>ms: error".
inline std::string retry_after_detail(std::chrono::milliseconds pause, std::string_view error) {
  return "retry-after=" + std::to_string(pause.count() < 1 ? 1 : pause.count()) + "ms: " + std::string(error);
}

// What every handle of one call shares: the host's callback and whether it
// has been called, so that exactly one report reaches the host.
struct CompletionState {
  idemsink_complete_fn fn;
  void* ctx;
  std::mutex mu;
  bool reported = false;
  bool in_call = true;  // the ABI trampoline has not returned yet
  int handles = 0;      // live Completion objects sharing this state
};
}  // namespace detail

/// Handler options, already validated by the host against the declarations.
class Options {
 public:
  Options(const idemsink_option* opts, size_t n) {
    for (size_t i = 0; i < n; ++i) values_.emplace(opts[i].name, opts[i].value);
  }
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  const std::string& str(const std::string& name) const {
    auto it = values_.find(name);
    if (it == values_.end()) throw std::invalid_argument("option '" + name + "' is not set");
    return it->second;
  }
  int64_t integer(const std::string& name) const { return parse<int64_t>(name); }
  double number(const std::string& name) const { return std::stod(str(name)); }
  bool boolean(const std::string& name) const { return str(name) == "true"; }
  std::chrono::milliseconds duration(const std::string& name) const {
    return std::chrono::milliseconds(parse<int64_t>(name));
  }

 private:
  template <class T>
  T parse(const std::string& name) const {
    const std::string& s = str(name);
    T v{};
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size())
      throw std::invalid_argument("option '" + name + "' is not a number: " + s);
    return v;
  }
  std::map<std::string, std::string> values_;
};

/// Read-only view of the record being handled; valid only during the call.
class Record {
 public:
  explicit Record(const idemsink_record* r) : r_(r) {}
  std::string_view route() const { return r_->route; }
  std::string_view topic() const { return r_->topic; }
  int32_t partition() const { return r_->partition; }
  int64_t offset() const { return r_->offset; }
  int64_t timestamp_ms() const { return r_->timestamp_ms; }
  std::string_view key() const { return detail::view(r_->key); }
  std::string_view value() const { return detail::view(r_->value); }
  std::string_view biz_key() const { return detail::view(r_->biz_key); }
  std::string_view idem_token() const { return r_->idem_token; }
  uint32_t attempt() const { return r_->attempt; }
  /// How long the host waits for this call's report, from invoke (ABI v1.1;
  /// nothing from an older host). A request not sent by then must never be
  /// sent: report it retryable.
  std::optional<std::chrono::milliseconds> timeout() const {
    if (r_->struct_size < offsetof(idemsink_record, timeout_ms) + sizeof r_->timeout_ms || r_->timeout_ms <= 0)
      return std::nullopt;
    return std::chrono::milliseconds(r_->timeout_ms);
  }
  std::optional<std::string_view> header(std::string_view name) const {
    for (size_t i = 0; i < r_->header_count; ++i)
      if (name == r_->headers[i].name && r_->headers[i].value.data) return detail::view(r_->headers[i].value);
    return std::nullopt;
  }
  /// The value as JSON: decoded when the route's format is a schema
  /// registry's (avro, protobuf, json_schema), the value itself otherwise
  /// (an older host, or a route reading string or bytes: value()).
  std::string_view json() const {
    if (has_v12() && r_->value_json.data) return detail::view(r_->value_json);
    return value();
  }
  /// The key as JSON, when the route reads its keys as JSON or decodes them.
  std::optional<std::string_view> key_json() const {
    if (has_v12() && r_->key_json.data) return detail::view(r_->key_json);
    return std::nullopt;
  }
  const idemsink_record* raw() const { return r_; }

 private:
  bool has_v12() const { return r_->struct_size >= offsetof(idemsink_record, key_json) + sizeof r_->key_json; }
  const idemsink_record* r_;
};

/// The one-shot result channel of a call. Move-only; report exactly once from
/// any thread. A Completion destroyed without reporting reports UNCERTAIN, so
/// a forgotten path can never hang a record.
class Completion {
 public:
  Completion(Completion&& o) noexcept : s_(std::move(o.s_)) {}
  Completion& operator=(Completion&& o) noexcept {
    if (this != &o) {
      release();
      s_ = std::move(o.s_);
    }
    return *this;
  }
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;
  ~Completion() { release(); }

  void ok(std::string_view receipt) { report(IDEMSINK_OUTCOME_OK, receipt); }
  void retryable(std::string_view error) { report(IDEMSINK_OUTCOME_RETRYABLE, error); }
  /// Not applied, and the remote asked for a pause of `pause` (Retry-After):
  /// the host holds the route's calls that long (see plugin_abi.h).
  void retry_after(std::chrono::milliseconds pause, std::string_view error) {
    report(IDEMSINK_OUTCOME_RETRYABLE, detail::retry_after_detail(pause, error));
  }
  void uncertain(std::string_view error) { report(IDEMSINK_OUTCOME_UNCERTAIN, error); }
  void permanent(std::string_view error) { report(IDEMSINK_OUTCOME_PERMANENT, error); }
  void report(idemsink_outcome outcome, std::string_view detail) {
    if (!s_) return;
    {
      std::lock_guard lk(s_->mu);
      if (s_->reported) return;
      s_->reported = true;
    }
    s_->fn(s_->ctx, outcome, detail.data(), detail.size());
  }

  /// Used by the ABI trampolines and idemsink/testing.h; not part of the
  /// author-facing API.
  class Call {
   public:
    Call(idemsink_complete_fn fn, void* ctx) : s_(std::make_shared<detail::CompletionState>()) {
      s_->fn = fn;
      s_->ctx = ctx;
    }
    Completion handle() { return Completion(s_); }
    /// The trampoline returned (normally or by exception): if every handle is
    /// gone and nothing was reported, report now.
    void finish(std::string_view error_if_unreported) {
      {
        std::lock_guard lk(s_->mu);
        s_->in_call = false;
        if (s_->reported || s_->handles > 0) return;
        s_->reported = true;
      }
      s_->fn(s_->ctx, IDEMSINK_OUTCOME_UNCERTAIN, error_if_unreported.data(), error_if_unreported.size());
    }

   private:
    std::shared_ptr<detail::CompletionState> s_;
  };

 private:
  explicit Completion(std::shared_ptr<detail::CompletionState> s) : s_(std::move(s)) {
    std::lock_guard lk(s_->mu);
    ++s_->handles;
  }
  void release() {
    if (!s_) return;
    auto s = std::move(s_);
    {
      std::lock_guard lk(s->mu);
      --s->handles;
      if (s->reported || s->handles > 0 || s->in_call) return;
      s->reported = true;
    }
    static constexpr std::string_view kDropped = "handler dropped its completion without reporting a result";
    s->fn(s->ctx, IDEMSINK_OUTCOME_UNCERTAIN, kDropped.data(), kDropped.size());
  }
  std::shared_ptr<detail::CompletionState> s_;
};

/// A copyable handle to one Completion, for callbacks that must be copyable
/// (std::function). Every copy reports through the same Completion, so the
/// first report from any copy wins and the rest are ignored; when the last
/// copy is destroyed without a report, the Completion reports UNCERTAIN.
class SharedCompletion {
 public:
  explicit SharedCompletion(Completion done) : c_(std::make_shared<Completion>(std::move(done))) {}

  // const: a copy captured by a non-mutable lambda must still report.
  void ok(std::string_view receipt) const { report(IDEMSINK_OUTCOME_OK, receipt); }
  void retryable(std::string_view error) const { report(IDEMSINK_OUTCOME_RETRYABLE, error); }
  void retry_after(std::chrono::milliseconds pause, std::string_view error) const {
    report(IDEMSINK_OUTCOME_RETRYABLE, detail::retry_after_detail(pause, error));
  }
  void uncertain(std::string_view error) const { report(IDEMSINK_OUTCOME_UNCERTAIN, error); }
  void permanent(std::string_view error) const { report(IDEMSINK_OUTCOME_PERMANENT, error); }
  void report(idemsink_outcome outcome, std::string_view detail) const {
    if (c_) c_->report(outcome, detail);
  }

 private:
  std::shared_ptr<Completion> c_;  // null only in a moved-from handle
};

/// Access to the host: logging.
class Host {
 public:
  explicit Host(const idemsink_host_api* api) : api_(api) {}
  void log(idemsink_log_level level, std::string_view msg) const {
    if (api_ && api_->log) api_->log(api_->host_ctx, level, msg.data(), msg.size());
  }
  void info(std::string_view msg) const { log(IDEMSINK_LOG_INFO, msg); }
  void warn(std::string_view msg) const { log(IDEMSINK_LOG_WARN, msg); }
  void error(std::string_view msg) const { log(IDEMSINK_LOG_ERROR, msg); }
  const idemsink_host_api* raw() const { return api_; }

 private:
  const idemsink_host_api* api_;
};

/// A bound SQL parameter for Tx::execute / Tx::query.
struct SqlParam {
  idemsink_sql_param p{};
  SqlParam() { p.type = IDEMSINK_SQL_NULL; }
  SqlParam(int64_t v) {
    p.type = IDEMSINK_SQL_INT;
    p.i = v;
  }
  SqlParam(int v) : SqlParam(static_cast<int64_t>(v)) {}
  SqlParam(double v) {
    p.type = IDEMSINK_SQL_DOUBLE;
    p.d = v;
  }
  SqlParam(std::string_view text) {
    p.type = IDEMSINK_SQL_TEXT;
    p.bytes = {text.data(), text.size()};
  }
  SqlParam(const char* text) : SqlParam(std::string_view(text)) {}
  SqlParam(const std::string& text) : SqlParam(std::string_view(text)) {}
  static SqlParam blob(std::string_view bytes) {
    SqlParam s;
    s.p.type = IDEMSINK_SQL_BLOB;
    s.p.bytes = {bytes.data(), bytes.size()};
    return s;
  }
};

/// A failed statement inside a local_tx apply.
class SqlError : public std::runtime_error {
 public:
  SqlError(int code, const std::string& msg) : std::runtime_error(msg), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

/// The host's open transaction, handed to local_tx apply().
class Tx {
 public:
  Tx(const idemsink_host_api* api, idemsink_tx* tx) : api_(api), tx_(tx) {}

  /// Executes one statement; returns affected rows; throws SqlError.
  uint64_t execute(std::string_view sql, std::initializer_list<SqlParam> params = {}) {
    std::vector<idemsink_sql_param> raw = to_raw(params);
    uint64_t affected = 0;
    char err[512];
    const std::string stmt(sql);
    if (int rc = api_->tx_execute(tx_, stmt.c_str(), raw.data(), raw.size(), &affected, err, sizeof err))
      throw SqlError(rc, err);
    return affected;
  }

  /// Runs a query; on_row receives each row's columns (nullopt = NULL).
  void query(std::string_view sql, std::initializer_list<SqlParam> params,
             const std::function<void(const std::vector<std::optional<std::string_view>>&)>& on_row) {
    std::vector<idemsink_sql_param> raw = to_raw(params);
    char err[512];
    const std::string stmt(sql);
    auto cb = [](void* ctx, size_t n, const idemsink_bytes* cols) {
      std::vector<std::optional<std::string_view>> row;
      row.reserve(n);
      for (size_t i = 0; i < n; ++i)
        row.push_back(cols[i].data ? std::optional(std::string_view(cols[i].data, cols[i].len)) : std::nullopt);
      (*static_cast<const std::function<void(const std::vector<std::optional<std::string_view>>&)>*>(ctx))(row);
    };
    if (int rc = api_->tx_query(tx_, stmt.c_str(), raw.data(), raw.size(), cb,
                                const_cast<void*>(static_cast<const void*>(&on_row)), err, sizeof err))
      throw SqlError(rc, err);
  }

  /// One column of a row for insert_row / upsert_row: its name (an
  /// identifier, never SQL) and its bound value.
  struct Column {
    const char* name;
    SqlParam value;
  };
  /// One column an upsert changes in the row it finds: set to the value, or
  /// the value added to it.
  struct Update {
    const char* name;
    SqlParam value;
    idemsink_column_update how = IDEMSINK_COLUMN_SET;
  };
  static Update set(const char* name, SqlParam value) { return {name, value, IDEMSINK_COLUMN_SET}; }
  static Update add(const char* name, SqlParam value) { return {name, value, IDEMSINK_COLUMN_ADD}; }

  /// Queues a row to INSERT at the end of the batch, with the batch's other
  /// rows of the same table and columns in one statement, if and only if
  /// this record reports ok. Never read it back in the same batch (whether
  /// execute/query see it is unspecified); a row the server refuses
  /// dead-letters this record alone (plugin_abi.h, tx_write_row). Throws
  /// SqlError for a malformed row.
  void insert_row(const char* table, std::initializer_list<Column> columns) {
    write_row(IDEMSINK_ROW_INSERT, table, columns, {});
  }

  /// Queues an update of the row whose unique key is `key`, inserting it
  /// when missing (INSERT ... ON DUPLICATE KEY UPDATE), written like
  /// insert_row's rows: the batch's rows in one statement, in key order.
  void upsert_row(const char* table, std::initializer_list<Column> key, std::initializer_list<Update> updates) {
    write_row(IDEMSINK_ROW_UPSERT, table, key, updates);
  }

 private:
  void write_row(idemsink_row_kind kind, const char* table, std::initializer_list<Column> key,
                 std::initializer_list<Update> updates) {
    char err[512];
    if (api_->struct_size < offsetof(idemsink_host_api, tx_write_row) + sizeof api_->tx_write_row ||
        api_->tx_write_row == nullptr)
      throw SqlError(1235, "this host predates tx_write_row (ABI v1.3): use execute()");
    std::vector<const char*> names;
    std::vector<idemsink_sql_param> values;
    std::vector<int32_t> how;
    for (const auto& c : key) {
      names.push_back(c.name);
      values.push_back(c.value.p);
    }
    for (const auto& u : updates) {
      names.push_back(u.name);
      values.push_back(u.value.p);
      how.push_back(u.how);
    }
    idemsink_row row{};
    row.struct_size = sizeof row;
    row.kind = kind;
    row.table = table;
    row.columns = names.data();
    row.values = values.data();
    row.column_count = names.size();
    row.key_count = kind == IDEMSINK_ROW_UPSERT ? key.size() : 0;
    row.updates = kind == IDEMSINK_ROW_UPSERT ? how.data() : nullptr;
    if (int rc = api_->tx_write_row(tx_, &row, err, sizeof err)) throw SqlError(rc, err);
  }
  static std::vector<idemsink_sql_param> to_raw(std::initializer_list<SqlParam> params) {
    std::vector<idemsink_sql_param> raw;
    raw.reserve(params.size());
    for (const auto& p : params) raw.push_back(p.p);
    return raw;
  }
  const idemsink_host_api* api_;
  idemsink_tx* tx_;
};

/// What IDEMSINK_PLUGIN needs to build the descriptor.
struct PluginInfo {
  const char* name = nullptr;
  const char* version = nullptr;
  const char* description = "";
  idemsink_kind kind = IDEMSINK_KIND_REMOTE_IDEMPOTENT;
  std::span<const idemsink_option_decl> options{};
  std::span<const char* const> schema{};
  std::span<const idemsink_check> checks{};
};

}  // namespace idemsink::sdk

// How a handler class becomes the ABI descriptor (IDEMSINK_PLUGIN).
#include <idemsink/detail/descriptor.h>
