// The chaos test's handler plugin, `probe`: records each run's start and end, with its fence and
// process, to <$JOBRT_CHAOS_LOG>/<pid>.log, one line per event written with one write(2) to an
// O_APPEND file, so a kill -9 loses at most the line not yet written. Lines:
//   <S|E|F|C> <job id> <group or -> <seq> <fence> <pid> <attempt> <realtime us>
// S start, E end, F failed on purpose (payload.fail and attempt 1, or payload.die), C cancelled
// (lease lost).
// payload: {"s": seq in its group, "ms": how long it works, "fail": true to fail its first run,
//           "die": true to fail every run (it is meant to end in the dead letters)}
#include <jobrt/plugin.hpp>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>

namespace {

int log_fd() {
  static const int fd = [] {
    const char* dir = std::getenv("JOBRT_CHAOS_LOG");
    if (!dir) throw std::runtime_error("probe: JOBRT_CHAOS_LOG is not set");
    auto path = fmt::format("{}/{}.log", dir, ::getpid());
    int f = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (f < 0) throw std::runtime_error(fmt::format("probe: cannot open {}", path));
    return f;
  }();
  return fd;
}

void record(char kind, const jobrt::job_context& c, std::int64_t seq) {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch());
  auto line = fmt::format("{} {} {} {} {} {} {} {}\n", kind, c.id(), c.group().empty() ? "-" : c.group(), seq,
                          c.fence(), ::getpid(), c.attempt(), us.count());
  if (::write(log_fd(), line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    throw std::runtime_error("probe: cannot write its log");
}

boost::asio::awaitable<void> probe(jobrt::job_context& c) {
  const auto& p = c.payload().as_object();
  auto seq = p.at("s").as_int64();
  record('S', c, seq);
  boost::asio::steady_timer work(co_await boost::asio::this_coro::executor,
                                 std::chrono::milliseconds(p.at("ms").as_int64()));
  auto [ec] = co_await work.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
  if (ec || c.cancelled()) {
    record('C', c, seq);
    throw std::runtime_error("probe: cancelled");
  }
  if (p.contains("die")) {
    record('F', c, seq);
    throw std::runtime_error("probe: fails every run on purpose");
  }
  if (p.contains("fail") && c.attempt() == 1) {
    record('F', c, seq);
    throw std::runtime_error("probe: fails its first run on purpose");
  }
  record('E', c, seq);
}

}  // namespace

JOBRT_PLUGIN(registry) { registry.add("probe", probe); }
