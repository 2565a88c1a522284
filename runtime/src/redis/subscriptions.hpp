// A subscriber connection's pub/sub state, with no I/O: the channels and patterns it holds (sent
// again after each reconnect), the pushes it reads, and the messages nobody received yet. The
// connection drives it from its strand; unit tests drive it with replies.
#pragma once

#include <jobrt/redis/connection.hpp>
#include <jobrt/redis/reply.hpp>

#include <cstddef>
#include <deque>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace jobrt::redis::detail {

class subscriptions {
 public:
  /// One (P)SUBSCRIBE or (P)UNSUBSCRIBE to send.
  struct command {
    const char* name;
    std::vector<std::string> names;
    bool pattern;
  };

  /// Adds or removes names; the command for those that changed, or nullopt when none did.
  std::optional<command> change(std::vector<std::string> names, bool pattern, bool add);
  /// The commands that subscribe to everything held, after a (re)connect: one for the channels,
  /// one for the patterns, each only when it has names.
  std::vector<command> resubscribe() const;
  /// Drops names the server refused (asking again would only be refused again).
  void forget(const std::vector<std::string>& names, bool pattern);

  /// The message a push carries ("message" or "pmessage"; its strings are moved out of `r`), or
  /// nullopt for any other reply.
  static std::optional<message> from_push(reply& r);

  /// Keeps a message nobody waits for. When `limit` are queued already, the queue is replaced
  /// by one confirmation notice (receivers learn that messages were missed) and this returns the
  /// count dropped; else 0. A confirmation is always kept.
  std::size_t queue(message m, std::size_t limit);
  /// The oldest queued message, if any.
  std::optional<message> next();

 private:
  std::set<std::string> channels_, patterns_;
  std::deque<message> messages_;
};

}  // namespace jobrt::redis::detail
