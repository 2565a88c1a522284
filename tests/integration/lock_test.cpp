// The distributed lock on a real redis-server: several processes, an operator deleting the key,
// kill -9 of a holder, a server restart, an unreachable server.
#include "support/redis_server.hpp"
#include "support/run.hpp"

#include <jobrt/mutex.hpp>
#include <jobrt/redis/connection.hpp>

#include <fmt/format.h>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>

#ifndef JOBRT_LOCK_PROCESS
#error "JOBRT_LOCK_PROCESS must name the jobrt_lock_process executable (see tests/CMakeLists.txt)"
#endif

extern char** environ;

namespace asio = boost::asio;
using namespace jobrt;
using namespace jobrt::test;
using asio::awaitable;
using asio::use_awaitable;
using boost::system::system_error;

namespace {

std::chrono::milliseconds since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t);
}

// Processes of one test in a throw-away directory; whatever still runs at the end is killed.
class processes {
 public:
  processes() {
    char tmpl[] = "/tmp/jobrt-locks-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
  }
  ~processes() {
    for (auto pid : pids_) kill(pid);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  processes(const processes&) = delete;
  processes& operator=(const processes&) = delete;

  std::string path(std::string_view name) const { return fmt::format("{}/{}", dir_, name); }

  pid_t spawn(std::vector<std::string> args) {
    args.insert(args.begin(), JOBRT_LOCK_PROCESS);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    if (int rc = ::posix_spawn(&pid, JOBRT_LOCK_PROCESS, nullptr, nullptr, argv.data(), environ); rc != 0)
      throw std::runtime_error(fmt::format("cannot start {}: {}", JOBRT_LOCK_PROCESS, std::strerror(rc)));
    pids_.push_back(pid);
    return pid;
  }

  static void kill(pid_t pid) {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
  }

  /// Waits (bounded) for every process to end; their exit codes, -1 for one still running.
  awaitable<std::vector<int>> wait_all(std::chrono::milliseconds limit) {
    std::vector<int> codes(pids_.size(), -1);
    co_await eventually(
        [&] {
          bool running = false;
          for (std::size_t i = 0; i < pids_.size(); ++i) {
            if (pids_[i] <= 0) continue;
            int status = 0;
            if (::waitpid(pids_[i], &status, WNOHANG) == pids_[i]) {
              codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
              pids_[i] = -1;
            } else {
              running = true;
            }
          }
          return !running;
        },
        limit);
    co_return codes;
  }

  /// Waits (bounded) until the file exists and is not empty; its text.
  static awaitable<std::string> file(const std::string& p, std::chrono::milliseconds limit) {
    std::string text;
    auto whole = [&] {
      std::ifstream in(p);
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      return !text.empty() && text.back() == '\n';
    };
    bool written = co_await eventually(whole, limit);  // (not in a ?: GCC 12 mishandles co_await there)
    if (!written) text.clear();
    co_return text;
  }

 private:
  std::string dir_;
  std::vector<pid_t> pids_;
};

std::string url_of(const redis::config& cfg) { return fmt::format("redis://{}:{}", cfg.host, cfg.port); }

lock_options opts(std::chrono::milliseconds ttl, std::chrono::milliseconds wait = std::chrono::seconds(10)) {
  lock_options o;
  o.ttl = ttl;
  o.wait = wait;
  return o;
}

}  // namespace

TEST_CASE("redis lock: 4 processes x 25 coroutines on 10 locks - no lost update and no two holders") {
  run(
      [](asio::io_context&) -> awaitable<void> {
        auto cfg = shared_redis();
        auto prefix = key_prefix();
        constexpr int procs = 4, coroutines = 25, locks = 10, iterations = 20;
        processes p;
        for (int i = 0; i < procs; ++i)
          p.spawn({"contend", url_of(cfg), prefix, std::to_string(locks), std::to_string(coroutines),
                   std::to_string(iterations), p.path(fmt::format("holds-{}", i))});
        auto codes = co_await p.wait_all(std::chrono::seconds(80));
        for (int c : codes) REQUIRE(c == 0);

        struct hold {
          std::int64_t fence, since, until;
          int process;
        };
        std::map<int, std::vector<hold>> by_lock;
        for (int i = 0; i < procs; ++i) {
          std::ifstream in(p.path(fmt::format("holds-{}", i)));
          int l = 0;
          hold h{};
          while (in >> l >> h.fence >> h.since >> h.until) {
            h.process = i;
            by_lock[l].push_back(h);
          }
        }
        std::size_t total = 0;
        for (auto& [l, holds] : by_lock) {
          total += holds.size();
          std::sort(holds.begin(), holds.end(), [](const hold& a, const hold& b) { return a.since < b.since; });
          for (std::size_t i = 1; i < holds.size(); ++i) {
            INFO("lock " << l << " hold " << i);
            CHECK(holds[i - 1].until <= holds[i].since);  // no two holders at once
            CHECK(holds[i - 1].fence < holds[i].fence);   // fences grow in holding order
          }
          auto counter = redis_cli(cfg, {"GET", fmt::format("{}counter:{}", prefix, l)});
          CHECK(counter == fmt::format("${}\r\n{}\r\n", std::to_string(holds.size()).size(), holds.size()));
        }
        CHECK(total == std::size_t(procs * coroutines * iterations));
      },
      std::chrono::seconds(100));
}

