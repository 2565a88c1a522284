// docs/PROTOCOL.md, followed to the letter: jobs enqueued with redis-cli alone run on a C++ worker.
#include "support/redis_server.hpp"
#include "support/run.hpp"

#include <jobrt/memory_backend.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/sharded_backend.hpp>
#include <jobrt/worker.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#ifndef JOBRT_LUA_DIR
#error "JOBRT_LUA_DIR must name runtime/lua"
#endif

extern char** environ;

namespace asio = boost::asio;
using namespace jobrt;
using namespace jobrt::test;
using asio::awaitable;

namespace {

// Runs redis-cli with these arguments; returns what it printed.
std::string redis_cli_process(const std::vector<std::string>& args) {
  char out_path[] = "/tmp/jobrt-cli-XXXXXX";
  int fd = ::mkstemp(out_path);
  REQUIRE(fd >= 0);
  ::close(fd);
  std::vector<std::string> all{"redis-cli"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 1, out_path, O_WRONLY | O_TRUNC, 0644);
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, "redis-cli", &files, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  REQUIRE_MESSAGE(rc == 0, "cannot run redis-cli");
  int status = 0;
  ::waitpid(pid, &status, 0);
  std::ifstream in(out_path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(out_path);
  CHECK(WIFEXITED(status));
  return text;
}

// A group of each of two shards.
std::pair<std::string, std::string> group_of_each_shard() {
  std::string in0, in1;
  for (int i = 0; in0.empty() || in1.empty(); ++i) {
    auto g = fmt::format("g{}", i);
    auto& slot = sharded_backend::shard_of(g, 2) == 0 ? in0 : in1;
    if (slot.empty()) slot = g;
  }
  return {in0, in1};
}

// Jobs a1 and a2 of group in0 and b1 of group in1 (g++ 12: braced lists outside the coroutine).
std::vector<job_spec> jobs_over_both_shards(const std::string& in0, const std::string& in1) {
  std::vector<job_spec> specs;
  for (auto [id, group] : {std::pair{"a1", in0}, std::pair{"a2", in0}, std::pair{"b1", in1}}) {
    job_spec s;
    s.type = "t";
    s.id = id;
    s.group = group;
    specs.push_back(std::move(s));
  }
  return specs;
}

}  // namespace

TEST_CASE("jobs enqueued with redis-cli by the protocol document run on a C++ worker") {
  auto cfg = shared_redis();
  std::string queue = key_prefix() + "protocol";
  std::string p = fmt::format("jobrt:{{{}}}:", queue);
  auto now_ms = [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  auto enqueued_at = now_ms();
  auto run_at = enqueued_at + 400;  // the same clock as the server's: both on this machine
  auto printed = redis_cli_process({"-h", cfg.host, "-p", cfg.port, "--eval", JOBRT_LUA_DIR "/enqueue.lua", p + "ready",
                                    p + "seq", p + "ids", p + "stats", p + "delayed", ",", "5",
                                    // grouped and delayed by 200 ms: it joins its group when due
                                    "order-3", "crm:acme", R"({"type":"import","payload":{"rows":40},"u":1})", "+200",
                                    // grouped, with an id of ours
                                    "order-1", "crm:acme", R"({"type":"import","payload":{"rows":10},"u":1})", "",
                                    // the same group, after it
                                    "order-2", "crm:acme", R"({"type":"import","payload":{"rows":20},"u":1})", "",
                                    // ungrouped, id assigned, due in 300 ms
                                    "", "", R"({"type":"import","payload":{"rows":30}})", "+300",
                                    // ungrouped, id assigned, to run at a time (ms since the epoch)
                                    "", "", R"({"type":"import","payload":{"rows":50}})", std::to_string(run_at)});
  CHECK(printed.find("order-1") != std::string::npos);
  CHECK(printed.find("order-2") != std::string::npos);
  // The same id again while it is pending: a duplicate, nothing stored.
  auto again = redis_cli_process({"-h", cfg.host, "-p", cfg.port, "--eval", JOBRT_LUA_DIR "/enqueue.lua", p + "ready",
                                  p + "seq", p + "ids", p + "stats", p + "delayed", ",", "1", "order-1", "crm:acme",
                                  R"({"type":"import","payload":{"rows":99},"u":1})", ""});
  CHECK(again == "order-1\n1\n");  // redis-cli prints raw replies when not on a terminal

  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), cfg);
    worker_options o;
    o.queue = queue;
    worker w(ctx.get_executor(), store, o);
    std::vector<std::string> ran;
    std::map<std::int64_t, std::int64_t> started_at;  // by rows
    w.add_handler("import", [&](job_context& c) -> awaitable<void> {
      ran.push_back(fmt::format("{}:{}:{}", c.id(), c.group(), c.payload().at("rows").as_int64()));
      started_at[c.payload().at("rows").as_int64()] = now_ms();
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return ran.size() == 5; }, 10s));
    co_await w.stop(std::chrono::seconds(5));
    REQUIRE(ran.size() == 5);
    // The group's jobs in their order: the delayed order-3, enqueued first, joined the group when
    // it was due, behind the two others. (The ungrouped jobs may run between them: once due, they
    // do not wait for the group, and on a slow machine they are due before the worker starts.)
    std::vector<std::string> group_runs;
    std::copy_if(ran.begin(), ran.end(), std::back_inserter(group_runs),
                 [](const std::string& r) { return r.starts_with("order-"); });
    CHECK(group_runs == std::vector<std::string>{"order-1:crm:acme:10", "order-2:crm:acme:20", "order-3:crm:acme:40"});
    CHECK(started_at[40] >= enqueued_at + 200);
    CHECK(started_at[30] >= enqueued_at + 300);
    CHECK(started_at[50] >= run_at);
    CHECK(std::count_if(ran.begin(), ran.end(), [](auto& r) { return r.ends_with("::50"); }) == 1);
    auto counts = co_await store.counts(queue);
    CHECK(counts.enqueued == 5);
    CHECK(counts.completed == 5);
  });
}

