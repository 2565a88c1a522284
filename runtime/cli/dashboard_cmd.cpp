// jobrt dashboard: the web dashboard (pages and a JSON API) at an address of its own.
#include "cli.hpp"

#include <jobrt/dashboard.hpp>
#include <jobrt/metrics.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/sharded_backend.hpp>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include <algorithm>
#include <csignal>
#include <memory>
#include <random>

namespace jobrt::cli {
namespace {

namespace asio = boost::asio;

struct dashboard_args {
  std::string url = default_redis_url();
  std::vector<std::string> queues;
  std::string listen = "127.0.0.1:8080";
  std::string token;
  bool read_only = false;
};

std::string made_up_token() {
  std::random_device random;
  std::string out;
  for (int i = 0; i < 4; ++i) out += fmt::format("{:08x}", random());
  return out;
}

int run_dashboard(dashboard_args& a) {
  asio::ip::tcp::endpoint at;
  try {
    at = parse_listen_address(a.listen);
  } catch (const std::invalid_argument& e) {
    throw usage_error(fmt::format("dashboard: --listen: {}", e.what()));
  }
  dashboard_options o;
  o.queues = a.queues.empty() ? std::vector<std::string>{"default"} : a.queues;
  o.read_only = a.read_only;
  if (at.address().is_loopback()) {
    o.hosts = {"localhost", "127.0.0.1", "[::1]"};
    // (Another loopback address, 127.0.0.2 say: the one the printed URL names.)
    auto bound = at.address().is_v6() ? "[" + at.address().to_string() + "]" : at.address().to_string();
    if (std::find(o.hosts.begin(), o.hosts.end(), bound) == o.hosts.end()) o.hosts.push_back(bound);
  }
  bool made_up = false;
  if (!a.read_only) {
    o.token = a.token;
    if (o.token.empty()) {
      o.token = made_up_token();
      made_up = true;
    }
  }
  asio::io_context ctx(1);
  // (No PING first: a server that does not answer shows as an error on the pages, which keep
  // asking.)
  redis_backend store(ctx.get_executor(), seeds_of(a.url));
  sharded_backend queues(store, 0, sharded_backend::when_unknown::look);
  o.store_error = [&store] { return store.connection().last_error(); };
  auto board = std::make_shared<dashboard>(ctx.get_executor(), queues, o);
  dashboard_server server(ctx.get_executor(), at, board);
  server.start();
  auto bound = server.local_endpoint();
  auto host = bound.address().is_v6() ? "[" + bound.address().to_string() + "]" : bound.address().to_string();
  fmt::print("dashboard: listening on http://{}:{}/ for {} at {}\n", host, bound.port(), fmt::join(o.queues, ", "),
             address_of(a.url));
  if (a.read_only)
    fmt::print("dashboard: read-only\n");
  else if (made_up)
    fmt::print("dashboard: actions need this token (set your own with --token or JOBRT_DASHBOARD_TOKEN): {}\n",
               o.token);
  std::fflush(stdout);
  asio::signal_set signals(ctx, SIGTERM, SIGINT);
  signals.async_wait([&](boost::system::error_code, int) {
    server.stop();
    ctx.stop();  // (open connections end with the process)
  });
  ctx.run();
  return 0;
}

}  // namespace

void add_dashboard(CLI::App& jobrt, action& chosen) {
  auto a = std::make_shared<dashboard_args>();
  auto* cmd = add_command(jobrt, chosen, "dashboard", "serve the web dashboard: queues, groups, jobs, dead letters",
                          [a] { return run_dashboard(*a); });
  redis_option(*cmd, a->url, "the server (default: redis://127.0.0.1:6379)");
  cmd->add_option("-q,--queue", a->queues, "a queue to show; again for more (default: default)")
      ->check(queue_name())
      ->option_text("NAME");
  cmd->add_option("--listen", a->listen,
                  "HOST:PORT to serve at (default 127.0.0.1:8080: loopback unless you name another address)")
      ->check(not_empty("--listen"))
      ->option_text("HOST:PORT");
  cmd->add_option("--token", a->token,
                  "what actions (pause, resume, requeue, purge) must send in the X-Jobrt-Token header; default: "
                  "one made up and printed")
      ->envname("JOBRT_DASHBOARD_TOKEN")
      ->check(not_empty("--token"))
      ->option_text("TEXT");
  cmd->add_flag("--read-only", a->read_only, "no actions at all");
}

}  // namespace jobrt::cli