TEST_CASE("redis lock: a streak of local hand-offs yields to another service once per mark, for no longer than it") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    auto cfg = shared_redis();
    redis_lock_service locks(ctx.get_executor(), cfg);
    auto name = key_prefix() + "l";
    auto key = "jobrt:lock:{" + name + "}";
    // Two coroutines of one service take turns: each release hands the lock to the other. At the
    // 12th hold (a streak of 8 is behind), two other services are marked: first one whose waiter
    // gives up 5 ms later (its mark must not hide the next one's), then one whose waiter waited
    // long and then left, for 60 s more. At the 40th, that one again, with 80 ms more. After
    // every release the key is read (on a connection: a redis-cli process could take longer to
    // start than the reservation lasts): a reservation is '~<service>'.
    redis::connection admin(ctx.get_executor(), cfg);
    admin.start();
    auto mark = [&](std::string service, std::chrono::milliseconds left) -> awaitable<void> {
      auto time = co_await redis::exec(admin, redis::request("TIME"));  // seconds, microseconds
      auto now =
          std::stoll(time.as_array().at(0).as_string()) * 1000 + std::stoll(time.as_array().at(1).as_string()) / 1000;
      auto value = fmt::format("{}:{}", now, now + left.count());
      co_await redis::exec(admin, redis::request("HSET", key + ":ws", service, value));
      co_await redis::exec(admin, redis::request("PEXPIRE", key + ":ws", 60000));  // outlives the marks
    };
    constexpr int holds_each = 30;
    int holds = 0, done = 0;
    std::vector<std::pair<int, long>> reserved;           // (hold, PTTL of the reservation)
    std::vector<std::chrono::milliseconds> waited_after;  // from such a release to the next hold
    std::optional<std::chrono::steady_clock::time_point> yielded_at;
    int asking = 0;  // coroutines in lock(): it queues them before its first suspension
    auto turns = [&]() -> awaitable<void> {
      for (int i = 0; i < holds_each; ++i) {
        ++asking;
        auto l = co_await locks.lock(name, opts(std::chrono::seconds(5)));
        --asking;
        ++holds;
        if (yielded_at) waited_after.push_back(since(*yielded_at));
        yielded_at.reset();
        if (holds == 12) {
          co_await mark("short-wait", std::chrono::milliseconds(5));
          co_await mark("another-service", std::chrono::seconds(60));
        }
        if (holds == 40) co_await mark("another-service", std::chrono::milliseconds(80));
        co_await sleep_for(std::chrono::milliseconds(holds == 12 ? 10 : 1));
        // Every release but the last has the other coroutine to hand the lock to, however slow
        // the server is to answer its peek: the streak is never cut short.
        co_await eventually([&] { return asking != 0 || done != 0; }, std::chrono::seconds(1));
        int hold = holds;
        CHECK(co_await l.unlock());
        redis::request peek;
        peek.push("GET", key).push("PTTL", key);
        auto read = co_await redis::exec(admin, std::move(peek));
        const auto& value = read.as_array().at(0);
        if (!value.is_nil() && value.as_string() == "~another-service") {
          yielded_at = std::chrono::steady_clock::now();
          reserved.emplace_back(hold, read.as_array().at(1).as_integer());
        }
      }
      ++done;
    };
    asio::co_spawn(ctx, turns(), asio::detached);
    asio::co_spawn(ctx, turns(), asio::detached);
    co_await eventually([&] { return done >= 2; }, std::chrono::milliseconds(10000));
    REQUIRE(done == 2);
    // Once per mark, at the first release after it (the streak was past 8 both times).
    REQUIRE(reserved.size() == 2);
    CHECK(reserved[0].first == 12);
    CHECK(reserved[1].first == 40);
    // For the 100 ms at most, then for what the second waiter had left of its wait.
    CHECK(reserved[0].second > 0);
    CHECK(reserved[0].second <= 100);
    CHECK(reserved[1].second <= 80);
    // The service's own waiters found it taken meanwhile: they took it when it lapsed.
    REQUIRE(waited_after.size() == 2);
    MESSAGE("the next hold came " << waited_after[0].count() << " and " << waited_after[1].count()
                                  << " ms after the reservations");
    CHECK(waited_after[0] >= std::chrono::milliseconds(reserved[0].second) - std::chrono::milliseconds(5));
    // Used up: what marks are left are this service's, whose own releases do not yield to them.
    CHECK(redis_cli(cfg, {"HEXISTS", key + ":ws", "another-service"}) == ":0\r\n");
    CHECK(redis_cli(cfg, {"HEXISTS", key + ":ws", "short-wait"}) == ":0\r\n");  // over: dropped
  });
}

