// Redis Sentinel (redis+sentinel://) against a real deployment on loopback (scripts/sentinel.sh:
// a primary, its replica, three redis-sentinel processes). A connection finds the primary
// through the sentinels, past one that is down, and says what each said when none can tell;
// every kind of connection moves to the new primary at a SENTINEL FAILOVER as soon as the
// sentinels announce it; and workers carry 20,000 grouped jobs through a SENTINEL FAILOVER and a
// kill -9 of the primary, losing no acknowledged job when enqueues wait for a replica; a stream
// bridge reads at the primary and follows a failover.
#include <jobrt/bridge.hpp>
#include <jobrt/memory_backend.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/redis/cluster.hpp>
#include <jobrt/redis/connection.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/worker.hpp>

#include "support/redis_sentinel.hpp"
#include "support/redis_server.hpp"
#include "support/run.hpp"
#include "support/shell.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace asio = boost::asio;
using namespace jobrt;
using namespace jobrt::redis;
using namespace jobrt::test;
using namespace std::chrono_literals;
using namespace asio::experimental::awaitable_operators;
using asio::awaitable;
using steady = std::chrono::steady_clock;

namespace {

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

// The port the server on the other end of `c` listens on (INFO server).
template <class Connection>
awaitable<int> port_behind(Connection& c) {
  auto info = co_await exec(c, request("INFO", "server"));
  auto at = info.as_string().find("tcp_port:");
  co_return at == std::string::npos ? 0 : std::stoi(info.as_string().substr(at + 9));
}

// The next message, or nothing within `limit`.
awaitable<std::optional<message>> receive_within(subscriber& s, std::chrono::milliseconds limit) {
  asio::steady_timer timer(co_await asio::this_coro::executor, limit);
  auto got = co_await (s.async_receive(use_tuple) || timer.async_wait(use_tuple));
  if (got.index() != 0 || std::get<0>(std::get<0>(got))) co_return std::nullopt;
  co_return std::get<1>(std::get<0>(got));
}

// Whether a CLIENT LIST shows the bridge's reader (client name "streamer") blocked in XREADGROUP.
bool reading(const std::string& clients) {
  std::istringstream lines(clients);
  for (std::string line; std::getline(lines, line);)
    if (line.find(" name=streamer:blocking ") != std::string::npos &&
        line.find(" cmd=xreadgroup ") != std::string::npos)
      return true;
  return false;
}

// jobrt's output and exit status ("exit=N" last).
std::string jobrt_says(const std::string& args) {
  return output_of(fmt::format("{} {} 2>&1; echo \"exit=$?\"", JOBRT_BIN, args));
}

}  // namespace

