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

#include <jobrt/job.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace jobrt {

/// Throws std::invalid_argument when `queue` cannot name a queue: empty, or holding '{' or '}'.
/// A queue's keys share the hash tag "{<queue>}"; a brace in a name would end the tag early, and
/// the keys of queue "a}:b" would start with those of queue "a" (a purge of "a" would take them).
/// A name ending in '#' and digits is refused too: that names a shard of a sharded queue.
void check_queue_name(std::string_view queue);

/// A job ready to store: body is the encoded job (see job_codec), group "" for none,
/// id "" to have the backend assign one.
struct encoded_job {
  std::string id;
  std::string group;
  std::string body;
  /// When it may run: at run_at_ms (milliseconds since the epoch, by the backend's clock) if
  /// set, else delay_ms after it is stored. Each is 0 or positive, of 15 digits at most (else
  /// enqueue refuses the batch with errc::bad_due). Until then it waits in the delayed set; a grouped
  /// job joins its group's tail when it is due.
  std::int64_t delay_ms = 0;
  std::int64_t run_at_ms = 0;
  /// For a grouped job, 0 or at least 1: the most jobs its group may hold once it is stored
  /// (the group's pending and running jobs, and the batch's for it, due now or later; jobs of
  /// earlier batches that wait for their due time count once they join). A job over it refuses
  /// the batch with errc::group_full, before anything is stored. 0: no limit.
  std::int64_t max_group_size = 0;
};

struct enqueue_result {
  std::string id;
  bool duplicate = false;  ///< the id was taken (job_spec::id): nothing stored
};

/// What backend::enqueue_in_shard did.
struct shard_enqueued {
  std::vector<enqueue_result> results;  ///< enqueue's
  bool marked = false;                  ///< the shard was marked in the same call, if a job due now was stored
};

/// A stored job as a backend hands it out: its record (docs/PROTOCOL.md) split into its parts.
struct job_record {
  std::string id;             ///< "" when the record has none
  std::int64_t attempts = 0;  ///< attempts counted before this run (failed runs, expired leases)
  std::string body;           ///< the encoded job, a JSON object (see job_codec)
  /// Why the record could not be split, when it could not (a producer elsewhere wrote it wrong;
  /// id and body then hold what could be read): the worker dead-letters the job with this.
  std::string malformed;
};

/// A job a worker holds under a lease.
struct claimed_job {
  std::string token;  ///< names the lease in finish/extend/release
  std::int64_t fence = 0;
  std::string group;  ///< "" when ungrouped
  job_record job;
  /// A grouped job's followers in its group, handed over under the same lease (claim_options::
  /// ahead): the worker may run them one after another with no claim in between, each job but
  /// the last finished with finish_kind::keep, and each started only once its predecessor's
  /// keep has landed (order). The i-th one's fence is fence + 1 + i.
  /// They stay in the group's list until finished, so a lease that expires sends them back.
  std::vector<job_record> ahead;
};

/// The most jobs one claim leases: a larger claim_options::max is taken as this.
inline constexpr std::size_t max_claim = 1000;
/// The most followers one lease carries: a larger claim_options::ahead or finish_item::ahead is
/// taken as this (so a script reads a bounded part of a group).
inline constexpr std::size_t max_ahead = 999;

struct claim_options {
  std::string worker;
  std::size_t max = 1;  ///< 0: nothing is leased, claim_wait does not wait
  std::chrono::milliseconds lease_ttl{30000};
  std::size_t ahead = 0;  ///< followers of a grouped job to hand over with it, at most
  /// The queue's rate limit (worker_options::rate_limit): the claim leases no more jobs than
  /// the starts left in the window (and no followers: each would be a start); with none left it
  /// leases nothing and throws rate_limited. A lease that never starts (finish_kind::release,
  /// hand_back, release()) gives its start back. check_rate_limit's bounds
  /// (std::invalid_argument); not on a sharded queue (std::invalid_argument).
  std::optional<rate_limit> rate{};
};

/// Thrown by claim and claim_wait when the queue's rate limit (claim_options::rate) lets no job
/// start now; nothing was leased, and what a blocking claim had moved went back to the head of
/// the ready list. retry_after(): when a start may.
class rate_limited : public std::runtime_error {
 public:
  explicit rate_limited(std::chrono::milliseconds retry_after)
      : std::runtime_error("the queue's rate limit lets no job start now"), retry_after_(retry_after) {}
  std::chrono::milliseconds retry_after() const noexcept { return retry_after_; }

