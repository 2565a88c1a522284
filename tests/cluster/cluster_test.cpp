// Redis Cluster against a real local cluster (scripts/cluster.sh). Its no-I/O parts
// (runtime/src/redis/cluster_map.hpp): key slots agree with the server's, the topology replies it
// sends become a map that sends every key to its primary, and one request's route follows the
// MOVED, ASK and TRYAGAIN replies a slot migration makes. The client (cluster_connection):
// requests reach their keys' primaries, through a migration and after it, and through a failover.
// The Redis backend on a cluster: a worker waiting for work follows its queue to a new primary,
// and the demo's checks hold while its queue's slot moves by hand and a third of the slots are
// resharded. A queue of 16 shards: 100 idle workers cost the cluster few commands. A stream
// bridge follows its stream's slot when it moves and when its primary dies.
#include "redis/cluster_map.hpp"

#include <jobrt/bridge.hpp>
#include <jobrt/memory_backend.hpp>
#include <jobrt/mutex.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/redis/cluster.hpp>
#include <jobrt/redis/connection.hpp>
#include <jobrt/redis/script.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/sharded_backend.hpp>
#include <jobrt/worker.hpp>

#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"
#include "support/run.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace asio = boost::asio;
using namespace jobrt;
using namespace jobrt::redis;
using namespace jobrt::redis::detail;
using namespace jobrt::test;
using namespace std::chrono_literals;
using asio::awaitable;
using steady = std::chrono::steady_clock;

namespace {

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

// One connection per node, by port.
class nodes {
 public:
  nodes(asio::io_context& ctx, const redis_cluster& c) {
    for (int i = 0; i < redis_cluster::nodes; ++i) {
      auto conn = std::make_unique<connection>(ctx.get_executor(), c.config(i));
      conn->start();
      by_port_[static_cast<std::uint16_t>(c.first() + i)] = std::move(conn);
    }
  }
  connection& at(const node_address& n) { return *by_port_.at(n.port); }
  connection& at(int port) { return *by_port_.at(static_cast<std::uint16_t>(port)); }

 private:
  std::map<std::uint16_t, std::unique_ptr<connection>> by_port_;
};

// Sends `req` where the route says until it is done or fails: the reply, or the failure's text.
awaitable<reply> routed(nodes& n, cluster_route& route, const request& req, std::vector<std::string>* trail) {
  auto a = route.next(steady::now());
  for (;;) {
    if (a.kind == cluster_route::action::fail) co_return reply::make_string(a.error, reply_kind::error);
    if (a.kind == cluster_route::action::wait) {
      if (trail) trail->push_back("wait");
      asio::steady_timer t(co_await asio::this_coro::executor, a.delay);
      co_await t.async_wait(use_tuple);
      a = route.next(steady::now());
      continue;
    }
    if (trail) trail->push_back(fmt::format("{}{}", a.asking ? "asking " : "", a.node.port));
    reply r;
    if (a.asking) {
      request asking("ASKING");
      asking.append(req);
      auto [ec, both] = co_await n.at(a.node).async_exec(std::move(asking), use_tuple);
      REQUIRE(both.kind() == reply_kind::array);
      REQUIRE(both.as_array().size() == 2);
      r = both.as_array()[1];
    } else {
      auto [ec, one] = co_await n.at(a.node).async_exec(req, use_tuple);
      r = std::move(one);
    }
    a = route.on_reply(r, steady::now());
    if (a.kind == cluster_route::action::done) co_return r;
  }
}

// Slot migration by hand, through redis-cli (outside the coroutines: g++ 12 does not take some
// braced lists inside them).
void set_slot(const redis_cluster& c, const node_address& node, std::uint16_t slot, std::string state, std::string id) {
  std::vector<std::string> args{"CLUSTER", "SETSLOT", std::to_string(slot), std::move(state), std::move(id)};
  c.cli(node.port - c.first(), args);
}

void migrate_key(const redis_cluster& c, const node_address& from, const node_address& to, const std::string& key) {
  std::vector<std::string> args{"MIGRATE", "127.0.0.1", std::to_string(to.port), "", "0", "5000", "KEYS", key};
  c.cli(from.port - c.first(), args);
}

std::string id_of(const redis_cluster& c, int port) { return c.id_of(port); }

// The replica of a primary (CLUSTER REPLICAS: node lines, "<id> <host>:<port>@<bus> ...").
node_address replica_of(const redis_cluster& c, const node_address& primary) {
  std::vector<std::string> args{"CLUSTER", "REPLICAS", id_of(c, primary.port)};
  auto line = c.cli(0, args);
  auto start = line.find(' ') + 1;
  auto address = parse_address(line.substr(start, line.find('@') - start));
  REQUIRE_MESSAGE(address.has_value(), "CLUSTER REPLICAS said: " << line);
  return *address;
}

// How many keys a node holds (DBSIZE, which a replica answers too).
int keys_at(const redis_cluster& c, const node_address& node) {
  std::vector<std::string> args(1, "DBSIZE");
  return std::atoi(c.cli(node.port - c.first(), args).c_str());
}

// Moves a slot, with its keys, from one primary to another, as `redis-cli --cluster reshard` does.
void move_slot(const redis_cluster& c, std::uint16_t slot, const node_address& from, const node_address& to) {
  c.move_slot(slot, from.port, to.port);
}

// A job of type "t" whose payload is {"i": i}.
job_spec numbered(int i) {
  job_spec s;
  s.type = "t";
  s.payload = {{"i", i}};
  return s;
}

// Whether a primary's replica has all it wrote (INFO replication: its offset, the replica's).
bool in_sync(const redis_cluster& c, const node_address& primary) {
  std::vector<std::string> args{"INFO", "replication"};
  auto info = c.cli(primary.port - c.first(), args);
  auto number_after = [&](std::string_view label) {
    auto at = info.find(label);
    return at == std::string::npos ? -1 : std::atoll(info.c_str() + at + label.size());
  };
  auto own = number_after("master_repl_offset:");
  return own > 0 && number_after(",offset=") == own;
}

// Every node forgets its scripts.
void flush_scripts(const redis_cluster& c) {
  std::vector<std::string> args{"SCRIPT", "FLUSH"};
  for (int node = 0; node < redis_cluster::nodes; ++node) c.cli(node, args);
}

}  // namespace

TEST_CASE("cluster: key slots agree with the server's CLUSTER KEYSLOT") {
  redis_cluster cluster;
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        connection conn(ctx.get_executor(), cluster.config(0));
        conn.start();
        std::mt19937 random(7);
        const std::string alphabet = "ab{}:#xyz0123456789-_";
        std::vector<std::string> keys{"", "{", "}", "{}", "{}{a}", "a{b}c{d}", "jobrt:{imports#3}:ready", "\xff\x01"};
        for (int i = 0; i < 400; ++i) {
          std::string key;
          auto length = random() % 24;
          for (unsigned j = 0; j < length; ++j) key += alphabet[random() % alphabet.size()];
          keys.push_back(std::move(key));
        }
        for (const auto& key : keys) {
          auto server = (co_await exec(conn, request("CLUSTER", "KEYSLOT", key))).as_integer();
          CHECK_MESSAGE(key_slot(key) == server, "key '" << key << "'");
        }
      },
      30s);
}