TEST_CASE("jobs enqueued with redis-cli into a sharded queue by the protocol document run on a C++ worker") {
  auto cfg = shared_redis();
  std::string queue = key_prefix() + "protocol-sharded";
  constexpr std::size_t shards = 4;
  // 1. The queue's shards, as the first process to use it stored them.
  redis_cli(cfg, {"SET", fmt::format("jobrt:{{{}}}:shards", queue), std::to_string(shards)});
  // 2. The group's shard: FNV-1a, 64 bits, with the document's constants, modulo S.
  auto fnv = [](std::string_view key) {
    std::uint64_t h = 14695981039346656037ull;
    for (char c : key) {
      h ^= static_cast<unsigned char>(c);
      h *= 1099511628211ull;
    }
    return static_cast<std::size_t>(h % shards);
  };
  auto k = fnv("crm:acme");
  CHECK(k == sharded_backend::shard_of("crm:acme", shards));
  // 3. One call at that shard's keys, its count written <n>:<S>:<k>.
  std::string p = fmt::format("jobrt:{{{}#{}}}:", queue, k);
  auto printed =
      redis_cli_process({"-h", cfg.host, "-p", cfg.port, "--eval", JOBRT_LUA_DIR "/enqueue.lua", p + "ready", p + "seq",
                         p + "ids", p + "stats", p + "delayed", ",", fmt::format("3:{}:{}", shards, k),
                         // grouped, ids assigned
                         "", "crm:acme", R"({"type":"import","payload":{"rows":10}})", "", "", "crm:acme",
                         R"({"type":"import","payload":{"rows":20}})", "",
                         // ungrouped, with an id of ours (its shard: any, here the group's)
                         "order-9", "", R"({"type":"import","payload":{"rows":90}})", ""});
  // The shard's ids: m * S + k.
  CHECK(printed == fmt::format("{}\n0\n{}\n0\norder-9\n0\n", 1 * shards + k, 2 * shards + k));
  // 4. The mark that wakes a waiting worker.
  auto now = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch());
  redis_cli(cfg,
            {"ZADD", fmt::format("jobrt:{{{}}}:marks", queue), "NX", std::to_string(now.count()), std::to_string(k)});

  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), cfg);
    sharded_backend sharded(store, shards);
    worker_options o;
    o.queue = queue;
    o.claim_wait = std::chrono::seconds(30);  // (woken by the mark, not at the end of a wait)
    worker w(ctx.get_executor(), sharded, o);
    std::vector<std::string> ran;
    w.add_handler("import", [&](job_context& c) -> awaitable<void> {
      ran.push_back(fmt::format("{}:{}:{}", c.id(), c.group(), c.payload().at("rows").as_int64()));
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return ran.size() == 3; }, 10s));
    co_await w.stop(std::chrono::seconds(5));
    std::vector<std::string> group_runs;
    std::copy_if(ran.begin(), ran.end(), std::back_inserter(group_runs),
                 [](const std::string& r) { return r.find(":crm:acme:") != std::string::npos; });
    CHECK(group_runs == std::vector<std::string>{fmt::format("{}:crm:acme:10", 1 * shards + k),
                                                 fmt::format("{}:crm:acme:20", 2 * shards + k)});
    auto counts = co_await sharded.counts(queue);
    CHECK(counts.enqueued == 3);
    CHECK(counts.completed == 3);
  });
}

