// A worker's settings from a JSON file (`jobrt worker --config FILE`, `jobrt enqueue --config`):
// the server, plugins, per-type backoff, and queues with their worker options, grouping rules and
// dead-letter retention. docs/CONFIG.md lists every key with its type, default and range, and has
// a complete example; tests/unit/settings_test.cpp holds that page to this parser.
//
// Only queues[].name and queues[].grouping.rules[].key must be given. A bad file is refused with
// a message naming the field and what is wrong with it; unknown fields are refused too, listing
// the known ones (a typo must not pass silently).
#pragma once

#include <jobrt/bridge.hpp>
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
  /// "shards": how many shards the queue spreads over (sharded_backend); 0 when not given: as
  /// the queue is stored (1 for a new one).
  std::size_t shards = 0;
  /// "max_group_size": producer_options::max_group_size for `jobrt enqueue --config` (0: none).
  std::size_t max_group_size = 0;
  /// "group_rate": producer_options::group_rate for `jobrt enqueue --config` and `jobrt bridge`.
  std::optional<rate_limit> group_rate;
  /// "group_concurrency": producer_options::group_concurrency for `jobrt enqueue --config`,
  /// `jobrt bridge` and `jobrt schedule add`.
  std::size_t group_concurrency = 1;
  /// "group_weight": producer_options::group_weight for `jobrt enqueue --config`, `jobrt bridge`
  /// and `jobrt schedule add`.
  std::size_t group_weight = 1;
  /// "bridge": how `jobrt bridge --config` turns messages into this queue's jobs.
  bridge_mapping bridge;
};

enum class durability : int;  // <jobrt/redis_backend.hpp>

struct settings {
  std::optional<std::string> redis_url;
  std::optional<jobrt::durability> durability;  ///< the config's "durability"
  std::vector<std::string> plugins;
  std::map<std::string, backoff> type_backoffs;  ///< by job type
  std::vector<queue_settings> queues;

  /// Throws std::invalid_argument naming the field ("queues[1].concurrency: ...").
  static settings from_json(const boost::json::value& v);
  /// Reads and parses a file; throws std::invalid_argument naming the file and the field.
  static settings from_file(const std::string& path);
};

}  // namespace jobrt
