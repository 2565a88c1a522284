// Redis Cluster without I/O (runtime/src/redis/cluster_map.hpp): key slots with Redis's own
// vectors, addresses, what error replies mean, the topology replies read into a slot map, and
// one request's route through redirects and transient errors, driven by replies written here.
#include "redis/cluster_map.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

using namespace jobrt::redis;
using namespace jobrt::redis::detail;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

namespace {

reply str(std::string s) { return reply::make_string(std::move(s)); }
reply num(std::int64_t n) { return reply::make_integer(n); }
reply arr(std::vector<reply> v) { return reply::make_array(std::move(v)); }
reply err(std::string s) { return reply::make_string(std::move(s), reply_kind::error); }

// One node of a CLUSTER SHARDS reply, in RESP2's flat form.
reply shard_node(std::string endpoint, std::int64_t port, std::string role, std::string health = "online") {
  return arr({str("id"), str("0123abcd"), str("port"), num(port), str("ip"), str("10.0.0.9"), str("endpoint"),
              str(std::move(endpoint)), str("role"), str(std::move(role)), str("replication-offset"), num(42),
              str("health"), str(std::move(health))});
}

reply shard(std::vector<std::int64_t> bounds, std::vector<reply> nodes) {
  std::vector<reply> slots;
  for (auto b : bounds) slots.push_back(num(b));
  return arr({str("slots"), arr(std::move(slots)), str("nodes"), arr(std::move(nodes))});
}

node_address at(std::string host, std::uint16_t port) { return node_address{std::move(host), port}; }

// Three primaries over every slot, as redis-cli --cluster create splits them.
slot_map three() {
  return slot_map(parse_cluster_shards(arr({
      shard({0, 5460}, {shard_node("127.0.0.1", 7000, "master"), shard_node("127.0.0.1", 7003, "replica")}),
      shard({5461, 10922}, {shard_node("127.0.0.1", 7001, "master")}),
      shard({10923, 16383}, {shard_node("127.0.0.1", 7002, "master")}),
  })));
}

}  // namespace

TEST_CASE("cluster: CRC16 and key slots as Redis computes them") {
  CHECK(crc16("123456789") == 0x31C3);  // XMODEM's check value, the one Redis's spec gives
  CHECK(crc16("") == 0);
  CHECK(key_slot("123456789") == 12739);
  CHECK(key_slot("foo") == 12182);
  // Hash tags: the text between the first '{' and the first '}' after it, when not empty.
  CHECK(hash_tag("{user1000}.following") == "user1000");
  CHECK(key_slot("{user1000}.following") == key_slot("{user1000}.followers"));
  CHECK(hash_tag("foo{}{bar}") == "foo{}{bar}");  // empty: the whole key
  CHECK(hash_tag("foo{{bar}}zap") == "{bar");
  CHECK(hash_tag("foo{bar}{zap}") == "bar");
  CHECK(hash_tag("no tag}{") == "no tag}{");
  CHECK(hash_tag("{open") == "{open");
  CHECK(key_slot("jobrt:{q}:ready") == key_slot("q"));
}

TEST_CASE("cluster: every slot has a short tag that hashes to it") {
  std::size_t longest = 0;
  for (std::uint32_t slot = 0; slot < cluster_slots; ++slot) {
    auto tag = slot_tag(static_cast<std::uint16_t>(slot));
    longest = std::max(longest, tag.size());
    if (key_slot("jobrt:lock:wake{" + tag + "}") != slot) {
      FAIL_CHECK("slot " << slot << ": tag " << tag << " is in slot " << key_slot(tag));
      break;
    }
  }
  CHECK(longest <= 6);
  CHECK(slot_tag(key_slot("0")) == "0");
}