TEST_CASE("on one server the enqueue script given the marks key marks its shard when it stores a job due now") {
  auto cfg = shared_redis();
  std::string queue = key_prefix() + "protocol-marks";
  std::string marks = fmt::format("jobrt:{{{}}}:marks", queue);
  constexpr std::size_t shards = 4, k = 3;
  std::string p = fmt::format("jobrt:{{{}#{}}}:", queue, k);
  auto enqueue = [&](std::vector<std::string> jobs) {
    std::vector<std::string> args{"-h",          cfg.host,
                                  "-p",          cfg.port,
                                  "--eval",      JOBRT_LUA_DIR "/enqueue.lua",
                                  p + "ready",   p + "seq",
                                  p + "ids",     p + "stats",
                                  p + "delayed", marks,
                                  ",",           fmt::format("{}:{}:{}", jobs.size() / 4, shards, k)};
    args.insert(args.end(), jobs.begin(), jobs.end());
    return redis_cli_process(args);
  };
  auto marked = [&] {  // (a RESP reply: "$-1" is nil)
    auto score = redis_cli(cfg, {"ZSCORE", marks, std::to_string(k)});
    return score.starts_with("$") && !score.starts_with("$-1");
  };
  // Jobs due later: the promoter marks the shard when they are due, not the enqueue.
  enqueue({"late-1", "", R"({"type":"t"})", "+60000", "late-2", "g", R"({"type":"t"})", "+60000"});
  CHECK_FALSE(marked());
  // One job due now (the script's short path), then several (its general path).
  enqueue({"now-1", "", R"({"type":"t"})", ""});
  CHECK(marked());
  redis_cli(cfg, {"DEL", marks});
  enqueue({"now-2", "g", R"({"type":"t"})", "", "now-3", "", R"({"type":"t"})", "+60000"});
  CHECK(marked());
  redis_cli(cfg, {"DEL", marks});
  // A duplicate stores nothing.
  enqueue({"now-1", "", R"({"type":"t"})", ""});
  CHECK_FALSE(marked());
  // Through the backend on one server: the enqueue call marks.
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), cfg);
    co_await store.stored_shards(queue, shards);
    encoded_job j;
    j.body = R"({"type":"t"})";
    std::vector<encoded_job> jobs(1, j);
    auto got = co_await store.enqueue_in_shard(queue, k, std::move(jobs));
    CHECK(got.marked);
    CHECK(got.results.size() == 1);
    CHECK(marked());
  });
}

TEST_CASE("a worker on a queue of one shard, as the jobrt command runs it, hears the wake-up of a job delayed later") {
  auto cfg = shared_redis();
  std::string queue = key_prefix() + "one-shard-wakeup";
  auto now_ms = [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), cfg);
    sharded_backend one(store, 1);
    worker_options o;
    o.queue = queue;
    o.promote_backstop = std::chrono::seconds(60);  // (the default: no promotion comes from it here)
    worker w(ctx.get_executor(), one, o);
    std::int64_t ran_at = 0;
    w.add_handler("t", [&](job_context&) -> awaitable<void> {
      ran_at = now_ms();
      co_return;
    });
    w.start();
    co_await sleep_for(std::chrono::milliseconds(500));  // the promoter waits, with nothing delayed
    producer p(one, queue);
    job_spec s;
    s.type = "t";
    s.delay = std::chrono::milliseconds(200);
    auto enqueued_at = now_ms();
    co_await p.enqueue(std::move(s));
    CHECK(co_await eventually([&] { return ran_at != 0; }, std::chrono::seconds(5)));
    CHECK(ran_at >= enqueued_at + 200);
    co_await w.stop(std::chrono::seconds(5));
  });
}

