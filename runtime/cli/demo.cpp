// `jobrt demo`: stock arrivals. Many arrivals for a few hundred commodities; each job reads the
// commodity's stock, yields, writes it back, and refuses an arrival that would exceed the limit.
// Grouped by commodity, every commodity ends exactly where a serial replay ends; ungrouped
// (--no-groups), concurrent read-modify-writes lose updates.
//
// Embedded (the default): workers, handlers and the scoreboard in this process. With --redis URL
// this process only enqueues and checks: worker processes (this binary again, with the hidden
// `demo-worker` command) run the handlers, with the stock, the running count and the last seq of
// every commodity kept in Redis, so the checks hold across processes.
#include "cli.hpp"
#include "processes.hpp"

#include <jobrt/memory_backend.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/sharded_backend.hpp>
#include <jobrt/worker.hpp>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <random>

namespace jobrt::cli {
namespace {

namespace asio = boost::asio;
using namespace asio::experimental::awaitable_operators;
using clock = std::chrono::steady_clock;

struct demo_options {
  std::size_t jobs = 20000;
  std::size_t commodities = 300;
  std::size_t workers = 4;  // with --redis: in each worker process (default 1)
  std::size_t concurrency = 32;
  std::size_t threads = 2;
  std::int64_t limit = 600;
  bool groups = true;
  std::string redis_url;
  std::size_t processes = 3;  // with --redis
  std::size_t shards = 1;     // the queue's (sharded_backend)
  std::string queue = "demo";
};

// What the handlers do and what the checker sees, per commodity.
struct commodity {
  std::atomic<std::int64_t> stock{0};
  std::atomic<int> running{0};
  std::atomic<std::int64_t> last_seq{-1};
};

struct scoreboard {
  explicit scoreboard(std::size_t n) : items(n) {}
  std::vector<commodity> items;
  std::atomic<std::uint64_t> done{0}, refused{0}, overlaps{0}, inversions{0};
};

asio::awaitable<void> yield_for(std::chrono::microseconds d) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  t.expires_after(d);
  co_await t.async_wait(asio::use_awaitable);
}

handler stock_arrival(std::shared_ptr<scoreboard> board, std::int64_t limit) {
  return [board, limit](job_context& ctx) -> asio::awaitable<void> {
    const auto& p = ctx.payload().as_object();
    auto index = static_cast<std::size_t>(p.at("commodity").as_int64());
    auto qty = p.at("qty").as_int64();
    auto seq = p.at("seq").as_int64();
    auto& c = board->items.at(index);
    if (c.running.fetch_add(1) > 0) ++board->overlaps;
    if (c.last_seq.exchange(seq) > seq) ++board->inversions;
    std::int64_t stock = c.stock.load();
    co_await yield_for(std::chrono::microseconds(50 + seq % 200));  // the read-modify-write window
    if (stock + qty > limit)
      ++board->refused;
    else
      c.stock.store(stock + qty);
    c.running.fetch_sub(1);
    ++board->done;
  };
}

// The demo's state in Redis, for worker processes. Its keys are under the queue's prefix (one
// hash tag, so one cluster slot), and the cleanup before a run removes them with the queue.
struct redis_state {
  explicit redis_state(const std::string& queue) : prefix(redis_backend::key_prefix(queue) + "demo:") {}
  std::string prefix;
  std::string stock() const { return prefix + "stock"; }                                 // hash: commodity → stock
  std::string running(const std::string& c) const { return prefix + "running:" + c; }    // INCR / DECR
  std::string last_seq(const std::string& c) const { return prefix + "last-seq:" + c; }  // SET ... GET
  std::string checks() const { return prefix + "checks"; }  // hash: refused, overlaps, inversions
  std::string ready() const { return prefix + "ready"; }    // list: a pid per worker process up
  // list: "<pid> <started> <completed> <failed> <leases lost>" per worker process that stopped
  std::string reports() const { return prefix + "processes"; }
};

// The same handler with its state in Redis: the read and the write of the stock are separate
// round trips around the same yield, so only grouping keeps them from interleaving.
// (Its keys share the queue's hash tag: on a Redis Cluster they are at the queue's primary. Each
// round trip is a transaction: while that slot migrates, one met by ASK runs nothing and is sent
// again whole once the slot has moved.)
handler stock_arrival_redis(redis_backend& store, std::shared_ptr<const redis_state> keys, std::int64_t limit) {
  return [&store, keys, limit](job_context& ctx) -> asio::awaitable<void> {
    const auto& p = ctx.payload().as_object();
    auto field = std::to_string(p.at("commodity").as_int64());
    auto qty = p.at("qty").as_int64();
    auto seq = p.at("seq").as_int64();
    redis::request reads("MULTI");
    reads.push("INCR", keys->running(field))
        .push("SET", keys->last_seq(field), seq, "GET")
        .push("HGET", keys->stock(), field)
        .push("EXEC");
    auto before = co_await store.exec(std::move(reads), keys->prefix);
    const auto& r = before.as_array().back().as_array();
    bool overlap = r.at(0).as_integer() > 1;
    bool inversion = !r.at(1).is_nil() && std::stoll(r.at(1).as_string()) > seq;
    std::int64_t stock = r.at(2).is_nil() ? 0 : std::stoll(r.at(2).as_string());
    co_await yield_for(std::chrono::microseconds(50 + seq % 200));  // the read-modify-write window
    redis::request writes("MULTI");
    if (stock + qty > limit)
      writes.push("HINCRBY", keys->checks(), "refused", 1);
    else
      writes.push("HSET", keys->stock(), field, stock + qty);
    if (overlap) writes.push("HINCRBY", keys->checks(), "overlaps", 1);
    if (inversion) writes.push("HINCRBY", keys->checks(), "inversions", 1);
    writes.push("DECR", keys->running(field)).push("EXEC");
    co_await store.exec(std::move(writes), keys->prefix);
  };
}

// The progress bar is redrawn in place with '\r': for a person at a terminal. Written to a file
// (a log, a CI job) it would be one long line of redraws, so there it is left out.
bool progress_shown() {
  static const bool tty = ::isatty(STDERR_FILENO) == 1;
  return tty;
}

// Ends the bar's line, so that what comes next starts on a line of its own.
void end_progress() {
  if (progress_shown()) fmt::print(stderr, "\n");
}

void progress(std::size_t done, std::size_t total, double secs) {
  if (!progress_shown()) return;
  constexpr int width = 40;
  auto filled = static_cast<int>(static_cast<double>(done) / static_cast<double>(total) * width);
  fmt::print(stderr, "\r  [{:=<{}}{:<{}}] {:3.0f}%  {}/{} jobs  {:.0f} jobs/s ", "", filled, "", width - filled,
             100.0 * static_cast<double>(done) / static_cast<double>(total), done, total,
             secs > 0 ? static_cast<double>(done) / secs : 0.0);
}

// The jobs: arrivals with a random commodity and quantity; seq is the arrival's rank within its
// commodity, and the serial replay gives the expected final stock.
struct arrivals {
  std::vector<job_spec> specs;
  std::vector<std::int64_t> expected;
  std::uint64_t expected_refusals = 0;
};

arrivals make_arrivals(const demo_options& o) {
  arrivals a;
  std::mt19937_64 rng(42);
  std::vector<std::int64_t> next_seq(o.commodities, 0);
  a.expected.assign(o.commodities, 0);
  for (std::size_t i = 0; i < o.jobs; ++i) {
    auto index = static_cast<std::int64_t>(rng() % o.commodities);
    auto qty = static_cast<std::int64_t>(1 + rng() % 20);
    auto& e = a.expected[static_cast<std::size_t>(index)];
    if (e + qty > o.limit)
      ++a.expected_refusals;
    else
      e += qty;
    job_spec s;
    s.type = "stock_arrival";
    s.payload = {{"commodity", index}, {"qty", qty}, {"seq", next_seq[static_cast<std::size_t>(index)]++}};
    a.specs.push_back(std::move(s));
  }
  return a;
}

producer_options make_producer_options(const demo_options& o) {
  producer_options popts;
  if (o.groups) {  // the team's rule: arrivals are grouped by commodity
    grouping_rule rule;
    rule.match["type"] = "stock_arrival";
    rule.key = "commodity-{commodity}";
    popts.rules.add(rule);
  }
  return popts;
}

// What a run ended with, as the summary shows it.
struct outcome {
  std::vector<std::int64_t> stock;  // per commodity
  std::uint64_t refused = 0, overlaps = 0, inversions = 0;
  std::uint64_t completed = 0, leases_lost = 0;
  double secs = 0;
  std::vector<std::string> notes;  // lines after the jobs line
  bool failed = false;             // something else went wrong (said in notes)
};

int summarize(const demo_options& o, const arrivals& a, const outcome& r) {
  int status = r.failed ? 1 : 0;
  std::size_t exact = 0;
  std::int64_t lost_units = 0;
  for (std::size_t i = 0; i < o.commodities; ++i) {
    auto got = r.stock[i];
    if (got == a.expected[i]) ++exact;
    lost_units += std::abs(a.expected[i] - got);
  }
  auto check = [&](bool ok) {
    if (!ok) status = 1;
    return ok ? "ok" : "FAILED";
  };
  fmt::print("\n  jobs          {} ({} completed by workers, {} leases lost)\n", o.jobs, r.completed, r.leases_lost);
  for (const auto& n : r.notes) fmt::print("  {}\n", n);
  fmt::print("  groups        {}\n", o.groups ? fmt::format("{} (one per commodity)", o.commodities) : "none");
  fmt::print("  time          {:.2f} s, {:.0f} jobs/s\n", r.secs, static_cast<double>(o.jobs) / r.secs);
  fmt::print("  checks\n");
  fmt::print("    final stock exactly as expected   {:>5}/{} commodities   {}\n", exact, o.commodities,
             o.groups ? check(exact == o.commodities) : (exact == o.commodities ? "ok" : "lost updates"));
  fmt::print("    order inversions                  {:>5}                   {}\n", r.inversions,
             o.groups ? check(r.inversions == 0) : "(not grouped)");
  fmt::print("    overlapping runs of a commodity   {:>5}                   {}\n", r.overlaps,
             o.groups ? check(r.overlaps == 0) : "(not grouped)");
  fmt::print("    refused over the limit            {:>5} (serial replay: {})\n", r.refused, a.expected_refusals);
  if (!o.groups)
    fmt::print("\n  Without groups, concurrent read-yield-write runs lost {} units of stock in {} commodities.\n",
               lost_units, o.commodities - exact);
  return status;
}

int run_demo(const demo_options& o) {
  asio::io_context ctx(static_cast<int>(o.threads));
  auto store = std::make_unique<sharded_backend>(std::make_shared<memory_backend>(ctx.get_executor()), o.shards);

  auto a = make_arrivals(o);
  producer prod(*store, o.queue, make_producer_options(o));

  auto board = std::make_shared<scoreboard>(o.commodities);
  std::vector<std::unique_ptr<worker>> workers;
  for (std::size_t w = 0; w < o.workers; ++w) {
    worker_options wo;
    wo.queue = o.queue;
    wo.concurrency = o.concurrency;
    wo.id = fmt::format("demo-{}-{}", ::getpid(), w);
    wo.claim_wait = std::chrono::milliseconds(500);
    workers.push_back(std::make_unique<worker>(ctx.get_executor(), *store, wo));
    workers.back()->add_handler("stock_arrival", stock_arrival(board, o.limit));
  }

  fmt::print("jobrt demo: {} stock arrivals for {} commodities, {}, on the {} backend\n", o.jobs, o.commodities,
             o.groups ? "grouped by commodity" : "NOT grouped (--no-groups)", "embedded");
  fmt::print("  {} workers x concurrency {}, {} threads{}\n", o.workers, o.concurrency, o.threads,
             o.shards > 1 ? fmt::format(", the queue over {} shards", o.shards) : "");

  double secs = 0;
  std::exception_ptr failure;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        auto start = clock::now();
        for (auto& w : workers) w->start();
        co_await prod.enqueue_bulk(std::move(a.specs));
        asio::steady_timer tick(ctx);
        while (board->done < o.jobs) {
          progress(board->done, o.jobs, std::chrono::duration<double>(clock::now() - start).count());
          tick.expires_after(std::chrono::milliseconds(100));
          co_await tick.async_wait(asio::use_awaitable);
        }
        secs = std::chrono::duration<double>(clock::now() - start).count();
        progress(board->done, o.jobs, secs);
        end_progress();
        for (auto& w : workers) co_await w->stop(std::chrono::seconds(5));
      },
      [&](std::exception_ptr e) {
        failure = e;
        ctx.stop();
      });
  run_threads(ctx, o.threads);
  if (failure) std::rethrow_exception(failure);

  outcome r;
  for (std::size_t i = 0; i < o.commodities; ++i) r.stock.push_back(board->items[i].stock.load());
  for (auto& w : workers) {
    r.completed += w->counters().completed;
    r.leases_lost += w->counters().leases_lost;
  }
  r.refused = board->refused.load();
  r.overlaps = board->overlaps.load();
  r.inversions = board->inversions.load();
  r.secs = secs;
  return summarize(o, a, r);
}