TEST_CASE("cluster: the map read from CLUSTER SHARDS or CLUSTER SLOTS sends every key to its primary") {
  redis_cluster cluster;
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        nodes n(ctx, cluster);
        auto& any = n.at(cluster.first());
        slot_map from_shards(parse_cluster_shards(co_await exec(any, request("CLUSTER", "SHARDS"))));
        slot_map from_slots(parse_cluster_slots(co_await exec(any, request("CLUSTER", "SLOTS"))));
        CHECK(from_shards.complete());
        CHECK(from_slots.complete());
        CHECK(from_shards.primaries().size() == 3);
        for (std::uint16_t s = 0; s < cluster_slots; ++s)
          if (*from_shards.owner(s) != *from_slots.owner(s)) {
            FAIL_CHECK("slot " << s << ": " << from_shards.owner(s)->text() << " or " << from_slots.owner(s)->text());
            break;
          }
        for (int i = 0; i < 200; ++i) {
          auto key = fmt::format("key:{}", i);
          auto owner = *from_shards.owner(key_slot(key));
          auto [ec, r] = co_await n.at(owner).async_exec(request("SET", key, "v"), use_tuple);
          CHECK_MESSAGE(!ec, key << ": " << r.error_message());
          // Any other primary sends it there.
          for (const auto& other : from_shards.primaries()) {
            if (other == owner) continue;
            auto [ec2, moved] = co_await n.at(other).async_exec(request("GET", key), use_tuple);
            auto e = classify(moved.error_message());
            CHECK(e.kind == cluster_error::moved);
            CHECK(e.slot == key_slot(key));
            CHECK(e.to == owner);
          }
        }
      },
      60s);
}

TEST_CASE("cluster: a request's route follows MOVED, and ASK and TRYAGAIN while its slot migrates") {
  redis_cluster cluster;
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        nodes n(ctx, cluster);
        auto& any = n.at(cluster.first());
        slot_map map(parse_cluster_shards(co_await exec(any, request("CLUSTER", "SHARDS"))));
        REQUIRE(map.complete());
        auto primaries = map.primaries();
        REQUIRE(primaries.size() == 3);
        const std::string key = "{mig}1", other_key = "{mig}2";
        auto slot = key_slot(key);
        auto from = *map.owner(slot);
        auto to = from == primaries[0] ? primaries[1] : primaries[0];
        co_await exec(n.at(from), request("SET", key, "one"));
        co_await exec(n.at(from), request("SET", other_key, "two"));

        // A stale map: the slot at the wrong primary. MOVED puts it right, for later requests too.
        map.assign(slot, to);
        std::vector<std::string> trail;
        cluster_route stale(map, slot, from, steady::now() + 5s);
        auto r = co_await routed(n, stale, request("GET", key), &trail);
        CHECK(r.as_string() == "one");
        CHECK(trail == std::vector<std::string>{std::to_string(to.port), std::to_string(from.port)});
        CHECK(*map.owner(slot) == from);

        // The slot migrates from `from` to `to`, and `key` has moved: `from` answers ASK for it.
        auto from_id = id_of(cluster, from.port), to_id = id_of(cluster, to.port);
        CHECK(cluster.cli(to.port - cluster.first(), {"CLUSTER", "SETSLOT", std::to_string(slot), "IMPORTING", from_id})
                  .starts_with("OK"));
        CHECK(cluster.cli(from.port - cluster.first(), {"CLUSTER", "SETSLOT", std::to_string(slot), "MIGRATING", to_id})
                  .starts_with("OK"));
        CHECK((co_await exec(n.at(from), request("MIGRATE", "127.0.0.1", to.port, "", 0, 5000, "KEYS", key)))
                  .as_string() == "OK");
        trail.clear();
        cluster_route asked(map, slot, from, steady::now() + 5s);
        r = co_await routed(n, asked, request("GET", key), &trail);
        CHECK(r.as_string() == "one");
        CHECK(trail == std::vector<std::string>{std::to_string(from.port), "asking " + std::to_string(to.port)});
        CHECK(*map.owner(slot) == from);  // ASK leaves the map as it is
        // Its keys split between the two, a request for both is told to try again; the route
        // waits, and fails at its deadline while the split lasts.
        trail.clear();
        request both("MGET", key, other_key);
        cluster_route split(map, slot, from, steady::now() + 200ms);
        r = co_await routed(n, split, both, &trail);
        CHECK(r.is_error());
        CHECK(std::string(r.error_message()).find("TRYAGAIN") != std::string::npos);
        CHECK(trail.size() >= 4);  // sent, waited, sent again, ...
        CHECK(trail[1] == "wait");

        // The migration ends: the slot is `to`'s, and `from` answers MOVED.
        CHECK((co_await exec(n.at(from), request("MIGRATE", "127.0.0.1", to.port, "", 0, 5000, "KEYS", other_key)))
                  .as_string() == "OK");
        for (const auto& node : primaries)
          cluster.cli(node.port - cluster.first(), {"CLUSTER", "SETSLOT", std::to_string(slot), "NODE", to_id});
        trail.clear();
        cluster_route after(map, slot, from, steady::now() + 5s);
        r = co_await routed(n, after, both, &trail);
        REQUIRE(r.kind() == reply_kind::array);
        CHECK(r.as_array()[0].as_string() == "one");
        CHECK(r.as_array()[1].as_string() == "two");
        CHECK(trail == std::vector<std::string>{std::to_string(from.port), std::to_string(to.port)});
        CHECK(*map.owner(slot) == to);
      },
      60s);
}

TEST_CASE("cluster connection: a cluster of one node, which knows no IP of its own, serves every slot") {
  // A node that never met another reports an empty IP and endpoint: reached where it was asked.
  // (Its bus port named: port + 10000, the default, is past 65535 for a port above 55535.)
  redis_server alone({"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-port",
                      std::to_string(free_port())});
  redis_cli(alone.config(), {"CLUSTER", "ADDSLOTSRANGE", "0", "16383"});
  auto until = steady::now() + 10s;
  while (redis_cli(alone.config(), {"CLUSTER", "INFO"}).find("cluster_state:ok") == std::string::npos &&
         steady::now() < until)
    std::this_thread::sleep_for(20ms);
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        std::vector<redis::config> seeds(1, alone.config());
        cluster_connection c(ctx.get_executor(), seeds);
        c.start();
        for (int round = 0; round < 2; ++round) {
          co_await c.refresh();  // the map it reads serves every slot, at the node asked
          for (int i = 0; i < 50; ++i) {
            auto key = fmt::format("k:{}", i);
            std::vector<std::string> keys{key};
            CHECK((co_await c.exec(request("SET", key, i), keys)).as_string() == "OK");
          }
        }
        CHECK(c.primaries() == std::vector<std::string>{fmt::format("127.0.0.1:{}", alone.port())});
        CHECK(c.refreshes() >= 2);
      },
      30s);
}

