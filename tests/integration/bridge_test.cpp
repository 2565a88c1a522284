// The stream bridge (jobrt/bridge.hpp) against a real server: entries become jobs once, bad ones
// go to the dead-letter stream with the reason, and bridge processes killed with SIGKILL again and
// again lose and double nothing while workers run the jobs.
#include "integration/job_runs.hpp"
#include "support/redis_server.hpp"
#include "support/run.hpp"

#include <jobrt/bridge.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/worker.hpp>

#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstring>
#include <fstream>
#include <map>

#ifndef JOBRT_BIN
#error "JOBRT_BIN must name the jobrt executable (see tests/CMakeLists.txt)"
#endif

extern char** environ;

namespace asio = boost::asio;
using namespace jobrt;
using namespace jobrt::test;
using asio::awaitable;

namespace {

// XADD stream * field value ...
template <class... Fields>
awaitable<void> add(redis::connection& c, std::string stream, Fields... fields) {
  co_await redis::exec(c, redis::request("XADD", stream, "*", fields...));
}

// The value of `field` in an entry's flat field list.
std::string field_of(const redis::reply& fields, std::string_view field) {
  const auto& kv = fields.as_array();
  for (std::size_t i = 0; i + 1 < kv.size(); i += 2)
    if (kv[i].as_string() == field) return kv[i + 1].as_string();
  return {};
}

// `jobrt bridge` processes; each still running at the end is killed.
class bridges {
 public:
  // Bridges from stream "in" at `url` into the queue at `queue_url` (by default the same server).
  explicit bridges(std::string url, std::string queue_url = {})
      : url_(std::move(url)), queue_url_(queue_url.empty() ? url_ : std::move(queue_url)) {}
  ~bridges() {
    for (auto& [name, pid] : pids_) reap(pid, SIGKILL);
  }
  bridges(const bridges&) = delete;
  bridges& operator=(const bridges&) = delete;

