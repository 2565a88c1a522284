// jobrt_lock_process: lock users in a process of their own, for tests/integration/lock_test.cpp.
//
//   jobrt_lock_process contend REDIS_URL PREFIX LOCKS COROUTINES ITERATIONS LOG_FILE
//     COROUTINES coroutines each take ITERATIONS times one of LOCKS locks <PREFIX>lock:<i> (the
//     next one each time) and, while holding it, read the counter <PREFIX>counter:<i>, yield,
//     and write it back plus one. One line per hold:
//       <lock index> <fence> <held since ns> <held until ns>     (steady_clock: CLOCK_MONOTONIC)
//     "held since" is taken after lock() returned, "held until" before unlock() is sent, so the
//     real holds contain the logged ones. Exit 0 when done, 1 on a failure.
//   jobrt_lock_process hold REDIS_URL NAME TTL_MS READY_FILE
//     Takes the lock NAME (watchdog on), writes "<fence>\n" to READY_FILE and holds it until killed.
//
// Both die with their parent (PR_SET_PDEATHSIG). Exit 2 on bad arguments.
#include <jobrt/mutex.hpp>
#include <jobrt/redis/connection.hpp>

#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;

namespace {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int positive(const char* text, const char* name) {
  std::size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || text[used] != '\0' || value <= 0)
    throw std::invalid_argument(fmt::format("{} must be a positive number, not '{}'", name, text));
  return value;
}

struct hold_record {
  int lock;
  std::int64_t fence, since, until;
};

awaitable<void> contender(jobrt::redis_lock_service& locks, jobrt::redis::connection& conn, std::string prefix,
                          int lock_count, int first, int iterations, std::vector<hold_record>& out) {
  auto ex = co_await asio::this_coro::executor;
  jobrt::lock_options o;
  o.ttl = std::chrono::milliseconds(2000);
  o.wait = std::chrono::milliseconds(60000);
  for (int i = 0; i < iterations; ++i) {
    int l = (first + i) % lock_count;
    auto lease = co_await locks.lock(fmt::format("{}lock:{}", prefix, l), o);
    auto since = now_ns();
    auto counter = fmt::format("{}counter:{}", prefix, l);
    auto r = co_await jobrt::redis::exec(conn, jobrt::redis::request("GET", counter));
    std::int64_t v = r.is_nil() ? 0 : std::stoll(r.as_string());
    if (i % 2 == 0) {
      asio::steady_timer t(ex);
      t.expires_after(std::chrono::milliseconds(1));
      co_await t.async_wait(use_awaitable);
    } else {
      co_await asio::post(ex, use_awaitable);
    }
    co_await jobrt::redis::exec(conn, jobrt::redis::request("SET", counter, v + 1));
    auto until = now_ns();
    if (lease.lost()) throw std::runtime_error("lease lost while holding");
    out.push_back({l, lease.fence(), since, until});
    if (!co_await lease.unlock()) throw std::runtime_error("unlock found the lock lost");
  }
}

awaitable<void> contend(std::string url, std::string prefix, int locks_n, int coroutines, int iterations,
                        std::string log_path) {
  auto ex = co_await asio::this_coro::executor;
  auto cfg = jobrt::redis::config::from_url(url);
  jobrt::redis_lock_service locks(ex, cfg);
  jobrt::redis::connection conn(ex, cfg);
  conn.start();
  std::vector<hold_record> records;
  int remaining = coroutines;
  std::exception_ptr failure;
  asio::steady_timer done(ex, std::chrono::steady_clock::time_point::max());
  for (int c = 0; c < coroutines; ++c) {
    asio::co_spawn(ex, contender(locks, conn, prefix, locks_n, c, iterations, records), [&](std::exception_ptr e) {
      if (e && !failure) failure = e;
      if (--remaining == 0) done.cancel();
    });
  }
  boost::system::error_code ec;
  co_await done.async_wait(asio::redirect_error(use_awaitable, ec));
  conn.close();
  if (failure) std::rethrow_exception(failure);
  std::FILE* f = std::fopen(log_path.c_str(), "w");
  if (f == nullptr) throw std::runtime_error("cannot write " + log_path);
  for (auto& r : records) fmt::print(f, "{} {} {} {}\n", r.lock, r.fence, r.since, r.until);
  if (std::fclose(f) != 0) throw std::runtime_error("writing " + log_path + " failed");
}

awaitable<void> hold(std::string url, std::string name, int ttl_ms, std::string ready_path) {
  auto ex = co_await asio::this_coro::executor;
  jobrt::redis_lock_service locks(ex, jobrt::redis::config::from_url(url));
  jobrt::lock_options o;
  o.ttl = std::chrono::milliseconds(ttl_ms);
  auto lease = co_await locks.lock(name, o);
  std::FILE* f = std::fopen(ready_path.c_str(), "w");
  if (f == nullptr) throw std::runtime_error("cannot write " + ready_path);
  fmt::print(f, "{}\n", lease.fence());
  std::fclose(f);
  asio::steady_timer forever(ex, std::chrono::steady_clock::time_point::max());
  boost::system::error_code ec;
  co_await forever.async_wait(asio::redirect_error(use_awaitable, ec));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  asio::io_context ctx(1);
  try {
    if (a.size() == 7 && a[0] == "contend") {
      asio::co_spawn(ctx,
                     contend(a[1], a[2], positive(argv[4], "LOCKS"), positive(argv[5], "COROUTINES"),
                             positive(argv[6], "ITERATIONS"), a[6]),
                     [&](std::exception_ptr e) {
                       if (e) std::rethrow_exception(e);
                       ctx.stop();
                     });
    } else if (a.size() == 5 && a[0] == "hold") {
      asio::co_spawn(ctx, hold(a[1], a[2], positive(argv[4], "TTL_MS"), a[4]), [&](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
        ctx.stop();
      });
    } else {
      throw std::invalid_argument(
          "expected: contend URL PREFIX LOCKS COROUTINES ITERATIONS LOG | hold URL NAME TTL_MS READY");
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "jobrt_lock_process: {}\n", e.what());
    return 2;
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() == 1) return 1;
  try {
    ctx.run();
  } catch (const std::exception& e) {
    fmt::print(stderr, "jobrt_lock_process: {}\n", e.what());
    return 1;
  }
  return 0;
}
