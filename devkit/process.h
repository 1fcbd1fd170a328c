// Child processes for tests and the demo: started with fork/exec, output to
// files, killed with their parent (PR_SET_PDEATHSIG), stoppable with any
// signal; plus scratch directories and waiting for a condition.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idemsink::devkit {

class Process {
 public:
  Process(std::vector<std::string> argv, std::filesystem::path out_file, std::filesystem::path err_file,
          std::map<std::string, std::string> env = {});
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool running();
  void signal(int sig);
  /// Waits for exit; returns the exit code, or -signal when killed, or
  /// nullopt on timeout.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  /// SIGKILL and reap.
  void kill_now();

  std::string out() const;
  std::string err() const;
  const std::filesystem::path& err_path() const { return err_file_; }

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
  std::filesystem::path out_file_, err_file_;
};

/// A TCP port that was free a moment ago on 127.0.0.1, below the ephemeral
/// range and not handed out before by this process.
int free_port();

/// The java launcher: $JAVA_HOME/bin/java, else the first on $PATH.
std::string java_binary();

/// Polls `pred` every `interval` until it holds or `timeout` passes;
/// throws std::runtime_error naming `what` on timeout.
template <class Pred>
void wait_until(Pred pred, std::chrono::milliseconds timeout, const std::string& what,
                std::chrono::milliseconds interval = std::chrono::milliseconds(10));

/// A fresh scratch directory under $TMPDIR, removed at destruction unless
/// IDEMSINK_KEEP_SCRATCH is set.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag);
  ~ScratchDir();
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

std::string read_file(const std::filesystem::path& p);
void write_file(const std::filesystem::path& p, const std::string& text);

/// Bytes as hex, and back (logs and encoders that write bytes as text lines).
std::string hex_of(std::string_view bytes);
std::string unhex(const std::string& hex);

}  // namespace idemsink::devkit

#include "devkit/wait_impl.h"