TEST_CASE("cluster: one request's keys must share a slot - the error names two that do not") {
  std::vector<std::string> none;
  CHECK_FALSE(common_slot(none).has_value());
  std::vector<std::string> tagged{"jobrt:{q}:ready", "jobrt:{q}:delayed", "{q}"};
  CHECK(common_slot(tagged) == key_slot("q"));
  std::vector<std::string> apart{"jobrt:{q}:ready", "jobrt:{other}:ready"};
  try {
    (void)common_slot(apart);
    FAIL("no error");
  } catch (const cross_slot_error& e) {
    std::string what = e.what();
    CHECK(what.find("'jobrt:{q}:ready' is in slot " + std::to_string(key_slot("q"))) != std::string::npos);
    CHECK(what.find("'jobrt:{other}:ready' in slot " + std::to_string(key_slot("other"))) != std::string::npos);
  }
}

TEST_CASE("cluster: node addresses") {
  CHECK(parse_address("127.0.0.1:6379") == at("127.0.0.1", 6379));
  CHECK(parse_address("::1:6380") == at("::1", 6380));
  CHECK(parse_address("[::1]:6380") == at("::1", 6380));
  CHECK(parse_address(":6380") == at("", 6380));  // Redis 7: the endpoint of the node that answered
  CHECK_FALSE(parse_address("localhost").has_value());
  CHECK_FALSE(parse_address("host:0").has_value());
  CHECK_FALSE(parse_address("host:70000").has_value());
  CHECK_FALSE(parse_address("host:12x").has_value());
  CHECK(at("::1", 6380).text() == "[::1]:6380");
  CHECK(at("10.0.0.1", 6380).text() == "10.0.0.1:6380");
}

TEST_CASE("cluster: what an error reply means") {
  auto moved = classify("MOVED 3999 127.0.0.1:6381");
  CHECK(moved.kind == cluster_error::moved);
  CHECK(moved.slot == 3999);
  CHECK(moved.to == at("127.0.0.1", 6381));
  auto ask = classify("ASK 12182 10.0.0.2:7002");
  CHECK(ask.kind == cluster_error::ask);
  CHECK(ask.slot == 12182);
  CHECK(ask.to == at("10.0.0.2", 7002));
  CHECK(classify("TRYAGAIN Multiple keys request during rehashing of slot").kind == cluster_error::try_again);
  CHECK(classify("CLUSTERDOWN The cluster is down").kind == cluster_error::cluster_down);
  CHECK(classify("LOADING Redis is loading the dataset in memory").kind == cluster_error::loading);
  CHECK(classify("ERR unknown command").kind == cluster_error::other);
  CHECK(classify("NOSCRIPT No matching script").kind == cluster_error::other);
  CHECK(classify("MOVED").kind == cluster_error::other);  // not as Redis writes one: the answer as it is
  CHECK(classify("MOVED 99999 127.0.0.1:6381").kind == cluster_error::other);
  CHECK(classify("MOVED 12 nowhere").kind == cluster_error::other);
}

TEST_CASE("cluster: CLUSTER SHARDS becomes a slot map of the online primaries") {
  auto shards = parse_cluster_shards(arr({
      shard({0, 100, 200, 5460}, {shard_node("127.0.0.1", 7000, "master"), shard_node("127.0.0.1", 7003, "replica"),
                                  shard_node("127.0.0.1", 7004, "replica", "failed")}),
      shard({101, 199}, {shard_node("?", 7001, "master")}),                     // endpoint unknown: its IP
      shard({5461, 10922}, {shard_node("127.0.0.1", 7005, "master", "failed"),  // failing over: unserved
                            shard_node("127.0.0.1", 7006, "replica")}),
      shard({}, {shard_node("127.0.0.1", 7007, "master")}),  // no slots: not a shard to route to
      shard({10923, 16383}, {shard_node("127.0.0.1", 7002, "master")}),
  }));
  REQUIRE(shards.size() == 3);
  CHECK(shards[0].ranges.size() == 2);
  CHECK(shards[0].primary == at("127.0.0.1", 7000));
  CHECK(shards[0].replicas == std::vector<node_address>{at("127.0.0.1", 7003)});
  CHECK(shards[1].primary == at("10.0.0.9", 7001));
  slot_map map(shards);
  CHECK_FALSE(map.complete());
  CHECK(map.unserved() == 10922 - 5461 + 1);
  REQUIRE(map.owner(150) != nullptr);
  CHECK(*map.owner(150) == at("10.0.0.9", 7001));
  CHECK(*map.owner(0) == at("127.0.0.1", 7000));
  CHECK(*map.owner(5460) == at("127.0.0.1", 7000));
  CHECK(map.owner(6000) == nullptr);
  CHECK(*map.owner(16383) == at("127.0.0.1", 7002));
  CHECK(map.primaries() ==
        std::vector<node_address>{at("127.0.0.1", 7000), at("10.0.0.9", 7001), at("127.0.0.1", 7002)});
  map.assign(6000, at("127.0.0.1", 7006));  // a MOVED: that slot only
  CHECK(*map.owner(6000) == at("127.0.0.1", 7006));
  CHECK(map.owner(6001) == nullptr);
  // Replies that are not CLUSTER SHARDS' say what they hold.
  CHECK_THROWS_AS(parse_cluster_shards(str("OK")), topology_error);
  CHECK_THROWS_AS(parse_cluster_shards(arr({shard({1}, {})})), topology_error);
  CHECK_THROWS_AS(parse_cluster_shards(arr({shard({20, 10}, {})})), topology_error);
  CHECK_THROWS_AS(parse_cluster_shards(arr({shard({0, 16384}, {})})), topology_error);
  CHECK_THROWS_AS(parse_cluster_shards(arr({shard({0, 10}, {arr({str("role"), str("master")})})})), topology_error);
}

