// One multiplexed connection, C coroutines issuing SET until N operations are done.
// Usage: jobrt_bench_connection URL [N=1000000] [C=64]
// Prints: connection C=<c> N=<n> ops_per_sec=<x>
#include <jobrt/redis/connection.hpp>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <cstdlib>
#include <string>

namespace asio = boost::asio;
using namespace jobrt::redis;

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: {} URL [N] [C]\n", argv[0]);
    return 2;
  }
  const long total = argc > 2 ? std::atol(argv[2]) : 1'000'000;
  const int concurrency = argc > 3 ? std::atoi(argv[3]) : 64;
  asio::io_context ctx(1);
  connection conn(ctx.get_executor(), config::from_url(argv[1]));
  conn.start();
  long issued = 0, failed = 0;
  int running = concurrency;
  std::chrono::steady_clock::time_point start;
  auto client = [&](int id) -> asio::awaitable<void> {
    std::string key = fmt::format("bench:conn:{}", id);
    while (issued < total) {
      ++issued;
      auto [ec, r] = co_await conn.async_exec(request("SET", key, "xxx"), asio::as_tuple(asio::use_awaitable));
      if (ec) ++failed;
    }
    if (--running == 0) conn.close();
  };
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        co_await conn.async_exec(request("PING"), asio::use_awaitable);  // connected
        start = std::chrono::steady_clock::now();
        for (int i = 0; i < concurrency; ++i) asio::co_spawn(ctx, client(i), asio::detached);
      },
      asio::detached);
  ctx.run();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("connection C={} N={} ops_per_sec={:.0f} failed={}\n", concurrency, total,
             static_cast<double>(total) / secs, failed);
  return failed == 0 ? 0 : 1;
}
