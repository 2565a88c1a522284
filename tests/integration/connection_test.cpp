// The connection against a real redis-server on loopback.
#include "support/redis_server.hpp"
#include "support/run.hpp"

#include <jobrt/redis/connection.hpp>
#include <jobrt/redis/script.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace asio = boost::asio;
using namespace jobrt;
using namespace jobrt::redis;
using namespace jobrt::test;
using asio::awaitable;
using asio::use_awaitable;
constexpr auto use_tuple = asio::as_tuple(use_awaitable);

TEST_CASE("10000 commands from 200 coroutines on one connection - each reply to its request") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    connection conn(ctx.get_executor(), shared_redis());
    conn.start();
    const std::string prefix = key_prefix();
    int finished = 0;
    int mismatches = 0;
    auto worker = [&](int id) -> awaitable<void> {
      for (int i = 0; i < 50; ++i) {
        std::string key = fmt::format("{}{}:{}", prefix, id, i);
        std::string value = fmt::format("value-{}-{}", id, i);
        request req;
        req.push("SET", key, value).push("GET", key);
        reply r = co_await exec(conn, std::move(req));
        if (r.as_array()[1].as_string() != value) ++mismatches;
        // A single command too: INCRBY by the id returns id * (i + 1).
        reply n = co_await exec(conn, request("INCRBY", prefix + "n:" + std::to_string(id), id));
        if (n.as_integer() != static_cast<std::int64_t>(id) * (i + 1)) ++mismatches;
      }
      ++finished;
    };
    for (int id = 0; id < 200; ++id) asio::co_spawn(ctx, worker(id), asio::detached);
    asio::steady_timer t(ctx);
    while (finished < 200) {
      t.expires_after(std::chrono::milliseconds(5));
      co_await t.async_wait(use_awaitable);
    }
    CHECK(mismatches == 0);
    CHECK(conn.connect_count() == 1);
  });
}

TEST_CASE("binary values round-trip: NUL bytes and 1 MiB") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    connection conn(ctx.get_executor(), shared_redis());
    conn.start();
    std::string key = key_prefix() + "bin";
    std::string small("\0\r\n\x01\xff$*", 7);
    co_await exec(conn, request("SET", key, small));
    CHECK((co_await exec(conn, request("GET", key))).as_string() == small);
    std::string big(1 << 20, '\0');
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7 + i / 251);
    co_await exec(conn, request("SET", key, big));
    CHECK((co_await exec(conn, request("GET", key))).as_string() == big);
  });
}

TEST_CASE("Redis error replies surface as errors with their message") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    connection conn(ctx.get_executor(), shared_redis());
    conn.start();
    std::string key = key_prefix() + "list";
    co_await exec(conn, request("RPUSH", key, "x"));
    auto [ec, r] = co_await conn.async_exec(request("INCR", key), use_tuple);
    CHECK(ec == errc::server_error);
    CHECK(r.error_message().starts_with("WRONGTYPE"));
    std::string what;
    try {
      co_await exec(conn, request("NOSUCHCOMMAND"));
    } catch (const boost::system::system_error& e) {
      what = e.what();
    }
    CHECK(what.find("unknown command") != std::string::npos);
    // The connection goes on.
    CHECK((co_await exec(conn, request("PING"))).as_string() == "PONG");
  });
}

TEST_CASE("an error with nothing of the server's to add reads as its own message, not ': message'") {
  redis_server server;  // private: paused below
  run([&](asio::io_context& ctx) -> awaitable<void> {
    connection conn(ctx.get_executor(), server.config());
    conn.start();
    co_await exec(conn, request("PING"));
    redis_cli(server.config(), {"CLIENT", "PAUSE", "1000", "ALL"});
    request slow("GET", "k");
    slow.options.timeout = std::chrono::milliseconds(50);
    std::string what;
    try {
      co_await exec(conn, std::move(slow));
    } catch (const boost::system::system_error& e) {
      what = e.what();
    }
    CAPTURE(what);
    CHECK(!what.empty());
    CHECK(!what.starts_with(":"));  // log lines read "claim failed: : ..." before
  });
}

