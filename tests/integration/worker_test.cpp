// The worker on Redis: what only a real server can show.
#include "support/records.hpp"
#include "support/redis_server.hpp"
#include "support/run.hpp"

#include <jobrt/producer.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/sharded_backend.hpp>
#include <jobrt/worker.hpp>

#include "backend/job_codec.hpp"
#include "backend/lua_scripts.hpp"

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

namespace asio = boost::asio;
using namespace jobrt;
using namespace jobrt::test;
using asio::awaitable;
using asio::use_awaitable;

namespace {

std::chrono::microseconds cpu_used() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto us = [](timeval t) { return std::chrono::seconds(t.tv_sec) + std::chrono::microseconds(t.tv_usec); };
  return us(u.ru_utime) + us(u.ru_stime);
}

// "cmdstat_evalsha:calls=3,usec=..." lines of INFO commandstats, as name → calls.
std::map<std::string, long> command_calls(const std::string& info) {
  std::map<std::string, long> out;
  std::istringstream in(info);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("cmdstat_")) continue;
    auto colon = line.find(':');
    auto calls = line.find("calls=");
    out[line.substr(8, colon - 8)] = std::stol(line.substr(calls + 6));
  }
  return out;
}

// finish.lua's keys, for tests that call it by hand (see redis_backend::finish_call).
std::vector<std::string> finish_keys(const std::string& p, const std::string& worker) {
  return {p + "ready",   p + "active", p + "fence",     p + "stats",
          p + "ids",     p + "dead",   p + "dead:info", p + "answers:" + worker,
          p + "delayed", p + "paused", p + "parked",    p + "jumped"};
}

// A user of `server` with every key and channel, the commands of `commands` (ACL rules such as
// "+@all", "-blmove"), and password "pw": the config to connect as it.
awaitable<redis::config> acl_user(redis_server& server, std::string name, std::vector<std::string> commands) {
  redis::connection admin(co_await asio::this_coro::executor, server.config());
  admin.start();
  redis::request setuser("ACL", "SETUSER", name, "on", ">pw", "~*", "&*", commands);
  co_await redis::exec(admin, std::move(setuser));
  co_return redis::config::from_url(fmt::format("redis://{}:pw@127.0.0.1:{}", name, server.port()));
}

// How long w.stop(grace) takes.
awaitable<std::chrono::milliseconds> timed_stop(worker& w, std::chrono::milliseconds grace) {
  auto before = std::chrono::steady_clock::now();
  co_await w.stop(grace);
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - before);
  MESSAGE("stop took " << took.count() << " ms");
  co_return took;
}

// Three jobs in group "g", and the claim of its lane by worker "w1", with `ahead` followers.
awaitable<claimed_job> claim_three_grouped(redis_backend& store, const std::string& queue, std::size_t ahead) {
  producer prod(store, queue);
  for (int i = 0; i < 3; ++i) {
    job_spec s;
    s.type = "t";
    s.group = "g";
    co_await prod.enqueue(s);
  }
  claim_options co{"w1", 1, std::chrono::seconds(30), ahead};
  auto claimed = co_await store.claim(queue, co);
  REQUIRE(claimed.size() == 1);
  REQUIRE(claimed[0].ahead.size() == ahead);
  co_return std::move(claimed[0]);
}

// A TCP relay to a redis-server that can hold the server's bytes: requests still reach the
// server and run, their answers wait (a slow way back, or a client too busy to read them).
class answer_relay {
 public:
  answer_relay(asio::any_io_executor ex, redis::config target)
      : state_(std::make_shared<state>(ex)), target_(std::move(target)) {
    auto& a = state_->acceptor;
    a.open(asio::ip::tcp::v4());
    a.bind({asio::ip::make_address("127.0.0.1"), 0});
    a.listen();
    asio::co_spawn(ex, accept_loop(state_, target_), asio::detached);
  }
  ~answer_relay() {
    boost::system::error_code ignored;
    state_->acceptor.close(ignored);
  }

  redis::config config() const {
    auto c = target_;
    c.port = std::to_string(state_->acceptor.local_endpoint().port());
    return c;
  }
  void hold(bool on) {
    state_->held = on;
    if (on)
      state_->released.expires_at(asio::steady_timer::time_point::max());
    else
      state_->released.cancel();
  }

 private:
  using socket = asio::ip::tcp::socket;
  struct state {
    explicit state(asio::any_io_executor ex) : acceptor(ex), released(ex) {}
    asio::ip::tcp::acceptor acceptor;
    asio::steady_timer released;
    bool held = false;
  };

  static awaitable<void> accept_loop(std::shared_ptr<state> s, redis::config target) {
    for (;;) {
      auto [ec, client] = co_await s->acceptor.async_accept(asio::as_tuple(use_awaitable));
      if (ec) co_return;
      auto in = std::make_shared<socket>(std::move(client));
      auto out = std::make_shared<socket>(s->acceptor.get_executor());
      auto [cec] = co_await out->async_connect(
          {asio::ip::make_address(target.host), static_cast<unsigned short>(std::stoi(target.port))},
          asio::as_tuple(use_awaitable));
      if (cec) co_return;
      boost::system::error_code ignored;  // (best effort: Nagle would only slow the relay)
      in->set_option(asio::ip::tcp::no_delay(true), ignored);
      out->set_option(asio::ip::tcp::no_delay(true), ignored);
      asio::co_spawn(s->acceptor.get_executor(), pump(s, in, out, false), asio::detached);
      asio::co_spawn(s->acceptor.get_executor(), pump(s, out, in, true), asio::detached);
    }
  }

  static awaitable<void> pump(std::shared_ptr<state> s, std::shared_ptr<socket> from, std::shared_ptr<socket> to,
                              bool answers) {
    std::array<char, 16384> buffer;
    for (;;) {
      auto [ec, n] = co_await from->async_read_some(asio::buffer(buffer), asio::as_tuple(use_awaitable));
      if (ec) break;
      while (answers && s->held) co_await s->released.async_wait(asio::as_tuple(use_awaitable));
      auto [wec, m] = co_await asio::async_write(*to, asio::buffer(buffer.data(), n), asio::as_tuple(use_awaitable));
      if (wec) break;
    }
    boost::system::error_code ignored;
    from->close(ignored);
    to->close(ignored);
  }

  std::shared_ptr<state> state_;
  redis::config target_;
};

}  // namespace

namespace {

// Whether a client named `name` is blocked in BLMOVE on the server right now (CLIENT LIST:
// cmd=blmove, flags with b): a worker idle in its blocking claim, seen from the server.
awaitable<bool> blocked_in_blmove(redis::connection& conn, std::string name) {
  auto list = co_await redis::exec(conn, redis::request("CLIENT", "LIST"));
  std::istringstream lines{std::string(list.as_string())};
  for (std::string line; std::getline(lines, line);)
    if (line.find(fmt::format(" name={} ", name)) != std::string::npos &&
        line.find(" cmd=blmove") != std::string::npos && line.find(" flags=b") != std::string::npos)
      co_return true;
  co_return false;
}

}  // namespace