  void start(const std::string& name) {
    std::vector<std::string> args{JOBRT_BIN,
                                  "bridge",
                                  "--from",
                                  fmt::format("{}/in?group=jobrt&consumer={}&lock_ttl_ms=300&batch=200",
                                              "redis-stream://" + url_.substr(std::strlen("redis://")), name),
                                  "-q",
                                  "bridged",
                                  "-u",
                                  queue_url_,
                                  "--log-level",
                                  "warn"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    if (int rc = ::posix_spawn(&pid, JOBRT_BIN, nullptr, nullptr, argv.data(), environ); rc != 0)
      throw std::runtime_error(fmt::format("cannot start {}: {}", JOBRT_BIN, std::strerror(rc)));
    pids_[name] = pid;
  }
  void kill(const std::string& name) { reap(pids_.at(name), SIGKILL); }
  void signal(const std::string& name, int signal) { ::kill(pids_.at(name), signal); }
  // Its exit status, or minus the signal that ended it, once it has ended.
  int wait(const std::string& name) { return reap(pids_.at(name), 0); }
  int terminate(const std::string& name) { return reap(pids_.at(name), SIGTERM); }
  // Whether each catches SIGTERM by now (a signal that comes earlier ends it by default).
  bool catching() const {
    for (const auto& [name, pid] : pids_) {
      std::ifstream status(fmt::format("/proc/{}/status", pid));
      std::string line;
      bool caught = false;
      while (std::getline(status, line))
        if (line.starts_with("SigCgt:")) caught = (std::stoull(line.substr(7), nullptr, 16) >> (SIGTERM - 1)) & 1;
      if (!caught) return false;
    }
    return true;
  }
  // SIGTERM to each, then its exit status (or minus the signal that ended it).
  std::vector<int> stop() {
    std::vector<int> out;
    for (auto& [name, pid] : pids_) out.push_back(reap(pid, SIGTERM));
    return out;
  }

 private:
  static int reap(pid_t& pid, int signal) {
    if (pid <= 0) return -1;
    if (signal != 0) ::kill(pid, signal);
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }
  std::string url_, queue_url_;
  std::map<std::string, pid_t> pids_;
};

}  // namespace

TEST_CASE("bridge: entries become jobs once, bad ones go to the dead-letter stream with the reason") {
  redis_server server;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis::connection c(ctx.get_executor(), server.config());
    c.start();
    redis_backend store(ctx.get_executor(), server.config());
    producer_options po;
    po.max_body_bytes = 300;
    producer to(store, "q", po);
    for (int n = 0; n < 3; ++n)
      co_await add(c, "s", "type", "t", "group", "g", "payload", fmt::format("{{\"n\":{}}}", n));
    co_await add(c, "s", "type", "t", "id", "order-7", "tenant", "3");
    co_await add(c, "s", "type", "t", "id", "order-7", "tenant", "3");  // sent twice: one job
    co_await add(c, "s", "type", "t", "payload", "{not json");
    co_await add(c, "s", "payload", "{}");
    co_await add(c, "s", "type", "t", "payload", fmt::format("\"{}\"", std::string(400, 'x')));
    co_await add(c, "s", "type", "t", "id", "17");

    auto from = stream_source::from_url(fmt::format("redis-stream://127.0.0.1:{}/s?group=jobrt", server.port()));
    stream_bridge bridge(ctx.get_executor(), from, to);
    bool ended = false;
    asio::co_spawn(ctx, bridge.run(), [&](std::exception_ptr e) {
      ended = true;
      if (e) std::rethrow_exception(e);
    });
    // Read, stored and acknowledged: nothing pending at the stream.
    bridge_counters counts;
    REQUIRE(co_await eventually([&]() -> awaitable<bool> {
      counts = co_await bridge.sample();
      co_return counts.received == 9 && counts.pending == 0;
    }));
    CHECK(counts.enqueued == 4);
    CHECK(counts.duplicates == 1);
    CHECK(counts.rejected == 4);
    CHECK(counts.active);
    CHECK(counts.lag == 0);
    CHECK(counts.pending == 0);

    // The jobs, in stream order; the group's in its order; the ids the entries gave or their own.
    claim_options o;
    o.worker = "w";
    o.max = 10;
    auto claimed = co_await store.claim("q", o);
    std::vector<std::string> ids;
    for (auto& j : claimed) ids.push_back(j.job.id);
    REQUIRE(claimed.size() == 2);  // g's head and order-7
    CHECK(claimed[0].job.id.starts_with("s@"));
    CHECK(claimed[1].job.id == "order-7");
    CHECK(co_await store.group_size("q", "g") == 3);
    auto seven = decode_job(fmt::format("0|order-7|{}", claimed[1].job.body), "");
    CHECK(seven.payload == boost::json::parse(R"({"tenant":"3"})"));
    CHECK(seven.keep == std::chrono::hours(1));

    // The dead letters, with their reasons and their fields.
    auto dead = co_await redis::exec(c, redis::request("XRANGE", "s:dead", "-", "+"));
    REQUIRE(dead.as_array().size() == 4);
    std::vector<std::string> reasons;
    for (auto& e : dead.as_array()) reasons.push_back(field_of(e.as_array().at(1), "reason"));
    CHECK(reasons[0].starts_with("field payload is not JSON"));
    CHECK(reasons[1] == "no field type to give the job's type, and no default type");
    CHECK(reasons[2].find("bytes encoded; the limit is 300") != std::string::npos);
    CHECK(reasons[3].find("all digits") != std::string::npos);
    CHECK(field_of(dead.as_array()[0].as_array().at(1), "payload") == "{not json");
    CHECK(field_of(dead.as_array()[0].as_array().at(1), "stream") == "s");

    // Stopped, it returns.
    bridge.stop();
    CHECK(co_await eventually([&] { return ended; }, 5s));
  });
}

TEST_CASE("bridge: entries another consumer of its group read and left pending are taken over within a lock TTL") {
  redis_server server;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis::connection c(ctx.get_executor(), server.config());
    c.start();
    redis_backend store(ctx.get_executor(), server.config());
    producer to(store, "q");
    co_await add(c, "s", "type", "t", "payload", R"({"n":0})");
    auto from = stream_source::from_url(
        fmt::format("redis-stream://127.0.0.1:{}/s?group=jobrt&lock_ttl_ms=300", server.port()));
    stream_bridge bridge(ctx.get_executor(), from, to);
    bool ended = false;
    asio::co_spawn(ctx, bridge.run(), [&](std::exception_ptr e) {
      ended = true;
      if (e) std::rethrow_exception(e);
    });
    bridge_counters counts;
    REQUIRE(co_await eventually([&]() -> awaitable<bool> {
      counts = co_await bridge.sample();
      co_return counts.enqueued == 1 && counts.pending == 0;
    }));
    // A bridge that lost the lock and did not know it yet reads an entry and does not store it.
    // (In one transaction: the entry goes to it, not to the running bridge's blocked read.)
    redis::request stale;
    stale.push("MULTI")
        .push("XADD", "s", "*", "type", "t", "payload", R"({"n":1})")
        .push("XREADGROUP", "GROUP", "jobrt", "gone", "COUNT", "10", "STREAMS", "s", ">")
        .push("EXEC");
    redis::blocking_connection reads(ctx.get_executor(), server.config());  // (XREADGROUP goes on one)
    reads.start();
    auto took = co_await redis::exec(reads, std::move(stale));
    REQUIRE(took.as_array().back().as_array().size() == 2);
    REQUIRE_FALSE(took.as_array().back().as_array()[1].is_nil());  // "gone" has it pending
    REQUIRE(co_await eventually([&]() -> awaitable<bool> {
      counts = co_await bridge.sample();
      co_return counts.enqueued == 2 && counts.pending == 0;
    }));
    CHECK(counts.taken_over == 1);
    bridge.stop();
    CHECK(co_await eventually([&] { return ended; }, 5s));
  });
}

