// `jobrt worker` and `jobrt enqueue`.
#include "cli.hpp"

#include <jobrt/log.hpp>
#include <jobrt/metrics.hpp>
#include <jobrt/plugin.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/settings.hpp>
#include <jobrt/sharded_backend.hpp>
#include <jobrt/worker.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>

namespace jobrt::cli {
namespace {

namespace asio = boost::asio;

// SIGTERM or SIGINT before the worker listens for them (it was still loading plugins): remembered,
// so that it stops as soon as it can, cleanly, instead of dying.
volatile std::sig_atomic_t early_signal = 0;
void remember_signal(int signal) { early_signal = signal; }

// Threads running one io_context: more than a few per core only cost memory (and, by the
// thousands, fail to start).
constexpr std::size_t max_threads = 256;

// Runs `body` on a fresh io_context with a Redis backend; rethrows what it throws.
template <class Body>
void with_backend(const std::string& url, durability d, std::size_t threads, Body body) {
  asio::io_context ctx(static_cast<int>(threads));
  redis_backend_options o;
  o.durability = d;
  redis_backend store(ctx.get_executor(), seeds_of(url), o);
  std::exception_ptr failure;
  asio::co_spawn(ctx, body(ctx, store), [&](std::exception_ptr e) {
    failure = e;
    ctx.stop();
  });
  run_threads(ctx, threads);
  if (failure) std::rethrow_exception(failure);
}

// --group-rate's and --rate-limit's "MAX/MS": at most MAX starts in any MS milliseconds. `what`
// names the option in the refusal.
rate_limit parse_rate(const std::string& text, std::string_view what) {
  std::int64_t max = 0, ms = 0;
  auto whole = [](std::string_view digits, std::int64_t& n) {
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    return ec == std::errc{} && end == digits.data() + digits.size() && !digits.empty();
  };
  auto slash = text.find('/');
  if (slash == std::string::npos || !whole(std::string_view(text).substr(0, slash), max) ||
      !whole(std::string_view(text).substr(slash + 1), ms))
    throw std::invalid_argument(
        fmt::format("{} '{}' is not MAX/MS (say 10/1000: 10 starts a second at most)", what, text));
  if (max < 1 || static_cast<std::uint64_t>(max) > max_rate_starts)
    throw std::invalid_argument(fmt::format("{} '{}': MAX must be from 1 to {}", what, text, max_rate_starts));
  if (ms < 1 || ms > max_rate_window.count())
    throw std::invalid_argument(fmt::format("{} '{}': MS must be from 1 to {}", what, text, max_rate_window.count()));
  return rate_limit{static_cast<std::size_t>(max), std::chrono::milliseconds(ms)};
}

// What `jobrt worker` was given.
struct worker_args {
  std::string url = default_redis_url(), config_file, metrics_at, log_level, follow, on_failure, rate_limit;
  std::vector<std::string> plugins, queues;
  std::size_t concurrency = 10, threads = 1, burst = 4, lease_ttl_ms = 5000, grace_ms = 10000;
  std::size_t unhandled_delay_ms = 1000, unhandled_limit_ms = 900'000;
  std::size_t shards = 0;  // 0: as the queue is stored
  std::string id;
  std::string durability = "primary";
  bool log_json = false, no_schedules = false;
  CLI::Option* url_option = nullptr;
  CLI::Option* durability_option = nullptr;
  std::vector<CLI::Option*> queue_options;  // options that only queues from the command line take
};

int run_worker(worker_args& a);

}  // namespace

void add_worker(CLI::App& jobrt, action& chosen) {
  auto a = std::make_shared<worker_args>();
  auto* cmd =
      add_command(jobrt, chosen, "worker", "run handlers from plugins on a queue", [a] { return run_worker(*a); });
  // Each option but --redis also comes from an environment variable: JOBRT_ and its name.
  auto env = [](CLI::Option* o) {
    auto name = o->get_name(false, false);  // --lease-ttl
    std::string var = "JOBRT_";
    for (char ch : name.substr(2)) var += ch == '-' ? '_' : static_cast<char>(std::toupper(ch));
    return o->envname(var);
  };
  auto queue_option = [a](CLI::Option* o) {
    a->queue_options.push_back(o);
    return o;
  };
  a->url_option = redis_option(*cmd, a->url, "the server (default: redis://127.0.0.1:6379)");
  a->durability_option = env(durability_option(*cmd, a->durability));
  env(cmd->add_option("-p,--plugin", a->plugins, "a plugin's .so; give it again for another")
          ->option_text("PATH")
          ->allow_extra_args(false));
  env(cmd->add_option("-C,--config", a->config_file, "the queues and their options from FILE (docs/CONFIG.md)")
          ->option_text("FILE"));
  queue_option(env(cmd->add_option("-q,--queue", a->queues,
                                   "the queue (default: default); given more than once, a worker for\n"
                                   "each queue, all with the options below")
                       ->check(queue_name())
                       ->option_text("NAME")
                       ->allow_extra_args(false)));
  queue_option(env(number_option(*cmd, "-c,--concurrency", a->concurrency, 1, 100'000, "jobs at once (default 10)")));
  env(number_option(*cmd, "--threads", a->threads, 1, max_threads, "threads running the io_context (default 1)"));
  env(cmd->add_option("--id", a->id, "worker id (default: <host>:<pid>:<random>)")->option_text("ID"));
  queue_option(env(number_option(*cmd, "--lease-ttl", a->lease_ttl_ms, 100, 86'400'000,
                                 "lease time-to-live in ms (default 5000; renewed every third of it)")
                       ->option_text("MS")));
  queue_option(env(number_option(*cmd, "--burst", a->burst, 1, 1000, "jobs of one group in a row (default 4)")));
  queue_option(env(number_option(*cmd, "--shards", a->shards, 1, 1024,
                                 "shards the queue spreads over (default: as the queue is stored; 1 for a new one)")));
  queue_option(env(word_option(*cmd, "--follow", a->follow,
                               "after-commit (default): a group's next job starts once its\n"
                               "predecessor's end is stored; pipelined: at once, the end stored on\n"
                               "the way (a lost lease may run a job again after its follower ran)",
                               [](const std::string& t) { parse_follow_policy(t); })
                       ->option_text("POLICY")));
  queue_option(env(word_option(*cmd, "--rate-limit", a->rate_limit,
                               "start at most MAX of the queue's jobs in any MS milliseconds, over\n"
                               "every worker given the same (no bursts then; one-shard queues)",
                               [](const std::string& t) { parse_rate(t, "rate limit"); })
                       ->option_text("MAX/MS")));
  queue_option(env(word_option(*cmd, "--on-failure", a->on_failure,
                               "hold, skip or halt: what a grouped job's failure does (default hold)",
                               [](const std::string& t) { parse_failure_policy(t); })
                       ->option_text("POLICY")));
  queue_option(env(number_option(*cmd, "--unhandled-delay", a->unhandled_delay_ms, 0, 86'400'000,
                                 "a job of a type this worker has no handler for goes back, no\n"
                                 "attempt counted, for a worker that has one, after MS (default 1000)")
                       ->option_text("MS")));
  queue_option(env(number_option(*cmd, "--unhandled-limit", a->unhandled_limit_ms, 0, 86'400'000,
                                 "...and is dead-lettered once no worker has been able to run its\n"
                                 "type for MS (default 900000: 15 minutes)")
                       ->option_text("MS")));
  queue_option(env(cmd->add_flag("--no-schedules", a->no_schedules,
                                 "do not fire the queue's repeatable jobs (docs/SCHEDULES.md); other\n"
                                 "workers do, each firing once")));
  env(number_option(*cmd, "--grace", a->grace_ms, 0, 86'400'000,
                    "how long running jobs may take to finish at stop (default 10000)")
          ->option_text("MS"));
  env(word_option(*cmd, "--log-level", a->log_level, "debug, info (default), warn, error or off",
                  [](const std::string& t) { parse_log_level(t); })
          ->option_text("LEVEL"));
  env(cmd->add_flag("--log-json", a->log_json, "log one JSON object per line"));
  env(cmd->add_option("--metrics", a->metrics_at,
                      "serve Prometheus metrics at http://ADDR/metrics (ADDR: [HOST]:PORT,\n"
                      "loopback when HOST is left out; PORT 0 picks one and prints it;\n"
                      "jobrt_queue_* series are queue-wide: aggregate them with max)")
          ->option_text("ADDR"));
  cmd->footer(
      "Runs the plugins' handlers on a queue (or on each queue of the config file) until SIGTERM or\n"
      "SIGINT, then stops gracefully: no new claims, running jobs get --grace to finish, the rest\n"
      "are handed back. A second SIGTERM or SIGINT forces the stop: running jobs are cancelled at\n"
      "once and handed back (they run again, no attempt counted), and the exit code is 128 + that\n"
      "signal: 130 for SIGINT, 143 for SIGTERM (0 after a graceful stop). A server that is down or\n"
      "not ready is asked again every 10 s; one that refuses the user or password (WRONGPASS,\n"
      "NOPERM), or a host name that does not exist, is an error at once (exit 1). With --config,\n"
      "the queues' options come from the file: --queue, --concurrency and the other queue options\n"
      "are an error there and their environment variables are ignored; the file's \"redis\" wins\n"
      "over $REDIS_URL, and --redis over both.");
}

namespace {

int run_worker(worker_args& a) {
  std::signal(SIGTERM, remember_signal);
  std::signal(SIGINT, remember_signal);
  auto url = a.url;
  auto durability = durability_of(a.durability);
  auto plugins = a.plugins;
  worker_options wo;
  wo.concurrency = a.concurrency;
  wo.id = a.id;
  wo.lease_ttl = std::chrono::milliseconds(a.lease_ttl_ms);
  wo.unhandled_delay = std::chrono::milliseconds(a.unhandled_delay_ms);
  wo.unhandled_limit = std::chrono::milliseconds(a.unhandled_limit_ms);
  wo.burst = a.burst;
  wo.schedules = !a.no_schedules;
  if (!a.follow.empty()) wo.follow = parse_follow_policy(a.follow);
  if (!a.on_failure.empty()) wo.on_failure = parse_failure_policy(a.on_failure);
  if (!a.rate_limit.empty()) wo.rate_limit = parse_rate(a.rate_limit, "rate limit");
  if (!a.log_level.empty()) set_log_level(parse_log_level(a.log_level));
  if (a.log_json) set_log_json(true);
  auto threads = a.threads;
  std::chrono::milliseconds grace(a.grace_ms);
  std::vector<worker_options> queues;
  std::vector<std::size_t> shards;  // per queue
  std::map<std::string, backoff> type_backoffs;
  if (!a.config_file.empty()) {
    for (auto* o : a.queue_options)  // (their environment variables give way to the file)
      if (given_on_command_line(o))
        throw usage_error(
            fmt::format("worker: with --config, the queues' options come from the file, not {}", o->get_name()));
    auto cfg = settings::from_file(a.config_file);                // std::invalid_argument names the field: exit 1
    if (cfg.redis_url && !given_on_command_line(a.url_option)) {  // the file over $REDIS_URL
      url = *cfg.redis_url;
      check_redis_url(url);  // std::invalid_argument: exit 1, as the file's other errors
    }
    if (cfg.durability && !given_on_command_line(a.durability_option)) durability = *cfg.durability;
    plugins.insert(plugins.begin(), cfg.plugins.begin(), cfg.plugins.end());
    type_backoffs = cfg.type_backoffs;
    for (auto& q : cfg.queues) {
      queues.push_back(q.worker);
      shards.push_back(q.shards);
    }
    if (queues.empty()) throw std::invalid_argument(fmt::format("config {}: no queues", a.config_file));
  } else {
    auto names = a.queues;
    if (names.empty()) names.push_back(wo.queue);
    for (auto& name : names) {
      if (std::count(names.begin(), names.end(), name) > 1)
        throw usage_error(fmt::format("worker: --queue {} is given twice", name));
      queues.push_back(wo);
      queues.back().queue = name;
      shards.push_back(a.shards);
    }
  }
  if (plugins.empty()) throw usage_error("worker: give at least one --plugin (or \"plugins\" in the config)");
  std::optional<asio::ip::tcp::endpoint> metrics_endpoint;
  if (!a.metrics_at.empty()) {
    try {
      metrics_endpoint = parse_listen_address(a.metrics_at);
    } catch (const std::invalid_argument& e) {
      throw usage_error(fmt::format("worker: --metrics: {}", e.what()));
    }
  }

  std::vector<std::unique_ptr<plugin>> loaded;
  for (auto& path : plugins) loaded.push_back(load_plugin(path));
  // The config's settings of a type that no plugin registers would never apply: a typo, most
  // likely, so it is an error that names the types there are.
  std::set<std::string> registered;
  for (auto& p : loaded)
    for (auto& e : p->handlers()) registered.insert(e.type);
  for (auto& [type, b] : type_backoffs)
    if (!registered.contains(type))
      throw std::invalid_argument(
          fmt::format("config {}: handlers.{}: no loaded plugin registers type '{}' (they register: {})", a.config_file,
                      type, type, fmt::join(registered, ", ")));
  auto base_id = wo.id.empty() ? make_worker_id() : wo.id;
  for (std::size_t i = 0; i < queues.size(); ++i)
    queues[i].id = queues.size() == 1 ? base_id : fmt::format("{}:{}", base_id, queues[i].queue);

  int forced_by = 0;  // the signal that forced the stop, if one did
  with_backend(url, durability, threads, [&](asio::io_context& ctx, redis_backend& store) -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    asio::signal_set signals(ctx, SIGTERM, SIGINT);  // from here on a signal waits for async_wait
    // A signal before this point, or while it connects (a server that is down or paused must not
    // keep a stopping worker), ends it cleanly at once.
    int early = early_signal;
    if (early == 0) {
      log(log_level::info, "worker " + base_id, "connecting to redis at {}", address_of(url));
      // A worker may start before its server, or outlive its restart: it asks until the server
      // answers and says why each time it does not (at most once per 10 s). What waiting cannot
      // fix (a wrong password or user, a host that does not exist) ends it at once instead. An
      // ask reports as a value ("" or the final failure): the `||` below waits for a success.
      auto reachable = [&]() -> asio::awaitable<std::string> {
        asio::steady_timer next(ctx);
        for (;;) {
          next.expires_after(std::chrono::seconds(10));
          auto r = co_await ping_seeds(store.connection(), url, std::chrono::seconds(1));
          using redis::connect_failure;
          if (!r.answered && (r.failure == connect_failure::denied || r.failure == connect_failure::unresolved))
            co_return r.why;
          if (!r.answered) r = co_await ping_seeds(store.connection(), url, std::chrono::seconds(9));
          if (r.answered) co_return std::string();
          if ((co_await asio::this_coro::cancellation_state).cancelled() != asio::cancellation_type::none)
            co_return std::string();
          log(log_level::warn, "worker " + base_id, "redis at {} does not answer: {}; asking again", address_of(url),
              r.why);
          co_await next.async_wait(asio::use_awaitable);
        }
      };
      auto first = co_await (reachable() || signals.async_wait(asio::use_awaitable));
      if (first.index() == 1)
        early = std::get<1>(first);
      else if (!std::get<0>(first).empty())
        throw std::runtime_error(std::get<0>(first));  // exit 1, in the connection's words
    }
    if (early != 0) {
      log(log_level::info, "worker " + base_id, "{} before it started: stopping", signal_name(early));
      co_return;
    }
    // Each queue through its shards (one shard: the queue itself). A queue stored with another
    // number of shards than the one given ends the worker here, before it starts, and so does a
    // rate limit on a queue of several (its claims would be refused again and again).
    std::vector<std::unique_ptr<sharded_backend>> sharded;
    for (std::size_t i = 0; i < queues.size(); ++i) {
      sharded.push_back(std::make_unique<sharded_backend>(store, shards[i]));
      auto n = co_await sharded.back()->shards_of(queues[i].queue);
      if (n > 1 && queues[i].rate_limit)
        throw std::invalid_argument(
            fmt::format("queue '{}' has {} shards: a rate limit (--rate-limit, a queue's "
                        "rate_limit) needs a queue of one shard",
                        queues[i].queue, n));
    }
    std::vector<std::unique_ptr<jobrt::worker>> pool;
    std::string types;
    for (auto& p : loaded)
      for (auto& e : p->handlers()) types += (types.empty() ? "" : ", ") + e.type;
    for (std::size_t i = 0; i < queues.size(); ++i) {
      pool.push_back(std::make_unique<jobrt::worker>(ctx.get_executor(), *sharded[i], queues[i]));
      for (auto& p : loaded) {
        for (auto& e : p->handlers()) {  // the config's backoff for a type wins over the plugin's
          auto b = type_backoffs.find(e.type);
          auto& h = e.h;
          if (b != type_backoffs.end())
            pool.back()->add_handler(e.type, h, b->second);
          else if (e.retry_backoff)
            pool.back()->add_handler(e.type, h, *e.retry_backoff);
          else
            pool.back()->add_handler(e.type, h);
        }
      }
    }
    std::unique_ptr<metrics_server> metrics;
    // A queue's counts for a scrape; none when the backend fails (said in the log, unless it
    // failed for being cut short at 2 s: the scrape says that).
    auto counts_of = [&](std::size_t i) -> asio::awaitable<std::optional<queue_counts>> {
      std::string failure;
      try {
        co_return co_await sharded[i]->counts(queues[i].queue);
      } catch (const std::exception& e) {
        failure = e.what();
      }
      if ((co_await asio::this_coro::cancellation_state).cancelled() == asio::cancellation_type::none)
        log(log_level::warn, "worker " + base_id, "metrics: the counts of queue {}: {}", queues[i].queue, failure);
      co_return std::nullopt;
    };
    if (metrics_endpoint) {
      metrics = std::make_unique<metrics_server>(
          ctx.get_executor(), *metrics_endpoint, [&]() -> asio::awaitable<std::string> {
            std::vector<queue_metrics> all;
            for (std::size_t i = 0; i < pool.size(); ++i) {
              queue_metrics q;
              q.queue = queues[i].queue;
              q.workers.push_back(pool[i]->metrics());
              // (Counters: no walk of the queue. Within 2 s: with the server out of reach the
              // scrape still answers, with this process's series, and holds no connection.)
              asio::steady_timer limit(ctx, std::chrono::seconds(2));
              auto got = co_await (counts_of(i) || limit.async_wait(asio::use_awaitable));
              if (got.index() == 0)
                q.counts = std::move(std::get<0>(got));
              else
                log(log_level::warn, "worker " + base_id, "metrics: the counts of queue {} got no answer within 2 s",
                    q.queue);
              all.push_back(std::move(q));
            }
            co_return prometheus_text(all);
          });
      metrics->start();
      auto at = metrics->local_endpoint();
      log(log_level::info, "worker " + base_id, "metrics at http://{}:{}/metrics",
          at.address().is_v6() ? "[" + at.address().to_string() + "]" : at.address().to_string(), at.port());
    }
    for (std::size_t i = 0; i < pool.size(); ++i) {
      pool[i]->start();
      log(log_level::info, "worker " + queues[i].id, "running {} on queue {} (concurrency {})", types, queues[i].queue,
          queues[i].concurrency);
    }
    int signal = co_await signals.async_wait(asio::use_awaitable);
    if (metrics) metrics->stop();
    log(log_level::info, "worker " + base_id, "{}: stopping (grace {} ms; {} again forces it)", signal_name(signal),
        grace.count(), signal_name(signal));
    auto force_on_signal = [&]() -> asio::awaitable<void> {
      forced_by = co_await signals.async_wait(asio::use_awaitable);
      log(log_level::warn, "worker " + base_id,
          "{} again: forcing the stop: running jobs are cancelled and handed back", signal_name(forced_by));
      co_await stop_workers(pool, std::chrono::milliseconds(0));  // cuts the grace under way short
    };
    co_await (stop_workers(pool, grace) || force_on_signal());
    if (metrics) co_await metrics->async_stop();  // a scrape under way reads the workers: it ends first
    for (std::size_t i = 0; i < pool.size(); ++i) {
      auto c = pool[i]->counters();
      log(log_level::info, "worker " + queues[i].id,
          "stopped: {} started, {} completed, {} retried, {} failed, {} leases lost, {} handed back", c.started,
          c.completed, c.retried, c.failed, c.leases_lost, c.released);
    }
  });
  return forced_by == 0 ? 0 : 128 + forced_by;  // as a shell reports a process a signal ended
}

// One line of an enqueue file; std::invalid_argument says what is wrong with it (the caller
// names the line).
job_spec spec_from_line(const std::string& line) {
  boost::system::error_code ec;
  auto v = boost::json::parse(line, ec);
  if (ec) throw std::invalid_argument(fmt::format("not JSON: {}", ec.message()));
  return job_spec_from_json(v);
}

// What `jobrt enqueue` was given.
struct enqueue_args {
  std::string url = default_redis_url(), queue = "default", file, config_file, payload, on_failure;
  job_spec base;
  std::size_t count = 0, groups = 0, delay_ms = 0, timeout_ms = 0, max_attempts = 3, keep_ms = 0, wait_s = 0;
  std::size_t max_group_size = 0;     // 0: none given
  std::string group_rate;             // "MAX/MS", "" none given
  std::size_t group_concurrency = 0;  // 0: none given
  std::size_t group_weight = 0;       // 0: none given
  std::size_t shards = 0;             // 0: as the queue is stored
  std::string group, durability = "primary";
  bool json = false;
  CLI::Option* url_option = nullptr;
  CLI::Option* durability_option = nullptr;
  CLI::Option* group_option = nullptr;
  CLI::Option* payload_option = nullptr;
  std::vector<CLI::Option*> job_options;  // one job's options, or the generated jobs'
};

int run_enqueue(enqueue_args& a);

}  // namespace

void add_enqueue(CLI::App& jobrt, action& chosen) {
  auto a = std::make_shared<enqueue_args>();
  auto* cmd = add_command(jobrt, chosen, "enqueue", "put jobs on a queue: one, a JSON-lines file, or N generated",
                          [a] { return run_enqueue(*a); });
  a->url_option = redis_option(*cmd, a->url, "the server (default: redis://127.0.0.1:6379)");
  a->durability_option = durability_option(*cmd, a->durability)->envname("JOBRT_DURABILITY");
  cmd->add_option("-q,--queue", a->queue, "the queue (default: default)")
      ->envname("JOBRT_QUEUE")
      ->check(queue_name())
      ->option_text("NAME");
  cmd->add_option("-C,--config", a->config_file, "the queue's grouping rules (and the server) from a worker config")
      ->option_text("FILE");
  cmd->add_option("-f,--file", a->file, "one job per line (JSON); - reads standard input")->option_text("FILE");
  number_option(*cmd, "-n,--count", a->count, 1, 100'000'000, "N generated jobs");
  number_option(*cmd, "--groups", a->groups, 1, 100'000'000, "spread the generated jobs over groups g0..g(G-1)")
      ->option_text("G");
  number_option(*cmd, "--shards", a->shards, 1, 1024,
                "shards the queue spreads over (default: as the queue is stored; 1 for a new one)")
      ->envname("JOBRT_SHARDS");
  number_option(*cmd, "--keep", a->keep_ms, 0, static_cast<std::size_t>(max_job_keep.count()),
                "keep the jobs' status, to find them by id (the dashboard), while they wait and MS after they "
                "complete (a line's \"keep_ms\" overrides it)")
      ->option_text("MS");
  number_option(*cmd, "--max-group-size", a->max_group_size, 1, max_group_size_limit,
                "refuse a grouped job (and its batch) whose group would then hold more than N jobs (a line's "
                "\"max_group_size\" overrides it)")
      ->option_text("N");
  word_option(*cmd, "--group-rate", a->group_rate,
              "start at most MAX jobs of a group in any MS milliseconds (a rule's \"rate\" and a line's "
              "\"group_rate\" override it)",
              [](const std::string& t) { parse_rate(t, "group rate"); })
      ->option_text("MAX/MS");
  number_option(*cmd, "--group-concurrency", a->group_concurrency, 1, max_group_concurrency,
                "let up to N jobs of a group run at once, started in enqueue order (a rule's \"concurrency\" "
                "and a line's \"group_concurrency\" override it)")
      ->option_text("N");
  number_option(*cmd, "--group-weight", a->group_weight, 1, max_group_weight,
                "give each group W times an unweighted group's share of the workers when groups wait for them "
                "(a rule's \"weight\" and a line's \"group_weight\" override it)")
      ->option_text("W");
  number_option(*cmd, "--wait", a->wait_s, 1, 86'400,
                "wait up to S seconds for the job's end and print it (its result, or its error); --json: "
                "{\"queue\", \"id\", \"duplicate\", \"status\"}")
      ->option_text("S");
  cmd->add_flag("--json", a->json, "print JSON: {\"id\", \"duplicate\"} for one job, else the counts");
  auto job_option = [&](CLI::Option* o) {
    a->job_options.push_back(o->group("job options (one job, and the generated jobs')"));
    return o;
  };
  job_option(cmd->add_option("-t,--type", a->base.type, "the job's type (its handler)")->option_text("TYPE"));
  a->payload_option =
      job_option(cmd->add_option("--payload", a->payload, "the job's payload, JSON; - reads it from standard input")
                     ->option_text("JSON"));
  a->group_option =
      job_option(cmd->add_option("-g,--group", a->group, "its group: one at a time, in order")->option_text("G"));
  job_option(cmd->add_option("--id", a->base.id, "its id: a pending job with this id makes it a duplicate")
                 ->option_text("ID"));
  job_option(
      number_option(*cmd, "--delay", a->delay_ms, 0, 999'999'999'999'999, "start it after MS")->option_text("MS"));
  job_option(
      number_option(*cmd, "--max-attempts", a->max_attempts, 1, 1'000'000, "runs before it is dead (default 3)"));
  job_option(
      number_option(*cmd, "--timeout", a->timeout_ms, 0, 999'999'999'999'999, "cancel a run after MS (default 0: none)")
          ->option_text("MS"));
  job_option(
      cmd->add_option(
             "--priority", a->base.priority,
             "-2 to 2 (default 0): workers take higher ones first (a grouped job's orders its group while it is next)")
          ->check(CLI::Range(-max_priority, max_priority))
          ->option_text("P"));
  job_option(word_option(*cmd, "--on-failure", a->on_failure, "hold, skip or halt: what its failure does",
                         [](const std::string& t) { parse_failure_policy(t); })
                 ->option_text("POLICY"));
  cmd->footer(
      "Puts one job (--type), one per line of a JSON-lines file (--file), or N generated (--count N\n"
      "--type TYPE) and prints the job's id, or a count. The generated jobs' payload gets \"n\": the\n"
      "job's number. A JSON line: {\"type\", \"payload\", \"group\", \"id\", \"delay_ms\",\n"
      "\"max_attempts\", \"timeout_ms\", \"on_failure\", \"keep_ms\", \"max_group_size\",\n"
      "\"group_rate\": {\"max\", \"window_ms\"}, \"group_concurrency\", \"group_weight\", \"priority\"}. The\n"
      "whole file is checked before any job is stored: an error names its line (FILE:LINE: ...)\n"
      "and nothing is enqueued. A job may be at most 1 MiB (1048576 bytes) once encoded, payload\n"
      "included. With --wait S (one job; kept at least 60 s), the exit code is 0 when it completed,\n"
      "1 when it went to the dead letters, 3 when it had not ended, 4 when it cannot be found (a\n"
      "pending duplicate enqueued without a keep), 5 when it was cancelled (jobrt cancel).");
}

namespace {

// `enqueue --wait`: the job's end as `jobrt job` prints it (its id came before the wait; --json:
// the queue, id, duplicate and its status's object), and the exit code: 0 done, 1 dead, 3 not
// ended when the wait ran out, 4 not found (a duplicate of a job enqueued without a keep), 5
// cancelled.
int print_end(const std::string& queue, const enqueue_result& r, const std::optional<job_status>& s, std::size_t wait_s,
              bool json) {
  bool over = s && (s->status == job_status::state::done || s->status == job_status::state::dead ||
                    s->status == job_status::state::cancelled);
  if (json) {
    boost::json::object o;
    o["queue"] = queue;
    o["id"] = r.id;
    o["duplicate"] = r.duplicate;
    o["status"] = s ? boost::json::value(to_json(*s)) : boost::json::value(nullptr);
    fmt::print("{}\n", boost::json::serialize(o));
  } else if (s) {
    fmt::print("state {}\n", to_string(s->status));
    if (!s->result.empty()) fmt::print("result {}\n", s->result);
    if (s->dead) fmt::print("error {}\n", s->dead->error);
  }
  if (!s) {
    fmt::print(stderr, "jobrt: enqueue: job {} cannot be found to wait for{}\n", r.id,
               r.duplicate ? ": a job of that id was pending already, enqueued without a keep" : "");
    return 4;
  }
  if (!over) {
    fmt::print(stderr, "jobrt: enqueue: job {} is still {} after {} s\n", r.id, to_string(s->status), wait_s);
    return 3;
  }
  return s->status == job_status::state::done ? 0 : s->status == job_status::state::dead ? 1 : 5;
}

int run_enqueue(enqueue_args& a) {
  auto url = a.url;
  auto durability = durability_of(a.durability);
  auto& queue = a.queue;
  auto& file = a.file;
  auto& config_file = a.config_file;
  auto count = a.count, groups = a.groups;
  job_spec base = a.base;
  base.delay = std::chrono::milliseconds(a.delay_ms);
  base.timeout = std::chrono::milliseconds(a.timeout_ms);
  base.max_attempts = static_cast<int>(a.max_attempts);
  if (!a.on_failure.empty()) base.on_failure = parse_failure_policy(a.on_failure);
  if (a.group_option->count() > 0) base.group = a.group;
  bool has_payload = a.payload_option->count() > 0;
  if (has_payload) {
    auto text = a.payload;
    if (text == "-") {
      std::ifstream unused;
      auto& in = open_input("-", unused, "enqueue");
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    try {
      base.payload = producer::parse_payload(text);
    } catch (const std::invalid_argument& e) {
      throw usage_error(fmt::format("enqueue: --payload: {}", e.what()));
    }
  }
  bool job_options = false;
  for (auto* o : a.job_options) job_options = job_options || o->count() > 0;
  if (!file.empty() && count > 0) throw usage_error("enqueue: give --file or --count, not both");
  if (file.empty() && base.type.empty()) throw usage_error("enqueue: --type is required");
  if (groups > 0 && count == 0) throw usage_error("enqueue: --groups needs --count");
  if (count > 0 && !base.id.empty()) throw usage_error("enqueue: --id names one job; it cannot go with --count");
  if (!file.empty() && job_options) throw usage_error("enqueue: with --file, each line gives its job's options");
  if (file == "-" && a.payload == "-") throw usage_error("enqueue: --file - and --payload - both read standard input");
  if (a.wait_s > 0 && (!file.empty() || count > 0))
    throw usage_error("enqueue: --wait waits for one job: not with --file or --count");
  if (file.empty()) {
    try {
      producer::check(base);  // what the job options say, before anything connects
    } catch (const std::invalid_argument& e) {
      throw usage_error(fmt::format("enqueue: {}", e.what()));
    }
  }
  producer_options po;
  po.keep = std::chrono::milliseconds(a.keep_ms);
  po.max_group_size = a.max_group_size;
  if (!a.group_rate.empty()) po.group_rate = parse_rate(a.group_rate, "group rate");
  if (a.group_concurrency != 0) po.group_concurrency = a.group_concurrency;
  if (a.group_weight != 0) po.group_weight = a.group_weight;
  if (a.wait_s > 0)
    po.keep = std::max<std::chrono::milliseconds>(po.keep, std::chrono::seconds(60));  // (found once it ended)
  if (!config_file.empty()) {
    auto cfg = settings::from_file(config_file);
    if (cfg.redis_url && !given_on_command_line(a.url_option)) {  // the file over $REDIS_URL
      url = *cfg.redis_url;
      check_redis_url(url);
    }
    if (cfg.durability && !given_on_command_line(a.durability_option)) durability = *cfg.durability;
    std::string names;  // the queue's grouping rules are the reason for --config: it must be there
    bool found = false;
    for (auto& q : cfg.queues) {
      if (q.worker.queue == queue) {
        po.rules = q.rules;
        if (q.shards != 0 && a.shards == 0) a.shards = q.shards;
        if (q.max_group_size != 0 && a.max_group_size == 0) po.max_group_size = q.max_group_size;
        if (q.group_rate && a.group_rate.empty()) po.group_rate = q.group_rate;
        if (a.group_concurrency == 0) po.group_concurrency = q.group_concurrency;
        if (a.group_weight == 0) po.group_weight = q.group_weight;
        found = true;
      }
      names += (names.empty() ? "" : ", ") + q.worker.queue;
    }
    if (!found)
      throw usage_error(fmt::format("enqueue: queue {} is not in config {} (its queues: {}); give --queue", queue,
                                    config_file, names));
  }

  // Every job is built and checked (its encoded size too) before anything is stored: the jobs go
  // in several calls, and one refused late would leave the earlier ones stored.
  std::vector<job_spec> specs;
  if (!file.empty()) {
    std::ifstream opened;
    std::istream& in = open_input(file, opened, "enqueue");
    auto name = file == "-" ? std::string("stdin") : file;
    std::string line;
    for (std::size_t n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      try {
        specs.push_back(spec_from_line(line));
        producer::check(specs.back(), po);
      } catch (const std::invalid_argument& e) {
        throw std::runtime_error(fmt::format("enqueue: {}:{}: {}; nothing was enqueued", name, n, e.what()));
      }
    }
    if (in.bad()) throw std::runtime_error(fmt::format("enqueue: cannot read {}; nothing was enqueued", name));
  } else if (count > 0) {
    specs.reserve(count);
    for (std::size_t n = 0; n < count; ++n) {
      job_spec s = base;
      if (!has_payload) s.payload = boost::json::object();
      if (s.payload.is_object()) s.payload.as_object()["n"] = n;
      if (groups > 0) s.group = fmt::format("g{}", n % groups);
      specs.push_back(std::move(s));
    }
  } else {
    specs.push_back(base);
  }

  bool tty = ::isatty(STDERR_FILENO) == 1 && specs.size() > 1;
  std::vector<enqueue_result> results;
  std::optional<job_status> ended;  // --wait: the job's status at its end, or when the wait ran out
  with_backend(url, durability, 1, [&](asio::io_context&, redis_backend& store) -> asio::awaitable<void> {
    co_await check_reachable(store.connection(), url);
    sharded_backend sharded(store, a.shards);
    co_await sharded.shards_of(queue);  // (another number stored: refused before anything is sent)
    producer p(sharded, queue, po);
    // One bulk call per step, and on a terminal a redrawn progress bar after each: about 1% a
    // step, in batches that still cost few round trips.
    auto step = std::clamp<std::size_t>(specs.size() / 100, 1000, 10000);
    auto began = std::chrono::steady_clock::now();
    for (std::size_t first = 0; first < specs.size(); first += step) {
      auto last = std::min(specs.size(), first + step);
      std::vector<job_spec> part(std::make_move_iterator(specs.begin() + static_cast<std::ptrdiff_t>(first)),
                                 std::make_move_iterator(specs.begin() + static_cast<std::ptrdiff_t>(last)));
      std::vector<enqueue_result> done;
      try {
        done = co_await p.enqueue_bulk(std::move(part));
      } catch (const partial_enqueue& e) {  // counted in this step: add the steps before it
        throw std::runtime_error(fmt::format("enqueue: the first {} of {} jobs are stored, then: {}",
                                             first + e.stored(), specs.size(), e.what()));
      } catch (const std::exception& e) {
        if (first == 0) throw;
        throw std::runtime_error(
            fmt::format("enqueue: the first {} of {} jobs are stored, then: {}", first, specs.size(), e.what()));
      }
      results.insert(results.end(), done.begin(), done.end());
      if (tty) {
        std::chrono::duration<double> took = std::chrono::steady_clock::now() - began;
        fmt::print(stderr, "\r[{:<40}] {:3}%  {}/{}  {:.0f} jobs/s", std::string(40 * last / specs.size(), '#'),
                   100 * last / specs.size(), last, specs.size(), static_cast<double>(last) / took.count());
      }
    }
    if (tty) fmt::print(stderr, "\n");
    if (a.wait_s > 0) {
      if (!a.json) {  // (the id first: an interrupted wait leaves it on the screen)
        fmt::print("{}{}\n", results.at(0).id, results.at(0).duplicate ? " (duplicate: already pending)" : "");
        std::fflush(stdout);
      }
      ended = co_await p.wait(results.at(0).id, std::chrono::seconds(a.wait_s));
    }
  });
  if (a.wait_s > 0) return print_end(queue, results.at(0), ended, a.wait_s, a.json);
  std::size_t duplicates = 0;
  for (auto& r : results) duplicates += r.duplicate ? 1 : 0;
  if (a.json && results.size() == 1 && a.count == 0 && file.empty())
    fmt::print("{}\n", boost::json::serialize(boost::json::object{
                           {"queue", queue}, {"id", results[0].id}, {"duplicate", results[0].duplicate}}));
  else if (a.json)
    fmt::print("{}\n", boost::json::serialize(boost::json::object{
                           {"queue", queue}, {"enqueued", results.size() - duplicates}, {"duplicates", duplicates}}));
  else if (results.size() == 1)
    fmt::print("{}{}\n", results[0].id, results[0].duplicate ? " (duplicate: already pending)" : "");
  else
    fmt::print("enqueued {} jobs on {} ({} duplicates)\n", results.size() - duplicates, queue, duplicates);
  return 0;
}

}  // namespace
}  // namespace jobrt::cli