TEST_CASE("redis lock: a service's mark goes with its last release, not left to reserve the lock for nobody") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    auto cfg = shared_redis();
    redis_lock_service locks(ctx.get_executor(), cfg);
    auto name = key_prefix() + "l";
    auto key = "jobrt:lock:{" + name + "}";
    auto first = co_await locks.lock(name, opts(std::chrono::seconds(5)));
    // A second waiter of the same service fails against the first: its service is marked.
    std::optional<lock_lease> second;
    asio::co_spawn(
        ctx, [&]() -> awaitable<void> { second = co_await locks.lock(name, opts(std::chrono::seconds(5))); },
        asio::detached);
    co_await eventually(
        [&] {
          return redis_cli(cfg, {"EXISTS", key + ":ws"}) == ":1\r\n";
        },
        std::chrono::milliseconds(1000));
    REQUIRE(redis_cli(cfg, {"HLEN", key + ":ws"}) == ":1\r\n");
    CHECK(co_await first.unlock());  // handed to the second, in the script
    co_await eventually([&] { return second.has_value(); }, std::chrono::milliseconds(1000));
    REQUIRE(second);
    CHECK(co_await second->unlock());  // nobody of its own left: its mark goes
    CHECK(redis_cli(cfg, {"EXISTS", key + ":ws"}) == ":0\r\n");
    CHECK(redis_cli(cfg, {"EXISTS", key}) == ":0\r\n");
  });
}

TEST_CASE("redis lock: the key deleted by an operator fires the holder's signal within one watchdog period") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    auto cfg = shared_redis();
    redis_lock_service locks(ctx.get_executor(), cfg);
    auto name = key_prefix() + "l";
    auto held = co_await locks.lock(name, opts(std::chrono::milliseconds(600)));
    asio::steady_timer work(ctx, std::chrono::steady_clock::time_point::max());
    std::chrono::steady_clock::time_point fired;
    work.async_wait(asio::bind_cancellation_slot(held.cancellation_slot(), [&](boost::system::error_code ec) {
      if (ec) fired = std::chrono::steady_clock::now();
    }));
    co_await sleep_for(std::chrono::milliseconds(50));
    auto deleted = std::chrono::steady_clock::now();
    CHECK(redis_cli(cfg, {"DEL", "jobrt:lock:{" + name + "}"}) == ":1\r\n");
    co_await eventually([&] { return fired != std::chrono::steady_clock::time_point{}; },
                        std::chrono::milliseconds(500));
    REQUIRE(held.lost());
    auto after = std::chrono::duration_cast<std::chrono::milliseconds>(fired - deleted);
    MESSAGE("signalled " << after.count() << " ms after the DEL (watchdog period 200 ms)");
    CHECK(after <= std::chrono::milliseconds(200 + 50));  // one period, and scheduling slack
    // Someone else takes it; the old holder's unlock leaves it alone.
    auto next = co_await locks.try_lock(name, opts(std::chrono::seconds(5)));
    REQUIRE(next);
    CHECK_FALSE(co_await held.unlock());
    CHECK(redis_cli(cfg, {"EXISTS", "jobrt:lock:{" + name + "}"}) == ":1\r\n");
    CHECK(co_await next.unlock());
  });
}

