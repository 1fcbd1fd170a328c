// What a host that dies of a fatal signal leaves behind: one line naming the
// signal and the faulting address, and the stack of the thread that took it,
// on stderr and appended to the log file. Then the signal's default action
// runs, so a supervisor still sees the process killed by that signal (and a
// core dump is written where the system keeps them).
//
// Delivery: nothing here touches records. A crash between a call and its
// done mark leaves the claim as it was, and the next owner decides from it
// (the crash cut points of DESIGN.md).
#pragma once

#include <string>

namespace idemsink::app {

/// Installs the handler for SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT (on
/// the faulting thread's own stack: an overflow of it dies unreported).
void install_crash_report();

/// Where the report also goes (the configured log file); empty: stderr only.
/// Called once the config is read, before the host starts its threads.
void set_crash_report_file(const std::string& path);

}  // namespace idemsink::app
