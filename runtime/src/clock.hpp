// The wall clock as jobrt stores it: milliseconds since the Unix epoch.
#pragma once

#include <chrono>
#include <cstdint>

namespace jobrt::detail {

inline std::int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace jobrt::detail