TEST_CASE("redis lock: a FIFO waiter that learns late that it was handed the lock gets its whole ttl") {
  // The hand-off's reply or message lost (here: made by hand, telling nobody), the waiter learns
  // of it at its backstop, the old holder's expiry. Its lease counts from that attempt, so the
  // key must too; it would otherwise expire about one backstop before the lease thinks.
  run([](asio::io_context& ctx) -> awaitable<void> {
    auto cfg = shared_redis();
    auto name = key_prefix() + "l";
    auto key = "jobrt:lock:{" + name + "}";
    redis_lock_service holder_side(ctx.get_executor(), cfg), waiter_side(ctx.get_executor(), cfg);
    lock_options short_held = opts(std::chrono::milliseconds(1000));
    short_held.order = lock_order::fifo;
    short_held.renewal = lock_renewal::none;
    auto held = co_await holder_side.lock(name, short_held);
    lock_options o = opts(std::chrono::milliseconds(3000));
    o.order = lock_order::fifo;
    o.renewal = lock_renewal::none;
    std::optional<lock_lease> got;
    asio::co_spawn(
        ctx, [&]() -> awaitable<void> { got = co_await waiter_side.lock(name, o); }, asio::detached);
    co_await sleep_for(std::chrono::milliseconds(100));             // queued, its backstop the holder's expiry
    auto head = redis_cli(cfg, {"ZRANGE", key + ":fq", "0", "0"});  // "*1\r\n$<length>\r\n<token>\r\n"
    REQUIRE(head.starts_with("*1\r\n$"));
    auto from = head.find("\r\n", 4) + 2;
    auto token = head.substr(from, head.size() - 2 - from);
    REQUIRE(token.ends_with(":3000"));  // its ticket: ":<wait ms>:<ttl ms>"
    // The release script's hand-off, with no message.
    CHECK(redis_cli(cfg, {"SET", key, token, "PX", "3000"}) == "+OK\r\n");
    redis_cli(cfg, {"ZREM", key + ":fq", token});
    co_await eventually([&] { return got.has_value(); }, std::chrono::milliseconds(3000));
    REQUIRE(got);
    auto pttl = std::stol(redis_cli(cfg, {"PTTL", key}).substr(1));
    MESSAGE("the key's ttl when the waiter took the lock: " << pttl << " ms of 3000");
    CHECK(pttl > 2500);  // about 2000 when not given anew
    CHECK(co_await got->unlock());
    CHECK_FALSE(co_await held.unlock());
  });
}

TEST_CASE("redis lock: a holder killed with kill -9 is replaced after its ttl and not later") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    auto cfg = shared_redis();
    auto name = key_prefix() + "l";
    processes p;
    auto pid = p.spawn({"hold", url_of(cfg), name, "800", p.path("ready")});
    auto fence_text = co_await processes::file(p.path("ready"), std::chrono::seconds(10));
    REQUIRE_FALSE(fence_text.empty());
    redis_lock_service locks(ctx.get_executor(), cfg);
    // It is renewed while the process lives.
    co_await sleep_for(std::chrono::milliseconds(1000));
    CHECK_FALSE(co_await locks.try_lock(name, opts(std::chrono::milliseconds(800))));
    auto killed = std::chrono::steady_clock::now();
    processes::kill(pid);
    auto next = co_await locks.lock(name, opts(std::chrono::milliseconds(800)));
    auto waited = since(killed);
    MESSAGE("taken " << waited.count() << " ms after kill -9 (ttl 800 ms)");
    CHECK(waited <= std::chrono::milliseconds(800 + 150));         // its TTL, and scheduling slack
    CHECK(waited >= std::chrono::milliseconds(800 * 2 / 3 - 50));  // renewed up to ttl/3 before
    CHECK(next.fence() > std::stoll(fence_text));
    CHECK(co_await next.unlock());
  });
}

