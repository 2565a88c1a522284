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

/// What a name subscribes to: a channel, a pattern of channels, or a shard channel (SSUBSCRIBE:
/// on a Redis Cluster, served by the nodes of its slot's shard only).
enum class channel_kind { channel, pattern, shard };

class subscriptions {
 public:
  /// One (P|S)SUBSCRIBE or (P)UNSUBSCRIBE to send.
  struct command {
    const char* name;
    std::vector<std::string> names;
    channel_kind kind;
  };

  /// Adds or removes names; the commands for those that changed (none when none did). Shard
  /// channels get one command each (on a cluster, one command's shard channels must share a
  /// slot), and are never removed by a command: the server drops them (see from_push), or they go
  /// with the connection. (A SUNSUBSCRIBE of ours and one the server sends unasked read alike, so
  /// ours could be taken for a reply to the wrong request.)
  std::vector<command> change(std::vector<std::string> names, channel_kind kind, bool add);
  /// The commands that subscribe to everything held, after a (re)connect: one for the channels,
  /// one for the patterns, each only when it has names, and one for each shard channel.
  std::vector<command> resubscribe() const;
  /// Drops names the server refused (asking again would only be refused again).
  void forget(const std::vector<std::string>& names, channel_kind kind);

  /// The message a push carries ("message", "pmessage" or "smessage"; its strings are moved out
  /// of `r`), or nullopt for any other reply. A "sunsubscribe" is the server dropping a shard
  /// channel (its slot moved to another shard; no SUNSUBSCRIBE is ever sent): the channel is
  /// forgotten, and the message says so (message::dropped).
  std::optional<message> from_push(reply& r);

  /// Keeps a message nobody waits for. When `limit` are queued already, the queued messages are
  /// replaced by one confirmation notice (receivers learn that messages were missed) and this
  /// returns the count dropped; else 0. Confirmations and dropped channels' notices are always
  /// kept (queued ones too).
  std::size_t queue(message m, std::size_t limit);
  /// The oldest queued message, if any.
  std::optional<message> next();

 private:
  std::set<std::string>& set_of(channel_kind kind) {
    return kind == channel_kind::pattern ? patterns_ : kind == channel_kind::shard ? shards_ : channels_;
  }

  std::set<std::string> channels_, patterns_, shards_;
  std::deque<message> messages_;
};

}  // namespace jobrt::redis::detail
