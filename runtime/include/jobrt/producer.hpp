// Enqueueing jobs.
#pragma once

#include <jobrt/backend.hpp>
#include <jobrt/grouping.hpp>
#include <jobrt/job.hpp>
#include <jobrt/job_status.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/json/object.hpp>

#include <chrono>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace jobrt {

/// A job in JSON, as `jobrt enqueue --file` reads one per line and a schedule keeps its job:
/// {"type", "payload", "group", "id", "delay_ms", "max_attempts", "timeout_ms", "on_failure",
/// "keep_ms", "max_group_size", "group_rate", "group_concurrency", "group_weight", "priority"}, each optional ("type"
/// is checked at enqueue). Throws std::invalid_argument naming a field that is unknown or of the wrong kind.
job_spec job_spec_from_json(const boost::json::value& v);
/// `s` in that JSON: the fields it sets (not run_at nor retry_backoff, which it has no field for).
boost::json::object to_json(const job_spec& s);

struct producer_options {
  /// Largest encoded job body accepted (payload included).
  std::size_t max_body_bytes = 1 << 20;
  /// Jobs per backend call in enqueue_bulk (one round trip each; on a sharded queue, per shard:
  /// a call carries this many times the shards, and each shard's part goes in calls of at most
  /// this many). 500 keeps each call short also when every job starts a group of its own
  /// (tests/integration/big_queue_test.cpp holds every call under 20 ms).
  std::size_t batch = 500;
  /// Decides the group of jobs that carry none.
  grouping_rules rules;
  /// job_spec::keep for the jobs that give none (0: none kept).
  std::chrono::milliseconds keep{0};
  /// job_spec::max_group_size for the grouped jobs whose job and rule give none (0: no limit).
  std::size_t max_group_size = 0;
  /// job_spec::group_rate for the grouped jobs whose job and rule give none (nullopt: none).
  std::optional<rate_limit> group_rate;
  /// job_spec::group_concurrency for the grouped jobs whose job and rule give none.
  std::size_t group_concurrency = 1;
  /// job_spec::group_weight for the grouped jobs whose job and rule give none.
  std::size_t group_weight = 1;
};

/// enqueue_bulk failed after some of its batches were stored: the first stored() jobs are on the
/// queue (their results in results()); the failed batch may or may not be, in part or whole (a
/// connection lost after the write; on a sharded queue, the shards whose parts got through), the
/// rest were not sent. Thrown nested (std::throw_with_nested) around the
/// backend's error. Sending the whole call again enqueues the stored jobs twice, unless they
/// have ids of their own.
class partial_enqueue : public std::runtime_error {
 public:
  partial_enqueue(const std::string& what, std::vector<enqueue_result> stored)
      : std::runtime_error(what), results_(std::move(stored)) {}
  std::size_t stored() const noexcept { return results_.size(); }
  const std::vector<enqueue_result>& results() const noexcept { return results_; }

 private:
  std::vector<enqueue_result> results_;
};

/// What producer::enqueue_and_wait did: the job enqueued, and its end (wait's answer).
struct waited_job {
  enqueue_result enqueued;
  std::optional<job_status> end;
};

/// Puts jobs on one queue. Cheap to copy; the backend must outlive it. Thread-safe.
class producer {
 public:
  producer(backend& b, std::string queue, producer_options opts = {});

  /// Enqueues one job. Throws std::invalid_argument (naming the field) for a bad job, with
  /// nothing stored; backend errors propagate as exceptions.
  boost::asio::awaitable<enqueue_result> enqueue(job_spec spec);
  /// Enqueues many, in order, in batches of options().batch. Every job is checked before any is
  /// stored: one bad job refuses the whole call. A backend error in the first batch propagates
  /// as it is (nothing stored); in a later one, as partial_enqueue. On a sharded queue a batch
  /// (then options().batch times the shards) goes to its shards apart, and a failure in one
  /// leaves the others' parts stored: "nothing stored" and the count of stored jobs then speak of
  /// the batches before the failed one only. Jobs with ids of their own make a retry safe.
  boost::asio::awaitable<std::vector<enqueue_result>> enqueue_bulk(std::vector<job_spec> specs);
  /// Enqueues jobs that encode() made with options(), as enqueue_bulk does (in order, in its
  /// batches, with its errors): for a caller that encodes its jobs to check them (a bridge), so
  /// that each is encoded once.
  boost::asio::awaitable<std::vector<enqueue_result>> enqueue_encoded(std::vector<encoded_job> jobs);
  /// Waits for the end of job `id`, enqueued with a keep (job_spec::keep): see wait_job.
  boost::asio::awaitable<std::optional<job_status>> wait(std::string id, std::chrono::milliseconds timeout);
  /// Enqueues one job and waits for its end, as enqueue then wait do, with one look fewer: the
  /// news of ends is listened for from before the job is stored, so a job with an id of jobrt's
  /// making is not looked up before its end (once the backend listens to the queue's ends: on
  /// Redis after the first wait on it). Without a keep (its own, or options().keep) it is
  /// not waited for, as wait says.
  boost::asio::awaitable<waited_job> enqueue_and_wait(job_spec spec, std::chrono::milliseconds timeout);
  /// Cancels job `id`, enqueued with a keep: see backend::cancel.
  boost::asio::awaitable<cancel_outcome> cancel(std::string id);

  /// Parses a payload given as text; throws std::invalid_argument when it is not JSON.
  static boost::json::value parse_payload(std::string_view text);
  /// Throws std::invalid_argument (naming the field) for what enqueue refuses in a job before
  /// it is encoded: an empty type or group, a bad id, attempts, timeout, delay or backoff.
  static void check(const job_spec& spec);
  /// The same, and what enqueue refuses once the job is encoded with `opts` (its group chosen by
  /// opts.rules): a body over opts.max_body_bytes. Needs no backend, so a caller can check
  /// every job of a batch before storing any.
  static void check(const job_spec& spec, const producer_options& opts);
  /// The job as enqueue hands it to the backend, enqueued at `now_ms` (ms since the epoch), after
  /// the checks above (which throw).
  static encoded_job encode(const job_spec& spec, std::int64_t now_ms, const producer_options& opts);

  const std::string& queue() const noexcept { return queue_; }
  const producer_options& options() const noexcept { return opts_; }

 private:
  backend* backend_;
  std::string queue_;
  producer_options opts_;
};

}  // namespace jobrt
