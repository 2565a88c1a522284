// When a repeatable job fires: a cron expression read in a time zone, or a fixed interval.
//
// Cron expressions have five fields, "minute hour day-of-month month day-of-week", or six with
// seconds first. A field is '*', a value, a range 'a-b', a step '*/s', 'a/s' or 'a-b/s', or a
// comma-separated list of these; months and days may be named (JAN-DEC, SUN-SAT, any case), and
// day-of-week 7 is Sunday as 0 is. '?' is '*' in the two day fields. When both day fields are
// restricted (neither starts with '*' or '?'), a day matches when either does, as in cron(8).
// @yearly (@annually), @monthly, @weekly, @daily (@midnight) and @hourly stand for their usual
// expressions.
//
// Times are the zone's wall-clock times. When the clock springs forward over a firing's time,
// the firing comes at the change. When it falls back, a time that comes twice fires once unless
// the hour field is '*' (then the repeated hour fires again, as every other hour does).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace jobrt {

using sys_ms = std::chrono::sys_time<std::chrono::milliseconds>;

class schedule_timing {
 public:
  /// Every minute, on the minute.
  schedule_timing() = default;
  /// Throws std::invalid_argument naming what is wrong: a field and its value, an unknown time
  /// zone, or an expression that never fires.
  static schedule_timing cron(std::string_view expression, std::string_view time_zone = "UTC");
  /// At anchor + k * interval for every integer k. Throws std::invalid_argument when interval is
  /// not positive.
  static schedule_timing every(std::chrono::milliseconds interval, sys_ms anchor = {});

  /// The first firing strictly after t.
  [[nodiscard]] sys_ms next_after(sys_ms t) const;

  bool is_cron() const noexcept { return interval_.count() == 0; }
  const std::string& expression() const noexcept { return expression_; }  ///< cron only
  const std::string& time_zone() const noexcept { return zone_; }         ///< cron only
  std::chrono::milliseconds interval() const noexcept { return interval_; }
  sys_ms anchor() const noexcept { return anchor_; }
  /// "cron '0 3 * * *' in Europe/Paris" or "every 100ms".
  std::string describe() const;

  /// The cron fields as bit sets: bit v is set when value v matches.
  struct fields {
    std::uint64_t seconds = 0;        // 0-59
    std::uint64_t minutes = 0;        // 0-59
    std::uint32_t hours = 0;          // 0-23
    std::uint32_t days = 0;           // 1-31
    std::uint16_t months = 0;         // 1-12
    std::uint8_t weekdays = 0;        // 0-6, Sunday 0
    bool day_restricted = false;      // the day-of-month field does not start with '*' or '?'
    bool weekday_restricted = false;  // nor does the day-of-week field
    bool any_hour = false;            // the hour field is '*'
  };
  const fields& cron_fields() const noexcept { return fields_; }

 private:
  fields fields_;
  std::string expression_;
  std::string zone_;
  const void* zone_data_ = nullptr;  // its date::time_zone, found once (the database lives on)
  std::chrono::milliseconds interval_{std::chrono::minutes(1)};  // 0: cron
  sys_ms anchor_{};
};

}  // namespace jobrt
