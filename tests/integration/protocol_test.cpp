// docs/PROTOCOL.md, followed to the letter: jobs enqueued with redis-cli alone run on a C++ worker.
#include "support/redis_server.hpp"
#include "support/run.hpp"

#include <jobrt/redis_backend.hpp>
#include <jobrt/worker.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>

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

}  // namespace

TEST_CASE("jobs enqueued with redis-cli by the protocol document run on a C++ worker") {
  auto cfg = shared_redis();
  std::string queue = key_prefix() + "protocol";
  std::string p = fmt::format("jobrt:{{{}}}:", queue);
  auto printed = redis_cli_process({"-h", cfg.host, "-p", cfg.port, "--eval", JOBRT_LUA_DIR "/enqueue.lua", p + "ready",
                                    p + "seq", p + "ids", p + "stats", p + "delayed", ",", "3",
                                    // grouped, with an id of ours
                                    "order-1", "crm:acme", R"({"type":"import","payload":{"rows":10},"u":1})", "",
                                    // the same group, after it
                                    "order-2", "crm:acme", R"({"type":"import","payload":{"rows":20},"u":1})", "",
                                    // ungrouped, id assigned, due in 300 ms
                                    "", "", R"({"type":"import","payload":{"rows":30}})", "+300"});
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
    w.add_handler("import", [&](job_context& c) -> awaitable<void> {
      ran.push_back(fmt::format("{}:{}:{}", c.id(), c.group(), c.payload().at("rows").as_int64()));
      co_return;
    });
    w.start();
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (ran.size() < 3 && std::chrono::steady_clock::now() < end) co_await sleep_for(std::chrono::milliseconds(10));
    co_await w.stop(std::chrono::seconds(5));
    REQUIRE(ran.size() == 3);
    CHECK(ran[0] == "order-1:crm:acme:10");
    CHECK(ran[1] == "order-2:crm:acme:20");
    CHECK(ran[2].ends_with("::30"));  // the delayed one, last
    auto counts = co_await store.counts(queue);
    CHECK(counts.enqueued == 3);
    CHECK(counts.completed == 3);
  });
}
