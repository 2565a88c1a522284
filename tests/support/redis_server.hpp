// Test support: a private redis-server on loopback (free port, throw-away directory, no
// persistence), or the one the test script started (JOBRT_TEST_REDIS_URL).
#pragma once

#include <jobrt/redis/config.hpp>

#include <sys/types.h>
#include <string>
#include <vector>

namespace jobrt::test {

class redis_server {
 public:
  /// Starts a server; extra arguments go to redis-server (e.g. {"--requirepass", "x"}).
  explicit redis_server(std::vector<std::string> extra_args = {});
  ~redis_server();
  redis_server(const redis_server&) = delete;
  redis_server& operator=(const redis_server&) = delete;

  /// Stops it (SIGKILL when hard, else SIGTERM) and waits for the process to end.
  void stop(bool hard = false);
  /// Starts it again on the same port and directory.
  void start();

  int port() const noexcept { return port_; }
  const std::string& dir() const noexcept { return dir_; }
  std::string url() const;
  std::string unix_socket() const { return dir_ + "/redis.sock"; }
  redis::config config() const;

 private:
  int port_ = 0;
  pid_t pid_ = -1;
  std::string dir_;
  std::vector<std::string> extra_;
};

/// A TCP port free on loopback now.
int free_port();

/// The server tests share: JOBRT_TEST_REDIS_URL if set, else one private server per process.
/// Tests that restart, pause or kill the server must make a private redis_server instead.
redis::config shared_redis();

/// The same server over TLS: JOBRT_TEST_TLS_URL if set (scripts/test.sh's shared server, with a
/// TLS port), else one private server per process (`TLS=1 scripts/redis.sh`), as
/// rediss://127.0.0.1:<tls port>/?ca=<its CA>.
redis::config shared_tls_redis();

/// A key prefix unique to the running test case and process.
std::string key_prefix();

/// Runs a blocking one-line command on a fresh loopback connection (for setup and fault
/// injection outside the code under test), and returns the raw reply text.
std::string redis_cli(const redis::config& cfg, const std::vector<std::string>& args);

}  // namespace jobrt::test
