// What the operators' views of backend.hpp (workers, history, groups, dead letters) share
// between the backends: how a worker's report and a history point are written as JSON, which
// dead letters a filter passes, and the cursor of find_dead.
#pragma once

#include <jobrt/backend.hpp>
#include <jobrt/job.hpp>

#include <boost/json/object.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace jobrt::detail {

/// A report as JSON, but for at_ms (the backend's to set).
boost::json::object report_object(const worker_report& r);
std::string report_json(const worker_report& r);
/// A report read back; fields that are missing or of the wrong kind stay at their defaults.
worker_report parse_report(std::string_view json);

/// The counters and gauges of `c` as a JSON object, by the names `jobrt stats --json` uses.
boost::json::object counts_object(const queue_counts& c);
std::string counts_json(const queue_counts& c);
queue_counts parse_counts(std::string_view json);

/// The type of a dead letter's job, as its record says ("" when it does not).
std::string type_of_record(std::string_view record);
bool passes(const dead_filter& f, const dead_letter& d);

/// Where find_dead goes on: after the letter `last_id` of time `at_ms` while that letter is still
/// there (newest first, and by id backwards within a millisecond); else past the letters newer
/// than `at_ms` and `skip` of those at it (as many as there still are).
struct dead_cursor {
  std::int64_t at_ms = 0;
  std::int64_t skip = 0;
  std::string last_id;
};
/// '<at>:<skip>:<last id>'.
std::string to_string(const dead_cursor& c);
/// Throws std::invalid_argument, naming the text, when it is not a cursor find_dead made.
std::optional<dead_cursor> parse_dead_cursor(std::string_view text);
/// The most dead letters one find_dead call looks at.
inline constexpr std::size_t dead_scan_bound = 2000;

/// The memory backend's group cursor: 'g:' and the last group listed (nullopt for "").
/// Throws std::invalid_argument, naming the text, when it is not one.
std::optional<std::string> parse_group_cursor(std::string_view text);

/// As the dashboard's API and `jobrt job --json` show them (docs/DASHBOARD.md): a job's record
/// decoded (or as stored, with why it does not decode), a dead letter, a group, and a job a
/// worker reported running.
boost::json::object record_object(const job_record& r, std::string_view group);
boost::json::object dead_object(const dead_letter& d);
boost::json::object group_object(const group_status& s);
boost::json::object running_object(const worker_report& r, const worker_report::job& j);

/// The keep of a job's body, when the body starts '{"keep":<digits>' (enqueue.lua), else nullopt.
std::optional<std::int64_t> keep_in_body(std::string_view body) noexcept;
/// The id and keep of a record whose body has a keep (finish.lua's match), else nullopt.
struct kept_record {
  std::string_view id;
  std::int64_t keep_ms = 0;
};
std::optional<kept_record> kept_in(std::string_view record) noexcept;
/// The group rate limit of a job's body, when it starts '{"rate":[<max>,<window ms>]' or
/// '{"keep":<digits>,"rate":[...]' with a max of at least 1 (claim.lua's match), else nullopt.
std::optional<rate_limit> rate_in_body(std::string_view body) noexcept;
/// As rate_in_body, for a record ('<attempts>|<id>|<body>').
std::optional<rate_limit> rate_in(std::string_view record) noexcept;
/// The group concurrency of a job's body: N when it starts '{' then, each optional,
/// '"keep":<digits>,' and '"rate":[<digits>,<digits>],', then '"conc":N,' with N at least 1
/// (claim.lua's conc_of); else 1.
std::size_t conc_in_body(std::string_view body) noexcept;
/// As conc_in_body, for a record ('<attempts>|<id>|<body>').
std::size_t conc_in(std::string_view record) noexcept;
/// The group weight of a job's body: W when, after what conc_in_body reads there and, when
/// present, '"conc":<digits>,', the body goes on '"weight":W,' with W at least 1 (claim.lua's
/// weight_of); else 1.
std::size_t weight_in_body(std::string_view body) noexcept;
/// As weight_in_body, for a record ('<attempts>|<id>|<body>').
std::size_t weight_in(std::string_view record) noexcept;
/// A job's priority (job_spec::priority): P when, after what weight_in_body reads there and,
/// when present, '"weight":<digits>,', the body goes on '"prio":P,' with P one of 2, 1, -1, -2
/// (enqueue.lua's level_of); else 0.
int prio_in_body(std::string_view body) noexcept;
/// As prio_in_body, for a record ('<attempts>|<id>|<body>').
int prio_in(std::string_view record) noexcept;
/// The priorities' levels other than 0, in the order claims read them around ready (level 0).
inline constexpr std::array<int, 4> priority_levels{2, 1, -1, -2};
/// The list of a level's lanes: '<prefix>ready' for 0, else '<prefix>ready:<level>'.
std::string level_key(std::string_view prefix, int level);
/// The group and the record in the lease lane of a job whose group runs several at once,
/// 'c:<length of group>:<group><record>' (claim.lua's conc_lane); both empty when malformed.
std::pair<std::string_view, std::string_view> conc_parts(std::string_view lane) noexcept;
/// A kept job's entry in the queue's index: '<state><ms>:<length of group>:<group><record>',
/// state 'p' (pending), 'd' (due at ms), 'c' (completed at ms: then, when its handler gave a
/// result, '<length of result>:<result>' before the record), 'n' (cancelled at ms, not dropped
/// yet: cancel.lua) or 'k' (cancelled, dropped or its run ended at ms).
std::string kept_entry(char state, std::int64_t at_ms, std::string_view group, std::string_view record,
                       std::string_view result = {});
/// The entry of job `id` as a lookup at `now_ms` sees it: a delayed job due by then is pending
/// (promoted, or about to be), a completed one whose entry goes at `gone_at_ms` (its score in
/// done) by then is not there. nullopt also when the text is not an entry (written by something
/// else).
std::optional<kept_job> parse_kept_entry(std::string id, std::string_view entry, std::int64_t now_ms,
                                         std::optional<std::int64_t> gone_at_ms);

/// The minute that `ms` falls in (its start), and how long history points are kept.
inline constexpr std::int64_t minute_ms = 60000;
inline constexpr std::int64_t history_keep_ms = 24 * 60 * minute_ms;

}  // namespace jobrt::detail
