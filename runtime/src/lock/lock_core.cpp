#include "lock/lock_core.hpp"

#include <jobrt/error.hpp>

#include <fmt/format.h>
#include <boost/asio/async_result.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
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
    }
    return "unknown lock error";
  }
};

const std::string empty_string;

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

}  // namespace

const boost::system::error_category& lock_error_category() noexcept {
  static const lock_category instance;
  return instance;
}

namespace detail {

// How long a service's waiters hold back after it yielded a lock to other services' waiters: time
// for the release's message to reach them and their attempt to reach Redis.
constexpr auto yield_window = std::chrono::milliseconds(3);

struct lock_core::waiter {
  explicit waiter(asio::any_io_executor ex) : timer(std::move(ex)) {}
  asio::steady_timer timer;
  std::string token;
  std::list<waiter*>* list = nullptr;  // in waiters_, while registered
  std::list<waiter*>::iterator pos;
  lock_order order = lock_order::any;
  std::chrono::milliseconds ttl{0};
  bool woken = false;                   // a wake-up not yet used by an attempt
  lock_clock::time_point not_before;    // a woken waiter tries from then on (a yield, see below)
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
    bool granted = false;
    {
      std::lock_guard lock(core.mutex_);
      // A hand-off on its way lands on this token: the release below follows it on the connection.
      granted = w.granted.has_value() || w.handoff_pending;
      if (w.list != nullptr) {
        auto* list = w.list;
        list->erase(w.pos);
        w.list = nullptr;
        if (!done) {
          if (w.woken) core.wake_one_locked(name, *list);
          // One that waits behind this one without having asked (see lock()) asks now.
          for (waiter* other : *list) {
            if (other->attempted || other->woken || other->granted || other->handoff_pending) continue;
            other->woken = true;
            other->not_before = lock_clock::time_point::min();
            other->timer.expires_at(lock_clock::time_point::min());
            break;
          }
        }
        if (list->empty()) {
          core.waiters_.erase(name);
          core.known_until_.erase(name);
          core.yield_until_.erase(name);
        }
      }
    }
    if (!done && (needs_release || granted)) core.release_in_background(name, w.token, order);
  }
};

lock_core::lock_core(asio::any_io_executor ex)
    : ex_(ex), strand_(asio::make_strand(ex)), watchdog_timer_(strand_), random_(std::random_device{}()) {}

lock_core::~lock_core() = default;

void lock_core::start() { asio::co_spawn(strand_, watchdog_loop(weak_from_this()), asio::detached); }

void lock_core::close() {
  if (closed_.exchange(true)) return;
  {
    std::lock_guard lock(held_mutex_);
    held_.clear();
  }
  asio::post(strand_, [self = shared_from_this()] { self->watchdog_timer_.cancel(); });
  on_close();
  wake_all();  // waiters find the service closed
}

std::string lock_core::make_token() {
  std::uint64_t a = 0, b = 0;
  {
    std::lock_guard lock(mutex_);
    a = random_();
    b = random_();
  }
  return fmt::format("{:016x}{:016x}", a, b);
}

void lock_core::wake_one_locked(const std::string& name, std::list<waiter*>& list) {
  // After yielding the lock to other services, this one's waiter tries only when their waiters
  // have had the time to take it.
  auto at = lock_clock::time_point::min();
  if (auto y = yield_until_.find(name); y != yield_until_.end()) {
    if (y->second > lock_clock::now())
      at = y->second;
    else
      yield_until_.erase(y);
  }
  for (waiter* w : list) {
    if (w->woken || w->granted || w->handoff_pending) continue;  // already has a chance to use
    w->woken = true;
    w->not_before = at;
    // Unlike cancel(), this also covers a waiter between its attempt and its wait: that wait then
    // completes at once.
    w->timer.expires_at(lock_clock::time_point::min());
    return;
  }
}

void lock_core::wake(const std::string& name) {
  std::lock_guard lock(mutex_);
  if (auto it = waiters_.find(name); it != waiters_.end()) wake_one_locked(name, it->second);
}

