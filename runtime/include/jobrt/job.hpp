// Jobs as producers describe them and as handlers see them.
#pragma once

#include <boost/json/value.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace jobrt {

/// What a failed job's group does (a grouped job's failure; ungrouped jobs retry or go to the
/// dead letters).
enum class failure_policy {
  hold,  ///< the group waits for the failed job's backoff and runs it again before anything
         ///< enqueued after it; out of attempts, it is dead-lettered and the group goes on
  skip,  ///< the failed job goes to the dead letters at once and the group goes on
  halt,  ///< as hold, but out of attempts the group stops (the job stays at its head) until an
         ///< operator resumes it
};

/// Parses "hold", "skip" or "halt"; throws std::invalid_argument naming the bad value.
failure_policy parse_failure_policy(std::string_view text);
std::string_view to_string(failure_policy p) noexcept;

/// Exponential backoff with jitter and a cap, between a failed run and the next.
struct backoff {
  std::chrono::milliseconds initial{1000};  ///< before the second run
  double factor = 2.0;                      ///< growth per further attempt
  std::chrono::milliseconds max{std::chrono::minutes(10)};
  double jitter = 0.2;  ///< each delay is moved by up to ±jitter of itself, at random

  /// The delay after run number `attempt` (1 for the first) failed; `random` in [0, 1).
  std::chrono::milliseconds delay_after(int attempt, double random) const noexcept;
};

/// A group's rate limit (job_spec::group_rate): at most `max` of its jobs start in any span of
/// `window` (by the backend's clock).
struct rate_limit {
  std::size_t max = 1;
  std::chrono::milliseconds window{1000};
  friend bool operator==(const rate_limit&, const rate_limit&) = default;
};
/// The largest rate_limit::max: the backend keeps the start times of a limited group's last
/// `max` starts while its window lasts (about 16 bytes each, in Redis).
inline constexpr std::size_t max_rate_starts = 10'000;
/// The longest rate_limit::window, and the longest job_context::throttle_group.
inline constexpr std::chrono::milliseconds max_rate_window = std::chrono::hours(24);
/// Throws std::invalid_argument, naming `what` and the value, unless max is from 1 to
/// max_rate_starts and the window from 1 ms to max_rate_window.
void check_rate_limit(const rate_limit& limit, std::string_view what);

/// The longest time limit a job may have (job_spec::timeout).
inline constexpr std::chrono::milliseconds max_job_timeout = std::chrono::hours(24 * 365);

/// The longest a completed job's status may be kept (job_spec::keep).
inline constexpr std::chrono::milliseconds max_job_keep = std::chrono::hours(24 * 365);
/// The largest job_spec::max_group_size.
inline constexpr std::size_t max_group_size_limit = 1'000'000'000;
/// The largest job_spec::group_concurrency.
inline constexpr std::size_t max_group_concurrency = 10'000;
/// Throws std::invalid_argument, naming `what` and the value, unless n is from 1 to
/// max_group_concurrency.
void check_group_concurrency(std::size_t n, std::string_view what);
/// The largest job_spec::group_weight.
inline constexpr std::size_t max_group_weight = 100;
/// Throws std::invalid_argument, naming `what` and the value, unless w is from 1 to
/// max_group_weight.
void check_group_weight(std::size_t w, std::string_view what);

/// The highest job_spec::priority; the lowest is its negation.
inline constexpr int max_priority = 2;