TEST_CASE("an idle worker sends only its blocking claim and its timers' calls and uses no CPU") {
  redis_server server;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), server.config());
    redis::connection admin(ctx.get_executor(), server.config());
    admin.start();
    worker_options o;
    o.queue = "idle";
    o.claim_wait = std::chrono::milliseconds(500);
    o.lease_ttl = std::chrono::milliseconds(900);  // watchdog every 300 ms
    worker w(ctx.get_executor(), store, o);
    w.add_handler("t", [](job_context&) -> awaitable<void> { co_return; });
    w.start();
    // Past the calls of its start: its claim waits in BLMOVE, on a blocking connection made for it.
    REQUIRE(co_await eventually([&] { return w.waiting_for_work(); }));
    REQUIRE(co_await eventually([&] { return blocked_in_blmove(admin, "jobrt:blocking"); }));
    co_await redis::exec(admin, redis::request("CONFIG", "RESETSTAT"));
    auto cpu_before = cpu_used();
    co_await sleep_for(std::chrono::milliseconds(3000));
    auto cpu = cpu_used() - cpu_before;
    auto calls = command_calls((co_await redis::exec(admin, redis::request("INFO", "commandstats"))).as_string());
    calls.erase("info");
    calls.erase("config|resetstat");
    std::string seen;
    for (auto& [name, n] : calls) seen += fmt::format("{}={} ", name, n);
    MESSAGE("in 3 s idle: " << seen << "| worker process CPU " << cpu.count() << " us");
    // Sent by the worker: BLMOVE (every claim_wait), EVALSHA (a claim with each BLMOVE; every
    // 300 ms an extend, the watchdog and heartbeat, and a reap, the recovery timer), SCRIPT LOAD
    // once if the server lost its scripts, health PINGs; the rest run inside those scripts. The
    // promoter of delayed jobs sleeps: nothing is delayed. (exists: the scripts' probe of a
    // migrating cluster slot.) Its report for operators goes every 10 s, so it may fall in these
    // 3 s (reports.lua: hset, zadd, zrange, hdel, zrem), and so may the turn of a minute (the
    // history's look and claim, history.lua: zrange, get, set; and then maybe the queue's counts
    // and their point: llen, zcount, zcard, hgetall, hlen, lindex, zremrangebyscore).
    const std::set<std::string> allowed{
        "blmove",        "evalsha", "script|load", "ping",    "lpop", "zadd",   "time",
        "zrangebyscore", "zcard",   "del",         "exists",  "hset", "zrange", "hdel",
        "zrem",          "llen",    "zcount",      "hgetall", "hlen", "lindex", "zremrangebyscore",
        "get",           "set"};
    for (auto& [name, n] : calls) CHECK_MESSAGE(allowed.count(name) == 1, "unexpected command " << name);
    CHECK(calls["blmove"] <= 3000 / 500 + 1);
    CHECK(calls["evalsha"] <= (3000 / 500 + 1) + 2 * (3000 / 300 + 1));
    // (A worker that polled would spend most of the 3 s; its timers and claims take a few tens of
    // milliseconds, several times that under ASan+UBSan: a CI run there once took 198 ms.)
#if defined(__SANITIZE_ADDRESS__)
    CHECK(cpu < std::chrono::milliseconds(500));
#else
    CHECK(cpu < std::chrono::milliseconds(100));
#endif
    co_await w.stop(std::chrono::seconds(1));
  });
}

TEST_CASE("a worker whose BLMOVE the server refuses backs off instead of asking again at once - and runs jobs") {
  redis_server server;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis::connection admin(ctx.get_executor(), server.config());
    admin.start();
    std::vector<std::string> rules{"+@all", "-blmove"};
    auto cfg = co_await acl_user(server, "noblock", std::move(rules));
    redis_backend store(ctx.get_executor(), cfg);
    worker_options o;
    o.queue = "refused";
    o.claim_wait = std::chrono::milliseconds(500);
    worker w(ctx.get_executor(), store, o);
    int ran = 0;
    w.add_handler("t", [&](job_context&) -> awaitable<void> {
      ++ran;
      co_return;
    });
    w.start();
    co_await sleep_for(std::chrono::milliseconds(2000));
    // Refused at once, each BLMOVE came back as an empty wait: thousands a second. Now each
    // refusal fails the claim, which backs off (100 ms, doubling).
    auto info = (co_await redis::exec(admin, redis::request("INFO", "commandstats"))).as_string();
    auto at = info.find("cmdstat_blmove:");
    REQUIRE(at != std::string::npos);
    auto rejected = std::stol(info.substr(info.find("rejected_calls=", at) + 15));
    MESSAGE("BLMOVE refused " << rejected << " times in 2 s");
    CHECK(rejected >= 1);
    CHECK(rejected <= 10);
    producer prod(store, "refused");
    job_spec s;
    s.type = "t";
    co_await prod.enqueue(s);
    co_await eventually([&] { return ran != 0; }, std::chrono::milliseconds(10000));
    CHECK(ran == 1);  // a claim without BLMOVE takes it
    co_await w.stop(std::chrono::seconds(1));
  });
}

TEST_CASE("stop ends an idle worker's blocking claim at once - the claim behind it answers, and its lease goes back") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    auto cfg = shared_redis();
    cfg.client_name = key_prefix() + "unblock";  // its blocking connection: <name>:blocking
    redis_backend store(ctx.get_executor(), cfg);
    std::string queue = key_prefix() + "q";
    auto p = redis_backend::key_prefix(queue);
    worker_options o;
    o.queue = queue;
    o.id = "w-unblock";
    o.claim_wait = std::chrono::seconds(5);
    worker w(ctx.get_executor(), store, o);
    int runs = 0;
    w.add_handler("t", [&](job_context&) -> awaitable<void> {
      ++runs;
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return blocked_in_blmove(store.connection(), cfg.client_name + ":blocking"); }));
    // A lane in the worker's claimed list, which BLMOVE does not watch and the claim behind it
    // takes first: as if BLMOVE had returned it just as the stop came. Abandoned, that claim
    // never ran (the connection was dropped under BLMOVE), or its lease was left to expire.
    co_await redis::exec(store.connection(),
                         redis::request("RPUSH", p + "claimed:w-unblock", R"(j:0|x-1|{"type":"t"})"));
    auto took = co_await timed_stop(w, std::chrono::seconds(1));
    CHECK(took < std::chrono::milliseconds(1000));  // not the 5 s of claim_wait
    CHECK(runs == 0);
    CHECK(w.counters().released == 1);
    auto ready = co_await redis::exec(store.connection(), redis::request("LRANGE", p + "ready", "0", "-1"));
    REQUIRE(ready.as_array().size() == 1);
    CHECK(ready.as_array()[0].as_string() == R"(j:0|x-1|{"type":"t"})");  // no attempt counted
    auto active = co_await redis::exec(store.connection(), redis::request("ZCOUNT", p + "active", "-inf", "(+inf"));
    CHECK(active.as_integer() == 0);  // no lease
  });
}

TEST_CASE("stop ends an idle worker's blocking claim soon also where CLIENT UNBLOCK is refused") {
  redis_server server;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    // Least privilege as Redis's docs show it: everything but the dangerous commands, among
    // them CLIENT UNBLOCK.
    std::vector<std::string> rules{"+@all", "-@dangerous"};
    redis_backend store(ctx.get_executor(), co_await acl_user(server, "worker", std::move(rules)));
    worker_options o;
    o.queue = "q";
    o.claim_wait = std::chrono::seconds(5);
    worker w(ctx.get_executor(), store, o);
    w.add_handler("t", [](job_context&) -> awaitable<void> { co_return; });
    w.start();
    redis::connection admin(ctx.get_executor(), server.config());
    admin.start();
    CHECK(co_await eventually([&] { return blocked_in_blmove(admin, "jobrt:blocking"); }));
    auto took = co_await timed_stop(w, std::chrono::seconds(1));
    CHECK(took < std::chrono::milliseconds(2000));  // not the 5 s of claim_wait
  });
}

