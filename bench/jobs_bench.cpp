// The job runtime on Redis, measured from the server's own counters.
//
//   jobrt_bench_jobs URL throughput N CONCURRENCY GROUPS [BURST=4] [FOLLOW=after-commit] [GROUP_CONC=1]
//     (GROUPS 0: ungrouped; FOLLOW: after-commit or pipelined, see worker_options::follow;
//     GROUP_CONC: up to that many jobs of a group run at once, job_spec::group_concurrency)
//     enqueue N no-op jobs in batches of 1000, then one worker runs them; prints jobs/s,
//     enqueue jobs/s, Redis commands per job (INFO commandstats: commands inside scripts count),
//     Redis CPU per job (INFO cpu), Redis memory per queued job (INFO memory).
//   jobrt_bench_jobs URL pickup N GROUPED [GAP_US=1000] [SHARDS=1]
//     an idle worker (on a queue of SHARDS shards: sharded_backend); N jobs enqueued one at a
//     time, each after the previous one ran; prints the
//     enqueue-to-handler-start latency p50/p99, and the same for a bare LPUSH → BLMOVE wake-up,
//     taking turns with it. Each send follows an idle gap of GAP_US (1 ms, as the Node drivers of
//     the peers wait: the shortest timer they have), so the worker is idle again in its blocking
//     claim.
//   jobrt_bench_jobs URL wait N GROUPED [GAP_US=1000] [SHARDS=1]
//     as pickup, and taking turns with it (after the same gap) the round trip of `jobrt enqueue
//     --wait`: a kept job enqueued, run and its end back to the producer (producer::wait); prints
//     its p50/p99 too, and its p50 over the pickup's.
//   jobrt_bench_jobs URL fairness SECONDS [NOISY_CONC=1]
//     one worker of concurrency 16, handlers that take 1 ms (a timer). 100 quiet groups get a job
//     every 2 ms in turn for SECONDS, twice: alone, then beside a noisy group (up to NOISY_CONC of
//     its jobs at once) whose backlog, enqueued before, is more than 16 slots can run in the
//     phase (16,000 jobs a second of it): it holds over 90% of the queue's jobs throughout.
//     Prints the quiet jobs' waits (enqueue to handler start), p50/p99 of each phase, the p99s'
//     ratio (every quiet job measured: their counts, alone + beside), and the noisy jobs started
//     and left (some are left when the backlog lasted).
//   jobrt_bench_jobs URL priorities SECONDS [GROUPS=0] [PRIORITY=2]
//     as fairness, with ungrouped jobs: urgent ones (job_spec::priority PRIORITY: 0 for a baseline)
//     every 2 ms, alone, then beside a backlog of jobs of priority 0 enqueued first. With GROUPS,
//     grouped: the urgent jobs in 100 groups in turn, the backlog spread over GROUPS groups. Prints
//     the urgent jobs' waits, p50/p99 of each phase and the p99s' ratio, and the backlog's jobs
//     started and left.
//   jobrt_bench_jobs URL weights SECONDS GROUPS [GROUP_CONC=1]
//     one worker of concurrency 16 (burst 4), handlers that take 1 ms (a timer). GROUPS groups of
//     each weight 1, 2 and 4 (job_spec::group_weight; up to GROUP_CONC of a group's jobs at once),
//     each with a backlog of three times its share of 16 slots in SECONDS. Counts each
//     group's starts over SECONDS; prints, per weight, the mean starts of its groups divided by
//     the weight, over the same of weight 1 (1.00: starts exactly in proportion), and the least
//     and most of a group of weight 1, 2 and 4 over their class's mean.
//   jobrt_bench_jobs URL fill N GROUPS
//     flushes the server and enqueues N no-op jobs in batches of 1000 on queue "bench"; prints
//     enqueue jobs/s and Redis memory per queued job. For runs with several worker processes.
//   jobrt_bench_jobs URL work N CONCURRENCY [BURST=4]
//     one worker process on queue "bench" until the queue has completed N jobs (its counters,
//     read every 5 ms); prints its own jobs, the wall-clock times (µs since the epoch) of its
//     start and of its last handler run, and its CPU time (getrusage).
//   jobrt_bench_jobs URL scale N CONCURRENCY GROUPS SHARDS NODE_URL...
//     throughput's run on a queue of SHARDS shards (sharded_backend) at URL, one server or a
//     Redis Cluster; NODE_URL... are the servers whose CPU is counted (every primary of a
//     cluster; they are flushed). Prints jobs/s, Redis CPU per job summed over the nodes, the
//     busiest node's CPU seconds and share of the sum, and jobs per CPU second of the busiest
//     node (the capacity with one core a node).
//   jobrt_bench_jobs URL rate GROUPS MAX WINDOW_MS SECONDS
//     GROUPS groups, each limited to MAX starts in any WINDOW_MS (job_spec::group_rate), with
//     more jobs queued than they may start; one worker (concurrency 100) runs them for SECONDS.
//     Prints the starts each group made in that time over what its limit allows (MAX a window:
//     1.00 is the limit reached exactly), their mean, least and most, and the shortest time
//     any MAX + 1 starts of a group took, by their handlers' start times (at least WINDOW_MS
//     when the limit holds, less the jitter between a claim and its handler's start).
//   jobrt_bench_jobs URL queue-rate WORKERS MAX WINDOW_MS SECONDS
//     the queue's own limit (worker_options::rate_limit): WORKERS workers (concurrency 100 each,
//     their own connections) each given MAX starts in any WINDOW_MS, ungrouped jobs queued beyond
//     what the limit lets start; run for SECONDS. Prints the starts over what the limit allows,
//     and the shortest time any MAX + 1 starts took, over all the workers.
//   jobrt_bench_jobs URL depth DEPTH
//     one queue 1,000 deep and one DEPTH deep; 100 claims of 10 jobs from each, alternating;
//     prints the median server time of a claim script call at each depth, and their ratio.
// Output: one line of key=value pairs. The server must be a throw-away one: it is flushed.
#include <jobrt/producer.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/sharded_backend.hpp>
#include <jobrt/worker.hpp>

