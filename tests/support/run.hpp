// Test support: run a coroutine on an io_context with a time bound.
#pragma once

#include <doctest/doctest.h>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <exception>
#include <functional>

namespace jobrt::test {

using namespace std::chrono_literals;

/// Runs the coroutine made by make(ctx) until it finishes; fails the test if it takes longer
/// than limit, rethrows what it throws.
template <class MakeCoroutine>
void run(MakeCoroutine make, std::chrono::milliseconds limit = 20s) {
  boost::asio::io_context ctx;
  bool done = false;
  std::exception_ptr failure;
  boost::asio::co_spawn(ctx, make(ctx), [&](std::exception_ptr e) {
    done = true;
    failure = e;
    ctx.stop();
  });
  ctx.run_for(limit);
  REQUIRE_MESSAGE(done, "test coroutine did not finish within " << limit.count() << " ms");
  if (failure) std::rethrow_exception(failure);
}

/// Waits d on the calling coroutine's executor (tests only: the runtime never sleeps).
inline boost::asio::awaitable<void> sleep_for(std::chrono::milliseconds d) {
  boost::asio::steady_timer t(co_await boost::asio::this_coro::executor);
  t.expires_after(d);
  co_await t.async_wait(boost::asio::use_awaitable);
}

}  // namespace jobrt::test