TEST_CASE("stop returns soon while the server answers nothing - not after the reaper's long bound") {
  redis_server server;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    auto cfg = server.config();
    cfg.health_interval = std::chrono::seconds(30);  // the connection does not give up on its own first
    redis_backend store(ctx.get_executor(), cfg);
    worker_options o;
    o.queue = "q";
    o.lease_ttl = std::chrono::seconds(60);  // bounds a reap call, and the renewals' period
    o.reap_period = std::chrono::milliseconds(100);
    worker w(ctx.get_executor(), store, o);
    w.add_handler("t", [](job_context&) -> awaitable<void> { co_return; });
    w.start();
    REQUIRE(co_await eventually([&] { return w.waiting_for_work(); }));
    // The server stops answering (as one cut off by the network would): the next reap waits.
    redis_cli(server.config(), {"CLIENT", "PAUSE", "30000", "ALL"});
    co_await sleep_for(std::chrono::milliseconds(300));
    auto took = co_await timed_stop(w, std::chrono::milliseconds(100));
    CHECK(took < std::chrono::seconds(5));
  });
}

TEST_CASE("on a sharded queue a producer's batch bounds each script call, however its jobs fall over the shards") {
  redis_server server;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend inner(ctx.get_executor(), server.config());
    sharded_backend store(inner, 4);
    producer_options po;
    po.batch = 10;
    producer p(store, "q", po);
    auto hot = [] {
      job_spec s;
      s.type = "t";
      s.group = "hot";
      return s;
    };
    co_await p.enqueue(hot());  // the queue's shards stored, its script loaded
    redis_cli(server.config(), {"CONFIG", "RESETSTAT"});
    // 100 jobs of one group: calls of 40 (the batch times the shards), all in the group's shard,
    // where each goes in calls of 10.
    std::vector<job_spec> specs;
    for (int i = 0; i < 100; ++i) specs.push_back(hot());
    co_await p.enqueue_bulk(std::move(specs));
    auto stats = redis_cli(server.config(), {"INFO", "commandstats"});
    auto at = stats.find("cmdstat_evalsha:calls=");
    REQUIRE(at != std::string::npos);
    CHECK(std::stoi(stats.substr(at + 22)) == 10);
    CHECK(co_await store.group_size("q", "hot") == 101);
  });
}

TEST_CASE("malformed jobs written by another producer are dead-lettered and the worker goes on") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), shared_redis());
    std::string queue = key_prefix() + "q";
    auto ready = redis_backend::key_prefix(queue) + "ready";
    co_await redis::exec(store.connection(), redis::request("RPUSH", ready, "j:garbage", "j:0|x|{not json",
                                                            "j:0|y|{\"payload\":1}", "j:0|z|[1,2]", "j:0|w|{\"u\":1}",
                                                            "j:0|v|{\"payload\":2}", "j:0|17|{\"payload\":3}"));
    // The producers gave w (its body says "u") and v (not all digits, like every id a producer
    // may give): both are free again. 17 is an id the queue assigns, so it stays as it is.
    auto ids = redis_backend::key_prefix(queue) + "ids";
    co_await redis::exec(store.connection(), redis::request("SADD", ids, "w", "v", "17"));
    worker_options o;
    o.queue = queue;
    worker w(ctx.get_executor(), store, o);
    int ran = 0;
    w.add_handler("ok", [&](job_context&) -> awaitable<void> {
      ++ran;
      co_return;
    });
    w.start();
    job_spec good;
    good.type = "ok";
    producer p(store, queue);
    co_await p.enqueue(good);
    co_await eventually([&] { return ran != 0; }, std::chrono::milliseconds(2000));
    CHECK(ran == 1);
    co_await w.stop(std::chrono::seconds(1));  // its finishes are all in, then
    auto counts = co_await store.counts(queue);
    CHECK(counts.failed == 7);
    CHECK(counts.dead == 7);
    auto dead = co_await store.dead_letters(queue, 0, 10);
    CHECK(std::count_if(dead.begin(), dead.end(), [](auto& d) { return d.id.starts_with("#"); }) == 1);  // no id
    auto left = co_await redis::exec(store.connection(), redis::request("SMEMBERS", ids));
    REQUIRE(left.as_array().size() == 1);
    CHECK(left.as_array()[0].as_string() == "17");
    auto info = co_await redis::exec(store.connection(),
                                     redis::request("HGETALL", redis_backend::key_prefix(queue) + "dead:info"));
    std::string all;
    for (auto& e : info.as_array()) all += e.as_string() + "\n";
    CHECK(all.find("job record 'garbage' is not '<attempts>|<id>|<body>'") != std::string::npos);
    CHECK(all.find("job x body is not JSON") != std::string::npos);
    CHECK(all.find("job y has no type") != std::string::npos);
    CHECK(all.find("job z body is not a JSON object") != std::string::npos);
  });
}

TEST_CASE("malformed records inside a group are dead-lettered and the rest of the group runs in order") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), shared_redis());
    std::string queue = key_prefix() + "q";
    auto p = redis_backend::key_prefix(queue);
    auto& c = store.connection();
    producer prod(store, queue);
    auto job = [](std::optional<std::string> group, int n) {
      job_spec s;
      s.type = "ok";
      s.group = std::move(group);
      s.payload = {{"n", n}};
      return s;
    };
    // Another producer wrote a garbage record as the head of group "bad" (a new group: its lane
    // and its count, as enqueue.lua makes them), then good jobs go behind it, another garbage
    // record among them; group "fine" and an ungrouped job are not to be touched.
    co_await redis::exec(c, redis::request("RPUSH", p + "g:bad", "garbage"));
    co_await redis::exec(c, redis::request("RPUSH", p + "ready", "g:bad"));
    co_await redis::exec(c, redis::request("HINCRBY", p + "stats", "groups", "1"));
    std::vector<job_spec> first{job("bad", 1), job("fine", 1)};
    co_await prod.enqueue_bulk(std::move(first));
    co_await redis::exec(c, redis::request("RPUSH", p + "g:bad", "0|broken|{not json"));
    std::vector<job_spec> rest{job("bad", 2), job("fine", 2), job("bad", 3), job(std::nullopt, 1)};
    co_await prod.enqueue_bulk(std::move(rest));
    auto length = co_await redis::exec(c, redis::request("LLEN", p + "g:bad"));
    REQUIRE(length.as_integer() == 5);  // the producer appended behind the garbage: one lane
    auto before = co_await store.check(queue, false);
    for (auto& line : before.problems) MESSAGE(line);
    REQUIRE(before.problems.size() == 1);
    CHECK(before.problems[0] == "malformed record in group bad: garbage");

    worker_options o;
    o.queue = queue;
    o.concurrency = 4;
    worker w(ctx.get_executor(), store, o);
    std::map<std::string, std::vector<std::int64_t>> ran;  // by group, in start order
    w.add_handler("ok", [&](job_context& jc) -> awaitable<void> {
      ran[jc.group().empty() ? "-" : jc.group()].push_back(jc.payload().at("n").as_int64());
      co_return;
    });
    w.start();
    auto total = [&] {
      std::size_t n = 0;
      for (auto& [g, list] : ran) n += list.size();
      return n;
    };
    co_await eventually([&] { return total() >= 6 && w.counters().failed >= 2; }, std::chrono::milliseconds(5000));
    co_await w.stop(std::chrono::seconds(1));  // its finishes are all in, then
    CHECK(ran["bad"] == std::vector<std::int64_t>{1, 2, 3});
    CHECK(ran["fine"] == std::vector<std::int64_t>{1, 2});
    CHECK(ran["-"] == std::vector<std::int64_t>{1});
    CHECK(w.counters().retried == 0);  // failed at once, no retry

    auto dead = co_await store.dead_letters(queue, 0, 10);
    REQUIRE(dead.size() == 2);
    std::map<std::string, const dead_letter*> by_record;
    for (auto& d : dead) by_record[d.record] = &d;
    REQUIRE(by_record.count("garbage") == 1);
    REQUIRE(by_record.count("0|broken|{not json") == 1);
    auto& garbage = *by_record["garbage"];
    CHECK(garbage.group == "bad");
    CHECK(garbage.error == "malformed job: job record 'garbage' is not '<attempts>|<id>|<body>'");
    CHECK(garbage.id.starts_with("#"));  // it has no id: keyed by its lease's fence
    auto& broken = *by_record["0|broken|{not json"];
    CHECK(broken.group == "bad");
    CHECK(broken.id == "broken");
    CHECK(broken.error.starts_with("malformed job: job broken body is not JSON"));

    auto counts = co_await store.counts(queue);
    CHECK(counts.completed == 6);
    CHECK(counts.failed == 2);
    CHECK(counts.dead == 2);
    CHECK(counts.retried == 0);
    CHECK(counts.running == 0);
    CHECK(counts.ready_lanes == 0);
    CHECK(counts.groups == 0);
    auto left = co_await redis::exec(c, redis::request("EXISTS", p + "g:bad", p + "g:fine"));
    CHECK(left.as_integer() == 0);
    auto after = co_await store.check(queue, false);
    for (auto& line : after.problems) MESSAGE(line);
    CHECK(after.problems.empty());
  });
}

