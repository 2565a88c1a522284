// A Lua script run with EVALSHA, loaded again on NOSCRIPT (server restarted, SCRIPT FLUSH).
#pragma once

#include <jobrt/redis/cluster.hpp>
#include <jobrt/redis/connection.hpp>

#include <boost/asio/awaitable.hpp>

#include <ranges>
#include <string>

namespace jobrt::redis {

class script {
 public:
  explicit script(std::string source);

  const std::string& source() const noexcept { return source_; }
  /// The SHA1 of the source, in hex, as EVALSHA wants it.
  const std::string& sha1() const noexcept { return sha1_; }

  /// The EVALSHA request for these keys and arguments (ranges or single values).
  template <class Keys, class Args>
  request make_request(const Keys& keys, const Args& args) const {
    return request("EVALSHA", sha1_, key_count(keys), keys, args);
  }

  /// Runs the request made by make_request: EVALSHA, and on NOSCRIPT, SCRIPT LOAD and EVALSHA
  /// again in one round trip. Returns the script's reply; throws boost::system::system_error on
  /// failure (a script error's what() holds Redis' message; an error reply 'JOBRT:<n> <message>',
  /// a refusal of jobrt's own scripts, comes as errc n with what() holding the message).
  boost::asio::awaitable<reply> run(connection& c, request evalsha) const;

  template <class Keys, class Args>
  boost::asio::awaitable<reply> run(connection& c, const Keys& keys, const Args& args) const {
    return run(c, make_request(keys, args));
  }

  /// A run's outcome from EVALSHA's (error code, reply): the reply, or the failure thrown as run
  /// throws it (`not_connected`: what to say for errc::not_connected, when not empty).
  static reply result(boost::system::error_code ec, reply r, const std::string& not_connected);

  /// The same on a cluster, at the primary of `keys`' slot (the keys of the request): each node
  /// has a script cache of its own, and a node that just took the slot over may not know it yet.
  boost::asio::awaitable<reply> run(cluster_connection& c, std::vector<std::string> keys, request evalsha) const;

 private:
  template <class T>
  static std::size_t key_count(const T& keys) {
    if constexpr (std::ranges::range<T> && !std::convertible_to<const T&, std::string_view>)
      return static_cast<std::size_t>(std::ranges::distance(keys));
    else
      return 1;
  }

  request reload(const request& evalsha) const;
  static void reloaded(boost::system::error_code& ec, reply& r);

  std::string source_;
  std::string sha1_;
};

}  // namespace jobrt::redis
