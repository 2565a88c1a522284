// What the worker's loops share, in worker.cpp and in its parts (worker/maintenance.cpp,
// worker/lease_keeper.cpp): a timer as a condition variable, backend calls bounded in time and
// cut short by a stop, and how a loop that dies is told.
#pragma once

#include <jobrt/log.hpp>

#include <fmt/format.h>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace jobrt::detail {

namespace asio = boost::asio;
using clock = std::chrono::steady_clock;

inline constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

inline std::string what(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
  }
}

// A timer parked at time_point::max() serves as a condition variable with one waiter.
inline asio::awaitable<void> wait_on(asio::steady_timer& t, clock::time_point until = clock::time_point::max()) {
  t.expires_at(until);
  co_await t.async_wait(use_tuple);
}

// A backend call with a time limit: past it the call is cancelled and this throws. For calls
// that must not hold up a loop, or stop(), while the backend is unreachable.
template <class T>
asio::awaitable<T> bounded(asio::any_io_executor ex, asio::awaitable<T> call, clock::duration limit,
                           std::string_view what) {
  asio::steady_timer timer(ex, limit);
  auto [order, error, value, timer_ec] =
      co_await asio::experimental::make_parallel_group(asio::co_spawn(ex, std::move(call), asio::deferred),
                                                       timer.async_wait(asio::deferred))
          .async_wait(asio::experimental::wait_for_one(), asio::use_awaitable);
  (void)timer_ec;
  if (order[0] == 1)
    throw std::runtime_error(fmt::format("{} got no answer within {} ms", what,
                                         std::chrono::duration_cast<std::chrono::milliseconds>(limit).count()));
  if (error) std::rethrow_exception(error);
  co_return std::move(value);
}

inline asio::awaitable<void> bounded(asio::any_io_executor ex, asio::awaitable<void> call, clock::duration limit,
                                     std::string_view what) {
  auto wrapped = [](asio::awaitable<void> c) -> asio::awaitable<bool> {
    co_await std::move(c);
    co_return true;
  };
  co_await bounded(std::move(ex), wrapped(std::move(call)), limit, what);
}

// A call that `stop` ends (it throws then): a loop's call in flight when the worker stops, which
// would otherwise hold stop() up for as long as its bound while the backend does not answer.
template <class T>
asio::awaitable<T> stoppable(asio::cancellation_signal& stop, asio::any_io_executor ex, asio::awaitable<T> call) {
  co_return co_await asio::co_spawn(std::move(ex), std::move(call),
                                    asio::bind_cancellation_slot(stop.slot(), asio::use_awaitable));
}

// The completion of a loop's co_spawn. A loop catches what its backend throws; anything else that
// escapes one is a bug. It is logged (the thread running the io_context may not say it) and
// rethrown from run(): the worker cannot go on without that loop, so whoever runs the io_context
// learns of it.
inline auto rethrow_if_died(std::string source, const char* loop) {
  return [source = std::move(source), loop](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      jobrt::log(log_level::error, source, "{} loop died: {}", loop, x.what());
    } catch (...) {
      jobrt::log(log_level::error, source, "{} loop died", loop);
    }
    std::rethrow_exception(e);
  };
}

}  // namespace jobrt::detail