TEST_CASE("lanes a dead worker took with BLMOVE but never started go back to the ready list") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), shared_redis());
    std::string queue = key_prefix() + "q";
    auto p = redis_backend::key_prefix(queue);
    producer prod(store, queue);
    job_spec s;
    s.type = "t";
    s.group = "g";
    co_await prod.enqueue(s);
    // The worker died between its BLMOVE and its claim: the lane sits in its claimed list, and
    // its heartbeat stopped long ago.
    co_await redis::exec(store.connection(),
                         redis::request("LMOVE", p + "ready", p + "claimed:dead-worker", "LEFT", "RIGHT"));
    co_await redis::exec(store.connection(), redis::request("ZADD", p + "workers", 1, "dead-worker"));
    worker_options o;
    o.queue = queue;
    o.lease_ttl = std::chrono::milliseconds(600);
    worker w(ctx.get_executor(), store, o);
    int ran = 0;
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      CHECK(c.attempt() == 1);  // never started: no attempt counted
      ++ran;
      co_return;
    });
    w.start();
    co_await eventually([&] { return ran != 0; }, std::chrono::milliseconds(2000));
    CHECK(ran == 1);
    auto left = co_await redis::exec(store.connection(), redis::request("EXISTS", p + "claimed:dead-worker"));
    CHECK(left.as_integer() == 0);
    co_await w.stop(std::chrono::seconds(1));
  });
}

// jumped marks a group whose running burst may have a requeued job behind its head (see
// finish.lua); a mark that outlived its lease would make every keep of the queue ask for it.
TEST_CASE("a group leaves jumped when its lease ends, however it ends, and when it is resumed") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), shared_redis());
    std::string queue = key_prefix() + "q";
    auto p = redis_backend::key_prefix(queue);
    producer prod(store, queue);
    auto jumped = [&]() -> awaitable<bool> {
      auto r = co_await redis::exec(store.connection(), redis::request("SISMEMBER", p + "jumped", "g"));
      co_return r.as_integer() == 1;
    };
    auto name_of = [](const std::string& record) {
      auto at = record.find("\"name\":\"") + 8;
      return record.substr(at, record.find('"', at) - at);
    };
    auto end = [&](const std::string& token, finish_kind kind) -> awaitable<void> {
      std::vector<finish_item> items(1);
      items[0].token = token;
      items[0].kind = kind;
      items[0].error = "e";
      co_await store.finish(queue, "w", std::move(items), std::chrono::seconds(30));
    };
    auto job = [](std::string name) {
      job_spec s;
      s.type = "t";
      s.group = "g";
      s.payload = {{"name", std::move(name)}};
      return s;
    };
    claim_options one{"w", 1, std::chrono::seconds(30)};
    // Four dead letters of group g (ids 1 to 4), then the job h at the group's head.
    for (std::string name : {"d1", "d2", "d3", "d4"}) {
      auto s = job(name);
      s.max_attempts = 1;
      co_await prod.enqueue(s);
      auto got = co_await store.claim(queue, one);
      REQUIRE(got.size() == 1);
      co_await end(got[0].token, finish_kind::fail);
    }
    co_await prod.enqueue(job("h"));
    // Each time: h runs, a dead letter is requeued behind it, and its lease ends another way.
    auto lease_h_and_requeue = [&](std::string id, claim_options o) -> awaitable<std::string> {
      auto got = co_await store.claim(queue, o);
      REQUIRE(got.size() == 1);
      CHECK(name_of(got[0].job.body) == "h");
      std::vector<std::string> ids{id};
      CHECK(co_await store.requeue(queue, ids, true) == ids);
      CHECK(co_await jumped());
      co_return got[0].token;
    };
    co_await end(co_await lease_h_and_requeue("1", one), finish_kind::retry);
    CHECK_FALSE(co_await jumped());
    auto token = co_await lease_h_and_requeue("2", one);
    std::vector<std::string> tokens{token};
    co_await store.release(queue, "w", tokens);
    CHECK_FALSE(co_await jumped());
    claim_options brief{"w", 1, std::chrono::milliseconds(50)};
    co_await lease_h_and_requeue("3", brief);
    co_await sleep_for(std::chrono::milliseconds(120));
    reap_options reap;
    CHECK((co_await store.reap(queue, reap)).leases == 1);
    CHECK_FALSE(co_await jumped());
    // Halted, the group is parked; a job requeued behind its head marks it; resuming clears it.
    auto got = co_await store.claim(queue, one);
    REQUIRE(got.size() == 1);
    co_await end(got[0].token, finish_kind::halt);
    std::vector<std::string> last{"4"};
    CHECK(co_await store.requeue(queue, last, true) == last);
    CHECK(co_await jumped());
    CHECK(co_await store.resume(queue, "g", resume_mode::retry));
    CHECK_FALSE(co_await jumped());
    // Nothing was lost, and the order is the requeues': each went right behind h.
    std::vector<std::string> order;
    for (int i = 0; i < 6; ++i) {
      auto next = co_await store.claim(queue, one);
      if (next.empty()) break;
      order.push_back(name_of(next[0].job.body));
      co_await end(next[0].token, finish_kind::ack);
    }
    CHECK(fmt::format("{}", fmt::join(order, " ")) == "h d4 d3 d2 d1");
    auto left = co_await redis::exec(store.connection(), redis::request("EXISTS", p + "jumped"));
    CHECK(left.as_integer() == 0);
  });
}

TEST_CASE("finish sent twice: a pipelined burst's keeps and its end in one call are held both times") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), shared_redis());
    std::string queue = key_prefix() + "q";
    auto p = redis_backend::key_prefix(queue);
    auto lease = co_await claim_three_grouped(store, queue, 2);
    redis::script finish(jobrt::lua::finish);
    auto keys = finish_keys(p, "w1");
    // Two keeps (their followers' ids), then the ack that ends the lease and wants nothing next.
    const auto& t = lease.token;
    std::vector<std::string> args{"30000", "3", "call-p",          "", t,   "k", "",  lease.ahead[0].id, t,
                                  "k",     "",  lease.ahead[1].id, t,  "a", "",  "00"};
    auto first = co_await finish.run(store.connection(), keys, args);
    auto again = co_await finish.run(store.connection(), keys, args);  // its reply was lost
    REQUIRE(first.as_array().size() == 3);
    REQUIRE(again.as_array().size() == 3);
    for (std::size_t i = 0; i < 3; ++i) {
      CHECK(first.as_array().at(i).as_integer() == 1);
      CHECK(again.as_array().at(i).as_integer() == 1);  // the keeps were not lost: this call ended the lease
    }
    auto counts = co_await store.counts(queue);
    CHECK(counts.completed == 3);
    CHECK(counts.running == 0);
    CHECK(counts.groups == 0);
  });
}

