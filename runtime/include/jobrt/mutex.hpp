// The distributed lock: a named mutex shared by coroutines in any number of processes.
//
//   jobrt::redis_lock_service locks(ex, redis::config::from_url(url));   // or memory_lock_service
//   jobrt::mutex stock(locks, "stock:42");
//   auto held = co_await stock.lock();                  // waits up to lock_options::wait
//   co_await update(db, held.fence());                  // pass the fence to your storage
//   co_await held.unlock();                             // or let it go out of scope
//
// Ownership is a random token, never a thread. While held, a watchdog renews the lock every
// ttl/3; when a renewal finds it gone or owned by someone else, the lease is marked lost and its
// cancellation signal fires on the holder's executor. Waiters never poll: a release publishes a
// wake-up that one subscriber per service (per node, on a cluster) hands to the waiting
// coroutines, and a timer at the holder's remaining TTL is the backstop when a holder dies.
// docs/ARCHITECTURE.md has the design.
#pragma once

#include <jobrt/redis/config.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/system/error_code.hpp>

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <type_traits>

namespace jobrt {

/// Errors of the lock (besides jobrt::errc for the connection's failures).
enum class lock_error {
  /// lock() waited lock_options::wait and did not get the lock.
  timeout = 1,
  /// The lock name is empty.
  empty_name,
  /// lock_options::ttl is shorter than 3 ms (the watchdog renews every ttl/3).
  invalid_ttl,
  /// striped_mutex with 0 segments.
  invalid_segments,
  /// The lock service was closed.
  closed,
  /// The lock name starts with '}': the hash tag of its keys, '{<name>}', would be empty, and on a
  /// cluster its keys would hash whole, to different slots.
  brace_first,
};

const boost::system::error_category& lock_error_category() noexcept;

inline boost::system::error_code make_error_code(lock_error e) noexcept {
  return {static_cast<int>(e), lock_error_category()};
}

/// Who gets a lock that is released while several coroutines wait for it.
enum class lock_order {
  /// No order (the default, cheapest): a release hands the lock straight to a waiter of the same
  /// service when there is one, else wakes waiters elsewhere to race for it. After 8 hand-offs in
  /// a row within one service, a waiter of another service that waits gets its turn.
  any,
  /// First come, first served: waiters queue with tickets, and a release hands the lock straight
  /// to the head of the queue (no race, no extra round trip). A ticket is valid for its waiter's
  /// wait: one that a dead process left expires then, and the queue moves on. Every user of one
  /// lock must use the same order.
  fifo,
};

/// What keeps a held lock alive.
enum class lock_renewal {
  /// A watchdog renews it every ttl/3 until it is released (the default).
  watchdog,
  /// Nothing: it expires ttl after it was taken, and the lease reports it lost then.
  none,
};

struct lock_options {
  /// Time to live of the lock in Redis; what a holder that dies keeps it for. At least 3 ms.
  std::chrono::milliseconds ttl{10'000};
  /// How long lock() waits before it fails with lock_error::timeout. try_lock() does not wait.
  std::chrono::milliseconds wait{30'000};
  lock_order order = lock_order::any;
  lock_renewal renewal = lock_renewal::watchdog;
};

namespace detail {
class lock_core;
struct lease_state;
}  // namespace detail

/// A held lock (or, from a failed try_lock, nothing). Move-only. Releasing happens once: by
/// unlock(), or, when that was not called, asynchronously when the lease is destroyed.
class lock_lease {
 public:
  lock_lease() = default;
  lock_lease(lock_lease&&) noexcept = default;
  lock_lease& operator=(lock_lease&& other) noexcept;
  lock_lease(const lock_lease&) = delete;
  lock_lease& operator=(const lock_lease&) = delete;
  /// Releases in the background when unlock() was not called (errors are ignored: the TTL ends
  /// the lock anyway).
  ~lock_lease();

  /// True when it holds (or held) a lock; false for an empty lease (a failed try_lock).
  explicit operator bool() const noexcept { return state_ != nullptr; }
  const std::string& name() const;
  /// The owner token stored in the lock (random, 128 bits in hex; taken by waiting in FIFO order,
  /// 256 bits and the waiter's ticket, ":<wait ms>:<ttl ms>").
  const std::string& token() const;
  /// Larger than the fence of every earlier acquisition of this lock: pass it to your storage
  /// and let it refuse writes with a smaller fence than it has seen.
  std::int64_t fence() const;
  /// True once the lock is known to be lost: a renewal found it gone or owned by another, or it
  /// could not be renewed before its TTL ran out. Thread-safe.
  bool lost() const noexcept;
  /// Emits terminal cancellation, on the executor that took the lock, when the lease is lost.
  /// Bind it to the work the lock guards (asio::bind_cancellation_slot). Not emitted on unlock.
  boost::asio::cancellation_slot cancellation_slot() const;
  /// Releases the lock if this lease still owns it (compare-and-delete in one script) and wakes
  /// the waiters. Returns false when it had been lost (the new owner is left alone). Throws
  /// boost::system::system_error on a connection failure; a second call returns false.
  boost::asio::awaitable<bool> unlock();

  friend std::ostream& operator<<(std::ostream& os, const lock_lease& l);

 private:
  friend class detail::lock_core;
  explicit lock_lease(std::shared_ptr<detail::lease_state> s) : state_(std::move(s)) {}
  void release_in_background() noexcept;
  std::shared_ptr<detail::lease_state> state_;
};

/// Where locks live. Thread-safe: any number of coroutines on any threads may use one service.
/// The service must outlive its leases' unlock() calls; leases destroyed after it do nothing.
/// Releases in the background (a lease destroyed without unlock()) run on the service's
/// executor: keep its io_context running until they are done, as for any pending operation.
class lock_service {
 public:
  virtual ~lock_service();
  lock_service(const lock_service&) = delete;
  lock_service& operator=(const lock_service&) = delete;

  /// Takes the lock, waiting up to o.wait. Throws boost::system::system_error: lock_error::timeout
  /// when the wait ran out, lock_error::empty_name / brace_first / invalid_ttl for bad input, jobrt::errc
  /// codes when Redis cannot be reached (the message says why), operation_aborted when the
  /// awaiting coroutine is cancelled (nothing is left held).
  boost::asio::awaitable<lock_lease> lock(std::string name, lock_options o = {});
  /// Takes the lock if it is free now; an empty lease when it is not. Errors as lock().
  boost::asio::awaitable<lock_lease> try_lock(std::string name, lock_options o = {});

  /// Stops the watchdog and closes connections; later operations fail with lock_error::closed.
  /// Leases still held are lost (lock_lease::lost(), their cancellation slots fire): nothing
  /// renews them, and their locks run out with their TTLs.
  void close();

 protected:
  explicit lock_service(std::shared_ptr<detail::lock_core> core);
  std::shared_ptr<detail::lock_core> core_;
};

struct redis_lock_options {
  /// Keys are <prefix>{<name>} and <prefix>{<name>}:fence (one hash tag per lock: Cluster safe).
  /// Wake-ups go by sharded pub/sub (SPUBLISH; PUBLISH before Redis 7.0) to the channel
  /// <prefix>wake, and on a Redis Cluster to <prefix>wake{<tag>}, where the tag puts the channel
  /// in the lock's slot (one channel per slot, heard at the node serving it).
  std::string prefix = "jobrt:lock:";
  /// The longest a single Redis call may take (the wait of lock() bounds it too). An unreachable
  /// server makes lock() and try_lock() fail after this long.
  std::chrono::milliseconds io_timeout{2'000};
};

/// Locks in Redis: one shared connection and one subscriber connection per service, however many
/// locks and waiters there are (on a Redis Cluster, one of each per node that serves its locks).
class redis_lock_service final : public lock_service {
 public:
  redis_lock_service(boost::asio::any_io_executor ex, redis::config cfg, redis_lock_options o = {});
  /// The same with seeds: one server, or nodes of a Redis Cluster (redis::cluster_seeds). Whether
  /// the server is a cluster is asked of it at the first call; several seeds are a cluster's.
  redis_lock_service(boost::asio::any_io_executor ex, std::vector<redis::config> seeds, redis_lock_options o = {});
  ~redis_lock_service() override;
};

/// Locks in this process (the embedded backend): the same semantics, no Redis.
class memory_lock_service final : public lock_service {
 public:
  explicit memory_lock_service(boost::asio::any_io_executor ex);
  ~memory_lock_service() override;
};

/// One named lock on a service, with its options.
class mutex {
 public:
  mutex(lock_service& s, std::string name, lock_options o = {});
  /// As lock_service::lock / try_lock.
  boost::asio::awaitable<lock_lease> lock() { return service_->lock(name_, opts_); }
  boost::asio::awaitable<lock_lease> try_lock() { return service_->try_lock(name_, opts_); }
  const std::string& name() const noexcept { return name_; }

 private:
  lock_service* service_;
  std::string name_;
  lock_options opts_;
};

/// N locks <name>:0 ... <name>:N-1; a key takes the segment its FNV-1a hash picks (the same in
/// every process and build). Bounds the number of lock keys for an unbounded set of keys, at the
/// cost of keys sharing a segment waiting for each other.
class striped_mutex {
 public:
  /// Throws system_error(lock_error::invalid_segments) for 0 segments, empty_name for "".
  striped_mutex(lock_service& s, std::string name, std::size_t segments, lock_options o = {});
  boost::asio::awaitable<lock_lease> lock(std::string_view key) { return service_->lock(segment_name(key), opts_); }
  boost::asio::awaitable<lock_lease> try_lock(std::string_view key) {
    return service_->try_lock(segment_name(key), opts_);
  }
  std::size_t segment(std::string_view key) const noexcept;
  std::string segment_name(std::string_view key) const;

 private:
  lock_service* service_;
  std::string name_;
  std::size_t segments_;
  lock_options opts_;
};

}  // namespace jobrt

template <>
struct boost::system::is_error_code_enum<jobrt::lock_error> : std::true_type {};