 private:
  std::chrono::milliseconds retry_after_;
};

/// How a leased job ends this run.
enum class finish_kind {
  ack,        ///< done
  keep,       ///< done, and the worker runs the job's follower under the same lease (claimed_job::
              ///< ahead): the job leaves its group, the lease goes on (ungrouped: as ack)
  fail,       ///< dead-lettered with `error`; a grouped job's group goes on (to the ready list's tail)
  give_up,    ///< dead-lettered with `error` without a run (its earlier leases expired, it is
              ///< malformed, no worker could run its type): as fail, but the group, which has
              ///< waited already, keeps its place: to the head of the ready list
  retry,      ///< one more attempt counted; runs again after `delay`, before anything of its group
  defer,      ///< as retry, with no attempt counted (the handler asked to run later)
  halt,       ///< attempt counted; the job stays at its group's head and the group is paused
              ///< until resume() (ungrouped: as fail)
  release,    ///< never started (its lease's local end came first): back to the head of the ready
              ///< list with no attempt counted, and out of the started count, as stop's release()
  hand_back,  ///< never started: this worker has no handler for its type. As defer (back after
              ///< `delay`, before anything of its group, no attempt counted), out of the started
              ///< count and into the unhandled one
  cancel,     ///< its kept job was cancelled (backend::cancel) while it ran: it leaves as with
              ///< fail, without a dead letter; its entry says cancelled
};

struct finish_item {
  std::string token;
  finish_kind kind = finish_kind::ack;
  /// For a keep: the id of the follower that starts next ("" for a malformed one). The backend
  /// makes that follower its group's head: a job requeued to the head during the burst (see
  /// requeue) went in front of it and goes behind it, so the running job is always the head.
  std::string id;
  std::string unique_id;  ///< the job's id when the producer gave it (forgotten on ack and fail)
  std::string error;      ///< for fail and halt
  /// For ack and keep of a kept job (job::keep): the result its handler gave (JSON), "" none.
  std::string result;
  std::chrono::milliseconds delay{0};  ///< for retry and defer
  /// For a grouped ack or fail: its handler throttled its group (job_context::throttle_group), so
  /// nothing of the group starts for this long (no next job is leased in this call). A group
  /// with no job left waits too: its next job, enqueued meanwhile, starts when this ends.
  std::chrono::milliseconds throttle{0};
  /// For a grouped ack: whether the worker runs the group's next job at once (a burst), leased
  /// to it in the same call instead of the lane going back to the ready list.
  enum class next_policy { no, yes, if_nobody_waits } want_next = next_policy::no;
  std::size_t ahead = 0;  ///< followers to hand over with that next job (claim_options::ahead)
};

struct finish_result {
  bool lease_held = false;  ///< false: the lease was lost; nothing was changed
  std::optional<claimed_job> next;
};

struct reap_options {
  std::size_t max = 100;               ///< leases, workers and dead letters handled per call at most
  std::size_t dead_max_count = 10000;  ///< dead letters kept (oldest removed first); 0: no limit
  std::chrono::milliseconds dead_max_age = std::chrono::hours(24 * 30);  ///< 0: no limit
  /// Of a sharded queue (sharded_backend): 0 reaps every shard. Else the call reaps every shard
  /// only while its process holds the queue's reaper turn, which it takes or keeps for `turn`
  /// (a worker's reaper gives twice its period), and nothing otherwise: one process at a time
  /// reaps the shards, so what that costs does not grow with the workers.
  std::chrono::milliseconds turn{0};
  /// Also removes up to `max` entries of completed kept jobs (job_spec::keep) whose keep ran out
  /// (each finish that completes kept jobs removes some too), and up to `max` group throttles
  /// that ended (job_context::throttle_group). A worker asks once a minute.
  bool drop_kept = false;
};

struct reap_result {
  std::int64_t leases = 0;                   ///< expired leases whose jobs went back to the head of their groups
  std::int64_t workers = 0;                  ///< workers whose heartbeat had expired
  std::int64_t lanes = 0;                    ///< lanes those workers had taken and not started, made ready again
  std::int64_t dead_removed = 0;             ///< dead letters past the retention limits
  std::vector<std::string> recovered_types;  ///< the job type of each recovered job found
};

