// Faults injected with real commands on a private redis-server: CLIENT KILL, CLIENT PAUSE,
// stopping and starting the server, a busy script that keeps requests unanswered.
#include "support/redis_server.hpp"
#include "support/run.hpp"

#include <jobrt/redis/connection.hpp>
#include <jobrt/redis/script.hpp>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <string>
#include <thread>

namespace asio = boost::asio;
using namespace jobrt;
using namespace jobrt::redis;
using namespace jobrt::test;
using asio::awaitable;
using asio::use_awaitable;
constexpr auto use_tuple = asio::as_tuple(use_awaitable);

namespace {

config fast(config cfg) {
  cfg.health_interval = std::chrono::milliseconds(200);
  cfg.reconnect_wait_min = std::chrono::milliseconds(10);
  cfg.reconnect_wait_max = std::chrono::milliseconds(100);
  return cfg;
}

// Keeps the server busy (and every other client unanswered) for ms milliseconds.
const char* busy_script =
    "local t = redis.call('TIME') local start = t[1] * 1000000 + t[2] "
    "repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start > tonumber(ARGV[1]) * 1000";

}  // namespace

TEST_CASE("CLIENT KILL under load: the connection comes back and no reply reaches the wrong request") {
  redis_server server;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    connection conn(ctx.get_executor(), fast(server.config()));
    connection admin(ctx.get_executor(), server.config());
    conn.start();
    admin.start();
    co_await exec(conn, request("PING"));
    int finished = 0, wrong = 0, lost = 0, ok = 0;
    bool stop = false;
    auto worker = [&](int id) -> awaitable<void> {
      for (int i = 0; !stop; ++i) {
        std::string key = fmt::format("k:{}", id), value = fmt::format("{}:{}", id, i);
        request req;
        req.push("SET", key, value).push("GET", key);
        auto [ec, r] = co_await conn.async_exec(std::move(req), use_tuple);
        if (ec) {
          CHECK(ec == errc::connection_lost);
          ++lost;
          continue;
        }
        ++ok;
        if (r.as_array()[1].as_string() != value) ++wrong;
      }
      ++finished;
    };
    for (int id = 0; id < 50; ++id) asio::co_spawn(ctx, worker(id), asio::detached);
    for (int kill = 0; kill < 5; ++kill) {
      co_await sleep_for(std::chrono::milliseconds(100));
      auto id = conn.client_id();
      if (id == 0) continue;
      co_await exec(admin, request("CLIENT", "KILL", "ID", id));
    }
    co_await sleep_for(std::chrono::milliseconds(100));
    stop = true;
    REQUIRE(co_await eventually([&] { return finished == 50; }));
    MESSAGE("ok=" << ok << " lost=" << lost << " reconnects=" << conn.connect_count() - 1);
    CHECK(wrong == 0);
    CHECK(conn.connect_count() >= 2);
    CHECK(ok > 1000);
    CHECK((co_await exec(conn, request("PING"))).as_string() == "PONG");
  });
}

TEST_CASE("redis-server stopped and started: reconnection - then EVALSHA after the script cache is gone") {
  redis_server server;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    connection conn(ctx.get_executor(), fast(server.config()));
    conn.start();
    script echo("return ARGV[1]");
    std::vector<std::string> none, one{"one"}, two{"two"}, three{"three"};
    CHECK((co_await echo.run(conn, none, one)).as_string() == "one");
    server.stop();
    co_await sleep_for(std::chrono::milliseconds(50));
    // Waiting during the outage: sent after the reconnect.
    request ping("PING");
    auto waiting = conn.async_exec(std::move(ping), use_tuple);
    std::thread restart([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      server.start();
    });
    auto [ec, r] = co_await std::move(waiting);
    restart.join();
    CHECK_FALSE(ec);
    CHECK(r.as_string() == "PONG");
    CHECK(conn.connect_count() >= 2);
    // The new server has no script cache: NOSCRIPT, then SCRIPT LOAD and EVALSHA again.
    CHECK((co_await echo.run(conn, none, two)).as_string() == "two");
    co_await exec(conn, request("SCRIPT", "FLUSH"));
    CHECK((co_await echo.run(conn, none, three)).as_string() == "three");
  });
}

