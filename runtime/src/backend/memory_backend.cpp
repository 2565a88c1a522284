// A queue_model per queue, a mutex over all of them, and claim_wait's waiters: a waiter sleeps on
// a timer that the operations which make lanes ready cut short (no polling).
#include <jobrt/memory_backend.hpp>

#include "backend/queue_model.hpp"
#include "backend/views.hpp"
#include "backend/wakeups.hpp"

#include <boost/asio/async_result.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <list>
#include <utility>

namespace jobrt {

namespace asio = boost::asio;

namespace {

// Starts the timer's wait while holding `m`. Wakers touch a waiter's timer (expires_at) only
// under that mutex too: Asio timers are not thread-safe, and a strand would not do, since the
// waiting coroutine may run on a plain multi-threaded io_context.
template <class Token>
auto async_wait_locked(std::mutex& m, asio::steady_timer& timer, Token&& token) {
  return asio::async_initiate<Token, void(boost::system::error_code)>(
      [&m, &timer](auto handler) {
        std::lock_guard lock(m);
        timer.async_wait(std::move(handler));
      },
      token);
}

}  // namespace

struct memory_backend::queue_state {
  detail::queue_model model;
  std::list<waiter*> waiters;  // claim_waits asleep, first come first woken
};

struct memory_backend::waiter {
  explicit waiter(asio::any_io_executor ex) : timer(std::move(ex)) {}
  asio::steady_timer timer;
  queue_state* queue = nullptr;  // the queue it waits on
  std::list<waiter*>::iterator pos;
  bool listed = false;  // in queue->waiters
  bool woken = false;   // taken off the list by a waker and not yet back to claim
};

// However claim_wait ends (a result, a cancellation, an exception, or its frame destroyed
// unresumed), the waiter leaves the list; a wake it got but did not use goes to the next waiter,
// or a ready lane could be left behind sleeping waiters.
struct memory_backend::wait_guard {
  memory_backend& self;
  waiter& w;
  ~wait_guard() {
    std::lock_guard lock(self.mutex_);
    if (self.leave_locked(w) && w.queue->model.has_ready()) self.wake_locked(*w.queue, 1);
  }
};

memory_backend::memory_backend(asio::any_io_executor ex)
    : executor_(std::move(ex)),
      delayed_wakeups_(std::make_shared<detail::wakeups>()),
      ended_wakeups_(std::make_shared<detail::wakeups>()),
      mark_wakeups_(std::make_shared<detail::wakeups>()),
      schedule_wakeups_(std::make_shared<detail::wakeups>()) {}

memory_backend::~memory_backend() = default;

memory_backend::queue_state& memory_backend::queue_locked(const std::string& name) {
  auto& q = queues_[name];
  if (!q) q = std::make_unique<queue_state>();
  return *q;
}

void memory_backend::wake_locked(queue_state& q, std::size_t lanes) {
  for (; lanes > 0 && !q.waiters.empty(); --lanes) {
    waiter* w = q.waiters.front();
    q.waiters.pop_front();
    w->listed = false;
    w->woken = true;
    // Unlike cancel(), this also covers a waiter that registered but has not started its wait
    // yet: that wait then completes at once.
    w->timer.expires_at(std::chrono::steady_clock::time_point::min());
  }
}

bool memory_backend::leave_locked(waiter& w) {
  if (w.listed) w.queue->waiters.erase(w.pos);
  w.listed = false;
  return std::exchange(w.woken, false);
}

const memory_backend::queue_state* memory_backend::find_locked(const std::string& name) const {
  auto found = queues_.find(name);
  return found == queues_.end() ? nullptr : found->second.get();
}

void memory_backend::settle_locked(const std::string& queue, queue_state& q) {
  auto e = q.model.take_effects();
  wake_locked(q, e.made_ready);
  if (e.earlier_due) delayed_wakeups_->bump(queue);
  if (e.kept_ended) ended_wakeups_->bump(queue);
  if (e.schedules_changed) schedule_wakeups_->bump(queue);
}

template <class Op>
auto memory_backend::change(const std::string& queue, Op op) {
  std::lock_guard lock(mutex_);
  queue_state& q = queue_locked(queue);
  if constexpr (std::is_void_v<decltype(op(q.model))>) {
    op(q.model);
    settle_locked(queue, q);
  } else {
    auto out = op(q.model);
    settle_locked(queue, q);
    return out;
  }
}

template <class Op, class T>
T memory_backend::read(const std::string& queue, Op op, T fallback) const {
  std::lock_guard lock(mutex_);
  const queue_state* q = find_locked(queue);
  return q ? op(q->model) : fallback;
}

asio::awaitable<std::vector<enqueue_result>> memory_backend::enqueue(std::string queue, std::vector<encoded_job> jobs) {
  co_return change(queue, [&](detail::queue_model& m) { return m.enqueue(std::move(jobs)); });
}

asio::awaitable<std::vector<claimed_job>> memory_backend::claim(std::string queue, claim_options opts) {
  co_return change(queue, [&](detail::queue_model& m) { return m.claim(opts); });
}

asio::awaitable<std::vector<claimed_job>> memory_backend::claim_wait(std::string queue, claim_options opts,
                                                                     std::chrono::milliseconds wait) {
  auto deadline = std::chrono::steady_clock::now() + wait;
  waiter w(co_await asio::this_coro::executor);
  {
    std::lock_guard lock(mutex_);
    w.queue = &queue_locked(queue);
  }
  wait_guard guard{*this, w};
  for (;;) {
    // Checked before every claim, not only after a wait: jobs claimed for a cancelled caller
    // would stay leased to nobody until a reaper took them back.
    auto state = co_await asio::this_coro::cancellation_state;
    if (state.cancelled() != asio::cancellation_type::none) {
      throw boost::system::system_error(asio::error::operation_aborted, "claim_wait");
    }
    std::vector<claimed_job> jobs;
    bool waiting = false, again = false;
    {
      std::lock_guard lock(mutex_);
      queue_state& q = *w.queue;
      bool woken = leave_locked(w);
      try {
        jobs = q.model.claim(opts);
      } catch (const rate_limited&) {  // nothing taken: the wake goes on to a waiter that may use it
        settle_locked(queue, q);
        if (woken && q.model.has_ready()) wake_locked(q, 1);
        throw;
      }
      settle_locked(queue, q);
      // This wake may have stood for more lanes than this claim took.
      if (woken && q.model.has_ready()) wake_locked(q, 1);
      // Nothing, though lanes are ready: again (as on Redis, where BLMOVE returns at once then).
      again = jobs.empty() && opts.max > 0 && q.model.has_ready();
      waiting = jobs.empty() && !again && opts.max > 0 && std::chrono::steady_clock::now() < deadline;
      if (waiting) {
        w.timer.expires_at(deadline);
        w.pos = q.waiters.insert(q.waiters.end(), &w);
        w.listed = true;
      }
    }
    if (again) continue;
    if (!waiting) co_return jobs;

    boost::system::error_code ec;  // operation_aborted when woken too; the loop finds out why
    co_await async_wait_locked(mutex_, w.timer, asio::redirect_error(asio::use_awaitable, ec));
  }
}

asio::awaitable<std::vector<finish_result>> memory_backend::finish(std::string queue, std::string /*worker*/,
                                                                   std::vector<finish_item> items,
                                                                   std::chrono::milliseconds lease_ttl) {
  co_return change(queue, [&](detail::queue_model& m) { return m.finish(std::move(items), lease_ttl); });
}

asio::awaitable<std::vector<bool>> memory_backend::extend(std::string queue, std::string worker,
                                                          std::vector<std::string> tokens,
                                                          std::chrono::milliseconds lease_ttl) {
  co_return change(queue, [&](detail::queue_model& m) { return m.extend(worker, std::move(tokens), lease_ttl); });
}

asio::awaitable<void> memory_backend::advertise(std::string queue, std::vector<std::string> types,
                                                std::chrono::milliseconds ttl) {
  change(queue, [&](detail::queue_model& m) { m.advertise(std::move(types), ttl); });
  co_return;
}

asio::awaitable<std::chrono::milliseconds> memory_backend::unrunnable_for(std::string queue, std::string type) {
  co_return read(
      queue, [&](const detail::queue_model& m) { return m.unrunnable_for(type); }, std::chrono::milliseconds::max());
}

asio::awaitable<std::int64_t> memory_backend::expire_own(std::string queue, std::string worker) {
  co_return change(queue, [&](detail::queue_model& m) { return m.expire_own(worker); });
}

asio::awaitable<void> memory_backend::release(std::string queue, std::string worker, std::vector<std::string> tokens) {
  change(queue, [&](detail::queue_model& m) { m.release(worker, std::move(tokens)); });
  co_return;
}

asio::awaitable<reap_result> memory_backend::reap(std::string queue, reap_options opts) {
  co_return change(queue, [&](detail::queue_model& m) { return m.reap(opts); });
}

asio::awaitable<queue_counts> memory_backend::counts(std::string queue) {
  co_return read(
      queue, [](const detail::queue_model& m) { return m.counts(); }, queue_counts{});
}

asio::awaitable<promote_result> memory_backend::promote(std::string queue, std::size_t max) {
  co_return change(queue, [&](detail::queue_model& m) { return m.promote(max); });
}

std::uint64_t memory_backend::delayed_version(const std::string& queue) { return delayed_wakeups_->version(queue); }

asio::awaitable<void> memory_backend::wait_delayed(std::string queue, std::uint64_t seen,
                                                   std::chrono::milliseconds timeout) {
  co_await delayed_wakeups_->wait(std::move(queue), seen, timeout);
}

std::uint64_t memory_backend::ended_version(const std::string& queue) { return ended_wakeups_->version(queue); }

asio::awaitable<std::optional<kept_job>> memory_backend::wait_ended(std::string queue, std::string, std::uint64_t seen,
                                                                    std::chrono::milliseconds timeout) {
  co_await ended_wakeups_->wait(std::move(queue), seen, timeout);
  co_return std::nullopt;  // (a look is a call in this process)
}

asio::awaitable<void> memory_backend::put_schedule(std::string queue, stored_schedule s) {
  change(queue, [&](detail::queue_model& m) { m.put_schedule(std::move(s)); });
  co_return;
}

asio::awaitable<bool> memory_backend::remove_schedule(std::string queue, std::string name) {
  co_return change(queue, [&](detail::queue_model& m) { return m.remove_schedule(name); });
}

asio::awaitable<page<stored_schedule>> memory_backend::schedules(std::string queue, std::string cursor,
                                                                 std::size_t limit) {
  co_return read(
      queue, [&](const detail::queue_model& m) { return m.schedules(cursor, limit); }, page<stored_schedule>{});
}

asio::awaitable<std::optional<stored_schedule>> memory_backend::next_schedule(std::string queue) {
  co_return read(
      queue, [](const detail::queue_model& m) { return m.next_schedule(); }, std::optional<stored_schedule>{});
}

asio::awaitable<schedule_fired> memory_backend::fire_schedule(std::string queue, schedule_step step) {
  co_return change(queue, [&](detail::queue_model& m) { return m.fire_schedule(step); });
}

std::uint64_t memory_backend::schedules_version(const std::string& queue) { return schedule_wakeups_->version(queue); }

asio::awaitable<void> memory_backend::wait_schedules(std::string queue, std::uint64_t seen,
                                                     std::chrono::milliseconds timeout) {
  co_await schedule_wakeups_->wait(std::move(queue), seen, timeout);
}

asio::awaitable<std::vector<dead_letter>> memory_backend::dead_letters(std::string queue, std::size_t offset,
                                                                       std::size_t limit) {
  co_return read(
      queue, [&](const detail::queue_model& m) { return m.dead_letters(offset, limit); }, std::vector<dead_letter>{});
}

asio::awaitable<std::optional<dead_letter>> memory_backend::dead_letter_of(std::string queue, std::string id) {
  co_return read(
      queue, [&](const detail::queue_model& m) { return m.dead_letter_of(id); }, std::optional<dead_letter>{});
}

asio::awaitable<std::vector<std::string>> memory_backend::requeue(std::string queue, std::vector<std::string> ids,
                                                                  bool at_head) {
  co_return change(queue, [&](detail::queue_model& m) { return m.requeue(std::move(ids), at_head); });
}

asio::awaitable<std::int64_t> memory_backend::purge(std::string queue, std::vector<std::string> ids) {
  co_return change(queue, [&](detail::queue_model& m) { return m.purge(std::move(ids)); });
}

asio::awaitable<bool> memory_backend::pause(std::string queue, std::string group) {
  co_return change(queue, [&](detail::queue_model& m) { return m.pause(group); });
}

asio::awaitable<bool> memory_backend::resume(std::string queue, std::string group, resume_mode mode) {
  co_return change(queue, [&](detail::queue_model& m) { return m.resume(group, mode); });
}

asio::awaitable<std::vector<paused_group>> memory_backend::paused_groups(std::string queue) {
  co_return read(
      queue, [](const detail::queue_model& m) { return m.paused_groups(); }, std::vector<paused_group>{});
}

asio::awaitable<std::int64_t> memory_backend::purge_queue(std::string queue) {
  std::lock_guard lock(mutex_);
  auto found = queues_.find(queue);
  if (found == queues_.end()) co_return 0;
  // Waiting claims keep their pointer to the queue: it is emptied, not erased.
  found->second->model.purge_queue();
  co_return 1;  // (one queue's state: the memory backend has no keys to count)
}

asio::awaitable<std::int64_t> memory_backend::group_size(std::string queue, std::string group) {
  co_return read(
      queue, [&](const detail::queue_model& m) { return m.group_size(group); }, std::int64_t{0});
}

asio::awaitable<void> memory_backend::report_worker(std::string queue, worker_report report,
                                                    std::chrono::milliseconds ttl) {
  change(queue, [&](detail::queue_model& m) { m.report_worker(std::move(report), ttl); });
  co_return;
}

asio::awaitable<page<worker_report>> memory_backend::workers(std::string queue, std::string cursor, std::size_t limit) {
  co_return read(
      queue, [&](const detail::queue_model& m) { return m.workers(cursor, limit); }, page<worker_report>{});
}

asio::awaitable<bool> memory_backend::claim_history(std::string queue) {
  co_return change(queue, [](detail::queue_model& m) { return m.claim_history(); });
}

asio::awaitable<bool> memory_backend::record_history(std::string queue, queue_counts counts) {
  co_return change(queue, [&](detail::queue_model& m) { return m.record_history(counts); });
}

asio::awaitable<std::vector<history_point>> memory_backend::history(std::string queue, std::chrono::minutes span) {
  co_return read(
      queue, [&](const detail::queue_model& m) { return m.history(span); }, std::vector<history_point>{});
}

asio::awaitable<page<std::string>> memory_backend::groups(std::string queue, std::string prefix, std::string cursor,
                                                          std::size_t limit) {
  detail::parse_group_cursor(cursor);  // (refused even for a queue never used)
  co_return read(
      queue, [&](const detail::queue_model& m) { return m.groups(prefix, cursor, limit); }, page<std::string>{});
}

asio::awaitable<group_status> memory_backend::group_of(std::string queue, std::string group) {
  group_status none;
  none.group = group;
  co_return read(
      queue, [&](const detail::queue_model& m) { return m.group_of(group); }, none);
}

asio::awaitable<std::optional<kept_job>> memory_backend::kept_job_of(std::string queue, std::string id) {
  co_return read(
      queue, [&](const detail::queue_model& m) { return m.kept_job_of(id); }, std::optional<kept_job>());
}

asio::awaitable<cancel_outcome> memory_backend::cancel(std::string queue, std::string id) {
  co_return change(queue, [&](detail::queue_model& m) { return m.cancel(id); });
}

asio::awaitable<std::vector<bool>> memory_backend::cancelled(std::string queue, std::vector<held_job> jobs) {
  co_return read(
      queue, [&](const detail::queue_model& m) { return m.cancelled(jobs); }, std::vector<bool>(jobs.size()));
}

asio::awaitable<page<dead_letter>> memory_backend::find_dead(std::string queue, dead_filter filter, std::string cursor,
                                                             std::size_t limit) {
  detail::parse_dead_cursor(cursor);
  co_return read(
      queue, [&](const detail::queue_model& m) { return m.find_dead(filter, cursor, limit); }, page<dead_letter>{});
}

asio::awaitable<check_report> memory_backend::check(std::string queue, bool repair) {
  // The walk and every confirmation at one instant (under the lock): what it finds is so.
  co_return change(queue, [&](detail::queue_model& m) { return m.check(repair); });
}

asio::awaitable<std::size_t> memory_backend::stored_shards(std::string queue, std::size_t wanted) {
  std::lock_guard lock(mutex_);
  auto found = shards_.find(queue);
  if (found == shards_.end()) {
    if (wanted == 0) co_return 0;
    found = shards_.emplace(queue, wanted).first;
  }
  if (found->second > 1) {
    for (std::size_t k = 0; k < found->second; ++k)
      queue_locked(fmt::format("{}#{}", queue, k))
          .model.assign_ids(static_cast<std::int64_t>(found->second), static_cast<std::int64_t>(k));
  }
  co_return found->second;
}

asio::awaitable<void> memory_backend::mark_shards(std::string queue, std::vector<std::size_t> shards) {
  bool added = false;
  {
    std::lock_guard lock(mutex_);
    auto& marks = marks_[queue];
    for (auto shard : shards) {
      if (std::find(marks.begin(), marks.end(), shard) != marks.end()) continue;
      marks.push_back(shard);
      added = true;
    }
  }
  if (added) mark_wakeups_->bump(queue);
  co_return;
}

asio::awaitable<std::optional<std::size_t>> memory_backend::take_shard_mark(std::string queue, std::string /*worker*/,
                                                                            std::chrono::milliseconds wait) {
  auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    auto seen = mark_wakeups_->version(queue);
    {
      std::lock_guard lock(mutex_);
      auto& marks = marks_[queue];
      if (!marks.empty()) {
        auto k = marks.front();
        marks.pop_front();
        co_return k;
      }
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) co_return std::nullopt;
    co_await mark_wakeups_->wait(queue, seen, left);
    auto state = co_await asio::this_coro::cancellation_state;
    if (state.cancelled() != asio::cancellation_type::none)
      throw boost::system::system_error(asio::error::operation_aborted, "take_shard_mark");
  }
}

