// `jobrt demo`: stock arrivals. Many arrivals for a few hundred commodities; each job reads the
// commodity's stock, yields, writes it back, and refuses an arrival that would exceed the limit.
// Grouped by commodity, every commodity ends exactly where a serial replay ends; ungrouped
// (--no-groups), concurrent read-modify-writes lose updates.
#include "cli.hpp"

#include <jobrt/memory_backend.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/worker.hpp>

#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

namespace jobrt::cli {
namespace {

namespace asio = boost::asio;
using clock = std::chrono::steady_clock;

struct demo_options {
  std::size_t jobs = 20000;
  std::size_t commodities = 300;
  std::size_t workers = 4;
  std::size_t concurrency = 32;
  std::size_t threads = 2;
  std::int64_t limit = 600;
  bool groups = true;
  std::string redis_url;
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

void progress(std::size_t done, std::size_t total, double secs) {
  constexpr int width = 40;
  auto filled = static_cast<int>(static_cast<double>(done) / static_cast<double>(total) * width);
  fmt::print(stderr, "\r  [{:=<{}}{:<{}}] {:3.0f}%  {}/{} jobs  {:.0f} jobs/s ", "", filled, "", width - filled,
             100.0 * static_cast<double>(done) / static_cast<double>(total), done, total,
             secs > 0 ? static_cast<double>(done) / secs : 0.0);
}

int run_demo(const demo_options& o) {
  asio::io_context ctx(static_cast<int>(o.threads));
  std::unique_ptr<backend> store;
  if (o.redis_url.empty())
    store = std::make_unique<memory_backend>(ctx.get_executor());
  else
    store = std::make_unique<redis_backend>(ctx.get_executor(), redis::config::from_url(o.redis_url));

  // The jobs: arrivals with a random commodity and quantity; seq is the arrival's rank within
  // its commodity, and the serial replay gives the expected final stock.
  std::mt19937_64 rng(42);
  std::vector<job_spec> specs;
  std::vector<std::int64_t> expected(o.commodities, 0), next_seq(o.commodities, 0);
  std::uint64_t expected_refusals = 0;
  for (std::size_t i = 0; i < o.jobs; ++i) {
    auto index = static_cast<std::int64_t>(rng() % o.commodities);
    auto qty = static_cast<std::int64_t>(1 + rng() % 20);
    auto& e = expected[static_cast<std::size_t>(index)];
    if (e + qty > o.limit)
      ++expected_refusals;
    else
      e += qty;
    job_spec s;
    s.type = "stock_arrival";
    s.payload = {{"commodity", index}, {"qty", qty}, {"seq", next_seq[static_cast<std::size_t>(index)]++}};
    specs.push_back(std::move(s));
  }

  producer_options popts;
  if (o.groups) {  // the team's rule: arrivals are grouped by commodity
    grouping_rule rule;
    rule.match["type"] = "stock_arrival";
    rule.key = "commodity-{commodity}";
    popts.rules.add(rule);
  }
  producer prod(*store, o.queue, popts);

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
             o.groups ? "grouped by commodity" : "NOT grouped (--no-groups)",
             o.redis_url.empty() ? "embedded" : "Redis");
  fmt::print("  {} workers x concurrency {}, {} threads\n", o.workers, o.concurrency, o.threads);

  int status = 0;
  double secs = 0;
  std::exception_ptr failure;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        if (!o.redis_url.empty()) {  // a clean queue for this run
          auto& conn = static_cast<redis_backend&>(*store).connection();
          auto prefix = redis_backend::key_prefix(o.queue);
          auto keys = co_await redis::exec(conn, redis::request("KEYS", prefix + "*"));
          for (const auto& k : keys.as_array()) co_await redis::exec(conn, redis::request("DEL", k.as_string()));
        }
        auto start = clock::now();
        for (auto& w : workers) w->start();
        co_await prod.enqueue_bulk(std::move(specs));
        asio::steady_timer tick(ctx);
        while (board->done < o.jobs) {
          progress(board->done, o.jobs, std::chrono::duration<double>(clock::now() - start).count());
          tick.expires_after(std::chrono::milliseconds(100));
          co_await tick.async_wait(asio::use_awaitable);
        }
        secs = std::chrono::duration<double>(clock::now() - start).count();
        progress(board->done, o.jobs, secs);
        fmt::print(stderr, "\n");
        for (auto& w : workers) co_await w->stop(std::chrono::seconds(5));
      },
      [&](std::exception_ptr e) {
        failure = e;
        ctx.stop();
      });
  std::vector<std::thread> extra;
  for (std::size_t t = 1; t < o.threads; ++t) extra.emplace_back([&] { ctx.run(); });
  ctx.run();
  for (auto& t : extra) t.join();
  if (failure) std::rethrow_exception(failure);

