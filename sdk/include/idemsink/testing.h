// idemsink plugin SDK, testing: unit-test a handler without a host, a
// database or Kafka. Header-only, standard library only, no test framework:
// use it from whichever one the plugin's tests use.
//
// Compile the plugin's source into the test executable (its IDEMSINK_PLUGIN
// line then defines the entry function there) and drive the plugin through
// its descriptor, the way the host does, so that the SDK's boundary (options,
// exceptions turned into UNCERTAIN, dropped completions) is exercised too:
//
//   #include <idemsink/testing.h>
//   namespace t = idemsink::sdk::testing;
//
//   t::FakeHost host;                               // collects log lines
//   t::PluginInstance plugin(t::compiled_in_descriptor(), host,
//                            {{"greeting", "hi"}}); // as written in a route config
//   t::RecordBuilder rec;                           // owns the record's strings
//   rec.biz_key("order-1").value(R"({"amount": 5})");
//
//   t::FakeTx tx;                                   // local_tx: records every statement and row
//   tx.then(t::FakeTx::fails(1213, "Deadlock found"));  // optional: script answers
//   t::RecordingCompletion done;                    // one per call
//   plugin.apply(rec, tx, done);                    // remote kinds: plugin.invoke(rec, done)
//
//   done.reports() == 1, done.outcome() == IDEMSINK_OUTCOME_OK, done.detail(),
//   tx.calls()[0].sql, tx.calls()[0].params[0].bytes, host.logged("ready")
//
// A remote handler that reports from its own thread: done.wait() first.
//
// A handler class the test can name may also be driven directly, without the
// descriptor (and so without option checks, defaults or the SDK's catching):
//
//   Handler h(host.host(), t::make_options({{"timeout", "2000"}}));  // canonical values
//   h.invoke(rec.record(), done.completion());
//   sdk::Tx sql = tx.tx(host);                      // local_tx
//   h.apply(rec.record(), sql, done.completion());
//
// Lifetimes: the FakeHost outlives every PluginInstance created with it (the
// plugin keeps its host API), and a RecordingCompletion outlives the call it
// records (a plugin may report from another thread later).
#pragma once

#include <idemsink/sdk.h>
#include <idemsink/testing/fake_tx.h>

#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

/// The entry function of the plugin compiled into the test executable,
/// defined by that plugin's IDEMSINK_PLUGIN line.
extern "C" IDEMSINK_EXPORT const idemsink_plugin* IDEMSINK_ENTRY_NAME(void);

namespace idemsink::sdk::testing {

/// The descriptor of the plugin compiled into the test executable.
inline const idemsink_plugin& compiled_in_descriptor() {
  const idemsink_plugin* d = IDEMSINK_ENTRY_NAME();
  if (d == nullptr) throw std::logic_error(IDEMSINK_ENTRY_SYMBOL " returned NULL");
  return *d;
}

/// Options for a handler constructed directly, in the canonical text the
/// host hands over (durations in milliseconds); nothing is checked.
inline sdk::Options make_options(const std::map<std::string, std::string>& values) {
  std::vector<idemsink_option> raw;
  raw.reserve(values.size());
  for (const auto& [name, value] : values) raw.push_back({name.c_str(), value.c_str()});
  return sdk::Options(raw.data(), raw.size());
}

/// The host as a plugin sees it: a valid idemsink_host_api whose log lines
/// are collected (from any thread) and whose tx functions reach a FakeTx.
class FakeHost {
 public:
  struct LogLine {
    idemsink_log_level level;
    std::string text;
  };

  FakeHost() {
    api_.struct_size = sizeof api_;
    api_.host_ctx = this;
    api_.log = &FakeHost::log;
    api_.tx_execute = &FakeTx::execute;
    api_.tx_query = &FakeTx::query;
    api_.tx_write_row = &FakeTx::write_row;
  }
  FakeHost(const FakeHost&) = delete;  // the API points back at this object
  FakeHost& operator=(const FakeHost&) = delete;