TEST_CASE("while its server is down a request that does not wait for a reconnect fails at once - others wait") {
  redis_server server;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    connection conn(ctx.get_executor(), fast(server.config()));
    conn.start();
    CHECK((co_await exec(conn, request("PING"))).as_string() == "PONG");
    server.stop();
    REQUIRE(co_await eventually([&] { return !conn.is_connected(); }));
    request elsewhere("PING");
    elsewhere.options.wait_for_reconnect = false;  // as a cluster client sends them
    auto began = std::chrono::steady_clock::now();
    auto [ec, r] = co_await conn.async_exec(std::move(elsewhere), use_tuple);
    CHECK(ec == errc::not_connected);
    CHECK(std::chrono::steady_clock::now() - began < std::chrono::seconds(1));
    auto waiting = conn.async_exec(request("PING"), use_tuple);
    std::thread restart([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      server.start();
    });
    auto [ec2, r2] = co_await std::move(waiting);
    restart.join();
    CHECK_FALSE(ec2);
    CHECK(r2.as_string() == "PONG");
  });
}

TEST_CASE("a server still loading its dataset after a restart: requests wait for it instead of failing with LOADING") {
  // key-load-delay slows loading to about 1.5 s; the small interval lets the server answer
  // (LOADING) while it loads instead of leaving new connections unaccepted.
  redis_server server({"--key-load-delay", "500", "--loading-process-events-interval-bytes", "1024"});
  redis_cli(server.config(), {"EVAL", "for i = 1, 3000 do redis.call('SET', 'k' .. i, 'v' .. i) end", "0"});
  redis_cli(server.config(), {"SAVE"});
  run([&](asio::io_context& ctx) -> awaitable<void> {
    connection conn(ctx.get_executor(), fast(server.config()));
    conn.start();
    co_await exec(conn, request("PING"));
    server.stop(true);
    request get("GET", "k3000");
    get.options.timeout = std::chrono::seconds(20);
    get.options.resend_safe = true;  // it may be written before the loss is seen
    auto waiting = conn.async_exec(std::move(get), use_tuple);
    // start() returns once the server answers PING; the connection tries every 100 ms at most,
    // so it reaches the loading server long before.
    std::thread restart([&] { server.start(); });
    auto [ec, r] = co_await std::move(waiting);
    restart.join();
    CHECK_FALSE(ec);
    if (!ec) CHECK(r.as_string() == "v3000");
    CHECK(conn.last_error().find("LOADING") != std::string::npos);  // it did meet the loading server
  });
}

TEST_CASE("CLIENT PAUSE beyond two health intervals is detected as a dead connection") {
  redis_server server;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    connection conn(ctx.get_executor(), fast(server.config()));
    connection admin(ctx.get_executor(), server.config());
    conn.start();
    admin.start();
    co_await exec(conn, request("PING"));
    co_await exec(admin, request("PING"));
    auto started = std::chrono::steady_clock::now();
    co_await exec(admin, request("CLIENT", "PAUSE", 1500, "ALL"));
    // (The reconnect itself waits for the pause to end: the handshake is paused too.)
    co_await eventually([&] { return !conn.last_error().empty(); }, std::chrono::seconds(5));
    auto detected = std::chrono::steady_clock::now() - started;
    MESSAGE("detected after " << std::chrono::duration_cast<std::chrono::milliseconds>(detected).count()
                              << " ms: " << conn.last_error());
    CHECK(conn.last_error().find("nothing read from the server for two health intervals") != std::string::npos);
    // Two intervals of silence, plus up to one check period and one idle interval before the PING.
    CHECK(detected < std::chrono::milliseconds(900));
    co_await exec(admin, request("CLIENT", "UNPAUSE"));
    CHECK((co_await exec(conn, request("PING"))).as_string() == "PONG");
  });
}

