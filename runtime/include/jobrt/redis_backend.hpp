// The Redis backend: every state change is one Lua script (runtime/lua/), all keys of a queue
// share the hash tag {jobrt:<queue>}.
#pragma once

#include <jobrt/backend.hpp>
#include <jobrt/redis/connection.hpp>
#include <jobrt/redis/script.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>

namespace jobrt {

namespace detail {
class wakeups;
class redis_link;
class shard_listener;
}  // namespace detail

/// How far the writes of an enqueue and of a finish have gone when the call returns.
enum class durability : int {
  /// The primary has them. Redis replicates asynchronously: a failover may lose the last ones.
  primary,
  /// `replicas` replicas have them too (WAIT after the call), else the call fails with
  /// errc::not_replicated (its writes stand at the primary). A failover that promotes one of
  /// them loses none of them.
  replicated,
};

/// "primary" or "replicated"; throws std::invalid_argument saying so for anything else.
durability durability_of(std::string_view name);

struct redis_backend_options {
  jobrt::durability durability = durability::primary;
  int replicas = 1;                              ///< replicated: how many replicas must have them
  std::chrono::milliseconds replica_wait{1000};  ///< replicated: how long they may take
};

class redis_backend final : public backend {
 public:
  /// Starts a shared connection to cfg; blocking connections (one per worker that waits for
  /// work) are made on demand.
  redis_backend(boost::asio::any_io_executor ex, redis::config cfg);
  /// The same with seeds: one server, or nodes of a Redis Cluster (redis::cluster_seeds gives them
  /// from a URL that names several: redis://h1:p1,h2:p2). Whether the server is a cluster is asked
  /// of it at the first command; several seeds are taken for a cluster at once.
  redis_backend(boost::asio::any_io_executor ex, std::vector<redis::config> seeds, redis_backend_options o = {});
  /// Destroy it on a thread that runs its executor, or once nothing runs that executor any more.
  ~redis_backend() override;

  /// The key prefix of a queue: "jobrt:{<queue>}:".
  static std::string key_prefix(std::string_view queue);
  /// For producers in other languages (docs/PROTOCOL.md): the enqueue script's source
  /// (runtime/lua/enqueue.lua), and the keys it takes for a queue, in order.
  static std::string_view enqueue_script() noexcept;
  static std::array<std::string, 5> enqueue_keys(std::string_view queue);
  /// The connection to the server configured (on a cluster, the node named): for tools and tests.
  redis::connection& connection() noexcept;
  /// Runs a command (or a pipeline) where `key` lives: on the server, or on a cluster at the
  /// primary serving its slot. Throws as redis::exec. For tools and tests.
  boost::asio::awaitable<redis::reply> exec(redis::request req, std::string key);
  /// Where a connection of one's own (a blocking one, say) for `key` goes: the server, or the
  /// primary serving its slot now.
  boost::asio::awaitable<redis::config> node_of(std::string key);

  boost::asio::awaitable<std::vector<enqueue_result>> enqueue(std::string queue,
                                                              std::vector<encoded_job> jobs) override;
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
  /// Subscribes (once per queue, on subscriber connections this backend shares among queues:
  /// one, or on a cluster one per node that serves a queue) to the wake-ups that enqueue and
  /// finish send (SPUBLISH, a shard channel) when a delayed entry is due first.
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

  /// At <prefix>shards (SET NX). Once known here, the shards' enqueues assign ids n * shards + k.
  boost::asio::awaitable<std::size_t> stored_shards(std::string queue, std::size_t wanted) override;
  /// One ZADD NX at <prefix>marks, scored by the time (oldest first).
  boost::asio::awaitable<void> mark_shards(std::string queue, std::vector<std::size_t> shards) override;
  boost::asio::awaitable<std::vector<finish_result>> finish_part(std::string queue, std::string worker,
                                                                 std::vector<finish_item> items,
                                                                 std::chrono::milliseconds lease_ttl,
                                                                 std::vector<std::string>& calls) override;
  void finish_answered(const std::string& queue, const std::string& worker, std::vector<std::string> calls) override;
  /// On one server, the enqueue script marks the shard too (one round trip, not two). On a
  /// cluster the shard and its queue's marks are in different slots: the caller marks.
  boost::asio::awaitable<shard_enqueued> enqueue_in_shard(std::string queue, std::size_t shard,
                                                          std::vector<encoded_job> jobs) override;
  /// BZPOPMIN on the worker's blocking connection (ZPOPMIN when `wait` is 0).
  boost::asio::awaitable<std::optional<std::size_t>> take_shard_mark(std::string queue, std::string worker,
                                                                     std::chrono::milliseconds wait) override;
  boost::asio::awaitable<bool> has_ready(std::string queue) override;
  /// ZADD GT at <prefix>leased.
  boost::asio::awaitable<void> note_leases(std::string queue,
                                           std::vector<std::pair<std::string, std::int64_t>> until) override;
  /// At <prefix>turn:reap and <prefix>leased (runtime/lua/reap_turn.lua).
  boost::asio::awaitable<std::optional<std::vector<std::string>>> take_reap_turn(std::string queue, std::string holder,
                                                                                 std::chrono::milliseconds ttl,
                                                                                 std::int64_t now_ms) override;