  const idemsink_host_api* api() const { return &api_; }
  /// The Host a handler's constructor receives, when driving the class directly.
  sdk::Host host() const { return sdk::Host(&api_); }

  std::vector<LogLine> logs() const {
    std::lock_guard lk(mu_);
    return logs_;
  }
  /// Whether any log line contains `fragment`.
  bool logged(std::string_view fragment) const {
    std::lock_guard lk(mu_);
    for (const auto& l : logs_)
      if (l.text.find(fragment) != std::string::npos) return true;
    return false;
  }

 private:
  static void log(void* host_ctx, idemsink_log_level level, const char* msg, size_t msg_len) {
    auto* self = static_cast<FakeHost*>(host_ctx);
    std::lock_guard lk(self->mu_);
    self->logs_.push_back({level, msg ? std::string(msg, msg_len) : std::string()});
  }

  idemsink_host_api api_{};
  mutable std::mutex mu_;
  std::vector<LogLine> logs_;
};

inline sdk::Tx FakeTx::tx(const FakeHost& host) { return sdk::Tx(host.api(), raw()); }

/// Builds an idemsink_record and owns its strings. The record points into
/// the builder: it is valid until the builder is changed, moved or destroyed.
class RecordBuilder {
 public:
  RecordBuilder& route(std::string v) { return set(route_, std::move(v)); }
  RecordBuilder& topic(std::string v) { return set(topic_, std::move(v)); }
  RecordBuilder& partition(int32_t v) { return set(partition_, v); }
  RecordBuilder& offset(int64_t v) { return set(offset_, v); }
  RecordBuilder& timestamp_ms(int64_t v) { return set(timestamp_ms_, v); }
  RecordBuilder& key(std::string v) { return set(key_, std::move(v)); }
  RecordBuilder& value(std::string v) { return set(value_, std::move(v)); }
  RecordBuilder& biz_key(std::string v) { return set(biz_key_, std::move(v)); }
  RecordBuilder& idem_token(std::string v) { return set(idem_token_, std::move(v)); }
  RecordBuilder& attempt(uint32_t v) { return set(attempt_, v); }
  /// The host's deadline for the call (0: none given, as an older host).
  RecordBuilder& timeout_ms(int64_t v) { return set(timeout_ms_, v); }
  /// Adds a header; nullopt is a header with a null value.
  RecordBuilder& header(std::string name, std::optional<std::string> value) {
    headers_.emplace_back(std::move(name), std::move(value));
    return *this;
  }

  /// The record as the host passes it to invoke/apply/reconcile.
  const idemsink_record* raw() {
    raw_headers_.clear();
    for (const auto& [name, text] : headers_)
      raw_headers_.push_back({name.c_str(), text ? bytes(*text) : idemsink_bytes{nullptr, 0}});
    rec_ = idemsink_record{};
    rec_.struct_size = sizeof rec_;
    rec_.route = route_.c_str();
    rec_.topic = topic_.c_str();
    rec_.partition = partition_;
    rec_.offset = offset_;
    rec_.timestamp_ms = timestamp_ms_;
    rec_.key = bytes(key_);
    rec_.value = bytes(value_);
    rec_.biz_key = bytes(biz_key_);
    rec_.headers = raw_headers_.empty() ? nullptr : raw_headers_.data();
    rec_.header_count = raw_headers_.size();
    rec_.idem_token = idem_token_.c_str();
    rec_.attempt = attempt_;
    rec_.timeout_ms = timeout_ms_;
    return &rec_;
  }
  /// The view a handler receives, when driving the class directly.
  sdk::Record record() { return sdk::Record(raw()); }

 private:
  template <class T>
  RecordBuilder& set(T& field, T v) {
    field = std::move(v);
    return *this;
  }
  static idemsink_bytes bytes(const std::string& s) { return {s.data(), s.size()}; }

