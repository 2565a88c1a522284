// A worker: claims jobs of one queue and runs their handlers as coroutines on an io_context.
#pragma once

#include <jobrt/backend.hpp>
#include <jobrt/job.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace jobrt {

/// What a handler gets: the job, its lease's fence, and a way to tell that it should stop.
class job_context {
 public:
  job_context(jobrt::job j, std::int64_t fence, std::string worker) noexcept
      : job_(std::move(j)), fence_(fence), worker_(std::move(worker)) {}

  const jobrt::job& job() const noexcept { return job_; }
  const boost::json::value& payload() const noexcept { return job_.payload; }
  const std::string& id() const noexcept { return job_.id; }
  const std::string& group() const noexcept { return job_.group; }
  int attempt() const noexcept { return job_.attempt; }
  /// Grows with every claim of the queue: pass it to your own storage to refuse stale writers.
  std::int64_t fence() const noexcept { return fence_; }
  const std::string& worker_id() const noexcept { return worker_; }
  /// True once the lease is lost or the worker stops: the handler is also cancelled through its
  /// cancellation slot (its pending operations complete with operation_aborted).
  bool cancelled() const noexcept { return cancelled_.load(std::memory_order_relaxed); }
  /// Writes a line to stderr, prefixed with the job's id and group.
  void log(std::string_view message) const;
  /// Asks to run the job again after `delay` instead of completing it, with no attempt counted
  /// (say, a resource it needs is busy). Takes effect when the handler returns normally; a
  /// grouped job keeps its place at its group's head, so the group waits for it.
  void retry_after(std::chrono::milliseconds delay) noexcept { retry_after_ = delay; }
  /// The job's result, kept with its status for its keep when it completes (a job enqueued with
  /// a keep: job().keep; for any other job it goes nowhere). Throws std::invalid_argument,
  /// naming both sizes, when it is longer than worker_options::max_result_bytes once encoded (the
  /// handler's failure, then, unless it catches it).
  void set_result(const boost::json::value& result);
  /// Throttles the job's group (say, after an HTTP 429 from the tenant's API): once this run
  /// completes, fails or asks to run again, the group starts nothing for `pause`, while other
  /// groups go on; a job that runs again (a retry, retry_after) waits at least as long. (A run
  /// that halts its group, is cancelled, or whose lease is lost or stop cuts short throttles
  /// nothing.) False, and nothing is done, for an ungrouped job. Throws std::invalid_argument,
  /// naming the value, unless `pause` is from 1 ms to max_rate_window.
  bool throttle_group(std::chrono::milliseconds pause);

 private:
  friend class worker;
  jobrt::job job_;
  std::int64_t fence_;
  std::string worker_;
  std::atomic<bool> cancelled_{false};
  std::optional<std::chrono::milliseconds> retry_after_;
  std::chrono::milliseconds throttle_{0};
  std::optional<std::string> result_;
  std::size_t max_result_ = 64 * 1024;
};

/// Thrown by a handler for a failure that retrying cannot fix (say, a payload it cannot parse):
/// the job goes to the dead letters at once (a group under the `halt` policy halts).
class permanent_failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A handler: a coroutine. Returning completes the job; throwing fails the run with what() as the
/// error: it runs again after a backoff while attempts are left (see failure_policy).
using handler = std::function<boost::asio::awaitable<void>(job_context&)>;

/// Where a worker is in its life (worker::state()); each state follows the one before.
enum class worker_state {
  created,   ///< start() has not run
  running,   ///< claiming and running jobs
  draining,  ///< stop() began: nothing more is claimed or started; running handlers have the grace
  closing,   ///< the handlers are done: the last results and hand-backs go out, the loops end
  stopped,   ///< stop() completed: nothing of the worker touches the backend any more
};

