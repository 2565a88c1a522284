// Where queue state lives. Two implementations share this interface and its semantics:
// redis_backend (many processes and machines) and memory_backend (one process, no Redis).
// Each operation is atomic: one Lua script on Redis, one critical section in memory.
//
// Data model (both backends): a queue has a list of ready *lanes*; a lane is one ungrouped job or
// one group that has work and no running job. A group keeps its pending jobs in order; its head
// stays there while it runs. A claim takes lanes and gives each job a *lease*: a token (which
// names the lane and a fence) with a deadline. Finishing a grouped job puts its group's lane back
// at the tail of the ready list (round robin) when the group has more work.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace jobrt {

/// A job ready to store: body is the encoded job (see job_codec), group "" for none,
/// id "" to have the backend assign one.
struct encoded_job {
  std::string id;
  std::string group;
  std::string body;
};

struct enqueue_result {
  std::string id;
  bool duplicate = false;  ///< a job with this id was already pending or running: nothing stored
};

/// A job a worker holds under a lease.
struct claimed_job {
  std::string token;  ///< names the lease in finish/extend/release
  std::int64_t fence = 0;
  std::string group;   ///< "" when ungrouped
  std::string record;  ///< "<attempts before>|<id>|<body>"
};

struct claim_options {
  std::string worker;
  std::size_t max = 1;
  std::chrono::milliseconds lease_ttl{30000};
};

enum class finish_kind { ack, fail };

struct finish_item {
  std::string token;
  finish_kind kind = finish_kind::ack;
  std::string unique_id;  ///< the job's id when the producer gave it (forgotten on finish)
  std::string error;      ///< for fail
  /// For a grouped ack: whether the worker runs the group's next job at once (a burst), leased
  /// to it in the same call instead of the lane going back to the ready list.
  enum class next_policy { no, yes, if_nobody_waits } want_next = next_policy::no;
};

struct finish_result {
  bool lease_held = false;  ///< false: the lease was lost; nothing was changed
  std::optional<claimed_job> next;
};

struct reap_result {
  std::int64_t leases = 0;   ///< expired leases whose jobs went back to the head of their groups
  std::int64_t workers = 0;  ///< workers whose heartbeat had expired
  std::int64_t lanes = 0;    ///< lanes those workers had taken and not started, made ready again
};

struct queue_counts {
  std::int64_t ready_lanes = 0;
  std::int64_t running = 0;
  std::int64_t dead = 0;
  std::int64_t enqueued = 0;
  std::int64_t started = 0;
  std::int64_t completed = 0;
  std::int64_t failed = 0;
  std::int64_t recovered = 0;  ///< jobs whose lease expired and that were made ready again
};

class backend {
 public:
  virtual ~backend() = default;

  /// Stores jobs, in order. Throws on failure (a batch is one script: it fails before storing
  /// anything unless the server itself fails mid-script, e.g. out of memory).
  virtual boost::asio::awaitable<std::vector<enqueue_result>> enqueue(std::string queue,
                                                                      std::vector<encoded_job> jobs) = 0;
  /// Leases up to opts.max jobs at once; an empty result means nothing is ready.
  virtual boost::asio::awaitable<std::vector<claimed_job>> claim(std::string queue, claim_options opts) = 0;
  /// Like claim, but waits (without polling) up to `wait` for work when nothing is ready.
  virtual boost::asio::awaitable<std::vector<claimed_job>> claim_wait(std::string queue, claim_options opts,
                                                                      std::chrono::milliseconds wait) = 0;
  /// Acks or fails leased jobs, checked against their tokens; results in the same order.
  virtual boost::asio::awaitable<std::vector<finish_result>> finish(std::string queue, std::string worker,
                                                                    std::vector<finish_item> items,
                                                                    std::chrono::milliseconds lease_ttl) = 0;
  /// Renews leases; true for each that is still held. Also records the worker's heartbeat.
  virtual boost::asio::awaitable<std::vector<bool>> extend(std::string queue, std::string worker,
                                                           std::vector<std::string> tokens,
                                                           std::chrono::milliseconds lease_ttl) = 0;
  /// Gives back leased jobs that were not started (a stopping worker): they are ready again, at
  /// the head, with no attempt counted.
  virtual boost::asio::awaitable<void> release(std::string queue, std::string worker,
                                               std::vector<std::string> tokens) = 0;
  /// Recovers what crashed or stalled workers held, up to `max` leases and `max` workers: a
  /// lease past its deadline sends its job back to the head of its group with its attempt
  /// counted (its lane to the head of the ready list); the lanes a worker whose heartbeat expired
  /// had taken but not started are made ready. Atomic and idempotent.
  virtual boost::asio::awaitable<reap_result> reap(std::string queue, std::size_t max) = 0;
  virtual boost::asio::awaitable<queue_counts> counts(std::string queue) = 0;
};

}  // namespace jobrt
