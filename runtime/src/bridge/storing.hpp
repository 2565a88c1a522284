// What the bridges share between reading messages and acknowledging them: sorting a batch into
// jobs and refusals, and storing the jobs until they are stored.
#pragma once

#include <jobrt/bridge.hpp>
#include <jobrt/log.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>
#include <string>
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

/// Stores `jobs` with `to`, each failure logged and tried again after a wait of 100 ms, doubling
/// up to 5 s, that `pause(wait)` takes (awaitable<bool>: false when the bridge stops). Before
/// each try `go_on()` must hold. The results, or nullopt when it gave up.
template <class Pause, class GoOn>
boost::asio::awaitable<std::optional<std::vector<enqueue_result>>> store_jobs(producer& to,
                                                                              std::vector<encoded_job> jobs,
                                                                              Pause pause, GoOn go_on) {
  std::vector<enqueue_result> results;
  for (std::chrono::milliseconds wait(100); !jobs.empty();) {
    if (!go_on()) co_return std::nullopt;
    try {
      results = co_await to.enqueue_encoded(jobs);
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