TEST_CASE("a finish across shards that fails in one is sent again whole and gets the other shards' first answers") {
  auto cfg = shared_redis();
  std::string queue = key_prefix() + "sharded-partial";
  constexpr std::size_t shards = 2;
  auto [in0, in1] = group_of_each_shard();
  // Shard 1's finish fails while its answers key holds a string (WRONGTYPE).
  auto broken = redis_backend::key_prefix(sharded_backend::shard_queue(queue, 1)) + "answers:w";
  auto break_shard = [&] { redis_cli(cfg, {"SET", broken, "x"}); };
  auto mend_shard = [&] { redis_cli(cfg, {"DEL", broken}); };
  auto specs = jobs_over_both_shards(in0, in1);
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), cfg);
    sharded_backend sharded(store, shards);
    producer p(sharded, queue);
    co_await p.enqueue_bulk(specs);
    claim_options co;
    co.worker = "w";
    co.max = 10;
    std::vector<claimed_job> got;
    for (int i = 0; i < 5 && got.size() < 2; ++i) {
      auto more = co_await sharded.claim(queue, co);
      got.insert(got.end(), more.begin(), more.end());
    }
    REQUIRE(got.size() == 2);
    std::vector<finish_item> items(2);
    for (auto& j : got) {
      auto& item = items[j.group == in0 ? 0 : 1];
      item.token = j.token;
      item.want_next = finish_item::next_policy::yes;
    }
    break_shard();
    bool failed = false;
    try {
      co_await sharded.finish(queue, "w", items, std::chrono::seconds(30));
    } catch (const std::exception&) {
      failed = true;
    }
    CHECK(failed);
    mend_shard();
    // Meanwhile another finish call of the worker goes to shard 0 (a worker has two on their way
    // at once): it must not drop the record of the first one's part there.
    std::vector<finish_item> other(1);
    other[0].token = "0/1|g:nobody";
    auto lost = co_await sharded.finish(queue, "w", other, std::chrono::seconds(30));
    CHECK_FALSE(lost.at(0).lease_held);
    // The batch again, whole: shard 0's part answers as it did (a1 acked, a2 leased to it).
    auto again = co_await sharded.finish(queue, "w", items, std::chrono::seconds(30));
    CHECK(again.at(0).lease_held);
    REQUIRE(again.at(0).next.has_value());
    CHECK(again.at(0).next->job.id == "a2");
    CHECK(again.at(1).lease_held);
  });
}

TEST_CASE("a sharded requeue or purge that fails in one shard says what the others did") {
  auto cfg = shared_redis();
  std::string queue = key_prefix() + "sharded-requeue-partial";
  constexpr std::size_t shards = 2;
  auto [in0, in1] = group_of_each_shard();
  // Shard 1's calls fail while its dead letters' info is a string (WRONGTYPE, before any write).
  auto info = redis_backend::key_prefix(sharded_backend::shard_queue(queue, 1)) + "dead:info";
  auto aside = info + ":aside";
  auto specs = jobs_over_both_shards(in0, in1);
  std::vector<std::string> requeue_ids{"a1", "b1"}, purge_ids{"a2", "b1"};
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), cfg);
    sharded_backend sharded(store, shards);
    producer p(sharded, queue);
    co_await p.enqueue_bulk(specs);
    claim_options co;
    co.worker = "w";
    co.max = 10;
    std::size_t failed = 0;
    for (int i = 0; i < 20 && failed < 3; ++i) {  // each fails at once: dead-lettered
      auto got = co_await sharded.claim(queue, co);
      std::vector<finish_item> items(got.size());
      for (std::size_t k = 0; k < got.size(); ++k) {
        items[k].token = got[k].token;
        items[k].unique_id = got[k].job.id;  // (its producer's id, given back)
        items[k].kind = finish_kind::fail;
        items[k].error = "no";
      }
      if (!items.empty()) co_await sharded.finish(queue, "w", items, std::chrono::seconds(30));
      failed += items.size();
    }
    REQUIRE(failed == 3);
    redis_cli(cfg, {"RENAME", info, aside});
    redis_cli(cfg, {"SET", info, "x"});
    std::string said;
    try {
      co_await sharded.requeue(queue, requeue_ids, false);
    } catch (const boost::system::system_error& e) {
      said = e.what();
    }
    CHECK_MESSAGE(
        said.find(fmt::format("requeue in queue '{}': 1 of the 2 ids went back, then shard 1 failed: ", queue)) == 0,
        said);
    CHECK(said.find("WRONGTYPE") != std::string::npos);
    auto code_said = make_error_code(errc::server_error).message();  // once, at the end
    CHECK_MESSAGE((said.find(code_said) != std::string::npos && said.find(code_said) == said.rfind(code_said)), said);
    said.clear();
    try {
      co_await sharded.purge(queue, purge_ids);
    } catch (const boost::system::system_error& e) {
      said = e.what();
    }
    CHECK_MESSAGE(said.find(fmt::format("purge in queue '{}': shard 1 failed after the others removed 1 dead letters: ",
                                        queue)) == 0,
                  said);
    redis_cli(cfg, {"DEL", info});
    redis_cli(cfg, {"RENAME", aside, info});
    // Mended, what was left goes: b1 back, and nothing else is dead.
    std::vector<std::string> last{"b1"};
    CHECK(co_await sharded.requeue(queue, last, false) == last);
    CHECK((co_await sharded.counts(queue)).dead == 0);
    co_await sharded.purge_queue(queue);
  });
}

