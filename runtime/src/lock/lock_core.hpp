// What both lock services share: waiting (timers woken by releases, never polling), the
// watchdog, leases and their lost signal. A backend (Redis, memory) supplies the three atomic
// steps (acquire, release, renew) and calls wake()/grant()/wake_all() when it learns of releases.
#pragma once

#include <jobrt/mutex.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace jobrt::detail {

using lock_clock = std::chrono::steady_clock;

struct lease_state : std::enable_shared_from_this<lease_state> {
  lease_state() = default;
  lease_state(const lease_state&) = delete;
  lease_state& operator=(const lease_state&) = delete;
  /// Leaves the core's list of held leases if it is still in it (see lock_core::hold).
  ~lease_state();

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
  std::atomic<bool> in_held{false};    // linked in the core's list of held leases (written under held_mutex_)
  lease_state* held_prev = nullptr;
  lease_state* held_next = nullptr;
};

/// The answer of one acquire attempt.
struct acquire_result {
  bool acquired = false;
  std::int64_t fence = 0;
  /// When not acquired: how long the current holder (or the FIFO head's ticket) may keep it; the
  /// waiter's backstop timer. Negative: unknown (retry at once, or at the wait's end).
  std::chrono::milliseconds backstop{-1};
};

/// Length of an owner token: 128 random bits in hex (lock_core::make_token). A FIFO waiter's
/// token is two of them and its ticket, ":<wait ms>:<ttl ms>", for the Redis queue to read.
inline constexpr std::size_t token_length = 32;
inline constexpr std::size_t max_token_length = 2 * token_length + 2 * 21;

/// A waiter of this process that a release in "any" order may hand the lock to directly.
struct local_handoff {
  local_handoff(std::string_view t, std::chrono::milliseconds waiter_ttl, int s)
      : size(std::min(t.size(), max_token_length)), ttl(waiter_ttl), streak(s) {
    std::copy_n(t.begin(), size, chars.begin());
  }
  /// The waiter's token: a copy (the waiter may leave while the release is on its way), kept
  /// inline rather than in a std::string, which would allocate for every hand-off.
  std::string_view token() const noexcept { return {chars.data(), size}; }

  std::array<char, max_token_length> chars;
  std::size_t size;
  std::chrono::milliseconds ttl;
  int streak = 0;  ///< hand-offs this service made in a row on this lock
};

struct release_result {
  bool owned = false;                  ///< the caller owned the lock (it is released or handed on now)
  std::optional<std::int64_t> handed;  ///< the fence of the local_handoff, when it got the lock
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
  /// lock_lease::unlock: false for an empty or already released lease.
  static boost::asio::awaitable<bool> unlock(std::shared_ptr<lease_state> s);
  /// Starts the watchdog; called once by the service's constructor.
  void start();
  void close();
  bool closed() const noexcept { return closed_.load(); }
  const boost::asio::any_io_executor& get_executor() const noexcept { return ex_; }

  // --- the backend's steps ---
  /// One attempt. `waits`: the caller waits when it fails (not try_lock): in FIFO order it leaves
  /// a ticket valid for its remaining wait, `left`, and a second more (the Redis backend reads the
  /// whole wait from the token instead, see lock_core::lock); in "any" order Redis marks for
  /// `left` that a waiter of this service waits (see lock_release.lua's reservation). `limit`:
  /// the longest the call may take. Throws system_error on failure.
  virtual boost::asio::awaitable<acquire_result> acquire(const std::string& name, const std::string& token,
                                                         const lock_options& o, bool waits,
                                                         std::chrono::milliseconds left,
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
  void wake(std::string_view name);
  /// A FIFO release handed the lock to `token` with `fence`.
  void grant(std::string_view name, std::string_view token, std::int64_t fence);
  /// Every waiter tries again (wake-ups may have been lost: the subscriber reconnected).
  void wake_all();
  /// Every waiter of the locks whose name `which` takes tries again (a subscription of their
  /// wake-ups is in place). `which` runs under the table's mutex.
  void wake_all(const std::function<bool(std::string_view name)>& which);
  /// Every waiter of one lock tries again.
  void wake_waiters(std::string_view name);

 private:
  struct waiter;
  struct waiter_guard;
  // What the service knows of one lock that has waiters in it (or a streak), under mutex_.
  struct lock_entry {
    // Its waiters in arrival order, linked through the waiters themselves.
    waiter* first = nullptr;
    waiter* last = nullptr;
    // Until when its holder may keep it, as the last failed attempt learned (min: unknown).
    lock_clock::time_point known_until = lock_clock::time_point::min();
    // Local hand-offs in a row: bounded, so waiters of other processes get their turn.
    int streak = 0;
  };
  // Heterogeneous lookup: a name from a pub/sub message needs no std::string.
  struct name_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };

  std::string make_token();
  void hold(const std::shared_ptr<lease_state>& s);
  void forget(lease_state* s);
  void unlink_held_locked(lease_state* s) noexcept;
  void mark_lost(const std::shared_ptr<lease_state>& s);
  void wake_one_locked(lock_entry& e);
  bool grant_locked(lock_entry& e, std::string_view token, std::int64_t fence);
  /// Takes `w` out of its lock's list; `done`: it holds the lock (no wake-up to pass on).
  void leave_locked(waiter& w, const std::string& name, bool done);
  static boost::asio::awaitable<void> watchdog_loop(std::weak_ptr<lock_core> weak);
  boost::asio::awaitable<std::optional<lock_clock::time_point>> watchdog_step();
  /// Releases, handing the lock to a waiter of this process when there is one (order any). The
  /// caller keeps `name` and `token` alive until it completes.
  boost::asio::awaitable<bool> release_to_next(const std::string& name, const std::string& token, lock_order order);
  void release_in_background(std::string name, std::string token, lock_order order);
  // release_to_next's steps around the backend's release(): the local waiter to hand the lock to,
  // then the streak, the hand-off's outcome told to that waiter, and a FIFO grant.
  std::optional<local_handoff> pick_next(const std::string& name, lock_order order);
  void after_release(const std::string& name, const std::optional<local_handoff>& next, const release_result& r);

  boost::asio::any_io_executor ex_;
  boost::asio::any_io_executor strand_;  // the watchdog loop and its timer
  boost::asio::steady_timer watchdog_timer_;
  std::atomic<bool> closed_{false};
  std::mutex held_mutex_;  // the list of held leases, armed_, and the leases' renewal times
  // Every held lease of the service, linked through the leases themselves (no allocation per
  // lease); a lease leaves it when released, lost or destroyed.
  lease_state* held_first_ = nullptr;
  lock_clock::time_point armed_ = lock_clock::time_point::max();  // when the watchdog wakes next

  std::mutex mutex_;  // locks_, every waiter's state and timer
  // Per lock with waiters in this service, or a streak of local hand-offs (lock_entry).
  std::unordered_map<std::string, lock_entry, name_hash, std::equal_to<>> locks_;
  std::mt19937_64 random_;  // under mutex_

  friend class jobrt::lock_lease;
  friend struct lease_state;
};

}  // namespace jobrt::detail
