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
#include <thread>
#include <type_traits>

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

/// Waits until `ready()` holds, asking every 5 ms, for at most `limit`; returns its last answer.
/// `ready` returns bool, or awaitable<bool> (a question to a backend or a server). What a test
/// waits for is a condition (a count reached, a client blocked, a file written), never a time.
template <class Ready>
boost::asio::awaitable<bool> eventually(Ready ready, std::chrono::milliseconds limit = 30s) {
  auto ask = [&]() -> boost::asio::awaitable<bool> {
    if constexpr (std::is_same_v<decltype(ready()), boost::asio::awaitable<bool>>)
      co_return co_await ready();
    else
      co_return static_cast<bool>(ready());
  };
  auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    if (co_await ask()) co_return true;
    if (std::chrono::steady_clock::now() > end) co_return false;
    co_await sleep_for(5ms);
  }
}

/// The same for a test body that is not a coroutine (a thread of its own).
template <class Ready>
bool eventually_here(Ready ready, std::chrono::milliseconds limit = 30s) {
  auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    if (ready()) return true;
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(5ms);
  }
}

}  // namespace jobrt::test
