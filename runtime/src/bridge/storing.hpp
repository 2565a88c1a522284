// What the bridges share between reading messages and acknowledging them: sorting a batch into
// jobs and refusals, and storing the jobs until they are stored.
#pragma once

#include <jobrt/bridge.hpp>
#include <jobrt/log.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace jobrt::detail {

/// A batch of messages as jobs (encoded, as the producer stores them), and the ones that cannot
/// be jobs with why (by their index).
struct sorted_batch {
  std::vector<encoded_job> jobs;
  std::vector<std::pair<std::size_t, std::string>> refused;
};

/// Maps each message (map_message) and encodes its job with the producer's options (which
/// checks it).
sorted_batch sort_batch(const std::vector<bridge_message>& batch, const bridge_mapping& how,
                        const producer_options& opts);

/// Waits `d`, or less when `wake` expires (a bridge's stop() sets it at its earliest).
boost::asio::awaitable<void> pause_unless_woken(boost::asio::steady_timer& wake, std::chrono::milliseconds d);

/// Ends `grace` after `wake` expired (a bridge's stop()), counted from then or, when it had
/// expired already, from the call. Cut short by cancellation.
boost::asio::awaitable<void> stopped_for(boost::asio::steady_timer& wake, std::chrono::milliseconds grace);

/// What `work` gave (or threw), or nullopt when the bridge stopped and `grace` passed (from the
/// stop, or from the start of a call made after it) before it ended: then it is cut short. (The awaitable operator ||
/// waits for a side that succeeds: `work` is caught, so that its failure ends the race too.)
template <class T>
boost::asio::awaitable<std::optional<T>> unless_stopped(boost::asio::awaitable<T> work, boost::asio::steady_timer& wake,
                                                        std::chrono::milliseconds grace) {
  using namespace boost::asio::experimental::awaitable_operators;
  auto caught = [](boost::asio::awaitable<T> w) -> boost::asio::awaitable<std::variant<T, std::exception_ptr>> {
    try {
      co_return co_await std::move(w);
    } catch (...) {
      co_return std::current_exception();
    }
  };
  // (The operator flattens the variants: T, the exception, or the stop's monostate.)
  auto done = co_await (caught(std::move(work)) || stopped_for(wake, grace));
  if (auto* failed = std::get_if<std::exception_ptr>(&done)) std::rethrow_exception(*failed);
  if (auto* value = std::get_if<T>(&done)) co_return std::move(*value);
  co_return std::nullopt;
}

/// Stores `jobs` with `to`, each failure logged and tried again after a wait of 100 ms, doubling
/// up to 5 s, that `pause(wait)` takes (awaitable<bool>: false when the bridge stops). Before
/// each try `go_on()` must hold. The results, or nullopt when it gave up. A try has 5 s from the
/// bridge's stop (`wake` expired), or from its start after it, to end; then it is cut short (the queue's
/// server may be out of reach, and a call waits for it to come back): its messages are not
/// acknowledged, and come again as the same jobs.
template <class Pause, class GoOn>
boost::asio::awaitable<std::optional<std::vector<enqueue_result>>> store_jobs(producer& to,
                                                                              std::vector<encoded_job> jobs,
                                                                              boost::asio::steady_timer& wake,
                                                                              Pause pause, GoOn go_on) {
  std::vector<enqueue_result> results;
  for (std::chrono::milliseconds wait(100); !jobs.empty();) {
    if (!go_on()) co_return std::nullopt;
    try {
      auto done = co_await unless_stopped(to.enqueue_encoded(jobs), wake, std::chrono::seconds(5));
      if (!done) co_return std::nullopt;
      results = std::move(*done);
      break;
    } catch (const std::exception& failed) {
      log(log_level::warn, "bridge", "storing {} jobs on queue {}: {}; trying again in {} ms", jobs.size(), to.queue(),
          failed.what(), wait.count());
    }
    if (!co_await pause(wait)) co_return std::nullopt;
    wait = std::min<std::chrono::milliseconds>(wait * 2, std::chrono::seconds(5));
  }
  co_return results;
}

}  // namespace jobrt::detail