TEST_CASE(
    "redis+sentinel:// - a connection finds the primary past a sentinel that is down, and an unknown name, a wrong "
    "password or no sentinel up is an error naming what each said") {
  redis_sentinels s("secret", "watch");
  int dead = free_port(), dead2 = free_port();
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        auto url =
            fmt::format("redis+sentinel://:secret@127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}/jobrt?sentinel_password=watch",
                        dead, s.sentinel(0), s.sentinel(1));
        connection c(ctx.get_executor(), config::from_url(url));
        c.start();
        CHECK(co_await port_behind(c) == s.server(0));

        auto unknown = config::from_url(
            fmt::format("redis+sentinel://:secret@127.0.0.1:{},127.0.0.1:{}/nosuch?sentinel_password=watch",
                        s.sentinel(0), s.sentinel(1)));
        connection u(ctx.get_executor(), unknown);
        u.start();
        CHECK(co_await eventually([&] { return u.last_failure() != connect_failure::none; }, 5s));
        CHECK(u.last_failure() == connect_failure::unresolved);
        CHECK(u.last_error() == fmt::format("connect to redis+sentinel://127.0.0.1:{0},127.0.0.1:{1}/nosuch: no "
                                            "sentinel named the primary 'nosuch': 127.0.0.1:{0} knows no primary "
                                            "'nosuch'; 127.0.0.1:{1} knows no primary 'nosuch'",
                                            s.sentinel(0), s.sentinel(1)));

        auto wrong = config::from_url(
            fmt::format("redis+sentinel://:secret@127.0.0.1:{}/jobrt?sentinel_password=nope", s.sentinel(2)));
        connection w(ctx.get_executor(), wrong);
        w.start();
        CHECK(co_await eventually([&] { return w.last_failure() != connect_failure::none; }, 5s));
        CHECK(w.last_failure() == connect_failure::denied);
        CHECK(w.last_error().find(fmt::format("127.0.0.1:{}: AUTH refused: WRONGPASS", s.sentinel(2))) !=
              std::string::npos);
        CHECK(w.last_error().find("nope") == std::string::npos);

        // A sentinel that hangs (its port open, nothing answered): the attempt times out there,
        // and the next one begins at the next sentinel.
        s.signal(s.sentinel(0), SIGSTOP);
        auto hung = config::from_url(
            fmt::format("redis+sentinel://:secret@127.0.0.1:{},127.0.0.1:{}/jobrt?sentinel_password=watch",
                        s.sentinel(0), s.sentinel(1)));
        hung.connect_timeout = 1000ms;
        connection h(ctx.get_executor(), hung);
        h.start();
        CHECK(co_await port_behind(h) == s.server(0));
        CHECK(h.last_error().find(fmt::format("sentinel 127.0.0.1:{}: timed out after 1000 ms", s.sentinel(0))) !=
              std::string::npos);
        s.signal(s.sentinel(0), SIGCONT);

        connection none(ctx.get_executor(),
                        config::from_url(fmt::format("redis+sentinel://127.0.0.1:{},127.0.0.1:{}/jobrt", dead, dead2)));
        none.start();
        CHECK(co_await eventually([&] { return none.last_failure() != connect_failure::none; }, 5s));
        CHECK(none.last_failure() == connect_failure::refused);
        CHECK(none.last_error().find(fmt::format("127.0.0.1:{}: Connection refused; 127.0.0.1:{}: Connection refused",
                                                 dead, dead2)) != std::string::npos);
      },
      30s);
  // The command line says the same, at once.
  auto began = steady::now();
  auto said = jobrt_says(fmt::format(
      "stats --redis 'redis+sentinel://:secret@127.0.0.1:{}/nosuch?sentinel_password=watch'", s.sentinel(0)));
  CAPTURE(said);
  CHECK(said.find(fmt::format("no sentinel named the primary 'nosuch': 127.0.0.1:{} knows no primary 'nosuch'",
                              s.sentinel(0))) != std::string::npos);
  CHECK(said.ends_with("exit=1\n"));
  CHECK(steady::now() - began < 3s);
  CHECK(said.find("secret") == std::string::npos);
  CHECK(said.find("watch") == std::string::npos);
}

TEST_CASE(
    "redis+sentinel:// - shared, blocking and pub/sub connections move to the new primary as a SENTINEL FAILOVER is "
    "announced, and none stays at the old one") {
  redis_sentinels s;
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        auto cfg = config::from_url(s.url());
        connection c(ctx.get_executor(), cfg);
        blocking_connection b(ctx.get_executor(), cfg);
        subscriber sub(ctx.get_executor(), cfg);
        c.start();
        b.start();
        sub.subscribe({"news"});
        sub.start();
        CHECK(co_await port_behind(c) == s.server(0));
        CHECK(co_await port_behind(b) == s.server(0));
        auto confirmed = co_await receive_within(sub, 5s);
        CHECK((confirmed && confirmed->confirmation));
        auto ours_at = [&](int port) {
          return s.cli(port, {"CLIENT", "LIST"}).find(" name=jobrt ") != std::string::npos;
        };
        CHECK(ours_at(s.server(0)));

        s.cli(s.sentinel(0), {"SENTINEL", "FAILOVER", "jobrt"});
        CHECK(co_await eventually([&] { return s.primary() == s.server(1); }, 15s));
        // The old primary takes writes still (the sentinels make it a replica some seconds
        // later): what moved the connections is the sentinels' +switch-master.
        CHECK(co_await eventually([&] { return !ours_at(s.server(0)); }, 5s));
        CHECK(s.role_of(s.server(0)) == "master");
        CHECK(co_await port_behind(c) == s.server(1));
        CHECK(co_await port_behind(b) == s.server(1));
        CHECK(co_await eventually(
            [&]() -> awaitable<bool> {
              s.cli(s.server(1), {"PUBLISH", "news", "hello"});
              auto m = co_await receive_within(sub, 200ms);
              co_return m && m->payload == "hello";
            },
            10s));
      },
      60s);
}

