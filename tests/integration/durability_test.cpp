// durability::replicated on a primary with a replica (both private redis-servers): an enqueue
// returns only once the replica has its jobs, fails naming what is missing when no replica
// answers in time, and a worker's finishes are replicated as they go. And on a Redis Cluster,
// where the WAIT goes to the queue's primary.
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"
#include "support/run.hpp"

#include <jobrt/producer.hpp>
#include <jobrt/redis/cluster.hpp>
#include <jobrt/redis/connection.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/worker.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <string>

namespace asio = boost::asio;
using namespace jobrt;
using namespace jobrt::test;
using asio::awaitable;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

namespace {

redis_backend_options replicated(std::chrono::milliseconds wait) {
  redis_backend_options o;
  o.durability = durability::replicated;
  o.replica_wait = wait;
  return o;
}

job_spec job_of(std::string group) {
  job_spec s;
  s.type = "t";
  s.payload = boost::json::object();
  s.group = std::move(group);
  return s;
}

std::vector<redis::config> one(redis::config cfg) { return std::vector<redis::config>(1, std::move(cfg)); }

std::int64_t ms_since(steady::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - t).count();
}

}  // namespace

TEST_CASE("durability replicated: an enqueue returns once a replica has it, and fails naming why when none answers") {
  redis_server primary;
  redis_server replica({"--replicaof", "127.0.0.1", std::to_string(primary.port()), "--enable-debug-command", "local"});
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        redis::connection at_primary(ctx.get_executor(), primary.config()),
            at_replica(ctx.get_executor(), replica.config());
        at_primary.start();
        at_replica.start();
        auto linked = [&]() -> awaitable<bool> {
          auto info = co_await redis::exec(at_replica, redis::request("INFO", "replication"));
          co_return info.as_string().find("master_link_status:up") != std::string::npos;
        };
        REQUIRE(co_await eventually(linked, 10s));
        redis_backend plain(ctx.get_executor(), primary.config());
        redis_backend durable(ctx.get_executor(), one(primary.config()), replicated(2000ms));
        producer fast(plain, "d"), safe(durable, "d");
        co_await fast.enqueue(job_of("a"));
        co_await safe.enqueue(job_of("a"));  // (its script loaded on its own connections)
        // The replica stops for 500 ms: an enqueue asked for it waits for it, the other not.
        asio::co_spawn(ctx, redis::exec(at_replica, redis::request("DEBUG", "SLEEP", "0.5")), asio::detached);
        // Asleep once a PING to it gets no answer for 50 ms.
        auto asleep = [&]() -> awaitable<bool> {
          redis::connection probe(ctx.get_executor(), replica.config());
          probe.start();
          redis::request ping("PING");
          ping.options.timeout = 50ms;
          auto [ec, r] = co_await probe.async_exec(std::move(ping), asio::as_tuple(asio::use_awaitable));
          probe.close();
          co_return ec == errc::timeout || ec == errc::not_connected;  // (a new connection's handshake waits too)
        };
        REQUIRE(co_await eventually(asleep, 5s));
        auto began = steady::now();
        co_await fast.enqueue(job_of("a"));
        auto fast_ms = ms_since(began);
        began = steady::now();
        co_await safe.enqueue(job_of("a"));
        auto safe_ms = ms_since(began);
        MESSAGE("while the replica slept: enqueue " << fast_ms << " ms, replicated enqueue " << safe_ms << " ms");
        CHECK(safe_ms >= 200);  // (asleep for most of its 500 ms still)
        // And it is at the replica the moment the call returns.
        auto enqueued = co_await redis::exec(
            at_replica, redis::request("HGET", redis_backend::key_prefix("d") + "stats", "enqueued"));
        CHECK(enqueued.as_string() == "4");
        // A worker's finishes go the same way: every job done, and the replica knows it.
        worker_options o;
        o.queue = "d";
        worker w(ctx.get_executor(), durable, o);
        w.add_handler("t", [](job_context&) -> awaitable<void> { co_return; });
        w.start();
        CHECK(co_await eventually([&] { return w.counters().completed == 4; }, 10s));
        co_await w.stop(1s);
        auto completed = co_await redis::exec(
            at_replica, redis::request("HGET", redis_backend::key_prefix("d") + "stats", "completed"));
        CHECK(completed.as_string() == "4");
        // A replica behind: the call fails; sent again (its id: a duplicate now, on another of
        // the backend's connections), it fails again: its WAIT covers the first call's writes.
        redis_backend hopeful(ctx.get_executor(), one(primary.config()), replicated(200ms));
        producer p(hopeful, "d");
        asio::co_spawn(ctx, redis::exec(at_replica, redis::request("DEBUG", "SLEEP", "1")), asio::detached);
        REQUIRE(co_await eventually(asleep, 5s));
        auto with_id = job_of("c");
        with_id.id = "c-1";
        for (int attempt = 0; attempt < 2; ++attempt) {
          CAPTURE(attempt);
          try {
            co_await p.enqueue(with_id);
            FAIL_CHECK("no error");
          } catch (const boost::system::system_error& e) {
            CHECK(e.code() == errc::not_replicated);
          }
        }
        // No replica: the call fails once its wait is over, saying so; the job is at the primary.
        replica.stop();
        try {
          co_await p.enqueue(job_of("b"));
          FAIL("no error");
        } catch (const boost::system::system_error& e) {
          CHECK(e.code() == errc::not_replicated);
          CHECK_MESSAGE(
              std::string(e.what()).find("0 of 1 replicas acknowledged it within 200 ms") != std::string::npos,
              e.what());
        }
        CHECK((co_await plain.counts("d")).enqueued == 6);  // (the four before, c-1 once, and this one)
      },
      60s);
}

TEST_CASE("durability replicated on a Redis Cluster: the queue's primary waits for its replica") {
  auto node = shared_cluster();
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        redis_backend durable(ctx.get_executor(), one(node), replicated(2000ms));
        auto queue = key_prefix() + "replicated";
        producer p(durable, queue);
        for (int i = 0; i < 3; ++i) co_await p.enqueue(job_of("g"));
        worker_options o;
        o.queue = queue;
        worker w(ctx.get_executor(), durable, o);
        w.add_handler("t", [](job_context&) -> awaitable<void> { co_return; });
        w.start();
        CHECK(co_await eventually([&] { return w.counters().completed == 3; }, 10s));
        co_await w.stop(1s);
        CHECK((co_await durable.counts(queue)).completed == 3);
      },
      60s);
}