TEST_CASE("cluster connection: requests that wait for a slow first map read wait without spinning") {
  // A seed that accepts and never answers: the map read waits for its connect timeout (2 s), and
  // every request meanwhile waits for that read. Four of them used to cancel one another's
  // waits in turn, a core's worth of CPU for as long as the read took.
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        asio::ip::tcp::acceptor mute(ctx, {asio::ip::make_address("127.0.0.1"), 0});
        std::vector<asio::ip::tcp::socket> held;
        asio::co_spawn(
            ctx,
            [&]() -> awaitable<void> {
              for (;;) {
                auto [ec, s] = co_await mute.async_accept(asio::as_tuple(asio::use_awaitable));
                if (ec) co_return;
                held.push_back(std::move(s));
              }
            },
            asio::detached);
        redis::config seed;
        seed.host = "127.0.0.1";
        seed.port = std::to_string(mute.local_endpoint().port());
        std::vector<redis::config> seeds(1, seed);
        cluster_connection c(ctx.get_executor(), seeds);
        c.start();
        auto cpu = [] {
          rusage u{};
          ::getrusage(RUSAGE_SELF, &u);
          return std::chrono::seconds(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
                 std::chrono::microseconds(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
        };
        auto began = cpu();
        auto wall = steady::now();
        int failed = 0;
        auto one = [&]() -> awaitable<void> {
          request ping("PING");
          ping.options.timeout = 1500ms;
          try {
            co_await c.exec(std::move(ping));
          } catch (const std::exception&) {
            ++failed;  // (a timeout: nobody answered)
          }
        };
        for (int i = 0; i < 4; ++i) asio::co_spawn(ctx, one(), asio::detached);
        co_await eventually([&] { return failed == 4; }, 10s);
        auto used = cpu() - began;
        auto took = steady::now() - wall;
        CHECK(failed == 4);
        MESSAGE("CPU " << std::chrono::duration_cast<std::chrono::milliseconds>(used).count() << " ms in "
                       << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms");
        CHECK(used < took / 4);
        c.close();
        mute.close();
      },
      30s);
}

TEST_CASE("cluster connection: each request goes to its keys' primary - keys of two slots are refused unsent") {
  redis_cluster cluster;
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        auto seeds = cluster_seeds(cluster.url());
        REQUIRE(seeds.size() == 2);
        cluster_connection c(ctx.get_executor(), seeds);
        c.start();
        for (int i = 0; i < 300; ++i) {
          auto key = fmt::format("k:{}", i);
          std::vector<std::string> keys{key};
          CHECK((co_await c.exec(request("SET", key, i), keys)).as_string() == "OK");
        }
        CHECK(c.primaries().size() == 3);
        CHECK(c.connections() <= 4);  // the three primaries (and a seed that is not one)
        // Each key is where the server says it is: its primary has it.
        slot_map map(parse_cluster_shards(co_await c.exec(request("CLUSTER", "SHARDS"))));
        for (int i = 0; i < 300; i += 37) {
          auto key = fmt::format("k:{}", i);
          auto owner = *map.owner(key_slot(key));
          auto got = cluster.cli(owner.port - cluster.first(), {"GET", key});
          CHECK(got.starts_with(std::to_string(i)));
        }
        // A pipeline of one slot; keys of two slots never leave the process.
        request both("SET", "{t}a", "1");
        both.push("MGET", "{t}a", "{t}b");
        std::vector<std::string> tagged{"{t}a", "{t}b"};
        auto r = co_await c.exec(std::move(both), tagged);
        REQUIRE(r.as_array().size() == 2);
        CHECK(r.as_array()[1].as_array()[0].as_string() == "1");
        std::vector<std::string> apart{"{t}a", "{u}a"};
        bool refused = false;
        try {
          co_await c.exec(request("MGET", "{t}a", "{u}a"), apart);
        } catch (const std::invalid_argument& e) {
          refused = std::string(e.what()).find("'{u}a' in slot") != std::string::npos;
        }
        CHECK(refused);
        // An error reply is the request's answer, as on a plain connection.
        std::vector<std::string> one{"k:1"};
        boost::system::error_code wrong_type;
        try {
          co_await c.exec(request("LPUSH", "k:1", "x"), one);
        } catch (const boost::system::system_error& e) {
          wrong_type = e.code();
        }
        CHECK(wrong_type == errc::server_error);
      },
      60s);
}

TEST_CASE(
    "cluster: a node that does not serve a shard channel's slot refuses it - the subscriber gets a dropped notice") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    std::vector<config> seeds{shared_cluster()};
    cluster_connection c(ctx.get_executor(), seeds);
    c.start();
    std::string channel = key_prefix() + "{wake}";
    auto owner = co_await c.primary_of(channel);
    auto other = owner;
    for (const auto& address : c.primaries()) {
      auto port = address.substr(address.rfind(':') + 1);
      if (port != owner.port) other.port = port;
    }
    REQUIRE(other.port != owner.port);
    // Refused with MOVED: a notice that the channel is not held there (the receiver subscribes
    // where it is served), not a subscription lost without a word.
    subscriber wrong(ctx.get_executor(), other);
    wrong.start();
    wrong.ssubscribe(std::vector<std::string>(1, channel));
    auto m = co_await wrong.async_receive(asio::use_awaitable);
    CHECK(m.dropped);
    CHECK(m.channel == channel);
    CHECK_FALSE(m.confirmation);
    subscriber right(ctx.get_executor(), owner);
    right.start();
    right.ssubscribe(std::vector<std::string>(1, channel));
    m = co_await right.async_receive(asio::use_awaitable);
    CHECK(m.confirmation);
    std::vector<std::string> keys{channel};
    co_await c.exec(request("SPUBLISH", channel, "here"), keys);
    m = co_await right.async_receive(asio::use_awaitable);
    CHECK(m.channel == channel);
    CHECK(m.payload == "here");
    c.close();
  });
}

TEST_CASE("cluster lock: hand-offs come by sharded pub/sub on a channel of the lock's slot, heard at its primary") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    redis_lock_options lo;
    lo.prefix = key_prefix() + "lock:";
    redis_lock_service a(ctx.get_executor(), shared_cluster(), lo);
    redis_lock_service b(ctx.get_executor(), shared_cluster(), lo);
    std::vector<config> seeds{shared_cluster()};
    cluster_connection c(ctx.get_executor(), seeds);
    c.start();
    std::array<lock_order, 2> orders{lock_order::any, lock_order::fifo};
    for (auto order : orders) {
      lock_options o;
      o.ttl = 20s;  // the waiter's backstop: far beyond the bound below
      o.wait = 10s;
      o.order = order;
      auto name = fmt::format("l{}", static_cast<int>(order));
      auto held = co_await a.lock(name, o);
      bool taken = false;
      asio::co_spawn(
          ctx,
          [&]() -> awaitable<void> {
            auto l = co_await b.lock(name, o);
            taken = true;
            co_await l.unlock();
          },
          asio::detached);
      auto channel = fmt::format("{}wake{{{}}}", lo.prefix, slot_tag(key_slot(lo.prefix + "{" + name + "}")));
      REQUIRE(key_slot(channel) == key_slot(lo.prefix + "{" + name + "}"));
      auto owner = co_await c.primary_of(channel);
      auto listening = [&]() -> awaitable<bool> {
        auto [ec, r] = co_await c.try_exec_at(owner, request("PUBSUB", "SHARDCHANNELS"));
        if (ec) co_return false;
        for (const auto& e : r.as_array())
          if (e.as_string() == channel) co_return true;
        co_return false;
      };
      CHECK(co_await eventually(listening, 5s));
      auto began = steady::now();
      co_await held.unlock();
      CHECK(co_await eventually([&] { return taken; }, 5s));
      CHECK(steady::now() - began < 2s);
    }
    c.close();
  });
}