// --- Redis: worker processes ---

asio::awaitable<void> sleep_for(std::chrono::milliseconds d) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  t.expires_after(d);
  co_await t.async_wait(asio::use_awaitable);
}

// Waits (BLPOP, no polling) until n worker processes said they are up. Returns "" when they are,
// else why not; never throws, as it races (||) against the processes' exit.
asio::awaitable<std::string> wait_ready(const redis::config& cfg, const std::string& key, std::size_t n,
                                        std::chrono::milliseconds limit) {
  redis::blocking_connection conn(co_await asio::this_coro::executor, cfg);
  conn.start();
  auto deadline = clock::now() + limit;
  std::string why_not;
  for (std::size_t i = 0; i < n && why_not.empty(); ++i) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    redis::request pop("BLPOP", key,
                       fmt::format("{:.3f}", static_cast<double>(std::max<std::int64_t>(left.count(), 1)) / 1000.0));
    pop.options.timeout = left + std::chrono::seconds(2);
    auto [ec, r] = co_await conn.async_exec(std::move(pop), asio::as_tuple(asio::use_awaitable));
    if (ec)
      why_not = fmt::format("waiting for the worker processes failed: {} {}", ec.message(), conn.last_error());
    else if (r.is_nil())
      why_not = fmt::format("{} of {} worker processes started within {} s", i, n,
                            std::chrono::duration_cast<std::chrono::seconds>(limit).count());
  }
  conn.close();
  co_return why_not;
}

