// Repeatable jobs: schedules kept in the queue's backend (schedule_book) and fired by the
// schedulers of the queue's workers (scheduler). Each firing is enqueued once, however many
// schedulers run: its job's id is "<schedule>@<firing time in ms>", and the enqueue and the
// schedule's step to its next firing are one atomic call (backend::fire_schedule). A scheduler
// sleeps on a timer until the next firing; a change to the schedules wakes it (no polling).
#pragma once

#include <jobrt/backend.hpp>
#include <jobrt/job.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/schedule.hpp>

#include <boost/asio/awaitable.hpp>

#include <cstddef>
#include <optional>
#include <string>

namespace jobrt {

/// The most missed firings a schedule enqueues at once (schedule_spec::catch_up).
inline constexpr std::size_t max_catch_up = 1000;

/// A repeatable job: when it fires, and the job each firing enqueues.
struct schedule_spec {
  /// Unique in the queue; its firings' ids are "<name>@<ms>". 1 to 200 bytes, no '|', no white
  /// space at its ends.
  std::string name;
  schedule_timing timing;
  /// The job each firing enqueues, as job_spec_from_json reads it. Its id, delay and run_at are
  /// not used (each firing has its own id, and is due at once); a retry_backoff is refused.
  job_spec job;
  /// When a scheduler finds several firings due at once (no worker ran at their times), the
  /// latest is enqueued, and up to this many before it (the newest of them), oldest first. 0:
  /// the missed ones are skipped. At most max_catch_up.
  std::size_t catch_up = 0;
};

/// A schedule as it is stored.
struct schedule_info {
  schedule_spec spec;
  sys_ms next;  ///< its next firing
  /// Empty, or why its stored form cannot be read (then spec holds only its name): written by
  /// another version, or by hand. Workers do not fire it until it is put right.
  std::string error;
};

/// The schedule's stored form (backend::stored_schedule's spec), and back. from_stored throws
/// std::invalid_argument when the text is not one to_stored wrote.
std::string to_stored(const schedule_spec& s);
schedule_spec schedule_from_stored(std::string name, std::string_view stored);

/// Adds, lists and removes a queue's schedules (`jobrt schedule add|list|remove`).
class schedule_book {
 public:
  schedule_book(backend& b, std::string queue, producer_options opts = {});

  /// Stores the schedule, replacing one of that name; its first firing is the first after now.
  /// Returns it as stored (with what the producer's options decided for its job) and that
  /// firing. Throws std::invalid_argument naming what is wrong (its name, catch_up, or its job,
  /// which is checked as the producer checks one).
  boost::asio::awaitable<schedule_info> add(schedule_spec s);
  /// Removes the schedule; false when the queue has none of that name.
  boost::asio::awaitable<bool> remove(std::string name);
  /// Up to about `limit` schedules from `cursor` ("" to start), in no particular order; one
  /// that cannot be read comes with its error.
  boost::asio::awaitable<page<schedule_info>> list(std::string cursor, std::size_t limit);

 private:
  backend& backend_;
  std::string queue_;
  producer_options opts_;
};

/// Fires a queue's schedules when they are due. A worker runs one (worker_options::schedules).
class scheduler {
 public:
  /// (What a producer's options decide for a schedule's job was decided when it was added.)
  scheduler(backend& b, std::string queue);

  /// Enqueues the firings due now, schedule by schedule (at most `max` steps); returns when the
  /// next firing is due (none: no schedule), or now when steps are left.
  boost::asio::awaitable<std::optional<sys_ms>> fire_due(std::size_t max = 100);

 private:
  backend& backend_;
  std::string queue_;
  producer_options opts_;
};

}  // namespace jobrt
