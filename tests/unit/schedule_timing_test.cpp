#include "schedule/due_firings.hpp"

#include <jobrt/schedule.hpp>
#include <jobrt/scheduler.hpp>

#include <date/date.h>

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

using namespace std::chrono_literals;
using jobrt::schedule_timing;
using jobrt::sys_ms;

namespace {

sys_ms utc(int y, unsigned mo, unsigned d, int h = 0, int mi = 0, int s = 0, int ms = 0) {
  return sys_ms{date::sys_days{date::year{y} / date::month{mo} / date::day{d}}.time_since_epoch() +
                std::chrono::hours{h} + std::chrono::minutes{mi} + std::chrono::seconds{s} +
                std::chrono::milliseconds{ms}};
}

std::string text(sys_ms t) { return date::format("%F %T", t); }

sys_ms next(std::string_view expression, sys_ms after, std::string_view zone = "UTC") {
  return schedule_timing::cron(expression, zone).next_after(after);
}

std::string refusal(std::string_view expression, std::string_view zone = "UTC") {
  try {
    (void)schedule_timing::cron(expression, zone);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

// 2026-11-28 is a Saturday.
TEST_CASE("cron: the next firing is strictly after the given time") {
  CHECK(text(next("0 3 * * *", utc(2026, 11, 28, 12))) == "2026-11-29 03:00:00.000");
  CHECK(text(next("0 3 * * *", utc(2026, 11, 29, 2, 59, 59, 999))) == "2026-11-29 03:00:00.000");
  CHECK(text(next("0 3 * * *", utc(2026, 11, 29, 3))) == "2026-11-30 03:00:00.000");
  CHECK(text(next("* * * * *", utc(2026, 11, 28, 12, 0, 0, 1))) == "2026-11-28 12:01:00.000");
  CHECK(text(next("0 0 1 1 *", utc(2026, 12, 31, 23, 59, 59))) == "2027-01-01 00:00:00.000");
}

TEST_CASE("cron: six fields put seconds first") {
  CHECK(text(next("*/10 * * * * *", utc(2026, 11, 28, 12, 0, 5, 500))) == "2026-11-28 12:00:10.000");
  CHECK(text(next("15,45 30 * * * *", utc(2026, 11, 28, 12, 30, 15))) == "2026-11-28 12:30:45.000");
  CHECK(text(next("15,45 30 * * * *", utc(2026, 11, 28, 12, 30, 45))) == "2026-11-28 13:30:15.000");
}

TEST_CASE("cron: ranges, steps, lists and names") {
  schedule_timing office = schedule_timing::cron("0 9-17/4 * * MON-FRI");
  sys_ms t = utc(2026, 11, 28, 12);
  t = office.next_after(t);
  CHECK(text(t) == "2026-11-30 09:00:00.000");
  t = office.next_after(t);
  CHECK(text(t) == "2026-11-30 13:00:00.000");
  t = office.next_after(t);
  CHECK(text(t) == "2026-11-30 17:00:00.000");
  CHECK(text(office.next_after(t)) == "2026-12-01 09:00:00.000");

  CHECK(text(next("0 0 1 jan *", utc(2026, 11, 28))) == "2027-01-01 00:00:00.000");
  CHECK(text(next("0 0 1 Jun-Aug *", utc(2026, 11, 28))) == "2027-06-01 00:00:00.000");
  CHECK(text(next("5/20 * * * *", utc(2026, 11, 28, 12, 26))) == "2026-11-28 12:45:00.000");
  CHECK(text(next("0 0 * * 7", utc(2026, 11, 28, 12))) == "2026-11-29 00:00:00.000");  // 7 is Sunday
  CHECK(text(next("0 0 * * sun", utc(2026, 11, 28, 12))) == "2026-11-29 00:00:00.000");
  CHECK(text(next("0 0 ? * 3", utc(2026, 11, 28, 12))) == "2026-12-02 00:00:00.000");
}

TEST_CASE("cron: both day fields restricted match either, one restricted matches it alone") {
  // The 13th, or any Friday: Friday 4 December comes first.
  CHECK(text(next("0 0 13 * FRI", utc(2026, 11, 28))) == "2026-12-04 00:00:00.000");
  // Fridays in December only.
  CHECK(text(next("0 0 * 12 FRI", utc(2026, 11, 28))) == "2026-12-04 00:00:00.000");
  CHECK(text(next("0 0 * 12 FRI", utc(2026, 12, 4))) == "2026-12-11 00:00:00.000");
  // A day-of-month step starts with '*': it is not "restricted", so Fridays must also be the 1st.
  CHECK(text(next("0 0 */31 * FRI", utc(2026, 11, 28))) == "2027-01-01 00:00:00.000");
}

TEST_CASE("cron: macros and 29 February") {
  CHECK(text(next("@hourly", utc(2026, 11, 28, 12, 30))) == "2026-11-28 13:00:00.000");
  CHECK(text(next("@daily", utc(2026, 11, 28, 12, 30))) == "2026-11-29 00:00:00.000");
  CHECK(text(next("@weekly", utc(2026, 11, 28, 12, 30))) == "2026-11-29 00:00:00.000");
  CHECK(text(next("@monthly", utc(2026, 11, 28, 12, 30))) == "2026-12-01 00:00:00.000");
  CHECK(text(next("@yearly", utc(2026, 11, 28, 12, 30))) == "2027-01-01 00:00:00.000");
  CHECK(text(next("0 0 29 2 *", utc(2026, 11, 28))) == "2028-02-29 00:00:00.000");
  CHECK(text(next("0 0 29 2 *", utc(2096, 3, 1))) == "2104-02-29 00:00:00.000");  // 2100 is not a leap year
}

TEST_CASE("cron: times are the zone's wall-clock times") {
  // Paris is UTC+1 in November, UTC+2 in July.
  CHECK(text(next("0 3 * * *", utc(2026, 11, 28, 12), "Europe/Paris")) == "2026-11-29 02:00:00.000");
  CHECK(text(next("0 3 * * *", utc(2027, 7, 1, 12), "Europe/Paris")) == "2027-07-02 01:00:00.000");
  CHECK(text(next("0 9 * * *", utc(2026, 11, 28, 12), "America/New_York")) == "2026-11-28 14:00:00.000");
  CHECK(text(next("30 5 * * *", utc(2026, 11, 28, 12), "Asia/Kolkata")) == "2026-11-29 00:00:00.000");
}

TEST_CASE("cron: a firing the clock springs forward over comes at the change") {
  // Paris, 28 March 2027: 02:00 CET becomes 03:00 CEST, at 01:00 UTC.
  schedule_timing daily = schedule_timing::cron("30 2 * * *", "Europe/Paris");
  sys_ms t = daily.next_after(utc(2027, 3, 27, 12));
  CHECK(text(t) == "2027-03-28 01:00:00.000");
  CHECK(text(daily.next_after(t)) == "2027-03-29 00:30:00.000");
  // Every minute runs straight through: 01:59 CET, then 03:00 CEST.
  CHECK(text(next("* * * * *", utc(2027, 3, 28, 0, 59), "Europe/Paris")) == "2027-03-28 01:00:00.000");
  CHECK(text(next("* * * * *", utc(2027, 3, 28, 1), "Europe/Paris")) == "2027-03-28 01:01:00.000");
}

TEST_CASE("cron: a time the clock falls back over fires once, unless the hour is '*'") {
  // Paris, 25 October 2026: 03:00 CEST becomes 02:00 CET, at 01:00 UTC; 02:30 comes twice.
  schedule_timing daily = schedule_timing::cron("30 2 * * *", "Europe/Paris");
  sys_ms t = daily.next_after(utc(2026, 10, 24, 12));
  CHECK(text(t) == "2026-10-25 00:30:00.000");
  CHECK(text(daily.next_after(t)) == "2026-10-26 01:30:00.000");

  schedule_timing half_hourly = schedule_timing::cron("*/30 * * * *", "Europe/Paris");
  t = half_hourly.next_after(utc(2026, 10, 25, 0, 15));
  CHECK(text(t) == "2026-10-25 00:30:00.000");  // 02:30 CEST
  t = half_hourly.next_after(t);
  CHECK(text(t) == "2026-10-25 01:00:00.000");  // 02:00 CET
  t = half_hourly.next_after(t);
  CHECK(text(t) == "2026-10-25 01:30:00.000");  // 02:30 CET
  CHECK(text(half_hourly.next_after(t)) == "2026-10-25 02:00:00.000");
}

TEST_CASE("scheduler: a step taken late in a fall-back's repeated hour does not fire the repeated time again") {
  // Paris, 25 October 2026: 02:30 CEST (00:30 UTC) fired; the step comes at 02:10 CET (01:10
  // UTC), in the hour's second pass. Counted from then, the next 02:30 would be the repeated one.
  jobrt::schedule_spec s;
  s.name = "nightly";
  s.timing = schedule_timing::cron("30 2 * * *", "Europe/Paris");
  s.catch_up = 3;
  auto ms = [](sys_ms t) { return t.time_since_epoch().count(); };
  auto first = utc(2026, 10, 25, 0, 30), late = utc(2026, 10, 25, 1, 10);
  CHECK(text(s.timing.next_after(late)) == "2026-10-25 01:30:00.000");  // (what "from now" would give)
  auto d = jobrt::detail::due_firings(s, ms(first), ms(late));
  REQUIRE(d.firings.size() == 1);
  CHECK(d.firings[0] == ms(first));
  CHECK(text(sys_ms(std::chrono::milliseconds(d.next))) == "2026-10-26 01:30:00.000");
  // And one taken after the repeated hour too: the one firing, the next the day after.
  d = jobrt::detail::due_firings(s, ms(first), ms(utc(2026, 10, 25, 1, 45)));
  REQUIRE(d.firings.size() == 1);
  CHECK(text(sys_ms(std::chrono::milliseconds(d.next))) == "2026-10-26 01:30:00.000");
}

TEST_CASE("scheduler: missed firings are the latest due and catch_up before it, and a long walk is bounded") {
  jobrt::schedule_spec s;
  s.name = "minutely";
  s.timing = schedule_timing::cron("* * * * *", "UTC");
  s.catch_up = 2;
  auto ms = [](sys_ms t) { return t.time_since_epoch().count(); };
  auto d = jobrt::detail::due_firings(s, ms(utc(2026, 11, 28, 10, 0)), ms(utc(2026, 11, 28, 10, 7, 30)));
  REQUIRE(d.firings.size() == 3);
  CHECK(text(sys_ms(std::chrono::milliseconds(d.firings[0]))) == "2026-11-28 10:05:00.000");
  CHECK(text(sys_ms(std::chrono::milliseconds(d.firings[2]))) == "2026-11-28 10:07:00.000");
  CHECK(text(sys_ms(std::chrono::milliseconds(d.next))) == "2026-11-28 10:08:00.000");
  // A year of missed minutes (over 500,000): the walk starts again a day back, the latest kept.
  d = jobrt::detail::due_firings(s, ms(utc(2025, 11, 28, 10, 0)), ms(utc(2026, 11, 28, 10, 7, 30)));
  REQUIRE(d.firings.size() == 3);
  CHECK(text(sys_ms(std::chrono::milliseconds(d.firings[2]))) == "2026-11-28 10:07:00.000");
  CHECK(text(sys_ms(std::chrono::milliseconds(d.next))) == "2026-11-28 10:08:00.000");
}

TEST_CASE("cron: bad expressions and zones are refused with what is wrong") {
  CHECK(refusal("0 3 * *") ==
        "cron expression '0 3 * *': has 4 fields; cron takes 5 (minute hour day-of-month "
        "month day-of-week) or 6 (second first)");
  CHECK(refusal("60 * * * *") == "cron expression '60 * * * *': minute '60' is out of range 0-59");
  CHECK(refusal("0 24 * * *") == "cron expression '0 24 * * *': hour '24' is out of range 0-23");
  CHECK(refusal("0 0 0 * *") == "cron expression '0 0 0 * *': day-of-month '0' is out of range 1-31");
  CHECK(refusal("0 0 * 13 *") == "cron expression '0 0 * 13 *': month '13' is out of range 1-12");
  CHECK(refusal("0 0 * * 8") == "cron expression '0 0 * * 8': day-of-week '8' is out of range 0-7");
  CHECK(refusal("*/0 * * * *") == "cron expression '*/0 * * * *': minute step '0' is not a number in 1-60");
  CHECK(refusal("0 17-9 * * *") == "cron expression '0 17-9 * * *': hour range '17-9' runs backwards");
  CHECK(refusal("0 0 * * FUN") == "cron expression '0 0 * * FUN': day-of-week 'FUN' is not a number or a name");
  CHECK(refusal("x * * * *") == "cron expression 'x * * * *': minute 'x' is not a number");
  CHECK(refusal("1,,2 * * * *") == "cron expression '1,,2 * * * *': minute field '1,,2' has an empty list item");
  CHECK(refusal("? * * * *") == "cron expression '? * * * *': minute field: '?' is for the day fields only");
  CHECK(refusal("0 0 30 2 *") == "cron expression '0 0 30 2 *': never fires (no such day)");
  CHECK(refusal("@often") == "cron expression '@often': unknown macro (@yearly, @monthly, @weekly, @daily, @hourly)");
  CHECK(refusal("0 3 * * *", "Mars/Olympus") == "unknown time zone 'Mars/Olympus'");
  CHECK(refusal("0 3 * * *", "") == "unknown time zone ''");
}

TEST_CASE("every: fixed intervals from an anchor") {
  schedule_timing every = schedule_timing::every(100ms, sys_ms{1000ms});
  CHECK(every.next_after(sys_ms{999ms}) == sys_ms{1000ms});
  CHECK(every.next_after(sys_ms{1000ms}) == sys_ms{1100ms});
  CHECK(every.next_after(sys_ms{1050ms}) == sys_ms{1100ms});
  CHECK(every.next_after(sys_ms{0ms}) == sys_ms{1000ms});
  CHECK(every.describe() == "every 100ms");
  CHECK(schedule_timing::every(10s).describe() == "every 10s");
  CHECK(schedule_timing::every(90s).describe() == "every 90s");
  CHECK(schedule_timing::every(2h).describe() == "every 2h");
  CHECK(schedule_timing::every(1500ms).describe() == "every 1500ms");
  CHECK(!every.is_cron());
  CHECK(schedule_timing::cron("0 3 * * *", "Europe/Paris").describe() == "cron '0 3 * * *' in Europe/Paris");
  CHECK_THROWS_WITH_AS(schedule_timing::every(0ms), "interval 0ms is not positive", std::invalid_argument);
  CHECK_THROWS_WITH_AS(schedule_timing::every(-5ms), "interval -5ms is not positive", std::invalid_argument);
}

TEST_CASE("scheduler: an unreadable stored form is quoted as one line, cut short between characters") {
  auto why = [](const std::string& stored) {
    try {
      jobrt::schedule_from_stored("s", stored);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("read");
  };
  CHECK(why("{x\n\x7f}") == "schedule 's': its stored form is not a JSON object: {x  }");
  // "\xc3\xa9" (an e with an acute accent) would be split by a cut at 80 bytes: cut before it.
  CHECK(why(std::string(79, 'x') + "\xc3\xa9yz") ==
        "schedule 's': its stored form is not a JSON object: " + std::string(79, 'x') + "...");
  CHECK(why(std::string(80, 'x')) == "schedule 's': its stored form is not a JSON object: " + std::string(80, 'x'));
  CHECK(why(R"({"every_ms":1000,"anchor_ms":0,"catch_up":0,"job":{"type":"t","colour":"red"}})")
            .starts_with(R"(schedule 's': its job: unknown field "colour": {"every_ms")"));
}
