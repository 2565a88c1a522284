// jobrt_test_worker: one jobrt::worker on Redis in a process of its own, for tests that need
// workers in separate processes (tests/integration/processes_test.cpp).
//
//   jobrt_test_worker REDIS_URL QUEUE CONCURRENCY BURST LOG_FILE
//
// Runs handlers of type "step" (payload {"seq": n}; they yield: a 1 ms timer when n % 3 == 0, else
// a post) and appends one line per start and per end to LOG_FILE:
//
//   start|end <group> <seq> <fence> <job id> <steady_clock ns since its epoch>
//
// steady_clock is CLOCK_MONOTONIC on Linux, one clock for every process on the machine, so the
// events of several processes can be merged by time. LOG_FILE is created only once the Redis
// connection answered and the worker started: its existence tells the test the worker is up.
// SIGTERM (or SIGINT) stops the worker gracefully (5 s grace), flushes the log and exits 0; so
// does the end of the parent (PR_SET_PDEATHSIG), so a test killed by its time limit leaves no
// worker behind. Exit 1 on a failure (also when leases were lost or jobs failed), 2 on bad
// arguments.
#include <jobrt/redis_backend.hpp>
#include <jobrt/worker.hpp>

#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;

namespace {

struct options {
  std::string url;
  std::string queue;
  std::size_t concurrency = 0;
  std::size_t burst = 0;
  std::string log_path;
};

std::size_t positive(const char* text, const char* name) {
  std::size_t used = 0;
  unsigned long value = 0;
  try {
    value = std::stoul(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || text[used] != '\0' || value == 0)
    throw std::invalid_argument(fmt::format("{} must be a positive number, not '{}'", name, text));
  return value;
}

// The log: written from the io_context's one thread only.
class event_log {
 public:
  explicit event_log(const std::string& path) : file_(std::fopen(path.c_str(), "w")) {
    if (file_ == nullptr) throw std::runtime_error(fmt::format("cannot create {}", path));
  }
  ~event_log() {
    if (file_ != nullptr) std::fclose(file_);
  }
  event_log(const event_log&) = delete;
  event_log& operator=(const event_log&) = delete;

  void write(const char* what, const jobrt::job_context& c, std::int64_t seq) {
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch());
    fmt::print(file_, "{} {} {} {} {} {}\n", what, c.group(), seq, c.fence(), c.id(), ns.count());
  }

  void close() {
    bool ok = std::fflush(file_) == 0;
    ok = std::fclose(file_) == 0 && ok;
    file_ = nullptr;
    if (!ok) throw std::runtime_error("writing the log failed");
  }

 private:
  std::FILE* file_;
};

awaitable<void> serve(const options& o) {
  auto ex = co_await asio::this_coro::executor;
  asio::signal_set signals(ex, SIGTERM, SIGINT);  // before the log exists: the test signals after
  jobrt::redis_backend store(ex, jobrt::redis::config::from_url(o.url));
  jobrt::redis::request ping("PING");
  ping.options.timeout = std::chrono::seconds(10);
  co_await jobrt::redis::exec(store.connection(), std::move(ping));

  jobrt::worker_options wo;
  wo.queue = o.queue;
  wo.concurrency = o.concurrency;
  wo.burst = o.burst;
  wo.claim_wait = std::chrono::milliseconds(300);
  jobrt::worker w(ex, store, wo);
  std::unique_ptr<event_log> log;
  w.add_handler("step", [&log](jobrt::job_context& c) -> awaitable<void> {
    auto seq = c.payload().at("seq").as_int64();
    log->write("start", c, seq);
    if (seq % 3 == 0) {
      asio::steady_timer t(co_await asio::this_coro::executor);
      t.expires_after(std::chrono::milliseconds(1));
      co_await t.async_wait(use_awaitable);
    } else {
      co_await asio::post(co_await asio::this_coro::executor, use_awaitable);
    }
    log->write("end", c, seq);
  });
  // No handler runs before the log is open: start() only posts, and this thread is the only one.
  w.start();
  log = std::make_unique<event_log>(o.log_path);

  co_await signals.async_wait(use_awaitable);
  co_await w.stop(std::chrono::seconds(5));
  log->close();
  auto c = w.counters();
  if (c.leases_lost != 0 || c.failed != 0)
    throw std::runtime_error(fmt::format("{} leases lost, {} jobs failed", c.leases_lost, c.failed));
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    if (argc != 6) throw std::invalid_argument("expected 5 arguments");
    o.url = argv[1];
    o.queue = argv[2];
    o.concurrency = positive(argv[3], "CONCURRENCY");
    o.burst = positive(argv[4], "BURST");
    o.log_path = argv[5];
    jobrt::redis::config::from_url(o.url);
  } catch (const std::exception& e) {
    fmt::print(stderr, "jobrt_test_worker: {}\nusage: jobrt_test_worker REDIS_URL QUEUE CONCURRENCY BURST LOG_FILE\n",
               e.what());
    return 2;
  }
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() == 1) return 1;  // the parent is gone already
  int status = 1;
  try {
    asio::io_context ctx(1);
    asio::co_spawn(ctx, serve(o), [&](std::exception_ptr e) {
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& ex) {
          fmt::print(stderr, "jobrt_test_worker: {}\n", ex.what());
        }
      } else {
        status = 0;
      }
      ctx.stop();  // the connections are closed by now; anything left is dropped with ctx
    });
    ctx.run();
  } catch (const std::exception& e) {
    fmt::print(stderr, "jobrt_test_worker: {}\n", e.what());
    status = 1;
  }
  return status;
}