struct promote_result {
  std::int64_t moved = 0;  ///< due entries moved out of the delayed set
  /// How long until the next entry is due; nullopt when the delayed set is empty.
  std::optional<std::chrono::milliseconds> next_due;
};

struct queue_counts {
  std::int64_t ready_lanes = 0;
  std::int64_t running = 0;
  std::int64_t delayed = 0;  ///< delayed jobs, and groups waiting for a retry, a throttle or their rate limit
  std::int64_t paused = 0;   ///< paused or halted groups
  std::int64_t groups = 0;   ///< groups with jobs (pending or running)
  std::int64_t dead = 0;
  std::int64_t enqueued = 0;
  std::int64_t started = 0;
  std::int64_t completed = 0;
  std::int64_t failed = 0;     ///< dead-lettered
  std::int64_t retried = 0;    ///< runs that failed and will run again
  std::int64_t deferred = 0;   ///< runs that asked to run again later
  std::int64_t unhandled = 0;  ///< jobs handed back by a worker without a handler for their type
  std::int64_t halted = 0;     ///< groups halted by a failure
  std::int64_t recovered = 0;  ///< jobs whose lease expired and that were made ready again
  /// When the job at the head of the ready list (the next to start) was enqueued, in
  /// milliseconds since the epoch; 0 when nothing is ready. Its age is the queue's latency.
  std::int64_t next_enqueued_ms = 0;
};

/// A dead-lettered job.
struct dead_letter {
  /// The key operators use: the job's id, or "<id>#<fence>" when another dead letter already had
  /// that id (a producer-given id enqueued again after it failed) or the record has no id.
  std::string id;
  std::string group;
  std::string record;  ///< as it was when it failed: "<attempts before>|<id>|<body>"
  std::string error;
  std::int64_t at_ms = 0;  ///< when, in milliseconds since the epoch
  /// How often it ran: the failed runs its record's header counts and its last one, except for a
  /// job an operator skipped (`resume_mode::skip`), which did not run again before it came here.
  std::int64_t runs = 0;
};

/// A paused or halted group.
struct paused_group {
  std::string group;
  bool halted = false;  ///< by a failure under the `halt` policy (else paused by an operator)
  std::string error;    ///< the failure that halted it
  std::int64_t at_ms = 0;
};

/// What check() found. On a queue that workers change meanwhile, the figures are as the walk
/// saw them (a job that moved may be counted twice or missed); the problems are confirmed.
struct check_report {
  std::int64_t groups = 0;              ///< groups with jobs
  std::int64_t jobs = 0;                ///< jobs pending, delayed or running
  std::int64_t oldest_enqueued_ms = 0;  ///< the oldest of those jobs' enqueue time; 0: none
  std::int64_t stuck_groups = 0;        ///< groups with jobs that nothing would ever run
  std::int64_t repaired = 0;            ///< problems fixed (with repair)
  std::vector<std::string> problems;    ///< one line each; empty when every invariant holds
  std::int64_t calls = 0;               ///< calls to the store it made, each bounded
};

/// A worker as it last described itself (backend::report_worker), for operators.
struct worker_report {
  std::string id;
  std::string host;
  std::int64_t pid = 0;
  std::int64_t concurrency = 0;
  std::int64_t started_ms = 0;  ///< when it started, in milliseconds since the epoch
  std::int64_t running = 0;     ///< jobs it was running
  struct job {
    std::string id;
    std::string group;  ///< "" when ungrouped
    std::string type;
    std::int64_t since_ms = 0;
  };
  std::vector<job> jobs;   ///< of those, the first max_reported_jobs, longest running first
  std::int64_t at_ms = 0;  ///< when it said so (set by the backend, by its clock)
};
inline constexpr std::size_t max_reported_jobs = 100;

/// A page of a listing; `cursor` continues it ("" when the listing is done).
template <class T>
struct page {
  std::vector<T> items;
  std::string cursor;
};

/// A queue's counts as they were at the start of a minute (backend::record_history).
struct history_point {
  std::int64_t minute_ms = 0;  ///< the minute's start, in milliseconds since the epoch
  queue_counts counts;
};