asio::awaitable<void> memory_backend::note_leases(std::string queue,
                                                  std::vector<std::pair<std::string, std::int64_t>> until) {
  std::lock_guard lock(mutex_);
  auto& leased = reaping_[queue].leased;
  for (auto& [member, at] : until) {
    auto& kept = leased[member];
    kept = std::max(kept, at);
  }
  co_return;
}

asio::awaitable<std::optional<std::vector<std::string>>> memory_backend::take_reap_turn(std::string queue,
                                                                                        std::string holder,
                                                                                        std::chrono::milliseconds ttl,
                                                                                        std::int64_t now_ms) {
  auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mutex_);
  auto& r = reaping_[queue];
  if (r.holder != holder && r.until > now) co_return std::nullopt;
  r.holder = std::move(holder);
  r.until = now + ttl;
  std::vector<std::string> due;
  for (auto it = r.leased.begin(); it != r.leased.end();) {
    if (it->second <= now_ms) {
      due.push_back(it->first);
      it = r.leased.erase(it);
    } else {
      ++it;
    }
  }
  co_return due;
}

asio::awaitable<bool> memory_backend::has_ready(std::string queue) {
  co_return read(
      queue, [](const detail::queue_model& m) { return m.has_ready(); }, false);
}

}  // namespace jobrt
