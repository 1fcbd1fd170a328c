// Test handler for remote kinds. Behaviour is scripted by the biz_key's
// prefix so one topic can mix outcomes:
//   perm-...        permanent rejection
//   retryN-...      retryable for the first N calls, then ok
//   uncertainN-...  uncertain for the first N calls, then ok ("uncertain-": always)
//   hang-...        never reports (the host's call_timeout must catch it)
//   throw-...       throws from invoke (the SDK turns it into uncertain)
//   crash-...       kills the host with SIGSEGV from invoke (a broken plugin)
//   bigreceipt-...  ok, with a 5,000-byte receipt (the column holds 1,024)
//   badtext-...     permanent, with an error text utf8mb4 refuses (overlong
//                   form, a byte above F4, a surrogate)
//   anything else   ok after `delay`
// Every call appends one line to the `log` file before reporting:
//   route \t hex(biz_key) \t idem_token \t attempt \t outcome \t unix ms \t hex(the value as JSON)
// so a test can prove what was really invoked, even across SIGKILLs.
#include <fcntl.h>
#include <unistd.h>

#include <condition_variable>
#include <csignal>
#include <idemsink/sdk.h>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#ifndef SCRIPTED_KIND
#error SCRIPTED_KIND must be defined
#endif

namespace {

using idemsink::sdk::Completion;
using idemsink::sdk::Record;

constexpr idemsink_option_decl kOptions[] = {
    {"log", IDEMSINK_OPTION_STRING, nullptr, "file receiving one line per call"},
    {"delay", IDEMSINK_OPTION_DURATION, "0ms", "latency of every call"},
};

std::string hex(std::string_view s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
  return out;
}

int leading_count(std::string_view key, std::string_view prefix) {
  // "retry3-..." -> 3; "uncertain-..." -> a large number
  std::string_view rest = key.substr(prefix.size());
  int n = 0;
  size_t i = 0;
  while (i < rest.size() && rest[i] >= '0' && rest[i] <= '9') n = n * 10 + (rest[i++] - '0');
  return i == 0 ? 1 << 30 : n;
}

class Scripted {
 public:
  Scripted(const idemsink::sdk::Host&, const idemsink::sdk::Options& o)
      : delay_(o.duration("delay")), worker_([this] { loop(); }) {
    fd_ = ::open(o.str("log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd_ < 0) throw std::runtime_error("cannot open log " + o.str("log"));
  }
  ~Scripted() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
    ::close(fd_);
  }

  void invoke(const Record& rec, Completion done) {
    const std::string_view key = rec.biz_key();
    idemsink_outcome outcome = IDEMSINK_OUTCOME_OK;
    if (key.starts_with("perm-") || key.starts_with("badtext-")) outcome = IDEMSINK_OUTCOME_PERMANENT;
    if (key.starts_with("retry") && static_cast<int>(rec.attempt()) <= leading_count(key, "retry"))
      outcome = IDEMSINK_OUTCOME_RETRYABLE;
    if (key.starts_with("uncertain") && static_cast<int>(rec.attempt()) <= leading_count(key, "uncertain"))
      outcome = IDEMSINK_OUTCOME_UNCERTAIN;
    const char* names[] = {"ok", "retryable", "uncertain", "permanent"};
    std::string line = std::string(rec.route()) + "\t" + hex(key) + "\t" + std::string(rec.idem_token()) + "\t" +
                       std::to_string(rec.attempt()) + "\t" +
                       (key.starts_with("hang-")    ? "hang"
                        : key.starts_with("throw-") ? "throw"
                                                    : names[outcome]) +
                       "\t" +
                       std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::system_clock::now().time_since_epoch())
                                          .count()) +
                       "\t" + hex(rec.json()) + "\n";
    if (::write(fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
      throw std::runtime_error("log write");
    if (key.starts_with("hang-")) {
      std::lock_guard lk(mu_);
      hung_.push_back(std::move(done));  // kept, never reported
      return;
    }
    if (key.starts_with("throw-")) throw std::runtime_error("scripted failure");
    if (key.starts_with("crash-")) std::raise(SIGSEGV);
    std::string receipt = "r-" + std::string(rec.idem_token());
    if (key.starts_with("bigreceipt-")) receipt += std::string(5000 - receipt.size(), 'x');
    std::string detail = receipt;
    if (outcome != IDEMSINK_OUTCOME_OK)
      detail = key.starts_with("badtext-") ? std::string("bad \xC0\xAF byte \xF5\x80\x80\x80 and \xED\xA0\x80 end")
                                           : "scripted outcome";
    {
      std::lock_guard lk(mu_);
      queue_.emplace(std::chrono::steady_clock::now() + delay_, Pending{std::move(done), outcome, detail});
    }
    cv_.notify_one();
  }

 private:
  struct Pending {
    Completion done;
    idemsink_outcome outcome;
    std::string detail;
  };
  void loop() {
    std::unique_lock lk(mu_);
    while (!stop_) {
      if (queue_.empty()) {
        cv_.wait(lk);
        continue;
      }
      auto due = queue_.begin()->first;
      if (std::chrono::steady_clock::now() < due) {
        cv_.wait_until(lk, due);
        continue;
      }
      Pending p = std::move(queue_.begin()->second);
      queue_.erase(queue_.begin());
      lk.unlock();
      p.done.report(p.outcome, p.detail);
      lk.lock();
    }
  }

  std::chrono::milliseconds delay_;
  int fd_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::multimap<std::chrono::steady_clock::time_point, Pending> queue_;
  std::vector<Completion> hung_;
  std::thread worker_;
};

}  // namespace

IDEMSINK_PLUGIN(Scripted, .name = "scripted", .version = "1.0.0", .description = "scripted test handler",
                .kind = SCRIPTED_KIND, .options = kOptions)
