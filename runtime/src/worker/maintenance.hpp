// The worker's maintenance: the reaper (recovers expired leases and dead workers' lanes, trims the
// dead letters, and between reaps says which job types the worker runs and asks about the types
// met without a handler), the promoter (moves delayed jobs when they come due) and the scheduler
// (fires repeatable jobs when they come due). Loops on the worker's strand, with timers and stop signals of their own;
// what the worker learns from them comes back through maintenance_hooks, called on that strand.
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
#include <string>
#include <vector>

namespace jobrt::detail {

struct maintenance_options {
  std::string queue;
  std::chrono::milliseconds lease_ttl{5000};  // the bound of each reaper call
  std::chrono::milliseconds reap_period{1000};
  std::size_t dead_max_count = 10000;
  std::chrono::milliseconds dead_max_age = std::chrono::hours(24 * 30);
  std::chrono::milliseconds promote_backstop{60000};
  bool schedules = true;  // run the scheduler
};

// Each is called on the strand, from one of the loops; an empty one is not called.
struct maintenance_hooks {
  // A reap recovered expired leases or dead workers' lanes (the reaper has logged it).
  std::function<void(const reap_result&)> recovered;
  // The promoter moved this many (more than 0) delayed entries.
  std::function<void(std::int64_t)> promoted;
  // The job types to ask the backend about (met here without a handler), asked at `now`.
  std::function<std::vector<std::string>(std::chrono::steady_clock::time_point now)> unhandled_types;
  // What the backend said of one of them (backend::unrunnable_for), just now.
  std::function<void(const std::string& type, std::chrono::milliseconds none_for)> unrunnable;
  // How the worker describes itself to operators (backend::report_worker), now.
  std::function<worker_report()> report;
};

class maintenance : public std::enable_shared_from_this<maintenance> {
 public:
  // `strand` is where both loops run, and where every member below is called. `source` names the
  // worker in the log. The backend must outlive the loops (stop() completed).
  maintenance(boost::asio::any_io_executor strand, backend& b, maintenance_options opts, std::string source,
              maintenance_hooks hooks);
  maintenance(const maintenance&) = delete;
  maintenance& operator=(const maintenance&) = delete;

  // Starts both loops (once; not after a stop). The reaper advertises `handled_types` (none:
  // nothing is advertised).
  void start(std::vector<std::string> handled_types);
  // The reaper reaps again as soon as it can, even if it is in a call now (leases were made
  // reapable: backend::expire_own).
  void reap_now();
  // Ends both loops: their waits and the calls they have on their way are cut short, and they
  // start no other call. Returns at once; stop() waits for them.
  void request_stop();
  // request_stop(), then waits until both loops have ended: after it neither touches the backend.
  // Their calls are bounded, so it returns even while the backend does not answer.
  boost::asio::awaitable<void> stop();

 private:
  static boost::asio::awaitable<void> reap_loop(std::shared_ptr<maintenance> self);
  boost::asio::awaitable<void> about_types();
  boost::asio::awaitable<void> for_operators();
  static boost::asio::awaitable<void> promote_loop(std::shared_ptr<maintenance> self);
  static boost::asio::awaitable<void> schedule_loop(std::shared_ptr<maintenance> self);

  boost::asio::any_io_executor strand_;
  backend& backend_;
  maintenance_options opts_;
  std::string source_;  // how its log lines name the worker
  maintenance_hooks hooks_;
  std::vector<std::string> handled_types_;
  std::chrono::steady_clock::time_point advertised_{};  // when the worker last said which types it runs
  std::chrono::steady_clock::time_point reported_{};    // when it last reported itself
  std::size_t reported_sig_ = 0;                        // what it ran then (a hash of the jobs' ids)
  std::int64_t history_minute_ = 0;                     // the last minute it looked at the history in
  boost::asio::steady_timer reap_timer_;
  boost::asio::cancellation_signal reap_stop_;      // ends a reap on its way
  boost::asio::steady_timer retry_timer_;           // the promoter's pause after a failure
  boost::asio::cancellation_signal promote_stop_;   // ends the promoter's wait
  boost::asio::steady_timer schedule_retry_timer_;  // the scheduler's pause after a failure
  boost::asio::cancellation_signal schedule_stop_;  // ends the scheduler's wait
  boost::asio::steady_timer ended_;                 // never expires: stop() waits on it for the loops to end
  bool started_ = false;
  bool stopped_ = false;
  bool reaping_ = true;
  bool promoting_ = true;
  bool scheduling_ = false;
  bool reap_now_ = false;  // expire_own made leases reapable: reap again at once
};

}  // namespace jobrt::detail