 private:
  // The version of a channel's wake-ups (delayed_version, ended_version): the first call
  // subscribes to it, on the one listener of this backend.
  std::uint64_t listened(const std::string& channel);
  // enqueue's call; with `marks` (a sharded queue's marks key, on one server) the script marks
  // the shard too.
  boost::asio::awaitable<std::vector<enqueue_result>> store_jobs(std::string queue,
                                                                 const std::vector<encoded_job>& jobs,
                                                                 std::string marks);
  redis::blocking_connection& blocking_for(const std::string& worker, const redis::config& node);
  redis::request claim_request(const std::string& prefix, const claim_options& opts) const;
  boost::asio::awaitable<void> claim_more(const std::string& prefix, claim_options opts,
                                          std::vector<claimed_job>& jobs);
  // One finish call of at most max_batch items; its id is added to `calls`.
  boost::asio::awaitable<std::vector<finish_result>> finish_call(const std::string& queue, const std::string& worker,
                                                                 std::vector<finish_item> items,
                                                                 std::chrono::milliseconds lease_ttl,
                                                                 std::vector<std::string>& calls);
  // A blocking command (BLMOVE and the claim behind it, BZPOPMIN) on the worker's blocking
  // connection to the node of `prefix`'s queue. A cancellation cuts it short while it waits to be
  // written; once written, CLIENT UNBLOCK ends the wait so that its reply comes (see claim_wait),
  // unless none comes soon. Throws operation_aborted when cancelled with no reply; `ec` is set
  // when the connection dropped. `address` names the node.
  struct blocked_reply {
    boost::system::error_code ec;
    redis::reply r;
    std::string address;
  };
  boost::asio::awaitable<blocked_reply> exec_blocking(const std::string& worker, const std::string& prefix,
                                                      redis::request req);
  bool take_idle_mark(const std::string& worker);
  void set_idle_mark(const std::string& worker);
  // Ends a blocking claim's wait (CLIENT UNBLOCK on the shared connection, or on a cluster the
  // cluster's connection to `node`), so that its reply comes.
  void unblock(const redis::config& node, std::int64_t client_id);

  boost::asio::any_io_executor ex_;
  redis::config cfg_;
  redis_backend_options opts_;
  std::shared_ptr<detail::redis_link> link_;  // (shared with the listener)
  redis::script enqueue_, claim_, finish_, extend_, release_, reap_, promote_, pause_, resume_, cancel_, requeue_,
      purge_, check_fix_, advertise_, expire_own_, reap_turn_, reports_, history_, schedule_put_, schedule_fire_;
  // Wake-ups for delayed jobs: one listener for every queue, started on first use. The
  // wake-ups are shared with the listener, which may outlive the backend briefly.
  std::shared_ptr<detail::wakeups> wakeups_;
  std::shared_ptr<detail::shard_listener> listener_;  // wake-ups: delayed sets, kept jobs' ends
  std::set<std::string> subscribed_;
  std::mutex blocking_mutex_;  // guards blocking_, idle_ and answered_
  std::map<std::string, std::unique_ptr<redis::blocking_connection>> blocking_;
  std::set<std::string> idle_;  // workers whose last claim got fewer jobs than it asked for
  // Per answers:<worker> key (a worker's, in one queue), ids of finish calls whose answers came:
  // the next call there has the script drop their records.
  std::map<std::string, std::vector<std::string>> answered_;
  // Shard counts this backend was told of (stored_shards), by queue: its shards' enqueues
  // assign ids that no other shard gives.
  std::mutex shards_mutex_;
  std::map<std::string, std::size_t, std::less<>> shards_;
  // The server refused an enqueue script that also marks (CROSSSLOT: a proxy): marks go apart.
  std::atomic<bool> marks_refused_{false};
  // Part of every finish call's id: no call of this process is taken for one of another process
  // (a worker restarted under the same id).
  std::uint64_t call_nonce_;
};

}  // namespace jobrt