#include "server_stats.hpp"

#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/object.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace asio = boost::asio;
using namespace jobrt;
using asio::awaitable;
using asio::use_awaitable;
using clock_type = std::chrono::steady_clock;

// Enqueued in batches of 1,000 a call, as docs/BENCHMARKS.md says (the library's default is 500).
const jobrt::producer_options bulk = [] {
  jobrt::producer_options o;
  o.batch = 1000;
  return o;
}();

namespace {

awaitable<void> sleep_for(std::chrono::microseconds d) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  t.expires_after(d);
  co_await t.async_wait(use_awaitable);
}

using bench::server_stats;

awaitable<server_stats> read_stats(redis::connection& c) {
  auto r = co_await redis::exec(c, redis::request("INFO", "all"));
  co_return bench::parse_server_stats(std::string(r.as_string()));
}

// CPU time of this process so far, user + system.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto secs = [](timeval t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return secs(u.ru_utime) + secs(u.ru_stime);
}

std::int64_t epoch_us(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1))];
}

// n no-op jobs, spread over `groups` groups (0: ungrouped).
std::vector<job_spec> noop_jobs(long n, long groups, std::size_t group_concurrency = 1) {
  std::vector<job_spec> specs;
  specs.reserve(static_cast<std::size_t>(n));
  for (long i = 0; i < n; ++i) {
    job_spec s;
    s.type = "noop";
    if (groups > 0) s.group = std::to_string(i % groups);
    s.group_concurrency = group_concurrency;
    specs.push_back(std::move(s));
  }
  return specs;
}

awaitable<void> throughput(asio::io_context& ctx, redis::config cfg, long n, std::size_t concurrency, long groups,
                           std::size_t burst, follow_policy follow, std::size_t group_concurrency) {
  redis_backend store(ctx.get_executor(), cfg);
  auto& conn = store.connection();
  co_await redis::exec(conn, redis::request("FLUSHALL"));
  co_await redis::exec(conn, redis::request("CONFIG", "RESETSTAT"));
  producer p(store, "bench", bulk);
  auto specs = noop_jobs(n, groups, group_concurrency);
  auto s0 = co_await read_stats(conn);
  auto t0 = clock_type::now();
  co_await p.enqueue_bulk(std::move(specs));
  auto t1 = clock_type::now();
  auto s1 = co_await read_stats(conn);

  long done = 0;
  worker_options o;
  o.queue = "bench";
  o.concurrency = concurrency;
  o.burst = burst;
  o.follow = follow;
  worker w(ctx.get_executor(), store, o);
  w.add_handler("noop", [&](job_context&) -> awaitable<void> {
    ++done;
    co_return;
  });
  auto c2 = cpu_seconds();
  auto t2 = clock_type::now();
  w.start();
  while (done < n) co_await sleep_for(std::chrono::microseconds(500));
  auto t3 = clock_type::now();
  auto c3 = cpu_seconds();
  co_await w.stop(std::chrono::seconds(5));
  auto s2 = co_await read_stats(conn);
  auto secs = [](auto d) { return std::chrono::duration<double>(d).count(); };
  auto per_job = [&](double x) { return x / static_cast<double>(n); };
  fmt::print(
      "throughput groups={} group_concurrency={} n={} concurrency={} burst={} follow={} jobs_per_sec={:.0f} "
      "enqueue_per_sec={:.0f} "
      "cmds_per_job={:.2f} enqueue_cmds_per_job={:.2f} process_cmds_per_job={:.2f} "
      "redis_cpu_us_per_job={:.2f} enqueue_cpu_us_per_job={:.2f} process_cpu_us_per_job={:.2f} "
      "mem_bytes_per_job={:.1f} worker_cpu_us_per_job={:.2f}\n",
      groups, group_concurrency, n, concurrency, burst,
      follow == follow_policy::pipelined ? "pipelined" : "after-commit", static_cast<double>(n) / secs(t3 - t2),
      static_cast<double>(n) / secs(t1 - t0), per_job(static_cast<double>(s2.commands - s0.commands)),
      per_job(static_cast<double>(s1.commands - s0.commands)), per_job(static_cast<double>(s2.commands - s1.commands)),
      per_job((s2.cpu_seconds - s0.cpu_seconds) * 1e6), per_job((s1.cpu_seconds - s0.cpu_seconds) * 1e6),
      per_job((s2.cpu_seconds - s1.cpu_seconds) * 1e6), per_job(static_cast<double>(s1.used_memory - s0.used_memory)),
      per_job((c3 - c2) * 1e6));
  if (std::getenv("JOBRT_BENCH_VERBOSE"))
    for (auto& [k, v] : s2.commandstats) fmt::print("  {} {}\n", k, v);
}