TEST_CASE("redis lock: redis-server restart while locks are held and waiters wait") {
  run(
      [](asio::io_context& ctx) -> awaitable<void> {
        redis_server server;
        auto cfg = server.config();
        cfg.reconnect_wait_max = std::chrono::milliseconds(100);
        redis_lock_service a(ctx.get_executor(), cfg);
        redis_lock_service b(ctx.get_executor(), cfg);
        auto held = co_await a.lock("stock", opts(std::chrono::milliseconds(900)));
        bool signalled = false;
        asio::steady_timer work(ctx, std::chrono::steady_clock::time_point::max());
        work.async_wait(asio::bind_cancellation_slot(held.cancellation_slot(),
                                                     [&](boost::system::error_code ec) { signalled = bool(ec); }));
        int taken = 0;
        std::vector<std::int64_t> fences;
        for (int w = 0; w < 5; ++w) {
          asio::co_spawn(
              ctx,
              [&]() -> awaitable<void> {
                auto l = co_await b.lock("stock", opts(std::chrono::milliseconds(900), std::chrono::seconds(20)));
                fences.push_back(l.fence());
                co_await sleep_for(std::chrono::milliseconds(5));
                co_await l.unlock();
                ++taken;
              },
              asio::detached);
        }
        co_await sleep_for(std::chrono::milliseconds(200));
        server.stop(true);
        co_await sleep_for(std::chrono::milliseconds(300));
        server.start();  // no persistence: the lock is gone
        co_await eventually([&] { return taken >= 5; }, std::chrono::milliseconds(10000));
        CHECK(taken == 5);
        CHECK(held.lost());
        CHECK(signalled);
        // The fence counter was lost with the data; new fences still exceed the old ones.
        for (auto f : fences) CHECK(f > held.fence());
        CHECK(std::is_sorted(fences.begin(), fences.end()));
        CHECK_FALSE(co_await held.unlock());
      },
      std::chrono::seconds(30));
}

TEST_CASE(
    "redis lock: fences stay above those handed out when the counter comes back older (a snapshot, a lagging "
    "replica)") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    auto cfg = shared_redis();
    redis_lock_service a(ctx.get_executor(), cfg), b(ctx.get_executor(), cfg);
    auto name = key_prefix() + "restored";
    auto fence_key = "jobrt:lock:{" + name + "}:fence";
    auto first = co_await a.lock(name, opts(std::chrono::seconds(5)));
    auto handed_out = first.fence();
    CHECK(co_await first.unlock());
    redis_cli(cfg, {"SET", fence_key, "3"});  // as an older copy of the data has it
    auto fifo = opts(std::chrono::seconds(5), std::chrono::seconds(5));
    fifo.order = lock_order::fifo;
    auto second = co_await a.lock(name, fifo);  // (taken by the acquire)
    CHECK(second.fence() > handed_out);
    handed_out = second.fence();
    // Handed on by the release, to a waiter of another service queued behind it.
    std::optional<lock_lease> third;
    asio::co_spawn(
        ctx, [&]() -> awaitable<void> { third = co_await b.lock(name, fifo); }, asio::detached);
    co_await eventually([&] { return redis_cli(cfg, {"EXISTS", "jobrt:lock:{" + name + "}:fq"}) == ":1\r\n"; });
    redis_cli(cfg, {"SET", fence_key, "3"});
    CHECK(co_await second.unlock());
    CHECK(co_await eventually([&] { return third.has_value(); }));
    if (third) CHECK(third->fence() > handed_out);
  });
}

TEST_CASE("redis lock: an unreachable server fails with a clear error") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    auto cfg = redis::config::from_url("redis://127.0.0.1:1");
    redis_lock_options o;
    o.io_timeout = std::chrono::milliseconds(300);
    redis_lock_service locks(ctx.get_executor(), cfg, o);
    auto t0 = std::chrono::steady_clock::now();
    try {
      co_await locks.lock("x", opts(std::chrono::seconds(1)));
      FAIL("locked on an unreachable server");
    } catch (const system_error& e) {
      MESSAGE(std::string(e.what()));
      CHECK(e.code() == errc::not_connected);
      CHECK(std::string(e.what()).find("lock 'x'") != std::string::npos);
      CHECK(std::string(e.what()).find("127.0.0.1:1") != std::string::npos);
    }
    CHECK(since(t0) < std::chrono::milliseconds(1500));
  });
}

TEST_CASE("redis lock: keys share one hash tag per lock and the fence key outlives the lock") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    auto cfg = shared_redis();
    redis_lock_service locks(ctx.get_executor(), cfg);
    auto name = key_prefix() + "tagged";
    auto held = co_await locks.lock(name, opts(std::chrono::seconds(5)));
    auto key = "jobrt:lock:{" + name + "}";
    CHECK(redis_cli(cfg, {"GET", key}) == fmt::format("${}\r\n{}\r\n", held.token().size(), held.token()));
    CHECK(redis_cli(cfg, {"EXISTS", key + ":fence"}) == ":1\r\n");
    CHECK(co_await held.unlock());
    CHECK(redis_cli(cfg, {"EXISTS", key}) == ":0\r\n");
    CHECK(redis_cli(cfg, {"EXISTS", key + ":fence"}) == ":1\r\n");
  });
}
