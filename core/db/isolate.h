// Writing a batch when the server may refuse one of its rows.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "core/db/connection.h"

namespace idemsink::db {

struct Rejected {
  size_t index;
  DbError error;
};

/// Runs `write(first, count)` over the rows [0, n). When the server refuses
/// a row's data (ErrorClass::Data), the batch is split in halves, each
/// written on its own, until the refused rows are alone: those are returned
/// with their error, every other row is written. Other errors propagate (the
/// pool re-runs the job). `write` must leave nothing behind when it throws:
/// one statement, or a transaction it began (rolled back here).
template <class Write>
std::vector<Rejected> write_isolating(Connection& c, size_t n, Write&& write) {
  std::vector<Rejected> rejected;
  std::function<void(size_t, size_t)> run = [&](size_t first, size_t count) {
    try {
      write(first, count);
    } catch (const DbError& e) {
      if (e.error_class() != ErrorClass::Data) throw;
      c.rollback_quietly();
      if (count == 1) {
        rejected.push_back({first, e});
        return;
      }
      run(first, count / 2);
      run(first + count / 2, count - count / 2);
    }
  };
  if (n > 0) run(0, n);
  return rejected;
}

}  // namespace idemsink::db