awaitable<void> scale(asio::io_context& ctx, redis::config cfg, long n, std::size_t concurrency, long groups,
                      std::size_t shards, std::vector<redis::config> nodes) {
  std::vector<std::unique_ptr<redis::connection>> at;
  for (auto& node : nodes) {
    at.push_back(std::make_unique<redis::connection>(ctx.get_executor(), node));
    at.back()->start();
    co_await redis::exec(*at.back(), redis::request("FLUSHALL"));
    co_await redis::exec(*at.back(), redis::request("CONFIG", "RESETSTAT"));
  }
  auto cpu = [&]() -> awaitable<std::vector<double>> {
    std::vector<double> out;
    for (auto& c : at) out.push_back((co_await read_stats(*c)).cpu_seconds);
    co_return out;
  };
  std::vector<redis::config> seeds(1, cfg);
  redis_backend redis(ctx.get_executor(), seeds);
  sharded_backend store(redis, shards);
  producer p(store, "bench", bulk);
  auto before = co_await cpu();
  auto t0 = clock_type::now();
  co_await p.enqueue_bulk(noop_jobs(n, groups));
  auto enqueued = co_await cpu();
  long done = 0;
  worker_options o;
  o.queue = "bench";
  o.concurrency = concurrency;
  worker w(ctx.get_executor(), store, o);
  w.add_handler("noop", [&](job_context&) -> awaitable<void> {
    ++done;
    co_return;
  });
  w.start();
  while (done < n) co_await sleep_for(std::chrono::microseconds(500));
  auto t1 = clock_type::now();
  co_await w.stop(std::chrono::seconds(5));
  auto after = co_await cpu();
  double sum = 0, busiest = 0, enqueuing = 0;
  std::string each;
  for (std::size_t i = 0; i < at.size(); ++i) {
    auto used = after[i] - before[i];
    enqueuing += enqueued[i] - before[i];
    sum += used;
    busiest = std::max(busiest, used);
    each += fmt::format("{}{:.2f}", each.empty() ? "" : ",", used);
  }
  fmt::print(
      "scale groups={} shards={} nodes={} n={} concurrency={} jobs_per_sec={:.0f} redis_cpu_us_per_job={:.2f} "
      "enqueue_cpu_us_per_job={:.2f} node_cpu_s={} busiest_cpu_s={:.2f} busiest_share={:.3f} "
      "jobs_per_busiest_cpu_s={:.0f}\n",
      groups, shards, at.size(), n, concurrency,
      static_cast<double>(n) / std::chrono::duration<double>(t1 - t0).count(), sum * 1e6 / static_cast<double>(n),
      enqueuing * 1e6 / static_cast<double>(n), each, busiest, busiest / sum, static_cast<double>(n) / busiest);
  if (std::getenv("JOBRT_BENCH_VERBOSE"))  // (the counters were reset at the start)
    for (auto& c : at)
      for (auto& [k, v] : (co_await read_stats(*c)).commandstats) fmt::print("  {} {}\n", k, v);
}

awaitable<void> fill_only(asio::io_context& ctx, redis::config cfg, long n, long groups) {
  redis_backend store(ctx.get_executor(), cfg);
  auto& conn = store.connection();
  co_await redis::exec(conn, redis::request("FLUSHALL"));
  producer p(store, "bench", bulk);
  auto specs = noop_jobs(n, groups);
  auto s0 = co_await read_stats(conn);
  auto t0 = clock_type::now();
  co_await p.enqueue_bulk(std::move(specs));
  auto t1 = clock_type::now();
  auto s1 = co_await read_stats(conn);
  fmt::print("fill groups={} n={} enqueue_per_sec={:.0f} mem_bytes_per_job={:.1f}\n", groups, n,
             static_cast<double>(n) / std::chrono::duration<double>(t1 - t0).count(),
             static_cast<double>(s1.used_memory - s0.used_memory) / static_cast<double>(n));
}

awaitable<void> work(asio::io_context& ctx, redis::config cfg, long n, std::size_t concurrency, std::size_t burst) {
  redis_backend store(ctx.get_executor(), cfg);
  long done = 0;
  auto last = std::chrono::system_clock::now();
  worker_options o;
  o.queue = "bench";
  o.concurrency = concurrency;
  o.burst = burst;
  worker w(ctx.get_executor(), store, o);
  w.add_handler("noop", [&](job_context&) -> awaitable<void> {
    ++done;
    last = std::chrono::system_clock::now();
    co_return;
  });
  auto c0 = cpu_seconds();
  auto start = std::chrono::system_clock::now();
  w.start();
  for (;;) {
    co_await sleep_for(std::chrono::milliseconds(5));
    auto counts = co_await store.counts("bench");
    if (counts.completed >= n) break;
  }
  auto c1 = cpu_seconds();
  co_await w.stop(std::chrono::seconds(5));
  fmt::print("work n={} concurrency={} jobs={} start_us={} end_us={} worker_cpu_us={:.0f}\n", n, concurrency, done,
             epoch_us(start), epoch_us(last), (c1 - c0) * 1e6);
}

