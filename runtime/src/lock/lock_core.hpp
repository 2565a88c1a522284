// What both lock services share: waiting (timers woken by releases, never polling), the
// watchdog, leases and their lost signal. A backend (Redis, memory) supplies the three atomic
// steps (acquire, release, renew) and calls wake()/grant()/wake_all() when it learns of releases.
#pragma once

#include <jobrt/mutex.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include <atomic>
#include <chrono>
#include <list>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

namespace jobrt::detail {

using lock_clock = std::chrono::steady_clock;

struct lease_state {
  std::shared_ptr<lock_core> core;
  std::string name;
  std::string token;
  std::int64_t fence = 0;
  lock_options opts;
  boost::asio::any_io_executor holder;  // where the lost signal is emitted
  boost::asio::cancellation_signal signal;
  std::atomic<bool> lost{false};
  std::atomic<bool> released{false};
  // The watchdog's bookkeeping, under the core's held_mutex_.
  lock_clock::time_point next_renewal;
  lock_clock::time_point valid_until;  // renewed by then, or counted as lost
};

/// The answer of one acquire attempt.
struct acquire_result {
  bool acquired = false;
  std::int64_t fence = 0;
  /// When not acquired: how long the current holder (or the FIFO head's ticket) may keep it; the
  /// waiter's backstop timer. Negative: unknown (retry at once, or at the wait's end).
  std::chrono::milliseconds backstop{-1};
};

/// A waiter of this process that a release in "any" order may hand the lock to directly.
struct local_handoff {
  std::string token;
  std::chrono::milliseconds ttl;
  int streak = 0;  ///< hand-offs this service made in a row on this lock
};

struct release_result {
  bool owned = false;                  ///< the caller owned the lock (it is released or handed on now)
  std::optional<std::int64_t> handed;  ///< the fence of the local_handoff, when it got the lock
  /// Released for all: another service's waiter has waited through a streak.
  bool yielded = false;
  /// FIFO: the queue's head it was handed to, and its fence (it may wait in this service).
  std::optional<std::pair<std::string, std::int64_t>> fifo_handed;
};

struct renew_item {
  std::string name;
  std::string token;
  std::chrono::milliseconds ttl;
};

/// Starts op(*self, handler) and lets go of `self` once it is started. A loop parked in an
/// operation of something its object owns (a timer, a connection) must not keep the object alive
/// that way: the cycle would outlive an io_context stopped before the object's close() ran.
template <class Signature, class T, class Op, class Token>
auto start_and_let_go(std::shared_ptr<T>& self, Op op, Token&& token) {
  return boost::asio::async_initiate<Token, Signature>(
      [&self, op](auto handler) mutable {
        op(*self, std::move(handler));
        self.reset();
      },
      token);
}

class lock_core : public std::enable_shared_from_this<lock_core> {
 public:
  explicit lock_core(boost::asio::any_io_executor ex);
  virtual ~lock_core();
  lock_core(const lock_core&) = delete;
  lock_core& operator=(const lock_core&) = delete;

  /// lock_service::lock (wait = true) and try_lock (wait = false).
  boost::asio::awaitable<lock_lease> lock(std::shared_ptr<lock_core> self, std::string name, lock_options o, bool wait);
  boost::asio::awaitable<bool> unlock(std::shared_ptr<lease_state> s);
  /// Starts the watchdog; called once by the service's constructor.
  void start();
  void close();
  bool closed() const noexcept { return closed_.load(); }
  const boost::asio::any_io_executor& get_executor() const noexcept { return ex_; }

  // --- the backend's steps ---
  /// One attempt. `waits`: the caller waits when it fails (not try_lock): in FIFO order it leaves
  /// a ticket valid for `ticket` (its remaining wait); in "any" order Redis marks that a waiter of
  /// this service waits. `limit`: the longest the call may take. Throws system_error on failure.
  virtual boost::asio::awaitable<acquire_result> acquire(const std::string& name, const std::string& token,
                                                         const lock_options& o, bool waits,
                                                         std::chrono::milliseconds ticket,
                                                         std::chrono::milliseconds limit) = 0;
  /// Compare-and-delete, or hand-off: in FIFO order to the queue's head (a FIFO waiter's ticket
  /// goes too), else to `next` when given. Wakes waiters when the lock becomes free.
  virtual boost::asio::awaitable<release_result> release(const std::string& name, const std::string& token,
                                                         lock_order order, const local_handoff* next) = 0;
  /// Compare-and-pexpire of every item: true = still held (renewed), false = lost.
  virtual boost::asio::awaitable<std::vector<bool>> renew(std::vector<renew_item> items,
                                                          std::chrono::milliseconds limit) = 0;
  virtual void on_close() {}

  /// A lock was released and nobody was handed it: one waiter of this process tries again.
  void wake(const std::string& name);
  /// A FIFO release handed the lock to `token` with `fence`.
  void grant(const std::string& name, const std::string& token, std::int64_t fence);
  /// Every waiter tries again (wake-ups may have been lost: the subscriber reconnected).
  void wake_all();

 private:
  struct waiter;
  struct waiter_guard;

  std::string make_token();
  void hold(const std::shared_ptr<lease_state>& s);
  void forget(lease_state* s);
  void mark_lost(const std::shared_ptr<lease_state>& s);
  void wake_one_locked(const std::string& name, std::list<waiter*>& list);
  static boost::asio::awaitable<void> watchdog_loop(std::weak_ptr<lock_core> weak);
  boost::asio::awaitable<std::optional<lock_clock::time_point>> watchdog_step();
  /// Releases, handing the lock to a waiter of this process when there is one (order any).
  boost::asio::awaitable<bool> release_to_next(std::string name, std::string token, lock_order order);
  void release_in_background(std::string name, std::string token, lock_order order);

  boost::asio::any_io_executor ex_;
  boost::asio::strand<boost::asio::any_io_executor> strand_;  // the watchdog loop and its timer
  boost::asio::steady_timer watchdog_timer_;
  std::atomic<bool> closed_{false};
  std::mutex held_mutex_;  // held_, armed_, and the leases' renewal times
  std::unordered_map<lease_state*, std::weak_ptr<lease_state>> held_;
  lock_clock::time_point armed_ = lock_clock::time_point::max();  // when the watchdog wakes next

  std::mutex mutex_;  // waiters_ and every waiter's timer
  std::unordered_map<std::string, std::list<waiter*>> waiters_;
  // Per lock with waiters: until when its holder may keep it, as the last failed attempt learned.
  std::unordered_map<std::string, lock_clock::time_point> known_until_;
  // Local hand-offs in a row per lock: bounded, so waiters of other processes get their turn.
  std::unordered_map<std::string, int> streak_;
  // Locks this service released for others after a streak: its own waiters hold back until then.
  std::unordered_map<std::string, lock_clock::time_point> yield_until_;
  std::mt19937_64 random_;  // under mutex_

  friend class jobrt::lock_lease;
};

}  // namespace jobrt::detail
