#include <jobrt/log.hpp>

#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <stdexcept>

namespace jobrt {
namespace {

std::atomic<log_level> threshold{log_level::info};
std::atomic<bool> as_json{false};

std::string_view name_of(log_level l) {
  switch (l) {
    case log_level::debug: return "debug";
    case log_level::info: return "info";
    case log_level::warn: return "warn";
    case log_level::error: return "error";
    case log_level::off: return "off";
  }
  return "info";
}

}  // namespace

log_level parse_log_level(std::string_view text) {
  for (auto l : {log_level::debug, log_level::info, log_level::warn, log_level::error, log_level::off})
    if (text == name_of(l)) return l;
  throw std::invalid_argument(fmt::format("log level '{}' is not one of debug, info, warn, error, off", text));
}

void set_log_level(log_level level) noexcept { threshold.store(level, std::memory_order_relaxed); }
log_level get_log_level() noexcept { return threshold.load(std::memory_order_relaxed); }
void set_log_json(bool json) noexcept { as_json.store(json, std::memory_order_relaxed); }

void log_line(log_level level, std::string_view source, std::string_view message, const log_fields& fields) {
  if (level < get_log_level() || level == log_level::off) return;
  auto now = std::chrono::system_clock::now();
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  std::string line;
  if (as_json.load(std::memory_order_relaxed)) {
    boost::json::object o{{"ts", ms}, {"level", name_of(level)}, {"source", source}, {"msg", message}};
    if (!fields.job.empty()) o["job"] = fields.job;
    if (!fields.group.empty()) o["group"] = fields.group;
    if (!fields.type.empty()) o["type"] = fields.type;
    if (fields.attempt > 0) o["attempt"] = fields.attempt;
    if (!fields.worker.empty()) o["worker"] = fields.worker;
    line = boost::json::serialize(o);
  } else {
    std::time_t seconds = ms / 1000;
    std::tm utc{};
    ::gmtime_r(&seconds, &utc);
    line = fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z jobrt {} {}: {}", utc.tm_year + 1900, utc.tm_mon + 1,
                       utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, ms % 1000, name_of(level), source, message);
  }
  line += '\n';
  // One write(2): whole lines even with several threads or processes on one stderr.
  for (std::size_t done = 0; done < line.size();) {
    auto n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace jobrt