void lock_core::grant(const std::string& name, const std::string& token, std::int64_t fence) {
  std::lock_guard lock(mutex_);
  auto it = waiters_.find(name);
  if (it == waiters_.end()) return;  // another process' waiter, or one that left (it releases)
  for (waiter* w : it->second) {
    if (w->token != token) continue;
    w->granted = fence;
    w->handoff_pending = false;
    w->timer.expires_at(lock_clock::time_point::min());
    return;
  }
}

void lock_core::wake_all() {
  std::lock_guard lock(mutex_);
  for (auto& [name, list] : waiters_) {
    for (waiter* w : list) {
      w->woken = true;
      w->not_before = lock_clock::time_point::min();
      w->timer.expires_at(lock_clock::time_point::min());
    }
  }
}

asio::awaitable<lock_lease> lock_core::lock(std::shared_ptr<lock_core> self, std::string name, lock_options o,
                                            bool wait) {
  if (name.empty()) throw system_error(lock_error::empty_name, "lock");
  if (o.ttl < 3ms)
    throw system_error(lock_error::invalid_ttl,
                       fmt::format("lock '{}': lock_options::ttl is {} ms", name, o.ttl.count()));
  if (closed_) throw system_error(lock_error::closed, fmt::format("lock '{}'", name));
  auto ex = co_await asio::this_coro::executor;
  auto deadline = lock_clock::now() + std::max(o.wait, 0ms);
  waiter w(ex);
  w.token = make_token();
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
    auto& list = waiters_[name];
    if (o.order == lock_order::any && !list.empty() && list.front()->order == lock_order::any) {
      auto k = known_until_.find(name);
      auto now = lock_clock::now();
      queued_until = k != known_until_.end() && k->second > now ? k->second : now + o.ttl;
    }
    w.pos = list.insert(list.end(), &w);
    w.list = &list;
  }
  waiter_guard guard{*this, w, name, o.order};

  for (;;) {
    auto cs = co_await asio::this_coro::cancellation_state;
    if (cs.cancelled() != asio::cancellation_type::none)
      throw system_error(asio::error::operation_aborted, fmt::format("lock '{}'", name));
    if (closed_) throw system_error(lock_error::closed, fmt::format("lock '{}'", name));

    std::optional<std::int64_t> granted;
    bool skip = false;
    bool held_back = false;
    {
      std::lock_guard lock(mutex_);
      if (w.granted) {
        w.woken = false;
        granted = std::exchange(w.granted, std::nullopt);
      } else if (w.woken && lock_clock::now() < w.not_before) {
        held_back = true;  // woken, but its service yielded the lock to others for a moment
        w.timer.expires_at(w.not_before);
      } else if (queued_until && !w.woken) {
        skip = true;
      } else {
        w.woken = false;
      }
    }
    if (held_back) {
      error_code ec;
      co_await async_wait_locked(mutex_, w.timer, asio::redirect_error(asio::use_awaitable, ec));
      continue;
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
        r = co_await acquire(name, w.token, o, wait, std::max(remaining, 0ms) + 1s, 0ms);
      } catch (const system_error& e) {
        // Never written (no connection): it cannot have taken anything.
        if (e.code() == error::not_connected) guard.needs_release = queue && w.attempted_once;
        failure = std::current_exception();
      }
      if (failure) std::rethrow_exception(failure);
      w.attempted_once = true;
      guard.needs_release = queue;  // a FIFO ticket stays until it is used or taken back
      if (wait && !r.acquired && r.backstop >= 0ms) {
        std::lock_guard lock(mutex_);
        known_until_[name] = lock_clock::now() + r.backstop;
      }
    }

    if (r.acquired) {
      guard.done = true;
      auto s = std::make_shared<lease_state>();
      s->core = self;
      s->name = name;  // the guard still needs it
      s->token = w.token;
      s->fence = r.fence;
      s->opts = o;
      s->holder = ex;
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
    error_code ec;  // operation_aborted when cancelled; the loop's top finds out
    co_await async_wait_locked(mutex_, w.timer, asio::redirect_error(asio::use_awaitable, ec));
  }
}