TEST_CASE("the shared connection refuses blocking commands") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    connection conn(ctx.get_executor(), shared_redis());
    conn.start();
    auto [ec, r] = co_await conn.async_exec(request("BLMOVE", "a", "b", "LEFT", "RIGHT", 0), use_tuple);
    CHECK(ec == errc::blocking_command_on_shared_connection);
    auto [ec2, r2] = co_await conn.async_exec(request("SUBSCRIBE", "ch"), use_tuple);
    CHECK(ec2 == errc::blocking_command_on_shared_connection);
  });
}

TEST_CASE("a BLMOVE on its own connection wakes within milliseconds of an LPUSH") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    connection conn(ctx.get_executor(), shared_redis());
    blocking_connection blocking(ctx.get_executor(), shared_redis());
    conn.start();
    blocking.start();
    std::string src = key_prefix() + "src", dst = key_prefix() + "dst";
    co_await exec(blocking, request("PING"));
    std::chrono::steady_clock::time_point pushed{};
    std::chrono::steady_clock::duration worst{};
    for (int i = 0; i < 20; ++i) {
      auto pusher = [&]() -> awaitable<void> {
        asio::steady_timer t(ctx);
        t.expires_after(std::chrono::milliseconds(20));
        co_await t.async_wait(use_awaitable);
        pushed = std::chrono::steady_clock::now();
        co_await exec(conn, request("LPUSH", src, std::to_string(i)));
      };
      asio::co_spawn(ctx, pusher(), asio::detached);
      reply r = co_await exec(blocking, request("BLMOVE", src, dst, "RIGHT", "LEFT", 5));
      auto latency = std::chrono::steady_clock::now() - pushed;
      worst = std::max(worst, latency);
      CHECK(r.as_string() == std::to_string(i));
    }
    MESSAGE("worst BLMOVE wake-up: " << std::chrono::duration<double, std::milli>(worst).count() << " ms");
    CHECK(worst < std::chrono::milliseconds(50));
  });
}

TEST_CASE("cancelling a BLMOVE resets the blocking connection - which goes on working") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    blocking_connection blocking(ctx.get_executor(), shared_redis());
    blocking.start();
    std::string src = key_prefix() + "src", dst = key_prefix() + "dst";
    co_await exec(blocking, request("PING"));
    using namespace asio::experimental::awaitable_operators;
    asio::steady_timer t(ctx);
    t.expires_after(std::chrono::milliseconds(100));
    auto result = co_await (blocking.async_exec(request("BLMOVE", src, dst, "RIGHT", "LEFT", 0), use_tuple) ||
                            t.async_wait(use_awaitable));
    CHECK(result.index() == 1);
    CHECK((co_await exec(blocking, request("PING"))).as_string() == "PONG");
    CHECK(blocking.connect_count() == 2);
  });
}

TEST_CASE("a subscriber gets messages - and a reconnect notice") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    connection conn(ctx.get_executor(), shared_redis());
    subscriber sub(ctx.get_executor(), shared_redis());
    conn.start();
    sub.start();
    std::string ch = key_prefix() + "ch";
    sub.subscribe({ch});
    message m = co_await sub.async_receive(use_awaitable);
    CHECK(m.confirmation);  // the subscription is in place
    co_await exec(conn, request("PUBLISH", ch, "hello"));
    m = co_await sub.async_receive(use_awaitable);
    CHECK(m.channel == ch);
    CHECK(m.payload == "hello");
    sub.psubscribe({ch + ":*"});
    // PUBLISH until the pattern subscription is in place.
    for (;;) {
      if ((co_await exec(conn, request("PUBLISH", ch + ":x", "p"))).as_integer() > 0) break;
    }
    do m = co_await sub.async_receive(use_awaitable);
    while (m.confirmation);
    CHECK(m.pattern == ch + ":*");
    CHECK(m.channel == ch + ":x");
  });
}