/// When a burst's follower starts (worker_options::follow). Either way a group's jobs run one at a
/// time, in order, and a failed job holds back the jobs behind it.
enum class follow_policy {
  /// Once its predecessor's end is stored: a round trip per job. A job never runs again after
  /// its follower started, whatever crashes.
  after_commit,
  /// As soon as its predecessor succeeded; the end is stored on the way, behind it. A burst
  /// costs about two round trips, not one per job. The price, only when the lease is lost (the
  /// worker dies, Redis is out of reach for a TTL): the group runs again from its first job
  /// whose end was not stored, with that job's attempt counted, so a job that ran may run again
  /// after its follower ran, as a consumer that commits its offsets asynchronously replays from
  /// the last commit. Under a lease that replays (from a job with attempt > 1 on) followers wait
  /// for their predecessors' ends, as after_commit does, so a follower that keeps crashing its
  /// worker is charged itself from its second crash on; the first charges the first job whose
  /// end was unstored, which is dead-lettered if that was its last attempt (give jobs at least
  /// two; the exceptions are in docs/RELIABILITY.md).
  pipelined,
};

/// "after-commit" or "pipelined"; throws std::invalid_argument naming the text otherwise.
follow_policy parse_follow_policy(std::string_view text);

struct worker_options {
  std::string queue = "default";
  /// Unique per running worker; a restarted worker with the same id takes back its own claims.
  /// Empty: <hostname>:<pid>:<random>.
  std::string id;
  /// Handlers run at once. A job whose handler is done gives its slot to the next claim while
  /// its result is on its way to the backend (unless that answer may bring its group's next job).
  std::size_t concurrency = 10;
  /// How long a lease lives unless renewed: a crashed worker's jobs run again after about this long.
  /// At most a day (so are the periods below).
  std::chrono::milliseconds lease_ttl{5000};
  /// How often leases are renewed; 0: lease_ttl / 3. Not below lease_ttl, leases run out
  /// between renewals (logged at warn).
  std::chrono::milliseconds watchdog_period{0};
  /// How often this worker runs the reaper (recovers expired leases and the claims of workers
  /// whose heartbeat stopped); 0: the watchdog period. Every live worker runs it.
  std::chrono::milliseconds reap_period{0};
  /// How long one blocking claim waits inside the backend before it is made again; at least 1 ms.
  std::chrono::milliseconds claim_wait{5000};
  /// How many jobs of one group in a row this worker may run before the group's lane goes back
  /// to the tail of the ready list (1: strict round robin). A claim brings a group's head with
  /// up to burst - 1 jobs behind it under one lease, and they run one after another with no
  /// claim in between (see follow and docs/ARCHITECTURE.md). At most 1,000.
  std::size_t burst = 4;
  /// The queue's rate limit: at most max jobs start in any window, counted in the backend over
  /// every worker that gives it (give all of a queue's workers the same; BullMQ's limiter). A
  /// worker at the limit waits on a timer until the oldest counted start leaves the window.
  /// Bursts are off while it is set (each follower would be a start: burst is taken as 1). Not
  /// on a sharded queue (its claims throw std::invalid_argument). check_rate_limit's bounds.
  std::optional<jobrt::rate_limit> rate_limit;
  /// The longest result a handler may give (job_context::set_result), encoded.
  std::size_t max_result_bytes = 64 * 1024;
  /// When a burst's next job starts: once its predecessor's end is stored (the default), or at
  /// once, the end stored on the way (see follow_policy).
  follow_policy follow = follow_policy::after_commit;
  /// Between a failed run and the next, for job types without a backoff of their own.
  backoff retry_backoff;
  /// What a grouped job's failure does to its group, unless its grouping rule or the job says.
  failure_policy on_failure = failure_policy::hold;
  /// Dead letters kept, applied by every worker's reaper: at most this many (0: no limit), none
  /// older than this (0: no limit).
  std::size_t dead_max_count = 10000;
  std::chrono::milliseconds dead_max_age = std::chrono::hours(24 * 30);
  /// Longest wait of the delayed-job promoter when nothing wakes it (a backstop; it is woken
  /// when a job due earlier arrives, and runs at each due time).
  std::chrono::milliseconds promote_backstop{60000};
  /// Fire the queue's repeatable jobs when due (scheduler.hpp): every worker may, and each
  /// firing is enqueued once. Its longest wait when nothing wakes it is promote_backstop.
  bool schedules = true;
  /// A job of a type this worker has no handler for (a mixed fleet, a rolling deploy) is handed
  /// back, with no attempt counted, to run after this long on a worker that has one; a grouped
  /// job's group waits for it. Workers say which types they run (backend::advertise) ...
  std::chrono::milliseconds unhandled_delay{1000};
  /// ... and such a job is dead-lettered only once no worker has been able to run its type for
  /// this long (counted from when the job was enqueued, if later). At most a day.
  std::chrono::milliseconds unhandled_limit = std::chrono::minutes(15);
};

