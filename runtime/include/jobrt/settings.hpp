// A worker's settings from a JSON file (`jobrt worker --config FILE`, `jobrt enqueue --config`):
//
// {
//   "redis": "redis://127.0.0.1:6379",
//   "plugins": ["build/handlers/jobrt_tenant_import.so"],
//   "handlers": {"tenant_import": {"retry": {"initial_ms": 500, "factor": 2, "max_ms": 60000, "jitter": 0.2}}},
//   "queues": [{
//     "name": "imports", "concurrency": 20, "lease_ttl_ms": 5000, "burst": 4, "follow": "after-commit",
//     "on_failure": "hold", "retry": {"initial_ms": 1000},
//     "unhandled_delay_ms": 1000, "unhandled_limit_ms": 900000,
//     "grouping": {"rules": [{"match": {"app": "crm"}, "key": "{entity}:{tenant}", "on_failure": "halt"}]},
//     "dead_letters": {"max_count": 10000, "max_age_ms": 2592000000}
//   }]
// }
//
// Every field but queues[].name is optional. A bad file is refused with a message naming the
// field and what is wrong with it; unknown fields are refused too (a typo must not pass silently).
#pragma once

#include <jobrt/grouping.hpp>
#include <jobrt/job.hpp>
#include <jobrt/worker.hpp>

#include <boost/json/value.hpp>

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace jobrt {

struct queue_settings {
  worker_options worker;  ///< worker.queue is the queue's name
  grouping_rules rules;   ///< for producers of this queue
};

struct settings {
  std::optional<std::string> redis_url;
  std::vector<std::string> plugins;
  std::map<std::string, backoff> type_backoffs;  ///< by job type
  std::vector<queue_settings> queues;

  /// Throws std::invalid_argument naming the field ("queues[1].concurrency: ...").
  static settings from_json(const boost::json::value& v);
  /// Reads and parses a file; throws std::invalid_argument naming the file and the field.
  static settings from_file(const std::string& path);
};

}  // namespace jobrt
