// The distributed lock under contention, against the usual hand-made lock, on one server.
//
//   jobrt_bench_lock URL rtt N
//     N PINGs one after another on the shared connection: the bare round trip, p50/p99.
//   jobrt_bench_lock URL KIND LOCKS WAITERS SECONDS [SERVICES=1] [per-lock|total]
//     KIND: jobrt (lock_order::any), jobrt-fifo, or sleep-retry (SET NX PX, on failure sleep 100 ms
//     and retry; release by compare-and-delete: the usual hand-made lock, done right otherwise).
//     Rounds: for each of LOCKS locks, WAITERS coroutines ask for it at once (with `total`:
//     WAITERS coroutines in all, each asking for one of the LOCKS locks at random), each takes it once,
//     holds it for nothing and releases it. A new round starts when every coroutine is done;
//     rounds go on for SECONDS (a round under way is finished, except for sleep-retry, where
//     coroutines stop trying at SECONDS and only completed pairs count). SECONDS written as <N>r
//     runs exactly N rounds instead: a fixed amount of work, for counting instructions with
//     valgrind --tool=callgrind (not for sleep-retry). Every coroutine asks
//     once per round, so nobody can retake the lock it just released: each pair is a hand-off.
//     Hand-off latency: from the moment the holder calls unlock() to the moment the next
//     holder's lock() returns, both in this process (steady_clock), for every acquisition that
//     had a predecessor in its round. SERVICES: the waiters are spread over that many lock
//     services (each with its own connection and subscriber, as separate processes would have),
//     so hand-offs cross services as they would cross processes.
// Output: one line of key=value pairs.
#include <jobrt/mutex.hpp>
#include <jobrt/redis/connection.hpp>
#include <jobrt/redis/script.hpp>

#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace asio = boost::asio;
using namespace jobrt;
using asio::awaitable;
using asio::use_awaitable;
using clock_type = std::chrono::steady_clock;

namespace {

double percentile_us(std::vector<clock_type::duration> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  auto i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1));
  return std::chrono::duration<double, std::micro>(v[i]).count();
}

awaitable<void> rtt(redis::config cfg, long n) {
  auto ex = co_await asio::this_coro::executor;
  redis::connection conn(ex, cfg);
  conn.start();
  co_await redis::exec(conn, redis::request("PING"));
  std::vector<clock_type::duration> samples;
  for (long i = 0; i < n; ++i) {
    auto t0 = clock_type::now();
    co_await redis::exec(conn, redis::request("PING"));
    samples.push_back(clock_type::now() - t0);
  }
  conn.close();
  fmt::print("mode=rtt n={} p50_us={:.1f} p99_us={:.1f}\n", n, percentile_us(samples, 0.5),
             percentile_us(samples, 0.99));
}

// The hand-made lock: what teams write by hand, with the retry sleep of the usual versions.
class sleep_retry_lock {
 public:
  explicit sleep_retry_lock(redis::connection& c)
      : conn_(c),
        release_("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0") {}

  /// Takes the lock or gives up at `stop`; false when it gave up.
  awaitable<bool> lock(const std::string& key, const std::string& token, clock_type::time_point stop) {
    asio::steady_timer t(co_await asio::this_coro::executor);
    for (;;) {
      auto r = co_await redis::exec(conn_, redis::request("SET", key, token, "NX", "PX", 10000));
      if (!r.is_nil()) co_return true;
      if (clock_type::now() >= stop) co_return false;
      t.expires_after(std::chrono::milliseconds(100));
      co_await t.async_wait(use_awaitable);
    }
  }
  awaitable<void> unlock(const std::string& key, const std::string& token) {
    std::vector<std::string> keys{key}, args{token};
    co_await release_.run(conn_, keys, args);
  }

 private:
  redis::connection& conn_;
  redis::script release_;
};

struct lock_slot {
  std::optional<clock_type::time_point> released;  // when the last holder called unlock()
};