TEST_CASE("bridge: with its stream's server out of reach it keeps trying, answers a sample, and stops when asked") {
  redis_server server;  // (the queue's)
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), server.config());
    producer to(store, "q");
    auto from = stream_source::from_url("redis-stream://127.0.0.1:1/s?group=jobrt&lock_ttl_ms=300");
    stream_bridge bridge(ctx.get_executor(), from, to);
    bool ended = false;
    asio::co_spawn(ctx, bridge.run(), [&](std::exception_ptr e) {
      ended = true;
      if (e) std::rethrow_exception(e);
    });
    asio::steady_timer t(ctx, 1s);
    co_await t.async_wait(asio::use_awaitable);
    CHECK_FALSE(ended);  // (trying still)
    auto began = std::chrono::steady_clock::now();
    auto counts = co_await bridge.sample();  // bounded: the figures it cannot read are -1
    CHECK(counts.pending == -1);
    CHECK(counts.lag == -1);
    CHECK(std::chrono::steady_clock::now() - began < 3s);
    began = std::chrono::steady_clock::now();
    bridge.stop();
    CHECK(co_await eventually([&] { return ended; }, 5s));
    CHECK(std::chrono::steady_clock::now() - began < 1s);
  });
}

TEST_CASE("bridge: with its queue's server out of reach, a stop ends the store after its grace and leaves the entry") {
  redis_server streams;
  redis_server queue;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis::connection c(ctx.get_executor(), streams.config());
    c.start();
    redis_backend store(ctx.get_executor(), queue.config());
    producer to(store, "q");
    auto from = stream_source::from_url(
        fmt::format("redis-stream://127.0.0.1:{}/s?group=jobrt&lock_ttl_ms=300", streams.port()));
    stream_bridge bridge(ctx.get_executor(), from, to);
    bool ended = false;
    asio::co_spawn(ctx, bridge.run(), [&](std::exception_ptr e) {
      ended = true;
      if (e) std::rethrow_exception(e);
    });
    REQUIRE(co_await eventually([&]() -> awaitable<bool> { co_return (co_await bridge.sample()).pending == 0; }));
    queue.stop();  // (its calls wait for it to come back)
    co_await add(c, "s", "type", "t", "payload", "{}");
    REQUIRE(co_await eventually([&] { return bridge.counters().received >= 1; }));
    auto began = std::chrono::steady_clock::now();
    bridge.stop();
    CHECK(co_await eventually([&] { return ended; }, 10s));
    auto took = std::chrono::steady_clock::now() - began;
    CHECK(took >= 4s);  // (the store's grace: 5 s)
    CHECK(took < 8s);
    CHECK(bridge.counters().enqueued == 0);
    // Not acknowledged: pending in the group, for the next bridge to take over.
    auto pending = co_await redis::exec(c, redis::request("XPENDING", "s", "jobrt"));
    CHECK(pending.as_array().at(0).as_integer() == 1);
  });
}