TEST_CASE("cluster connection: requests follow a slot while it migrates and after") {
  redis_cluster cluster;
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        cluster_connection c(ctx.get_executor(), cluster_seeds(cluster.url()));
        c.start();
        const std::string key = "{move}1", other_key = "{move}2";
        std::vector<std::string> keys(1, key), other_keys(1, other_key), both(keys);
        both.push_back(other_key);
        co_await c.exec(request("SET", key, "one"), keys);
        co_await c.exec(request("SET", other_key, "two"), other_keys);
        slot_map map(parse_cluster_shards(co_await c.exec(request("CLUSTER", "SHARDS"))));
        auto slot = key_slot(key);
        auto from = *map.owner(slot);
        auto primaries = map.primaries();
        auto to = from == primaries[0] ? primaries[1] : primaries[0];
        auto from_id = id_of(cluster, from.port), to_id = id_of(cluster, to.port);
        set_slot(cluster, to, slot, "IMPORTING", from_id);
        set_slot(cluster, from, slot, "MIGRATING", to_id);
        migrate_key(cluster, from, to, key);
        // Moved already: asked at its new node. Not yet: served where it was.
        CHECK((co_await c.exec(request("GET", key), keys)).as_string() == "one");
        CHECK((co_await c.exec(request("GET", other_key), other_keys)).as_string() == "two");
        // Split between the two: told to try again until the request's time is up.
        request split("MGET", key, other_key);
        split.options.timeout = 300ms;
        try {
          co_await c.exec(std::move(split), both);
          FAIL("no error");
        } catch (const boost::system::system_error& e) {
          CHECK(e.code() == errc::timeout);
          CHECK(std::string(e.what()).find("TRYAGAIN") != std::string::npos);
        }
        // A script loaded ahead of its call (script::run after NOSCRIPT): the load ran, the call
        // did not, and loading again is harmless: tried again until the request's time is up.
        request load_and_call("SCRIPT", "LOAD", "return redis.call('MGET', KEYS[1], KEYS[2])");
        load_and_call.push("EVAL", "return redis.call('MGET', KEYS[1], KEYS[2])", 2, key, other_key);
        load_and_call.options.timeout = 300ms;
        try {
          co_await c.exec(std::move(load_and_call), both);
          FAIL("no error");
        } catch (const boost::system::system_error& e) {
          CHECK(e.code() == errc::timeout);
          CHECK(std::string(e.what()).find("TRYAGAIN") != std::string::npos);
        }
        // A pipeline of writes half of which ran at the old node is not sent again (the APPEND
        // there would run twice): its replies come back, ASK in place of the other half.
        request halves("APPEND", other_key, "!");
        halves.push("APPEND", key, "!");
        auto half = co_await c.exec(std::move(halves), both);
        REQUIRE(half.as_array().size() == 2);
        CHECK(half.as_array()[0].as_integer() == 4);
        CHECK(half.as_array()[1].is_error());
        CHECK(half.as_array()[1].error_message().starts_with("ASK"));
        migrate_key(cluster, from, to, other_key);
        for (const auto& node : primaries) set_slot(cluster, node, slot, "NODE", to_id);
        auto refreshes = c.refreshes();
        auto r = co_await c.exec(request("MGET", key, other_key), both);  // MOVED, then there
        CHECK(r.as_array()[0].as_string() == "one");
        CHECK(r.as_array()[1].as_string() == "two!");                               // (appended once)
        CHECK(co_await eventually([&] { return c.refreshes() > refreshes; }, 5s));  // the MOVED asked for the map
      },
      60s);
}

TEST_CASE("cluster connection: carries on when a primary dies and its replica takes over") {
  redis_cluster cluster;
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        cluster_options o;
        o.request_timeout = 30s;   // the failover: node timeout 2 s, then the replicas' election
        o.refresh_period = 200ms;  // (the map of a node that learns of the failover last is read again soon)
        cluster_connection c(ctx.get_executor(), cluster_seeds(cluster.url()), o);
        c.start();
        const std::string key = "lasting";  // (slot 12679: at the third primary, not a seed)
        std::vector<std::string> keys{key};
        co_await c.exec(request("SET", key, "before"), keys);
        slot_map map(parse_cluster_shards(co_await c.exec(request("CLUSTER", "SHARDS"))));
        auto dead = *map.owner(key_slot(key));
        // The replica has the key before its primary dies (replication is asynchronous): the only
        // key of that shard.
        auto replica = replica_of(cluster, dead);
        CHECK(co_await eventually([&] { return keys_at(cluster, replica) == 1; }, 5s));
        cluster.kill(dead.port - cluster.first());
        auto began = steady::now();
        request read("GET", key);
        read.options.resend_safe = true;  // a read: sent again if its connection drops under it
        auto r = co_await c.exec(std::move(read), keys);
        MESSAGE("served again after "
                << std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - began).count() << " ms");
        CHECK(r.as_string() == "before");
        CHECK((co_await c.exec(request("SET", key, "after"), keys)).as_string() == "OK");
        // Every node learns of the new primary, and so does the map.
        CHECK(co_await eventually(
            [&] {
              auto now_primaries = c.primaries();
              return now_primaries.size() == 3 &&
                     std::find(now_primaries.begin(), now_primaries.end(), dead.text()) == now_primaries.end();
            },
            10s));
        // Started again (a replica now), the old primary gets no connection of ours back: once it
        // answers, one left would be back within reconnect_wait_max (2 s).
        REQUIRE(dead.port - cluster.first() > 1);  // (the client keeps its seeds' connections)
        cluster.restart(dead.port - cluster.first());
        CHECK(co_await eventually(
            [&] {
              try {
                cluster.cli(dead.port - cluster.first(), {"PING"});
                return true;
              } catch (const std::exception&) {
                return false;
              }
            },
            10s));
        co_await sleep_for(3s);
        auto clients = cluster.cli(dead.port - cluster.first(), {"CLIENT", "LIST"});
        CHECK_MESSAGE(clients.find(" name=jobrt ") == std::string::npos, clients);
      },
      60s);
}

TEST_CASE("cluster connection: a script runs at its keys' primary and is loaded again where a node lacks it") {
  redis_cluster cluster;
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        cluster_connection c(ctx.get_executor(), cluster_seeds(cluster.url()));
        c.start();
        script incr("return redis.call('INCR', KEYS[1])");
        std::vector<std::string> none;
        for (int round = 1; round <= 2; ++round) {
          for (int i = 0; i < 30; ++i) {
            std::vector<std::string> keys(1, fmt::format("counter:{}", i));
            auto r = co_await incr.run(c, keys, incr.make_request(keys, none));
            CHECK(r.as_integer() == round);
          }
          // Every node forgets its scripts (a restart, a new primary): NOSCRIPT, then loaded there.
          flush_scripts(cluster);
        }
        // jobrt's own refusals come as their codes.
        script refuse("return redis.error_reply('JOBRT:21 job id is empty')");
        std::vector<std::string> keys(1, "any");
        try {
          co_await refuse.run(c, keys, refuse.make_request(keys, none));
          FAIL("no error");
        } catch (const boost::system::system_error& e) {
          CHECK(e.code() == errc::bad_job_id);
          CHECK(std::string(e.what()).find("job id is empty") != std::string::npos);
        }
      },
      60s);
}

TEST_CASE("cluster backend: a worker waiting for work follows its queue when the queue's slot moves") {
  redis_cluster cluster;
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        auto seeds = cluster_seeds(cluster.url());            // two seeds: a cluster without asking
        for (auto& seed : seeds) seed.client_name = "mover";  // its blocking connection: mover:blocking
        redis_backend store(ctx.get_executor(), seeds);
        const std::string queue = "moving";
        auto p = redis_backend::key_prefix(queue);
        worker_options o;
        o.queue = queue;
        o.claim_wait = 20s;  // no claim's wait ends by itself during the test
        worker w(ctx.get_executor(), store, o);
        std::vector<int> done;
        w.add_handler("t", [&](job_context& job) -> awaitable<void> {
          done.push_back(static_cast<int>(job.payload().as_object().at("i").as_int64()));
          co_return;
        });
        w.start();
        producer before(store, queue);
        co_await before.enqueue(numbered(1));
        CHECK(co_await eventually([&] { return done.size() == 1 && w.waiting_for_work(); }, 10s));
        // The worker waits in BLMOVE at the queue's primary; the slot goes to another one.
        slot_map map(parse_cluster_shards(co_await store.exec(request("CLUSTER", "SHARDS"), p)));
        auto slot = key_slot(p);
        auto from = *map.owner(slot);
        auto primaries = map.primaries();
        auto to = from == primaries[0] ? primaries[1] : primaries[0];
        nodes n(ctx, cluster);
        auto blocked_at = [&](const node_address& node) -> awaitable<bool> {
          auto list = co_await exec(n.at(node), request("CLIENT", "LIST"));
          co_return list.as_string().find("name=mover:blocking") !=
              std::string::npos&& list.as_string().find("cmd=blmove") != std::string::npos;
        };
        CHECK(co_await eventually([&]() -> awaitable<bool> { co_return co_await blocked_at(from); }, 5s));
        move_slot(cluster, slot, from, to);
        // Redis answers the blocked BLMOVE with MOVED (within a second: its clients cron); the
        // worker reads the map again and waits at the new primary.
        CHECK(co_await eventually([&]() -> awaitable<bool> { co_return co_await blocked_at(to); }, 10s));
        // A producer of another process, and the job reaches the worker there, with no poll.
        redis_backend other(ctx.get_executor(), cluster.config(2));
        producer after(other, queue);
        auto began = steady::now();
        co_await after.enqueue(numbered(2));
        CHECK(co_await eventually([&] { return done.size() == 2; }, 5s));
        MESSAGE("picked up at the new primary after "
                << std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - began).count() << " ms");
        CHECK(done == std::vector<int>{1, 2});
        CHECK(co_await eventually(  // (its end is stored just after the handler returns)
            [&]() -> awaitable<bool> { co_return (co_await other.counts(queue)).completed == 2; }, 5s));
        co_await w.stop(1s);
        CHECK(w.counters().completed == 2);
      },
      90s);
}