  std::size_t exact = 0;
  std::int64_t lost_units = 0;
  for (std::size_t i = 0; i < o.commodities; ++i) {
    auto got = board->items[i].stock.load();
    if (got == expected[i]) ++exact;
    lost_units += std::abs(expected[i] - got);
  }
  std::uint64_t completed = 0, leases_lost = 0;
  for (auto& w : workers) {
    completed += w->counters().completed;
    leases_lost += w->counters().leases_lost;
  }
  auto check = [&](bool ok) {
    if (!ok) status = 1;
    return ok ? "ok" : "FAILED";
  };
  fmt::print("\n  jobs          {} ({} completed by workers, {} leases lost)\n", o.jobs, completed, leases_lost);
  fmt::print("  groups        {}\n", o.groups ? fmt::format("{} (one per commodity)", o.commodities) : "none");
  fmt::print("  time          {:.2f} s, {:.0f} jobs/s\n", secs, static_cast<double>(o.jobs) / secs);
  fmt::print("  checks\n");
  fmt::print("    final stock exactly as expected   {:>5}/{} commodities   {}\n", exact, o.commodities,
             o.groups ? check(exact == o.commodities) : (exact == o.commodities ? "ok" : "lost updates"));
  fmt::print("    order inversions                  {:>5}                   {}\n", board->inversions.load(),
             o.groups ? check(board->inversions == 0) : "(not grouped)");
  fmt::print("    overlapping runs of a commodity   {:>5}                   {}\n", board->overlaps.load(),
             o.groups ? check(board->overlaps == 0) : "(not grouped)");
  fmt::print("    refused over the limit            {:>5} (serial replay: {})\n", board->refused.load(),
             expected_refusals);
  if (!o.groups)
    fmt::print("\n  Without groups, concurrent read-yield-write runs lost {} units of stock in {} commodities.\n",
               lost_units, o.commodities - exact);
  return status;
}

}  // namespace

int demo(const args& a) {
  demo_options o;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto& arg = a[i];
    if (arg == "--help" || arg == "-h") {
      fmt::print(
          "usage: jobrt demo [--jobs N] [--commodities N] [--workers N] [--concurrency N] [--threads N]\n"
          "                  [--limit N] [--no-groups] [--redis URL]\n"
          "Stock arrivals: each job reads a commodity's stock, yields, writes it back, and refuses to\n"
          "exceed the limit. Grouped by commodity (the default), the final stock of every commodity is\n"
          "exactly what a serial replay gives; --no-groups shows the lost updates grouping prevents.\n"
          "Runs on the embedded backend unless --redis URL is given.\n");
      return 0;
    }
    if (arg == "--no-groups")
      o.groups = false;
    else if (arg == "--jobs")
      o.jobs = number_arg(a, i);
    else if (arg == "--commodities")
      o.commodities = number_arg(a, i);
    else if (arg == "--workers")
      o.workers = number_arg(a, i);
    else if (arg == "--concurrency")
      o.concurrency = number_arg(a, i);
    else if (arg == "--threads")
      o.threads = number_arg(a, i);
    else if (arg == "--limit")
      o.limit = static_cast<std::int64_t>(number_arg(a, i));
    else if (arg == "--redis")
      o.redis_url = string_arg(a, i);
    else
      throw usage_error(fmt::format("demo: unknown option '{}'", arg));
  }
  if (o.jobs == 0 || o.commodities == 0 || o.workers == 0 || o.concurrency == 0 || o.threads == 0)
    throw usage_error("demo: --jobs, --commodities, --workers, --concurrency and --threads must be positive");
  if (!o.redis_url.empty()) redis::config::from_url(o.redis_url);  // a bad URL is a usage error
  return run_demo(o);
}

}  // namespace jobrt::cli