awaitable<void> pickup(asio::io_context& ctx, redis::config cfg, int n, bool grouped, std::chrono::microseconds gap,
                       std::size_t shards, bool round_trips) {
  redis_backend redis(ctx.get_executor(), cfg);
  auto& conn = redis.connection();
  co_await redis::exec(conn, redis::request("FLUSHALL"));
  sharded_backend store(redis, shards);

  worker_options o;
  o.queue = "pickup";
  o.concurrency = 100;
  worker w(ctx.get_executor(), store, o);
  clock_type::time_point started{};
  // The handler wakes the loop below by cancelling this timer: no polling, which would compete
  // with the worker for this thread.
  asio::steady_timer ran(ctx);
  w.add_handler("noop", [&](job_context&) -> awaitable<void> {
    started = clock_type::now();
    ran.cancel();
    co_return;
  });
  w.start();
  producer p(store, "pickup");

  // The bare wake-up: LPUSH on one connection, BLMOVE waiting on another. It takes turns with
  // jobrt's pickup, and each send follows the same idle gap, so both see the machine in the same
  // state: a wake-up after a longer idle spell is slower (caches and the CPU gone cold).
  redis::blocking_connection blocking(ctx.get_executor(), cfg);
  blocking.start();
  std::vector<double> bare, ours, round_trip;
  for (int i = 0; i < n; ++i) {
    clock_type::time_point sent{};
    asio::co_spawn(
        ctx,
        [&]() -> awaitable<void> {
          co_await sleep_for(gap);  // (the BLMOVE below is blocked by then)
          sent = clock_type::now();
          co_await redis::exec(conn, redis::request("LPUSH", "bare:src", "x"));
        },
        asio::detached);
    co_await redis::exec(blocking, redis::request("BLMOVE", "bare:src", "bare:dst", "RIGHT", "LEFT", 5));
    bare.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - sent).count());

    co_await sleep_for(gap);  // the worker is idle in its blocking claim
    job_spec s;
    s.type = "noop";
    if (grouped) s.group = std::to_string(i);  // a new group each time
    started = {};
    sent = clock_type::now();
    co_await p.enqueue(std::move(s));
    while (started == clock_type::time_point{}) {
      ran.expires_after(std::chrono::seconds(10));
      boost::system::error_code ec;
      co_await ran.async_wait(asio::redirect_error(use_awaitable, ec));
      if (!ec) throw std::runtime_error(fmt::format("pickup: job {} did not start within 10 s", i));
    }
    ours.push_back(std::chrono::duration<double, std::micro>(started - sent).count());

    // The round trip of `enqueue --wait`: a kept job enqueued, run, and its end back to the
    // producer (woken by the message of its end).
    if (!round_trips) continue;
    co_await sleep_for(gap);
    job_spec k;
    k.type = "noop";
    if (grouped) k.group = "w" + std::to_string(i);
    k.keep = std::chrono::seconds(60);
    sent = clock_type::now();
    auto id = (co_await p.enqueue(std::move(k))).id;
    auto end = co_await p.wait(id, std::chrono::seconds(10));
    if (!end || end->status != job_status::state::done)
      throw std::runtime_error(fmt::format("pickup: kept job {} did not end within 10 s", id));
    round_trip.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - sent).count());
  }
  co_await w.stop(std::chrono::seconds(5));
  fmt::print(
      "pickup grouped={} shards={} n={} p50_us={:.0f} p99_us={:.0f} bare_p50_us={:.0f} bare_p99_us={:.0f} "
      "p10_us={:.0f} p25_us={:.0f} p75_us={:.0f} p90_us={:.0f} p95_us={:.0f}{}\n",
      grouped, shards, n, percentile(ours, 0.5), percentile(ours, 0.99), percentile(bare, 0.5), percentile(bare, 0.99),
      percentile(ours, 0.1), percentile(ours, 0.25), percentile(ours, 0.75), percentile(ours, 0.9),
      percentile(ours, 0.95),
      round_trips ? fmt::format(" wait_p50_us={:.0f} wait_p99_us={:.0f} wait_over_pickup_p50={:.2f}",
                                percentile(round_trip, 0.5), percentile(round_trip, 0.99),
                                percentile(round_trip, 0.5) / percentile(ours, 0.5))
                  : std::string());
}

// Quiet jobs on a steady beat (one every 2 ms), twice: alone, then beside a noisy backlog,
// enqueued first, that holds more than one worker of concurrency 16 with 1 ms handlers can start
// in the phase (16,000 jobs a second of it). `quiet(i)` and `noisy()` make the jobs.
struct contention_result {
  std::vector<double> alone, beside;  // the quiet jobs' waits (enqueue to handler start), µs
  long noisy_backlog = 0, noisy_started = 0;
};

