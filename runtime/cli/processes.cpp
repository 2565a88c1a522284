// The worker processes of `jobrt demo --redis` (processes.hpp).
#include "processes.hpp"

#include <fmt/format.h>
#include <boost/asio/use_awaitable.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

extern char** environ;

namespace jobrt::cli {

namespace asio = boost::asio;

worker_processes::worker_processes(asio::any_io_executor ex) : sigchld_(ex, SIGCHLD) {}

worker_processes::~worker_processes() { kill_all(); }

void worker_processes::spawn(const args& a) {
  args argv_text{"jobrt"};
  argv_text.insert(argv_text.end(), a.begin(), a.end());
  std::vector<char*> argv;
  for (auto& s : argv_text) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (int rc = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ); rc != 0)
    throw std::runtime_error(fmt::format("cannot start a worker process: {}", std::strerror(rc)));
  children_.push_back({pid});
}

void worker_processes::terminate() {
  for (auto& c : children_)
    if (c.running) ::kill(c.pid, SIGTERM);
}

void worker_processes::kill_all() {
  for (auto& c : children_) {
    if (!c.running) continue;
    ::kill(c.pid, SIGKILL);
    ::waitpid(c.pid, &c.status, 0);
    c.running = false;
  }
}

asio::awaitable<std::string> worker_processes::wait_exit() {
  for (;;) {
    reap();
    for (auto& c : children_) {
      if (c.running || c.reported) continue;
      c.reported = true;
      co_return fmt::format("worker process {} ended early ({})", c.pid, describe(c));
    }
    co_await sigchld_.async_wait(asio::use_awaitable);
  }
}

asio::awaitable<void> worker_processes::wait_all() {
  for (;;) {
    reap();
    if (std::none_of(children_.begin(), children_.end(), [](const child& c) { return c.running; })) co_return;
    co_await sigchld_.async_wait(asio::use_awaitable);
  }
}

std::vector<std::string> worker_processes::failures() const {
  std::vector<std::string> out;
  for (auto& c : children_)
    if (c.running || !WIFEXITED(c.status) || WEXITSTATUS(c.status) != 0)
      out.push_back(fmt::format("worker process {}: {}", c.pid, describe(c)));
  return out;
}

void worker_processes::reap() {
  for (auto& c : children_)
    if (c.running && ::waitpid(c.pid, &c.status, WNOHANG) == c.pid) c.running = false;
}

std::string worker_processes::describe(const child& c) {
  if (c.running) return "still running";
  if (WIFEXITED(c.status)) return fmt::format("exit status {}", WEXITSTATUS(c.status));
  if (WIFSIGNALED(c.status)) return fmt::format("killed by signal {}", WTERMSIG(c.status));
  return "ended";
}

}  // namespace jobrt::cli