TEST_CASE("cluster: CLUSTER SLOTS becomes the same map") {
  auto node = [](std::string host, std::int64_t port) { return arr({str(std::move(host)), num(port), str("id")}); };
  auto shards = parse_cluster_slots(arr({
      arr({num(0), num(5460), node("127.0.0.1", 7000), node("127.0.0.1", 7003)}),
      arr({num(5461), num(10922), node("127.0.0.1", 7001)}),
      arr({num(10923), num(16383), node("127.0.0.1", 7002)}),
  }));
  slot_map map(shards);
  CHECK(map.complete());
  CHECK(*map.owner(5461) == at("127.0.0.1", 7001));
  CHECK(shards[0].replicas == std::vector<node_address>{at("127.0.0.1", 7003)});
  CHECK_THROWS_AS(parse_cluster_slots(arr({arr({num(0), num(5460)})})), topology_error);
  CHECK_THROWS_AS(parse_cluster_slots(arr({arr({num(0), num(5460), arr({num(1)})})})), topology_error);
}

TEST_CASE("cluster: a request goes to its slot's primary, follows MOVED and ASK, and waits out TRYAGAIN") {
  auto map = three();
  auto now = steady::now();
  auto slot = key_slot("foo");  // 12182: at 7002
  cluster_route route(map, slot, at("127.0.0.1", 7000), now + 1s);
  auto a = route.next(now);
  CHECK(a.kind == cluster_route::action::send);
  CHECK(a.node == at("127.0.0.1", 7002));
  CHECK_FALSE(a.asking);
  CHECK_FALSE(a.refresh);
  // Moved: the map learns the slot's new owner, the request goes there, and the map is to be
  // refreshed.
  a = route.on_reply(err("MOVED 12182 127.0.0.1:7001"), now);
  CHECK(a.kind == cluster_route::action::send);
  CHECK(a.node == at("127.0.0.1", 7001));
  CHECK(a.refresh);
  CHECK(*map.owner(slot) == at("127.0.0.1", 7001));
  CHECK(*map.owner(slot + 1) == at("127.0.0.1", 7002));  // only that slot
  // Being migrated: once to the node named, with ASKING; the map stays.
  a = route.on_reply(err("ASK 12182 127.0.0.1:7000"), now);
  CHECK(a.kind == cluster_route::action::send);
  CHECK(a.node == at("127.0.0.1", 7000));
  CHECK(a.asking);
  CHECK_FALSE(a.refresh);
  CHECK(*map.owner(slot) == at("127.0.0.1", 7001));
  // A migration splits the keys for now: wait, longer each time, then the owner again.
  a = route.on_reply(err("TRYAGAIN Multiple keys request during rehashing of slot"), now);
  CHECK(a.kind == cluster_route::action::wait);
  CHECK(a.delay == 10ms);
  a = route.next(now + 10ms);
  CHECK(a.kind == cluster_route::action::send);
  CHECK(a.node == at("127.0.0.1", 7001));
  CHECK_FALSE(a.asking);  // an ASK redirects one send only
  a = route.on_reply(err("CLUSTERDOWN The cluster is down"), now + 10ms);
  CHECK(a.kind == cluster_route::action::wait);
  CHECK(a.delay == 20ms);
  a = route.on_reply(str("bar"), now + 30ms);
  CHECK(a.kind == cluster_route::action::done);
  // An error that is not the cluster's is the request's answer.
  cluster_route other(map, slot, at("127.0.0.1", 7000), now + 1s);
  (void)other.next(now);
  CHECK(other.on_reply(err("WRONGTYPE Operation against a key holding the wrong kind of value"), now).kind ==
        cluster_route::action::done);
}