// A job of type "t" due after `delay`.
job_spec due_in(std::chrono::milliseconds delay) {
  auto s = numbered(0);
  s.delay = delay;
  return s;
}

TEST_CASE(
    "cluster backend: delayed-job wake-ups come by sharded pub/sub from the queue's primary, also after it moves") {
  redis_cluster cluster;
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        redis_backend store(ctx.get_executor(), cluster_seeds(cluster.url()));
        const std::string queue = "waking";
        auto p = redis_backend::key_prefix(queue);
        slot_map map(parse_cluster_shards(co_await store.exec(request("CLUSTER", "SHARDS"), p)));
        auto slot = key_slot(p);
        auto from = *map.owner(slot);
        auto primaries = map.primaries();
        auto to = from == primaries[0] ? primaries[1] : primaries[0];
        nodes n(ctx, cluster);
        auto listening_at = [&](const node_address& node) -> awaitable<bool> {
          auto r = co_await exec(n.at(node), request("PUBSUB", "SHARDCHANNELS"));
          for (const auto& c : r.as_array())
            if (c.as_string() == p + "delayed") co_return true;
          co_return false;
        };
        producer prod(store, queue);
        co_await prod.enqueue(due_in(3'600'000ms));
        // Woken when a job comes due before all others, and only then. (First, a wait that takes
        // in any notice of the subscription itself.)
        auto woken = [&](std::chrono::milliseconds delay) -> awaitable<bool> {
          co_await store.wait_delayed(queue, store.delayed_version(queue), 300ms);
          auto seen = store.delayed_version(queue);
          co_await prod.enqueue(due_in(delay));
          auto began = steady::now();
          co_await store.wait_delayed(queue, seen, 2s);
          co_return steady::now() - began < 1500ms;
        };
        store.delayed_version(queue);  // (starts listening)
        CHECK(co_await eventually([&]() -> awaitable<bool> { co_return co_await listening_at(from); }, 5s));
        CHECK(co_await woken(600'000ms));
        CHECK_FALSE(co_await woken(3'000'000ms));  // not the earliest: no wake-up
        // Two wake-ups sent: the first delayed job's (the set was empty) and the earlier one's.
        auto stats = co_await exec(n.at(from), request("INFO", "commandstats"));
        CHECK_MESSAGE(stats.as_string().find("cmdstat_spublish:calls=2,") != std::string::npos, stats.as_string());
        CHECK(stats.as_string().find("cmdstat_publish:") == std::string::npos);  // (PUBLISH goes to every node)

        auto subscriber_at = [&](const node_address& node) -> awaitable<bool> {
          auto r = co_await exec(n.at(node), request("CLIENT", "LIST"));
          co_return r.as_string().find(" name=jobrt:wakeups ") != std::string::npos;
        };
        CHECK(co_await subscriber_at(from));

        // The slot moves: its old primary drops the channel, and the listener goes to the new one.
        move_slot(cluster, slot, from, to);
        CHECK(co_await eventually([&]() -> awaitable<bool> { co_return co_await listening_at(to); }, 10s));
        CHECK(co_await woken(300'000ms));
        CHECK_FALSE(co_await listening_at(from));
        // Its connection there, with no channel left, is closed.
        CHECK(co_await eventually([&]() -> awaitable<bool> { co_return !co_await subscriber_at(from); }, 5s));
      },
      60s);
}

// A job of group g, with the producer's id `id`.
job_spec of_group(const std::string& group, const std::string& id, int i) {
  auto s = numbered(i);
  s.group = group;
  s.id = id;
  return s;
}

TEST_CASE("cluster backend: while the queue's slot migrates its scripts wait, and write nothing on either side") {
  redis_cluster cluster;
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        redis_backend store(ctx.get_executor(), cluster_seeds(cluster.url()));
        const std::string queue = "halfway";
        auto p = redis_backend::key_prefix(queue);
        producer before(store, queue);
        co_await before.enqueue(of_group("a", "a-1", 1));
        co_await before.enqueue(of_group("b", "b-1", 2));
        auto later = of_group("later", "later-1", 9);
        later.delay = std::chrono::hours(1);  // (so the key of delayed jobs is there too)
        co_await before.enqueue(later);
        slot_map map(parse_cluster_shards(co_await store.exec(request("CLUSTER", "SHARDS"), p)));
        auto slot = key_slot(p);
        auto from = *map.owner(slot);
        auto primaries = map.primaries();
        auto to = from == primaries[0] ? primaries[1] : primaries[0];
        auto from_id = id_of(cluster, from.port), to_id = id_of(cluster, to.port);
        set_slot(cluster, to, slot, "IMPORTING", from_id);
        set_slot(cluster, from, slot, "MIGRATING", to_id);
        // Group b's list has moved; everything else is still at the old primary, where an
        // enqueue to b (its keys named all there) would fail halfway: its id taken, its job not
        // stored.
        migrate_key(cluster, from, to, p + "g:b");
        int stored = 0;
        auto enqueue = [&](job_spec s) -> awaitable<void> {
          try {
            producer during(store, queue);
            auto r = co_await during.enqueue(std::move(s));
            CHECK_FALSE(r.duplicate);
            ++stored;
          } catch (const std::exception& e) {
            FAIL_CHECK("an enqueue failed: " << std::string(e.what()));
          }
        };
        asio::co_spawn(ctx, enqueue(of_group("a", "a-2", 3)), asio::detached);
        asio::co_spawn(ctx, enqueue(of_group("b", "b-2", 4)), asio::detached);
        asio::steady_timer pause(ctx, 300ms);
        co_await pause.async_wait(asio::use_awaitable);
        CHECK(stored == 0);  // they wait
        // Then the keys an enqueue names: it is sent on to the new primary (ASK), where group
        // a's list is not yet. Followed, it would start a second list there, behind which a-2
        // would run first, and which the list's own move would then fail on (BUSYKEY).
        for (const char* key : {"ready", "seq", "ids", "stats", "delayed"}) migrate_key(cluster, from, to, p + key);
        pause.expires_after(300ms);
        co_await pause.async_wait(asio::use_awaitable);
        CHECK(stored == 0);
        std::vector<std::string> list{"CLUSTER", "GETKEYSINSLOT", std::to_string(slot), "1000"};
        std::istringstream rest(cluster.cli(from.port - cluster.first(), list));
        for (std::string key; std::getline(rest, key);)
          if (!key.empty()) migrate_key(cluster, from, to, key);  // (a MIGRATE onto a key there fails: BUSYKEY)
        for (const auto& node : primaries) set_slot(cluster, node, slot, "NODE", to_id);
        CHECK(co_await eventually([&] { return stored == 2; }, 10s));
        std::vector<std::string> count{"CLUSTER", "COUNTKEYSINSLOT", std::to_string(slot)};
        CHECK(std::atoi(cluster.cli(from.port - cluster.first(), count).c_str()) == 0);
        // Every job once, each group in order, and the queue whole.
        worker_options o;
        o.queue = queue;
        worker w(ctx.get_executor(), store, o);
        std::vector<int> done;
        w.add_handler("t", [&](job_context& job) -> awaitable<void> {
          done.push_back(static_cast<int>(job.payload().as_object().at("i").as_int64()));
          co_return;
        });
        w.start();
        CHECK(co_await eventually([&] { return done.size() == 4; }, 10s));
        co_await w.stop(1s);
        auto at = [&](int i) { return std::find(done.begin(), done.end(), i) - done.begin(); };
        CHECK(at(1) < at(3));  // each group in order
        CHECK(at(2) < at(4));
        std::sort(done.begin(), done.end());
        CHECK(done == std::vector<int>{1, 2, 3, 4});
        auto report = co_await store.check(queue, false);
        CHECK(report.problems.empty());
        CHECK(report.jobs == 1);  // the delayed one
      },
      60s);
}

