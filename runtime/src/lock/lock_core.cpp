#include "lock/lock_core.hpp"

#include "strand.hpp"

#include <jobrt/error.hpp>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <ostream>

namespace asio = boost::asio;
using boost::system::error_code;
using boost::system::system_error;
using namespace std::chrono_literals;

namespace jobrt {
namespace {

class lock_category final : public boost::system::error_category {
 public:
  const char* name() const noexcept override { return "jobrt.lock"; }
  std::string message(int ev) const override {
    switch (static_cast<lock_error>(ev)) {
      case lock_error::timeout: return "the lock was not taken within lock_options::wait";
      case lock_error::empty_name: return "the lock name is empty";
      case lock_error::invalid_ttl: return "lock_options::ttl must be at least 3 ms";
      case lock_error::invalid_segments: return "a striped_mutex needs at least one segment";
      case lock_error::closed: return "the lock service is closed";
      case lock_error::brace_first: return "the lock name starts with '}', which leaves its keys' hash tag empty";
    }
    return "unknown lock error";
  }
};

const std::string empty_string;

// The first 8 bytes of a token as a number: a lock's waiters are searched by token (grants, and
// the FIFO hand-off messages every service reads), and for all but the one sought this tells the
// difference without calling memcmp.
std::uint64_t token_key(std::string_view token) noexcept {
  std::uint64_t key = 0;
  if (!token.empty()) std::memcpy(&key, token.data(), std::min(token.size(), sizeof key));
  return key;
}

// Starts the timer's wait while holding `m`: wakers set a waiter's timer (expires_at) under the
// same mutex, since Asio timers are not thread-safe and the waiting coroutine may run on a
// multi-threaded io_context, where no strand would serialise the waker with it.
template <class Token>
auto async_wait_locked(std::mutex& m, asio::steady_timer& timer, Token&& token) {
  return asio::async_initiate<Token, void(error_code)>(
      [&m, &timer](auto handler) {
        std::lock_guard lock(m);
        timer.async_wait(std::move(handler));
      },
      token);
}

// A waiter's wait: a deferred operation, which co_await runs without a coroutine frame of its
// own (use_awaitable allocates one per wait), and its error as a value, not an exception.
constexpr auto wait_token = asio::as_tuple(asio::deferred);

}  // namespace

const boost::system::error_category& lock_error_category() noexcept {
  static const lock_category instance;
  return instance;
}

namespace detail {

struct lock_core::waiter {
  explicit waiter(asio::any_io_executor ex) : timer(std::move(ex)) {}
  asio::steady_timer timer;
  std::string token;
  std::uint64_t token_key = 0;  // token_key(token): compared first when a token is looked up
  lock_entry* entry = nullptr;  // its lock's entry in locks_, while registered
  waiter* prev = nullptr;       // the entry's list
  waiter* next = nullptr;
  lock_order order = lock_order::any;
  std::chrono::milliseconds ttl{0};
  bool woken = false;                   // a wake-up not yet used by an attempt
  bool handoff_pending = false;         // a release in this process is handing the lock to it
  bool attempted = false;               // asked Redis at least once
  bool attempted_once = false;          // and got an answer
  std::optional<std::int64_t> granted;  // a hand-off's fence, not yet taken
};

// However lock() ends (a lease, an empty try_lock, a timeout, an error, a cancellation, or its
// frame destroyed unresumed), the waiter leaves the list. A wake-up it got but did not use goes
// to the next waiter of the lock (one release wakes one waiter per process, and must not be
// lost with a waiter that left). A lock that may have been taken for it (an attempt whose answer
// never came, a FIFO ticket or hand-off) is released in the background: nothing stays held by
// nobody until its TTL.
struct lock_core::waiter_guard {
  lock_core& core;
  waiter& w;
  const std::string& name;
  lock_order order;
  bool needs_release = false;
  bool done = false;  // the caller holds the lock now