TEST_CASE("a keep sent again after its call's record expired takes no second job off its group") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), shared_redis());
    std::string queue = key_prefix() + "q";
    auto p = redis_backend::key_prefix(queue);
    auto lease = co_await claim_three_grouped(store, queue, 2);
    redis::script finish(jobrt::lua::finish);
    auto keys = finish_keys(p, "w1");
    std::vector<std::string> args{"30000", "1", "call-k", "", lease.token, "k", "", lease.ahead[0].id};
    auto first = co_await finish.run(store.connection(), keys, args);
    CHECK(first.as_array().at(0).as_integer() == 1);
    // The reply was lost, and the worker could not reach the server for longer than the call's
    // record lasts; the lease is not reaped yet. The same call comes again.
    co_await redis::exec(store.connection(), redis::request("DEL", p + "answers:w1"));
    auto again = co_await finish.run(store.connection(), keys, args);
    CHECK(again.as_array().at(0).as_integer() == 1);  // the lease goes on
    auto left = co_await redis::exec(store.connection(), redis::request("LRANGE", p + "g:g", "0", "-1"));
    REQUIRE(left.as_array().size() == 2);  // the follower and the one behind it: nothing lost
    CHECK(detail::script_id(std::string(left.as_array()[0].as_string())) == lease.ahead[0].id);
    auto counts = co_await store.counts(queue);
    CHECK(counts.completed == 1);
  });
}

TEST_CASE("finish sent twice (a resend after a lost reply) changes nothing the second time") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), shared_redis());
    std::string queue = key_prefix() + "q";
    auto p = redis_backend::key_prefix(queue);
    auto lease = co_await claim_three_grouped(store, queue, 0);
    redis::script finish(jobrt::lua::finish);
    auto keys = finish_keys(p, "w1");
    // token, kind, producer id, then for an ack: want next ('1') and ahead (1 follower)
    std::vector<std::string> args{"30000", "1", "call-1", "", lease.token, "a", "", "11"};
    auto first = co_await finish.run(store.connection(), keys, args);
    auto again = co_await finish.run(store.connection(), keys, args);
    // The same held flag, next token and record; a resend's next job comes without followers.
    REQUIRE(first.as_array().size() == 5);
    REQUIRE(again.as_array().size() == 4);
    for (std::size_t i = 0; i < 3; ++i) CHECK(first.as_array().at(i) == again.as_array().at(i));
    CHECK(first.as_array().at(3).as_integer() == 1);
    CHECK(again.as_array().at(3).as_integer() == 0);
    CHECK(first.as_array().at(0).as_integer() == 3);          // held, and a next job
    CHECK_FALSE(first.as_array().at(1).as_string().empty());  // the burst's next job, leased once
    auto counts = co_await store.counts(queue);
    CHECK(counts.completed == 1);
    CHECK(counts.started == 2);
    CHECK(counts.running == 1);
    auto left = co_await redis::exec(store.connection(), redis::request("LLEN", p + "g:g"));
    CHECK(left.as_integer() == 2);  // one job popped, not two

    // A resend renews the next job's lease (it may come late)...
    std::string next(first.as_array().at(1).as_string());
    co_await redis::exec(store.connection(), redis::request("ZADD", p + "active", "XX", "1", next));
    co_await finish.run(store.connection(), keys, args);
    auto score = co_await redis::exec(store.connection(), redis::request("ZSCORE", p + "active", next));
    CHECK(std::stoll(std::string(score.as_string())) > 1000);
    // ...and one that comes after the lease was reaped does not hand out the job again.
    co_await redis::exec(store.connection(), redis::request("ZADD", p + "active", "XX", "1", next));
    reap_options ro;
    auto reaped = co_await store.reap(queue, ro);
    CHECK(reaped.leases == 1);
    auto late = co_await finish.run(store.connection(), keys, args);
    REQUIRE(late.as_array().size() == 1);  // held, and no next job
    CHECK(late.as_array().at(0).as_integer() == 1);
  });
}

TEST_CASE("finish calls on their way at once: each resend gets its own answer, and answered calls' records go") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), shared_redis());
    std::string queue = key_prefix() + "q";
    auto p = redis_backend::key_prefix(queue);
    producer prod(store, queue);
    std::vector<job_spec> specs;
    for (auto group : {"g", "g", "g", "h", "h"}) {
      job_spec s;
      s.type = "t";
      s.group = group;
      specs.push_back(s);
    }
    co_await prod.enqueue_bulk(std::move(specs));
    claim_options co{"w1", 2, std::chrono::seconds(30), 2};
    auto claimed = co_await store.claim(queue, co);
    REQUIRE(claimed.size() == 2);
    redis::script finish(jobrt::lua::finish);
    auto keys = finish_keys(p, "w1");
    auto keep = [&](std::string call, std::string forget, const claimed_job& c) {
      return std::vector<std::string>{"30000", "1", call, forget, c.token, "k", "", ""};
    };
    // Two keeps, each in a call of its own, both answered; then both sent again, as after a
    // dropped connection: neither takes a second job off its group.
    auto one = keep("call-1", "", claimed[0]), two = keep("call-2", "", claimed[1]);
    auto first = co_await finish.run(store.connection(), keys, one);
    auto second = co_await finish.run(store.connection(), keys, two);
    CHECK(co_await finish.run(store.connection(), keys, one) == first);
    CHECK(co_await finish.run(store.connection(), keys, two) == second);
    CHECK(first.as_array().at(0).as_integer() == 1);
    CHECK(second.as_array().at(0).as_integer() == 1);
    auto left = [&](std::string group) -> awaitable<std::int64_t> {
      co_return (co_await redis::exec(store.connection(), redis::request("LLEN", p + "g:" + group))).as_integer();
    };
    CHECK(co_await left("g") + co_await left("h") == 3);
    CHECK((co_await store.counts(queue)).completed == 2);
    // A call that says both answers came drops their records and keeps its own.
    auto three = keep("call-3", "call-1 call-2", claimed[0]);
    co_await finish.run(store.connection(), keys, three);
    auto fields = co_await redis::exec(store.connection(), redis::request("HKEYS", p + "answers:w1"));
    REQUIRE(fields.as_array().size() == 1);
    CHECK(fields.as_array().at(0).as_string() == "call-3");
    CHECK(co_await left("g") + co_await left("h") == 2);
    // A keep's lease goes on after it: sent again once the lease was reaped, it reports the
    // lease lost, so the worker does not start the follower beside the lease's next holder.
    co_await redis::exec(store.connection(), redis::request("ZADD", p + "active", "XX", "1", claimed[0].token));
    CHECK((co_await store.reap(queue, reap_options{})).leases == 1);
    auto late = co_await finish.run(store.connection(), keys, three);
    CHECK(late.as_array().at(0).as_integer() == 0);
    CHECK(co_await left("g") + co_await left("h") == 2);  // and took nothing off the group
  });
}

