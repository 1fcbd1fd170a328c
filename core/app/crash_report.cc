#include "core/app/crash_report.h"

#include <execinfo.h>
#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <csignal>
#include <cstdlib>
#include <cstring>

namespace idemsink::app {
namespace {

// Everything the handler reads is set before any thread that could crash
// starts, and the handler calls only async-signal-safe functions
// (backtrace() is made safe by calling it once up front: it loads libgcc).
std::array<char, 4096> g_report_file{};
constexpr std::array kFatalSignals{SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

void write_all(int fd, const char* s, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

void write_str(int fd, const char* s) { write_all(fd, s, std::strlen(s)); }

// Decimal and hexadecimal without printf (not async-signal-safe).
void write_number(int fd, unsigned long v, unsigned base) {
  char buf[32];
  size_t i = sizeof buf;
  do {
    buf[--i] = "0123456789abcdef"[v % base];
    v /= base;
  } while (v != 0);
  write_all(fd, buf + i, sizeof buf - i);
}

void report(int fd, int sig, const siginfo_t* info, void* const* frames, int depth) {
  write_str(fd, "idemsink: fatal signal ");
  write_number(fd, static_cast<unsigned long>(sig), 10);
  write_str(fd, " (");
  write_str(fd, sigabbrev_np(sig) != nullptr ? sigabbrev_np(sig) : "?");
  write_str(fd, ") at address 0x");
  write_number(fd, reinterpret_cast<unsigned long>(info->si_addr), 16);
  write_str(fd, " in thread ");
  write_number(fd, static_cast<unsigned long>(::gettid()), 10);
  write_str(fd, "; stack (resolve with addr2line -Cfe <module> <offset>):\n");
  backtrace_symbols_fd(frames, depth, fd);
}

void on_fatal_signal(int sig, siginfo_t* info, void*) {
  void* frames[64];
  const int depth = backtrace(frames, 64);
  report(STDERR_FILENO, sig, info, frames, depth);
  if (g_report_file[0] != '\0') {
    const int fd = ::open(g_report_file.data(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd >= 0) {
      report(fd, sig, info, frames, depth);
      ::close(fd);
    }
  }
  // SA_RESETHAND restored the default action: re-raised, it runs once this
  // handler returns, and the process dies of the signal it took.
  ::raise(sig);
}

}  // namespace

void install_crash_report() {
  void* warm_up[1];
  backtrace(warm_up, 1);
  struct sigaction sa {};
  sa.sa_sigaction = on_fatal_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int sig : kFatalSignals) ::sigaction(sig, &sa, nullptr);
}

void set_crash_report_file(const std::string& path) {
  const size_t n = std::min(path.size(), g_report_file.size() - 1);
  std::memcpy(g_report_file.data(), path.data(), n);
  g_report_file[n] = '\0';
}

}  // namespace idemsink::app
