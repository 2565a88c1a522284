// One small logging layer: levels, and text or JSON lines on stderr. Thread-safe; a line is
// written with one call, so lines of several threads (or processes) do not interleave. Text lines
// start with the time (UTC, ISO 8601, milliseconds); JSON lines carry it as "ts" (ms since the
// epoch) and a job's fields as fields of their own.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace jobrt {

enum class log_level { debug, info, warn, error, off };

/// Parses "debug", "info", "warn", "error", "off"; throws std::invalid_argument naming the value.
log_level parse_log_level(std::string_view text);

/// Lines below this level are dropped (default: info).
void set_log_level(log_level level) noexcept;
log_level get_log_level() noexcept;
/// One JSON object per line ({"ts", "level", "source", "msg"} and a job's fields) instead of text.
void set_log_json(bool json) noexcept;

/// What a line is about, when it is about a job: in JSON each field set (not empty, not 0) is a
/// field of the line ("job", "group", "type", "attempt", "worker"); text lines say it in the
/// message.
struct log_fields {
  std::string_view job;
  std::string_view group;
  std::string_view type;
  std::int64_t attempt = 0;
  std::string_view worker;
};

/// Writes one line: `source` names who speaks ("worker host:1:ab", "job 17").
void log_line(log_level level, std::string_view source, std::string_view message, const log_fields& fields = {});

template <class... Args>
void log(log_level level, std::string_view source, fmt::format_string<Args...> format, Args&&... args) {
  if (level < get_log_level()) return;
  log_line(level, source, fmt::format(format, std::forward<Args>(args)...));
}

/// The same, about a job.
template <class... Args>
void log(log_level level, const log_fields& fields, std::string_view source, fmt::format_string<Args...> format,
         Args&&... args) {
  if (level < get_log_level()) return;
  log_line(level, source, fmt::format(format, std::forward<Args>(args)...), fields);
}

}  // namespace jobrt