std::int64_t to_int(const redis::reply& r) { return r.is_nil() ? 0 : std::stoll(r.as_string()); }

int run_demo_processes(const demo_options& o) {
  asio::io_context ctx(1);  // one thread: the children's parent-death signal follows this thread
  redis_backend store(ctx.get_executor(), seeds_of(o.redis_url));
  sharded_backend queue(store, o.shards);
  redis_state keys(o.queue);
  auto a = make_arrivals(o);
  producer prod(queue, o.queue, make_producer_options(o));
  worker_processes children(ctx.get_executor());

  fmt::print("jobrt demo: {} stock arrivals for {} commodities, {}, on the {} backend\n", o.jobs, o.commodities,
             o.groups ? "grouped by commodity" : "NOT grouped (--no-groups)", "Redis");
  fmt::print("  {} worker processes x {} worker{} x concurrency {}, {} thread{} each{}\n", o.processes, o.workers,
             o.workers == 1 ? "" : "s", o.concurrency, o.threads, o.threads == 1 ? "" : "s",
             o.shards > 1 ? fmt::format(", the queue over {} shards", o.shards) : "");

  outcome r;
  std::exception_ptr failure;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        // A clean queue for this run (the demo's state keys go with it).
        auto& conn = store.connection();
        co_await check_reachable(conn, o.redis_url);
        {  // (SCAN and UNLINK in steps: KEYS would hold the server up) every shard of an earlier run
          sharded_backend earlier(store, 0, sharded_backend::when_unknown::look);
          co_await earlier.purge_queue(o.queue);
        }
        co_await queue.shards_of(o.queue);  // (stored now, before the worker processes look)

        args worker_args{"demo-worker",
                         "--redis",
                         o.redis_url,
                         "--queue",
                         o.queue,
                         "--workers",
                         std::to_string(o.workers),
                         "--concurrency",
                         std::to_string(o.concurrency),
                         "--threads",
                         std::to_string(o.threads),
                         "--limit",
                         std::to_string(o.limit),
                         "--shards",
                         std::to_string(o.shards),
                         "--parent",
                         std::to_string(::getpid())};
        for (std::size_t p = 0; p < o.processes; ++p) children.spawn(worker_args);
        // Every worker process up before the work exists, so that all of them get some.
        auto at = co_await store.node_of(keys.ready());
        auto up =
            co_await (wait_ready(at, keys.ready(), o.processes, std::chrono::seconds(15)) || children.wait_exit());
        auto why_not = up.index() == 0 ? std::get<0>(up) : std::get<1>(up);
        if (!why_not.empty()) throw std::runtime_error(why_not);

        auto start = clock::now();
        co_await prod.enqueue_bulk(std::move(a.specs));
        queue_counts counts;
        for (;;) {
          counts = co_await queue.counts(o.queue);
          auto done = static_cast<std::size_t>(counts.completed + counts.failed);
          r.secs = std::chrono::duration<double>(clock::now() - start).count();
          progress(static_cast<std::size_t>(counts.completed), o.jobs, r.secs);
          if (done >= o.jobs) break;
          auto ended = co_await (sleep_for(std::chrono::milliseconds(100)) || children.wait_exit());
          if (ended.index() == 1) throw std::runtime_error(std::get<1>(ended));
        }
        end_progress();

        children.terminate();
        auto stopped = co_await (children.wait_all() || sleep_for(std::chrono::seconds(15)));
        if (stopped.index() == 1) {
          children.kill_all();
          r.notes.push_back("worker processes did not stop within 15 s after SIGTERM: killed");
        }
        for (auto& f : children.failures()) r.notes.push_back(f + "   FAILED");
        if (counts.failed > 0) r.notes.push_back(fmt::format("{} jobs failed   FAILED", counts.failed));
        r.failed = !r.notes.empty();

        redis::request state;
        state.push("HGETALL", keys.stock()).push("HGETALL", keys.checks()).push("LRANGE", keys.reports(), 0, -1);
        auto got = co_await store.exec(std::move(state), keys.prefix);
        const auto& parts = got.as_array();
        r.stock.assign(o.commodities, 0);
        const auto& stock = parts.at(0).as_array();
        for (std::size_t i = 0; i + 1 < stock.size(); i += 2) {
          auto index = std::stoull(stock[i].as_string());
          if (index < o.commodities) r.stock[index] = to_int(stock[i + 1]);
        }
        const auto& checks = parts.at(1).as_array();
        for (std::size_t i = 0; i + 1 < checks.size(); i += 2) {
          auto value = static_cast<std::uint64_t>(to_int(checks[i + 1]));
          if (checks[i].as_string() == "refused") r.refused = value;
          if (checks[i].as_string() == "overlaps") r.overlaps = value;
          if (checks[i].as_string() == "inversions") r.inversions = value;
        }
        // Each worker process's report: "<pid> <started> <completed> <failed> <leases lost>".
        std::vector<std::string> ran;
        std::size_t with_jobs = 0;
        for (const auto& line : parts.at(2).as_array()) {
          long long pid = 0, started = 0, completed = 0, failed = 0, lost = 0;
          if (std::sscanf(line.as_string().c_str(), "%lld %lld %lld %lld %lld", &pid, &started, &completed, &failed,
                          &lost) != 5)
            continue;
          r.completed += static_cast<std::uint64_t>(completed);
          r.leases_lost += static_cast<std::uint64_t>(lost);
          ran.push_back(std::to_string(completed));
          if (completed > 0) ++with_jobs;
        }
        r.notes.insert(r.notes.begin(), fmt::format("processes     {} of {} worker processes ran jobs ({})", with_jobs,
                                                    o.processes, fmt::join(ran, " / ")));
        // Nothing of the run is left on the server (its keys, the demo's state among them).
        co_await queue.purge_queue(o.queue);
      },
      [&](std::exception_ptr e) {
        failure = e;
        ctx.stop();
      });
  ctx.run();
  if (failure) {
    end_progress();
    std::rethrow_exception(failure);  // the worker processes are killed on the way out
  }
  return summarize(o, a, r);
}

