// Jobs as producers describe them and as handlers see them.
#pragma once

#include <boost/json/value.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace jobrt {

/// What a producer enqueues.
struct job_spec {
  /// The handler's name. Required.
  std::string type;
  /// Any JSON value.
  boost::json::value payload;
  /// Jobs of one group run one at a time, in enqueue order. When absent, the producer's grouping
  /// rules may give the job a group; when they do not, the job takes the ungrouped fast path.
  std::optional<std::string> group;
  /// Optional. Enqueueing the same id again while the job is pending or running does nothing.
  std::string id;
  /// How many times it may start (a lease that expired counts) before it is dead-lettered.
  int max_attempts = 3;
  /// The handler's time limit; 0: none.
  std::chrono::milliseconds timeout{0};
};

/// A claimed job, as its handler sees it.
struct job {
  std::string id;
  std::string type;
  std::string group;  ///< empty: ungrouped
  boost::json::value payload;
  int attempt = 1;  ///< 1 for the first run
  int max_attempts = 1;
  std::chrono::milliseconds timeout{0};
  std::int64_t enqueued_at_ms = 0;  ///< milliseconds since the epoch
  bool unique_id = false;           ///< the producer gave the id
};

}  // namespace jobrt
