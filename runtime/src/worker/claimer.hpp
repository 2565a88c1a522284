// The worker's claimer: leases jobs for the worker's free slots. Before its first claim it
// expires the leases of an earlier run under the worker's id and sends the first heartbeat; then
// each claim waits inside the backend until work is ready (backend::claim_wait: BLMOVE on Redis),
// and a failed one is asked again after a backoff that doubles; one the queue's rate limit holds
// back is asked again when the limit lets a job start (a timer). One loop on the worker's strand,
// with timers and a stop signal of its own. The slots are the worker's: the claimer asks how many
// are free and hands each leased job back through claimer_hooks, called on that strand.
#pragma once

#include <jobrt/backend.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace jobrt::detail {

struct claimer_options {
  std::string queue;
  std::string worker;           // the id the leases are taken under (and the heartbeat recorded for)
  std::size_t concurrency = 1;  // the worker's slots
  std::size_t burst = 1;        // a grouped job and its followers under one lease (claim_options::ahead + 1)
  std::chrono::milliseconds lease_ttl{5000};   // of each lease; also the bound of the calls before the first claim
  std::chrono::milliseconds claim_wait{5000};  // how long a claim waits in the backend for work
  std::optional<rate_limit> rate;              // the queue's (claim_options::rate)
};

// Each is called on the strand, from the loop; an empty one is not called.
struct claimer_hooks {
  // The worker's slots free now.
  std::function<std::size_t()> free_slots;
  // A claim leased this job: the worker starts it, or hands it back if it is stopping.
  std::function<void(claimed_job)> claimed;
  // That many (more than 0) leases of this worker's earlier run were expired: the reaper may send
  // their jobs back at once.
  std::function<void(std::int64_t)> expired;
  // A claim went out (true; it waits in the backend, up to claim_wait, while no work is ready),
  // or came back (false).
  std::function<void(bool)> claiming;
};

class claimer : public std::enable_shared_from_this<claimer> {
 public:
  // `strand` is where the loop runs, and where every member below is called. `source` names the
  // worker in the log. The backend must outlive the loop (stop() completed).
  claimer(boost::asio::any_io_executor strand, backend& b, claimer_options opts, std::string source,
          claimer_hooks hooks);
  claimer(const claimer&) = delete;
  claimer& operator=(const claimer&) = delete;

  // Starts the loop (once; not after a stop). The loop holds `owner` until it ends: the worker,
  // which its hooks point into.
  void start(std::shared_ptr<const void> owner);
  // A slot may have freed: the loop, if it waits for one, looks again.
  void slot_freed();
  // The last claim got fewer jobs than it asked for: no other work was ready then.
  bool drained() const noexcept { return drained_; }
  // Ends the loop: a claim waiting in the backend, and a pause after a failure, are cut short,
  // and no claim starts. Jobs a claim leased just as the stop came still reach `claimed` (the
  // backend's answer wins over the cancellation). Returns at once; stop() waits for it.
  void request_stop();
  // request_stop(), then waits until the loop has ended: after it the claimer neither touches the
  // backend nor calls a hook. Returns even while the backend does not answer.
  boost::asio::awaitable<void> stop();

 private:
  static boost::asio::awaitable<void> claim_loop(std::shared_ptr<claimer> self, std::shared_ptr<const void> owner);
  boost::asio::awaitable<void> before_first_claim();

  boost::asio::any_io_executor strand_;
  backend& backend_;
  claimer_options opts_;
  std::string source_;  // how its log lines name the worker
  claimer_hooks hooks_;
  boost::asio::steady_timer slot_timer_;   // the loop waits here for a free slot
  boost::asio::steady_timer pause_;        // the pause after a failed claim
  boost::asio::cancellation_signal stop_;  // ends a claim (and the calls before the first) on its way
  boost::asio::steady_timer ended_;        // never expires: stop() waits on it for the loop to end
  bool started_ = false;
  bool stopped_ = false;
  bool claiming_ = true;
  bool drained_ = false;
};

}  // namespace jobrt::detail