TEST_CASE("cluster: a script or a pipeline met by ASK waits for the migration's end at the slot's owner") {
  auto map = three();
  auto now = steady::now();
  auto slot = key_slot("foo");  // 12182: at 7002
  cluster_route route(map, slot, at("127.0.0.1", 7000), now + 1s, false);
  auto a = route.next(now);
  CHECK(a.node == at("127.0.0.1", 7002));
  a = route.on_reply(err("ASK 12182 127.0.0.1:7000"), now);
  CHECK(a.kind == cluster_route::action::wait);
  CHECK(a.delay == 10ms);
  CHECK_FALSE(a.refresh);
  a = route.next(now + 10ms);  // the owner again, without ASKING
  CHECK(a.kind == cluster_route::action::send);
  CHECK(a.node == at("127.0.0.1", 7002));
  CHECK_FALSE(a.asking);
  // The migration has ended: the new owner's MOVED is followed as ever.
  a = route.on_reply(err("MOVED 12182 127.0.0.1:7000"), now + 10ms);
  CHECK(a.kind == cluster_route::action::send);
  CHECK(a.node == at("127.0.0.1", 7000));
  CHECK_FALSE(a.asking);
  CHECK(route.on_reply(str("bar"), now + 10ms).kind == cluster_route::action::done);
}