/// What is known of a group at once, without a walk.
struct group_status {
  std::string group;
  std::int64_t depth = 0;          ///< jobs, pending or running (0: the group has none)
  std::optional<job_record> head;  ///< the job at its head: running, or the next to run
  /// Of a group whose jobs run several at once (job_spec::group_concurrency): how many run now,
  /// out of its list (depth counts them; head is the next to run).
  std::int64_t running = 0;
  std::optional<paused_group> paused;
  bool parked = false;                ///< paused, and its lane out of circulation
  std::int64_t waiting_until_ms = 0;  ///< waiting for a retry's backoff until then; 0: not
};

/// A job enqueued with a keep (job_spec::keep), as the queue's index of such jobs holds it
/// (backend::kept_job_of). A job that runs shows as pending: a worker's report says where it runs.
struct kept_job {
  enum class state {
    pending,  ///< waiting its turn, or running
    delayed,  ///< due later: at_ms (a delayed job, or a failed one waiting for its retry)
    done,     ///< completed at at_ms
    /// cancelled at at_ms (backend::cancel): it will not start; if it was running, its handler
    /// is cancelled (unless it completed first: then done)
    cancelled,
  };
  std::string id;
  state status = state::pending;
  std::int64_t at_ms = 0;
  std::string group;  ///< "" when ungrouped
  /// As last stored: a lease that expired since, or a halted group resumed, changed its attempts
  /// (its group's head has them).
  job_record record;
  std::string result;  ///< done: the result its handler gave (JSON), "" when none
  /// cancelled: whether it has ended (dropped where it would have started, or its run ended).
  /// Until then it waits to be dropped, or it runs and its worker cancels it.
  bool ended = false;
};
std::string_view to_string(kept_job::state s) noexcept;

/// A job a worker holds: the token of the lease it runs (or will run) under, and its id.
struct held_job {
  std::string token;
  std::string id;
};

/// What backend::cancel did.
enum class cancel_outcome {
  cancelled,  ///< it was pending, delayed or running: cancelled now
  already,    ///< it was cancelled before: nothing changed
  done,       ///< it completed: nothing changed
  /// no kept job has this id: it was enqueued without a keep, went to the dead letters, its
  /// keep ran out, or it never was
  not_found,
};
std::string_view to_string(cancel_outcome o) noexcept;

/// A repeatable job as a backend keeps it (see jobrt/scheduler.hpp, which writes and reads it).
struct stored_schedule {
  std::string name;
  std::string spec;          ///< when it fires and what, as the scheduler wrote it (opaque here)
  std::string group;         ///< its jobs' group ("" none): a sharded queue keeps it in that group's shard
  std::int64_t next_ms = 0;  ///< its next firing, in milliseconds since the epoch
};

/// One step of a schedule (backend::fire_schedule).
struct schedule_step {
  stored_schedule was;                ///< as next_schedule gave it: the step is taken only while it is so
  std::vector<std::int64_t> firings;  ///< the firings to enqueue, in ms, oldest first (none: all skipped)
  encoded_job job;                    ///< each firing's job; its id is "<name>@<firing in ms>"
  std::int64_t next_ms = 0;           ///< the schedule's next firing after these
};

/// What backend::fire_schedule did.
struct schedule_fired {
  bool taken = false;                   ///< false: the schedule had changed, or had been stepped by another caller
  std::vector<enqueue_result> results;  ///< one per firing (a duplicate: its id was taken)
  /// The enqueue's refusal (a full group, say), when it refused: the schedule moved on without
  /// these firings.
  std::string refused;
};

/// Which dead letters backend::find_dead returns: all of what is given must hold.
struct dead_filter {
  std::string group;  ///< the group, exactly ("" any)
  std::string type;   ///< the job's type, exactly ("" any)
  std::string text;   ///< found in the error, ignoring case ("" any)
};

enum class resume_mode {
  retry,  ///< the head job runs again (a halted group's with its attempts reset)
  skip,   ///< the head job goes to the dead letters first (only while nothing of the group runs)
};

class backend {
 public:
  virtual ~backend() = default;

