// Test support: a private Redis Sentinel deployment on loopback (scripts/sentinel.sh: a primary,
// its replica, and three sentinels that watch them as "jobrt"), stopped and removed when the
// object goes.
#pragma once

#include <string>
#include <vector>

namespace jobrt::test {

class redis_sentinels {
 public:
  /// password: the servers' own; sentinel_password: the sentinels' own ("": none); tls: all of
  /// them speak TLS only (TLS=1 scripts/sentinel.sh).
  explicit redis_sentinels(std::string password = "", std::string sentinel_password = "", bool tls = false);
  ~redis_sentinels();
  redis_sentinels(const redis_sentinels&) = delete;
  redis_sentinels& operator=(const redis_sentinels&) = delete;

  /// The two servers' ports (the primary and its replica when started), and the sentinels'.
  int server(int i) const { return servers_.at(static_cast<std::size_t>(i)); }
  int sentinel(int i) const { return sentinels_.at(static_cast<std::size_t>(i)); }
  /// redis+sentinel://[:password@]127.0.0.1:<sentinel 0>,...,127.0.0.1:<sentinel 2>/jobrt, with
  /// the sentinels' password as a parameter when they have one; over TLS, rediss+sentinel://
  /// with the CA as a parameter.
  std::string url() const;
  /// The port of the server the sentinels name the primary now (sentinel 0, else the others).
  int primary() const;
  /// Runs a command with redis-cli at the server or sentinel listening on `port`, with its
  /// password, and returns what it prints.
  std::string cli(int port, const std::vector<std::string>& args) const;
  /// The role a server says it has ("master", "slave"), or "" when it does not answer.
  std::string role_of(int port) const;
  /// Kills the server at `port` (SIGKILL): a crash.
  void kill(int port) const { signal(port, 9); }
  /// Sends `sig` to the server or sentinel at `port` (SIGSTOP: it hangs, its port still open).
  void signal(int port, int sig) const;
  /// Starts it again, empty, as a replica of the primary the sentinels name now.
  void restart(int port) const;

 private:
  std::string password_, sentinel_password_;
  bool tls_ = false;
  std::vector<int> servers_, sentinels_;
  std::string dir_;
};

}  // namespace jobrt::test