  ~waiter_guard() {
    // Left already (it holds the lock, see lock()): only the owner changes w.entry.
    if (done && w.entry == nullptr) return;
    bool granted = false;
    {
      std::lock_guard lock(core.mutex_);
      // A hand-off on its way lands on this token: the release below follows it on the connection.
      granted = w.granted.has_value() || w.handoff_pending;
      core.leave_locked(w, name, done);
    }
    if (!done && (needs_release || granted)) core.release_in_background(name, w.token, order);
  }
};

void lock_core::leave_locked(waiter& w, const std::string& name, bool done) {
  if (w.entry == nullptr) return;
  lock_entry& e = *w.entry;
  (w.prev ? w.prev->next : e.first) = w.next;
  (w.next ? w.next->prev : e.last) = w.prev;
  w.entry = nullptr;
  w.prev = w.next = nullptr;
  if (!done) {
    if (w.woken) wake_one_locked(e);
    // One that waits behind this one without having asked (see lock()) asks now.
    for (waiter* other = e.first; other != nullptr; other = other->next) {
      if (other->attempted || other->woken || other->granted || other->handoff_pending) continue;
      other->woken = true;
      other->timer.expires_at(lock_clock::time_point::min());
      break;
    }
  }
  if (e.first == nullptr) {
    e.known_until = lock_clock::time_point::min();
    if (e.streak == 0) locks_.erase(name);
  }
}

lock_core::lock_core(asio::any_io_executor ex)
    : ex_(ex), strand_(detail::make_strand(ex)), watchdog_timer_(strand_), random_(std::random_device{}()) {}

lock_core::~lock_core() = default;

lease_state::~lease_state() {
  // Usually unlock() or the lease's destructor took it out already; the flag spares the lock then
  // (it is cleared under held_mutex_ by whoever unlinks, who touches the lease no more after).
  if (core && in_held.load(std::memory_order_acquire)) core->forget(this);
}

void lock_core::start() { asio::co_spawn(strand_, watchdog_loop(weak_from_this()), asio::detached); }

void lock_core::close() {
  if (closed_.exchange(true)) return;
  std::vector<std::shared_ptr<lease_state>> dropped;
  {
    std::lock_guard lock(held_mutex_);
    while (held_first_ != nullptr) {
      if (auto s = held_first_->weak_from_this().lock()) dropped.push_back(std::move(s));
      unlink_held_locked(held_first_);
    }
  }
  // Renewed no more: each holder is told its lease is lost (lost(), its cancellation slot), as
  // when one runs out, rather than work on unguarded.
  for (const auto& s : dropped) mark_lost(s);
  asio::post(strand_, [self = shared_from_this()] { self->watchdog_timer_.cancel(); });
  on_close();
  wake_all();  // waiters find the service closed
}

std::string lock_core::make_token() {
  std::uint64_t words[2];
  {
    std::lock_guard lock(mutex_);
    words[0] = random_();
    words[1] = random_();
  }
  // As fmt's "{:016x}{:016x}", a byte (two digits) at a time: one token per lock() call.
  static constexpr auto hex_pairs = [] {
    constexpr std::string_view digits = "0123456789abcdef";
    std::array<char, 512> t{};
    for (std::size_t b = 0; b < 256; ++b) {
      t[2 * b] = digits[b >> 4];
      t[2 * b + 1] = digits[b & 0xf];
    }
    return t;
  }();
  std::string token(token_length, '0');
  char* p = token.data();
  for (std::uint64_t w : words) {
    for (int shift = 56; shift >= 0; shift -= 8, p += 2) {
      std::size_t b = (w >> shift) & 0xff;
      p[0] = hex_pairs[2 * b];
      p[1] = hex_pairs[2 * b + 1];
    }
  }
  return token;
}

void lock_core::wake_one_locked(lock_entry& e) {
  for (waiter* w = e.first; w != nullptr; w = w->next) {
    if (w->woken || w->granted || w->handoff_pending) continue;  // already has a chance to use
    w->woken = true;
    // Unlike cancel(), this also covers a waiter between its attempt and its wait: that wait then
    // completes at once.
    w->timer.expires_at(lock_clock::time_point::min());
    return;
  }
}

void lock_core::wake(std::string_view name) {
  std::lock_guard lock(mutex_);
  if (auto it = locks_.find(name); it != locks_.end()) wake_one_locked(it->second);
}

bool lock_core::grant_locked(lock_entry& e, std::string_view token, std::int64_t fence) {
  const std::uint64_t key = token_key(token);
  for (waiter* w = e.first; w != nullptr; w = w->next) {
    if (w->token_key != key || w->token != token) continue;
    w->granted = fence;
    w->handoff_pending = false;
    w->timer.expires_at(lock_clock::time_point::min());
    return true;
  }
  return false;  // another process' waiter, or one that left (it releases)
}

void lock_core::grant(std::string_view name, std::string_view token, std::int64_t fence) {
  std::lock_guard lock(mutex_);
  if (auto it = locks_.find(name); it != locks_.end()) grant_locked(it->second, token, fence);
}

void lock_core::wake_waiters(std::string_view name) {
  std::lock_guard lock(mutex_);
  auto it = locks_.find(name);
  if (it == locks_.end()) return;
  for (waiter* w = it->second.first; w != nullptr; w = w->next) {
    w->woken = true;
    w->timer.expires_at(lock_clock::time_point::min());
  }
}

void lock_core::wake_all() {
  wake_all([](std::string_view) { return true; });
}

void lock_core::wake_all(const std::function<bool(std::string_view name)>& which) {
  std::lock_guard lock(mutex_);
  for (auto& [name, e] : locks_) {
    if (!which(name)) continue;
    for (waiter* w = e.first; w != nullptr; w = w->next) {
      w->woken = true;
      w->timer.expires_at(lock_clock::time_point::min());
    }
  }
}

asio::awaitable<lock_lease> lock_core::lock(std::shared_ptr<lock_core> self, std::string name, lock_options o,
                                            bool wait) {
  if (name.empty()) throw system_error(lock_error::empty_name, "lock");
  if (name.front() == '}') throw system_error(lock_error::brace_first, fmt::format("lock '{}'", name));
  if (o.ttl < 3ms)
    throw system_error(lock_error::invalid_ttl,
                       fmt::format("lock '{}': lock_options::ttl is {} ms", name, o.ttl.count()));
  if (closed_) throw system_error(lock_error::closed, fmt::format("lock '{}'", name));
  auto ex = co_await asio::this_coro::executor;
  auto deadline = lock_clock::now() + std::max(o.wait, 0ms);
  waiter w(ex);
  w.token = make_token();
  if (wait && o.order == lock_order::fifo) {
    // Its ticket, in the token: the Redis queue keeps nothing else per waiter (lock_acquire.lua).
    // Valid for the whole wait (and a second more) from when it was queued, which a waiter that
    // gives up ends sooner by taking it back; a dead process's ticket runs out by itself. And 128
    // more random bits: over 64 bytes, the token makes Redis keep the queue as a skiplist from
    // its first ticket (a small sorted set of short members is a listpack, O(n) per insert).
    w.token += make_token();
    auto wait_ms = std::min(std::max(o.wait, 0ms), std::chrono::milliseconds(std::int64_t{1} << 50)) + 1s;
    fmt::format_to(std::back_inserter(w.token), ":{}:{}", wait_ms.count(), o.ttl.count());
  }
  w.token_key = token_key(w.token);
  w.order = o.order;
  w.ttl = o.ttl;
  // In "any" order, a waiter that finds others of this service waiting for the lock does not ask
  // Redis first: the lock is surely taken (or about to be, by one of them), its release will
  // hand it to one of them or wake one, and the TTL they learned is the backstop (before any of
  // them learned it: one TTL, the longest a dead holder keeps it). A burst of N waiters costs one
  // failed call instead of N. A waiter that leaves wakes one that never asked, so none sleeps
  // on a lock nobody holds.
  std::optional<lock_clock::time_point> queued_until;
  if (wait) {
    // Registered before the first attempt: a release between the attempt and the wait must wake it.
    std::lock_guard lock(mutex_);
    lock_entry& e = locks_.try_emplace(name).first->second;
    if (o.order == lock_order::any && e.first != nullptr && e.first->order == lock_order::any) {
      auto now = lock_clock::now();
      queued_until = e.known_until > now ? e.known_until : now + o.ttl;
    }
    w.prev = e.last;
    (e.last ? e.last->next : e.first) = &w;
    e.last = &w;
    w.entry = &e;
  }
  waiter_guard guard{*this, w, name, o.order};

  for (;;) {
    auto cs = co_await asio::this_coro::cancellation_state;
    if (cs.cancelled() != asio::cancellation_type::none)
      throw system_error(asio::error::operation_aborted, fmt::format("lock '{}'", name));
    if (closed_) throw system_error(lock_error::closed, fmt::format("lock '{}'", name));

    std::optional<std::int64_t> granted;
    bool skip = false;
    {
      std::lock_guard lock(mutex_);
      if (w.granted) {
        w.woken = false;
        granted = std::exchange(w.granted, std::nullopt);
        // It holds the lock: out of the list now, under this lock rather than another below.
        leave_locked(w, name, true);
      } else if (queued_until && !w.woken) {
        skip = true;
      } else {
        w.woken = false;
      }
    }
    auto attempt_start = lock_clock::now();
    acquire_result r;
    if (skip) {
      r.backstop = std::chrono::ceil<std::chrono::milliseconds>(*queued_until - attempt_start);
      queued_until.reset();
    } else if (granted) {
      r.acquired = true;
      r.fence = *granted;
    } else {
      auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - attempt_start);
      bool queue = wait && o.order == lock_order::fifo;
      // Until an answer comes, the lock may have been taken for us (a connection lost after the
      // call was written): released in the background if this ends here.
      guard.needs_release = true;
      w.attempted = true;
      std::exception_ptr failure;
      try {
        r = co_await acquire(name, w.token, o, wait, std::max(remaining, 0ms), 0ms);
      } catch (const system_error& e) {
        // Never written (no connection): it cannot have taken anything.
        if (e.code() == errc::not_connected) guard.needs_release = queue && w.attempted_once;
        failure = std::current_exception();
      }
      if (failure) std::rethrow_exception(failure);
      w.attempted_once = true;
      guard.needs_release = queue;  // a FIFO ticket stays until it is used or taken back
      if (wait && !r.acquired && r.backstop >= 0ms) {
        std::lock_guard lock(mutex_);
        w.entry->known_until = lock_clock::now() + r.backstop;  // registered: it waits
      }
    }

    if (r.acquired) {
      guard.done = true;
      if (w.entry != nullptr) {  // (only this coroutine changes w.entry)
        // Out of the list now rather than when the guard goes: then nothing here needs the
        // name and the token any more, and the lease takes them over.
        std::lock_guard lock(mutex_);
        leave_locked(w, name, true);
      }
      auto s = std::make_shared<lease_state>();
      s->core = std::move(self);
      s->name = std::move(name);
      s->token = std::move(w.token);
      s->fence = r.fence;
      s->opts = o;
      s->holder = std::move(ex);
      // The TTL counts from when the server set it, which is after attempt_start; a hand-off was
      // set before this waiter heard of it, so take a tenth off.
      s->valid_until = granted ? lock_clock::now() + o.ttl - o.ttl / 10 : attempt_start + o.ttl;
      s->next_renewal = o.renewal == lock_renewal::watchdog ? attempt_start + o.ttl / 3 : lock_clock::time_point::max();
      hold(s);
      co_return lock_lease(std::move(s));
    }
    if (!wait) co_return lock_lease();

    auto now = lock_clock::now();
    if (now >= deadline)
      throw system_error(lock_error::timeout, fmt::format("lock '{}' not taken within {} ms", name, o.wait.count()));
    // The backstop: a holder that dies without releasing publishes nothing; its TTL ends its lock.
    auto until = deadline;
    if (r.backstop >= 0ms) until = std::min(until, now + r.backstop + 1ms);
    {
      std::lock_guard lock(mutex_);
      if (w.woken || w.granted) continue;  // woken while the attempt was on its way (a pending
      // hand-off waits: its grant, or its failure, wakes the timer)
      w.timer.expires_at(until);
    }
    // operation_aborted when cancelled (ignored: the loop's top finds out)
    co_await async_wait_locked(mutex_, w.timer, wait_token);
  }
}

// One coroutine for lock_lease::unlock (which only forwards): `s` keeps the name and token alive
// for release_to_next, which takes them by reference.
asio::awaitable<bool> lock_core::unlock(std::shared_ptr<lease_state> s) {
  if (!s || s->released.exchange(true)) co_return false;
  lock_core& core = *s->core;
  core.forget(s.get());
  if (core.closed_) throw system_error(lock_error::closed, fmt::format("unlock '{}'", s->name));
  // release_to_next's steps, inline: one coroutine frame fewer per unlock.
  auto next = core.pick_next(s->name, s->opts.order);
  release_result r;
  std::exception_ptr failure;
  // The release goes out and its answer is awaited however the caller is cancelled (on a
  // coroutine thread of its own, and without the throw a cancelled caller's co_await makes): cut
  // short, it would leave the lock held until its TTL, the lease already let go.
  auto ex = co_await asio::this_coro::executor;
  bool throws = co_await asio::this_coro::throw_if_cancelled();
  co_await asio::this_coro::throw_if_cancelled(false);
  try {
    r = co_await asio::co_spawn(ex, core.release(s->name, s->token, s->opts.order, next ? &*next : nullptr),
                                asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable));
  } catch (...) {
    failure = std::current_exception();
  }
  co_await asio::this_coro::throw_if_cancelled(throws);
  core.after_release(s->name, next, r);
  // A FIFO release that found the lock not ours (which is also the answer to a release sent
  // again after its first reply was lost) may have handed the lock to a waiter here that no
  // message will tell (see lock_release.lua): this service's waiters ask again. (Not after a
  // failure: while Redis is away they would only fail. Their backstops wake them, and all of
  // them when the subscriber reconnects.)
  if (s->opts.order == lock_order::fifo && !failure && !r.owned) core.wake_waiters(s->name);
  if (failure) std::rethrow_exception(failure);
  co_return r.owned;
}

