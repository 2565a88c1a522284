// Listens to shard channels (SSUBSCRIBE) at the nodes that serve them, for wake-ups that scripts
// send with SPUBLISH. On a plain server: one subscriber connection. On a Redis Cluster: one per
// node serving a channel's slot (closed when it serves none of them any more), and each channel
// follows its slot: when the slot moves, the node drops the channel (message::dropped) and it is
// subscribed again where the map, read again, says; when its primary changes (a failover), the
// slot map the cluster client keeps says so, looked at every `recheck` (no command is sent for
// that).
#pragma once

#include <jobrt/redis/connection.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace jobrt::detail {

class redis_link;

class shard_listener : public std::enable_shared_from_this<shard_listener> {
 public:
  /// Gets each message, and a confirmation notice (message::confirmation) whenever messages may
  /// have been missed: after each (re)subscription, at a new node too when a channel moved. Runs
  /// on the listener's strand.
  using handler = std::function<void(const redis::message&)>;

  /// Made with make_shared. Its connections are named "<client name>:<role>".
  shard_listener(boost::asio::any_io_executor ex, std::shared_ptr<redis_link> link, std::string role,
                 handler on_message, std::chrono::milliseconds recheck = std::chrono::seconds(1));

  /// Subscribes to a shard channel (once; thread-safe).
  void listen(std::string channel);
  /// Closes its connections; no message is handled after. Thread-safe.
  void close();

 private:
  static boost::asio::awaitable<void> place(std::shared_ptr<shard_listener> self, std::string channel,
                                            std::string dropped_by);
  static boost::asio::awaitable<void> receive(std::shared_ptr<shard_listener> self, redis::subscriber* sub,
                                              std::string address);
  static boost::asio::awaitable<void> recheck_loop(std::shared_ptr<shard_listener> self);
  redis::subscriber& subscriber_at(const redis::config& node);
  void leave(const std::string& channel);

  boost::asio::strand<boost::asio::any_io_executor> strand_;
  std::shared_ptr<redis_link> link_;
  std::string role_;
  handler on_message_;
  std::chrono::milliseconds recheck_;
  boost::asio::steady_timer recheck_timer_;
  std::set<std::string> channels_;
  std::map<std::string, std::string> where_;                               // channel -> the address it is subscribed at
  std::map<std::string, std::unique_ptr<redis::subscriber>> subscribers_;  // by address
  std::vector<std::unique_ptr<redis::subscriber>> retired_;                // closed, their receive loops not ended
  bool rechecking_ = false;
  std::atomic<bool> closed_{false};
};

}  // namespace jobrt::detail
