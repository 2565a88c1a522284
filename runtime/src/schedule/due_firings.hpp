// Which of a schedule's firings are due at a moment, and when the one after them is: the
// scheduler's arithmetic, without I/O (unit tested).
#pragma once

#include <jobrt/scheduler.hpp>

#include <cstdint>
#include <vector>

namespace jobrt::detail {

struct due {
  std::vector<std::int64_t> firings;  ///< the latest due and up to catch_up before it, oldest first (ms)
  std::int64_t next = 0;              ///< the firing after the latest due (ms)
};

/// The firings of `s` due at `now` from `first` (due, not yet fired), times in ms since the
/// epoch. The next firing follows the latest due one, not `now`: a step taken late during a
/// fall-back does not fire the repeated time again.
due due_firings(const schedule_spec& s, std::int64_t first, std::int64_t now);

}  // namespace jobrt::detail