// In "any" order, a release hands the lock straight to a waiter of this process, in the same
// script call: that waiter holds it when the release's reply arrives, one round trip after the
// unlock() (waking it through pub/sub and letting it try would take two). After 8 hand-offs in
// a row, while a waiter of another service is marked in Redis, the script reserves the lock for
// that service's waiters instead, so a service (a process) with a steady supply of local waiters
// does not starve the rest; this one's waiters find it taken until the other service had it.
// FIFO order hands off in the script itself.
asio::awaitable<bool> lock_core::release_to_next(const std::string& name, const std::string& token, lock_order order) {
  auto next = pick_next(name, order);
  release_result r;
  std::exception_ptr failure;
  try {
    r = co_await release(name, token, order, next ? &*next : nullptr);
  } catch (...) {
    failure = std::current_exception();
  }
  after_release(name, next, r);
  if (failure) std::rethrow_exception(failure);
  co_return r.owned;
}

std::optional<local_handoff> lock_core::pick_next(const std::string& name, lock_order order) {
  std::optional<local_handoff> next;
  std::lock_guard lock(mutex_);
  auto it = locks_.find(name);
  if (it == locks_.end()) return next;
  lock_entry& e = it->second;
  if (order == lock_order::fifo) {
    // Not a hand-off, a hint: the queue's head, which the release hands the lock to, is likely
    // the first waiter here; if it is, the release's reply tells it and nothing is published.
    for (waiter* w = e.first; w != nullptr; w = w->next) {
      if (w->order != lock_order::fifo || w->granted) continue;
      next.emplace(w->token, w->ttl, 0);
      break;
    }
    return next;
  }
  for (waiter* w = e.first; w != nullptr; w = w->next) {
    if (w->order != lock_order::any || w->granted || w->handoff_pending) continue;
    w->handoff_pending = true;
    next.emplace(w->token, w->ttl, e.streak);
    break;
  }
  return next;
}