TEST_CASE("a subscriber's shard channels get SPUBLISH messages - and SPUBLISH from a script") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    connection conn(ctx.get_executor(), shared_redis());
    subscriber sub(ctx.get_executor(), shared_redis());
    conn.start();
    sub.start();
    std::string ch = key_prefix() + "{s}";
    std::vector<std::string> channels;  // (g++ 12: no braced list of temporaries in a coroutine)
    channels.push_back(ch);
    channels.push_back(ch + ":2");
    sub.ssubscribe(channels);
    message m = co_await sub.async_receive(use_awaitable);
    CHECK(m.confirmation);
    co_await exec(conn, request("SPUBLISH", ch, "hello"));
    do m = co_await sub.async_receive(use_awaitable);
    while (m.confirmation);  // (one a channel: each has its own SSUBSCRIBE)
    CHECK(m.channel == ch);
    CHECK(m.payload == "hello");
    CHECK_FALSE(m.dropped);
    request eval("EVAL", "return redis.call('SPUBLISH', KEYS[1], ARGV[1])", 1, ch + ":2", "from a script");
    CHECK((co_await exec(conn, std::move(eval))).as_integer() == 1);
    do m = co_await sub.async_receive(use_awaitable);
    while (m.confirmation);
    CHECK(m.channel == ch + ":2");
    CHECK(m.payload == "from a script");
    // A plain PUBLISH is another namespace: it does not reach a shard channel's subscriber.
    CHECK((co_await exec(conn, request("PUBLISH", ch, "x"))).as_integer() == 0);
  });
}

TEST_CASE("a script runs with EVALSHA and is loaded on NOSCRIPT") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    connection conn(ctx.get_executor(), shared_redis());
    conn.start();
    script add("return redis.call('INCRBY', KEYS[1], ARGV[1])");
    CHECK(add.sha1().size() == 40);
    std::string key = key_prefix() + "counter";
    std::vector<std::string> keys{key};
    // (Arguments are built before co_await: GCC 12 cannot keep an initializer_list across it.)
    std::vector<std::string> five{"5"}, two{"2"}, none;
    reply r = co_await add.run(conn, keys, five);
    CHECK(r.as_integer() == 5);
    auto sha = co_await exec(conn, request("SCRIPT", "EXISTS", add.sha1()));
    CHECK(sha.as_array()[0].as_integer() == 1);
    r = co_await add.run(conn, keys, two);
    CHECK(r.as_integer() == 7);
    std::string what;
    try {
      script broken("return redis.call('NOPE')");
      co_await broken.run(conn, none, none);
    } catch (const boost::system::system_error& e) {
      what = e.what();
    }
    CHECK(what.find("Unknown Redis command") != std::string::npos);
  });
}

TEST_CASE("AUTH - SELECT and CLIENT SETNAME on connect - a wrong password is a clear error") {
  redis_server server({"--requirepass", "s3cret"});
  run([&](asio::io_context& ctx) -> awaitable<void> {
    auto cfg = config::from_url(fmt::format("redis://:s3cret@127.0.0.1:{}/5", server.port()));
    cfg.client_name = "jobrt-test";
    connection conn(ctx.get_executor(), cfg);
    conn.start();
    co_await exec(conn, request("SET", "where", "db5"));
    reply info = co_await exec(conn, request("CLIENT", "INFO"));
    CHECK(info.as_string().find("name=jobrt-test") != std::string::npos);
    CHECK(info.as_string().find("db=5") != std::string::npos);

    auto bad = config::from_url(fmt::format("redis://:wrong@127.0.0.1:{}", server.port()));
    bad.reconnect_wait_min = bad.reconnect_wait_max = std::chrono::milliseconds(50);
    connection refused(ctx.get_executor(), bad);
    refused.start();
    request ping("PING");
    ping.options.timeout = std::chrono::milliseconds(300);
    auto [ec, r] = co_await refused.async_exec(std::move(ping), use_tuple);
    CHECK(ec == errc::not_connected);
    MESSAGE(refused.last_error());
    CHECK(refused.last_error().find("AUTH refused: WRONGPASS") != std::string::npos);
  });
}