TEST_CASE("a worker's finish calls across a sharded queue drop their records in each shard as answers come") {
  auto cfg = shared_redis();
  std::string queue = key_prefix() + "sharded-answers";
  constexpr std::size_t shards = 4;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), cfg);
    sharded_backend sharded(store, shards);
    producer p(sharded, queue);
    std::vector<job_spec> specs;
    for (int i = 0; i < 400; ++i) {
      job_spec s;
      s.type = "t";
      s.group = fmt::format("g{}", i % 16);  // (over every shard)
      specs.push_back(std::move(s));
    }
    co_await p.enqueue_bulk(std::move(specs));
    claim_options co{"w", 16, std::chrono::seconds(30)};
    for (int round = 0; round < 60; ++round) {
      auto claimed = co_await sharded.claim(queue, co);
      if (claimed.empty()) break;
      std::vector<finish_item> acks;
      for (auto& c : claimed) {
        finish_item f;
        f.token = c.token;
        acks.push_back(std::move(f));
      }
      auto done = co_await sharded.finish(queue, "w", std::move(acks), std::chrono::seconds(30));
      for (auto& r : done) CHECK(r.lease_held);
    }
    CHECK((co_await sharded.counts(queue)).completed == 400);
    // Each call's record stays until the worker's next call to that shard says its answer came:
    // one a shard at most, not one a call.
    for (std::size_t k = 0; k < shards; ++k) {
      auto key = fmt::format("jobrt:{{{}#{}}}:answers:w", queue, k);
      auto held = (co_await redis::exec(store.connection(), redis::request("HLEN", key))).as_integer();
      CAPTURE(key);
      CHECK(held <= 1);
    }
  });
}

TEST_CASE("on a server without sharded pub/sub (before Redis 7) delayed-job wake-ups come by SUBSCRIBE and PUBLISH") {
  // SSUBSCRIBE and SPUBLISH renamed away are unknown commands, as on Redis 6.2.
  std::vector<std::string> args{"--rename-command", "SSUBSCRIBE", "", "--rename-command", "SPUBLISH", ""};
  redis_server server(args);
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), server.config());
    auto before = store.delayed_version("q");  // (subscribes)
    // The refused SSUBSCRIBE goes again as SUBSCRIBE, whose confirmation wakes every waiter.
    co_await store.wait_delayed("q", before, std::chrono::seconds(10));
    auto seen = store.delayed_version("q");
    REQUIRE(seen != before);
    job_spec later;
    later.type = "t";
    later.delay = std::chrono::hours(1);
    producer p(store, "q");
    co_await p.enqueue(later);  // (its script's SPUBLISH fails: it publishes with PUBLISH)
    co_await store.wait_delayed("q", seen, std::chrono::seconds(10));
    CHECK(store.delayed_version("q") != seen);
    auto channels = redis_cli(server.config(), {"PUBSUB", "CHANNELS"});
    CHECK(channels.find("jobrt:{q}:delayed") != std::string::npos);
    auto stats = redis_cli(server.config(), {"INFO", "commandstats"});
    CHECK(stats.find("cmdstat_publish:calls=1") != std::string::npos);
  });
}

