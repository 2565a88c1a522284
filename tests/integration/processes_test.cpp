// Exclusion and order across processes: 8 workers on one Redis queue, 3 of them separate
// processes (tests/support/test_worker.cpp), 5 in this one; every start and end is logged with
// the job's fencing token and a CLOCK_MONOTONIC time, one clock for all processes, so all events
// can be merged by time and checked as one history.
#include "support/redis_server.hpp"
#include "support/run.hpp"

#include <jobrt/producer.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/worker.hpp>

#include <fmt/format.h>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>

#ifndef JOBRT_TEST_WORKER
#error "JOBRT_TEST_WORKER must name the jobrt_test_worker executable (see tests/CMakeLists.txt)"
#endif

extern char** environ;

namespace asio = boost::asio;
using namespace jobrt;
using namespace jobrt::test;
using asio::awaitable;
using asio::use_awaitable;

namespace {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The URL of the server shared_redis() names, for the worker processes' command line.
std::string shared_redis_url() {
  if (const char* url = std::getenv("JOBRT_TEST_REDIS_URL"); url != nullptr && *url != '\0') return url;
  return shared_redis().address();
}

struct event {
  bool start = false;
  std::string group;
  std::int64_t seq = 0;
  std::int64_t fence = 0;
  std::string id;
  std::int64_t ns = 0;  // steady_clock (CLOCK_MONOTONIC)
  int source = 0;       // 0: this process; 1..: the worker process
};

// Worker processes of one test and their logs, in a throw-away directory. Whatever is still
// running when this goes away (a failed check, an exception) is killed and reaped, so no process
// outlives the test.
class worker_processes {
 public:
  worker_processes() {
    char tmpl[] = "/tmp/jobrt-workers-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
  }
  ~worker_processes() {
    for (auto pid : pids_) {
      if (pid <= 0) continue;
      ::kill(pid, SIGKILL);
      int status = 0;
      ::waitpid(pid, &status, 0);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  worker_processes(const worker_processes&) = delete;
  worker_processes& operator=(const worker_processes&) = delete;

  std::size_t size() const { return pids_.size(); }
  std::string log_path(std::size_t i) const { return fmt::format("{}/worker-{}.log", dir_, i); }

  /// Starts one: jobrt_test_worker URL QUEUE CONCURRENCY BURST LOG.
  void spawn(const std::string& url, const std::string& queue, std::size_t concurrency, std::size_t burst) {
    std::vector<std::string> args{JOBRT_TEST_WORKER,     url, queue, std::to_string(concurrency), std::to_string(burst),
                                  log_path(pids_.size())};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    if (int rc = ::posix_spawn(&pid, JOBRT_TEST_WORKER, nullptr, nullptr, argv.data(), environ); rc != 0)
      throw std::runtime_error(fmt::format("cannot start {}: {}", JOBRT_TEST_WORKER, std::strerror(rc)));
    pids_.push_back(pid);
    status_.push_back(-1);
  }

  /// True when worker i is up: its log exists (it creates it once connected and started).
  bool ready(std::size_t i) const { return std::filesystem::exists(log_path(i)); }

  /// Reaps the workers that ended; the first one that ended, described, or "" when all run.
  std::string ended() {
    std::string what;
    for (std::size_t i = 0; i < pids_.size(); ++i) {
      if (pids_[i] > 0) {
        int status = 0;
        if (::waitpid(pids_[i], &status, WNOHANG) == pids_[i]) {
          pids_[i] = -1;
          status_[i] = status;
        }
      }
      if (pids_[i] <= 0 && what.empty()) what = fmt::format("worker process {} ended: {}", i + 1, describe(i));
    }
    return what;
  }

  void terminate() {
    for (auto pid : pids_)
      if (pid > 0) ::kill(pid, SIGTERM);
  }

  /// Waits (bounded) until every worker has ended; false on timeout.
  awaitable<bool> wait_all(std::chrono::milliseconds limit) {
    co_return co_await eventually(
        [&] {
          ended();
          return std::none_of(pids_.begin(), pids_.end(), [](pid_t p) { return p > 0; });
        },
        limit);
  }

  bool exited_cleanly(std::size_t i) const {
    return pids_[i] <= 0 && WIFEXITED(status_[i]) && WEXITSTATUS(status_[i]) == 0;
  }

  std::string describe(std::size_t i) const {
    if (pids_[i] > 0) return "running";
    if (WIFEXITED(status_[i])) return fmt::format("exit status {}", WEXITSTATUS(status_[i]));
    if (WIFSIGNALED(status_[i])) return fmt::format("killed by signal {}", WTERMSIG(status_[i]));
    return "ended";
  }

 private:
  std::string dir_;
  std::vector<pid_t> pids_;
  std::vector<int> status_;  // waitpid status once reaped
};

// Reads a log of lines "start|end <group> <seq> <fence> <job id> <ns>".
std::vector<event> read_log(const std::string& path, int source) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("cannot read {}", path));
  std::vector<event> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string kind;
    event e;
    e.source = source;
    if (!(fields >> kind >> e.group >> e.seq >> e.fence >> e.id >> e.ns) || (kind != "start" && kind != "end"))
      throw std::runtime_error(fmt::format("{}: bad line '{}'", path, line));
    e.start = kind == "start";
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

TEST_CASE("exclusion and order across processes: 3 of 8 workers in other processes x 200 groups x 50 jobs") {
  constexpr int groups = 200, per_group = 50, total = groups * per_group;
  constexpr std::size_t in_process = 5, processes = 3, concurrency = 16;
  worker_processes children;
  auto started = std::chrono::steady_clock::now();
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        const std::string queue = key_prefix() + "q";
        for (std::size_t p = 0; p < processes; ++p)
          children.spawn(shared_redis_url(), queue, concurrency, 1 + (in_process + p) % 3);
        // All of them up before any work exists, or the first ones could take it all.
        auto up_by = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        for (std::size_t p = 0; p < processes; ++p) {
          while (!children.ready(p)) {
            auto ended = children.ended();
            REQUIRE_MESSAGE(ended.empty(), ended);
            REQUIRE_MESSAGE(std::chrono::steady_clock::now() < up_by, "worker process " << p + 1 << " not up in 20 s");
            co_await sleep_for(std::chrono::milliseconds(10));
          }
        }

        std::vector<event> events;  // this process' workers
        auto h = [&](job_context& c) -> awaitable<void> {
          auto seq = c.payload().at("seq").as_int64();
          events.push_back({true, c.group(), seq, c.fence(), c.id(), now_ns(), 0});
          if (seq % 3 == 0)
            co_await sleep_for(std::chrono::milliseconds(1));
          else
            co_await asio::post(co_await asio::this_coro::executor, use_awaitable);
          events.push_back({false, c.group(), seq, c.fence(), c.id(), now_ns(), 0});
        };
        std::vector<std::unique_ptr<redis_backend>> stores;
        std::vector<std::unique_ptr<worker>> workers;
        for (std::size_t w = 0; w < in_process; ++w) {
          worker_options o;
          o.queue = queue;
          o.concurrency = concurrency;
          o.burst = 1 + w % 3;
          o.claim_wait = std::chrono::milliseconds(300);
          stores.push_back(std::make_unique<redis_backend>(ctx.get_executor(), shared_redis()));
          workers.push_back(std::make_unique<worker>(ctx.get_executor(), *stores.back(), o));
          workers.back()->add_handler("step", h);
          workers.back()->start();
        }

        redis_backend store(ctx.get_executor(), shared_redis());
        producer prod(store, queue);
        std::vector<job_spec> specs;
        for (int s = 0; s < per_group; ++s)
          for (int g = 0; g < groups; ++g) {
            job_spec spec;
            spec.type = "step";
            spec.payload = {{"seq", s}};
            spec.group = fmt::format("g{}", g);
            specs.push_back(std::move(spec));
          }
        auto ids = co_await prod.enqueue_bulk(std::move(specs));
        CHECK(ids.size() == total);

        // Bounded wait for the queue to drain; a worker process that dies fails it at once.
        auto drained_by = std::chrono::steady_clock::now() + std::chrono::seconds(45);
        queue_counts counts;
        for (;;) {
          counts = co_await store.counts(queue);
          if (counts.completed >= total) break;
          auto ended = children.ended();
          REQUIRE_MESSAGE(ended.empty(), ended);
          REQUIRE_MESSAGE(std::chrono::steady_clock::now() < drained_by,
                          "only " << counts.completed << " of " << total << " jobs completed in 45 s");
          co_await sleep_for(std::chrono::milliseconds(20));
        }
        for (auto& w : workers) co_await w->stop(std::chrono::seconds(5));
        children.terminate();
        CHECK(co_await children.wait_all(std::chrono::seconds(15)));
        for (std::size_t p = 0; p < processes; ++p)
          CHECK_MESSAGE(children.exited_cleanly(p), "worker process " << p + 1 << ": " << children.describe(p));
        counts = co_await store.counts(queue);
        CHECK(counts.enqueued == total);
        CHECK(counts.started == total);
        CHECK(counts.completed == total);
        CHECK(counts.failed == 0);
        CHECK(counts.running == 0);
        CHECK(counts.ready_lanes == 0);

        // One history: this process' events and every log, merged by time. Within one source the
        // order is the order of writing; across sources each handoff of a group goes through a
        // Redis round trip, so its end and the next start are far apart in time.
        std::vector<std::size_t> starts_by_source(processes + 1, 0);
        for (auto& e : events) starts_by_source[0] += e.start;
        for (std::size_t p = 0; p < processes; ++p) {
          auto logged = read_log(children.log_path(p), static_cast<int>(p + 1));
          for (auto& e : logged) starts_by_source[p + 1] += e.start;
          events.insert(events.end(), std::make_move_iterator(logged.begin()), std::make_move_iterator(logged.end()));
        }
        std::stable_sort(events.begin(), events.end(), [](const event& a, const event& b) { return a.ns < b.ns; });

        std::map<std::string, std::int64_t> last_seq, last_fence;
        std::map<std::string, std::string> running;  // group → job id running now
        std::map<std::string, int> started_ids, ended_ids;
        std::map<std::string, int> starts_per_group;
        int overlaps = 0, inversions = 0, fence_regressions = 0, unmatched_ends = 0;
        for (auto& e : events) {
          if (e.start) {
            ++started_ids[e.id];
            ++starts_per_group[e.group];
            if (running.count(e.group)) ++overlaps;
            running[e.group] = e.id;
            auto s = last_seq.find(e.group);
            if (s == last_seq.end() ? e.seq != 0 : e.seq != s->second + 1) ++inversions;
            last_seq[e.group] = e.seq;
            auto f = last_fence.find(e.group);
            if (f != last_fence.end() && e.fence <= f->second) ++fence_regressions;
            last_fence[e.group] = e.fence;
          } else {
            ++ended_ids[e.id];
            auto r = running.find(e.group);
            if (r == running.end() || r->second != e.id)
              ++unmatched_ends;
            else
              running.erase(r);
          }
        }
        MESSAGE("jobs started: " << starts_by_source[0] << " by the " << in_process << " workers in this process, "
                                 << starts_by_source[1] << " / " << starts_by_source[2] << " / " << starts_by_source[3]
                                 << " by the worker processes");
        CHECK(overlaps == 0);
        CHECK(unmatched_ends == 0);
        CHECK(inversions == 0);
        CHECK(fence_regressions == 0);
        CHECK(running.empty());
        CHECK(starts_per_group.size() == static_cast<std::size_t>(groups));
        int short_groups = 0;
        for (auto& [g, n] : starts_per_group) short_groups += n != per_group;
        CHECK(short_groups == 0);
        // Every job ran exactly once: ids are the backend's, unique in the queue.
        CHECK(started_ids.size() == static_cast<std::size_t>(total));
        CHECK(ended_ids.size() == static_cast<std::size_t>(total));
        int not_once = 0;
        for (auto& [id, n] : started_ids) not_once += n != 1;
        for (auto& [id, n] : ended_ids) not_once += n != 1;
        CHECK(not_once == 0);
        // A process that ran nothing proves nothing.
        for (std::size_t s = 0; s <= processes; ++s)
          CHECK_MESSAGE(starts_by_source[s] > 0,
                        (s == 0 ? std::string("this process") : fmt::format("worker process {}", s)) << " ran no job");
      },
      std::chrono::seconds(100));
  MESSAGE("took "
          << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count()
          << " ms");
}
