// One queue's state and every operation on it, each as its Lua script does it (runtime/lua/),
// with no I/O, no lock and no waiting. memory_backend is this model plus a mutex and the waiters
// of claim_wait; the differential test (tests/conformance/differential_test.cpp) drives it and
// Redis with the same operations and compares them.
#pragma once

#include <jobrt/backend.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace jobrt::detail {

class queue_model {
 public:
  /// Milliseconds since the epoch: the clock lease deadlines and due times are read from (as the
  /// scripts read the server's TIME).
  using clock = std::int64_t (*)();
  static std::int64_t system_now();

  explicit queue_model(clock now = system_now);
  ~queue_model();
  queue_model(queue_model&&) noexcept;
  queue_model& operator=(queue_model&&) noexcept;

  /// What the operations since the last call ask of the queue's waiters: how many lanes they
  /// made ready (as many waiting claims to wake), and whether an entry now due before every
  /// other delayed one was added (the promoters to wake, as the scripts' PUBLISH).
  struct effects {
    std::size_t made_ready = 0;
    bool earlier_due = false;
    bool kept_ended = false;         ///< a kept job completed or went to the dead letters (finish.lua's PUBLISH)
    bool schedules_changed = false;  ///< a schedule was put or removed (the schedulers to wake)
  };
  effects take_effects() noexcept;
  bool has_ready() const noexcept;

  // The backend's operations on this queue (see backend.hpp); refusals throw
  // boost::system::system_error with a jobrt::errc before anything changes.
  std::vector<enqueue_result> enqueue(std::vector<encoded_job> jobs);
  std::vector<claimed_job> claim(const claim_options& opts);
  std::vector<finish_result> finish(std::vector<finish_item> items, std::chrono::milliseconds lease_ttl);
  std::vector<bool> extend(const std::string& worker, std::vector<std::string> tokens,
                           std::chrono::milliseconds lease_ttl);
  void advertise(std::vector<std::string> types, std::chrono::milliseconds ttl);
  std::chrono::milliseconds unrunnable_for(const std::string& type) const;
  std::int64_t expire_own(const std::string& worker);
  void release(const std::string& worker, std::vector<std::string> tokens);
  reap_result reap(reap_options opts);
  queue_counts counts() const;
  promote_result promote(std::size_t max);
  std::vector<dead_letter> dead_letters(std::size_t offset, std::size_t limit) const;
  std::optional<dead_letter> dead_letter_of(const std::string& id) const;
  std::vector<std::string> requeue(std::vector<std::string> ids, bool at_head);
  std::int64_t purge(std::vector<std::string> ids);
  bool pause(const std::string& group);
  bool resume(const std::string& group, resume_mode mode);
  std::vector<paused_group> paused_groups() const;
  /// Empties the queue but for its fence and id counters.
  void purge_queue();
  std::int64_t group_size(const std::string& group) const;
  check_report check(bool repair);
  // The operators' views (reports.lua, history.lua, and the reads of redis_backend).
  void report_worker(worker_report r, std::chrono::milliseconds ttl);
  page<worker_report> workers(const std::string& cursor, std::size_t limit) const;
  bool claim_history();
  bool record_history(const queue_counts& c);
  std::vector<history_point> history(std::chrono::minutes span) const;
  page<std::string> groups(const std::string& prefix, const std::string& cursor, std::size_t limit) const;
  group_status group_of(const std::string& group) const;
  page<dead_letter> find_dead(const dead_filter& filter, const std::string& cursor, std::size_t limit) const;
  std::optional<kept_job> kept_job_of(const std::string& id) const;
  cancel_outcome cancel(const std::string& id);
  std::vector<bool> cancelled(const std::vector<held_job>& jobs) const;
  // Repeatable jobs (schedule_put.lua, schedule_fire.lua). A purge removes them, as on Redis.
  void put_schedule(stored_schedule s);
  bool remove_schedule(const std::string& name);
  page<stored_schedule> schedules(const std::string& cursor, std::size_t limit) const;
  std::optional<stored_schedule> next_schedule() const;
  schedule_fired fire_schedule(const schedule_step& step);
  /// Shard `offset` of a queue of `stride` shards: the ids it assigns are n * stride + offset.
  void assign_ids(std::int64_t stride, std::int64_t offset) noexcept {
    id_stride_ = stride;
    id_offset_ = offset;
  }

 private:
  struct queue_state;
  // One claim.lua call: `stopped` when it stopped at its bound of lanes passed over with room left.
  std::vector<claimed_job> claim_step(const claim_options& opts, bool& stopped);
  // finish.lua's and reap.lua's removal of kept jobs' entries that ran out: up to `max`.
  void drop_done(std::int64_t now, std::size_t max);
  // ZADD delayed, and (effects) PUBLISH when the earliest entry is new.
  void delay(std::vector<std::pair<std::int64_t, std::string>> entries);

  clock now_;
  std::unique_ptr<queue_state> s_;
  std::map<std::string, stored_schedule> schedules_;             // by name
  std::set<std::pair<std::int64_t, std::string>> schedule_due_;  // (next firing, name)
  effects effects_;
  std::int64_t id_stride_ = 1, id_offset_ = 0;
};

}  // namespace jobrt::detail