TEST_CASE("enqueue.lua refuses a bad due time or an all-digit id before it writes, and frees an id given without u") {
  auto cfg = shared_redis();
  std::string queue = key_prefix() + "protocol-bad";
  std::string p = fmt::format("jobrt:{{{}}}:", queue);
  auto enqueue = [&](std::vector<std::string> jobs) {
    std::vector<std::string> args{
        "-h",      cfg.host,  "-p",        cfg.port,      "--eval", JOBRT_LUA_DIR "/enqueue.lua",   p + "ready",
        p + "seq", p + "ids", p + "stats", p + "delayed", ",",      std::to_string(jobs.size() / 4)};
    args.insert(args.end(), jobs.begin(), jobs.end());
    return redis_cli_process(args);
  };
  auto cli = [&](std::vector<std::string> command) {
    std::vector<std::string> args{"-h", cfg.host, "-p", cfg.port};
    args.insert(args.end(), command.begin(), command.end());
    return redis_cli_process(args);
  };
  std::string body = R"({"type":"import","payload":{"rows":1},"u":1})";
  // A good job first, then one with a bad due time: the call fails, and the good job's id is not
  // left taken (a retry would find it "pending" and drop it).
  for (std::string due : {"tomorrow", "inf", "nan", "+1e400", "-5", "1234567890123456"}) {
    CAPTURE(due);
    auto reply = enqueue({"order-a", "g", body, "", "order-b", "g", body, due});
    CHECK(reply.find("job 2 due '" + due + "' is not") != std::string::npos);
  }
  auto digits = enqueue({"order-c", "", body, "", "1042", "", body, ""});
  CHECK(digits.find("job id '1042' is all digits") != std::string::npos);
  // A call of one job due now takes the script's short path: the same checks, nothing stored.
  CHECK(enqueue({"a|b", "g", body, ""}).find("job id 'a|b' contains '|'") != std::string::npos);
  CHECK(enqueue({"1043", "", body, ""}).find("job id '1043' is all digits") != std::string::npos);
  CHECK(cli({"EXISTS", p + "ids", p + "seq", p + "ready", p + "stats", p + "delayed"}) == "0\n");
  CHECK(enqueue({"order-a", "g", body, ""}) == "order-a\n0\n");  // stored, not a duplicate
  CHECK(enqueue({"order-a", "g", body, ""}) == "order-a\n1\n");  // the same id again: a duplicate

  // An id given without "u": it is the producer's all the same (it is not all digits), and its
  // job's end frees it.
  CHECK(enqueue({"plain-id", "", R"({"type":"import","payload":{"rows":2}})", ""}) == "plain-id\n0\n");
  CHECK(enqueue({"flag-true", "", R"({"type":"import","payload":{"rows":4},"u":true})", ""}) == "flag-true\n0\n");
  CHECK(cli({"SISMEMBER", p + "ids", "plain-id"}) == "1\n");
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), cfg);
    worker_options o;
    o.queue = queue;
    worker w(ctx.get_executor(), store, o);
    int ran = 0;
    w.add_handler("import", [&](job_context&) -> awaitable<void> {
      ++ran;
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&]() -> awaitable<bool> { co_return (co_await store.counts(queue)).completed == 3; },
                              10s));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(ran == 3);  // "u":true is a flag too, not a malformed job
  });
  CHECK(cli({"SISMEMBER", p + "ids", "plain-id"}) == "0\n");
  CHECK(cli({"SISMEMBER", p + "ids", "order-a"}) == "0\n");
  CHECK(enqueue({"plain-id", "", R"({"type":"import","payload":{"rows":3}})", ""}) == "plain-id\n0\n");
}

TEST_CASE("a body that starts with a keep is kept in the queue's index until its keep runs out, and no other is") {
  auto cfg = shared_redis();
  std::string queue = key_prefix() + "protocol-kept";
  std::string p = fmt::format("jobrt:{{{}}}:", queue);
  auto cli = [&](std::vector<std::string> command) {
    std::vector<std::string> args{"-h", cfg.host, "-p", cfg.port};
    args.insert(args.end(), command.begin(), command.end());
    return redis_cli_process(args);
  };
  auto enqueue = [&](std::string id, std::string body) {
    return cli({"--eval", JOBRT_LUA_DIR "/enqueue.lua", p + "ready", p + "seq", p + "ids", p + "stats", p + "delayed",
                ",", "1", id, "", body, ""});
  };
  CHECK(enqueue("kept-a", R"({"keep":200,"type":"import","payload":{}})") == "kept-a\n0\n");
  CHECK(enqueue("kept-b", R"({"keep":200,"type":"import","payload":{}})") == "kept-b\n0\n");
  CHECK(enqueue("spaced", R"({"keep": 200,"type":"import","payload":{}})") == "spaced\n0\n");  // not at the start
  CHECK(enqueue("plain", R"({"type":"import","payload":{"keep":1}})") == "plain\n0\n");
  CHECK(cli({"HKEYS", p + "jobs"}) == "kept-a\nkept-b\n");
  CHECK(cli({"HGET", p + "jobs", "kept-a"}) == R"(p0:0:0|kept-a|{"keep":200,"type":"import","payload":{}})"
                                               "\n");
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), cfg);
    claim_options co;
    co.worker = "w";
    co.max = 10;
    std::vector<finish_item> acks;
    for (auto& c : co_await store.claim(queue, co)) {
      finish_item f;
      f.token = c.token;
      f.unique_id = c.job.id;
      acks.push_back(std::move(f));
    }
    CHECK(acks.size() == 4);
    co_await store.finish(queue, "w", std::move(acks), std::chrono::seconds(30));
    CHECK((co_await store.kept_job_of(queue, "kept-b"))->status == kept_job::state::done);
    co_await sleep_for(std::chrono::milliseconds(300));
    reap_options ro;
    co_await store.reap(queue, ro);  // (not asked to drop them)
    CHECK(cli({"HLEN", p + "jobs"}) == "2\n");
    ro.drop_kept = true;
    co_await store.reap(queue, ro);
  });
  CHECK(cli({"EXISTS", p + "jobs", p + "done"}) == "0\n");
}