TEST_CASE("bridge: a store its queue's server refuses is tried again, and stored once the server takes it") {
  redis_server streams;
  redis_server queue;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis::connection c(ctx.get_executor(), streams.config());
    c.start();
    redis::connection admin(ctx.get_executor(), queue.config());
    admin.start();
    redis_backend store(ctx.get_executor(), queue.config());
    producer to(store, "q");
    auto from = stream_source::from_url(
        fmt::format("redis-stream://127.0.0.1:{}/s?group=jobrt&lock_ttl_ms=300", streams.port()));
    stream_bridge bridge(ctx.get_executor(), from, to);
    bool ended = false;
    asio::co_spawn(ctx, bridge.run(), [&](std::exception_ptr e) {
      ended = true;
      if (e) std::rethrow_exception(e);
    });
    REQUIRE(co_await eventually([&]() -> awaitable<bool> { co_return (co_await bridge.sample()).pending == 0; }));
    co_await redis::exec(admin, redis::request("CONFIG", "SET", "maxmemory", "1"));  // (writes refused: OOM)
    co_await add(c, "s", "type", "t", "payload", "{}");
    REQUIRE(co_await eventually([&] { return bridge.counters().received >= 1; }));
    asio::steady_timer t(ctx, 500ms);  // (refused and tried again meanwhile)
    co_await t.async_wait(asio::use_awaitable);
    CHECK(bridge.counters().enqueued == 0);
    co_await redis::exec(admin, redis::request("CONFIG", "SET", "maxmemory", "0"));
    CHECK(co_await eventually(
        [&]() -> awaitable<bool> {
          auto counts = co_await bridge.sample();
          co_return counts.enqueued == 1 && counts.pending == 0;
        },
        10s));
    bridge.stop();
    CHECK(co_await eventually([&] { return ended; }, 5s));
  });
}