TEST_CASE("cluster backend: the demo's checks hold while its queue's slot moves by hand and a reshard moves a third") {
  redis_cluster cluster;
  auto out = fmt::format("/tmp/jobrt-cluster-demo-{}.out", ::getpid());
  // Three worker processes of one worker of concurrency 4: a run of some seconds.
  auto command = fmt::format(
      "timeout 100 {} demo --redis {} --jobs 20000 --commodities 1000 --processes 3 --workers 1 --concurrency 4 "
      ">{} 2>&1",
      JOBRT_BIN, cluster.url(), out);
  std::atomic<bool> demo_done{false};
  int status = -1;
  std::thread demo([&] {
    status = std::system(command.c_str());
    demo_done = true;
  });
  struct joined {  // (the run ends by itself: `timeout 100`)
    std::thread& t;
    ~joined() {
      if (t.joinable()) t.join();
    }
  } join_demo{demo};
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        cluster_connection c(ctx.get_executor(), cluster_seeds(cluster.url()));
        c.start();
        auto p = redis_backend::key_prefix("demo");
        auto slot = key_slot(p);
        std::vector<std::string> keys(1, p);
        // The run's jobs are in: its group lists are there (one key per commodity with jobs).
        auto queued = [&]() -> awaitable<bool> {
          co_return (co_await c.exec(request("CLUSTER", "COUNTKEYSINSLOT", slot), keys)).as_integer() > 500;
        };
        if (!co_await eventually(queued, 60s)) {
          FAIL_CHECK("the demo's jobs never reached its queue");
          co_return;
        }
        slot_map map(parse_cluster_shards(co_await c.exec(request("CLUSTER", "SHARDS"))));
        auto from = *map.owner(slot);
        auto primaries = map.primaries();
        auto to = from == primaries[0] ? primaries[1] : primaries[0];
        auto began = steady::now();
        move_slot(cluster, slot, from, to);  // ASK and TRYAGAIN while its keys move
        auto moved_in = steady::now() - began;
        CHECK_MESSAGE(!demo_done, "the run ended before its queue's slot had moved: nothing was tested");
        MESSAGE("the queue's slot moved in " << std::chrono::duration_cast<std::chrono::milliseconds>(moved_in).count()
                                             << " ms");
        // And a third of the slots from the queue's new primary to the third one, by redis-cli.
        auto third = primaries[0] != from && primaries[0] != to   ? primaries[0]
                     : primaries[1] != from && primaries[1] != to ? primaries[1]
                                                                  : primaries[2];
        auto reshard = fmt::format(
            "redis-cli --cluster reshard 127.0.0.1:{} --cluster-from {} --cluster-to {} --cluster-slots 5461 "
            "--cluster-yes >/dev/null 2>&1",
            to.port, id_of(cluster, to.port), id_of(cluster, third.port));
        CHECK(std::system(reshard.c_str()) == 0);
        CHECK(co_await eventually([&] { return demo_done.load(); }, 100s));
      },
      120s);
  demo.join();
  std::ifstream in(out);
  std::string output(std::istreambuf_iterator<char>(in), {});
  std::remove(out.c_str());
  CHECK_MESSAGE(status == 0, output);
  CHECK(output.find("1000/1000 commodities   ok") != std::string::npos);
  CHECK(output.find("FAILED") == std::string::npos);
}

// What a run through a failover saw.
struct failover_run {
  int acknowledged = 0;  // jobs whose enqueue returned
  int lost = 0;          // of those, jobs that never ran
  int ran_twice = 0;     // jobs that ran more than once (a finish or a lease lost with the primary)
  int inversions = 0;    // a job's first run after the first run of a later job of its group
  std::int64_t failover_ms = 0;
  bool wakeups_followed = false;  // the delayed-job wake-ups are listened to at the new primary
  bool former_let_go = false;     // no wake-up or replicated-call connection stays at the old one
};

// 3,000 jobs over 50 groups, enqueued 10 a call while a worker runs them; after 1,000 the
// queue's primary (with shards, shard 0's) is killed (kill -9), its replica takes over, and 5 s
// later the old primary is started again, empty: it syncs as the new primary's replica. A call
// that fails meanwhile is sent again (the producer's ids keep a stored job from being stored
// twice).
awaitable<failover_run> through_failover(asio::io_context& ctx, const redis_cluster& cluster, durability mode,
                                         std::size_t shards) {
  constexpr int groups = 50, total = 3000, batch = 10;
  redis_backend_options bo;
  bo.durability = mode;
  bo.replica_wait = 2s;
  redis_backend store(ctx.get_executor(), cluster_seeds(cluster.url()), bo);
  sharded_backend sharded(store, shards);
  const std::string queue = "failover";
  auto p = redis_backend::key_prefix(shards > 1 ? sharded_backend::shard_queue(queue, 0) : queue);
  failover_run out;
  std::vector<int> runs(total, 0), last_first(groups, -1);
  worker_options o;
  o.queue = queue;
  o.concurrency = 16;
  worker w(ctx.get_executor(), sharded, o);
  w.add_handler("t", [&](job_context& job) -> awaitable<void> {
    auto i = static_cast<int>(job.payload().as_object().at("i").as_int64());
    if (runs[static_cast<std::size_t>(i)]++ == 0) {
      auto& last = last_first[static_cast<std::size_t>(i % groups)];
      if (i < last) ++out.inversions;
      last = i;
    }
    co_return;
  });
  w.start();
  auto primary = co_await store.node_of(p);
  int dead = std::stoi(primary.port) - cluster.first();
  producer prod(sharded, queue);
  std::optional<steady::time_point> killed, restarted, served_again;
  for (int i = 0; i < total;) {
    std::vector<job_spec> specs;
    for (int k = i; k < i + batch; ++k)
      specs.push_back(of_group(fmt::format("g{}", k % groups), fmt::format("job-{}", k), k));
    bool stored = false;
    try {
      co_await prod.enqueue_bulk(std::move(specs));
      stored = true;
    } catch (const std::exception&) {
      // (during the failover: sent again below)
    }
    if (stored) {
      i += batch;
      out.acknowledged = i;
      if (killed && !served_again) served_again = steady::now();
    } else {
      asio::steady_timer pause(ctx, 50ms);
      co_await pause.async_wait(asio::use_awaitable);
    }
    if (!killed && i >= 1000) {
      cluster.kill(dead);
      killed = steady::now();
    }
    if (killed && !restarted && steady::now() - *killed > 5s) {
      cluster.restart(dead);
      restarted = steady::now();
    }
  }
  if (killed && !restarted) cluster.restart(dead);  // (the enqueues ended within 5 s of the kill)
  if (killed && served_again)
    out.failover_ms = std::chrono::duration_cast<std::chrono::milliseconds>(*served_again - *killed).count();
  // Done when nothing is left to run (jobs lost with the primary never will be).
  auto drained = [&]() -> awaitable<bool> {
    auto c = co_await sharded.counts(queue);
    co_return c.ready_lanes == 0 && c.running == 0 && c.delayed == 0;
  };
  CHECK(co_await eventually(drained, 60s));
  // The worker's promoter listens for its queue's wake-ups at the primary serving it now (the
  // listener saw the slot map change: the old primary said nothing, being dead).
  out.wakeups_followed = co_await eventually(
      [&]() -> awaitable<bool> {
        auto r = co_await store.exec(request("PUBSUB", "SHARDCHANNELS"), p);  // (at the queue's primary)
        for (const auto& c : r.as_array())
          if (c.as_string() == p + "delayed") co_return true;
        co_return false;
      },
      5s);
  // The old primary, a replica now, keeps none of the connections made for it as a primary:
  // once it answers, one left would be back within reconnect_wait_max (2 s).
  std::string clients;
  co_await eventually(
      [&] {
        try {
          clients = cluster.cli(dead, {"CLIENT", "LIST"});
          return true;
        } catch (const std::exception&) {
          return false;  // (still starting)
        }
      },
      10s);
  co_await sleep_for(3s);
  clients = cluster.cli(dead, {"CLIENT", "LIST"});
  out.former_let_go = clients.find(" name=jobrt:wakeups ") == std::string::npos &&
                      clients.find(" name=jobrt:replicated ") == std::string::npos;
  if (!out.former_let_go) MESSAGE(clients);
  co_await w.stop(2s);
  for (int i = 0; i < out.acknowledged; ++i) {
    if (runs[static_cast<std::size_t>(i)] == 0) ++out.lost;
    if (runs[static_cast<std::size_t>(i)] > 1) ++out.ran_twice;
  }
  co_return out;
}