void lock_core::after_release(const std::string& name, const std::optional<local_handoff>& next,
                              const release_result& r) {
  std::lock_guard lock(mutex_);
  auto it = locks_.find(name);
  if (r.handed) {
    // The streak outlives the waiters (the entry stays while it is not 0), as the next release
    // continues it.
    if (it == locks_.end()) it = locks_.try_emplace(name).first;
    // (Counted up to 8 only: from there on every release looks for another service's waiter.)
    it->second.streak = std::min(it->second.streak + 1, 8);
  }
  if (it == locks_.end()) return;  // no waiter here, no streak to end
  lock_entry& e = it->second;
  if (!r.handed) e.streak = 0;
  if (next) {
    if (r.handed) {
      grant_locked(e, next->token(), *r.handed);
    } else {
      // Not handed (reserved for another service, not owned any more, or the call failed): the
      // waiter tries for itself. It may have left meanwhile: looked up again by its token.
      const std::uint64_t key = token_key(next->token());
      for (waiter* w = e.first; w != nullptr; w = w->next) {
        if (w->token_key != key || w->token != next->token() || !w->handoff_pending) continue;
        w->handoff_pending = false;
        w->woken = true;
        w->timer.expires_at(lock_clock::time_point::min());
      }
    }
  }
  // A FIFO hand-off to a waiter of this service: told now; its message, when it comes, finds it
  // gone or sets the same fence again.
  if (r.fifo_handed) grant_locked(e, r.fifo_handed->first, r.fifo_handed->second);
  if (e.first == nullptr && e.streak == 0) locks_.erase(it);
}

