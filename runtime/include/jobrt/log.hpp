// One small logging layer: levels, and text or JSON lines on stderr. Thread-safe; a line is
// written with one call, so lines of several threads (or processes) do not interleave.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace jobrt {

enum class log_level { debug, info, warn, error, off };

/// Parses "debug", "info", "warn", "error", "off"; throws std::invalid_argument naming the value.
log_level parse_log_level(std::string_view text);

/// Lines below this level are dropped (default: info).
void set_log_level(log_level level) noexcept;
log_level get_log_level() noexcept;
/// One JSON object per line ({"ts", "level", "source", "msg"}) instead of text.
void set_log_json(bool json) noexcept;

/// Writes one line: `source` names who speaks ("worker host:1:ab", "job 17").
void log_line(log_level level, std::string_view source, std::string_view message);

template <class... Args>
void log(log_level level, std::string_view source, fmt::format_string<Args...> format, Args&&... args) {
  if (level < get_log_level()) return;
  log_line(level, source, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace jobrt