TEST_CASE(
    "rediss+sentinel:// - over TLS, the sentinels name the primary and a connection follows a SENTINEL FAILOVER") {
  redis_sentinels s("secret", "watch", true);
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        auto cfg = config::from_url(s.url());
        REQUIRE(cfg.tls);
        connection c(ctx.get_executor(), cfg);
        c.start();
        CHECK(co_await port_behind(c) == s.server(0));
        s.cli(s.sentinel(1), {"SENTINEL", "FAILOVER", "jobrt"});
        CHECK(co_await eventually([&] { return s.primary() == s.server(1); }, 15s));
        auto at_new_primary = [&]() -> awaitable<bool> {
          try {
            co_return co_await port_behind(c) == s.server(1);
          } catch (const std::exception&) {
            co_return false;  // (a request cut by the switch)
          }
        };
        CHECK(co_await eventually(at_new_primary, 10s));
        // Asked without TLS, the sentinels do not answer in RESP: the error names each.
        auto plain = cfg;
        plain.tls = false;
        connection p(ctx.get_executor(), plain);
        p.start();
        CHECK(co_await eventually([&] { return p.last_failure() != connect_failure::none; }, 5s));
        CHECK(p.last_error().find("no sentinel named the primary 'jobrt'") != std::string::npos);
      },
      60s);
}

namespace {

// Jobs first to first + n - 1, over `groups` groups in turn, each with an id of its own.
std::vector<job_spec> jobs_from(int first, int n, int groups) {
  std::vector<job_spec> specs;
  for (int k = first; k < first + n; ++k) {
    job_spec spec;
    spec.type = "t";
    spec.group = fmt::format("g{}", k % groups);
    spec.id = fmt::format("job-{}", k);
    spec.payload = boost::json::object{{"i", k}};
    specs.push_back(std::move(spec));
  }
  return specs;
}

// One queue of the run below, with its durability, and what its jobs did.
struct stream {
  durability mode;
  std::string queue;
  std::unique_ptr<redis_backend> store;
  std::unique_ptr<worker> w;
  std::vector<int> runs;
  std::vector<int> last_first;
  std::atomic<int> acknowledged{0};
  int lost = 0, ran_twice = 0, inversions = 0;
  steady::duration longest_wait{};  // the longest time an enqueue waited to be stored
};

}  // namespace

