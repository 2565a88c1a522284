// Test support: a private Redis Cluster on loopback (scripts/cluster.sh: 3 primaries, 3 replicas,
// six consecutive ports, no persistence), stopped and removed when the object goes.
#pragma once

#include <jobrt/redis/config.hpp>

#include <string>
#include <vector>

namespace jobrt::test {

class redis_cluster {
 public:
  redis_cluster();
  ~redis_cluster();
  redis_cluster(const redis_cluster&) = delete;
  redis_cluster& operator=(const redis_cluster&) = delete;

  static constexpr int nodes = 6;
  /// The nodes' ports: first() to first() + 5.
  int first() const noexcept { return first_; }
  /// A connection config for one of its nodes.
  redis::config config(int node) const;
  /// Runs a command on one of its nodes with redis-cli and returns what it prints.
  std::string cli(int node, const std::vector<std::string>& args) const;
  /// Kills one of its nodes (SIGKILL): as a crashed server.
  void kill(int node) const;
  /// Starts a node again (scripts/cluster.sh restart), empty: it rejoins, and syncs as a replica
  /// when its replica took over meanwhile.
  void restart(int node) const;
  /// redis://127.0.0.1:<first>,127.0.0.1:<first + 1>: two seeds.
  std::string url() const;

 private:
  int first_ = 0;
  std::string dir_;
};

/// The cluster the tests share: JOBRT_TEST_CLUSTER_URL's first node when it is set (scripts/test.sh
/// starts one), else a private one, started on first use, for this test process.
redis::config shared_cluster();

}  // namespace jobrt::test