TEST_CASE("a kept job's end is published with its entry up to 1 KiB, and a waiter takes it from the message") {
  auto cfg = shared_redis();
  std::string queue = key_prefix() + "protocol-ended";
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), cfg);
    // Subscribed once the notice that the subscription holds has moved the version.
    auto seen = store.ended_version(queue);
    CHECK_FALSE(co_await store.wait_ended(queue, "none", seen, std::chrono::seconds(10)));
    REQUIRE(store.ended_version(queue) != seen);

    producer p(store, queue);
    auto finish = [&](std::string result) -> awaitable<void> {
      claim_options co;
      co.worker = "w";
      co.max = 1;
      auto claimed = co_await store.claim(queue, co);
      REQUIRE(claimed.size() == 1);
      finish_item f;
      f.token = claimed[0].token;
      f.unique_id = claimed[0].job.id;
      f.result = std::move(result);
      std::vector<finish_item> items;
      items.push_back(std::move(f));
      co_await store.finish(queue, "w", std::move(items), std::chrono::seconds(30));
    };
    // Small: the message carries the job as its end left it, result and group included.
    job_spec small;
    small.id = "small";
    small.type = "import";
    small.group = "tenant-1";
    small.keep = std::chrono::minutes(1);
    co_await p.enqueue(std::move(small));
    seen = store.ended_version(queue);
    co_await finish(R"({"rows":3})");
    auto told = co_await store.wait_ended(queue, "small", seen, std::chrono::seconds(10));
    REQUIRE(told);
    CHECK(told->id == "small");
    CHECK(told->status == kept_job::state::done);
    CHECK(told->group == "tenant-1");
    CHECK(told->result == R"({"rows":3})");
    CHECK(told->record.id == "small");
    auto looked = co_await store.kept_job_of(queue, "small");
    REQUIRE(looked);
    CHECK(told->at_ms == looked->at_ms);
    CHECK(told->record.body == looked->record.body);
    // Another job's news is not this one's.
    CHECK_FALSE(co_await store.wait_ended(queue, "other", seen, std::chrono::seconds(10)));

    // Over 1 KiB: the message names the job only, and the waiter, woken, must look.
    job_spec big;
    big.id = "big";
    big.type = "import";
    big.payload = boost::json::object{{"blob", std::string(1100, 'x')}};
    big.keep = std::chrono::minutes(1);
    co_await p.enqueue(std::move(big));
    seen = store.ended_version(queue);
    co_await finish("");
    CHECK_FALSE(co_await store.wait_ended(queue, "big", seen, std::chrono::seconds(10)));
    CHECK(store.ended_version(queue) != seen);  // (woken by the message, not by the timeout)
    CHECK((co_await store.kept_job_of(queue, "big"))->status == kept_job::state::done);
  });
}

TEST_CASE("a waiter through a new sharded_backend of one shard hears the end of a job it did not enqueue") {
  auto cfg = shared_redis();
  std::string queue = key_prefix() + "protocol-ended-sharded";
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend writer(ctx.get_executor(), cfg);
    sharded_backend writes(writer, 1);
    job_spec s;
    s.id = "late";
    s.type = "import";
    s.keep = std::chrono::minutes(1);
    co_await producer(writes, queue).enqueue(std::move(s));
    // Another process's waiter: its backends have not met the queue (its first version is 0).
    redis_backend reader(ctx.get_executor(), cfg);
    sharded_backend reads(reader, 1);
    std::optional<job_status> end;
    auto began = std::chrono::steady_clock::now();
    asio::co_spawn(
        ctx, [&]() -> awaitable<void> { end = co_await producer(reads, queue).wait("late", std::chrono::seconds(50)); },
        asio::detached);
    co_await sleep_for(std::chrono::milliseconds(300));  // (waiting by then)
    worker_options o;
    o.queue = queue;
    worker w(ctx.get_executor(), writes, o);
    w.add_handler("import", [](job_context&) -> awaitable<void> { co_return; });
    w.start();
    while (!end && std::chrono::steady_clock::now() - began < std::chrono::seconds(40))
      co_await sleep_for(std::chrono::milliseconds(20));
    co_await w.stop(std::chrono::seconds(5));
    REQUIRE(end);
    CHECK(end->status == job_status::state::done);
    CHECK(std::chrono::steady_clock::now() - began < std::chrono::seconds(10));  // (woken, not by a look a minute on)
  });
}