  /// Stores jobs, in order. Throws on failure (a batch is one script: it fails before storing
  /// anything unless the server itself fails mid-script, e.g. out of memory); a job it refuses
  /// as boost::system::system_error with errc::bad_job_id, bad_max_attempts or bad_due.
  virtual boost::asio::awaitable<std::vector<enqueue_result>> enqueue(std::string queue,
                                                                      std::vector<encoded_job> jobs) = 0;
  /// The number of shards `queue` is spread over (sharded_backend), 1 for a backend that keeps
  /// none: what a call splits into, each part sent on its own. A producer puts that many batches
  /// in one enqueue, so that each shard's part is still about a batch.
  virtual boost::asio::awaitable<std::size_t> shard_count(std::string queue);
  /// enqueue, for a batch a producer sized by shard_count: each shard's part goes in calls of at
  /// most `per_call` jobs (the producer's batch), one after the other. The default is enqueue
  /// (a backend without shards gets a batch of per_call at most).
  virtual boost::asio::awaitable<std::vector<enqueue_result>> enqueue_parts(std::string queue,
                                                                            std::vector<encoded_job> jobs,
                                                                            std::size_t per_call);
  /// Leases up to opts.max jobs at once; an empty result means nothing is ready.
  virtual boost::asio::awaitable<std::vector<claimed_job>> claim(std::string queue, claim_options opts) = 0;
  /// Like claim, but waits (without polling) up to `wait` for work when nothing is ready.
  virtual boost::asio::awaitable<std::vector<claimed_job>> claim_wait(std::string queue, claim_options opts,
                                                                      std::chrono::milliseconds wait) = 0;
  /// Acks or fails leased jobs, checked against their tokens; results in the same order. A
  /// worker may have several calls on their way at once, never two with one token; a call sent
  /// again after a failure must get the first answer if the first got through.
  virtual boost::asio::awaitable<std::vector<finish_result>> finish(std::string queue, std::string worker,
                                                                    std::vector<finish_item> items,
                                                                    std::chrono::milliseconds lease_ttl) = 0;
  /// Renews leases; true for each that is still held. Also records the worker's heartbeat and
  /// which leases it holds (see expire_own).
  virtual boost::asio::awaitable<std::vector<bool>> extend(std::string queue, std::string worker,
                                                           std::vector<std::string> tokens,
                                                           std::chrono::milliseconds lease_ttl) = 0;
  /// Records that a worker can run jobs of these types, for `ttl` from now (workers say so again
  /// before it runs out). See unrunnable_for.
  virtual boost::asio::awaitable<void> advertise(std::string queue, std::vector<std::string> types,
                                                 std::chrono::milliseconds ttl) = 0;
  /// How long no worker has said it can run `type`: 0 while one can; milliseconds::max() when
  /// none ever did.
  virtual boost::asio::awaitable<std::chrono::milliseconds> unrunnable_for(std::string queue, std::string type) = 0;
  /// For a worker starting under an id that ran before: the leases its previous incarnation held
  /// at its last heartbeat expire at once (the next reap recovers them). Returns how many.
  virtual boost::asio::awaitable<std::int64_t> expire_own(std::string queue, std::string worker) = 0;
  /// Gives back leased jobs that were not started (a stopping worker): they are ready again, at
  /// the head, with no attempt counted.
  virtual boost::asio::awaitable<void> release(std::string queue, std::string worker,
                                               std::vector<std::string> tokens) = 0;
  /// Recovers what crashed or stalled workers held, up to opts.max leases and workers: a lease
  /// past its deadline sends its job back to the head of its group with its attempt counted (its
  /// lane to the head of the ready list); the lanes a worker whose heartbeat expired had taken
  /// but not started are made ready. Also applies the dead letters' retention limits. Atomic and
  /// idempotent.
  virtual boost::asio::awaitable<reap_result> reap(std::string queue, reap_options opts) = 0;
  virtual boost::asio::awaitable<queue_counts> counts(std::string queue) = 0;
  /// counts()' counters alone (enqueued, started, completed, failed, retried, deferred,
  /// unhandled, halted, recovered; groups), the rest 0: one read on Redis. The default is counts().
  virtual boost::asio::awaitable<queue_counts> counters(std::string queue);

  // --- delayed jobs ---