// What `jobrt demo` and `jobrt demo-worker` were given.
struct demo_args {
  demo_options o;
  std::size_t limit = 600, parent = 0;
  CLI::Option* workers = nullptr;
  CLI::Option* processes = nullptr;
};

int run_demo_command(demo_args& a) {
  auto& o = a.o;
  o.limit = static_cast<std::int64_t>(a.limit);
  if (o.redis_url.empty()) {
    if (a.processes->count() > 0) throw usage_error("demo: --processes needs --redis");
    return run_demo(o);
  }
  if (a.workers->count() == 0) o.workers = 1;
  return run_demo_processes(o);
}

int run_demo_worker(const demo_args& a);

}  // namespace

void add_demo(CLI::App& jobrt, action& chosen) {
  auto a = std::make_shared<demo_args>();
  auto* cmd = add_command(jobrt, chosen, "demo", "stock arrivals on the embedded backend (or --redis URL)",
                          [a] { return run_demo_command(*a); });
  auto& o = a->o;
  number_option(*cmd, "--jobs", o.jobs, 1, 10'000'000, "arrivals (default 20000)");
  number_option(*cmd, "--commodities", o.commodities, 1, 1'000'000, "commodities, one group each (default 300)");
  a->workers = number_option(*cmd, "--workers", o.workers, 1, 1000,
                             "workers (default 4; with --redis, in each process, default 1)");
  number_option(*cmd, "--concurrency", o.concurrency, 1, 100'000, "jobs at once per worker (default 32)");
  number_option(*cmd, "--threads", o.threads, 1, 256, "threads running the io_context (default 2)");
  number_option(*cmd, "--limit", a->limit, 1, 1'000'000'000'000, "the most stock a commodity holds (default 600)");
  cmd->add_flag(
      "--no-groups", [&o](std::int64_t) { o.groups = false; },
      "run ungrouped: concurrent read-modify-writes lose updates");
  redis_option(*cmd, o.redis_url, "run on this server, with worker processes", false);
  a->processes = number_option(*cmd, "--processes", o.processes, 1, 64, "worker processes with --redis (default 3)");
  number_option(*cmd, "--shards", o.shards, 1, 1024, "shards the queue spreads over (default 1)");
  cmd->add_option("--queue", o.queue, "the queue, emptied before and after a run with --redis (default demo)")
      ->check(queue_name());
  cmd->footer(
      "Stock arrivals: each job reads a commodity's stock, yields, writes it back, and refuses to\n"
      "exceed the limit. Grouped by commodity (the default), the final stock of every commodity is\n"
      "exactly what a serial replay gives; --no-groups shows the lost updates grouping prevents.\n"
      "Runs on the embedded backend unless --redis URL is given: then this process enqueues and\n"
      "checks, and --processes worker processes, each with --workers workers and --threads\n"
      "threads, run the jobs with the stock kept in Redis.");

  // The worker processes of `jobrt demo --redis` (not in the help).
  auto w = std::make_shared<demo_args>();
  w->o.workers = 1;
  cmd = add_command(jobrt, chosen, "demo-worker", "", [w] { return run_demo_worker(*w); })->group("");
  redis_option(*cmd, w->o.redis_url, "", false)->required();
  cmd->add_option("--queue", w->o.queue, "")->check(queue_name());
  number_option(*cmd, "--workers", w->o.workers, 1, 1000, "");
  number_option(*cmd, "--concurrency", w->o.concurrency, 1, 100'000, "");
  number_option(*cmd, "--threads", w->o.threads, 1, 256, "");
  number_option(*cmd, "--limit", w->limit, 1, 1'000'000'000'000, "");
  number_option(*cmd, "--shards", w->o.shards, 1, 1024, "");
  number_option(*cmd, "--parent", w->parent, 0, std::numeric_limits<std::size_t>::max(), "");
}

namespace {

// The hidden worker-process side of `jobrt demo --redis`: runs the stock_arrival handler on
// Redis until SIGTERM (or SIGINT), then stops gracefully, reports its counters and exits 0.
int run_demo_worker(const demo_args& a) {
  auto& url = a.o.redis_url;
  auto& queue = a.o.queue;
  auto workers = a.o.workers, concurrency = a.o.concurrency, threads = a.o.threads;
  auto limit = static_cast<std::int64_t>(a.limit);
  auto parent = static_cast<long>(a.parent);
  if (parent != 0) {
    // Ends with the demo even when the demo cannot stop it (killed with SIGKILL).
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != static_cast<pid_t>(parent)) return 1;
  }

  asio::io_context ctx(static_cast<int>(threads));
  asio::signal_set signals(ctx, SIGTERM, SIGINT);
  redis_backend store(ctx.get_executor(), seeds_of(url));
  sharded_backend shards(store, a.o.shards);
  auto keys = std::make_shared<const redis_state>(queue);
  std::vector<std::unique_ptr<worker>> pool;
  for (std::size_t w = 0; w < workers; ++w) {
    worker_options wo;
    wo.queue = queue;
    wo.concurrency = concurrency;
    wo.id = fmt::format("demo-{}-{}", ::getpid(), w);
    wo.claim_wait = std::chrono::milliseconds(500);
    pool.push_back(std::make_unique<worker>(ctx.get_executor(), shards, wo));
    pool.back()->add_handler("stock_arrival", stock_arrival_redis(store, keys, limit));
  }

  std::exception_ptr failure;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        auto& conn = store.connection();
        co_await check_reachable(conn, url);
        for (auto& w : pool) w->start();
        co_await store.exec(redis::request("RPUSH", keys->ready(), ::getpid()), keys->prefix);
        co_await signals.async_wait(asio::use_awaitable);
        co_await stop_workers(pool, std::chrono::seconds(5));
        worker_counters total;
        for (auto& w : pool) {
          auto c = w->counters();
          total.started += c.started;
          total.completed += c.completed;
          total.failed += c.failed;
          total.leases_lost += c.leases_lost;
        }
        auto report =
            fmt::format("{} {} {} {} {}", ::getpid(), total.started, total.completed, total.failed, total.leases_lost);
        co_await store.exec(redis::request("RPUSH", keys->reports(), report), keys->prefix);
      },
      [&](std::exception_ptr e) {
        failure = e;
        ctx.stop();
      });
  run_threads(ctx, threads);
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("demo-worker {}: {}", ::getpid(), e.what()));
    }
  }
  return 0;
}

}  // namespace
}  // namespace jobrt::cli