// Registering a lease costs linking it into a list: the watchdog is poked (a post) only when the
// lease is due before the watchdog's timer, which with one TTL for all is rare (new leases are
// due last).
void lock_core::hold(const std::shared_ptr<lease_state>& s) {
  bool poke = false;
  {
    std::lock_guard lock(held_mutex_);
    if (closed_) return;
    s->in_held.store(true, std::memory_order_relaxed);
    s->held_prev = nullptr;
    s->held_next = held_first_;
    if (held_first_ != nullptr) held_first_->held_prev = s.get();
    held_first_ = s.get();
    auto due = std::min(s->next_renewal, s->valid_until);
    if (due < armed_) {
      armed_ = due;
      poke = true;
    }
  }
  if (poke) asio::post(strand_, [self = shared_from_this()] { self->watchdog_timer_.cancel(); });
}

void lock_core::forget(lease_state* s) {
  std::lock_guard lock(held_mutex_);
  unlink_held_locked(s);
}

void lock_core::unlink_held_locked(lease_state* s) noexcept {
  if (!s->in_held.load(std::memory_order_relaxed)) return;
  (s->held_prev ? s->held_prev->held_next : held_first_) = s->held_next;
  if (s->held_next != nullptr) s->held_next->held_prev = s->held_prev;
  s->in_held.store(false, std::memory_order_release);
  s->held_prev = s->held_next = nullptr;
}