TEST_CASE("a finish batch of more than 1,000 items goes in parts, each answer in its item's place") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), shared_redis());
    std::string queue = key_prefix() + "q";
    auto p = redis_backend::key_prefix(queue);
    producer prod(store, queue);
    std::vector<job_spec> specs(1001);
    for (auto& s : specs) s.type = "t";
    for (int i = 0; i < 2; ++i) {
      job_spec s;
      s.type = "t";
      s.group = "g";
      specs.push_back(s);
    }
    co_await prod.enqueue_bulk(std::move(specs));
    std::vector<claimed_job> claimed;
    claim_options co{"w1", 1000, std::chrono::seconds(30), 1};  // (named: g++ 12 and temporaries in co_await)
    while (claimed.size() < 1002) {
      auto more = co_await store.claim(queue, co);
      REQUIRE(!more.empty());
      std::move(more.begin(), more.end(), std::back_inserter(claimed));
    }
    auto burst = std::find_if(claimed.begin(), claimed.end(), [](const claimed_job& c) { return c.group == "g"; });
    REQUIRE(burst != claimed.end());
    REQUIRE(burst->ahead.size() == 1);
    // The burst's keep is the 1,000th item and its lease's end the 1,001st: one call takes both
    // (a resent call reads a keep whose lease ended elsewhere as lost).
    std::vector<finish_item> items;
    for (const auto& c : claimed) {
      if (!c.group.empty()) continue;
      if (items.size() == 999) {
        finish_item keep;
        keep.token = burst->token;
        keep.kind = finish_kind::keep;
        keep.id = burst->ahead.front().id;
        items.push_back(keep);
        finish_item end;
        end.token = burst->token;
        items.push_back(end);
      }
      finish_item ack;
      ack.token = c.token;
      ack.kind = finish_kind::fail;  // the failures show where each answer went
      ack.error = c.token;
      items.push_back(ack);
    }
    auto results = co_await store.finish(queue, "w1", items, std::chrono::seconds(30));
    REQUIRE(results.size() == items.size());
    for (const auto& r : results) CHECK(r.lease_held);
    auto counts = co_await store.counts(queue);
    CHECK(counts.completed == 2);
    CHECK(counts.failed == 1001);
    CHECK(counts.running == 0);
    CHECK((co_await redis::exec(store.connection(), redis::request("LLEN", p + "g:g"))).as_integer() == 0);
    // Each failure is the dead letter of the job its item named.
    auto letters = co_await store.dead_letters(queue, 0, 2000);
    REQUIRE(letters.size() == 1001);
    for (const auto& d : letters) CHECK(d.error.find("|j:0|" + d.id + "|") != std::string::npos);
  });
}

TEST_CASE("a keep whose answer comes during stop's grace hands its follower back at once: no attempt counted") {
  redis_server server;  // (paused below: a server of its own)
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), server.config());
    redis::connection admin(ctx.get_executor(), server.config());
    admin.start();
    worker_options o;
    o.queue = "graceful";
    o.concurrency = 2;
    o.burst = 2;
    o.lease_ttl = std::chrono::milliseconds(900);  // the grace below outlasts it
    o.reap_period = std::chrono::milliseconds(100);
    o.claim_wait = std::chrono::milliseconds(300);
    worker w(ctx.get_executor(), store, o);
    int slow_started = 0;
    bool first_done = false;
    std::vector<std::string> runs;
    w.add_handler("slow", [&](job_context&) -> awaitable<void> {  // holds the grace open
      ++slow_started;
      co_await sleep_for(std::chrono::seconds(30));
    });
    w.add_handler("k", [&](job_context& c) -> awaitable<void> {
      runs.push_back(c.id());
      co_await eventually([&] { return slow_started > 0; });
      // The keep goes out now and waits in the server until stop has begun.
      co_await redis::exec(admin, redis::request("CLIENT", "PAUSE", 400, "WRITE"));
      first_done = true;
    });
    producer p(store, o.queue);
    std::vector<job_spec> specs(3);
    for (auto& s : specs) s.type = "k";
    specs[0].type = "slow";
    specs[1].group = specs[2].group = "g";
    auto ids = co_await p.enqueue_bulk(std::move(specs));
    w.start();
    co_await eventually([&] { return first_done; }, std::chrono::milliseconds(10000));
    REQUIRE(first_done);
    auto begun = std::chrono::steady_clock::now();
    co_await w.stop(std::chrono::milliseconds(2500));
    // slow held the grace; the follower did not start; the follower and slow went back.
    CHECK(std::chrono::steady_clock::now() - begun >= std::chrono::milliseconds(2500));
    CHECK(runs.size() == 1);
    CHECK(w.counters().released >= 2);
    // Handed back before its lease ran out, so the reaper found nothing to count.
    worker next(ctx.get_executor(), store, o);
    int attempt = 0;
    next.add_handler("k", [&](job_context& c) -> awaitable<void> {
      CHECK(c.id() == ids[2].id);
      attempt = c.attempt();
      co_return;
    });
    next.add_handler("slow", [&](job_context&) -> awaitable<void> { co_return; });
    next.start();
    co_await eventually([&] { return attempt != 0; }, std::chrono::milliseconds(10000));
    CHECK(attempt == 1);
    co_await next.stop(std::chrono::seconds(5));
  });
}

TEST_CASE("a keep answered after its lease's local end hands the follower back: it runs, no attempt counted") {
  redis_server server;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    // The keep and the renewals after it run in the server, which keeps the lease; their
    // answers wait in the relay past the lease's local end.
    answer_relay relay(ctx.get_executor(), server.config());
    redis_backend store(ctx.get_executor(), relay.config());
    redis_backend direct(ctx.get_executor(), server.config());  // the test's own calls: never held
    worker_options o;
    o.queue = "late-keep";
    o.concurrency = 1;
    o.burst = 2;
    o.lease_ttl = std::chrono::milliseconds(600);
    o.reap_period = std::chrono::milliseconds(100);
    o.claim_wait = std::chrono::milliseconds(300);
    worker w(ctx.get_executor(), store, o);
    std::vector<std::pair<std::string, int>> runs;  // job id, attempt
    w.add_handler("k", [&](job_context& c) -> awaitable<void> {
      runs.emplace_back(c.id(), c.attempt());
      if (runs.size() == 2) relay.hold(true);  // the group's first job: its keep's answer waits
      co_return;
    });
    producer p(direct, o.queue);
    w.start();
    // A first job loads the scripts: a finish sent back for SCRIPT LOAD would land late.
    job_spec first;
    first.type = "k";
    co_await p.enqueue(first);
    co_await eventually([&] { return w.counters().completed != 0; }, std::chrono::milliseconds(5000));
    std::vector<job_spec> specs(2);
    for (auto& s : specs) {
      s.type = "k";
      s.group = "g";
    }
    specs[1].max_attempts = 1;  // an attempt counted for a run that never happened: dead-lettered
    auto ids = co_await p.enqueue_bulk(std::move(specs));
    co_await eventually([&] { return runs.size() >= 2; }, std::chrono::milliseconds(5000));
    REQUIRE(runs.size() == 2);
    // Longer than the TTL, shorter than two health intervals (the connection is not given up).
    co_await sleep_for(std::chrono::milliseconds(900));
    relay.hold(false);
    co_await eventually([&] { return runs.size() >= 3; }, std::chrono::milliseconds(5000));
    REQUIRE(runs.size() == 3);
    CHECK(runs[1].first == ids[0].id);
    CHECK(runs[2].first == ids[1].id);
    CHECK(runs[2].second == 1);
    co_await w.stop(std::chrono::seconds(5));  // (its last ack lands)
    CHECK(w.counters().released == 1);
    CHECK(w.counters().completed == 3);
    CHECK((co_await direct.counts(o.queue)).dead == 0);
  });
}