TEST_CASE("a subscription the server refuses is named - and the replies after it stay in step") {
  redis_server server;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    auto url = fmt::format("redis://127.0.0.1:{}", server.port());
    connection admin(ctx.get_executor(), config::from_url(url));
    admin.start();
    // A user with every key and command but no channel (Redis 7's default for new users).
    co_await exec(admin, request("ACL", "SETUSER", "nochan", "on", ">pw", "~*", "+@all", "resetchannels"));
    subscriber sub(ctx.get_executor(), config::from_url(fmt::format("redis://nochan:pw@127.0.0.1:{}", server.port())));
    sub.start();
    // Two channels, one command: the server answers it with one error, not one reply per channel.
    std::vector<std::string> two{"a", "b"};
    sub.subscribe(two);
    co_await eventually([&] { return sub.last_error().find("refused") != std::string::npos; },
                        std::chrono::milliseconds(2000));
    CHECK(sub.last_error().find("SUBSCRIBE a b refused by") != std::string::npos);
    CHECK(sub.last_error().find("NOPERM") != std::string::npos);
    auto connections = [&]() -> awaitable<std::string> {
      auto info = (co_await exec(admin, request("INFO", "stats"))).as_string();
      auto at = info.find("total_connections_received:");
      co_return info.substr(at, info.find('\r', at) - at);
    };
    auto before = co_await connections();
    // Allowed one channel, it subscribes and gets its messages: its confirmation was not taken as
    // the refused command's second reply, so nothing waits for a reply that never comes...
    co_await exec(admin, request("ACL", "SETUSER", "nochan", "&ok"));
    std::vector<std::string> ok{"ok"};
    sub.subscribe(ok);
    REQUIRE(co_await eventually([&]() -> awaitable<bool> {  // published once it has a subscriber
      co_return (co_await exec(admin, request("PUBLISH", "ok", "hello"))).as_integer() > 0;
    }));
    message m;
    do m = co_await sub.async_receive(use_awaitable);  // (confirmations: of the first connect's
    while (m.confirmation);                            // subscribe, refused as well, and of ok's)
    CHECK(m.channel == "ok");
    CHECK(m.payload == "hello");
    // ...and the health check does not find a request stuck and drop the connection (it would
    // within two intervals of a second).
    co_await sleep_for(std::chrono::milliseconds(2500));
    CHECK(co_await connections() == before);
  });
}

TEST_CASE("unix socket URLs") {
  redis_server server;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    connection conn(ctx.get_executor(), config::from_url("unix://" + server.unix_socket()));
    conn.start();
    CHECK((co_await exec(conn, request("PING"))).as_string() == "PONG");
  });
}

TEST_CASE("an unreachable server: waiting requests time out with not_connected - naming the address") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    auto cfg = config::from_url("redis://127.0.0.1:1");
    connection conn(ctx.get_executor(), cfg);
    conn.start();
    request ping("PING");
    ping.options.timeout = std::chrono::milliseconds(200);
    auto [ec, r] = co_await conn.async_exec(std::move(ping), use_tuple);
    CHECK(ec == errc::not_connected);
    CHECK(conn.last_error().find("connect to redis://127.0.0.1:1/0: Connection refused") != std::string::npos);
  });
}

TEST_CASE("closing completes everything with errc::closed") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    connection conn(ctx.get_executor(), config::from_url("redis://127.0.0.1:1"));
    conn.start();
    asio::steady_timer t(ctx);
    t.expires_after(std::chrono::milliseconds(20));
    co_await t.async_wait(use_awaitable);
    auto waiter = conn.async_exec(request("PING"), use_tuple);
    conn.close();
    auto [ec, r] = co_await std::move(waiter);
    CHECK(ec == errc::closed);
  });
}

TEST_CASE(
    "an io_context destroyed while a request waits frees the request - also one whose coroutine owns the connection") {
  // A coroutine that holds the connection and waits on it (a cluster client's refresh does): the
  // connection holds the request, the request the coroutine. When the io_context stops and goes,
  // both must go too.
  std::weak_ptr<blocking_connection> watch;
  {
    asio::io_context ctx;
    auto blocking = std::make_shared<blocking_connection>(ctx.get_executor(), shared_redis());
    watch = blocking;
    blocking->start();
    std::string src = key_prefix() + "never";
    auto waits = [](std::shared_ptr<blocking_connection> c, std::string key) -> awaitable<void> {
      co_await exec(*c, request("PING"));
      co_await exec(*c, request("BLMOVE", key, key + ":to", "RIGHT", "LEFT", 0));
    };
    asio::co_spawn(ctx, waits(std::move(blocking), src), asio::detached);
    asio::steady_timer stop(ctx, std::chrono::milliseconds(200));
    stop.async_wait([&](boost::system::error_code) { ctx.stop(); });
    ctx.run_for(std::chrono::seconds(10));
    REQUIRE(ctx.stopped());
    CHECK(!watch.expired());  // (still held: the BLMOVE waits)
  }
  CHECK(watch.expired());
}

