// Connections to Redis, all on Asio:
// - connection: shared by any number of coroutines; requests are multiplexed, coalesced into one
//   write and matched to replies in order. Blocking commands are refused.
// - blocking_connection: for BLMOVE and friends; one such command holds it until it returns.
// - subscriber: SUBSCRIBE/PSUBSCRIBE; messages are delivered to coroutines.
// Each reconnects with capped backoff, checks the server's health with PING when idle, and keeps
// all of its state on a strand of its own, so it can be used from any thread.
#pragma once

#include <jobrt/error.hpp>
#include <jobrt/redis/config.hpp>
#include <jobrt/redis/reply.hpp>
#include <jobrt/redis/request.hpp>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>

#include <memory>
#include <string>
#include <vector>

namespace jobrt::redis {

namespace detail {
class connection_impl;
}

enum class connection_role { shared, blocking, subscriber };

/// What made the last connection attempt fail, for a caller that decides whether waiting for the
/// server can help.
enum class connect_failure {
  none,        ///< no attempt failed yet
  unresolved,  ///< the host name does not exist (a name server that did not answer is `other`)
  refused,     ///< nothing listens at the address: the port refused, or the unix socket is not there
  denied,      ///< the server refused the handshake: AUTH (WRONGPASS), an ACL (NOPERM), SELECT
  not_ready,   ///< the server is loading its data (LOADING), or did not answer within connect_timeout
  other,       ///< anything else: a network error, a connection lost after it was made
};

/// A message received by a subscriber.
struct message {
  std::string channel;
  std::string payload;
  std::string pattern;  ///< the pattern it matched, for PSUBSCRIBE; else empty
  /// True for a notice, not a message: subscriptions are in place (after subscribe() and after
  /// each reconnect). Messages published while the connection was down are lost, so a receiver
  /// should re-check what it waits for: what `channel` is about when it names one (the shard
  /// channel that ssubscribe() just added), else everything.
  bool confirmation = false;
  /// True for a notice, not a message: the server dropped this shard channel (its slot moved
  /// to another shard, or this node does not serve it). Subscribe to it where it is served now;
  /// messages published meanwhile are lost.
  bool dropped = false;
};

using exec_handler = boost::asio::any_completion_handler<void(boost::system::error_code, reply)>;
using receive_handler = boost::asio::any_completion_handler<void(boost::system::error_code, message)>;

/// What the three connection types share: lifetime, status and settings.
class basic_connection {
 public:
  using executor_type = boost::asio::any_io_executor;

  basic_connection(const basic_connection&) = delete;
  basic_connection& operator=(const basic_connection&) = delete;
  /// Closes the connection: every request still waiting or in flight completes with errc::closed.
  ~basic_connection();

  /// Starts connecting, and reconnecting after each loss, until close(). Idempotent.
  void start();
  /// Stops for good. Thread-safe.
  void close();

  executor_type get_executor() const noexcept;
  const config& get_config() const noexcept;
  /// True while a connection is established and its handshake done.
  bool is_connected() const noexcept;
  /// Why the last connection attempt or connection failed ("" when it never did). Thread-safe.
  std::string last_error() const;
  /// The kind of last_error(). Thread-safe.
  connect_failure last_failure() const;
  /// Connections made so far (1 after the first connect; more after reconnects).
  std::uint64_t connect_count() const noexcept;
  /// The server's CLIENT ID for the current connection (0 when not connected).
  std::int64_t client_id() const noexcept;

 protected:
  basic_connection(executor_type ex, config cfg, connection_role role);
  // The initiation owns the impl (a deferred one may run after `this` is gone) and gives it up
  // when it runs: an awaitable keeps its initiation until the operation completes, and a
  // shared_ptr kept there would form a cycle through the pending request's handler.
  struct exec_initiation {
    std::shared_ptr<detail::connection_impl> impl;
    template <class Handler>
    void operator()(Handler&& handler, request req) {
      exec_impl(std::move(impl), std::move(req), exec_handler(std::forward<Handler>(handler)));
    }
  };
  static void exec_impl(std::shared_ptr<detail::connection_impl> impl, request req, exec_handler handler);

  std::shared_ptr<detail::connection_impl> impl_;
};

/// The shared, multiplexed connection.
class connection : public basic_connection {
 public:
  connection(executor_type ex, config cfg) : basic_connection(std::move(ex), std::move(cfg), connection_role::shared) {}

  /// Sends req and completes with its reply: for a single command, its reply (an error reply
  /// completes with errc::server_error and the reply holding the message); for a pipeline, an
  /// array of their replies. Waits while disconnected; see request_options for timeouts and
  /// resending. Cancellation: a waiting request is removed; a written one is abandoned (its reply
  /// is dropped). Blocking commands complete with errc::blocking_command_on_shared_connection.
  /// Thread-safe.
  template <class CompletionToken>
  auto async_exec(request req, CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken, void(boost::system::error_code, reply)>(exec_initiation{impl_},
                                                                                                token, std::move(req));
  }
};

/// A connection for blocking commands (BLMOVE, BLPOP, ...). Cancelling or timing out a written
/// request resets the connection, so the server stops blocking for it at once.
class blocking_connection : public basic_connection {
 public:
  blocking_connection(executor_type ex, config cfg)
      : basic_connection(std::move(ex), std::move(cfg), connection_role::blocking) {}

  /// As connection::async_exec, blocking commands included. Thread-safe.
  template <class CompletionToken>
  auto async_exec(request req, CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken, void(boost::system::error_code, reply)>(exec_initiation{impl_},
                                                                                                token, std::move(req));
  }
};

/// A pub/sub connection. Subscriptions survive reconnects (they are made again).
class subscriber : public basic_connection {
 public:
  subscriber(executor_type ex, config cfg)
      : basic_connection(std::move(ex), std::move(cfg), connection_role::subscriber) {}

  /// Adds channels (or patterns, with PSUBSCRIBE semantics). Thread-safe.
  void subscribe(std::vector<std::string> channels);
  void psubscribe(std::vector<std::string> patterns);
  /// Adds shard channels (SSUBSCRIBE, one command each). On a Redis Cluster, subscribe at a
  /// node of the channel's slot; when that slot moves, or this node does not serve it, a
  /// message::dropped notice names the channel, no longer held. On a server that has no sharded
  /// pub/sub (before Redis 7.0) they are plain channels, as its publishers' SPUBLISH is PUBLISH.
  void ssubscribe(std::vector<std::string> channels);
  void unsubscribe(std::vector<std::string> channels);
  void punsubscribe(std::vector<std::string> patterns);

  /// Completes with the next message (messages are queued until received), or errc::closed.
  /// Thread-safe; concurrent receivers are served in order.
  template <class CompletionToken>
  auto async_receive(CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken, void(boost::system::error_code, message)>(
        receive_initiation{impl_}, token);
  }

 private:
  struct receive_initiation {
    std::shared_ptr<detail::connection_impl> impl;
    template <class Handler>
    void operator()(Handler&& handler) {
      receive_impl(std::move(impl), receive_handler(std::forward<Handler>(handler)));
    }
  };
  static void receive_impl(std::shared_ptr<detail::connection_impl> impl, receive_handler handler);
};

/// Runs req on c and returns its reply; throws boost::system::system_error on failure (for an
/// error reply, its what() holds the server's message).
boost::asio::awaitable<reply> exec(connection& c, request req);
boost::asio::awaitable<reply> exec(blocking_connection& c, request req);

}  // namespace jobrt::redis