TEST_CASE("check reports broken bookkeeping and repair fixes it") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), shared_redis());
    std::string queue = key_prefix() + "q";
    auto p = redis_backend::key_prefix(queue);
    producer prod(store, queue);
    std::vector<job_spec> specs;
    for (auto group : {"stuck", "twice", "fine"}) {
      job_spec s;
      s.type = "t";
      s.group = group;
      specs.push_back(s);
    }
    co_await prod.enqueue_bulk(std::move(specs));
    auto& c = store.connection();
    // A crash between steps, or a hand at redis-cli: a group loses its lane, another gets a
    // second one, a lane names a group with no jobs, an id is left taken, a dead worker holds a lane.
    co_await redis::exec(c, redis::request("LREM", p + "ready", "0", "g:stuck"));
    co_await redis::exec(c, redis::request("RPUSH", p + "ready", "g:twice", "g:gone"));
    co_await redis::exec(c, redis::request("SADD", p + "ids", "orphan"));
    co_await redis::exec(c, redis::request("RPUSH", p + "claimed:dead-worker", "j:0|x1|{\"type\":\"t\",\"at\":1}"));

    auto report = co_await store.check(queue, false);
    for (auto& line : report.problems) MESSAGE(line);
    CHECK(report.problems.size() == 5);
    CHECK(report.stuck_groups == 1);
    CHECK(report.jobs == 4);
    CHECK(report.oldest_enqueued_ms == 1);
    auto has = [&](std::string_view text) {
      return std::any_of(report.problems.begin(), report.problems.end(),
                         [&](const std::string& line) { return line.find(text) != std::string::npos; });
    };
    CHECK(has("group stuck has 1 jobs and no lane"));
    CHECK(has("group twice has 2 lanes"));
    CHECK(has("a lane of group gone, which has no jobs, is in ready"));
    CHECK(has("id orphan is taken but no pending job has it"));
    CHECK(has("1 lanes held by worker dead-worker, which has no heartbeat"));

    auto repaired = co_await store.check(queue, true);
    CHECK(repaired.repaired == 5);
    auto after = co_await store.check(queue, false);
    for (auto& line : after.problems) MESSAGE(line);
    CHECK(after.problems.empty());
    // Every job runs once: one lane per group, and the dead worker's lane is back.
    claim_options co{"w", 10, std::chrono::seconds(30)};
    auto claimed = co_await store.claim(queue, co);
    CHECK(claimed.size() == 4);
  });
}

TEST_CASE("check's confirmation drops a copy only when there are two: an entry its walk read twice stays") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), shared_redis());
    std::string queue = key_prefix() + "q";
    auto p = redis_backend::key_prefix(queue);
    auto& c = store.connection();
    producer prod(store, queue);
    job_spec loose;
    loose.type = "t";
    co_await prod.enqueue(loose);
    auto lane = std::string((co_await redis::exec(c, redis::request("LINDEX", p + "ready", "0"))).as_string());
    REQUIRE(lane.starts_with("j:"));
    auto id = std::string(detail::script_id(std::string_view(lane).substr(2)));
    redis::script fix(jobrt::lua::check_fix);
    std::vector<std::string> keys{p + "ready",  p + "active", p + "delayed", p + "paused",
                                  p + "parked", p + "ids",    p + "workers", p + "stats"};
    // What the walk would report had it read the one entry twice (the list moved under it).
    std::vector<std::string> args{"1", "copy", "200000", id, "ready", "", lane, "ready", "", lane};
    auto once = (co_await fix.run(c, keys, args)).as_array();
    CHECK(once.size() == 2);  // no problem confirmed
    CHECK(once.at(1).as_integer() == 0);
    CHECK((co_await redis::exec(c, redis::request("LLEN", p + "ready"))).as_integer() == 1);  // the job stays
    // Really twice: confirmed, and one copy goes.
    co_await redis::exec(c, redis::request("RPUSH", p + "ready", lane));
    auto twice = (co_await fix.run(c, keys, args)).as_array();
    CHECK(twice.size() == 3);
    CHECK(twice.at(1).as_integer() == 1);
    CHECK((co_await redis::exec(c, redis::request("LLEN", p + "ready"))).as_integer() == 1);
  });
}

TEST_CASE("check reports a job in two places and a lease on a group with no jobs, and repair fixes both") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), shared_redis());
    std::string queue = key_prefix() + "q";
    auto p = redis_backend::key_prefix(queue);
    auto& c = store.connection();
    producer prod(store, queue);
    job_spec grouped;
    grouped.type = "t";
    grouped.group = "dup";
    grouped.id = "in-group";
    job_spec ungrouped;
    ungrouped.type = "t";
    ungrouped.id = "loose";
    std::vector<job_spec> specs{grouped, ungrouped};
    co_await prod.enqueue_bulk(std::move(specs));
    auto record = std::string((co_await redis::exec(c, redis::request("LINDEX", p + "g:dup", "0"))).as_string());
    REQUIRE(record.starts_with("0|in-group|"));
    auto lanes = co_await redis::exec(c, redis::request("LRANGE", p + "ready", "0", "-1"));
    std::string loose_lane;
    for (auto& l : lanes.as_array())
      if (l.as_string().starts_with("j:")) loose_lane = std::string(l.as_string());
    REQUIRE(loose_lane.starts_with("j:0|loose|"));
    // A job in two places: the grouped job's record also as an ungrouped lane in ready (a
    // producer's half-done rewrite), the ungrouped job also waiting in delayed (a retry written
    // twice). A lease on a group with no jobs: its job is gone (an operator deleted the list), a
    // finish of it would pop a job enqueued to the group later while another worker runs that.
    co_await redis::exec(c, redis::request("RPUSH", p + "ready", "j:" + record));
    co_await redis::exec(c, redis::request("ZADD", p + "delayed", "4102444800000", loose_lane));
    auto far = std::chrono::duration_cast<std::chrono::milliseconds>(
                   (std::chrono::system_clock::now() + std::chrono::minutes(10)).time_since_epoch())
                   .count();
    co_await redis::exec(c, redis::request("ZADD", p + "active", far, "999999|g:gone"));

    auto report = co_await store.check(queue, false);
    for (auto& line : report.problems) MESSAGE(line);
    CHECK(report.problems.size() == 3);
    auto has = [&](std::string_view text) {
      return std::any_of(report.problems.begin(), report.problems.end(),
                         [&](const std::string& line) { return line.find(text) != std::string::npos; });
    };
    CHECK(has("job in-group is in ready and in group dup"));
    CHECK(has("job loose is in ready and in delayed"));
    CHECK(has("a lane of group gone, which has no jobs, is in a lease"));
    CHECK(report.stuck_groups == 0);

    auto repaired = co_await store.check(queue, true);
    CHECK(repaired.repaired == 3);
    auto after = co_await store.check(queue, false);
    for (auto& line : after.problems) MESSAGE(line);
    CHECK(after.problems.empty());
    CHECK(after.jobs == 2);
    // What was kept: the group's record and the ready lane; the copies and the lease are gone.
    auto counts = co_await store.counts(queue);
    CHECK(counts.delayed == 0);
    CHECK(counts.running == 0);
    CHECK(counts.ready_lanes == 2);
    claim_options co{"w", 10, std::chrono::seconds(30)};
    auto claimed = co_await store.claim(queue, co);
    REQUIRE(claimed.size() == 2);
    std::set<std::string> got;
    for (auto& j : claimed) got.insert(j.group + ":" + text(j.job));
    CHECK(got == std::set<std::string>{"dup:" + record, ":" + loose_lane.substr(2)});
    CHECK((co_await store.claim(queue, co)).empty());
  });
}

namespace {

// The ids of the clients whose name starts with `name` (a backend's blocking and subscriber
// connections are named <name>:blocking and <name>:wakeups).
std::vector<std::string> clients_named(const redis::config& cfg, std::string_view name) {
  std::istringstream list(redis_cli(cfg, {"CLIENT", "LIST"}));
  std::vector<std::string> ids;
  for (std::string line; std::getline(list, line);)
    if (line.find(fmt::format(" name={}", name)) != std::string::npos)
      ids.push_back(line.substr(3, line.find(' ') - 3));
  return ids;
}

}  // namespace

