// The worker's lease keeper (the watchdog): every period one backend::extend call renews every
// lease the worker holds and records its heartbeat; a lease the backend no longer holds is
// reported lost, and after each round the worker gives up the leases no renewal has reached for
// a whole TTL. One loop on the worker's strand, with a timer and a stop signal of its own. The
// leases themselves (which tokens, each one's local end, what a lost one means for its job) are
// the worker's: the keeper asks for them and reports back through lease_keeper_hooks, called on
// that strand.
#pragma once

#include <jobrt/backend.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace jobrt::detail {

struct lease_keeper_options {
  std::string queue;
  std::string worker;  // the id the leases are held under (and the heartbeat recorded for)
  std::chrono::milliseconds lease_ttl{5000};
  // Between two renewals; also the bound of each renewal call.
  std::chrono::milliseconds period{5000 / 3};
};

// Each is called on the strand, from the loop; an empty one is not called.
struct lease_keeper_hooks {
  // The leases to renew now, each token once, in the order their answers are to be reported.
  std::function<std::vector<std::string>()> tokens;
  // A renewal was answered (called before what it said of each token: held and lost below).
  std::function<void()> answered;
  // The backend still holds the lease under `token`: it lasts at least until `valid_until` (when
  // the renewal was sent, plus the TTL).
  std::function<void(const std::string& token, std::chrono::steady_clock::time_point valid_until)> held;
  // The backend no longer holds the lease under `token`.
  std::function<void(const std::string& token)> lost;
  // After each round, answered or not: the worker gives up the leases whose local end has passed.
  std::function<void()> overdue;
  // The kept jobs (job_spec::keep) the worker runs or holds to run next: after each round, the
  // keeper asks the backend which were cancelled (backend::cancelled) ...
  std::function<std::vector<held_job>()> kept_ids;
  // ... and tells the worker of each.
  std::function<void(const held_job& job)> cancelled;
};

class lease_keeper : public std::enable_shared_from_this<lease_keeper> {
 public:
  // `strand` is where the loop runs, and where every member below is called. `source` names the
  // worker in the log. The backend must outlive the loop (stop() completed).
  lease_keeper(boost::asio::any_io_executor strand, backend& b, lease_keeper_options opts, std::string source,
               lease_keeper_hooks hooks);
  lease_keeper(const lease_keeper&) = delete;
  lease_keeper& operator=(const lease_keeper&) = delete;

  // Starts the loop (once; not after a stop). The first renewal goes out one period from now.
  void start();
  // Ends the loop: its wait and the renewal on its way are cut short, and it starts no other
  // call. Returns at once; stop() waits for it.
  void request_stop();
  // request_stop(), then waits until the loop has ended: after it the keeper neither touches the
  // backend nor calls a hook. Returns even while the backend does not answer.
  boost::asio::awaitable<void> stop();

 private:
  static boost::asio::awaitable<void> renew_loop(std::shared_ptr<lease_keeper> self);

  boost::asio::any_io_executor strand_;
  backend& backend_;
  lease_keeper_options opts_;
  std::string source_;  // how its log lines name the worker
  lease_keeper_hooks hooks_;
  boost::asio::steady_timer timer_;        // the wait between renewals
  boost::asio::cancellation_signal stop_;  // ends a renewal on its way
  boost::asio::steady_timer ended_;        // never expires: stop() waits on it for the loop to end
  bool started_ = false;
  bool stopped_ = false;
  bool renewing_ = true;
};

}  // namespace jobrt::detail