TEST_CASE("cluster backend: a primary killed under load - workers carry on, and replicated loses no acknowledged job") {
  for (auto mode : {durability::primary, durability::replicated}) {
    std::string name = mode == durability::primary ? "primary" : "replicated";
    CAPTURE(name);
    redis_cluster cluster;
    failover_run got;
    run([&](asio::io_context& ctx) -> awaitable<void> { got = co_await through_failover(ctx, cluster, mode, 1); },
        150s);
    MESSAGE("durability " << name << ": " << got.acknowledged << " acknowledged, " << got.lost << " lost, "
                          << got.ran_twice << " ran twice, " << got.inversions << " order inversions; enqueues "
                          << "served again " << got.failover_ms << " ms after the kill");
    CHECK(got.acknowledged == 3000);
    CHECK(got.inversions == 0);
    CHECK(got.wakeups_followed);
    CHECK(got.former_let_go);
    if (mode == durability::replicated) CHECK(got.lost == 0);
  }
}

TEST_CASE(
    "cluster backend: a primary killed under load on a queue of 16 shards - workers carry on, and replicated loses "
    "no acknowledged job") {
  for (auto mode : {durability::primary, durability::replicated}) {
    std::string name = mode == durability::primary ? "primary" : "replicated";
    CAPTURE(name);
    redis_cluster cluster;
    failover_run got;
    run([&](asio::io_context& ctx) -> awaitable<void> { got = co_await through_failover(ctx, cluster, mode, 16); },
        150s);
    MESSAGE("16 shards, durability " << name << ": " << got.acknowledged << " acknowledged, " << got.lost << " lost, "
                                     << got.ran_twice << " ran twice, " << got.inversions
                                     << " order inversions; enqueues served again " << got.failover_ms
                                     << " ms after the kill");
    CHECK(got.acknowledged == 3000);
    CHECK(got.inversions == 0);
    CHECK(got.wakeups_followed);
    CHECK(got.former_let_go);
    if (mode == durability::replicated) CHECK(got.lost == 0);
  }
}

namespace {
// Commands the cluster's primaries ran so far, by their INFO commandstats (INFO's own left out),
// and how many INFO calls that took.
std::int64_t primaries_calls(const redis_cluster& c) {
  std::int64_t calls = 0;
  for (int i = 0; i < redis_cluster::nodes; ++i) {
    if (c.cli(i, {"INFO", "replication"}).find("role:master") == std::string::npos) continue;
    std::istringstream stats(c.cli(i, {"INFO", "commandstats"}));
    for (std::string line; std::getline(stats, line);) {
      if (!line.starts_with("cmdstat_") || line.starts_with("cmdstat_info:")) continue;
      auto at = line.find("calls=");
      if (at != std::string::npos) calls += std::stoll(line.substr(at + 6));
    }
  }
  return calls;
}
}  // namespace

TEST_CASE("cluster backend: 100 idle workers on a queue of 16 shards cost the cluster under 50 commands a second") {
  redis_cluster cluster;  // (its own: the counts are this test's alone)
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        auto queue = key_prefix() + "idle";
        std::vector<config> seeds{cluster.config(0), cluster.config(1)};
        // Four processes' worth, of 25 slots each, with the defaults (claims wait 5 s, leases of 5 s).
        std::vector<std::unique_ptr<redis_backend>> stores;
        std::vector<std::unique_ptr<sharded_backend>> shards;
        std::vector<std::unique_ptr<worker>> workers;
        std::atomic<int> ran{0};
        for (int i = 0; i < 4; ++i) {
          stores.push_back(std::make_unique<redis_backend>(ctx.get_executor(), seeds));
          shards.push_back(std::make_unique<sharded_backend>(*stores.back(), std::size_t{16}));
          worker_options o;
          o.queue = queue;
          o.concurrency = 25;
          workers.push_back(std::make_unique<worker>(ctx.get_executor(), *shards.back(), o));
          workers.back()->add_handler("t", [&](job_context&) -> awaitable<void> {
            ++ran;
            co_return;
          });
          workers.back()->start();
        }
        co_await sleep_for(3s);  // started: connected, scripts loaded
        auto before = primaries_calls(cluster);
        auto began = steady::now();
        co_await sleep_for(10s);
        auto after = primaries_calls(cluster);
        auto secs = std::chrono::duration<double>(steady::now() - began).count();
        auto rate = static_cast<double>(after - before) / secs;
        MESSAGE(fmt::format("100 idle workers, 16 shards, 3 primaries: {:.1f} commands/s ({} in {:.1f} s)", rate,
                            after - before, secs));
        CHECK(rate < 50);
        // And they are waiting, not gone: work in every shard is picked up.
        producer p(*shards.front(), queue);
        std::vector<job_spec> specs;
        for (int i = 0; i < 64; ++i) {
          job_spec s;
          s.type = "t";
          s.group = fmt::format("g{}", i);
          specs.push_back(std::move(s));
        }
        co_await p.enqueue_bulk(std::move(specs));
        CHECK(co_await eventually([&] { return ran.load() == 64; }, 10s));
        for (auto& w : workers) co_await w->stop(5s);
      },
      90s);
}