  std::string route_ = "test_route";
  std::string topic_ = "test_topic";
  int32_t partition_ = 0;
  int64_t offset_ = 0;
  int64_t timestamp_ms_ = 0;
  std::string key_;
  std::string value_;
  std::string biz_key_;
  std::string idem_token_ = "00000000-0000-4000-8000-000000000001";
  uint32_t attempt_ = 1;
  int64_t timeout_ms_ = 0;
  std::vector<std::pair<std::string, std::optional<std::string>>> headers_;
  std::vector<idemsink_header> raw_headers_;
  idemsink_record rec_{};
};

/// Captures what a call reports: the first outcome and detail, and how many
/// reports arrived (the host ignores all but the first; a correct handler
/// makes exactly one). Use one per call. Reports may come from any thread.
class RecordingCompletion {
 public:
  RecordingCompletion() = default;
  RecordingCompletion(const RecordingCompletion&) = delete;  // its address is the call context
  RecordingCompletion& operator=(const RecordingCompletion&) = delete;

  /// A Completion whose report lands here, for driving a handler class
  /// directly. Dropped without a report, it reports UNCERTAIN.
  Completion completion() {
    Completion::Call call(&RecordingCompletion::on_report, this);
    Completion c = call.handle();
    // No ABI call is in progress, so the handle alone owns the report from
    // here: this never reports, it only lets a dropped handle report.
    call.finish({});
    return c;
  }
  /// The callback and context for a raw descriptor call.
  idemsink_complete_fn fn() const { return &RecordingCompletion::on_report; }
  void* ctx() { return this; }

  int reports() const {
    std::lock_guard lk(mu_);
    return reports_;
  }
  /// The first report's outcome; nullopt before any report.
  std::optional<idemsink_outcome> outcome() const {
    std::lock_guard lk(mu_);
    return outcome_;
  }
  /// The first report's detail: the receipt, or the error message.
  std::string detail() const {
    std::lock_guard lk(mu_);
    return detail_;
  }
  /// Waits for the first report; false if none came within `timeout`.
  bool wait(std::chrono::milliseconds timeout = std::chrono::seconds(5)) const {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return reports_ > 0; });
  }

 private:
  static void on_report(void* ctx, idemsink_outcome outcome, const char* detail, size_t detail_len) {
    auto* self = static_cast<RecordingCompletion*>(ctx);
    std::lock_guard lk(self->mu_);
    if (self->reports_++ == 0) {
      self->outcome_ = outcome;
      self->detail_ = detail ? std::string(detail, detail_len) : std::string();
    }
    // Under the lock: a waiter may destroy this object as soon as it wakes.
    self->cv_.notify_all();
  }

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  int reports_ = 0;
  std::optional<idemsink_outcome> outcome_;
  std::string detail_;
};

/// One instance of a plugin, created through its descriptor the way the host
/// creates one for a route, and destroyed with it.
class PluginInstance {
 public:
  /// Option values as written in a route config ("2s" for a duration).
  using OptionValues = std::map<std::string, std::string>;

