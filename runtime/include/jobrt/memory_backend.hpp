// The in-process backend: queue state in memory, for one process without Redis (embedding, tests,
// the demo). Each queue is a detail::queue_model (runtime/src/backend/queue_model.hpp), which
// mirrors the Redis scripts in runtime/lua/ operation by operation, so the two backends agree on
// every result, counter, fence and order; this class adds the lock and claim_wait's waiters. See
// backend.hpp for the data model.
#pragma once

#include <jobrt/backend.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace jobrt {

namespace detail {
class wakeups;
}

/// Keeps any number of named queues in memory. Every operation runs in one critical section, so
/// the object may be used from any number of threads and coroutines at once; none of them
/// suspends except claim_wait while it waits. Besides the refusals backend.hpp names (as
/// Redis: boost::system::system_error with a jobrt::errc, nothing changed), the only exceptions
/// an operation throws are std::bad_alloc (which may leave a batch half stored) and claim_wait's
/// when it is cancelled.
/// The object must outlive every operation on it, including a claim_wait still waiting.
///
/// Lease deadlines are system_clock milliseconds, as the Lua scripts use the server's TIME. As
/// with Redis, a lease counts as held while it is in `active`, whatever its deadline, until
/// reap() removes an expired one.
class memory_backend final : public backend {
 public:
  /// `ex` is the executor the backend belongs to (see get_executor()). claim_wait's timers run on
  /// the executor of the coroutine that awaits it, which is normally the same one.
  explicit memory_backend(boost::asio::any_io_executor ex);
  ~memory_backend() override;
  memory_backend(const memory_backend&) = delete;
  memory_backend& operator=(const memory_backend&) = delete;

  boost::asio::any_io_executor get_executor() const noexcept { return executor_; }

  /// Stores jobs, in order (enqueue.lua). A producer-given id that is pending or running, kept
  /// (job_spec::id), or given twice in the batch gives duplicate=true and stores nothing; a missing id is assigned
  /// from the queue's sequence (1, 2, ...). Wakes one claim_wait per lane it makes ready.
  boost::asio::awaitable<std::vector<enqueue_result>> enqueue(std::string queue,
                                                              std::vector<encoded_job> jobs) override;
  /// Leases up to opts.max jobs from the head of ready (claim.lua); empty when nothing is ready.
  boost::asio::awaitable<std::vector<claimed_job>> claim(std::string queue, claim_options opts) override;
  /// Like claim, but when nothing is ready waits up to `wait` (on a timer, never polling) for
  /// enqueue, finish or release to make a lane ready, then claims. A waiter that is woken but
  /// finds the work already taken by another claimer keeps waiting until its deadline; after the
  /// deadline it returns empty. Cancelling the awaiting coroutine (terminal cancellation) ends
  /// the wait at once with boost::system::system_error(operation_aborted), having claimed
  /// nothing. With opts.max == 0 it returns empty at once.
  boost::asio::awaitable<std::vector<claimed_job>> claim_wait(std::string queue, claim_options opts,
                                                              std::chrono::milliseconds wait) override;
  /// Acks or fails leased jobs (finish.lua). When none of the tokens is held, nothing changes;
  /// otherwise the held ones are finished and the others answer lease_held=false.
  boost::asio::awaitable<std::vector<finish_result>> finish(std::string queue, std::string worker,
                                                            std::vector<finish_item> items,
                                                            std::chrono::milliseconds lease_ttl) override;
  /// Renews the held leases and records the worker's heartbeat (extend.lua).
  boost::asio::awaitable<std::vector<bool>> extend(std::string queue, std::string worker,
                                                   std::vector<std::string> tokens,
                                                   std::chrono::milliseconds lease_ttl) override;
  /// Puts the held leases' lanes back at the head of ready, in the tokens' order, and takes back
  /// the `started` count of each (release.lua). Tokens not held are ignored.
  boost::asio::awaitable<void> advertise(std::string queue, std::vector<std::string> types,
                                         std::chrono::milliseconds ttl) override;
  boost::asio::awaitable<std::chrono::milliseconds> unrunnable_for(std::string queue, std::string type) override;
  boost::asio::awaitable<std::int64_t> expire_own(std::string queue, std::string worker) override;
  boost::asio::awaitable<void> release(std::string queue, std::string worker, std::vector<std::string> tokens) override;
  /// Recovers expired leases and dead workers' lanes, and trims the dead letters (reap.lua).
  boost::asio::awaitable<reap_result> reap(std::string queue, reap_options opts) override;
  /// Ready lanes, leases in `active`, dead letters and the counters; all zero for an unknown queue.
  boost::asio::awaitable<queue_counts> counts(std::string queue) override;

  boost::asio::awaitable<promote_result> promote(std::string queue, std::size_t max) override;
  std::uint64_t delayed_version(const std::string& queue) override;
  boost::asio::awaitable<void> wait_delayed(std::string queue, std::uint64_t seen,
                                            std::chrono::milliseconds timeout) override;
  std::uint64_t ended_version(const std::string& queue) override;
  boost::asio::awaitable<std::optional<kept_job>> wait_ended(std::string queue, std::string id, std::uint64_t seen,
                                                             std::chrono::milliseconds timeout) override;