TEST_CASE("a worker survives CLIENT KILL of each of its connections") {
  redis_server server;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    auto cfg = server.config();
    cfg.client_name = "victim";
    redis_backend store(ctx.get_executor(), cfg);
    auto producer_cfg = server.config();
    producer_cfg.client_name = "producer";
    redis_backend feeder(ctx.get_executor(), producer_cfg);
    producer p(feeder, "q");
    worker_options o;
    o.queue = "q";
    o.concurrency = 4;
    o.claim_wait = std::chrono::milliseconds(500);
    o.lease_ttl = std::chrono::milliseconds(900);
    worker w(ctx.get_executor(), store, o);
    int done = 0;
    w.add_handler("t", [&](job_context&) -> awaitable<void> {
      ++done;
      co_return;
    });
    w.start();
    job_spec s;
    s.type = "t";
    s.group = "g";
    co_await p.enqueue(s);
    CHECK(co_await eventually([&] { return done == 1; }));
    // Shared, blocking and subscriber connections all carry the name: kill them all, three times.
    for (int round = 0; round < 3; ++round) {
      // All three back (a reconnect may still be in its backoff after the last round).
      std::vector<std::string> victims;
      CHECK(co_await eventually([&] { return (victims = clients_named(server.config(), "victim")).size() == 3; }));
      for (auto& id : victims) redis_cli(server.config(), {"CLIENT", "KILL", "ID", id});
      co_await p.enqueue(s);  // an idle worker wakes for it...
      auto later = s;
      later.delay = std::chrono::milliseconds(300);  // ...and its promoter for this one
      co_await p.enqueue(later);
      CHECK(co_await eventually([&] { return done == 3 + 2 * round; }));
    }
    co_await w.stop(std::chrono::seconds(5));
    CHECK(w.counters().leases_lost == 0);
    CHECK(w.counters().completed == 7);
  });
}

TEST_CASE("a lease held across a redis-server restart is renewed and its job runs once") {
  redis_server server({"--appendonly", "yes", "--appendfsync", "always"});
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), server.config());
    producer p(store, "q");
    worker_options o;
    o.queue = "q";
    o.concurrency = 2;
    o.lease_ttl = std::chrono::milliseconds(1500);
    worker w(ctx.get_executor(), store, o);
    int starts = 0, ends = 0;
    w.add_handler("t", [&](job_context&) -> awaitable<void> {
      ++starts;
      co_await sleep_for(std::chrono::milliseconds(2500));  // longer than the TTL, across the restart
      ++ends;
    });
    w.start();
    job_spec s;
    s.type = "t";
    s.group = "g";
    co_await p.enqueue(s);
    CHECK(co_await eventually([&] { return starts == 1; }));
    co_await sleep_for(std::chrono::milliseconds(300));
    server.stop(true);  // SIGKILL: the append-only file has every acknowledged write
    co_await sleep_for(std::chrono::milliseconds(200));
    server.start();
    CHECK(co_await eventually([&] { return w.counters().completed == 1; }));
    co_await sleep_for(std::chrono::milliseconds(1000));  // a second run would start by now
    co_await w.stop(std::chrono::seconds(5));
    CHECK(starts == 1);
    CHECK(ends == 1);
    CHECK(w.counters().leases_lost == 0);
    auto counts = co_await store.counts("q");
    CHECK(counts.completed == 1);
    CHECK(counts.running == 0);
  });
}

TEST_CASE(
    "redis-server down for longer than the lease TTL: the handler is cancelled, stop() still returns, the job runs "
    "again") {
  redis_server server({"--appendonly", "yes", "--appendfsync", "always"});
  run([&](asio::io_context& ctx) -> awaitable<void> {
    auto lease_ttl = std::chrono::milliseconds(900);
    redis_backend store(ctx.get_executor(), server.config());
    producer p(store, "q");
    job_spec s;
    s.type = "t";
    s.group = "g";
    co_await p.enqueue(s);
    worker_options o;
    o.queue = "q";
    o.lease_ttl = lease_ttl;
    auto w = std::make_unique<worker>(ctx.get_executor(), store, o);
    bool cancelled = false;
    std::chrono::steady_clock::time_point down, cancelled_at;
    w->add_handler("t", [&](job_context& c) -> awaitable<void> {
      asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::seconds(30));
      co_await t.async_wait(asio::as_tuple(use_awaitable));
      cancelled = c.cancelled();
      cancelled_at = std::chrono::steady_clock::now();
    });
    w->start();
    CHECK(co_await eventually([&] { return w->in_flight() == 1; }));
    server.stop(true);
    down = std::chrono::steady_clock::now();
    // No renewal can reach the server: within the TTL and a watchdog period the lease is
    // given up here, as the server will find it expired.
    CHECK(co_await eventually([&] { return cancelled; }));
    CHECK(cancelled_at - down <= lease_ttl + lease_ttl / 3 + std::chrono::milliseconds(300));
    CHECK(w->counters().leases_lost == 1);
    auto stop_began = std::chrono::steady_clock::now();
    co_await w->stop(std::chrono::milliseconds(200));  // every call it makes is bounded
    CHECK(std::chrono::steady_clock::now() - stop_began < std::chrono::seconds(5));
    w.reset();
    server.start();
    // Another worker finds the lease expired and runs the job again, as its second attempt.
    worker again(ctx.get_executor(), store, o);
    int attempt = 0;
    again.add_handler("t", [&](job_context& c) -> awaitable<void> {
      attempt = c.attempt();
      co_return;
    });
    again.start();
    CHECK(co_await eventually([&] { return again.counters().completed == 1; }));
    co_await again.stop(std::chrono::seconds(5));
    CHECK(attempt == 2);
  });
}

TEST_CASE("check reads only its own queue's keys when the queue's name has glob characters") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), shared_redis());
    std::string glob = key_prefix() + "q*[a]?", other = key_prefix() + "qXa!";  // `other` matches glob as a pattern
    for (auto& queue : {glob, other}) {
      producer p(store, queue);
      job_spec s;
      s.type = "t";
      s.group = "g";
      co_await p.enqueue(s);
    }
    auto report = co_await store.check(glob, false);
    CHECK(report.groups == 1);
    CHECK(report.jobs == 1);
    CHECK(report.problems.empty());
  });
}

TEST_CASE("a worker's next run expires every lease it held: more than one script batch and tokens with newlines") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), shared_redis());
    std::string queue = key_prefix() + "q";
    auto p = redis_backend::key_prefix(queue);
    std::vector<std::string> tokens, scored;
    for (int i = 0; i < 1500; ++i) {
      // An ungrouped job's token carries its record, whose JSON may hold raw newlines.
      tokens.push_back(fmt::format("{}|j:0|{}|{{\n\"type\": \"t\"}}", i + 1, i + 1));
      scored.push_back("9999999999999");
      scored.push_back(tokens.back());
    }
    co_await redis::exec(store.connection(), redis::request("ZADD", p + "active", scored));
    auto held = co_await store.extend(queue, "w", tokens, std::chrono::seconds(30));
    CHECK(held.size() == 1500);
    CHECK(std::count(held.begin(), held.end(), true) == 1500);
    CHECK(co_await store.expire_own(queue, "w") == 1500);
    auto expired = co_await redis::exec(store.connection(), redis::request("ZCOUNT", p + "active", "0", "0"));
    CHECK(expired.as_integer() == 1500);
  });
}
