// One queue over many shards: a backend that keeps each queue as S queues of another backend,
// "<queue>#0" ... "<queue>#<S-1>", each with keys of its own hash tag, so that on a Redis Cluster
// one queue spreads over every node. See docs/ARCHITECTURE.md ("Shards").
//
// A group lives in one shard (a stable hash of its key), so its order, exclusion and fences hold
// as on one queue; ungrouped jobs spread over every shard (by the hash of their id when the
// producer gives one, so a duplicate meets its first; else in turn). Tokens carry their shard:
// "<k>/<token>". Counts are summed; dead letters, paused groups and check reports are merged.
//
// Finding work without polling: every call that may make a shard's ready list non-empty
// (enqueue, a finish that sends a lane back, release, reap, promote, requeue, resume) marks the
// shard in the queue's set of marks (backend::mark_shards: one ZADD on Redis, at the queue's own
// node, for every shard a call marks; on one server an enqueue's script marks too). An idle worker waits for a mark
// (backend::take_shard_mark: BZPOPMIN), claims in that shard, and when the claim got all it asked for marks the shard
// again for the next one. A process also remembers the shards whose last claim was full and claims there first, in
// turn. Reaping takes turns: the reaper whose turn it is (one process at a time) reaps the shards where a lease may
// have run out (processes note where they hold leases, with their renewals) and one more in turn, whose ready list it
// also looks at, marking it when it has work (a mark lost with a worker that took it and crashed).
//
// With S = 1 every call goes to the queue itself, as with the inner backend alone (the stored
// count is checked at the first call).
#pragma once

#include <jobrt/backend.hpp>

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace jobrt {

class sharded_backend final : public backend {
 public:
  /// What a process does when the queue has no count stored yet.
  enum class when_unknown {
    store,  ///< stores its own (1 for shards 0): producers and workers
    look,   ///< stores nothing and takes the queue for one shard: tools that only look
  };
  /// Queues of `shards` shards in `inner`, which must outlive this object. The first call on a
  /// queue stores that count, or throws boost::system::system_error(errc::shards_mismatch),
  /// naming both, when the queue is stored with another. shards 0: as stored.
  sharded_backend(backend& inner, std::size_t shards, when_unknown unknown = when_unknown::store);
  /// The same, owning `inner`.
  sharded_backend(std::shared_ptr<backend> inner, std::size_t shards, when_unknown unknown = when_unknown::store);

  /// The shards of `queue` (asked of the store at the first call on it).
  boost::asio::awaitable<std::size_t> shards_of(std::string queue);
  /// Shard k's queue: "<queue>#<k>".
  static std::string shard_queue(std::string_view queue, std::size_t k);
  /// The shard of a group (or of a producer-given id): FNV-1a of the key, modulo `shards`.
  static std::size_t shard_of(std::string_view key, std::size_t shards) noexcept;

  boost::asio::awaitable<std::vector<enqueue_result>> enqueue(std::string queue,
                                                              std::vector<encoded_job> jobs) override;
  boost::asio::awaitable<std::size_t> shard_count(std::string queue) override;
  boost::asio::awaitable<std::vector<enqueue_result>> enqueue_parts(std::string queue, std::vector<encoded_job> jobs,
                                                                    std::size_t per_call) override;
  boost::asio::awaitable<std::vector<claimed_job>> claim(std::string queue, claim_options opts) override;
  boost::asio::awaitable<std::vector<claimed_job>> claim_wait(std::string queue, claim_options opts,
                                                              std::chrono::milliseconds wait) override;
  boost::asio::awaitable<std::vector<finish_result>> finish(std::string queue, std::string worker,
                                                            std::vector<finish_item> items,
                                                            std::chrono::milliseconds lease_ttl) override;
  boost::asio::awaitable<std::vector<bool>> extend(std::string queue, std::string worker,
                                                   std::vector<std::string> tokens,
                                                   std::chrono::milliseconds lease_ttl) override;
  boost::asio::awaitable<void> advertise(std::string queue, std::vector<std::string> types,
                                         std::chrono::milliseconds ttl) override;
  boost::asio::awaitable<std::chrono::milliseconds> unrunnable_for(std::string queue, std::string type) override;
  boost::asio::awaitable<std::int64_t> expire_own(std::string queue, std::string worker) override;
  boost::asio::awaitable<void> release(std::string queue, std::string worker, std::vector<std::string> tokens) override;
  boost::asio::awaitable<reap_result> reap(std::string queue, reap_options opts) override;
  boost::asio::awaitable<queue_counts> counters(std::string queue) override;
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
  boost::asio::awaitable<page<std::string>> groups(std::string queue, std::string prefix, std::string cursor,
                                                   std::size_t limit) override;
  boost::asio::awaitable<group_status> group_of(std::string queue, std::string group) override;
  boost::asio::awaitable<std::optional<kept_job>> kept_job_of(std::string queue, std::string id) override;
  boost::asio::awaitable<cancel_outcome> cancel(std::string queue, std::string id) override;
  boost::asio::awaitable<std::vector<bool>> cancelled(std::string queue, std::vector<held_job> jobs) override;
  boost::asio::awaitable<page<dead_letter>> find_dead(std::string queue, dead_filter filter, std::string cursor,
                                                      std::size_t limit) override;

 private:
  struct queue_state;
  // The queue's state, with its shards known (asks the store at the first call).
  boost::asio::awaitable<std::shared_ptr<queue_state>> state_of(const std::string& queue);
  // Marks shards (one call; none: nothing); a failure is logged, not thrown.
  boost::asio::awaitable<void> mark(const std::string& queue, std::vector<std::size_t> shards);
  boost::asio::awaitable<void> mark(const std::string& queue, std::size_t k);
  // delayed_version or ended_version over the shards, summed.
  template <class Version>
  std::uint64_t summed_version(const std::string& queue, Version version);
  // counts() or counters() over the shards, summed.
  boost::asio::awaitable<queue_counts> summed(std::string queue, bool counters_only);
  // A claim in shard k, its tokens prefixed; marks k again (and remembers it) when it was full.
  // Refuses a batch over several shards whose limited groups would grow past their limits.
  boost::asio::awaitable<void> check_group_sizes(const queue_state& q, const std::vector<encoded_job>& jobs);
  boost::asio::awaitable<std::vector<claimed_job>> claim_in(const std::string& queue, queue_state& q, std::size_t k,
                                                            const claim_options& opts);
  // Throws std::invalid_argument for a claim with a queue-wide rate limit on several shards.
  static void refuse_queue_rate(const std::string& queue, const queue_state& q, const claim_options& opts);
  // Notes for the reaper that this process holds leases in these shards for `ttl` from now.
  boost::asio::awaitable<void> note(const std::string& queue, queue_state& q, const std::vector<std::size_t>& shards,
                                    std::chrono::milliseconds ttl);
  // Adds to `got` claims in the shards whose last claim here was full (known_first), then in
  // marked ones, until it holds opts.max jobs or no mark is left.
  boost::asio::awaitable<std::vector<claimed_job>> claim_more(const std::string& queue, queue_state& q,
                                                              const claim_options& opts, std::vector<claimed_job> got,
                                                              bool known_first);

  std::shared_ptr<backend> owned_;  // (empty when the caller owns it)
  backend& inner_;
  std::size_t shards_;
  when_unknown unknown_;
  std::string holder_;  // names this object in turns (the reaper's)
  std::mutex mutex_;    // guards queues_ and every queue_state's members
  std::map<std::string, std::shared_ptr<queue_state>, std::less<>> queues_;
};

}  // namespace jobrt
