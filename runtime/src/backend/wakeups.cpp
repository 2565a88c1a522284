#include "backend/wakeups.hpp"

#include <boost/asio/async_result.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace jobrt::detail {

namespace asio = boost::asio;

namespace {

// Starts the timer's wait while holding `m` (wakers touch the timer only under it).
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

std::uint64_t wakeups::version(const std::string& name) {
  std::lock_guard lock(mutex_);
  return entries_[name].version;
}

void wakeups::wake_locked(entry& e) {
  ++e.version;
  // Timers are touched only under the mutex: they are not thread-safe, and a waiter's coroutine
  // may run on another thread. Unlike cancel(), an expiry in the past also covers a wait that is
  // about to start.
  for (auto* t : e.waiters) t->expires_at(std::chrono::steady_clock::time_point::min());
}

void wakeups::bump(const std::string& name, std::string_view said) {
  std::lock_guard lock(mutex_);
  auto& e = entries_[name];
  wake_locked(e);
  if (said.empty()) return;
  auto& slot = e.last[e.version % said_kept];
  slot.version = e.version;
  slot.text.assign(said);  // (the slot's buffer is reused)
}

wakeups::heard wakeups::said_since(const std::string& name, std::uint64_t seen, std::string_view key) {
  std::lock_guard lock(mutex_);
  heard out;
  auto found = entries_.find(name);
  if (found == entries_.end()) return out;
  const auto& e = found->second;
  out.version = e.version;
  out.all_kept = e.version - seen <= said_kept;
  for (auto v = e.version; v > seen && e.version - v < said_kept; --v) {
    const auto& slot = e.last[v % said_kept];
    if (slot.version != v) {
      out.all_kept = false;  // (a bump that said nothing)
    } else if (!out.said && slot.text.starts_with(key) &&
               (slot.text.size() == key.size() || slot.text[key.size()] == '|')) {
      out.said = slot.text;
    }
  }
  return out;
}

void wakeups::bump_all() {
  std::lock_guard lock(mutex_);
  for (auto& [name, e] : entries_) wake_locked(e);
}

asio::awaitable<void> wakeups::wait(std::string name, std::uint64_t seen, std::chrono::milliseconds timeout) {
  auto keep = shared_from_this();
  asio::steady_timer timer(co_await asio::this_coro::executor);
  std::list<asio::steady_timer*>::iterator pos;
  {
    std::lock_guard lock(mutex_);
    auto& e = entries_[name];
    if (e.version != seen) co_return;
    timer.expires_after(timeout);
    pos = e.waiters.insert(e.waiters.end(), &timer);
  }
  struct leave {
    wakeups& self;
    const std::string& name;
    std::list<asio::steady_timer*>::iterator pos;
    ~leave() {
      std::lock_guard lock(self.mutex_);
      self.entries_[name].waiters.erase(pos);
    }
  } guard{*this, name, pos};
  boost::system::error_code ec;  // expired, woken or cancelled: the caller looks at the version
  co_await async_wait_locked(mutex_, timer, asio::redirect_error(asio::use_awaitable, ec));
}

}  // namespace jobrt::detail
