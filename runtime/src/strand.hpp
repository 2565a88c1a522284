// The strands jobrt makes for its own objects (connections, workers, groups, lock services).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <cstddef>
#include <exception>
#include <memory>
#include <utility>
#include <vector>

namespace jobrt::detail {

/// A strand on `ex`. On an io_context's executor (the usual case) the strand wraps that
/// executor's own type rather than the type-erased one: an any_io_executor then holds the
/// strand in place, where a strand over an any_io_executor is too big for that and is copied to
/// the heap every time an operation asks it to track work, and the strand asks its executor
/// about blocking directly, where through the type erasure the answer is allocated. Any other
/// executor gets a strand over the type-erased one.
inline boost::asio::any_io_executor make_strand(const boost::asio::any_io_executor& ex) {
  if (const auto* io = ex.target<boost::asio::io_context::executor_type>()) return boost::asio::make_strand(*io);
  return boost::asio::make_strand(ex);
}

/// Runs `work` on `ex` (a strand) and waits for it, as `co_await co_spawn(ex, work,
/// use_awaitable)` would, and passes the caller's cancellation on. co_spawn passes it on itself,
/// but across executors its emit is posted with a pointer into the caller's cancellation slot,
/// which the coroutine's end frees: a coroutine that ends before that post runs leaves the emit
/// reading freed memory (ASan saw it). Here the post owns the signal it emits, which outlives both.
template <class T>
boost::asio::awaitable<T> run_on(boost::asio::any_io_executor ex, boost::asio::awaitable<T> work) {
  auto cut = std::make_shared<boost::asio::cancellation_signal>();
  auto caller = co_await boost::asio::this_coro::cancellation_state;
  if (caller.slot().is_connected())
    caller.slot().assign(
        [cut, ex](boost::asio::cancellation_type type) { boost::asio::post(ex, [cut, type] { cut->emit(type); }); });
  co_return co_await boost::asio::co_spawn(
      std::move(ex), std::move(work), boost::asio::bind_cancellation_slot(cut->slot(), boost::asio::use_awaitable));
}

/// What all_at_once's calls gave, in the order they were made: each one's failure (or none) and
/// its result (a default one where it failed).
template <class T>
struct all_outcomes {
  std::vector<std::exception_ptr> errors;
  std::vector<T> results;
};

/// Runs `make(i)`, an awaitable<T>, for each i below `n`, all at once, and waits for every one.
/// The caller's cancellation reaches them all, and each takes the caller's throw_if_cancelled
/// (one set false to finish through a stop stays so). On a strand of its own over `ex`: a ranged
/// parallel_group reads its operations while it launches them, and on an executor of several
/// threads one that ended at once could free them under it (ASan saw it). Launched from the
/// strand, their ends wait for the launch.
template <class T, class Make>
boost::asio::awaitable<all_outcomes<T>> all_at_once(boost::asio::any_io_executor ex, std::size_t n, Make make) {
  namespace asio = boost::asio;
  all_outcomes<T> out;
  if (n == 0) co_return out;
  bool throws = co_await asio::this_coro::throw_if_cancelled();
  auto one = [&](std::size_t i) -> asio::awaitable<T> {
    co_await asio::this_coro::throw_if_cancelled(throws);
    co_return co_await make(i);
  };
  auto strand = make_strand(ex);
  auto launch = [&]() -> asio::awaitable<void> {
    co_await asio::this_coro::throw_if_cancelled(throws);
    using op = decltype(asio::co_spawn(strand, one(0), asio::deferred));
    std::vector<op> ops;
    ops.reserve(n);
    for (std::size_t i = 0; i < n; ++i) ops.push_back(asio::co_spawn(strand, one(i), asio::deferred));
    auto all = co_await asio::experimental::make_parallel_group(std::move(ops))
                   .async_wait(asio::experimental::wait_for_all(), asio::use_awaitable);
    out.errors = std::move(std::get<1>(all));
    out.results = std::move(std::get<2>(all));
  };
  co_await run_on(strand, launch());
  co_return out;
}

}  // namespace jobrt::detail