void lock_core::mark_lost(const std::shared_ptr<lease_state>& s) {
  if (s->released || s->lost.exchange(true)) return;
  asio::post(s->holder, [s] { s->signal.emit(asio::cancellation_type::terminal); });
}

void lock_core::release_in_background(std::string name, std::string token, lock_order order) {
  if (closed_) return;
  asio::co_spawn(
      ex_,
      [self = shared_from_this(), name = std::move(name), token = std::move(token), order]() -> asio::awaitable<void> {
        try {
          co_await self->release_to_next(name, token, order);
        } catch (const std::exception&) {
          // The lock's TTL (or the FIFO ticket's) ends it anyway.
        }
      },
      asio::detached);
}

// One loop for every lease of the service, on strand_: it sleeps until the earliest renewal or
// expiry, and renews all leases that are due (or nearly: within ttl/12) in one call.
asio::awaitable<void> lock_core::watchdog_loop(std::weak_ptr<lock_core> weak) {
  for (;;) {
    auto self = weak.lock();
    if (!self || self->closed_) co_return;
    auto next = co_await self->watchdog_step();
    if (!next) continue;
    self->watchdog_timer_.expires_at(*next);
    error_code ec;
    co_await start_and_let_go<void(error_code)>(
        self, [](lock_core& c, auto handler) { c.watchdog_timer_.async_wait(std::move(handler)); },
        asio::redirect_error(asio::use_awaitable, ec));
  }
}