TEST_CASE("bridge: a bad stream URL is refused naming what is wrong") {
  auto refusal = [](std::string url) {
    try {
      stream_source::from_url(url);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(refusal("redis://h/s?group=g").find("none of redis-stream://, rediss-stream://") != std::string::npos);
  CHECK(refusal("redis-stream://h/s").find("consumer group is missing") != std::string::npos);
  CHECK(refusal("redis-stream://h/?group=g").find("must name the stream") != std::string::npos);
  CHECK(refusal("redis-stream://h/s?group=g&speed=9").find("unknown parameter 'speed'") != std::string::npos);
  CHECK(refusal("redis-stream://h/s?group=g&batch=0").find("batch '0' is not a whole number") != std::string::npos);
  CHECK(refusal("redis-stream://h:99999/s?group=g").find("stream URL 'redis-stream://h:99999") != std::string::npos);
  CHECK(refusal("redis-stream://u:secret@h/s") ==
        "stream URL 'redis-stream://u:***@h/s': the consumer group is missing "
        "(?group=<group>)");
  CHECK(stream_source::from_url("redis-stream://h/a%2Fb?group=g%26h").stream == "a/b");
  CHECK(stream_source::from_url("redis-stream://h/a%2Fb?group=g%26h").group == "g&h");
  auto spaced = stream_source::from_url("redis-stream://h/a%2Fb%3Fc?group=g%201%2B2%26x");
  CHECK(spaced.group == "g 1+2&x");
  CHECK(spaced.stream == "a/b?c");
  CHECK(spaced.address() == "redis-stream://h:6379/a%2Fb%3Fc?group=g%201%2B2%26x");
  CHECK(stream_source::from_url(spaced.address()).group == spaced.group);
  CHECK(stream_source::from_url(spaced.address()).stream == spaced.stream);
  // A hash tag, quotes and other marks a URL must not hold bare: address() encodes them.
  auto tagged = stream_source::from_url("redis-stream://h/%7Borders%7D?group=%5Bg%5D%7C%22x%22%5E%60%3C%3E%5C");
  CHECK(tagged.stream == "{orders}");
  CHECK(tagged.group == "[g]|\"x\"^`<>\\");
  CHECK(tagged.address() == "redis-stream://h:6379/%7Borders%7D?group=%5Bg%5D%7C%22x%22%5E%60%3C%3E%5C");
  CHECK(stream_source::from_url(tagged.address()).group == tagged.group);
  // A bare '+' in a name is refused (a space to redis://, a plus to earlier bridges).
  CHECK(refusal("redis-stream://h/s?group=a+b") ==
        "stream URL 'redis-stream://h/s?group=a+b': parameter group 'a+b' holds a bare '+': write %2B for a plus, "
        "%20 for a space");
  CHECK(refusal("redis-stream://h/s?group=g&consumer=c+1").find("consumer 'c+1' holds a bare '+'") !=
        std::string::npos);
  CHECK(refusal("redis-stream://h/s?group=g&dead=d+1").find("dead 'd+1' holds a bare '+'") != std::string::npos);
  CHECK(stream_source::from_url("redis-stream://h/s?group=g&db=3").address() == "redis-stream://h:6379/s?group=g&db=3");
  auto s = stream_source::from_url("rediss-stream://u:pw@h:7000/orders?group=g&consumer=c&db=2&ca=/x.pem");
  CHECK(s.server.tls);
  CHECK(s.server.password == "pw");
  CHECK(s.server.database == 2);
  CHECK(s.server.tls_ca_file == "/x.pem");
  CHECK(s.stream == "orders");
  CHECK(s.dead == "orders:dead");
  CHECK(s.consumer == "c");
  CHECK(s.address() == "rediss-stream://h:7000/orders?group=g&db=2");

  // Several hosts: a cluster's nodes.
  auto on_cluster = stream_source::from_url("redis-stream://u:pw@n1:7000,n2:7001/orders?group=g");
  CHECK(on_cluster.server.host == "n1");
  CHECK(on_cluster.server.password == "pw");
  REQUIRE(on_cluster.other_seeds.size() == 1);
  CHECK(on_cluster.other_seeds[0].host == "n2");
  CHECK(on_cluster.other_seeds[0].port == "7001");
  CHECK(on_cluster.other_seeds[0].password == "pw");
  CHECK(on_cluster.address() == "redis-stream://n1:7000,n2:7001/orders?group=g");
  CHECK(refusal("redis-stream://n1,n2/s?group=g&db=1").find("Redis Cluster, which has no db") != std::string::npos);

  // Behind Sentinel: the sentinels, the primary's name, then the stream.
  auto behind = stream_source::from_url(
      "rediss-stream+sentinel://:pw@s1,s2:26380/main/a%2Fb?group=g&db=4&sentinel_password=w&ca=/c.pem");
  REQUIRE(behind.server.sentinels.size() == 2);
  CHECK(behind.server.sentinels[0].port == "26379");
  CHECK(behind.server.sentinels[1].host == "s2");
  CHECK(behind.server.sentinel_master == "main");
  CHECK(behind.server.sentinel_password == "w");
  CHECK(behind.server.password == "pw");
  CHECK(behind.server.database == 4);
  CHECK(behind.server.tls);
  CHECK(behind.server.tls_ca_file == "/c.pem");
  CHECK(behind.other_seeds.empty());
  CHECK(behind.stream == "a/b");
  CHECK(behind.address() == "rediss-stream+sentinel://s1:26379,s2:26380/main/a%2Fb?group=g&db=4");
  CHECK(stream_source::from_url(behind.address() + "&sentinel_password=w").address() == behind.address());
  CHECK(refusal("redis-stream://h/s?group=g&db=0%26verify%3Dnone").find("parameter db '0&verify=none' is not") !=
        std::string::npos);
  CHECK(refusal("redis-stream+sentinel://s1/main?group=g").find("must name the primary and the stream") !=
        std::string::npos);
  CHECK(refusal("redis-stream://h/s?group=g&sentinel_user=x").find("unknown parameter 'sentinel_user'") !=
        std::string::npos);
  CHECK(refusal("redis-stream+sentinel://s1/m/s?group=g&sentinel_user=x").find("sentinel_user 'x' has no") !=
        std::string::npos);
  CHECK(refusal("redis-stream+sentinel:///m/s?group=g").find("not a URL") != std::string::npos);
}

TEST_CASE("jobrt bridge: a second SIGTERM ends it at once while a store waits for its queue's server") {
  redis_server streams;
  redis_server queue;
  bridges running(fmt::format("redis://127.0.0.1:{}", streams.port()),
                  fmt::format("redis://127.0.0.1:{}", queue.port()));
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis::connection c(ctx.get_executor(), streams.config());
    c.start();
    auto pending = [&]() -> awaitable<std::int64_t> {
      auto p = co_await redis::exec(c, redis::request("XPENDING", "in", "jobrt"));
      co_return p.as_array().at(0).as_integer();
    };
    co_await redis::exec(c, redis::request("XGROUP", "CREATE", "in", "jobrt", "0", "MKSTREAM"));
    running.start("b0");
    co_await add(c, "in", "type", "t", "payload", "{}");  // stored and acknowledged: the bridge is up
    REQUIRE(co_await eventually(
        [&]() -> awaitable<bool> {
          auto read = co_await redis::exec(c, redis::request("XINFO", "GROUPS", "in"));
          if (field_of(read.as_array().at(0), "last-delivered-id") == "0-0") co_return false;
          co_return co_await pending() == 0 && running.catching();
        },
        10s));
    queue.stop();  // (the next store waits for it)
    co_await add(c, "in", "type", "t", "payload", "{}");
    REQUIRE(co_await eventually([&]() -> awaitable<bool> { co_return co_await pending() == 1; }, 10s));
    auto began = std::chrono::steady_clock::now();
    running.signal("b0", SIGTERM);
    asio::steady_timer t(ctx, 500ms);  // (the first one handled: its store has 5 s)
    co_await t.async_wait(asio::use_awaitable);
    running.signal("b0", SIGTERM);
    CHECK(running.wait("b0") == -SIGTERM);
    CHECK(std::chrono::steady_clock::now() - began < 3s);
    CHECK(co_await pending() == 1);  // read, not acknowledged: for the next bridge
  });
}