TEST_CASE("cancellation and timeout of a request in each state") {
  redis_server server;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    auto cfg = server.config();
    cfg.health_interval = std::chrono::milliseconds(0);  // the busy script must not look like a dead server
    connection conn(ctx.get_executor(), cfg);
    connection busy(ctx.get_executor(), server.config());
    conn.start();
    busy.start();
    co_await exec(conn, request("SET", "k", "v"));
    co_await exec(busy, request("PING"));

    // Written, then the server is busy: the request is abandoned and its reply dropped later.
    asio::co_spawn(ctx, exec(busy, request("EVAL", busy_script, 0, 400)), asio::detached);
    co_await sleep_for(std::chrono::milliseconds(50));
    asio::cancellation_signal signal;
    asio::steady_timer t(ctx);
    auto cancelled = conn.async_exec(request("GET", "k"), asio::bind_cancellation_slot(signal.slot(), use_tuple));
    asio::co_spawn(
        ctx,
        [&]() -> awaitable<void> {
          co_await sleep_for(std::chrono::milliseconds(30));
          signal.emit(asio::cancellation_type::terminal);
        },
        asio::detached);
    auto [ec1, r1] = co_await std::move(cancelled);
    CHECK(ec1 == asio::error::operation_aborted);

    request timed("GET", "k");
    timed.options.timeout = std::chrono::milliseconds(50);
    auto [ec2, r2] = co_await conn.async_exec(std::move(timed), use_tuple);
    CHECK(ec2 == errc::timeout);

    // After the busy script, the next request gets its own reply, not an abandoned one's.
    co_await exec(conn, request("SET", "k", "other"));
    CHECK((co_await exec(conn, request("GET", "k"))).as_string() == "other");

    // Waiting (no connection): cancelled and timed out requests are removed.
    server.stop();
    co_await sleep_for(std::chrono::milliseconds(50));
    request waiting("GET", "k");
    waiting.options.timeout = std::chrono::milliseconds(100);
    auto [ec3, r3] = co_await conn.async_exec(std::move(waiting), use_tuple);
    CHECK(ec3 == errc::not_connected);
    asio::cancellation_signal signal2;
    auto cancelled2 = conn.async_exec(request("GET", "k"), asio::bind_cancellation_slot(signal2.slot(), use_tuple));
    asio::co_spawn(
        ctx,
        [&]() -> awaitable<void> {
          co_await sleep_for(std::chrono::milliseconds(30));
          signal2.emit(asio::cancellation_type::terminal);
        },
        asio::detached);
    auto [ec4, r4] = co_await std::move(cancelled2);
    CHECK(ec4 == asio::error::operation_aborted);
    server.start();
    CHECK((co_await exec(conn, request("PING"))).as_string() == "PONG");
  });
}

TEST_CASE("written requests fail on a lost connection unless marked safe to resend") {
  redis_server server;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    auto cfg = fast(server.config());
    cfg.health_interval = std::chrono::milliseconds(0);
    connection conn(ctx.get_executor(), cfg);
    connection busy(ctx.get_executor(), server.config());
    conn.start();
    busy.start();
    co_await exec(conn, request("SET", "k", "v"));
    co_await exec(busy, request("PING"));
    asio::co_spawn(ctx, busy.async_exec(request("EVAL", busy_script, 0, 300), use_tuple), asio::detached);
    co_await sleep_for(std::chrono::milliseconds(50));
    // Both are written and unanswered while the script runs; then the server dies.
    int done = 0;
    boost::system::error_code unsafe_ec, safe_ec;
    reply safe_reply;
    asio::co_spawn(
        ctx,
        [&]() -> awaitable<void> {
          std::tie(unsafe_ec, std::ignore) = co_await conn.async_exec(request("INCR", "n"), use_tuple);
          ++done;
        },
        asio::detached);
    asio::co_spawn(
        ctx,
        [&]() -> awaitable<void> {
          request get("GET", "k");
          get.options.resend_safe = true;
          std::tie(safe_ec, safe_reply) = co_await conn.async_exec(std::move(get), use_tuple);
          ++done;
        },
        asio::detached);
    co_await sleep_for(std::chrono::milliseconds(50));
    server.stop(true);
    co_await sleep_for(std::chrono::milliseconds(100));
    CHECK(done == 1);
    CHECK(unsafe_ec == errc::connection_lost);
    server.start();
    REQUIRE(co_await eventually([&] { return done == 2; }));
    CHECK_FALSE(safe_ec);
    CHECK(safe_reply.is_nil());  // the new server is empty; the GET ran there
  });
}