// One round of the watchdog: expired leases are lost, due ones renewed. Returns when to wake
// next, or nothing when it renewed (the loop looks at every lease again at once).
asio::awaitable<std::optional<lock_clock::time_point>> lock_core::watchdog_step() {
  {
    auto now = lock_clock::now();
    auto next = lock_clock::time_point::max();
    std::vector<std::shared_ptr<lease_state>> due;
    std::vector<std::shared_ptr<lease_state>> expired;
    {
      std::lock_guard lock(held_mutex_);
      // A lease in the list is alive or being destroyed: its destructor leaves the list under
      // held_mutex_, so this sees it either linked with its members intact or not at all. Only a
      // lease that is due or expired is taken (a shared_ptr), and it is kept past the lock: one
      // dropped here that was the last would run that destructor under held_mutex_.
      for (lease_state* p = held_first_; p != nullptr;) {
        lease_state* following = p->held_next;
        if (p->released) {
          unlink_held_locked(p);
          p = following;
          continue;
        }
        bool is_expired = now >= p->valid_until;  // not renewed in time: another may hold it by now
        bool is_due =
            !is_expired && p->opts.renewal == lock_renewal::watchdog && now + p->opts.ttl / 12 >= p->next_renewal;
        if (is_expired || is_due) {
          auto s = p->weak_from_this().lock();
          if (!s || is_expired) unlink_held_locked(p);
          if (!s) {  // being destroyed
            p = following;
            continue;
          }
          (is_expired ? expired : due).push_back(std::move(s));
          if (is_expired) {
            p = following;
            continue;
          }
        } else if (p->opts.renewal == lock_renewal::watchdog) {
          next = std::min(next, p->next_renewal);
        }
        next = std::min(next, p->valid_until);
        p = following;
      }
      // While renewing, hold() need not poke: the loop looks at every lease again afterwards.
      armed_ = due.empty() ? next : lock_clock::time_point::min();
    }
    for (auto& s : expired) mark_lost(s);

    if (!due.empty()) {
      std::vector<renew_item> items;
      auto limit = std::chrono::milliseconds::max();
      for (auto& s : due) {
        items.push_back({s->name, s->token, s->opts.ttl});
        limit = std::min(limit, std::chrono::duration_cast<std::chrono::milliseconds>(s->valid_until - now));
      }
      std::vector<bool> held;
      std::string failure;
      try {
        held = co_await renew(std::move(items), std::max(limit, 1ms));
      } catch (const std::exception& e) {
        failure = e.what();
      }
      if (!failure.empty())
        fmt::print(stderr, "jobrt lock: renewing {} locks failed: {} (retrying)\n", due.size(), failure);
      std::vector<std::shared_ptr<lease_state>> lost;
      {
        std::lock_guard lock(held_mutex_);
        for (std::size_t i = 0; i < due.size(); ++i) {
          auto& s = due[i];
          if (s->released) continue;
          if (i >= held.size()) {  // failed: again soon, until valid_until says it is lost
            s->next_renewal = lock_clock::now() + std::max(s->opts.ttl / 10, std::chrono::milliseconds(1));
          } else if (held[i]) {
            s->valid_until = now + s->opts.ttl;
            s->next_renewal = now + s->opts.ttl / 3;
          } else {
            lost.push_back(s);
            unlink_held_locked(s.get());
          }
        }
      }
      for (auto& s : lost) mark_lost(s);
      co_return std::nullopt;
    }
    co_return next;
  }
}

}  // namespace detail

