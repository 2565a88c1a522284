// Test support: a private Redis Cluster on loopback (scripts/cluster.sh: 3 primaries, 3 replicas,
// six consecutive ports, no persistence), stopped and removed when the object goes.
#pragma once

#include <jobrt/redis/config.hpp>

#include <chrono>
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

  // Slots, by redis-cli (outside coroutines: g++ 12 does not take some braced lists in them).
  /// The node id of the node at `port` (CLUSTER MYID).
  std::string id_of(int port) const;
  /// The ports of the primaries, and of the one serving `slot` (CLUSTER NODES, as node 0 sees it).
  std::vector<int> primaries() const;
  int owner_of(int slot) const;
  /// The slot of a key (CLUSTER KEYSLOT).
  int slot_of(const std::string& key) const;
  /// Moves `slot` with its keys from the primary at port `from` to the one at `to` by hand, as
  /// `redis-cli --cluster reshard` does: IMPORTING at `to`, MIGRATING at `from`, MIGRATE `step`
  /// keys at a time (so ASK and TRYAGAIN meet the clients meanwhile), `pause` between steps,
  /// then SETSLOT NODE at every primary.
  void move_slot(int slot, int from, int to, int step = 100,
                 std::chrono::milliseconds pause = std::chrono::milliseconds(0)) const;
  /// Error replies of a kind ("MOVED", "ASK", "TRYAGAIN", ...) the primaries and replicas gave
  /// since they started, summed (INFO errorstats).
  long errors(const std::string& kind) const;

 private:
  int first_ = 0;
  std::string dir_;
};

/// The cluster the tests share: JOBRT_TEST_CLUSTER_URL's first node when it is set (scripts/test.sh
/// starts one), else a private one, started on first use, for this test process.
redis::config shared_cluster();

}  // namespace jobrt::test
