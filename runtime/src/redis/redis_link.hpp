// Where the Redis backend's and the lock's commands go: one plain server, or the primaries of a
// Redis Cluster. Which of the two is found out from the server (INFO cluster) at the first
// command; on a cluster, each command goes to the primary serving its route key's slot (every
// key of one queue, or of one lock, shares that slot), and follows the cluster's redirects.
#pragma once

#include <jobrt/redis/cluster.hpp>
#include <jobrt/redis/connection.hpp>
#include <jobrt/redis/script.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/system/system_error.hpp>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace jobrt::detail {

/// A failure caught on the way to a server, as a reply: an error reply of its words (nil when it
/// says nothing but its code), as the cluster client's own failures come.
redis::reply reply_of(const boost::system::system_error& e);

class redis_link {
 public:
  /// Several seeds name a cluster's nodes: a cluster at once. One is asked at the first command.
  redis_link(boost::asio::any_io_executor ex, std::vector<redis::config> seeds);
  ~redis_link();

  /// The connection to the configured server (on a cluster, the seed node).
  redis::connection& plain() noexcept { return plain_; }
  const redis::connection& plain() const noexcept { return plain_; }
  const redis::config& config() const noexcept { return cfg_; }

  /// Runs req (one command or a pipeline) where `route` lives; throws as redis::exec.
  boost::asio::awaitable<redis::reply> exec(redis::request req, const std::string& route);
  /// Runs a script's EVALSHA where `route` lives (script::run).
  boost::asio::awaitable<redis::reply> run(const redis::script& s, redis::request evalsha, const std::string& route);
  /// The same, then WAIT until `replicas` replicas have its writes, for `wait` at most: on a
  /// connection of the link's own to that server (WAIT counts the writes of the connection it
  /// comes on, and holds the connection while it waits). Fewer in time: throws
  /// boost::system::system_error(errc::not_replicated), the write done at the primary.
  boost::asio::awaitable<redis::reply> run_replicated(const redis::script& s, redis::request evalsha,
                                                      const std::string& route, int replicas,
                                                      std::chrono::milliseconds wait);

  /// As exec, the outcome as a value: an error reply comes as (errc::server_error, the reply),
  /// any other failure as its code and an empty reply.
  boost::asio::awaitable<std::pair<boost::system::error_code, redis::reply>> try_exec(redis::request req,
                                                                                      const std::string& route);

  /// The cluster, or null on a plain server (found out on the first call: INFO cluster, within
  /// `timeout` when one is given; throws boost::system::system_error when it fails).
  boost::asio::awaitable<redis::cluster_connection*> cluster(std::chrono::milliseconds timeout = {});
  /// Without waiting: whether that is found out yet, and the cluster when it is one.
  bool known() const noexcept { return mode_.load(std::memory_order_acquire) != unknown; }
  redis::cluster_connection* known_cluster() const noexcept {
    return mode_.load(std::memory_order_acquire) == clustered ? cluster_.get() : nullptr;
  }
  /// The server a connection of one's own (a blocking one) for `route` goes to: the configured
  /// one, or the primary serving its slot now.
  boost::asio::awaitable<redis::config> node_of(const std::string& route);
  /// Runs req at that server as it is (no redirect followed), and hands the outcome to `done`.
  void exec_at(const redis::config& node, redis::request req,
               std::function<void(boost::system::error_code, redis::reply)> done);

 private:
  enum mode : int { unknown, plain_server, clustered };
  boost::asio::any_io_executor ex_;
  redis::config cfg_;  // the first seed
  redis::connection plain_;
  std::atomic<int> mode_{unknown};
  std::mutex mutex_;  // guards cluster_ while it is made, and replicated_
  std::unique_ptr<redis::cluster_connection> cluster_;
  // run_replicated's connections, a few per server ("host:port"), taken in turn.
  redis::blocking_connection& replicated_at(const redis::config& node);
  void drop_former_primaries_locked(const std::string& keep);
  std::map<std::string, std::vector<std::unique_ptr<redis::blocking_connection>>> replicated_;
  std::size_t next_replicated_ = 0;
};

}  // namespace jobrt::detail