TEST_CASE(
    "redis+sentinel:// - workers carry 20,000 grouped jobs through a SENTINEL FAILOVER and a kill -9 of the primary, "
    "and with durability replicated no acknowledged job is lost") {
  static constexpr int total = 20000, groups = 200, batch = 20;
  redis_sentinels s;
  std::atomic<bool> killed{false}, faults_done{false};
  std::array<stream, 2> streams{};
  std::string faults_failed;
  std::jthread faults;  // (after streams: joined before they go)
  streams[0].mode = durability::primary;
  streams[1].mode = durability::replicated;
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        struct before_the_io_context_goes {  // (also when the run fails or times out)
          std::array<stream, 2>& streams;
          ~before_the_io_context_goes() {
            for (auto& st : streams) {
              st.w.reset();
              st.store.reset();
            }
          }
        } guard{streams};
        for (auto& st : streams) {
          st.queue = key_prefix() + (st.mode == durability::primary ? "primary" : "replicated");
          st.runs.assign(total, 0);
          st.last_first.assign(groups, -1);
          redis_backend_options bo;
          bo.durability = st.mode;
          bo.replica_wait = 1s;
          st.store = std::make_unique<redis_backend>(ctx.get_executor(), cluster_seeds(s.url()), bo);
          worker_options o;
          o.queue = st.queue;
          o.concurrency = 16;
          st.w = std::make_unique<worker>(ctx.get_executor(), *st.store, o);
          st.w->add_handler("t", [&st](job_context& job) -> awaitable<void> {
            auto i = static_cast<int>(job.payload().as_object().at("i").as_int64());
            if (st.runs[static_cast<std::size_t>(i)]++ == 0) {
              auto& last = st.last_first[static_cast<std::size_t>(i % groups)];
              if (i < last) ++st.inversions;
              last = i;
            }
            co_return;
          });
          st.w->start();
        }
        // The faults, from a thread of their own (redis-cli blocks): at 4,000 jobs a SENTINEL
        // FAILOVER; once the old primary is a replica in sync, a kill -9 of the new one, and
        // once the sentinels have failed over to the old one, the killed one back as a replica.
        faults = std::jthread([&] {
          try {
            eventually_here([&] { return streams[0].acknowledged >= 4000 && streams[1].acknowledged >= 4000; }, 60s);
            int first = s.primary();
            s.cli(s.sentinel(0), {"SENTINEL", "FAILOVER", "jobrt"});
            CHECK(eventually_here([&] { return s.primary() != first; }, 15s));
            int second = s.primary();
            // (A server being turned into a replica may refuse a call for a moment: asked again.)
            CHECK(eventually_here(
                [&] {
                  try {
                    return s.cli(first, {"INFO", "replication"}).find("master_link_status:up") != std::string::npos;
                  } catch (const std::exception&) {
                    return false;
                  }
                },
                30s));
            s.kill(second);
            killed = true;
            CHECK(eventually_here([&] { return s.primary() == first; }, 30s));
            s.restart(second);
          } catch (const std::exception& e) {
            faults_failed = e.what();
            killed = true;  // (the producers go on)
          }
          faults_done = true;
        });
        // Each queue's producer: `batch` jobs a call, one call every 5 ms; at 12,000 it waits for
        // the kill, so that both faults come while it enqueues. A call that fails is sent again
        // (the jobs' ids keep a stored job from being stored twice).
        auto produce = [&](stream& st) -> awaitable<void> {
          producer prod(*st.store, st.queue);
          for (int i = 0; i < total;) {
            if (i >= 12000 && !killed) {
              co_await sleep_for(10ms);
              continue;
            }
            auto specs = jobs_from(i, batch, groups);
            auto began = steady::now();
            for (;;) {
              try {
                co_await prod.enqueue_bulk(specs);
                break;
              } catch (const std::exception&) {
                // (during a failover: sent again)
              }
              co_await sleep_for(50ms);
            }
            st.longest_wait = std::max(st.longest_wait, steady::now() - began);
            i += batch;
            st.acknowledged = i;
            co_await sleep_for(5ms);
          }
        };
        co_await (produce(streams[0]) && produce(streams[1]));
        CHECK(co_await eventually([&] { return faults_done.load(); }, 60s));
        // Done when nothing is left to run (jobs lost with a primary never will be).
        for (auto& st : streams) {
          CHECK(co_await eventually(
              [&]() -> awaitable<bool> {
                auto c = co_await st.store->counts(st.queue);
                co_return c.ready_lanes == 0 && c.running == 0 && c.delayed == 0;
              },
              60s));
          co_await st.w->stop(2s);
        }
      },
      240s);
  faults.join();
  CHECK_MESSAGE(faults_failed.empty(), faults_failed);
  for (auto& st : streams) {
    for (int i = 0; i < st.acknowledged; ++i) {
      if (st.runs[static_cast<std::size_t>(i)] == 0) ++st.lost;
      if (st.runs[static_cast<std::size_t>(i)] > 1) ++st.ran_twice;
    }
    auto name = st.mode == durability::primary ? "primary" : "replicated";
    MESSAGE(
        fmt::format("durability {}: {} acknowledged, {} lost, {} ran twice, {} order inversions; the longest "
                    "enqueue waited {} ms",
                    name, st.acknowledged.load(), st.lost, st.ran_twice, st.inversions,
                    std::chrono::duration_cast<std::chrono::milliseconds>(st.longest_wait).count()));
    CAPTURE(name);
    CHECK(st.acknowledged == total);
    CHECK(st.inversions == 0);
    if (st.mode == durability::primary) {
      CHECK(st.longest_wait < 10s);  // enqueues carry on within the failover's time
    } else {
      // Enqueues wait for a replica: after the SENTINEL FAILOVER, until the sentinels make the
      // old primary one (about 8 s later), and after the kill, until the killed one is back.
      CHECK(st.longest_wait < 30s);
      CHECK(st.lost == 0);
    }
  }
}

