#include <jobrt/schedule.hpp>

#include <date/date.h>
#include <date/tz.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <optional>
#include <stdexcept>
#include <vector>

namespace jobrt {
namespace {

using namespace std::chrono_literals;
using std::chrono::seconds;
using local_s = date::local_seconds;

struct field_spec {
  const char* name;
  int low;
  int high;
  const std::array<std::string_view, 12>* names;  // names[i] is value name_base + i
  int name_base;
  bool a_day = false;  // takes '?' for '*'
};

constexpr std::array<std::string_view, 12> month_names{"jan", "feb", "mar", "apr", "may", "jun",
                                                       "jul", "aug", "sep", "oct", "nov", "dec"};
constexpr std::array<std::string_view, 12> day_names{"sun", "mon", "tue", "wed", "thu", "fri", "sat"};

constexpr field_spec second_spec{"second", 0, 59, nullptr, 0, false};
constexpr field_spec minute_spec{"minute", 0, 59, nullptr, 0, false};
constexpr field_spec hour_spec{"hour", 0, 23, nullptr, 0, false};
constexpr field_spec day_spec{"day-of-month", 1, 31, nullptr, 0, true};
constexpr field_spec month_spec{"month", 1, 12, &month_names, 1, false};
constexpr field_spec weekday_spec{"day-of-week", 0, 7, &day_names, 0, true};

[[noreturn]] void bad(std::string_view expression, std::string_view what) {
  throw std::invalid_argument(fmt::format("cron expression '{}': {}", expression, what));
}

std::optional<int> number(std::string_view s) {
  int v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

/// A value of the field: a number or, for months and days, a name.
int value_of(std::string_view s, const field_spec& f, std::string_view expression) {
  std::optional<int> v = number(s);
  if (!v && f.names != nullptr && s.size() == 3) {
    std::string lower(s);
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    for (std::size_t i = 0; i < f.names->size(); ++i)
      if (!(*f.names)[i].empty() && (*f.names)[i] == lower) v = static_cast<int>(i) + f.name_base;
  }
  if (!v) bad(expression, fmt::format("{} '{}' is not a number{}", f.name, s, f.names ? " or a name" : ""));
  if (*v < f.low || *v > f.high)
    bad(expression, fmt::format("{} '{}' is out of range {}-{}", f.name, s, f.low, f.high));
  return *v;
}

/// The field's values as a bit set (bit v for value v).
std::uint64_t parse_field(std::string_view text, const field_spec& f, std::string_view expression) {
  std::uint64_t bits = 0;
  std::size_t start = 0;
  while (true) {
    std::size_t comma = text.find(',', start);
    std::string_view item =
        text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (item.empty()) bad(expression, fmt::format("{} field '{}' has an empty list item", f.name, text));
    std::string_view range = item;
    int step = 1;
    if (auto slash = item.find('/'); slash != std::string_view::npos) {
      range = item.substr(0, slash);
      std::optional<int> s = number(item.substr(slash + 1));
      if (!s || *s < 1 || *s > f.high - f.low + 1)
        bad(expression,
            fmt::format("{} step '{}' is not a number in 1-{}", f.name, item.substr(slash + 1), f.high - f.low + 1));
      step = *s;
    }
    int low = f.low;
    int high = f.high;
    if (range == "*" || range == "?") {
      if (range == "?" && !f.a_day) bad(expression, fmt::format("{} field: '?' is for the day fields only", f.name));
    } else if (auto dash = range.find('-'); dash != std::string_view::npos) {
      low = value_of(range.substr(0, dash), f, expression);
      high = value_of(range.substr(dash + 1), f, expression);
      if (low > high) bad(expression, fmt::format("{} range '{}' runs backwards", f.name, range));
    } else {
      low = value_of(range, f, expression);
      if (step > 1)
        high = f.high;  // 'a/s': from a to the end, every s
      else
        high = low;
    }
    for (int v = low; v <= high; v += step) bits |= std::uint64_t{1} << v;
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return bits;
}

bool restricted(std::string_view field) { return !field.empty() && field[0] != '*' && field[0] != '?'; }

std::string_view macro(std::string_view e) {
  if (e == "@yearly" || e == "@annually") return "0 0 1 1 *";
  if (e == "@monthly") return "0 0 1 * *";
  if (e == "@weekly") return "0 0 * * 0";
  if (e == "@daily" || e == "@midnight") return "0 0 * * *";
  if (e == "@hourly") return "0 * * * *";
  return {};
}

bool has(std::uint64_t bits, unsigned v) { return ((bits >> v) & 1U) != 0; }

bool day_matches(const schedule_timing::fields& f, date::year_month_day ymd) {
  bool dom = has(f.days, static_cast<unsigned>(ymd.day()));
  bool dow = has(f.weekdays, date::weekday{date::local_days{ymd}}.c_encoding());
  if (f.day_restricted && f.weekday_restricted) return dom || dow;
  return dom && dow;
}

/// The first wall-clock time at or after `from` that the fields match, looking no further than
/// ten years ahead (far enough for 29 February).
std::optional<local_s> next_local(const schedule_timing::fields& f, local_s from) {
  auto limit = date::year_month_day{date::floor<date::days>(from)}.year() + date::years{10};
  local_s t = from;
  while (true) {
    auto day = date::floor<date::days>(t);
    date::year_month_day ymd{day};
    if (ymd.year() > limit) return std::nullopt;
    if (!has(f.months, static_cast<unsigned>(ymd.month()))) {
      t = local_s{date::local_days{(ymd.year() / ymd.month() + date::months{1}) / 1}};
      continue;
    }
    if (!day_matches(f, ymd)) {
      t = local_s{day + date::days{1}};
      continue;
    }
    date::hh_mm_ss<seconds> tod{t - local_s{day}};
    if (!has(f.hours, static_cast<unsigned>(tod.hours().count()))) {
      t = date::floor<std::chrono::hours>(t) + std::chrono::hours{1};
      continue;
    }
    if (!has(f.minutes, static_cast<unsigned>(tod.minutes().count()))) {
      t = date::floor<std::chrono::minutes>(t) + std::chrono::minutes{1};
      continue;
    }
    if (!has(f.seconds, static_cast<unsigned>(tod.seconds().count()))) {
      t += 1s;
      continue;
    }
    return t;
  }
}

const date::time_zone* zone_named(std::string_view name) {
  try {
    return date::locate_zone(name);
  } catch (const std::runtime_error&) {
    throw std::invalid_argument(fmt::format("unknown time zone '{}'", name));
  }
}

}  // namespace

schedule_timing schedule_timing::cron(std::string_view expression, std::string_view time_zone) {
  schedule_timing s;
  s.interval_ = std::chrono::milliseconds(0);
  s.expression_ = std::string(expression);
  s.zone_ = std::string(time_zone);
  std::string_view text = expression;
  if (!text.empty() && text[0] == '@') {
    text = macro(text);
    if (text.empty()) bad(expression, "unknown macro (@yearly, @monthly, @weekly, @daily, @hourly)");
  }
  std::vector<std::string_view> parts;
  for (std::size_t i = 0; i < text.size();) {
    if (std::isspace(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    parts.push_back(text.substr(i, j - i));
    i = j;
  }
  if (parts.size() == 5)
    parts.insert(parts.begin(), "0");
  else if (parts.size() != 6)
    bad(expression, fmt::format("has {} fields; cron takes 5 (minute hour day-of-month month day-of-week) or 6 "
                                "(second first)",
                                parts.size()));
  fields& f = s.fields_;
  f.seconds = parse_field(parts[0], second_spec, expression);
  f.minutes = parse_field(parts[1], minute_spec, expression);
  f.hours = static_cast<std::uint32_t>(parse_field(parts[2], hour_spec, expression));
  f.days = static_cast<std::uint32_t>(parse_field(parts[3], day_spec, expression));
  f.months = static_cast<std::uint16_t>(parse_field(parts[4], month_spec, expression));
  std::uint64_t weekdays = parse_field(parts[5], weekday_spec, expression);
  f.weekdays = static_cast<std::uint8_t>((weekdays | (weekdays >> 7)) & 0x7F);  // 7 is Sunday
  f.day_restricted = restricted(parts[3]);
  f.weekday_restricted = restricted(parts[5]);
  f.any_hour = parts[2] == "*";
  s.zone_data_ = zone_named(time_zone);
  // A day that never comes (30 February): refused now rather than found missing at run time.
  if (!next_local(f, local_s{date::local_days{date::year{2000} / 1 / 1}})) bad(expression, "never fires (no such day)");
  return s;
}

schedule_timing schedule_timing::every(std::chrono::milliseconds interval, sys_ms anchor) {
  if (interval <= 0ms) throw std::invalid_argument(fmt::format("interval {}ms is not positive", interval.count()));
  schedule_timing s;
  s.interval_ = interval;
  s.anchor_ = anchor;
  return s;
}

sys_ms schedule_timing::next_after(sys_ms t) const {
  if (!is_cron()) {
    if (t < anchor_) return anchor_;
    return anchor_ + ((t - anchor_) / interval_ + 1) * interval_;
  }
  const auto* zone = static_cast<const date::time_zone*>(zone_data_);
  // The zone's clock runs in segments of one offset each. Within a segment, wall-clock time and
  // real time move together; between two, the clock jumps forward or back.
  date::sys_seconds at = date::floor<seconds>(t) + 1s;
  std::optional<local_s> seen_up_to;  // after a fall back: the wall-clock time already passed
  for (int segment = 0; segment < 64; ++segment) {
    date::sys_info info = zone->get_info(at);
    local_s from{(at + info.offset).time_since_epoch()};
    if (seen_up_to && *seen_up_to > from) from = *seen_up_to;
    std::optional<local_s> match = next_local(fields_, from);
    if (!match) break;
    date::sys_seconds fires{(*match - info.offset).time_since_epoch()};
    if (fires < info.end) return fires;
    date::sys_info next = zone->get_info(info.end);
    local_s end_before{(info.end + info.offset).time_since_epoch()};
    local_s end_after{(info.end + next.offset).time_since_epoch()};
    // Sprung forward over the match: it fires at the change.
    if (*match < end_after) return info.end;
    // Falling back repeats [end_after, end_before); a restricted hour does not fire twice.
    if (end_after < end_before && !fields_.any_hour) seen_up_to = end_before;
    at = info.end;
  }
  throw std::logic_error(fmt::format("{}: no firing found after {}", describe(), date::format("%F %T", t)));
}

std::string schedule_timing::describe() const {
  if (is_cron()) return fmt::format("cron '{}' in {}", expression_, zone_);
  // In the largest unit that divides it: "every 100ms", "every 10s", "every 2h".
  constexpr std::array<std::pair<std::int64_t, std::string_view>, 4> units{
      {{86'400'000, "d"}, {3'600'000, "h"}, {60'000, "m"}, {1000, "s"}}};
  for (auto [ms, unit] : units)
    if (interval_.count() % ms == 0) return fmt::format("every {}{}", interval_.count() / ms, unit);
  return fmt::format("every {}ms", interval_.count());
}

}  // namespace jobrt