// --- lock_lease ---

lock_lease& lock_lease::operator=(lock_lease&& other) noexcept {
  if (this != &other) {
    release_in_background();
    state_ = std::move(other.state_);
  }
  return *this;
}

lock_lease::~lock_lease() { release_in_background(); }

void lock_lease::release_in_background() noexcept {
  if (!state_ || state_->released.exchange(true)) return;
  try {
    state_->core->forget(state_.get());
    state_->core->release_in_background(state_->name, state_->token, state_->opts.order);
  } catch (const std::exception&) {
    // Out of memory: the TTL ends the lock.
  }
}

const std::string& lock_lease::name() const { return state_ ? state_->name : empty_string; }
const std::string& lock_lease::token() const { return state_ ? state_->token : empty_string; }
std::int64_t lock_lease::fence() const { return state_ ? state_->fence : 0; }
bool lock_lease::lost() const noexcept { return state_ && state_->lost.load(); }

asio::cancellation_slot lock_lease::cancellation_slot() const {
  if (!state_) throw std::logic_error("cancellation_slot() of an empty lock_lease");
  return state_->signal.slot();
}

// Not a coroutine itself: one frame fewer per unlock. Still lazy: nothing happens until the
// returned awaitable is awaited.
asio::awaitable<bool> lock_lease::unlock() { return detail::lock_core::unlock(state_); }

std::ostream& operator<<(std::ostream& os, const lock_lease& l) {
  if (!l) return os << "lock_lease{}";
  return os << "lock_lease{" << l.name() << ", fence " << l.fence() << (l.lost() ? ", lost" : "") << "}";
}

// --- lock_service, mutex, striped_mutex ---

lock_service::lock_service(std::shared_ptr<detail::lock_core> core) : core_(std::move(core)) { core_->start(); }

lock_service::~lock_service() {
  if (core_) core_->close();
}

asio::awaitable<lock_lease> lock_service::lock(std::string name, lock_options o) {
  return core_->lock(core_, std::move(name), o, true);
}

asio::awaitable<lock_lease> lock_service::try_lock(std::string name, lock_options o) {
  return core_->lock(core_, std::move(name), o, false);
}

void lock_service::close() { core_->close(); }

mutex::mutex(lock_service& s, std::string name, lock_options o) : service_(&s), name_(std::move(name)), opts_(o) {
  if (name_.empty()) throw system_error(lock_error::empty_name, "mutex");
}

striped_mutex::striped_mutex(lock_service& s, std::string name, std::size_t segments, lock_options o)
    : service_(&s), name_(std::move(name)), segments_(segments), opts_(o) {
  if (name_.empty()) throw system_error(lock_error::empty_name, "striped_mutex");
  if (segments_ == 0) throw system_error(lock_error::invalid_segments, fmt::format("striped_mutex '{}'", name_));
}

std::size_t striped_mutex::segment(std::string_view key) const noexcept {
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a, 64 bits: stable across processes and builds
  for (char c : key) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return static_cast<std::size_t>(h % segments_);
}

std::string striped_mutex::segment_name(std::string_view key) const {
  return fmt::format("{}:{}", name_, segment(key));
}

}  // namespace jobrt