TEST_CASE(
    "redis-stream+sentinel:// - a stream bridge reads at the primary the sentinels name, and follows a SENTINEL "
    "FAILOVER: each entry one job") {
  redis_sentinels s;
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        auto url = fmt::format(
            "redis-stream+sentinel://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}/jobrt/"
            "in?group=g&consumer=b&lock_ttl_ms=600",
            s.sentinel(0), s.sentinel(1), s.sentinel(2));
        auto from = stream_source::from_url(url);
        from.server.client_name = "streamer";
        memory_backend store(ctx.get_executor());
        producer to(store, "bridged");
        stream_bridge bridge(ctx.get_executor(), from, to);
        bool ended = false;
        asio::co_spawn(ctx, bridge.run(), [&](std::exception_ptr e) {
          ended = true;
          if (e) std::rethrow_exception(e);
        });
        // Entries appended through the sentinels too: each sent again until the primary of the
        // moment took it.
        connection c(ctx.get_executor(), config::from_url(s.url()));
        c.start();
        auto append = [&](int first, int n) -> awaitable<void> {
          for (int i = first; i < first + n; ++i) {
            auto added = [&, i]() -> awaitable<bool> {
              request xadd("XADD", "in", "*", "type", "t", "id", fmt::format("e{}", i));
              auto [ec, r] = co_await c.async_exec(std::move(xadd), use_tuple);
              co_return !ec;
            };
            REQUIRE(co_await eventually(added, 20s));
          }
        };
        auto stored = [&](std::uint64_t n) {
          return [&bridge, n]() -> awaitable<bool> {
            auto counts = co_await bridge.sample();
            bool all = counts.enqueued >= n;  // (jobs stored, each once)
            co_return all&& counts.pending == 0;
          };
        };
        co_await append(0, 100);
        auto first_hundred = stored(100);
        REQUIRE(co_await eventually(first_hundred, 10s));
        auto blocked_at = [&](int port) { return reading(s.cli(port, {"CLIENT", "LIST"})); };
        CHECK(co_await eventually([&] { return blocked_at(s.server(0)); }, 5s));

        s.cli(s.sentinel(0), {"SENTINEL", "FAILOVER", "jobrt"});
        CHECK(co_await eventually([&] { return s.primary() == s.server(1); }, 15s));
        // The old primary takes writes until the sentinels make it a replica, and loses them then
        // (asynchronous replication): the entries go in once it is one.
        CHECK(co_await eventually([&] { return s.role_of(s.server(0)) == "slave"; }, 30s));
        co_await append(100, 100);
        auto all = stored(200);
        REQUIRE(co_await eventually(all, 30s));
        CHECK(co_await eventually([&] { return blocked_at(s.server(1)); }, 5s));

        // Every entry one job, and no other.
        claim_options o;
        o.worker = "w";
        o.max = 1000;
        auto claimed = co_await store.claim("bridged", o);
        std::vector<std::string> ids;
        for (auto& j : claimed) ids.push_back(j.job.id);
        std::sort(ids.begin(), ids.end());
        std::vector<std::string> entries;
        for (int i = 0; i < 200; ++i) entries.push_back(fmt::format("e{}", i));
        std::sort(entries.begin(), entries.end());
        CHECK(ids == entries);
        bridge.stop();
        CHECK(co_await eventually([&] { return ended; }, 5s));
      },
      90s);
}