/// What a producer enqueues.
struct job_spec {
  /// The handler's name. Required.
  std::string type;
  /// Any JSON value.
  boost::json::value payload;
  /// Jobs of one group run one at a time, in enqueue order (or up to group_concurrency at once,
  /// started in enqueue order). When absent, the producer's grouping
  /// rules may give the job a group; when they do not, the job takes the ungrouped fast path.
  std::optional<std::string> group;
  /// Optional. Enqueueing the same id again does nothing while the job is pending or running,
  /// and, for a kept job (keep), until its keep after it ended runs out (not once it is
  /// dead-lettered): an idempotency key, as a bridge's message id is (bridge.hpp).
  /// It must not contain '|' nor be all digits (the ids the queue assigns): "order-17", not "17".
  std::string id;
  /// How many times it may start (a lease that expired counts) before it is dead-lettered.
  int max_attempts = 3;
  /// The handler's time limit; 0: none. At most max_job_timeout.
  std::chrono::milliseconds timeout{0};
  /// Run no earlier than this long from now (0: at once)...
  std::chrono::milliseconds delay{0};
  /// ...or than this time (by the backend's clock). A grouped job joins its group when it is due.
  std::optional<std::chrono::system_clock::time_point> run_at;
  /// Overrides the worker's backoff for this job's job type.
  std::optional<jobrt::backoff> retry_backoff;
  /// Overrides the grouping rule's and the worker's failure policy.
  std::optional<failure_policy> on_failure;
  /// Keep the job's status, for a look-up by id (find_job, `jobrt job`, the dashboard), while it
  /// waits or runs and this long after it completes; 0: not kept. When absent,
  /// producer_options::keep. A job not kept costs the queue no index entry. At most max_job_keep.
  std::optional<std::chrono::milliseconds> keep;
  /// For a grouped job: refuse it (and its batch) when its group would then hold more than
  /// this many jobs, pending or running (errc::group_full; see encoded_job::max_group_size). At
  /// least 1. When absent, the grouping rule's, else producer_options::max_group_size.
  std::optional<std::size_t> max_group_size;
  /// For a grouped job: while it is its group's next job, the group starts at most max jobs in
  /// any window (rate_limit). A group at its limit waits in the delayed set, as a retry's backoff
  /// does, while other groups go on. When absent, the grouping rule's, else
  /// producer_options::group_rate. Ignored for an ungrouped job.
  std::optional<rate_limit> group_rate;
  /// For a grouped job: while it is its group's next job, up to this many of the group's jobs
  /// may run at once (1, the default: one at a time). They start in enqueue order; a job that
  /// goes back (a retry, a lost lease) starts again before any job that has not started yet.
  /// From 1 to max_group_concurrency. When absent, the grouping rule's, else
  /// producer_options::group_concurrency. Ignored for an ungrouped job.
  std::optional<std::size_t> group_concurrency;
  /// For a grouped job: while it is its group's next job, the group's share of the workers when
  /// more groups are ready than slots are free: each turn the group gets, it runs up to this
  /// many times as many of its jobs as an unweighted group (1, the default), so over time its
  /// starts are in proportion to its weight. From 1 to max_group_weight. When absent, the
  /// grouping rule's, else producer_options::group_weight. Ignored for an ungrouped job.
  std::optional<std::size_t> group_weight;
  /// Workers take jobs of a higher priority first, from -max_priority to max_priority (0, the
  /// default); jobs of one priority start in enqueue order. A job that goes back (a retry, a lost
  /// lease) keeps its priority. A grouped job's jobs keep their enqueue order: its priority
  /// orders its group among the others while it is the group's next job (its group waits at
  /// the priority of the job next when it became ready).
  int priority = 0;
};

/// A claimed job, as its handler sees it.
struct job {
  std::string id;
  std::string type;
  std::string group;  ///< empty: ungrouped
  boost::json::value payload;
  int attempt = 1;  ///< 1 for the first run
  int max_attempts = 1;
  std::chrono::milliseconds timeout{0};
  std::int64_t enqueued_at_ms = 0;  ///< milliseconds since the epoch
  bool unique_id = false;           ///< the producer gave the id
  std::optional<jobrt::backoff> retry_backoff;
  std::optional<failure_policy> on_failure;
  /// How long its status is kept after it completes (job_spec::keep); 0: it is not kept.
  std::chrono::milliseconds keep{0};
  /// Its group's rate limit (job_spec::group_rate), when it has one.
  std::optional<rate_limit> group_rate;
  /// How many of its group's jobs may run at once (job_spec::group_concurrency); 1: one at a time.
  std::size_t group_concurrency = 1;
  /// Its group's weight (job_spec::group_weight); 1: unweighted.
  std::size_t group_weight = 1;
  /// Its priority (job_spec::priority); 0: the default.
  int priority = 0;
};

/// Decodes a job as it is stored, "<attempts before>|<id>|<body>" (dead_letter::record), in the
/// given group ("" for none). Throws std::runtime_error naming the part that is wrong.
job decode_job(std::string_view record, std::string_view group);

}  // namespace jobrt
