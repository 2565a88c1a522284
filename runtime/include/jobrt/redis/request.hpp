// One or more Redis commands, encoded as RESP once, when they are pushed.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <string>
#include <string_view>

namespace jobrt::redis {

/// Per-request settings.
struct request_options {
  /// 0: no timeout of its own. A request that times out while waiting is removed; one already
  /// written is abandoned (its reply is read and dropped).
  std::chrono::milliseconds timeout{0};
  /// Safe to send again when the connection drops after it was written (reads, idempotent writes).
  bool resend_safe = false;
};

/// A pipeline of commands. Arguments are binary safe: strings, string_views, integers, and
/// ranges of those (expanded in place).
class request {
 public:
  request() = default;
  template <class... Args>
  explicit request(std::string_view command, const Args&... args) {
    push(command, args...);
  }

  template <class... Args>
  request& push(std::string_view command, const Args&... args) {
    begin_command(command, 1 + (count(args) + ... + 0));
    (append(args), ...);
    return *this;
  }

  /// Appends the commands of another request (a pipeline of both).
  request& append(const request& other);

  /// Number of commands, hence of replies.
  std::size_t size() const noexcept { return commands_; }
  bool empty() const noexcept { return commands_ == 0; }
  /// The RESP bytes to write.
  const std::string& payload() const& noexcept { return payload_; }
  std::string payload() && noexcept { return std::move(payload_); }
  /// True when a command blocks the connection (BLMOVE, SUBSCRIBE, ...).
  bool has_blocking_command() const noexcept { return blocking_; }
  /// True when it holds (P)SUBSCRIBE or (P)UNSUBSCRIBE.
  bool has_pubsub_command() const noexcept { return pubsub_; }

  request_options options;

 private:
  template <class T>
  static constexpr bool is_scalar = std::convertible_to<const T&, std::string_view> || std::integral<T>;

  template <class T>
  static std::size_t count(const T& arg) {
    if constexpr (is_scalar<T>)
      return 1;
    else
      return static_cast<std::size_t>(std::ranges::distance(arg));
  }

  template <class T>
  void append(const T& arg) {
    if constexpr (std::same_as<T, bool>)
      static_assert(!std::same_as<T, bool>, "pass \"0\" or \"1\", not bool");
    else if constexpr (std::integral<T>)
      append_integer(static_cast<std::int64_t>(arg));
    else if constexpr (std::convertible_to<const T&, std::string_view>)
      append_bulk(std::string_view(arg));
    else
      for (const auto& elem : arg) append(elem);
  }

  void begin_command(std::string_view command, std::size_t argc);
  void append_bulk(std::string_view arg);
  void append_integer(std::int64_t arg);

  std::string payload_;
  std::size_t commands_ = 0;
  bool blocking_ = false;
  bool pubsub_ = false;
};

}  // namespace jobrt::redis