struct worker_counters {
  std::uint64_t started = 0;
  std::uint64_t completed = 0;
  std::uint64_t failed = 0;       ///< dead-lettered (or halted their group)
  std::uint64_t retried = 0;      ///< failed and will run again
  std::uint64_t deferred = 0;     ///< asked to run again later
  std::uint64_t promoted = 0;     ///< delayed entries this worker's promoter moved
  std::uint64_t leases_lost = 0;  ///< leases found lost (their handlers cancelled, if running)
  std::uint64_t renewals = 0;     ///< watchdog calls
  std::uint64_t released = 0;     ///< handed back unstarted: at stop, or when a lease's local end came first
  std::uint64_t recovered = 0;    ///< expired leases this worker's reaper sent back
  std::uint64_t unhandled = 0;    ///< handed back: this worker has no handler for their type
  std::uint64_t cancelled = 0;    ///< runs ended by a cancel of their job (backend::cancel)
};

/// A histogram with fixed buckets, in seconds (Prometheus' cumulative form is made when written).
struct histogram {
  static constexpr std::array<double, 16> bounds{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,  0.1,   0.25,
                                                 0.5,   1.0,    5.0,   30.0, 60.0,  300.0, 900.0, 3600.0};
  std::array<std::uint64_t, bounds.size() + 1> counts{};  ///< per bucket; the last is above every bound
  double sum = 0;
  std::uint64_t count = 0;
  void observe(double seconds) noexcept;
};

/// Counters of one job type in one worker.
struct type_counters {
  std::uint64_t started = 0;
  std::uint64_t completed = 0;
  std::uint64_t failed = 0;
  std::uint64_t retried = 0;
  std::uint64_t deferred = 0;
  std::uint64_t recovered = 0;  ///< expired leases of this type this worker's reaper sent back
  std::uint64_t unhandled = 0;  ///< handed back: this worker has no handler for the type
  std::uint64_t cancelled = 0;  ///< runs (or jobs about to start) ended by a cancel of their job
};

/// What a metrics endpoint shows of a worker.
struct worker_metrics {
  worker_counters totals;
  std::map<std::string, type_counters> by_type;
  histogram run_seconds;     ///< handler run time
  histogram pickup_seconds;  ///< from enqueue to start, first runs only
  std::size_t in_flight = 0;
};

class worker {
 public:
  /// The backend must outlive the worker. A started worker is stopped (its stop() completed)
  /// before it is destroyed: until then its loops run on, and call the backend.
  worker(boost::asio::any_io_executor ex, backend& b, worker_options opts);
  ~worker();
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;

  /// Registers the handler of a job type. Call before start().
  void add_handler(std::string type, handler h);
  /// The same, with a backoff of the type's own.
  void add_handler(std::string type, handler h, backoff retry_backoff);
  /// Starts claiming and running jobs.
  void start();
  /// Stops claiming, lets running handlers finish for up to `grace`, cancels the rest and hands
  /// their jobs back (no attempt counted), then returns. Called again while a stop runs, it waits
  /// for that one, and a shorter grace cuts the one under way short (a forced stop: stop(0ms)
  /// cancels the running handlers at once). Thread-safe.
  boost::asio::awaitable<void> stop(std::chrono::milliseconds grace);

  const worker_options& options() const noexcept;
  /// A snapshot. Thread-safe.
  worker_counters counters() const;
  /// Jobs started and not yet finished (running, or their result on its way; or handed back,
  /// the call on its way). Thread-safe.
  std::size_t in_flight() const;
  /// Counters by job type and histograms. Thread-safe.
  worker_metrics metrics() const;
  /// Where the worker is in its life. Thread-safe.
  worker_state state() const noexcept;
  /// Running, holding no job, with a claim on its way: the claim waits in the backend (BLMOVE on
  /// Redis, up to claim_wait) for work. A job enqueued from now on is picked up at once, without
  /// waiting for a later claim. Thread-safe.
  bool waiting_for_work() const noexcept;

 private:
  class impl;
  std::shared_ptr<impl> impl_;
};

/// <hostname>:<pid>:<random>, unique enough to name a worker.
std::string make_worker_id();

}  // namespace jobrt
