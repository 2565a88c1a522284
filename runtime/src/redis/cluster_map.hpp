// Redis Cluster without I/O: which slot a key hashes to, which node serves a slot (the slot map,
// read from CLUSTER SHARDS or CLUSTER SLOTS), what a redirect or a transient error in a reply
// means, and, for one request, what to do next (cluster_route). The cluster client drives these
// with its connections; the unit tests drive them with replies written by hand.
#pragma once

#include <jobrt/redis/reply.hpp>

#include <chrono>
#include <compare>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace jobrt::redis::detail {

inline constexpr std::uint16_t cluster_slots = 16384;

// CRC16-CCITT (XMODEM: polynomial 0x1021, initial 0, no reflection), as Redis hashes keys.
std::uint16_t crc16(std::string_view data) noexcept;

// The part of a key that is hashed: the text between its first '{' and the first '}' after it,
// when that is not empty; otherwise the whole key.
std::string_view hash_tag(std::string_view key) noexcept;

// The slot of a key: crc16(hash_tag(key)) mod 16384.
std::uint16_t key_slot(std::string_view key) noexcept;

// A short text that hashes to `slot` (the smallest number, in decimal, that does): a name with
// "{<it>}" in it lives in that slot, beside the keys of any other name there.
std::string slot_tag(std::uint16_t slot);

// The one slot every key of a request hashes to; nullopt for a request without keys (any node
// serves it). Keys of several slots cannot go in one request: throws cross_slot_error naming two
// of them and their slots.
class cross_slot_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};
std::optional<std::uint16_t> common_slot(std::span<const std::string> keys);

struct node_address {
  std::string host;
  std::uint16_t port = 0;
  friend auto operator<=>(const node_address&, const node_address&) = default;
  std::string text() const;  // host:port ([host]:port for IPv6)
};

// "host:port" (the host may be an IPv6 address: the port follows the last ':'); nullopt when
// that is not what it is.
std::optional<node_address> parse_address(std::string_view text);

// A shard as the cluster reports it: its slot ranges, its primary, its replicas.
struct shard_info {
  std::vector<std::pair<std::uint16_t, std::uint16_t>> ranges;  // first and last slot of each
  node_address primary;
  std::vector<node_address> replicas;
};

// Throws when a topology reply is not what CLUSTER SHARDS or CLUSTER SLOTS answer; the message
// says what was found.
class topology_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// CLUSTER SHARDS (Redis 7): shards with at least one slot and an online primary (one that is
// failing over leaves its slots unserved until a replica takes over); replicas that have not
// failed. `asked` is the host the command went to: a node whose endpoint and IP the reply leaves
// empty (a node alone, which never met another, knows no IP of its own) is reached there, at the
// port the reply gives; with `asked` empty, such a node is left out, as is one given as '?'.
std::vector<shard_info> parse_cluster_shards(const reply& r, std::string_view asked = {});
// CLUSTER SLOTS (before Redis 7): one entry per slot range, the primary first; `asked` as above.
std::vector<shard_info> parse_cluster_slots(const reply& r, std::string_view asked = {});

// Which primary serves each slot, as last learned: from a topology reply, and slot by slot from
// MOVED redirects.
class slot_map {
 public:
  slot_map() : owner_(cluster_slots, none) {}
  explicit slot_map(const std::vector<shard_info>& shards);

  // The primary serving `slot`; null when none is known.
  const node_address* owner(std::uint16_t slot) const noexcept;
  // `slot` is served by `node` now (a MOVED redirect said so).
  void assign(std::uint16_t slot, const node_address& node);
  // The primaries serving at least one slot, each once, in the order first met.
  std::vector<node_address> primaries() const;
  // Every slot has a primary.
  bool complete() const noexcept;
  // Slots without one.
  std::size_t unserved() const noexcept;

 private:
  static constexpr std::uint16_t none = 0xffff;
  std::uint16_t index_of(const node_address& node);
  std::vector<node_address> nodes_;
  std::vector<std::uint16_t> owner_;  // per slot: an index into nodes_, or none
};

// What an error reply says to a cluster client.
struct cluster_error {
  enum kind_t {
    other,         // not a cluster matter: the request's own answer
    moved,         // the slot lives at `to` now: update the map, send it there
    ask,           // the slot is being migrated and the key is at `to`: ASKING, then send it there once
    try_again,     // TRYAGAIN: the keys are split by a migration for now; send again soon
    cluster_down,  // CLUSTERDOWN: the cluster cannot serve the slot now; send again soon
    loading,       // LOADING: the node is loading its data; send again soon
  } kind = other;
  std::uint16_t slot = 0;  // moved, ask
  node_address to;         // moved, ask
};
cluster_error classify(std::string_view error_message);

// One request's way through the cluster: where to send it, and after each reply whether it is
// done, goes elsewhere, or waits and goes again. Redirects are bounded (a map that keeps sending
// it around fails it), and so is the waiting: it ends by the request's deadline. A MOVED right
// after a MOVED is followed after a wait: nodes that send a slot to each other disagree only for
// a moment.
class cluster_route {
 public:
  struct action {
    enum kind_t {
      send,  // send the request to `node` (preceded by ASKING when `asking`)
      wait,  // wait `delay`, then call next() and do what it says
      done,  // the reply is the request's answer
      fail,  // give up: `error` says why
    } kind = fail;
    node_address node;
    bool asking = false;
    std::chrono::milliseconds delay{0};
    std::string error;
    // The map is stale (a MOVED, or a slot nobody serves): refresh it from the cluster.
    bool refresh = false;
  };

  static constexpr int max_redirects = 16;

  // `slot`: the request's (nullopt: no keys, any primary). `any` is the node for a request
  // without keys. The deadline bounds the waits. `follow_ask`: an ASK is followed (ASKING and
  // the request at the node named); else the request waits and goes again to the slot's owner,
  // as after TRYAGAIN, until the migration has ended. Only one command whose keys are all its
  // arguments may follow an ASK: at the importing node a missing key reads as empty, while it
  // may still be at the migrating one (a script's undeclared keys), and one ASKING covers only
  // the first command of a pipeline.
  cluster_route(slot_map& map, std::optional<std::uint16_t> slot, node_address any,
                std::chrono::steady_clock::time_point deadline, bool follow_ask = true);

  // Where to send it first, or again after a wait.
  action next(std::chrono::steady_clock::time_point now);
  // The node's reply to the request.
  action on_reply(const reply& r, std::chrono::steady_clock::time_point now);
  // The node could not be reached (`why`): the request was not sent. Its primary may be failing
  // over: wait, refresh the map, and send again.
  action on_unreachable(std::string_view why, std::chrono::steady_clock::time_point now);

 private:
  action retry_later(std::string_view why, std::chrono::steady_clock::time_point now);
  slot_map& map_;
  std::optional<std::uint16_t> slot_;
  node_address any_;
  std::chrono::steady_clock::time_point deadline_;
  std::optional<node_address> ask_to_;  // the next send goes there with ASKING
  bool follow_ask_;
  int redirects_ = 0;
  int moved_ = 0;         // MOVED replies in a row: the first is followed at once, the next ones after a wait
  node_address sent_to_;  // where the last send went (a redirect without a host names a node there)
  std::chrono::milliseconds backoff_{10};
};

}  // namespace jobrt::redis::detail