asio::awaitable<bool> lock_core::unlock(std::shared_ptr<lease_state> s) {
  if (s->released.exchange(true)) co_return false;
  forget(s.get());
  if (closed_) throw system_error(lock_error::closed, fmt::format("unlock '{}'", s->name));
  co_return co_await release_to_next(s->name, s->token, s->opts.order);
}

// In "any" order, a release hands the lock straight to a waiter of this process, in the same
// script call: that waiter holds it when the release's reply arrives, one round trip after the
// unlock() (waking it through pub/sub and letting it try would take two). After 8 hand-offs in
// a row, while a waiter of another service is marked in Redis, the script releases the lock for
// all instead, and this service's waiters hold back for a few milliseconds, so the others get
// it: a service (a process) with a steady supply of local waiters does not starve the rest.
// FIFO order hands off in the script itself.
asio::awaitable<bool> lock_core::release_to_next(std::string name, std::string token, lock_order order) {
  std::optional<local_handoff> next;
  if (order == lock_order::any) {
    std::lock_guard lock(mutex_);
    auto it = waiters_.find(name);
    if (it != waiters_.end()) {
      for (waiter* w : it->second) {
        if (w->order != lock_order::any || w->granted || w->handoff_pending) continue;
        w->handoff_pending = true;
        auto s = streak_.find(name);
        next = local_handoff{w->token, w->ttl, s == streak_.end() ? 0 : s->second};
        // This release may yield: set before it is sent, since its wake-up message may arrive
        // before its reply.
        if (next->streak >= 8) yield_until_[name] = lock_clock::now() + yield_window;
        break;
      }
    }
  }
  release_result r;
  std::exception_ptr failure;
  try {
    r = co_await release(name, token, order, next ? &*next : nullptr);
  } catch (...) {
    failure = std::current_exception();
  }
  {
    std::lock_guard lock(mutex_);
    if (r.handed)
      ++streak_[name];
    else
      streak_.erase(name);
    if (next && next->streak >= 8 && !r.yielded) yield_until_.erase(name);
  }
  if (next) {
    if (r.handed) {
      grant(name, next->token, *r.handed);
    } else {
      // Not handed (yielded, not owned any more, or the call failed): the waiter tries for
      // itself (after the yield). It may have left meanwhile: looked up again by its token.
      std::lock_guard lock(mutex_);
      auto at = r.yielded ? yield_until_[name] : lock_clock::time_point::min();
      if (auto it = waiters_.find(name); it != waiters_.end()) {
        for (waiter* w : it->second) {
          if (w->token != next->token || !w->handoff_pending) continue;
          w->handoff_pending = false;
          w->woken = true;
          w->not_before = at;
          w->timer.expires_at(lock_clock::time_point::min());
        }
      }
    }
  }
  // A FIFO hand-off to a waiter of this service: told now; its message, when it comes, finds it
  // gone or sets the same fence again.
  if (r.fifo_handed) grant(name, r.fifo_handed->first, r.fifo_handed->second);
  if (failure) std::rethrow_exception(failure);
  co_return r.owned;
}

// Registering a lease costs a map insert: the watchdog is poked (a post) only when the lease is
// due before the watchdog's timer, which with one TTL for all is rare (new leases are due last).
void lock_core::hold(const std::shared_ptr<lease_state>& s) {
  bool poke = false;
  {
    std::lock_guard lock(held_mutex_);
    if (closed_) return;
    held_.emplace(s.get(), s);
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
  held_.erase(s);
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
      for (auto it = held_.begin(); it != held_.end();) {
        auto s = it->second.lock();
        if (!s || s->released) {
          it = held_.erase(it);
          continue;
        }
        if (now >= s->valid_until) {  // not renewed in time: someone else may hold it by now
          expired.push_back(std::move(s));
          it = held_.erase(it);
          continue;
        }
        if (s->opts.renewal == lock_renewal::watchdog) {
          if (now + s->opts.ttl / 12 >= s->next_renewal)
            due.push_back(s);
          else
            next = std::min(next, s->next_renewal);
        }
        next = std::min(next, s->valid_until);
        ++it;
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
            held_.erase(s.get());
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

asio::awaitable<bool> lock_lease::unlock() {
  if (!state_) co_return false;
  auto s = state_;
  co_return co_await s->core->unlock(s);
}

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