awaitable<contention_result> contention(asio::io_context& ctx, redis::config cfg, long seconds,
                                        std::function<job_spec(long)> quiet, std::function<job_spec()> noisy) {
  redis_backend store(ctx.get_executor(), cfg);
  co_await redis::exec(store.connection(), redis::request("FLUSHALL"));
  constexpr auto every = std::chrono::microseconds(2000);
  const long per_phase = seconds * 1'000'000 / every.count();
  contention_result out;
  out.noisy_backlog = 16'000 * seconds;
  worker_options o;
  o.queue = "contention";
  o.concurrency = 16;
  worker w(ctx.get_executor(), store, o);
  auto t0 = clock_type::now();
  auto since = [&] { return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count(); };
  std::vector<double> waits;  // of the quiet jobs of the phase
  w.add_handler("quiet", [&](job_context& c) -> awaitable<void> {
    waits.push_back(since() - c.payload().at("sent_us").to_number<double>());
    co_await sleep_for(std::chrono::milliseconds(1));
  });
  w.add_handler("noisy", [&](job_context&) -> awaitable<void> {
    ++out.noisy_started;
    co_await sleep_for(std::chrono::milliseconds(1));
  });
  w.start();
  producer p(store, o.queue);
  auto phase = [&](bool beside) -> awaitable<std::vector<double>> {
    out.noisy_started = 0;
    if (beside) {
      producer filler(store, o.queue, bulk);
      std::vector<job_spec> specs;
      for (long i = 0; i < out.noisy_backlog; ++i) specs.push_back(noisy());
      co_await filler.enqueue_bulk(std::move(specs));
    }
    waits.clear();
    auto next = clock_type::now();
    for (long i = 0; i < per_phase; ++i) {  // on a steady beat, whatever each enqueue took
      next += every;
      auto s = quiet(i);
      s.type = "quiet";
      s.payload = boost::json::object{{"sent_us", since()}};
      co_await p.enqueue(std::move(s));
      if (auto left = next - clock_type::now(); left > clock_type::duration::zero())
        co_await sleep_for(std::chrono::duration_cast<std::chrono::microseconds>(left));
    }
    for (auto until = clock_type::now() + std::chrono::seconds(10); std::ssize(waits) < per_phase;) {
      if (clock_type::now() > until)
        throw std::runtime_error(fmt::format("contention: {} of {} quiet jobs started", waits.size(), per_phase));
      co_await sleep_for(std::chrono::microseconds(500));  // (every quiet job is measured)
    }
    co_return std::move(waits);
  };
  out.alone = co_await phase(false);
  out.beside = co_await phase(true);
  auto started = out.noisy_started;  // (read before the worker stops)
  co_await w.stop(std::chrono::seconds(5));
  out.noisy_started = started;
  co_return out;
}

awaitable<void> fairness(asio::io_context& ctx, redis::config cfg, long seconds, std::size_t noisy_concurrency) {
  auto r = co_await contention(
      ctx, std::move(cfg), seconds,
      [](long i) {
        job_spec s;
        s.group = fmt::format("q{}", i % 100);  // 100 quiet groups, in turn
        return s;
      },
      [noisy_concurrency] {
        job_spec s;
        s.type = "noisy";
        s.group = "noisy";
        s.group_concurrency = noisy_concurrency;
        return s;
      });
  fmt::print(
      "fairness seconds={} noisy_concurrency={} quiet_jobs={}+{} alone_p50_us={:.0f} alone_p99_us={:.0f} "
      "beside_p50_us={:.0f} beside_p99_us={:.0f} p99_ratio={:.2f} noisy_started={} noisy_left={}\n",
      seconds, noisy_concurrency, r.alone.size(), r.beside.size(), percentile(r.alone, 0.5), percentile(r.alone, 0.99),
      percentile(r.beside, 0.5), percentile(r.beside, 0.99), percentile(r.beside, 0.99) / percentile(r.alone, 0.99),
      r.noisy_started, r.noisy_backlog - r.noisy_started);
}

// Urgent jobs (priority `urgent`, 2 unless a baseline is asked for) beside a backlog of priority 0:
// ungrouped, or with GROUPS > 0 the urgent ones in 100 groups in turn and the backlog spread over
// GROUPS groups.
awaitable<void> priorities(asio::io_context& ctx, redis::config cfg, long seconds, long groups, int urgent) {
  auto r = co_await contention(
      ctx, std::move(cfg), seconds,
      [groups, urgent](long i) {
        job_spec s;
        s.priority = urgent;
        if (groups > 0) s.group = fmt::format("u{}", i % 100);
        return s;
      },
      [groups, n = 0L]() mutable {
        job_spec s;
        s.type = "noisy";
        if (groups > 0) s.group = fmt::format("b{}", n++ % groups);
        return s;
      });
  fmt::print(
      "priorities seconds={} groups={} priority={} urgent_jobs={}+{} alone_p50_us={:.0f} alone_p99_us={:.0f} "
      "beside_p50_us={:.0f} "
      "beside_p99_us={:.0f} p99_ratio={:.2f} backlog_started={} backlog_left={}\n",
      seconds, groups, urgent, r.alone.size(), r.beside.size(), percentile(r.alone, 0.5), percentile(r.alone, 0.99),
      percentile(r.beside, 0.5), percentile(r.beside, 0.99), percentile(r.beside, 0.99) / percentile(r.alone, 0.99),
      r.noisy_started, r.noisy_backlog - r.noisy_started);
}