TEST_CASE("empty requests, pub/sub commands off a subscriber and commands that change the connection are refused") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    connection conn(ctx.get_executor(), shared_redis());
    blocking_connection blocking(ctx.get_executor(), shared_redis());
    conn.start();
    blocking.start();
    auto [ec1, r1] = co_await conn.async_exec(request(), use_tuple);
    CHECK(ec1 == errc::invalid_request);
    auto [ec2, r2] = co_await conn.async_exec(request("UNSUBSCRIBE", "a", "b"), use_tuple);
    CHECK(ec2 == errc::invalid_request);
    auto [ec3, r3] = co_await blocking.async_exec(request("SUBSCRIBE", "a"), use_tuple);
    CHECK(ec3 == errc::invalid_request);
    CHECK((co_await exec(conn, request("PING"))).as_string() == "PONG");
    // A MULTI whose EXEC would come in a later request: other coroutines' commands would join the
    // transaction. In one request it runs.
    auto [ec4, r4] = co_await conn.async_exec(request("MULTI"), use_tuple);
    CHECK(ec4 == errc::invalid_request);
    auto [ec5, r5] = co_await conn.async_exec(request("HELLO", "3"), use_tuple);
    CHECK(ec5 == errc::invalid_request);
    // Replies out of step for every request after it, or a state a reconnect silently undoes.
    auto [ec6, r6] = co_await conn.async_exec(request("CLIENT", "REPLY", "OFF"), use_tuple);
    CHECK(ec6 == errc::invalid_request);
    auto [ec7, r7] = co_await blocking.async_exec(request("SELECT", "1"), use_tuple);
    CHECK(ec7 == errc::invalid_request);
    std::string probe = key_prefix() + "probe";
    co_await exec(conn, request("SET", probe, "here"));
    CHECK((co_await exec(conn, request("GET", probe))).as_string() == "here");      // replies in step
    CHECK((co_await exec(blocking, request("GET", probe))).as_string() == "here");  // database 0 still
    CHECK((co_await exec(conn, request("CLIENT", "ID"))).as_integer() > 0);
    std::string key = key_prefix() + "tx";
    request tx("MULTI");
    tx.push("SET", key, "1").push("INCR", key).push("EXEC");
    auto done = co_await exec(conn, std::move(tx));
    REQUIRE(done.as_array().size() == 4);
    CHECK(done.as_array()[3].as_array()[1].as_integer() == 2);
  });
}

TEST_CASE("a script that does not compile reports the compile error") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    connection conn(ctx.get_executor(), shared_redis());
    conn.start();
    script broken("this is not lua");
    std::vector<std::string> none;
    std::string what;
    try {
      co_await broken.run(conn, none, none);
    } catch (const boost::system::system_error& e) {
      what = e.what();
    }
    CHECK(what.find("Error compiling script") != std::string::npos);
  });
}

TEST_CASE("a reply the parser cannot read fails its request - also one safe to resend - and the connection recovers") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    connection conn(ctx.get_executor(), shared_redis());
    conn.start();
    // Arrays nested 9 deep: more than the RESP parser's 7 levels. Sent again after the reconnect
    // it would meet the same reply, drop that connection too, and so on for ever.
    const char* deep = "return {{{{{{{{{1}}}}}}}}}";
    for (bool resend_safe : {true, false}) {
      request r("EVAL", deep, "0");
      r.options.resend_safe = resend_safe;
      auto [ec, reply] = co_await conn.async_exec(std::move(r), use_tuple);
      CHECK(ec == errc::protocol_error);
      CHECK((co_await exec(conn, request("PING"))).as_string() == "PONG");
    }
    CHECK(conn.last_error().find("nested") != std::string::npos);
  });
}

