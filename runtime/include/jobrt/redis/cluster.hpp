// A client of Redis Cluster, beside the plain connection: one multiplexed connection per primary,
// opened when a request first needs it, and every request sent to the primary that serves the
// slot of its keys, following the cluster's redirects on the way.
#pragma once

#include <jobrt/redis/config.hpp>
#include <jobrt/redis/connection.hpp>
#include <jobrt/redis/reply.hpp>
#include <jobrt/redis/request.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace jobrt::redis {

namespace detail {
class cluster_impl;
}

struct cluster_options {
  /// Requests without a timeout of their own (request_options::timeout) get this one. It bounds
  /// a request's whole way: its redirects, and its waits through a failover or a migration.
  std::chrono::milliseconds request_timeout{10'000};
  /// The slot map is read again this often, and besides after each MOVED and each primary that
  /// cannot be reached.
  std::chrono::milliseconds refresh_period{30'000};
};

/// Connections to one Redis Cluster. The slot map comes from CLUSTER SHARDS (CLUSTER SLOTS on a
/// server without it), read from a seed, later from any primary known. A request goes to the
/// primary of its keys' slot; MOVED updates the map and sends it there, ASK sends one command
/// once to the node named (behind ASKING), and TRYAGAIN, CLUSTERDOWN, LOADING and a primary that
/// cannot be reached make it wait (10 ms, doubling up to 500 ms) and go again, within its
/// timeout. A script's call (EVAL, EVALSHA, FCALL) or a pipeline met by ASK waits too, until the
/// migration has ended: at the importing node a key not there yet reads as missing, which only
/// the keys a command names are checked for (a script may touch others), and one ASKING covers
/// one command. A pipeline is sent again whole only when none of its commands ran (a
/// transaction, MULTI ... EXEC, that EXEC refused counts as none) or it is resend_safe; else its
/// replies come back as they are, the cluster's error (ASK, TRYAGAIN, ...) in place of each
/// command that did not run. So on a cluster, give writes to several keys as one script or
/// one transaction. Thread-safe.
class cluster_connection {
 public:
  /// `seeds`: nodes to learn the topology from, tried in turn. The first one's user, password,
  /// client name and timeouts are used for every node.
  cluster_connection(boost::asio::any_io_executor ex, std::vector<config> seeds, cluster_options o = {});
  /// close().
  ~cluster_connection();
  cluster_connection(const cluster_connection&) = delete;
  cluster_connection& operator=(const cluster_connection&) = delete;

  /// Reads the slot map, and again every refresh_period, until close(). Idempotent.
  void start();
  /// Closes every connection: requests under way complete with errc::closed.
  void close();

  /// Runs `req` (one command, or a pipeline of them) at the primary serving the slot of `keys`,
  /// or at any primary when there are none, and returns its reply as connection's exec does.
  /// Throws std::invalid_argument, before anything is sent, when the keys hash to several slots
  /// (the message names two of them); boost::system::system_error with errc::server_error for an
  /// error reply (its message), errc::timeout when the cluster did not serve the request within
  /// its timeout (the message says what it met on the way), errc::connection_lost when a
  /// connection dropped after it was written and it is not request_options::resend_safe (one
  /// that is goes again, as to a primary that cannot be reached).
  boost::asio::awaitable<reply> exec(request req, std::vector<std::string> keys = {});
  /// As exec, but an error reply comes back as (errc::server_error, the reply) instead of being
  /// thrown.
  boost::asio::awaitable<std::pair<boost::system::error_code, reply>> try_exec(request req,
                                                                               std::vector<std::string> keys = {});

  /// The primary serving the slot of `key` now, as a config for a connection of one's own (a
  /// blocking one, say): the first seed's settings at that node's address. Reads the slot map
  /// first when there is none yet; throws as exec when no primary serves the slot in time.
  boost::asio::awaitable<config> primary_of(std::string key);
  /// Reads the slot map now (or waits for a read under way): after a redirect met elsewhere, by a
  /// connection of one's own.
  boost::asio::awaitable<void> refresh();
  /// As try_exec, at the node `node` names (its host and port) as it is, redirects not followed.
  boost::asio::awaitable<std::pair<boost::system::error_code, reply>> try_exec_at(const config& node, request req);

  /// The primaries in the slot map now, as host:port.
  std::vector<std::string> primaries() const;
  /// Connections opened so far (one per primary a request went to).
  std::size_t connections() const;
  /// Slot maps read so far.
  std::uint64_t refreshes() const;

 private:
  std::shared_ptr<detail::cluster_impl> impl_;
};

/// The seeds named by a URL: redis://[user:password@]host:port[,host:port...][/db]; each gets the
/// same user, password and settings. A redis+sentinel:// URL's hosts are its sentinels: one
/// config, which names them all.
std::vector<config> cluster_seeds(std::string_view url);

/// Whether the server behind `c` runs in cluster mode (INFO cluster: cluster_enabled:1).
boost::asio::awaitable<bool> is_cluster(connection& c);

}  // namespace jobrt::redis