awaitable<void> weights(asio::io_context& ctx, redis::config cfg, long seconds, long groups,
                        std::size_t group_concurrency) {
  redis_backend store(ctx.get_executor(), cfg);
  co_await redis::exec(store.connection(), redis::request("FLUSHALL"));
  constexpr std::array<std::size_t, 3> classes{1, 2, 4};
  constexpr long slots = 16, per_second = slots * 1000;  // (1 ms handlers)
  // Each group's backlog: three times its share of the slots for the whole run (the share of
  // weight w: w / 7 of them, over `groups` groups), so that every group stays backlogged even
  // when the weights are far from met (a group that ran out fails the run).
  auto backlog = [&](std::size_t w) { return per_second * seconds * static_cast<long>(w) * 3 / (7 * groups) + 100; };
  {
    producer filler(store, "weights", bulk);
    std::vector<job_spec> specs;
    for (long i = 0; i < groups; ++i)  // interleaved, so that no weight's lanes come first
      for (auto w : classes)
        for (long k = 0; k < backlog(w); ++k) {
          job_spec s;
          s.type = "t";
          s.group = fmt::format("w{}-{}", w, i);
          s.group_weight = w;
          s.group_concurrency = group_concurrency;
          specs.push_back(std::move(s));
          if (specs.size() < 100'000) continue;
          std::vector<job_spec> batch;
          batch.swap(specs);
          co_await filler.enqueue_bulk(std::move(batch));
        }
    co_await filler.enqueue_bulk(std::move(specs));
  }
  std::map<std::string, long> starts;
  bool counting = true;
  worker_options o;
  o.queue = "weights";
  o.concurrency = static_cast<std::size_t>(slots);
  worker w(ctx.get_executor(), store, o);
  w.add_handler("t", [&](job_context& c) -> awaitable<void> {
    if (counting) ++starts[c.group()];
    co_await sleep_for(std::chrono::milliseconds(1));
  });
  w.start();
  co_await sleep_for(std::chrono::seconds(seconds));
  counting = false;
  auto counted = starts;
  co_await w.stop(std::chrono::seconds(5));
  // Per weight: the mean of its groups' starts, and the least and most of a group over it.
  std::array<double, 3> mean{}, least{}, most{};
  for (std::size_t c = 0; c < classes.size(); ++c) {
    std::vector<double> of;
    for (long i = 0; i < groups; ++i) {
      auto n = counted[fmt::format("w{}-{}", classes[c], i)];
      if (n >= backlog(classes[c]))
        throw std::runtime_error(fmt::format("weights: group w{}-{} ran out of jobs", classes[c], i));
      of.push_back(static_cast<double>(n));
    }
    for (auto n : of) mean[c] += n / static_cast<double>(of.size());
    least[c] = *std::min_element(of.begin(), of.end()) / mean[c];
    most[c] = *std::max_element(of.begin(), of.end()) / mean[c];
  }
  long total = 0;
  for (auto& [group, n] : counted) total += n;
  fmt::print(
      "weights seconds={} groups={}x3 group_concurrency={} jobs_per_sec={:.0f} per_weight_over_w1_w2={:.3f} "
      "per_weight_over_w1_w4={:.3f} spread_w1={:.2f}-{:.2f} spread_w2={:.2f}-{:.2f} spread_w4={:.2f}-{:.2f}\n",
      seconds, groups, group_concurrency, static_cast<double>(total) / static_cast<double>(seconds),
      mean[1] / 2 / mean[0], mean[2] / 4 / mean[0], least[0], most[0], least[1], most[1], least[2], most[2]);
}

awaitable<void> depth(asio::io_context& ctx, redis::config cfg, long queued) {
  redis_backend store(ctx.get_executor(), cfg);
  auto& conn = store.connection();
  co_await redis::exec(conn, redis::request("FLUSHALL"));
  // Two queues, 1,000 and `queued` deep; claims alternate between them, and each claim's server
  // time is read on its own (CONFIG RESETSTAT, claim, INFO commandstats), so both depths see the
  // same machine at the same moments.
  auto fill = [&](std::string queue, long n) -> awaitable<void> {
    producer p(store, queue, bulk);
    for (long first = 0; first < n; first += 10000) {
      std::vector<job_spec> specs;
      for (long i = first; i < std::min(n, first + 10000); ++i) {
        job_spec s;
        s.type = "noop";
        specs.push_back(std::move(s));
      }
      co_await p.enqueue_bulk(std::move(specs));
    }
  };
  co_await fill("shallow", 1000);
  co_await fill("deep", queued);
  auto one_claim = [&](std::string queue) -> awaitable<double> {
    co_await redis::exec(conn, redis::request("CONFIG", "RESETSTAT"));
    claim_options co{"bench", 10, std::chrono::seconds(30)};
    co_await store.claim(queue, co);
    auto s = co_await read_stats(conn);
    auto evalsha = s.commandstats["cmdstat_evalsha"];
    co_return std::stod(evalsha.substr(evalsha.find("usec=") + 5));
  };
  std::vector<double> shallow, deep;
  for (int i = 0; i < 100; ++i) {  // 100 claims of 10: all of the shallow queue
    shallow.push_back(co_await one_claim("shallow"));
    deep.push_back(co_await one_claim("deep"));
  }
  fmt::print("depth queued={} claim_usec_p50={:.0f} shallow_claim_usec_p50={:.0f} ratio={:.2f}\n", queued,
             percentile(deep, 0.5), percentile(shallow, 0.5), percentile(deep, 0.5) / percentile(shallow, 0.5));
}

awaitable<void> rate(asio::io_context& ctx, redis::config cfg, long groups, long max, long window_ms, long seconds) {
  redis_backend store(ctx.get_executor(), cfg);
  co_await redis::exec(store.connection(), redis::request("FLUSHALL"));
  producer p(store, "bench", bulk);
  const auto window = std::chrono::milliseconds(window_ms);
  const long windows = seconds * 1000 / window_ms;
  auto specs = noop_jobs(groups * max * (windows + 2), groups);
  for (auto& s : specs) s.group_rate = rate_limit{static_cast<std::size_t>(max), window};
  co_await p.enqueue_bulk(std::move(specs));
  worker_options o;
  o.queue = "bench";
  o.concurrency = 100;
  worker w(ctx.get_executor(), store, o);
  std::map<std::string, std::vector<clock_type::time_point>> starts;
  auto t0 = clock_type::now();
  auto end = t0 + std::chrono::seconds(seconds);
  w.add_handler("noop", [&](job_context& c) -> awaitable<void> {
    auto now = clock_type::now();
    if (now < end) starts[c.group()].push_back(now);
    co_return;
  });
  w.start();
  co_await sleep_for(std::chrono::duration_cast<std::chrono::microseconds>(end - clock_type::now()));
  co_await w.stop(std::chrono::seconds(5));
  // A group's share of its limit over the run: its first window begins at its first start.
  std::vector<double> ratios;
  auto shortest = clock_type::duration::max();  // of any max + 1 starts of a group
  for (auto& [group, list] : starts) {
    ratios.push_back(static_cast<double>(list.size()) / static_cast<double>(max * windows));
    for (std::size_t i = 0; i + static_cast<std::size_t>(max) < list.size(); ++i)
      shortest = std::min(shortest, list[i + static_cast<std::size_t>(max)] - list[i]);
  }
  ratios.resize(static_cast<std::size_t>(groups), 0.0);  // a group that never started counts as 0
  double sum = 0;
  for (double r : ratios) sum += r;
  fmt::print(
      "rate groups={} max={} window_ms={} seconds={} limit_ratio_mean={:.3f} limit_ratio_min={:.3f} "
      "limit_ratio_max={:.3f} shortest_span_ms={:.1f}\n",
      groups, max, window_ms, seconds, sum / static_cast<double>(groups),
      *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()),
      std::chrono::duration<double, std::milli>(shortest).count());
}