TEST_CASE("a subscriber whose messages nobody receives keeps a bounded queue - a notice stands for what it dropped") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    auto cfg = shared_redis();
    cfg.max_queued_messages = 5;
    connection conn(ctx.get_executor(), cfg);
    subscriber sub(ctx.get_executor(), cfg);
    conn.start();
    sub.start();
    std::string ch = key_prefix() + "ch";
    sub.subscribe({ch});
    CHECK((co_await sub.async_receive(use_awaitable)).confirmation);
    // Nobody receives while 12 messages come: 5 fit, the 6th drops them for a notice, then (when
    // they come in one read, as they mostly do) 4 more fit after it, the 11th drops those too,
    // and the 12th waits behind the second notice.
    request burst;
    for (int i = 1; i <= 12; ++i) burst.push("PUBLISH", ch, fmt::format("m{}", i));
    co_await exec(conn, std::move(burst));
    asio::steady_timer t(ctx);
    for (int i = 0; i < 400 && sub.last_error().find("dropped") == std::string::npos; ++i) {
      t.expires_after(std::chrono::milliseconds(5));
      co_await t.async_wait(use_awaitable);
    }
    CHECK(sub.last_error().find("dropped for a notice") != std::string::npos);
    std::vector<std::string> got;
    for (;;) {
      message m = co_await sub.async_receive(use_awaitable);
      got.push_back(m.confirmation ? "notice" : m.payload);
      if (m.payload == "m12") break;
    }
    MESSAGE("received: " << fmt::format("{}", fmt::join(got, " ")));
    REQUIRE(got.size() <= 7);  // the first notice and at most m7 to m12
    CHECK(got.front() == "notice");
    for (const auto& g : got)
      if (g != "notice") CHECK(std::stoi(g.substr(1)) >= 7);  // m1 to m6 were dropped before any receive
    // Received at once, messages flow as before.
    co_await exec(conn, request("PUBLISH", ch, "after"));
    CHECK((co_await sub.async_receive(use_awaitable)).payload == "after");
  });
}

TEST_CASE("connections over TCP keep alive - so a blocking command finds out about a server that vanished") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    auto server = shared_redis();
    blocking_connection conn(ctx.get_executor(), server);
    conn.start();
    // The server sees the connection from addr=<ip>:<port>; that port is ours.
    std::string info = (co_await exec(conn, request("CLIENT", "INFO"))).as_string();
    auto at = info.find(" addr=");
    REQUIRE(at != std::string::npos);
    auto colon = info.find(' ', at + 1);
    colon = info.rfind(':', colon);
    unsigned port = static_cast<unsigned>(std::stoul(info.substr(colon + 1)));
    // /proc/net/tcp(6): "sl local rem st queues tr:when ...", addresses "<hex ip>:<hex port>"; tr 2 is
    // the keepalive timer, and when (hex, in 1/100 s) counts down from the 15 s of silence.
    std::stringstream table;
    for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"})
      if (std::ifstream f(path); f) table << f.rdbuf();  // (each starts with a header line)
    std::string line;
    bool found = false;
    while (std::getline(table, line)) {
      std::istringstream fields(line);
      std::string sl, local, remote, state, queues, timer;
      fields >> sl >> local >> remote >> state >> queues >> timer;
      // Ours: that local port, to the server's port, established (01). The same local port may
      // be in use towards another server too, or linger in TIME_WAIT from an earlier connection.
      if (local.size() < 5 || local.substr(local.size() - 4) != fmt::format("{:04X}", port)) continue;
      if (remote.size() < 5 || remote.substr(remote.size() - 4) != fmt::format("{:04X}", std::stoi(server.port)))
        continue;
      if (state != "01") continue;
      found = true;
      CHECK(timer.substr(0, 3) == "02:");
      long when = std::stol(timer.substr(3), nullptr, 16);
      CHECK(when > 1000);
      CHECK(when <= 1500);
    }
    CHECK(found);
  });
}
