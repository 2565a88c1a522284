// `jobrt worker` and `jobrt enqueue`.
#include "cli.hpp"

#include <jobrt/log.hpp>
#include <jobrt/metrics.hpp>
#include <jobrt/plugin.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/settings.hpp>
#include <jobrt/worker.hpp>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/parse.hpp>

#include <unistd.h>

#include <algorithm>
#include <csignal>
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

const char* signal_name(int signal) { return signal == SIGINT ? "SIGINT" : "SIGTERM"; }

// A file to read lines from; a directory or an unreadable path is an error naming it.
std::ifstream open_file(const std::string& path, std::string_view command) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw std::runtime_error(fmt::format("{}: {} is a directory, not a file", command, path));
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("{}: cannot open {}", command, path));
  return in;
}

// Threads running one io_context: more than a few per core only cost memory (and, by the
// thousands, fail to start).
constexpr std::size_t max_threads = 256;

// Runs `body` on a fresh io_context with a Redis backend; rethrows what it throws.
template <class Body>
void with_backend(const std::string& url, std::size_t threads, Body body) {
  asio::io_context ctx(static_cast<int>(threads));
  redis_backend store(ctx.get_executor(), redis::config::from_url(url));
  std::exception_ptr failure;
  asio::co_spawn(ctx, body(ctx, store), [&](std::exception_ptr e) {
    failure = e;
    ctx.stop();
  });
  run_threads(ctx, threads);
  if (failure) std::rethrow_exception(failure);
}

constexpr const char* worker_usage =
    "usage: jobrt worker --plugin PATH [--plugin PATH ...] [options]\n"
    "       jobrt worker --config FILE [--plugin PATH ...] [--redis URL] [--threads N] [--grace MS]\n"
    "Runs the plugins' handlers on a queue (or on each queue of the config file, see\n"
    "docs/CONFIG.md) until SIGTERM or SIGINT, then stops gracefully: no new claims, running jobs\n"
    "get --grace to finish, the rest are handed back. A second SIGTERM or SIGINT forces the stop:\n"
    "running jobs are cancelled at once and handed back (they run again, no attempt counted), and the\n"
    "exit code is 128 + that signal: 130 for SIGINT, 143 for SIGTERM (0 after a graceful stop).\n"
    "A server that is down or not ready is asked again every 10 s; one that refuses the user or\n"
    "password (WRONGPASS, NOPERM), or a host name that does not exist, is an error at once (exit 1).\n"
    "  --redis URL          the server (default: $REDIS_URL, else redis://127.0.0.1:6379)\n"
    "  --queue NAME         (default: default); given more than once, a worker for each queue,\n"
    "                       all with the options below\n"
    "  --concurrency N      jobs at once, 1 to 100000 (default 10)\n"
    "  --threads N          threads running the io_context, 1 to 256 (default 1)\n"
    "  --id ID              worker id (default: <host>:<pid>:<random>)\n"
    "  --lease-ttl MS       lease time-to-live, 100 to 86400000 (default 5000; renewed every\n"
    "                       third of it)\n"
    "  --burst N            jobs of one group in a row, 1 to 1000 (default 4)\n"
    "  --follow POLICY      after-commit (default): a group's next job starts once its\n"
    "                       predecessor's end is stored; pipelined: at once, the end stored on\n"
    "                       the way (a lost lease may run a job again after its follower ran)\n"
    "  --on-failure POLICY  hold, skip or halt: what a grouped job's failure does (default hold)\n"
    "  --unhandled-delay MS a job of a type this worker has no handler for goes back, no attempt\n"
    "                       counted, for a worker that has one, after MS (default 1000)\n"
    "  --unhandled-limit MS ...and is dead-lettered once no worker has been able to run its type\n"
    "                       for MS (default 900000: 15 minutes)\n"
    "  --grace MS           how long running jobs may take to finish at stop (default 10000)\n"
    "  --log-level LEVEL    debug, info (default), warn, error or off\n"
    "  --log-json           log one JSON object per line\n"
    "  --metrics ADDR       serve Prometheus metrics at http://ADDR/metrics (ADDR: [HOST]:PORT,\n"
    "                       loopback when HOST is left out; PORT 0 picks one and prints it;\n"
    "                       jobrt_queue_* series are queue-wide: aggregate them with max)\n";

}  // namespace

