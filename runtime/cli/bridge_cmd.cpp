// jobrt bridge: jobs from a Redis Stream (docs/BRIDGES.md).
#include "cli.hpp"

#include <jobrt/bridge.hpp>
#include <jobrt/log.hpp>
#include <jobrt/metrics.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/settings.hpp>
#include <jobrt/sharded_backend.hpp>

#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <csignal>
#include <memory>
#include <optional>

namespace jobrt::cli {
namespace {

namespace asio = boost::asio;

struct bridge_args {
  std::string from, queue, url = default_redis_url(), config_file, type, metrics_at, log_level, durability = "primary";
  std::size_t keep_ms = 0, shards = 0;
  CLI::Option* url_option = nullptr;
  CLI::Option* durability_option = nullptr;
};

int run_bridge(bridge_args& a) {
  std::optional<asio::ip::tcp::endpoint> metrics_at;
  if (!a.metrics_at.empty()) {
    try {
      metrics_at = parse_listen_address(a.metrics_at);
    } catch (const std::invalid_argument& e) {
      throw usage_error(fmt::format("bridge: --metrics: {}", e.what()));
    }
  }
  if (!a.log_level.empty()) set_log_level(parse_log_level(a.log_level));
  auto url = a.url;
  auto durability = durability_of(a.durability);
  producer_options po;
  bridge_mapping how;
  if (!a.config_file.empty()) {
    auto cfg = settings::from_file(a.config_file);
    if (cfg.redis_url && !given_on_command_line(a.url_option)) {
      url = *cfg.redis_url;
      check_redis_url(url);
    }
    if (cfg.durability && !given_on_command_line(a.durability_option)) durability = *cfg.durability;
    bool found = false;
    for (auto& q : cfg.queues) {
      if (q.worker.queue != a.queue) continue;
      found = true;
      po.rules = q.rules;
      po.max_group_size = q.max_group_size;
      po.group_rate = q.group_rate;
      po.group_concurrency = q.group_concurrency;
      po.group_weight = q.group_weight;
      how = q.bridge;
      if (q.shards != 0 && a.shards == 0) a.shards = q.shards;
    }
    if (!found) throw usage_error(fmt::format("bridge: queue {} is not in config {}", a.queue, a.config_file));
  }
  if (!a.type.empty()) how.type = a.type;
  if (a.keep_ms > 0) how.keep = std::chrono::milliseconds(a.keep_ms);

  asio::io_context ctx(1);
  redis_backend_options ro;
  ro.durability = durability;
  redis_backend store(ctx.get_executor(), seeds_of(url), ro);
  sharded_backend sharded(store, a.shards);
  po.batch = max_bridge_batch;  // (each batch of the source one enqueue call)
  producer to(sharded, a.queue, po);
  std::unique_ptr<bridge> bridge;
  try {
    bridge = make_bridge(ctx.get_executor(), a.from, to, how);
  } catch (const std::invalid_argument& e) {
    throw usage_error(fmt::format("bridge: --from: {}", e.what()));
  }
  std::unique_ptr<metrics_server> metrics;
  std::exception_ptr failure;
  asio::signal_set signals(ctx, SIGTERM, SIGINT);
  signals.async_wait([&](boost::system::error_code ec, int signal) {
    if (ec) return;
    log(log_level::info, "bridge", "{}: stopping: storing and acknowledging what was read ({} again stops at once)",
        signal_name(signal), signal_name(signal));
    bridge->stop();  // (before run(): run() returns at once)
    signals.async_wait([&](boost::system::error_code again, int forced) {
      if (again) return;
      // Ended by the signal, as a shell expects: what was read and not acknowledged is delivered
      // again (to a bridge that starts), and stored once, by its id.
      log(log_level::warn, "bridge", "{} again: stopping now; what was read and not acknowledged comes again",
          signal_name(forced));
      std::signal(forced, SIG_DFL);
      std::raise(forced);
    });
  });
  auto body = [&]() -> asio::awaitable<void> {
    co_await check_reachable(store.connection(), url);
    co_await sharded.shards_of(a.queue);  // (another number stored: refused before anything is read)
    if (metrics_at) {
      auto source = bridge->source();
      metrics = std::make_unique<metrics_server>(ctx.get_executor(), *metrics_at,
                                                 [&, source]() -> asio::awaitable<std::string> {
                                                   co_return bridge_metrics_text(co_await bridge->sample(), source);
                                                 });
      metrics->start();
      log(log_level::info, "bridge", "metrics at http://{}:{}/metrics", metrics->local_endpoint().address().to_string(),
          metrics->local_endpoint().port());
    }
    log(log_level::info, "bridge", "from {} to queue {} at {}", bridge->source(), a.queue, address_of(url));
    co_await bridge->run();
    auto c = bridge->counters();
    log(log_level::info, "bridge", "stopped: {} messages, {} jobs stored, {} duplicates, {} refused", c.received,
        c.enqueued, c.duplicates, c.rejected);
    if (metrics) metrics->stop();
    signals.cancel();
  };
  asio::co_spawn(ctx, body(), [&](std::exception_ptr e) {
    failure = e;
    ctx.stop();  // (the backend's connections would keep it running)
  });
  ctx.run();
  bridge.reset();
  if (failure) std::rethrow_exception(failure);
  return 0;
}

}  // namespace

void add_bridge(CLI::App& jobrt, action& chosen) {
  auto a = std::make_shared<bridge_args>();
  auto* cmd = add_command(jobrt, chosen, "bridge", "take jobs from a Redis Stream or a RabbitMQ queue into a queue",
                          [a] { return run_bridge(*a); });
  cmd->add_option("--from", a->from,
                  "redis-stream://HOST:PORT/STREAM?group=GROUP (several HOST:PORT for a cluster's nodes; behind "
                  "Sentinel redis-stream+sentinel://HOST:26379/PRIMARY/STREAM?group=GROUP) or "
                  "amqp://USER:PASSWORD@HOST:5672/VHOST?queue=QUEUE (amqps:// for TLS; docs/BRIDGES.md)")
      ->required()
      ->envname("JOBRT_BRIDGE_FROM")
      ->option_text("URL");
  cmd->add_option("-q,--to-queue", a->queue, "the queue the jobs go to")
      ->required()
      ->check(queue_name())
      ->option_text("NAME");
  a->url_option = redis_option(*cmd, a->url, "the queue's server (default: redis://127.0.0.1:6379)");
  a->durability_option = durability_option(*cmd, a->durability)->envname("JOBRT_DURABILITY");
  cmd->add_option("-C,--config", a->config_file,
                  "the queue's grouping rules and its bridge mapping from a worker config")
      ->option_text("FILE");
  cmd->add_option("-t,--type", a->type, "the job type of messages that name none")
      ->check(not_empty("--type"))
      ->option_text("TYPE");
  number_option(*cmd, "--keep", a->keep_ms, 1, static_cast<std::size_t>(max_job_keep.count()),
                "how long a message's id stays taken after its job ended (default 3600000: 1 h)")
      ->option_text("MS");
  number_option(*cmd, "--shards", a->shards, 1, 1024,
                "shards the queue spreads over (default: as the queue is stored; 1 for a new one)")
      ->envname("JOBRT_SHARDS");
  cmd->add_option("--metrics", a->metrics_at, "serve Prometheus metrics at http://ADDR/metrics (ADDR: [HOST]:PORT)")
      ->option_text("ADDR");
  word_option(*cmd, "--log-level", a->log_level, "debug, info (default), warn, error or off",
              [](const std::string& t) { parse_log_level(t); });
  cmd->footer(
      "Reads a Redis Stream through a consumer group, or a RabbitMQ queue, stores each message as a\n"
      "job, and acknowledges it only once stored. A stream entry's fields give the job: type, payload\n"
      "(JSON), id and group (the config's bridge mapping renames them); without an id it is\n"
      "<stream>@<entry id>. An AMQP message's body is the payload, its type property or header the\n"
      "type, its message_id (else a hash of the body) the id. One bridge of a stream's group consumes\n"
      "at a time; more stand by and take over when it dies. Messages that cannot be jobs go to\n"
      "<stream>:dead or <queue>.dead with the reason. SIGTERM stops it after the batch in hand (its\n"
      "store and acknowledgements get 5 s each with a server out of reach); a second SIGTERM at once.");
}

}  // namespace jobrt::cli
