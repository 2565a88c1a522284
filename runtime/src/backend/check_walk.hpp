// check() in two stages, so that no call to the store is long however big the queue is. A walk
// reads every structure of a queue in bounded pages (on a live queue that is not one instant: a
// lane that moves meanwhile may be seen twice or not at all). analyse() finds what looks wrong in
// what the walk saw. Each suspect is then confirmed, and repaired when asked, by one atomic call
// that looks at that one group, job copy, worker or id (check_fix.lua; the memory backend's
// confirm_*), so a lane that merely moved is neither reported nor "repaired".
#pragma once

#include <jobrt/backend.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace jobrt::detail {

/// Where a copy of a job was seen, and what finds it again.
struct job_place {
  enum class kind { ready, claimed, delayed, lease, group };
  kind where = kind::ready;
  std::string key;     ///< the worker (claimed), the group (group) or a priority's level (ready); else empty
  std::string member;  ///< the lane, delayed member, lease token or record, as read

  /// As problems name it: "ready", "ready:<level>", "claimed:<worker>", "delayed", "a lease", "group <group>".
  std::string describe() const;
  /// A lane's copy (ready, a claimed list, delayed) may be dropped; a group's record or a lease
  /// may not (a running job stays at its group's head).
  bool droppable() const noexcept { return where == kind::ready || where == kind::claimed || where == kind::delayed; }
  /// The name check_fix.lua takes.
  const char* name() const noexcept;
};

/// What a walk read.
struct queue_walk {
  std::vector<std::string> ready;
  std::vector<std::pair<std::string, std::vector<std::string>>> levels;   ///< a priority's level ("2"), its lanes
  std::vector<std::pair<std::string, std::vector<std::string>>> claimed;  ///< worker, lanes
  std::vector<std::string> delayed;                                       ///< members
  std::vector<std::string> active;                                        ///< lease tokens
  std::vector<std::string> parked;
  std::vector<std::string> full;  ///< groups whose lane waits for one of their several runs to end
  /// The runs counted of groups that run several jobs at once (group -> count), as stored.
  std::map<std::string, std::int64_t> running;
  std::unordered_set<std::string> paused;
  std::unordered_set<std::string> workers;
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;  ///< group, records
  std::vector<std::string> ids;
  /// The store's count of groups with jobs, when it has one and nothing changed it while the
  /// walk went on (so that the walk's own count can be compared with it).
  std::optional<std::int64_t> counted_groups;
  std::int64_t calls = 0;  ///< calls to the store the walk made
};

/// A job seen twice.
struct job_copy {
  std::string id;
  job_place first, second;
};

/// What to confirm, in this order (a copy's drop before a dead worker's lanes move to ready).
struct check_suspects {
  std::vector<std::string> groups;  ///< groups whose lanes look wrong, or lanes with no jobs behind them
  std::vector<job_copy> copies;
  std::vector<std::string> dead_workers;    ///< claimed lanes of workers with no heartbeat
  std::vector<std::string> ids;             ///< taken ids with no job seen
  std::optional<std::int64_t> groups_seen;  ///< set when the walk's count of groups differs from the store's
};

/// Finds the suspects; sets report's groups, jobs and oldest_enqueued_ms, and adds the problems
/// that need no confirming (malformed records).
check_suspects analyse(const queue_walk& walk, check_report& report);

/// What one confirmation found.
struct confirmed {
  std::vector<std::string> problems;
  std::int64_t repaired = 0;
  bool stuck = false;  ///< a group with jobs that nothing would ever run
};

/// The walk's taken ids that also had no job in `again` (a second walk: an ungrouped job moves
/// between structures, and a walk may miss it once).
std::vector<std::string> missing_twice(const std::vector<std::string>& ids, const queue_walk& again);

/// check's other problems, as every backend words them.
std::string stuck_problem(const std::string& group, std::int64_t jobs);
std::string lanes_problem(const std::string& group, const std::vector<std::string>& holders);
std::string parked_problem(const std::string& group);
std::string empty_group_problem(const std::string& group, const std::string& where);
std::string copy_problem(const std::string& id, const job_place& first, const job_place& second);
std::string dead_worker_problem(const std::string& worker, std::size_t lanes);
std::string id_problem(const std::string& id);
std::string count_problem(std::int64_t counted, std::int64_t seen);
std::string runs_problem(const std::string& group, std::int64_t counted, std::int64_t leases);

}  // namespace jobrt::detail
