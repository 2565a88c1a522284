// The worker processes of `jobrt demo --redis`: a small supervisor of child processes.
#pragma once

#include "cli.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/signal_set.hpp>

#include <sys/types.h>

#include <string>
#include <vector>

namespace jobrt::cli {

// This binary again (/proc/self/exe) with the given arguments, as many times as spawn is called.
// SIGCHLD, through an asio::signal_set, tells when one ends (no polling). Whatever still runs
// when this goes away (the run failed) is killed and reaped.
class worker_processes {
 public:
  // The signal set exists before the first child: no SIGCHLD is missed.
  explicit worker_processes(boost::asio::any_io_executor ex);
  ~worker_processes();
  worker_processes(const worker_processes&) = delete;
  worker_processes& operator=(const worker_processes&) = delete;

  /// Starts one: argv[0] is "jobrt", then `a`.
  void spawn(const args& a);
  /// SIGTERM to those still running: they stop gracefully.
  void terminate();
  /// SIGKILL to those still running, and reaps them.
  void kill_all();
  /// Completes when a worker process ends that was not reported before; says which and how.
  boost::asio::awaitable<std::string> wait_exit();
  /// Completes when every worker process has ended.
  boost::asio::awaitable<void> wait_all();
  /// How those that did not exit 0 ended; empty when all did.
  std::vector<std::string> failures() const;

 private:
  struct child {
    pid_t pid = -1;
    bool running = true;
    bool reported = false;  // by wait_exit
    int status = 0;         // waitpid's, once it ended
  };

  void reap();
  static std::string describe(const child& c);

  boost::asio::signal_set sigchld_;
  std::vector<child> children_;
};

}  // namespace jobrt::cli