TEST_CASE("enqueue.lua, the C++ producer and both backends refuse the same ids, counts and max in the same words") {
  auto cfg = shared_redis();
  std::string queue = key_prefix() + "protocol-refused";
  std::string p = fmt::format("jobrt:{{{}}}:", queue);
  auto eval = [&](std::string count, std::vector<std::string> args) {
    std::vector<std::string> all{
        "-h",      cfg.host,    "-p",          cfg.port, "--eval", JOBRT_LUA_DIR "/enqueue.lua", p + "ready", p + "seq",
        p + "ids", p + "stats", p + "delayed", ",",      count};
    all.insert(all.end(), args.begin(), args.end());
    return redis_cli_process(all);
  };
  // What each refuses, in order: the Lua script's reply holds the same words the C++ side throws.
  struct bad {
    std::string id, body, says;
  };
  std::vector<bad> cases{
      {" 12", R"({"type":"t"})", "job id ' 12' starts or ends with white space"},
      {"order-1 ", R"({"type":"t"})", "job id 'order-1 ' starts or ends with white space"},
      {" ", R"({"type":"t"})", "job id ' ' starts or ends with white space"},
      {"a|b", R"({"type":"t"})", "job id 'a|b' contains '|'"},
      {"17", R"({"type":"t"})", "job id '17' is all digits"},
      {"", R"({"type":"t","max":0})", "job max_attempts is 0; it must be at least 1"},
      {"", R"({"type":"t","payload":{"max":5},"max": -2})", "job max_attempts is -2; it must be at least 1"},
  };
  for (auto& c : cases) {
    CAPTURE(c.id);
    CAPTURE(c.body);
    // A good job first: nothing of the call is stored. One job alone takes the script's short path.
    CHECK(eval("2", {"good", "", R"({"type":"t"})", "", c.id, "g", c.body, ""}).find(c.says) != std::string::npos);
    CHECK(eval("1", {c.id, "g", c.body, ""}).find(c.says) != std::string::npos);
    run([&](asio::io_context& ctx) -> awaitable<void> {
      redis_backend store(ctx.get_executor(), cfg);
      memory_backend memory(ctx.get_executor());
      std::array<backend*, 2> both{&store, &memory};  // (no braced list in a coroutine: GCC 12)
      for (backend* b : both) {
        std::vector<encoded_job> jobs(1);
        jobs[0].id = c.id;
        jobs[0].group = "g";
        jobs[0].body = c.body;
        std::string error;
        try {
          co_await b->enqueue(queue, std::move(jobs));
        } catch (const std::exception& e) {
          error = e.what();
        }
        CHECK(error.find(c.says) != std::string::npos);
      }
    });
  }
  // The C++ producer checks its job_spec before it encodes it.
  for (auto& c : cases) {
    job_spec spec;
    spec.type = "t";
    spec.id = c.id;
    if (c.body.find("max") != std::string::npos) spec.max_attempts = c.body.find("-2") != std::string::npos ? -2 : 0;
    std::string error;
    try {
      producer::check(spec);
    } catch (const std::invalid_argument& e) {
      error = e.what();
    }
    CAPTURE(c.id);
    CHECK(error.find(c.says) != std::string::npos);
  }
  CHECK(redis_cli_process({"-h", cfg.host, "-p", cfg.port, "EXISTS", p + "ids", p + "seq", p + "ready", p + "stats"}) ==
        "0\n");

  // A max that is 1 or more, or one in the payload only, is no error.
  CHECK(eval("1", {"", "", R"({"type":"t","payload":{"max":0},"max":1})", ""}) == "1\n0\n");
  // A count that is not a whole number, or that the arguments do not match (the C++ producer
  // always sends the right one).
  std::string body = R"({"type":"t"})";
  CHECK(eval("abc", {"", "", body, ""}).find("job count 'abc' is not a whole number") != std::string::npos);
  CHECK(eval("1.5", {"", "", body, ""}).find("job count '1.5' is not a whole number") != std::string::npos);
  CHECK(eval("-1", {}).find("job count '-1' is not a whole number") != std::string::npos);
  CHECK(
      eval("2", {"", "", body, ""})
          .find("a count of 2 jobs needs 8 arguments after it (id, group, body, due each), or 10 (and a max group size "
                "each); got 4") != std::string::npos);
  CHECK(eval("1", {"", "", body, "", "x", "y"}).find("a count of 1 jobs needs 4 arguments after it") !=
        std::string::npos);
  CHECK(eval("1", {"", "g", body, "", "x"}).find("job 1 max group size 'x' is not a whole number of at least 1") !=
        std::string::npos);
  // Max group sizes after the jobs' arguments: the second job would make group lg hold 2.
  CHECK(
      eval("2", {"", "lg", body, "", "", "lg", body, "", "", "1"})
          .find(
              "JOBRT:26 group 'lg' would hold 2 jobs, over its max group size of 1 (job 2 of 2): nothing was stored") !=
      std::string::npos);
  auto fits = eval("2", {"", "lg", body, "", "", "lg", body, "", "", "2"});
  CHECK(fits.find("JOBRT") == std::string::npos);
  CHECK(std::count(fits.begin(), fits.end(), '\n') == 4);  // two ids, each not a duplicate
}