  /// Moves up to `max` due entries of the delayed set to where they belong, oldest first.
  virtual boost::asio::awaitable<promote_result> promote(std::string queue, std::size_t max) = 0;
  /// A number that changes whenever an entry due before all others is added to the queue's
  /// delayed set (by any process, for Redis), and when wake-ups may have been missed (a
  /// reconnect). Read it before promote(), then pass it to wait_delayed().
  virtual std::uint64_t delayed_version(const std::string& queue) = 0;
  /// Waits until `timeout` has passed or delayed_version(queue) != seen (at once if it already
  /// is). Cancellable; never polls.
  virtual boost::asio::awaitable<void> wait_delayed(std::string queue, std::uint64_t seen,
                                                    std::chrono::milliseconds timeout) = 0;
  /// As delayed_version and wait_delayed, for the ends of kept jobs (job_spec::keep): the number
  /// changes whenever one completes or goes to the dead letters (by any process, for Redis), and
  /// when wake-ups may have been missed. Read it, look the job up (kept_job_of), then wait.
  virtual std::uint64_t ended_version(const std::string& queue) = 0;
  /// Returns job `id` as its end left it when that end came after `seen` with the news of it
  /// (on Redis, the message of a completed or cancelled job that is not too large to carry):
  /// then it need not be looked up again. Else none: look.
  virtual boost::asio::awaitable<std::optional<kept_job>> wait_ended(std::string queue, std::string id,
                                                                     std::uint64_t seen,
                                                                     std::chrono::milliseconds timeout) = 0;

  // --- dead letters (`ids` below are their keys, dead_letter::id) ---

  /// Oldest first.
  virtual boost::asio::awaitable<std::vector<dead_letter>> dead_letters(std::string queue, std::size_t offset,
                                                                        std::size_t limit) = 0;
  virtual boost::asio::awaitable<std::optional<dead_letter>> dead_letter_of(std::string queue, std::string id) = 0;
  /// Puts dead-lettered jobs back with their attempts reset: at the tail of their group (or of the
  /// ready list), or at_head: next in their group (after the job at its head; while a worker
  /// runs the group's followers it holds, after those; in front of it when the group runs
  /// several at once, whose running jobs are out of its list) or at the head of the ready list;
  /// several keep the order given.
  /// Returns the keys requeued; a key that is not dead-lettered, or whose job's producer-given
  /// id a pending job has taken meanwhile, stays where it is.
  virtual boost::asio::awaitable<std::vector<std::string>> requeue(std::string queue, std::vector<std::string> ids,
                                                                   bool at_head) = 0;
  /// Removes dead letters (every one when ids is empty); returns how many.
  virtual boost::asio::awaitable<std::int64_t> purge(std::string queue, std::vector<std::string> ids) = 0;

  // --- groups ---

  /// Pauses a group: the job running now finishes (and the followers its worker holds, at most a
  /// burst), nothing more of it starts until resume().
  /// Returns false when it already was paused or halted.
  virtual boost::asio::awaitable<bool> pause(std::string queue, std::string group) = 0;
  /// Returns false when the group was not paused. Throws boost::system::system_error with
  /// errc::group_busy when `skip` is asked while the group's head job runs or waits in the
  /// ready list.
  virtual boost::asio::awaitable<bool> resume(std::string queue, std::string group, resume_mode mode) = 0;
  virtual boost::asio::awaitable<std::vector<paused_group>> paused_groups(std::string queue) = 0;
  /// Removes everything of a queue: its jobs, leases, dead letters, counters, worker records and
  /// any other key under its prefix, but for its fence and id counters (a token or id given out
  /// before is never given out again). Workers still running on it lose their leases. In bounded
  /// steps (SCAN and UNLINK, 1,000 keys a call on Redis). Returns how many keys went (memory: 1
  /// when the queue had state).
  virtual boost::asio::awaitable<std::int64_t> purge_queue(std::string queue) = 0;
  /// Jobs in a group, pending or running (0: the group has none, or never had any).
  virtual boost::asio::awaitable<std::int64_t> group_size(std::string queue, std::string group) = 0;

  // --- operators ---

  /// Verifies the data model's invariants and, with repair, fixes what it finds. Reads the
  /// queue in bounded steps (pages of at most 1,000 entries), so it may run beside workers
  /// without holding the store up; each problem it suspects is confirmed, and repaired, by one
  /// atomic call about that group, job, worker or id (runtime/lua/check_fix.lua). O(the queue's
  /// size) calls in all.
  virtual boost::asio::awaitable<check_report> check(std::string queue, bool repair) = 0;

  // --- for operators' views (the dashboard): each call bounded, whatever the queue's size

