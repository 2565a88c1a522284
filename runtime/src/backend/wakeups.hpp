// Versioned wake-ups by name, for backend::delayed_version and wait_delayed: a waiter reads the
// version, checks its condition, then waits until the version moves or its timeout passes. A
// bump between the read and the wait is not lost: the wait returns at once. A bump may carry what
// its message said: the last few are kept, so a waiter can find its own news there (said_since)
// rather than look again, and can tell when every message since it read the version is kept and
// none is about it (then it waits on).
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace jobrt::detail {

/// Made with make_shared: a wait keeps the object alive (its frame may outlive the backend, when
/// an io_context is destroyed with the wait pending).
class wakeups : public std::enable_shared_from_this<wakeups> {
 public:
  std::uint64_t version(const std::string& name);
  /// Moves the version of `name` and wakes its waiters; `said`, when not empty, is kept with the
  /// new version among the last `said_kept` of `name`.
  void bump(const std::string& name, std::string_view said = {});
  /// What said_since found.
  struct heard {
    /// The newest kept message of `name` that came after version `seen` and is about `key`:
    /// '<key>' or '<key>|<news>'. None when none is kept (none came, or it was pushed out).
    std::optional<std::string> said;
    /// Every bump after `seen` is kept with its message (none said nothing, none was pushed
    /// out): no message about `key` then means that none came.
    bool all_kept = false;
    std::uint64_t version = 0;  ///< the version the answer covers (up to which it looked)
  };
  heard said_since(const std::string& name, std::uint64_t seen, std::string_view key);
  /// Moves every version and wakes every waiter (wake-ups may have been missed).
  void bump_all();
  /// Marks the owner gone (see redis_backend's subscriber loop).
  void close() noexcept { closed_.store(true); }
  bool closed() const noexcept { return closed_.load(); }
  /// Returns when version(name) != seen or after `timeout`; on cancellation, at once.
  boost::asio::awaitable<void> wait(std::string name, std::uint64_t seen, std::chrono::milliseconds timeout);

  /// How many of a name's last messages are kept.
  static constexpr std::size_t said_kept = 64;

 private:
  struct message {
    std::uint64_t version = 0;  // 0: none yet
    std::string text;
  };
  struct entry {
    std::uint64_t version = 0;
    std::list<boost::asio::steady_timer*> waiters;
    std::array<message, said_kept> last;  // the message of version v at [v % said_kept]
  };
  void wake_locked(entry& e);

  std::mutex mutex_;
  std::unordered_map<std::string, entry> entries_;
  std::atomic<bool> closed_{false};
};

}  // namespace jobrt::detail