// fixed_rounds > 0: exactly that many rounds, whatever the time.
awaitable<void> contend(redis::config cfg, std::string kind, int locks, int waiters, double seconds, long fixed_rounds,
                        int service_count, bool total) {
  auto ex = co_await asio::this_coro::executor;
  redis::connection conn(ex, cfg);
  conn.start();
  co_await redis::exec(conn, redis::request("FLUSHALL"));
  std::vector<std::unique_ptr<redis_lock_service>> services;
  for (int i = 0; i < service_count; ++i) services.push_back(std::make_unique<redis_lock_service>(ex, cfg));
  std::mt19937 random(42);
  sleep_retry_lock hand_made(conn);
  lock_options o;
  o.ttl = std::chrono::seconds(10);
  o.wait = std::chrono::seconds(600);
  o.order = kind == "jobrt-fifo" ? lock_order::fifo : lock_order::any;
  // Warm up: the scripts loaded, the subscriber subscribed.
  for (auto& s : services)
    for (int i = 0; i < 3; ++i) co_await (co_await s->lock("warm-up", o)).unlock();

  std::vector<clock_type::duration> handoffs;
  long pairs = 0;
  auto start = clock_type::now();
  auto stop = start + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
  long rounds = 0;
  std::uint64_t token_seq = 0;
  while (fixed_rounds > 0 ? rounds < fixed_rounds : clock_type::now() < stop) {
    ++rounds;
    std::vector<lock_slot> slots(static_cast<std::size_t>(locks));
    int remaining = total ? waiters : locks * waiters;
    asio::steady_timer done(ex, clock_type::time_point::max());
    for (int n = 0; n < (total ? 1 : locks); ++n) {
      for (int w = 0; w < waiters; ++w) {
        int l = total ? static_cast<int>(random() % static_cast<unsigned>(locks)) : n;
        auto& service = *services[static_cast<std::size_t>(w % service_count)];
        auto name = fmt::format("bench:{}", l);
        auto token = fmt::format("t{}", ++token_seq);
        auto& slot = slots[static_cast<std::size_t>(l)];
        asio::co_spawn(
            ex,
            [&, name, token, &service = service]() -> awaitable<void> {
              if (kind == "sleep-retry") {
                auto key = "jobrt:lock:{" + name + "}";
                if (co_await hand_made.lock(key, token, stop)) {
                  auto now = clock_type::now();
                  if (slot.released) handoffs.push_back(now - *slot.released);
                  slot.released = clock_type::now();
                  co_await hand_made.unlock(key, token);
                  ++pairs;
                }
              } else {
                auto lease = co_await service.lock(name, o);
                auto now = clock_type::now();
                if (slot.released) handoffs.push_back(now - *slot.released);
                slot.released = clock_type::now();
                co_await lease.unlock();
                ++pairs;
              }
            },
            [&](std::exception_ptr e) {
              if (e) std::rethrow_exception(e);
              if (--remaining == 0) done.cancel();
            });
      }
    }
    boost::system::error_code ec;
    co_await done.async_wait(asio::redirect_error(use_awaitable, ec));
  }
  auto elapsed = std::chrono::duration<double>(clock_type::now() - start).count();
  for (auto& s : services) s->close();
  conn.close();
  fmt::print(
      "mode={} locks={} waiters={}{} services={} rounds={} pairs={} seconds={:.2f} pairs_per_sec={:.0f} "
      "handoff_p50_us={:.1f} handoff_p99_us={:.1f}\n",
      kind, locks, waiters, total ? "_total" : "_per_lock", service_count, rounds, pairs, elapsed,
      static_cast<double>(pairs) / elapsed, percentile_us(handoffs, 0.5), percentile_us(handoffs, 0.99));
}

int usage() {
  fmt::print(stderr,
             "usage: jobrt_bench_lock URL rtt N\n"
             "       jobrt_bench_lock URL jobrt|jobrt-fifo|sleep-retry LOCKS WAITERS SECONDS|<N>r [SERVICES=1] "
             "[per-lock|total]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) return usage();
  std::vector<std::string> a(argv + 1, argv + argc);
  asio::io_context ctx(1);
  try {
    auto cfg = redis::config::from_url(a[0]);
    if (a[1] == "rtt" && a.size() == 3) {
      asio::co_spawn(ctx, rtt(cfg, std::stol(a[2])), [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
    } else if ((a[1] == "jobrt" || a[1] == "jobrt-fifo" || a[1] == "sleep-retry") && a.size() >= 5 && a.size() <= 7) {
      int service_count = a.size() >= 6 ? std::stoi(a[5]) : 1;
      bool total = a.size() == 7 && a[6] == "total";
      if (service_count < 1 || (a.size() == 7 && !total && a[6] != "per-lock")) return usage();
      long fixed_rounds = a[4].ends_with('r') ? std::stol(a[4]) : 0;
      if (a[4].ends_with('r') && (fixed_rounds < 1 || a[1] == "sleep-retry")) return usage();
      double seconds = fixed_rounds > 0 ? 1e9 : std::stod(a[4]);
      asio::co_spawn(ctx,
                     contend(cfg, a[1], std::stoi(a[2]), std::stoi(a[3]), seconds, fixed_rounds, service_count, total),
                     [](std::exception_ptr e) {
                       if (e) std::rethrow_exception(e);
                     });
    } else {
      return usage();
    }
    ctx.run();
  } catch (const std::exception& e) {
    fmt::print(stderr, "jobrt_bench_lock: {}\n", e.what());
    return 1;
  }
  return 0;
}