  boost::asio::awaitable<void> put_schedule(std::string queue, stored_schedule s) override;
  boost::asio::awaitable<bool> remove_schedule(std::string queue, std::string name) override;
  boost::asio::awaitable<page<stored_schedule>> schedules(std::string queue, std::string cursor,
                                                          std::size_t limit) override;
  boost::asio::awaitable<std::optional<stored_schedule>> next_schedule(std::string queue) override;
  boost::asio::awaitable<schedule_fired> fire_schedule(std::string queue, schedule_step step) override;
  std::uint64_t schedules_version(const std::string& queue) override;
  boost::asio::awaitable<void> wait_schedules(std::string queue, std::uint64_t seen,
                                              std::chrono::milliseconds timeout) override;

  boost::asio::awaitable<std::vector<dead_letter>> dead_letters(std::string queue, std::size_t offset,
                                                                std::size_t limit) override;
  boost::asio::awaitable<std::optional<dead_letter>> dead_letter_of(std::string queue, std::string id) override;
  boost::asio::awaitable<std::vector<std::string>> requeue(std::string queue, std::vector<std::string> ids,
                                                           bool at_head) override;
  boost::asio::awaitable<std::int64_t> purge(std::string queue, std::vector<std::string> ids) override;

  boost::asio::awaitable<bool> pause(std::string queue, std::string group) override;
  boost::asio::awaitable<bool> resume(std::string queue, std::string group, resume_mode mode) override;
  boost::asio::awaitable<std::vector<paused_group>> paused_groups(std::string queue) override;
  boost::asio::awaitable<std::int64_t> purge_queue(std::string queue) override;
  boost::asio::awaitable<std::int64_t> group_size(std::string queue, std::string group) override;
  boost::asio::awaitable<check_report> check(std::string queue, bool repair) override;

  boost::asio::awaitable<void> report_worker(std::string queue, worker_report report,
                                             std::chrono::milliseconds ttl) override;
  boost::asio::awaitable<page<worker_report>> workers(std::string queue, std::string cursor,
                                                      std::size_t limit) override;
  boost::asio::awaitable<bool> claim_history(std::string queue) override;
  boost::asio::awaitable<bool> record_history(std::string queue, queue_counts counts) override;
  boost::asio::awaitable<std::vector<history_point>> history(std::string queue, std::chrono::minutes span) override;
  /// In the groups' name order, from the last one of the page before.
  boost::asio::awaitable<page<std::string>> groups(std::string queue, std::string prefix, std::string cursor,
                                                   std::size_t limit) override;
  boost::asio::awaitable<group_status> group_of(std::string queue, std::string group) override;
  boost::asio::awaitable<std::optional<kept_job>> kept_job_of(std::string queue, std::string id) override;
  boost::asio::awaitable<cancel_outcome> cancel(std::string queue, std::string id) override;
  boost::asio::awaitable<std::vector<bool>> cancelled(std::string queue, std::vector<held_job> jobs) override;
  boost::asio::awaitable<page<dead_letter>> find_dead(std::string queue, dead_filter filter, std::string cursor,
                                                      std::size_t limit) override;

  /// Stores the count once; the shards' queues then assign ids n * shards + k.
  boost::asio::awaitable<std::size_t> stored_shards(std::string queue, std::size_t wanted) override;
  boost::asio::awaitable<void> mark_shards(std::string queue, std::vector<std::size_t> shards) override;
  /// Waits on a timer that mark_shards cuts short (no polling).
  boost::asio::awaitable<std::optional<std::size_t>> take_shard_mark(std::string queue, std::string worker,
                                                                     std::chrono::milliseconds wait) override;
  boost::asio::awaitable<bool> has_ready(std::string queue) override;
  boost::asio::awaitable<void> note_leases(std::string queue,
                                           std::vector<std::pair<std::string, std::int64_t>> until) override;
  boost::asio::awaitable<std::optional<std::vector<std::string>>> take_reap_turn(std::string queue, std::string holder,
                                                                                 std::chrono::milliseconds ttl,
                                                                                 std::int64_t now_ms) override;

 private:
  struct queue_state;
  struct waiter;
  struct wait_guard;

  queue_state& queue_locked(const std::string& name);
  const queue_state* find_locked(const std::string& name) const;
  // Runs `op` on the queue's model under the lock, then wakes whom its effects ask for.
  template <class Op>
  auto change(const std::string& queue, Op op);
  // Runs `op` on the queue's model under the lock; `fallback` for a queue never used.
  template <class Op, class T>
  T read(const std::string& queue, Op op, T fallback) const;
  void settle_locked(const std::string& queue, queue_state& q);
  void wake_locked(queue_state& q, std::size_t lanes);
  bool leave_locked(waiter& w);

  boost::asio::any_io_executor executor_;
  std::shared_ptr<detail::wakeups> delayed_wakeups_;
  std::shared_ptr<detail::wakeups> ended_wakeups_;  // a kept job's end (wait_ended)
  std::shared_ptr<detail::wakeups> mark_wakeups_;
  std::shared_ptr<detail::wakeups>
      schedule_wakeups_;  // a schedule put or removed   // a mark_shards wakes take_shard_mark's waiters
  mutable std::mutex mutex_;
  // Queues are never erased: claim_wait keeps a queue's address across its wait.
  std::unordered_map<std::string, std::unique_ptr<queue_state>> queues_;
  std::unordered_map<std::string, std::size_t> shards_;             // stored shard counts
  std::unordered_map<std::string, std::deque<std::size_t>> marks_;  // per queue, oldest first, each once
  struct reaping {
    std::string holder;  // whose turn it is
    std::chrono::steady_clock::time_point until;
    std::map<std::string, std::int64_t> leased;  // note_leases' entries
  };
  std::unordered_map<std::string, reaping> reaping_;  // by queue
};

}  // namespace jobrt