  /// Records how a worker describes itself, kept for `ttl` from now (workers say so again before
  /// it runs out; a worker that stops saying so leaves the listing then).
  virtual boost::asio::awaitable<void> report_worker(std::string queue, worker_report report,
                                                     std::chrono::milliseconds ttl) = 0;
  /// Up to `limit` workers that reported and whose report has not run out, from `cursor` ("" to
  /// start). A worker present throughout a walk of every page is listed at least once.
  virtual boost::asio::awaitable<page<worker_report>> workers(std::string queue, std::string cursor,
                                                              std::size_t limit) = 0;
  /// Whether the caller is to record this minute's history point: true for the first caller in
  /// the minute (by the backend's clock) while the minute has none, false for every other (so
  /// that one process a minute counts the queue, not all of them).
  virtual boost::asio::awaitable<bool> claim_history(std::string queue) = 0;
  /// Stores `counts` as this minute's history point unless it has one; points older than a day
  /// go. Returns whether it stored.
  virtual boost::asio::awaitable<bool> record_history(std::string queue, queue_counts counts) = 0;
  /// The history points of the last `span` (at most a day), oldest first.
  virtual boost::asio::awaitable<std::vector<history_point>> history(std::string queue, std::chrono::minutes span) = 0;
  /// About `limit` groups with jobs whose key starts with `prefix`, from `cursor` ("" to start),
  /// in no particular order (on Redis, SCAN steps: the last may bring a few more, up to about
  /// 128 more while few groups run several jobs at once; such groups come after those with jobs
  /// waiting, and one that has both is listed twice). A call reads
  /// a bounded part of the queue, so a page may hold fewer than `limit` groups and still have a
  /// cursor. A group with jobs throughout a walk of every
  /// page is listed at least once.
  virtual boost::asio::awaitable<page<std::string>> groups(std::string queue, std::string prefix, std::string cursor,
                                                           std::size_t limit) = 0;
  virtual boost::asio::awaitable<group_status> group_of(std::string queue, std::string group) = 0;
  /// The job `id`, when it was enqueued with a keep and is pending, delayed, running or completed
  /// less than its keep ago; nullopt otherwise (a dead-lettered one: dead_letter_of). One read.
  virtual boost::asio::awaitable<std::optional<kept_job>> kept_job_of(std::string queue, std::string id) = 0;
  /// Cancels the kept job `id` (job_spec::keep): pending or delayed, it is dropped where it would
  /// be leased and never starts; running, its worker learns of it at its next lease renewal and
  /// cancels its handler (job_context::cancelled()), and the run ends cancelled unless it
  /// completed first (then done). Its entry says cancelled (kept_job_of) from now on, unless
  /// that run completes; those waiting for its end (wait_ended) are woken. One atomic call.
  virtual boost::asio::awaitable<cancel_outcome> cancel(std::string queue, std::string id) = 0;
  /// For each of `jobs` (kept jobs a worker runs, or holds to run next), whether it was
  /// cancelled. One read (a sharded queue: one for each shard whose leases are among them; a
  /// job given with no token is looked for by its id, as kept_job_of does).
  virtual boost::asio::awaitable<std::vector<bool>> cancelled(std::string queue, std::vector<held_job> jobs) = 0;
  /// Dead letters that pass `filter`, newest first, up to `limit`, from `cursor` ("" to start).
  /// A call looks at a bounded number of them, so a page may hold fewer than `limit` and still
  /// have a cursor.
  virtual boost::asio::awaitable<page<dead_letter>> find_dead(std::string queue, dead_filter filter, std::string cursor,
                                                              std::size_t limit) = 0;

  // --- repeatable jobs (jobrt/scheduler.hpp). Each call does bounded work.