  /// Checks `options` against the descriptor's declarations as the host does
  /// (unknown names, missing required options and ill-typed values throw
  /// std::invalid_argument), fills in the defaults and calls create(); a
  /// failing create() throws std::runtime_error with the plugin's message.
  PluginInstance(const idemsink_plugin& descriptor, FakeHost& host, const OptionValues& options = {})
      : desc_(descriptor) {
    for (const auto& given : options) {
      bool declared = false;
      for (size_t i = 0; i < desc_.option_count; ++i) declared = declared || given.first == desc_.options[i].name;
      if (!declared) throw std::invalid_argument("unknown option '" + given.first + "' for plugin " + desc_.name);
    }
    std::vector<std::pair<std::string, std::string>> values;  // declaration order, as the host passes them
    for (size_t i = 0; i < desc_.option_count; ++i) {
      const idemsink_option_decl& decl = desc_.options[i];
      auto it = options.find(decl.name);
      if (it == options.end() && decl.default_value == nullptr)
        throw std::invalid_argument(std::string("option '") + decl.name + "' is required");
      const std::string text = it != options.end() ? it->second : std::string(decl.default_value);
      auto canonical = canonical_option(decl.type, text);
      if (!canonical)
        throw std::invalid_argument(std::string("option '") + decl.name + "': bad value \"" + text + "\"");
      values.emplace_back(decl.name, std::move(*canonical));
    }
    std::vector<idemsink_option> raw;
    raw.reserve(values.size());
    for (const auto& [name, value] : values) raw.push_back({name.c_str(), value.c_str()});
    char err[1024] = {};
    if (desc_.create(host.api(), raw.data(), raw.size(), &instance_, err, sizeof err) != 0) {
      err[sizeof err - 1] = '\0';
      throw std::runtime_error(std::string("create failed: ") + (err[0] ? err : "no message"));
    }
  }
  ~PluginInstance() { desc_.destroy(instance_); }
  PluginInstance(const PluginInstance&) = delete;
  PluginInstance& operator=(const PluginInstance&) = delete;

  const idemsink_plugin& descriptor() const { return desc_; }
  idemsink_kind kind() const { return static_cast<idemsink_kind>(desc_.kind); }

  void invoke(RecordBuilder& rec, RecordingCompletion& done) {
    require(desc_.invoke, "invoke");
    desc_.invoke(instance_, rec.raw(), done.fn(), done.ctx());
  }
  void apply(RecordBuilder& rec, FakeTx& tx, RecordingCompletion& done) {
    require(desc_.apply, "apply");
    desc_.apply(instance_, rec.raw(), tx.raw(), done.fn(), done.ctx());
  }
  void reconcile(RecordBuilder& rec, RecordingCompletion& done) {
    require(desc_.reconcile, "reconcile");
    desc_.reconcile(instance_, rec.raw(), done.fn(), done.ctx());
  }

 private:
  // The text the host hands a plugin for an option written as `text` in a
  // route config (a duration in milliseconds, everything else as written), or
  // nullopt if `text` is not of that type.
  static std::optional<std::string> canonical_option(idemsink_option_type type, const std::string& text) {
    const char* end = text.data() + text.size();
    switch (type) {
      case IDEMSINK_OPTION_STRING: return text;
      case IDEMSINK_OPTION_INT: {
        int64_t v = 0;
        auto [p, ec] = std::from_chars(text.data(), end, v);
        if (ec != std::errc() || p != end) return std::nullopt;
        return text;
      }
      case IDEMSINK_OPTION_FLOAT: {
        char* stop = nullptr;
        std::strtod(text.c_str(), &stop);
        if (text.empty() || stop != end) return std::nullopt;
        return text;
      }
      case IDEMSINK_OPTION_BOOL:
        if (text != "true" && text != "false") return std::nullopt;
        return text;
      case IDEMSINK_OPTION_DURATION: {
        int64_t n = 0;
        auto [p, ec] = std::from_chars(text.data(), end, n);
        if (ec != std::errc() || p == text.data() || n < 0) return std::nullopt;
        const std::string_view unit(p, static_cast<size_t>(end - p));
        const std::pair<std::string_view, int64_t> units[] = {
            {"ms", 1}, {"s", 1000}, {"m", 60'000}, {"h", 3'600'000}, {"d", 86'400'000}};
        for (const auto& [name, ms] : units)
          if (unit == name) return std::to_string(n * ms);
        return std::nullopt;
      }
    }
    return std::nullopt;
  }

  template <class Fn>
  void require(Fn fn, const char* what) const {
    if (fn == nullptr) throw std::logic_error(std::string("plugin ") + desc_.name + " has no " + what + " callback");
  }

  const idemsink_plugin& desc_;
  void* instance_ = nullptr;
};

}  // namespace idemsink::sdk::testing
