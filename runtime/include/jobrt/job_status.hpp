// A job looked up by id, whatever its state: what the dashboard's job page and `jobrt job` show.
#pragma once

#include <jobrt/backend.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/json/object.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace jobrt {

struct job_status {
  enum class state {
    pending,  ///< waiting its turn
    delayed,  ///< due later (at_ms): delayed, or waiting for a retry
    paused,   ///< its group's next, and the group paused
    halted,   ///< its group's next, and the group halted by its failure
    running,  ///< a worker says so (running_on)
    done,     ///< completed at at_ms (a kept job, for its keep)
    dead,     ///< dead-lettered (dead)
    /// cancelled at at_ms (backend::cancel; a kept job, for its keep): it will not start, or,
    /// running then, its handler was cancelled
    cancelled,
  };
  std::string id;
  state status = state::pending;
  std::int64_t at_ms = 0;  ///< delayed: when due; done: when it completed; cancelled: when; else 0
  std::string group;       ///< "" when ungrouped (or not known)
  /// Its record: a kept job's as last stored, or its group's next as it is now.
  std::optional<job_record> record;
  /// running: the worker's report (its id, host, pid) and the job as it reported it.
  std::optional<worker_report> running_on;
  std::optional<worker_report::job> running;
  std::optional<dead_letter> dead;
  std::optional<group_status> group_state;  ///< its group's, when it has one (but done or dead)
  std::string result;                       ///< done: the result its handler gave (JSON), "" none
  /// running, and cancelled: its worker cancels its handler at its next lease renewal (it ends
  /// cancelled, or done if it completes first)
  bool cancelling = false;
};
std::string_view to_string(job_status::state s) noexcept;
/// As the dashboard's API and `jobrt job --json` show it (docs/DASHBOARD.md): "id", "state",
/// "at" (when due, done or cancelled), "job" (its record decoded), "result" (done, when its
/// handler gave one), "running", "cancelling" (when true), "dead", "group".
boost::json::object to_json(const job_status& s);

/// Finds job `id` of `queue`: kept (job_spec::keep: pending, delayed or done), running (as its
/// worker last reported, within a second), dead-lettered (unless a kept job of the id is newer),
/// or, when `group` is given, that group's next job. nullopt when it is none of those: a job enqueued without a keep is
/// not found while it waits behind others, nor once it completed. A few bounded calls (the workers' reports in pages,
/// at most 1,000 workers).
boost::asio::awaitable<std::optional<job_status>> find_job(backend& store, std::string queue, std::string id,
                                                           std::string group = {});

/// Waits for the end of job `id`, enqueued with a keep: its status once it is done (with its
/// result), cancelled (and not running) or dead, or, when `timeout` passes first, as it is then (pending, delayed,
/// running). A job without a keep (or whose keep ran out) is not waited for: find_job's answer at once. Woken by the
/// store at each kept job's end (backend::wait_ended: on Redis a published message, which tells the end of a job up to
/// a size, else one look at the job follows); and, in
/// case a message did not come (a worker of an older release, a user that may not subscribe), a look at least once a
/// minute. With `since`, backend::ended_version(queue) read before the job was enqueued with an id of jobrt's making
/// (and a keep): no end of it came before, and every end of that id after it is this job's, so the first look is
/// skipped (producer::enqueue_and_wait).
boost::asio::awaitable<std::optional<job_status>> wait_job(backend& store, std::string queue, std::string id,
                                                           std::chrono::milliseconds timeout,
                                                           std::optional<std::uint64_t> since = std::nullopt);

}  // namespace jobrt
