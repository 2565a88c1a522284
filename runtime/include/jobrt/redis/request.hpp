// One or more Redis commands, encoded as RESP once, when they are pushed.
#pragma once

#include <charconv>
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
  /// Cancellation cuts it short only while it waits to be written; once written, its reply is
  /// delivered (a write whose result the caller must see, such as a claim that leases jobs).
  /// A timeout still applies.
  bool keep_once_written = false;
  /// With keep_once_written: a cancellation that comes once the request is written ends it
  /// after all when its reply has not come this long after (it times out then: abandoned, and a
  /// blocking connection made again). 0: the reply is waited for, up to the timeout.
  std::chrono::milliseconds written_cancel_wait{0};
  /// false: not written when its connection drops (or a resend-safe one taken back by the drop),
  /// or while the connection is down after a drop or a failed attempt, it completes with
  /// errc::not_connected at once instead of waiting for the next connection (a cluster client
  /// sends it to another node). A connection not yet tried is waited for, as usual.
  bool wait_for_reconnect = true;
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
  /// True when it holds a command whose replies are pushed rather than one reply per command:
  /// (P|S)SUBSCRIBE, (P|S)UNSUBSCRIBE, MONITOR. Only a subscriber carries these.
  bool has_pubsub_command() const noexcept { return pubsub_; }
  /// True when it would disturb every other request on the connection: a MULTI whose EXEC or
  /// DISCARD is not in the same request (other coroutines' commands would join the transaction);
  /// HELLO (switches the protocol), CLIENT REPLY (OFF and SKIP leave commands without a reply) and
  /// QUIT, which put the replies out of step; AUTH, SELECT and RESET, which change what the
  /// connection is until a reconnect silently undoes it (config's user, password and database
  /// are the way to set them).
  bool disturbs_connection() const noexcept { return open_multi_ || changes_connection_; }

  request_options options;

 private:
  template <class T>
  static constexpr bool is_char =
      std::same_as<T, char> || std::same_as<T, signed char> || std::same_as<T, unsigned char> ||
      std::same_as<T, char8_t> || std::same_as<T, char16_t> || std::same_as<T, char32_t> || std::same_as<T, wchar_t>;

  template <class T>
  static constexpr bool is_scalar = std::convertible_to<const T&, std::string_view> || std::integral<T>;

  template <class T>
  static std::size_t count(const T& arg) {
    if constexpr (is_scalar<T>) {
      return 1;
    } else {
      static_assert(std::ranges::forward_range<const T>, "arguments are strings, integers or forward ranges of them");
      std::size_t n = 0;
      for (const auto& elem : arg) n += count(elem);
      return n;
    }
  }

  template <class T>
  void append(const T& arg) {
    static_assert(!std::same_as<T, bool>, "pass \"0\" or \"1\", not bool");
    static_assert(!is_char<T>, "a character is not an argument; pass a string");
    if constexpr (std::integral<T>) {
      append_integer(arg);
    } else if constexpr (std::convertible_to<const T&, std::string_view>) {
      append_bulk(std::string_view(arg));
    } else {
      for (const auto& elem : arg) append(elem);
    }
  }

  template <std::integral T>
  void append_integer(T arg) {
    char buf[24];
    auto res = std::to_chars(buf, buf + sizeof buf, arg);
    append_bulk(std::string_view(buf, static_cast<std::size_t>(res.ptr - buf)));
  }

  void begin_command(std::string_view command, std::size_t argc);
  void append_bulk(std::string_view arg);

  std::string payload_;
  std::size_t commands_ = 0;
  bool blocking_ = false;
  bool pubsub_ = false;
  bool open_multi_ = false;          // a MULTI not yet followed by EXEC or DISCARD
  bool closes_multi_ = false;        // an EXEC or DISCARD before any MULTI: ends one opened before it
  bool changes_connection_ = false;  // HELLO, AUTH, SELECT, RESET, QUIT, CLIENT REPLY
  bool client_command_ = false;      // the last command is CLIENT: its next argument is read
};

}  // namespace jobrt::redis