TEST_CASE("bridge: 50,000 entries over 1,000 groups, two bridges killed again and again: each one job, in order") {
  redis_server server;
  auto url = fmt::format("redis://127.0.0.1:{}", server.port());
  bridges running(url);
  constexpr int total = 50'000, groups = 1'000;
  job_runs ran(total);
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        redis::connection c(ctx.get_executor(), server.config());
        c.start();
        redis_backend store(ctx.get_executor(), server.config());
        worker_options o;
        o.queue = "bridged";
        o.concurrency = 32;
        worker w(ctx.get_executor(), store, o);
        w.add_handler("t", ran.handler());
        w.start();
        // The group made here (the bridges find it there: BUSYGROUP), so XPENDING has it at once.
        co_await redis::exec(c, redis::request("XGROUP", "CREATE", "in", "jobrt", "0", "MKSTREAM"));
        running.start("b0");
        running.start("b1");
        // 10 rounds: 5,000 entries published at once; once the bridge consuming them has read
        // some and not yet acknowledged them, both bridges are killed and started again.
        auto pending_count = [&]() -> awaitable<std::int64_t> {
          auto pending = co_await redis::exec(c, redis::request("XPENDING", "in", "jobrt"));
          co_return pending.as_array().at(0).as_integer();
        };
        int left_pending = 0;
        for (int round = 0; round < 10; ++round) {
          for (int first = round * 5'000; first < (round + 1) * 5'000; first += 500) {
            redis::request req;
            for (int n = first; n < first + 500; ++n)
              req.push("XADD", "in", "*", "type", "t", "group", fmt::format("g{}", n % groups), "payload",
                       fmt::format("{{\"n\":{}}}", n));
            co_await redis::exec(c, std::move(req));
          }
          co_await eventually([&]() -> awaitable<bool> { co_return co_await pending_count() > 0; }, 5s);
          if (round == 5) {  // SIGTERM instead: each stores and acknowledges what it read, and exits 0
            REQUIRE(co_await eventually([&] { return running.catching(); }, 10s));
            CHECK(running.terminate("b0") == 0);
            CHECK(running.terminate("b1") == 0);
          } else if (round % 2 == 1) {  // one: when it was the one consuming, the other takes over
            running.kill("b0");
          } else {
            running.kill("b0");
            running.kill("b1");
          }
          if (co_await pending_count() > 0) ++left_pending;
          running.start("b0");
          if (round % 2 == 0) running.start("b1");
        }
        MESSAGE(left_pending << " of 10 stops left entries read and not acknowledged");
        CHECK(left_pending >= 3);
        REQUIRE_MESSAGE(co_await eventually([&] { return ran.distinct == total; }, 30s),
                        ran.distinct << " of " << total);
        // Nothing pending at the stream, nothing left in the queue.
        REQUIRE(co_await eventually(
            [&]() -> awaitable<bool> {
              auto pending = co_await redis::exec(c, redis::request("XPENDING", "in", "jobrt"));
              co_return pending.as_array().at(0).as_integer() == 0;
            },
            10s));
        REQUIRE(co_await eventually([&] { return running.catching(); }, 10s));
        auto statuses = running.stop();
        for (auto s : statuses) CHECK(s == 0);  // SIGTERM: a clean exit
        co_await w.stop(std::chrono::seconds(5));
        auto counts = co_await store.counts("bridged");
        CHECK(counts.ready_lanes == 0);
        CHECK(counts.groups == 0);
      },
      120s);
  CHECK(ran.doubled() == 0);
  CHECK(ran.inversions == 0);
  CHECK(ran.distinct == total);
}