awaitable<void> queue_rate(asio::io_context& ctx, redis::config cfg, long workers, long max, long window_ms,
                           long seconds) {
  std::vector<std::unique_ptr<redis_backend>> stores;
  for (long i = 0; i < workers; ++i) stores.push_back(std::make_unique<redis_backend>(ctx.get_executor(), cfg));
  co_await redis::exec(stores[0]->connection(), redis::request("FLUSHALL"));
  const auto window = std::chrono::milliseconds(window_ms);
  const long windows = seconds * 1000 / window_ms;
  producer p(*stores[0], "bench", bulk);
  co_await p.enqueue_bulk(noop_jobs(max * (windows + 2), 0));
  worker_options o;
  o.queue = "bench";
  o.concurrency = 100;
  o.rate_limit = rate_limit{static_cast<std::size_t>(max), window};
  std::vector<clock_type::time_point> starts;
  auto end = clock_type::now() + std::chrono::seconds(seconds);
  std::vector<std::unique_ptr<worker>> ws;
  for (auto& store : stores) {
    ws.push_back(std::make_unique<worker>(ctx.get_executor(), *store, o));
    ws.back()->add_handler("noop", [&](job_context&) -> awaitable<void> {
      if (auto now = clock_type::now(); now < end) starts.push_back(now);
      co_return;
    });
  }
  for (auto& w : ws) w->start();
  co_await sleep_for(std::chrono::duration_cast<std::chrono::microseconds>(end - clock_type::now()));
  for (auto& w : ws) co_await w->stop(std::chrono::seconds(5));
  std::sort(starts.begin(), starts.end());
  auto shortest = clock_type::duration::max();  // of any max + 1 starts
  for (std::size_t i = 0; i + static_cast<std::size_t>(max) < starts.size(); ++i)
    shortest = std::min(shortest, starts[i + static_cast<std::size_t>(max)] - starts[i]);
  fmt::print("queue-rate workers={} max={} window_ms={} seconds={} limit_ratio={:.3f} shortest_span_ms={:.1f}\n",
             workers, max, window_ms, seconds, static_cast<double>(starts.size()) / static_cast<double>(max * windows),
             std::chrono::duration<double, std::milli>(shortest).count());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    fmt::print(
        stderr,
        "usage: {} URL throughput N C GROUPS [BURST] [FOLLOW] [GROUP_CONC] | fill N GROUPS | work N C [BURST] | "
        "pickup N "
        "GROUPED [GAP_US] [SHARDS] | wait N GROUPED [GAP_US] [SHARDS] | "
        "scale N C GROUPS SHARDS NODE_URL... | rate GROUPS MAX WINDOW_MS SECONDS | queue-rate WORKERS MAX "
        "WINDOW_MS SECONDS | depth DEPTH | fairness SECONDS [NOISY_CONC] | priorities SECONDS [GROUPS] [PRIORITY] | "
        "weights SECONDS GROUPS "
        "[GROUP_CONC]\n",
        argv[0]);
    return 2;
  }
  auto cfg = redis::config::from_url(argv[1]);
  std::string mode = argv[2];
  auto arg = [&](int i, long fallback) { return argc > i ? std::atol(argv[i]) : fallback; };
  asio::io_context ctx(1);
  std::exception_ptr failure;
  auto done = [&](std::exception_ptr e) {
    failure = e;
    ctx.stop();
  };
  auto follow = follow_policy::after_commit;
  try {
    if (mode == "throughput" && argc > 7) follow = parse_follow_policy(argv[7]);
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr, "error: FOLLOW: {}\n", e.what());
    return 2;
  }
  if (mode == "throughput")
    asio::co_spawn(
        ctx,
        throughput(ctx, cfg, arg(3, 100000), static_cast<std::size_t>(arg(4, 100)), arg(5, 0),
                   static_cast<std::size_t>(arg(6, 4)), follow, static_cast<std::size_t>(std::max(1L, arg(8, 1)))),
        done);
  else if (mode == "pickup" || mode == "wait")
    asio::co_spawn(
        ctx,
        pickup(ctx, cfg, static_cast<int>(arg(3, 1000)), arg(4, 0) != 0, std::chrono::microseconds(arg(5, 1000)),
               static_cast<std::size_t>(std::max(1L, arg(6, 1))), mode == "wait"),
        done);
  else if (mode == "fill")
    asio::co_spawn(ctx, fill_only(ctx, cfg, arg(3, 100000), arg(4, 0)), done);
  else if (mode == "work")
    asio::co_spawn(
        ctx, work(ctx, cfg, arg(3, 100000), static_cast<std::size_t>(arg(4, 100)), static_cast<std::size_t>(arg(5, 4))),
        done);
  else if (mode == "scale" && argc > 7) {
    std::vector<redis::config> nodes;
    for (int i = 7; i < argc; ++i) nodes.push_back(redis::config::from_url(argv[i]));
    asio::co_spawn(ctx,
                   scale(ctx, cfg, arg(3, 100000), static_cast<std::size_t>(arg(4, 100)), arg(5, 0),
                         static_cast<std::size_t>(std::max(1L, arg(6, 1))), std::move(nodes)),
                   done);
  } else if (mode == "rate" && argc > 6 && arg(3, 0) > 0 && arg(4, 0) > 0 && arg(5, 0) > 0 && arg(6, 0) > 0)
    asio::co_spawn(ctx, rate(ctx, cfg, arg(3, 0), arg(4, 0), arg(5, 0), arg(6, 0)), done);
  else if (mode == "queue-rate" && argc > 6 && arg(3, 0) > 0 && arg(4, 0) > 0 && arg(5, 0) > 0 && arg(6, 0) > 0)
    asio::co_spawn(ctx, queue_rate(ctx, cfg, arg(3, 0), arg(4, 0), arg(5, 0), arg(6, 0)), done);
  else if (mode == "fairness" && arg(3, 0) > 0)
    asio::co_spawn(ctx, fairness(ctx, cfg, arg(3, 0), static_cast<std::size_t>(std::max(1L, arg(4, 1)))), done);
  else if (mode == "priorities" && arg(3, 0) > 0)
    asio::co_spawn(ctx, priorities(ctx, cfg, arg(3, 0), arg(4, 0), static_cast<int>(arg(5, 2))), done);
  else if (mode == "weights" && arg(3, 0) > 0 && arg(4, 0) > 0)
    asio::co_spawn(ctx, weights(ctx, cfg, arg(3, 0), arg(4, 0), static_cast<std::size_t>(std::max(1L, arg(5, 1)))),
                   done);
  else if (mode == "depth")
    asio::co_spawn(ctx, depth(ctx, cfg, arg(3, 1000)), done);
  else {
    fmt::print(stderr, "unknown mode {}\n", mode);
    return 2;
  }
  ctx.run();
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      fmt::print(stderr, "error: {}\n", e.what());
      return 1;
    }
  }
  return 0;
}