TEST_CASE("cluster: a route ends by its deadline, and after too many redirects") {
  auto map = three();
  auto now = steady::now();
  cluster_route loading(map, key_slot("a"), at("127.0.0.1", 7000), now + 100ms);
  (void)loading.next(now);
  auto t = now;
  int waits = 0;
  cluster_route::action a;
  for (;;) {
    a = loading.on_reply(err("LOADING Redis is loading the dataset in memory"), t);
    if (a.kind != cluster_route::action::wait) break;
    ++waits;
    t += a.delay;
    CHECK(loading.next(t).kind == cluster_route::action::send);
  }
  CHECK(a.kind == cluster_route::action::fail);
  CHECK(a.error.find("LOADING") != std::string::npos);
  CHECK(waits == 3);  // 10 + 20 + 40 ms; 80 more would pass the deadline
  // Two nodes that send it to each other: the first MOVED is followed at once, the next ones
  // after a wait (a slot's move half told), until the redirects run out.
  cluster_route loop(map, key_slot("a"), at("127.0.0.1", 7000), now + 60s);
  (void)loop.next(now);
  int sends = 1, bounce_waits = 0;
  t = now;
  for (;;) {
    a = loop.on_reply(err(sends % 2 ? "MOVED 15495 127.0.0.1:7001" : "MOVED 15495 127.0.0.1:7002"), t);
    if (a.kind == cluster_route::action::wait) {
      ++bounce_waits;
      t += a.delay;
      a = loop.next(t);
    }
    if (a.kind != cluster_route::action::send) break;
    CHECK(a.node == at("127.0.0.1", sends % 2 ? 7001 : 7002));
    ++sends;
  }
  CHECK(a.kind == cluster_route::action::fail);
  CHECK(sends == cluster_route::max_redirects + 1);
  CHECK(bounce_waits == cluster_route::max_redirects - 1);
  CHECK(a.error.find("redirected more than 16 times") != std::string::npos);
  // A MOVED after something else (here a TRYAGAIN) is followed at once: only MOVEDs in a row wait.
  auto moves = three();
  cluster_route moving(moves, key_slot("a"), at("127.0.0.1", 7000), now + 60s);
  (void)moving.next(now);
  CHECK(moving.on_reply(err("MOVED 15495 127.0.0.1:7001"), now).kind == cluster_route::action::send);
  CHECK(moving.on_reply(err("TRYAGAIN Multiple keys request during rehashing of slot"), now).kind ==
        cluster_route::action::wait);
  (void)moving.next(now + 10ms);
  a = moving.on_reply(err("MOVED 15495 127.0.0.1:7002"), now + 10ms);
  CHECK(a.kind == cluster_route::action::send);
  CHECK(a.node == at("127.0.0.1", 7002));
  // A redirect without a host names a node at the host the request went to.
  a = moving.on_reply(err("MOVED 15495 :7005"), now + 10ms);
  CHECK(a.kind == cluster_route::action::wait);  // (a MOVED right after a MOVED)
  a = moving.next(now + 40ms);
  CHECK(a.node == at("127.0.0.1", 7005));
  // A slot nobody serves: wait for a refreshed map, until the deadline.
  slot_map empty;
  cluster_route nowhere(empty, 5, at("127.0.0.1", 7000), now + 15ms);
  a = nowhere.next(now);
  CHECK(a.kind == cluster_route::action::wait);
  CHECK(a.refresh);
  a = nowhere.next(now + 10ms);
  CHECK(a.kind == cluster_route::action::fail);
  CHECK(a.error.find("no node serves slot 5") != std::string::npos);
  // A primary that cannot be reached: wait for the map to name another, and send again.
  cluster_route down(map, key_slot("a"), at("127.0.0.1", 7000), now + 1s);
  CHECK(down.next(now).node == at("127.0.0.1", 7002));
  CHECK(down.on_reply(err("ASK 15495 127.0.0.1:7001"), now).asking);
  a = down.on_unreachable("127.0.0.1:7001 cannot be reached", now);
  CHECK(a.kind == cluster_route::action::wait);
  CHECK(a.refresh);
  map.assign(key_slot("a"), at("127.0.0.1", 7005));  // (what the refresh learned)
  a = down.next(now + a.delay);
  CHECK(a.node == at("127.0.0.1", 7005));
  CHECK_FALSE(a.asking);  // the ASK went with the send that did not happen
  // A request without keys goes to the node given for those.
  cluster_route keyless(map, std::nullopt, at("127.0.0.1", 7001), now + 1s);
  a = keyless.next(now);
  CHECK(a.kind == cluster_route::action::send);
  CHECK(a.node == at("127.0.0.1", 7001));
}

TEST_CASE("cluster: a node alone, which knows no IP of its own, is reached at the host the topology came from") {
  // A cluster of one node that never met another: its IP and endpoint are empty.
  auto alone = arr({str("id"), str("0123abcd"), str("port"), num(7000), str("ip"), str(""), str("endpoint"), str(""),
                    str("role"), str("master"), str("replication-offset"), num(0), str("health"), str("online")});
  auto shards = parse_cluster_shards(arr({shard({0, 16383}, {alone})}), "127.0.0.1");
  REQUIRE(shards.size() == 1);
  CHECK(shards[0].primary == at("127.0.0.1", 7000));
  CHECK(slot_map(shards).complete());
  CHECK(parse_cluster_shards(arr({shard({0, 16383}, {alone})})).empty());  // asked nowhere: left out
  // CLUSTER SLOTS says it with an empty host, or a null one (an unknown endpoint).
  for (auto& host : {str(""), reply()}) {
    auto slots = parse_cluster_slots(arr({arr({num(0), num(16383), arr({host, num(7000), str("id")})})}), "::1");
    REQUIRE(slots.size() == 1);
    CHECK(slots[0].primary == at("::1", 7000));
  }
}