TEST_CASE(
    "cluster backend: an enqueue that marks its shard, refused CROSSSLOT by a server that hides its cluster, goes "
    "again") {
  redis_cluster cluster;
  // A user that may not run INFO: the backend takes node 0 for a server of its own, as it would
  // some proxies, and gives the enqueue script the marks key, of another slot.
  cluster.cli(0, {"ACL", "SETUSER", "blind", "on", ">pw", "~*", "&*", "+@all", "-info"});
  // A queue whose own slot and shard 0's are both at node 0.
  std::string queue;
  for (int i = 0; queue.empty() && i < 500; ++i) {
    auto q = fmt::format("hidden{}", i);
    if (cluster.owner_of(cluster.slot_of("{" + q + "}")) == cluster.first() &&
        cluster.owner_of(cluster.slot_of("{" + q + "#0}")) == cluster.first())
      queue = q;
  }
  REQUIRE_FALSE(queue.empty());
  auto cfg = cluster.config(0);
  cfg.username = "blind";
  cfg.password = "pw";
  encoded_job job;
  job.body = R"({"type":"t"})";
  std::vector<encoded_job> jobs(1, job);
  std::string in0;  // a producer id of shard 0
  for (int i = 0; in0.empty(); ++i)
    if (sharded_backend::shard_of(fmt::format("id{}", i), 2) == 0) in0 = fmt::format("id{}", i);
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), cfg);
    CHECK(co_await store.stored_shards(queue, 2) == 2);
    auto first = co_await store.enqueue_in_shard(queue, 0, jobs);
    CHECK_FALSE(first.marked);  // (refused, then stored without the mark: the caller marks)
    CHECK(first.results.size() == 1);
    auto second = co_await store.enqueue_in_shard(queue, 0, jobs);
    CHECK_FALSE(second.marked);
    CHECK(second.results.size() == 1);
    // Through a sharded_backend, the shard is marked apart.
    sharded_backend sharded(store, 2);
    producer p(sharded, queue);
    job_spec s;
    s.type = "t";
    s.id = in0;
    co_await p.enqueue(std::move(s));
  });
  auto mark = cluster.cli(0, {"ZSCORE", fmt::format("jobrt:{{{}}}:marks", queue), "0"});
  CHECK_MESSAGE(mark.find_first_of("0123456789") != std::string::npos, mark);
  CHECK(cluster.cli(0, {"LLEN", fmt::format("jobrt:{{{}#0}}:ready", queue)}) == "3\n");
  CHECK(cluster.errors("CROSSSLOT") == 1);  // refused once: the second went without the key at once
}

TEST_CASE(
    "cluster stream bridge: reads at the stream's primary, writes dead letters at theirs, and follows the stream's "
    "slot "
    "when it moves and when its primary dies: each entry one job") {
  redis_cluster cluster;
  // A stream whose dead-letter stream lives at another primary, and a primary that is no seed
  // (nor the stream's), for the stream's slot to move to and die at (the seeds stay up to be asked).
  auto primaries = cluster.primaries();
  int spare = 0;
  for (int p : primaries)
    if (p > cluster.first() + 1) spare = p;
  REQUIRE(spare != 0);
  std::string stream;
  for (int i = 0; stream.empty() && i < 500; ++i) {
    auto name = fmt::format("in{}", i);
    auto at = cluster.owner_of(cluster.slot_of(name)), dead_at = cluster.owner_of(cluster.slot_of(name + ":dead"));
    if (at != spare && dead_at != at) stream = name;
  }
  REQUIRE_FALSE(stream.empty());
  auto slot = static_cast<std::uint16_t>(cluster.slot_of(stream));
  node_address from{"127.0.0.1", static_cast<std::uint16_t>(cluster.owner_of(slot))};
  node_address to{"127.0.0.1", static_cast<std::uint16_t>(spare)};
  auto source =
      stream_source::from_url(fmt::format("redis-stream://127.0.0.1:{},127.0.0.1:{}/{}?group=g&lock_ttl_ms=600",
                                          cluster.first(), cluster.first() + 1, stream));
  REQUIRE(source.other_seeds.size() == 1);
  source.server.client_name = "streamer";
  source.other_seeds[0].client_name = "streamer";
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        memory_backend store(ctx.get_executor());
        producer into(store, "bridged");
        stream_bridge bridge(ctx.get_executor(), source, into);
        bool ended = false;
        asio::co_spawn(ctx, bridge.run(), [&](std::exception_ptr e) {
          ended = true;
          if (e) std::rethrow_exception(e);
        });
        cluster_options co;
        co.request_timeout = 30s;  // (through the failover)
        co.refresh_period = 200ms;
        cluster_connection c(ctx.get_executor(), cluster_seeds(cluster.url()), co);
        c.start();
        std::vector<std::string> keys(1, stream);
        // (An XADD cut by its primary's death is sent again: the entry's id makes a second one a
        // duplicate.)
        auto append = [&](int first, int n) -> awaitable<void> {
          for (int i = first; i < first + n; ++i) {
            auto added = [&, i]() -> awaitable<bool> {
              try {
                co_await c.exec(request("XADD", stream, "*", "type", "t", "id", fmt::format("e{}", i)), keys);
                co_return true;
              } catch (const boost::system::system_error&) {
                co_return false;
              }
            };
            REQUIRE(co_await eventually(added, 30s));
          }
        };
        auto stored = [&bridge](std::uint64_t n) {
          return [&bridge, n]() -> awaitable<bool> {
            auto counts = co_await bridge.sample();
            bool all = counts.enqueued >= n;  // (jobs stored, each once)
            co_return all&& counts.pending == 0;
          };
        };
        nodes n(ctx, cluster);
        auto blocked_at = [&](const node_address& node) -> awaitable<bool> {
          auto [ec, list] = co_await n.at(node).async_exec(request("CLIENT", "LIST"), use_tuple);
          if (ec) co_return false;
          std::istringstream lines(list.as_string());
          for (std::string line; std::getline(lines, line);)
            if (line.find(" name=streamer:blocking ") != std::string::npos &&
                line.find(" cmd=xreadgroup ") != std::string::npos)
              co_return true;
          co_return false;
        };

        co_await append(0, 50);
        co_await c.exec(request("XADD", stream, "*", "payload", "{}"), keys);  // no type: a dead letter
        auto first_fifty = stored(50);
        REQUIRE(co_await eventually(first_fifty, 10s));
        CHECK(co_await eventually([&] { return bridge.counters().rejected == 1; }, 5s));  // (counted once written)
        std::vector<std::string> dead_keys(1, stream + ":dead");
        auto dead = co_await c.exec(request("XRANGE", stream + ":dead", "-", "+"), dead_keys);
        CHECK(dead.as_array().size() == 1);
        CHECK(co_await eventually([&]() -> awaitable<bool> { co_return co_await blocked_at(from); }, 5s));

        // The slot moves: the blocked read is answered MOVED, and the bridge reads at the new primary.
        move_slot(cluster, slot, from, to);
        CHECK(co_await eventually([&]() -> awaitable<bool> { co_return co_await blocked_at(to); }, 10s));
        co_await append(50, 50);
        auto hundred = stored(100);
        REQUIRE(co_await eventually(hundred, 10s));

        // Its primary dies, once its replica has everything: the bridge reads at the one promoted.
        auto replica = replica_of(cluster, to);
        CHECK(co_await eventually([&] { return in_sync(cluster, to); }, 5s));
        cluster.kill(to.port - cluster.first());
        co_await append(100, 50);
        auto all = stored(150);
        REQUIRE(co_await eventually(all, 30s));
        CHECK(co_await eventually([&]() -> awaitable<bool> { co_return co_await blocked_at(replica); }, 10s));

        // Every entry one job, and no other.
        claim_options o;
        o.worker = "w";
        o.max = 1000;
        auto claimed = co_await store.claim("bridged", o);
        std::vector<std::string> ids;
        for (auto& j : claimed) ids.push_back(j.job.id);
        std::sort(ids.begin(), ids.end());
        std::vector<std::string> entries;
        for (int i = 0; i < 150; ++i) entries.push_back(fmt::format("e{}", i));
        std::sort(entries.begin(), entries.end());
        CHECK(ids == entries);
        bridge.stop();
        CHECK(co_await eventually([&] { return ended; }, 5s));
      },
      120s);
}
