// Enqueueing jobs.
#pragma once

#include <jobrt/backend.hpp>
#include <jobrt/grouping.hpp>
#include <jobrt/job.hpp>

#include <boost/asio/awaitable.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace jobrt {

struct producer_options {
  /// Largest encoded job body accepted (payload included).
  std::size_t max_body_bytes = 1 << 20;
  /// Jobs per backend call in enqueue_bulk (one round trip each).
  std::size_t batch = 1000;
  /// Decides the group of jobs that carry none.
  grouping_rules rules;
};

/// Puts jobs on one queue. Cheap to copy; the backend must outlive it. Thread-safe.
class producer {
 public:
  producer(backend& b, std::string queue, producer_options opts = {});

  /// Enqueues one job. Throws std::invalid_argument (naming the field) for a bad job, with
  /// nothing stored; backend errors propagate as exceptions.
  boost::asio::awaitable<enqueue_result> enqueue(job_spec spec);
  /// Enqueues many, in order, in batches of options().batch. Every job is checked before any is
  /// stored: one bad job refuses the whole call.
  boost::asio::awaitable<std::vector<enqueue_result>> enqueue_bulk(std::vector<job_spec> specs);

  /// Parses a payload given as text; throws std::invalid_argument when it is not JSON.
  static boost::json::value parse_payload(std::string_view text);
  /// Throws std::invalid_argument (naming the field) for what enqueue refuses in a job before
  /// it is encoded: an empty type or group, a bad id, attempts, timeout, delay or backoff.
  static void check(const job_spec& spec);

  const std::string& queue() const noexcept { return queue_; }
  const producer_options& options() const noexcept { return opts_; }

 private:
  encoded_job encode(const job_spec& spec, std::int64_t now_ms) const;

  backend* backend_;
  std::string queue_;
  producer_options opts_;
};

}  // namespace jobrt