int worker_command(const args& a) {
  std::signal(SIGTERM, remember_signal);
  std::signal(SIGINT, remember_signal);
  std::string url = default_redis_url();
  bool url_given = false;
  std::vector<std::string> plugins;
  std::string config_file, metrics_at;
  bool queue_options = false;  // options that only queues from the command line take
  std::vector<std::string> queue_names;
  worker_options wo;
  std::size_t threads = 1;
  std::chrono::milliseconds grace{10000};
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto& arg = a[i];
    if (arg == "--help" || arg == "-h") {
      fmt::print("{}", worker_usage);
      return 0;
    } else if (arg == "--redis") {
      url = string_arg(a, i);
      url_given = true;
    } else if (arg == "--config") {
      config_file = string_arg(a, i);
    } else if (arg == "--metrics") {
      metrics_at = string_arg(a, i);
    } else if (arg == "--log-level") {
      try {
        set_log_level(parse_log_level(string_arg(a, i)));
      } catch (const std::invalid_argument& e) {
        throw usage_error(fmt::format("worker: --log-level: {}", e.what()));
      }
    } else if (arg == "--log-json") {
      set_log_json(true);
    } else if (arg == "--queue") {
      queue_names.push_back(string_arg(a, i));
      queue_options = true;
    } else if (arg == "--plugin") {
      plugins.push_back(string_arg(a, i));
    } else if (arg == "--concurrency") {
      wo.concurrency = number_arg(a, i, 1, 100'000);
      queue_options = true;
    } else if (arg == "--threads") {
      threads = number_arg(a, i, 1, max_threads);
    } else if (arg == "--id") {
      wo.id = string_arg(a, i);
    } else if (arg == "--lease-ttl") {
      wo.lease_ttl = std::chrono::milliseconds(number_arg(a, i, 100, 86'400'000));
      queue_options = true;
    } else if (arg == "--unhandled-delay") {
      wo.unhandled_delay = std::chrono::milliseconds(number_arg(a, i, 0, 86'400'000));
      queue_options = true;
    } else if (arg == "--unhandled-limit") {
      wo.unhandled_limit = std::chrono::milliseconds(number_arg(a, i, 0, 86'400'000));
      queue_options = true;
    } else if (arg == "--burst") {
      wo.burst = number_arg(a, i, 1, 1000);
      queue_options = true;
    } else if (arg == "--follow") {
      try {
        wo.follow = parse_follow_policy(string_arg(a, i));
      } catch (const std::invalid_argument& e) {
        throw usage_error(fmt::format("worker: --follow: {}", e.what()));
      }
      queue_options = true;
    } else if (arg == "--on-failure") {
      try {
        wo.on_failure = parse_failure_policy(string_arg(a, i));
      } catch (const std::invalid_argument& e) {
        throw usage_error(fmt::format("worker: --on-failure: {}", e.what()));
      }
      queue_options = true;
    } else if (arg == "--grace") {
      grace = std::chrono::milliseconds(number_arg(a, i, 0, 86'400'000));
    } else {
      throw usage_error(fmt::format("worker: unknown option '{}'", arg));
    }
  }
  std::vector<worker_options> queues;
  std::map<std::string, backoff> type_backoffs;
  if (!config_file.empty()) {
    if (queue_options)
      throw usage_error(
          "worker: with --config, the queues' options come from the file (not --queue, --concurrency, ...)");
    auto cfg = settings::from_file(config_file);  // std::invalid_argument names the field: exit 1
    if (cfg.redis_url && !url_given) url = *cfg.redis_url;
    plugins.insert(plugins.begin(), cfg.plugins.begin(), cfg.plugins.end());
    type_backoffs = cfg.type_backoffs;
    for (auto& q : cfg.queues) queues.push_back(q.worker);
    if (queues.empty()) throw std::invalid_argument(fmt::format("config {}: no queues", config_file));
  } else {
    if (queue_names.empty()) queue_names.push_back(wo.queue);
    for (auto& name : queue_names) {
      if (name.empty()) throw usage_error("worker: --queue is empty");
      if (std::count(queue_names.begin(), queue_names.end(), name) > 1)
        throw usage_error(fmt::format("worker: --queue {} is given twice", name));
      queues.push_back(wo);
      queues.back().queue = name;
    }
  }
  if (plugins.empty()) throw usage_error("worker: give at least one --plugin (or \"plugins\" in the config)");
  check_url(url);
  std::optional<asio::ip::tcp::endpoint> metrics_endpoint;
  if (!metrics_at.empty()) {
    try {
      metrics_endpoint = parse_listen_address(metrics_at);
    } catch (const std::invalid_argument& e) {
      throw usage_error(fmt::format("worker: --metrics: {}", e.what()));
    }
  }

  std::vector<std::unique_ptr<plugin>> loaded;
  for (auto& path : plugins) loaded.push_back(load_plugin(path));
  auto base_id = wo.id.empty() ? make_worker_id() : wo.id;
  for (std::size_t i = 0; i < queues.size(); ++i)
    queues[i].id = queues.size() == 1 ? base_id : fmt::format("{}:{}", base_id, queues[i].queue);

  int forced_by = 0;  // the signal that forced the stop, if one did
  with_backend(url, threads, [&](asio::io_context& ctx, redis_backend& store) -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    asio::signal_set signals(ctx, SIGTERM, SIGINT);  // from here on a signal waits for async_wait
    // A signal before this point, or while it connects (a server that is down or paused must not
    // keep a stopping worker), ends it cleanly at once.
    int early = early_signal;
    if (early == 0) {
      log(log_level::info, "worker " + base_id, "connecting to redis at {}", redis::config::from_url(url).address());
      // A worker may start before its server, or outlive its restart: it asks until the server
      // answers and says why each time it does not (at most once per 10 s). What waiting cannot
      // fix (a wrong password or user, a host that does not exist) ends it at once instead. An
      // ask reports as a value ("" or the final failure): the `||` below waits for a success.
      auto reachable = [&]() -> asio::awaitable<std::string> {
        asio::steady_timer next(ctx);
        for (;;) {
          next.expires_after(std::chrono::seconds(10));
          auto r = co_await ping_within(store.connection(), std::chrono::seconds(1));
          using redis::connect_failure;
          if (!r.answered && (r.failure == connect_failure::denied || r.failure == connect_failure::unresolved))
            co_return r.why;
          if (!r.answered) r = co_await ping_within(store.connection(), std::chrono::seconds(9));
          if (r.answered) co_return std::string();
          if ((co_await asio::this_coro::cancellation_state).cancelled() != asio::cancellation_type::none)
            co_return std::string();
          log(log_level::warn, "worker " + base_id, "redis at {} does not answer: {}; asking again",
              redis::config::from_url(url).address(), r.why);
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
    std::vector<std::unique_ptr<jobrt::worker>> pool;
    std::string types;
    for (auto& p : loaded)
      for (auto& e : p->handlers()) types += (types.empty() ? "" : ", ") + e.type;
    for (auto& q : queues) {
      pool.push_back(std::make_unique<jobrt::worker>(ctx.get_executor(), store, q));
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
    if (metrics_endpoint) {
      metrics = std::make_unique<metrics_server>(
          ctx.get_executor(), *metrics_endpoint, [&]() -> asio::awaitable<std::string> {
            std::vector<queue_metrics> all;
            for (std::size_t i = 0; i < pool.size(); ++i) {
              queue_metrics q;
              q.queue = queues[i].queue;
              q.workers.push_back(pool[i]->metrics());
              q.counts = co_await store.counts(q.queue);  // counters: no walk of the queue
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
    auto stop_all = [&](std::chrono::milliseconds within) -> asio::awaitable<void> {  // all drain at once
      auto ex = ctx.get_executor();
      using stop_op = decltype(asio::co_spawn(ex, pool.front()->stop(within), asio::deferred));
      std::vector<stop_op> ops;
      for (auto& w : pool) ops.push_back(asio::co_spawn(ex, w->stop(within), asio::deferred));
      // Bound to no cancellation slot: the `||` below must not cut a stop short (it would leave
      // the worker half stopped); a forced stop ends it with a second stop of no grace.
      co_await asio::experimental::make_parallel_group(std::move(ops))
          .async_wait(asio::experimental::wait_for_all(),
                      asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable));
    };
    auto force_on_signal = [&]() -> asio::awaitable<void> {
      forced_by = co_await signals.async_wait(asio::use_awaitable);
      log(log_level::warn, "worker " + base_id,
          "{} again: forcing the stop: running jobs are cancelled and handed back", signal_name(forced_by));
      co_await stop_all(std::chrono::milliseconds(0));  // cuts the grace under way short
    };
    co_await (stop_all(grace) || force_on_signal());
    for (std::size_t i = 0; i < pool.size(); ++i) {
      auto c = pool[i]->counters();
      log(log_level::info, "worker " + queues[i].id,
          "stopped: {} started, {} completed, {} retried, {} failed, {} leases lost, {} handed back", c.started,
          c.completed, c.retried, c.failed, c.leases_lost, c.released);
    }
  });
  return forced_by == 0 ? 0 : 128 + forced_by;  // as a shell reports a process a signal ended
}

namespace {

constexpr const char* enqueue_usage =
    "usage: jobrt enqueue [options] --type TYPE [--payload JSON] [job options]   one job\n"
    "       jobrt enqueue [options] --file FILE.jsonl                           one job per line\n"
    "       jobrt enqueue [options] --count N --type TYPE [--groups G]           N generated jobs\n"
    "  --redis URL, --queue NAME   as for jobrt worker\n"
    "  --config FILE               the queue's grouping rules (and the server) from a worker config\n"
    "job options (one job, and defaults for generated jobs):\n"
    "  --group G  --id ID  --delay MS  --max-attempts N  --timeout MS  --on-failure POLICY\n"
    "--groups G spreads generated jobs over groups g0..g(G-1); their payload gets \"n\": the\n"
    "job's number. A JSON line: {\"type\", \"payload\", \"group\", \"id\", \"delay_ms\",\n"
    "\"max_attempts\", \"timeout_ms\", \"on_failure\"}. --file - reads standard input. The whole\n"
    "file is checked before any job is stored: an error names its line (FILE:LINE: ...) and\n"
    "nothing is enqueued. A job may be at most 1 MiB (1048576 bytes) once encoded, payload\n"
    "included. Prints the job's id, or a count.\n";

// One line of an enqueue file; std::invalid_argument says what is wrong with it (the caller
// names the line).
job_spec spec_from_line(const std::string& line) {
  boost::system::error_code ec;
  auto v = boost::json::parse(line, ec);
  if (ec) throw std::invalid_argument(fmt::format("not JSON: {}", ec.message()));
  if (!v.is_object()) throw std::invalid_argument("not a JSON object");
  auto& o = v.as_object();
  job_spec s;
  auto text = [&](std::string_view name) -> std::optional<std::string> {
    auto* f = o.if_contains(name);
    if (!f) return std::nullopt;
    if (!f->is_string()) throw std::invalid_argument(fmt::format("\"{}\" is not a string", name));
    return std::string(f->as_string());
  };
  auto number_of = [&](std::string_view name) -> std::optional<std::int64_t> {
    auto* f = o.if_contains(name);
    if (!f) return std::nullopt;
    if (!f->is_int64() || f->as_int64() < 0)
      throw std::invalid_argument(fmt::format("\"{}\" is not a non-negative integer", name));
    return f->as_int64();
  };
  for (auto& [key, value] : o) {
    static const std::set<std::string_view> known{"type",     "payload",      "group",      "id",
                                                  "delay_ms", "max_attempts", "timeout_ms", "on_failure"};
    if (!known.contains(key)) throw std::invalid_argument(fmt::format("unknown field \"{}\"", key));
  }
  s.type = text("type").value_or("");
  if (auto* p = o.if_contains("payload")) s.payload = *p;
  s.group = text("group");
  s.id = text("id").value_or("");
  s.delay = std::chrono::milliseconds(number_of("delay_ms").value_or(0));
  s.max_attempts = static_cast<int>(number_of("max_attempts").value_or(3));
  s.timeout = std::chrono::milliseconds(number_of("timeout_ms").value_or(0));
  if (auto p = text("on_failure")) s.on_failure = parse_failure_policy(*p);
  return s;
}

}  // namespace

int enqueue_command(const args& a) {
  std::string url = default_redis_url(), queue = "default", file, config_file;
  bool url_given = false;
  job_spec base;
  bool has_payload = false, job_options = false;  // job options: one job's, or the generated jobs'
  std::size_t count = 0, groups = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto& arg = a[i];
    if (arg == "--help" || arg == "-h") {
      fmt::print("{}", enqueue_usage);
      return 0;
    } else if (arg == "--redis") {
      url = string_arg(a, i);
      url_given = true;
    } else if (arg == "--config") {
      config_file = string_arg(a, i);
    } else if (arg == "--queue") {
      queue = string_arg(a, i);
      if (queue.empty()) throw usage_error("enqueue: --queue is empty");
    } else if (arg == "--type") {
      job_options = true;
      base.type = string_arg(a, i);
    } else if (arg == "--payload") {
      job_options = true;
      try {
        base.payload = producer::parse_payload(string_arg(a, i));
      } catch (const std::invalid_argument& e) {
        throw usage_error(fmt::format("enqueue: --payload: {}", e.what()));
      }
      has_payload = true;
    } else if (arg == "--group") {
      job_options = true;
      base.group = string_arg(a, i);
    } else if (arg == "--id") {
      job_options = true;
      base.id = string_arg(a, i);
    } else if (arg == "--delay") {
      job_options = true;
      base.delay = std::chrono::milliseconds(number_arg(a, i, 0, 999'999'999'999'999));
    } else if (arg == "--max-attempts") {
      job_options = true;
      base.max_attempts = static_cast<int>(number_arg(a, i, 1, 1'000'000));
    } else if (arg == "--timeout") {
      job_options = true;
      base.timeout = std::chrono::milliseconds(number_arg(a, i, 0, 999'999'999'999'999));
    } else if (arg == "--on-failure") {
      job_options = true;
      try {
        base.on_failure = parse_failure_policy(string_arg(a, i));
      } catch (const std::invalid_argument& e) {
        throw usage_error(fmt::format("enqueue: --on-failure: {}", e.what()));
      }
    } else if (arg == "--file") {
      file = string_arg(a, i);
    } else if (arg == "--count") {
      count = number_arg(a, i, 1, 100'000'000);
    } else if (arg == "--groups") {
      groups = number_arg(a, i, 1, 100'000'000);
    } else {
      throw usage_error(fmt::format("enqueue: unknown option '{}'", arg));
    }
  }
  if (!file.empty() && count > 0) throw usage_error("enqueue: give --file or --count, not both");
  if (file.empty() && base.type.empty()) throw usage_error("enqueue: --type is required");
  if (groups > 0 && count == 0) throw usage_error("enqueue: --groups needs --count");
  if (count > 0 && !base.id.empty()) throw usage_error("enqueue: --id names one job; it cannot go with --count");
  if (!file.empty() && job_options) throw usage_error("enqueue: with --file, each line gives its job's options");
  if (file.empty()) {
    try {
      producer::check(base);  // what the job options say, before anything connects
    } catch (const std::invalid_argument& e) {
      throw usage_error(fmt::format("enqueue: {}", e.what()));
    }
  }
  producer_options po;
  if (!config_file.empty()) {
    auto cfg = settings::from_file(config_file);
    if (cfg.redis_url && !url_given) url = *cfg.redis_url;
    std::string names;  // the queue's grouping rules are the reason for --config: it must be there
    bool found = false;
    for (auto& q : cfg.queues) {
      if (q.worker.queue == queue) {
        po.rules = q.rules;
        found = true;
      }
      names += (names.empty() ? "" : ", ") + q.worker.queue;
    }
    if (!found)
      throw usage_error(fmt::format("enqueue: queue {} is not in config {} (its queues: {}); give --queue", queue,
                                    config_file, names));
  }
  check_url(url);

  // Every job is built and checked (its encoded size too) before anything is stored: the jobs go
  // in several calls, and one refused late would leave the earlier ones stored.
  std::vector<job_spec> specs;
  if (!file.empty()) {
    std::ifstream opened;
    if (file != "-") opened = open_file(file, "enqueue");
    std::istream& in = file == "-" ? std::cin : opened;
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
  with_backend(url, 1, [&](asio::io_context&, redis_backend& store) -> asio::awaitable<void> {
    co_await check_reachable(store.connection(), url);
    producer p(store, queue, po);
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
  });
  std::size_t duplicates = 0;
  for (auto& r : results) duplicates += r.duplicate ? 1 : 0;
  if (results.size() == 1)
    fmt::print("{}{}\n", results[0].id, results[0].duplicate ? " (duplicate: already pending)" : "");
  else
    fmt::print("enqueued {} jobs on {} ({} duplicates)\n", results.size() - duplicates, queue, duplicates);
  return 0;
}

}  // namespace jobrt::cli