  /// Stores `s` under its name, replacing the schedule of that name, and wakes the schedulers
  /// (wait_schedules).
  virtual boost::asio::awaitable<void> put_schedule(std::string queue, stored_schedule s) = 0;
  /// Removes the schedule `name` (its firings already enqueued stay); false when there was none.
  virtual boost::asio::awaitable<bool> remove_schedule(std::string queue, std::string name) = 0;
  /// About `limit` schedules from `cursor` ("" to start), in no particular order; a page may hold
  /// fewer than `limit` and still have a cursor.
  virtual boost::asio::awaitable<page<stored_schedule>> schedules(std::string queue, std::string cursor,
                                                                  std::size_t limit) = 0;
  /// The schedule whose next firing comes first; none when the queue has none.
  virtual boost::asio::awaitable<std::optional<stored_schedule>> next_schedule(std::string queue) = 0;
  /// In one atomic call, when the schedule is still as step.was (its spec and next firing):
  /// enqueues step.job once per firing, due now, with the id "<name>@<firing>", and moves its
  /// next firing to step.next_ms. Otherwise does nothing (taken is false). A refused enqueue
  /// (a full group) still moves the schedule on.
  virtual boost::asio::awaitable<schedule_fired> fire_schedule(std::string queue, schedule_step step) = 0;
  /// Versions of the queue's schedules' wake-ups: put_schedule and remove_schedule move them.
  virtual std::uint64_t schedules_version(const std::string& queue) = 0;
  /// Returns when schedules_version moved from `seen`, or after `timeout`.
  virtual boost::asio::awaitable<void> wait_schedules(std::string queue, std::uint64_t seen,
                                                      std::chrono::milliseconds timeout) = 0;

  // --- for sharded queues (sharded_backend keeps a queue's shards, and what finds them work, in
  // this backend). The defaults throw std::logic_error: a backend without them holds no shards.

  /// The number of shards stored for `queue`. When none is, stores `wanted` and returns it
  /// (wanted 0: stores nothing, returns 0). Once stored, shard k's queue is "<queue>#<k>", and
  /// the ids it assigns are n * shards + k (unique across the queue's shards).
  virtual boost::asio::awaitable<std::size_t> stored_shards(std::string queue, std::size_t wanted);
  /// Marks shards of `queue` as ones that may have ready work (a set: marking twice is marking
  /// once; the oldest mark is taken first).
  virtual boost::asio::awaitable<void> mark_shards(std::string queue, std::vector<std::size_t> shards);
  /// finish, for a part of a caller's batch (a shard's): the calls it makes are not counted as
  /// answered (whose records a later call may drop) until finish_answered is given them, once
  /// the whole batch got through; a batch sent again after a failure in another part must find
  /// them. Their names are added to `calls`. The default is finish, and calls stays as it is.
  virtual boost::asio::awaitable<std::vector<finish_result>> finish_part(std::string queue, std::string worker,
                                                                         std::vector<finish_item> items,
                                                                         std::chrono::milliseconds lease_ttl,
                                                                         std::vector<std::string>& calls);
  /// Counts finish_part's calls as answered.
  virtual void finish_answered(const std::string& queue, const std::string& worker, std::vector<std::string> calls);
  /// Stores `jobs` in shard `shard` of `queue` (its queue "<queue>#<shard>", as enqueue would)
  /// and, where the backend can do both in one call, marks that shard when a job due now was
  /// stored. The default only enqueues: the caller marks.
  virtual boost::asio::awaitable<shard_enqueued> enqueue_in_shard(std::string queue, std::size_t shard,
                                                                  std::vector<encoded_job> jobs);
  /// Takes the oldest mark, waiting up to `wait` for one (without polling); nullopt when none
  /// came. `worker` names the waiter (on Redis, the blocking connection it waits on). A mark
  /// taken as the caller is cancelled still comes back: the caller marks it again.
  virtual boost::asio::awaitable<std::optional<std::size_t>> take_shard_mark(std::string queue, std::string worker,
                                                                             std::chrono::milliseconds wait);
  /// Whether `queue` has ready lanes: the backstop for a mark lost on its way.
  virtual boost::asio::awaitable<bool> has_ready(std::string queue);
  /// Notes until when a process holds leases in shards of `queue`: entries of '<shard>|<holder>'
  /// and a time in ms since the epoch (by the caller's clock), each kept at the later of its old
  /// and new time.
  virtual boost::asio::awaitable<void> note_leases(std::string queue,
                                                   std::vector<std::pair<std::string, std::int64_t>> until);
  /// Takes or keeps `queue`'s reaping turn for `ttl`: nullopt while another holder has it; else
  /// the entries noted (note_leases) whose time is at most `now_ms`, taken out.
  virtual boost::asio::awaitable<std::optional<std::vector<std::string>>> take_reap_turn(std::string queue,
                                                                                         std::string holder,
                                                                                         std::chrono::milliseconds ttl,
                                                                                         std::int64_t now_ms);
};

}  // namespace jobrt
