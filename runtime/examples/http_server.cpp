// An async HTTP server (Boost.Beast) that enqueues a job per POST and runs a jobrt worker on the
// same io_context: jobrt embedded in a server, with no Redis (memory backend) or with --redis URL.
//
//   jobrt_example_http_server [--port N] [--redis URL]
//   POST /jobs   {"type": "greet", "payload": {...}, "group": "optional"}  -> 202 {"id": "..."}
//   GET  /stats  -> 200 {"done": N, "queue": {...counts}}
//   /dashboard/  the jobrt dashboard of queue "http", mounted here (read-only)
//
// Handler `greet` waits a little (on a timer) and counts itself done. It prints "listening on
// PORT" when it accepts connections; SIGTERM or SIGINT stop it gracefully.
#include <jobrt/dashboard.hpp>
#include <jobrt/memory_backend.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/worker.hpp>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <atomic>
#include <csignal>
#include <memory>
#include <string>

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace json = boost::json;
using asio::ip::tcp;

namespace {

std::atomic<int> done{0};

using response = http::response<http::string_body>;

response reply(const http::request<http::string_body>& req, http::status status, const json::value& body) {
  response res(status, req.version());
  res.set(http::field::content_type, "application/json");
  res.keep_alive(req.keep_alive());
  res.body() = json::serialize(body) + "\n";
  res.prepare_payload();
  return res;
}

// One request: POST /jobs enqueues, GET /stats reports; bad input gets a 400 naming what is wrong.
asio::awaitable<response> handle(const http::request<http::string_body>& req, jobrt::producer& jobs,
                                 jobrt::backend& store) {
  if (req.method() == http::verb::post && req.target() == "/jobs") {
    boost::system::error_code ec;
    auto body = json::parse(req.body(), ec);
    if (ec || !body.is_object())
      co_return reply(req, http::status::bad_request, {{"error", "body is not a JSON object"}});
    jobrt::job_spec spec;
    const auto& o = body.as_object();
    if (auto* t = o.if_contains("type"); t && t->is_string()) spec.type = std::string(t->as_string());
    if (auto* p = o.if_contains("payload")) spec.payload = *p;
    if (auto* g = o.if_contains("group"); g && g->is_string()) spec.group = std::string(g->as_string());
    try {
      auto r = co_await jobs.enqueue(std::move(spec));
      co_return reply(req, http::status::accepted, {{"id", r.id}});
    } catch (const std::invalid_argument& e) {
      co_return reply(req, http::status::bad_request, {{"error", e.what()}});
    }
  }
  if (req.method() == http::verb::get && req.target() == "/stats") {
    auto c = co_await store.counts(jobs.queue());
    co_return reply(req, http::status::ok,
                    {{"done", done.load()}, {"queue", {{"enqueued", c.enqueued}, {"completed", c.completed}}}});
  }
  co_return reply(req, http::status::not_found, {{"error", "POST /jobs or GET /stats"}});
}

asio::awaitable<void> session(beast::tcp_stream stream, jobrt::producer& jobs, jobrt::backend& store,
                              jobrt::dashboard& board) {
  beast::flat_buffer buffer;
  for (;;) {
    http::request<http::string_body> req;
    stream.expires_after(std::chrono::seconds(30));
    auto [ec, n] = co_await http::async_read(stream, buffer, req, asio::as_tuple(asio::use_awaitable));
    if (ec) co_return;
    stream.expires_after(std::chrono::seconds(30));  // for the answer too
    // The dashboard, under /dashboard: it answers (or streams events) itself.
    constexpr std::string_view mount = "/dashboard";
    std::string_view target = req.target();
    if (target.starts_with(mount) &&
        (target.size() == mount.size() || target[mount.size()] == '/' || target[mount.size()] == '?')) {
      if (!co_await board.serve(stream, req, target.substr(mount.size()))) co_return;
      continue;
    }
    auto res = co_await handle(req, jobs, store);
    auto [wec, written] = co_await http::async_write(stream, res, asio::as_tuple(asio::use_awaitable));
    if (wec || !res.keep_alive()) co_return;
  }
}

}  // namespace

int main(int argc, char** argv) {
  unsigned short port = 0;
  std::string redis_url;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string_view arg = argv[i];
    if (arg == "--port")
      port = static_cast<unsigned short>(std::stoi(argv[i + 1]));
    else if (arg == "--redis")
      redis_url = argv[i + 1];
  }
  asio::io_context ctx;
  std::unique_ptr<jobrt::backend> store;
  if (redis_url.empty())
    store = std::make_unique<jobrt::memory_backend>(ctx.get_executor());
  else
    store = std::make_unique<jobrt::redis_backend>(ctx.get_executor(), jobrt::redis::config::from_url(redis_url));
  jobrt::producer jobs(*store, "http");
  jobrt::worker_options wo;
  wo.queue = "http";
  jobrt::worker worker(ctx.get_executor(), *store, wo);
  worker.add_handler("greet", [](jobrt::job_context&) -> asio::awaitable<void> {
    asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::milliseconds(5));
    co_await t.async_wait(asio::use_awaitable);
    ++done;
  });
  jobrt::dashboard_options dopts;
  dopts.queues = {"http"};
  dopts.read_only = true;
  dopts.hosts = {"localhost", "127.0.0.1"};  // on loopback: no other name (DNS rebinding)
  jobrt::dashboard board(ctx.get_executor(), *store, dopts);
  tcp::acceptor acceptor(ctx, {asio::ip::make_address("127.0.0.1"), port});
  asio::signal_set signals(ctx, SIGTERM, SIGINT);
  worker.start();
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        for (;;) {
          auto [ec, socket] = co_await acceptor.async_accept(asio::as_tuple(asio::use_awaitable));
          if (ec) co_return;
          asio::co_spawn(ctx, session(beast::tcp_stream(std::move(socket)), jobs, *store, board), asio::detached);
        }
      },
      asio::detached);
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        co_await signals.async_wait(asio::use_awaitable);
        acceptor.close();
        board.stop();  // (its event streams)
        co_await worker.stop(std::chrono::seconds(5));
        ctx.stop();
      },
      asio::detached);
  fmt::print("listening on {}\n", acceptor.local_endpoint().port());
  std::fflush(stdout);
  ctx.run();
  return 0;
}
