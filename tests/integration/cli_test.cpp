// The jobrt command as an operator runs it: plugins, worker, enqueue, stats, and its errors.
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"
#include "support/run.hpp"

#include <jobrt/metrics.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/sharded_backend.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/json/parse.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#ifndef JOBRT_BIN
#error "JOBRT_BIN, JOBRT_HANDLERS and JOBRT_TEST_PLUGINS must be defined (see tests/CMakeLists.txt)"
#endif

extern char** environ;

namespace asio = boost::asio;
using namespace jobrt;
using namespace jobrt::test;
using asio::awaitable;

namespace {

struct finished {
  int status = -1;  // exit code, or -1
  std::string output;
};

// Starts `jobrt args...` with stdout and stderr to one file, and `env` added to the environment;
// standard input from the file `in` when given.
pid_t start(const std::vector<std::string>& args, const std::string& out, const std::vector<std::string>& env = {},
            const std::string& in = {}) {
  std::vector<std::string> all{JOBRT_BIN};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&files, 1, 2);
  if (!in.empty()) posix_spawn_file_actions_addopen(&files, 0, in.c_str(), O_RDONLY, 0);
  std::vector<std::string> vars(env);
  std::vector<char*> envp;
  for (auto& v : vars) envp.push_back(v.data());
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);  // the first of a name wins
  envp.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, JOBRT_BIN, &files, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&files);
  REQUIRE(rc == 0);
  return pid;
}

// What an ended process left: its exit status (-1: a signal ended it) and its output file.
finished ended(int status, const std::string& out) {
  std::ifstream in(out);
  finished f;
  f.output.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  f.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::remove(out.c_str());
  return f;
}

finished wait_for(pid_t pid, const std::string& out) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return ended(status, out);
}

finished jobrt_cli(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
                   const std::string& in = {}) {
  auto out = fmt::format("/tmp/jobrt-cli-{}-{}.out", ::getpid(), std::rand());
  return wait_for(start(args, out, env, in), out);
}

// Waits (bounded) until the file has `text`.
bool wait_for_text(const std::string& file, std::string_view text, std::chrono::seconds limit) {
  return eventually_here(
      [&] {
        std::ifstream in(file);
        return std::string(std::istreambuf_iterator<char>(in), {}).find(text) != std::string::npos;
      },
      limit);
}

// Waits (bounded) until the queue's counts satisfy `done`; returns the last counts read.
template <class Done>
queue_counts wait_counts(const redis::config& cfg, const std::string& queue, Done done) {
  queue_counts counts;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), cfg);
    sharded_backend shards(store, 0, sharded_backend::when_unknown::look);  // (every shard of a sharded queue)
    co_await eventually([&]() -> awaitable<bool> {
      counts = co_await shards.counts(queue);
      co_return done(counts);
    });
  });
  return counts;
}

// The port a worker started with --metrics :0 prints that it listens on (port 0 picked one);
// 0 when it prints none in time.
awaitable<unsigned short> metrics_port(const std::string& out) {
  unsigned short port = 0;
  co_await eventually([&] {
    std::ifstream in(out);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto at = text.find("metrics at http://127.0.0.1:");
    if (at != std::string::npos) port = static_cast<unsigned short>(std::stoi(text.substr(at + 28)));
    return port != 0;
  });
  co_return port;
}

std::string url_of(const redis::config& cfg) { return fmt::format("redis://{}:{}", cfg.host, cfg.port); }

// wait_for, bounded: a process still running after `limit` is killed (status -1).
finished wait_at_most(pid_t pid, const std::string& out, std::chrono::seconds limit) {
  int status = 0;
  if (!eventually_here([&] { return ::waitpid(pid, &status, WNOHANG) != 0; }, limit)) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  return ended(status, out);
}

}  // namespace

TEST_CASE("jobrt worker runs plugin handlers on jobs from jobrt enqueue and stops cleanly on SIGTERM") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  std::string queue = key_prefix() + "cli";
  auto imports = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "tenant_import", "--payload",
                            R"({"tenant":"acme","entity":"orders","rows":1000})", "--count", "200", "--groups", "7"});
  CHECK(imports.status == 0);
  CHECK(imports.output == "enqueued 200 jobs on " + queue + " (0 duplicates)\n");
  auto one = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "stock_arrival", "--payload",
                        R"({"commodity":"copper","qty":5})", "--group", "copper", "--id", "arrival-1"});
  CHECK(one.output == "arrival-1\n");
  auto bad = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "stock_arrival", "--payload",
                        R"({"commodity":"copper"})", "--group", "copper"});  // no qty: dead-lettered at once
  CHECK(bad.status == 0);

  std::vector<pid_t> workers;
  std::vector<std::string> outs;
  for (int i = 0; i < 2; ++i) {
    outs.push_back(fmt::format("/tmp/jobrt-cli-worker-{}-{}.out", ::getpid(), i));
    std::vector<std::string> args{"worker",
                                  "--redis",
                                  url,
                                  "--queue",
                                  queue,
                                  "--plugin",
                                  JOBRT_HANDLERS "/jobrt_tenant_import.so",
                                  "--plugin",
                                  JOBRT_HANDLERS "/jobrt_stock_arrival.so",
                                  "--concurrency",
                                  "8",
                                  "--grace",
                                  "5000"};
    if (i == 1) args.insert(args.end(), {"--burst", "8", "--follow", "pipelined"});  // the other way to run bursts
    workers.push_back(start(args, outs.back()));
  }
  auto counts = wait_counts(cfg, queue, [](const queue_counts& c) { return c.completed + c.dead >= 202; });
  CHECK(counts.completed == 201);
  CHECK(counts.dead == 1);
  CHECK(counts.retried == 0);
  // Both running (one may have done every job while the other still connected: a SIGTERM then
  // stops it before it starts, which another test covers).
  for (auto& out : outs) CHECK(wait_for_text(out, "running tenant_import", std::chrono::seconds(30)));
  for (auto pid : workers) ::kill(pid, SIGTERM);
  std::string logs;
  for (std::size_t i = 0; i < workers.size(); ++i) {
    auto f = wait_for(workers[i], outs[i]);
    CHECK(f.status == 0);
    CHECK(f.output.find("SIGTERM: stopping") != std::string::npos);
    CHECK(f.output.find("stopped:") != std::string::npos);
    logs += f.output;
  }
  // tenant_import reports its progress through the job's logger (every 10 chunks, and at the end).
  CHECK(logs.find("importing orders for tenant acme: 1000/1000 rows") != std::string::npos);
  auto stats = jobrt_cli({"stats", "--redis", url, "--queue", queue, "--json"});
  CHECK(stats.status == 0);
  CHECK(stats.output.find("\"completed\":201") != std::string::npos);
  auto dlq = jobrt_cli({"dlq", "list", "--redis", url, "--queue", queue});
  CHECK(dlq.output.find("payload needs \"commodity\" (string) and \"qty\" (integer)") != std::string::npos);
  auto check = jobrt_cli({"check", "--redis", url, "--queue", queue});
  CHECK(check.status == 0);
  CHECK(check.output.find("no problems") != std::string::npos);
}

TEST_CASE("jobrt worker stops cleanly and at once on a SIGTERM that comes while it is still connecting") {
  redis_server server;  // private: paused below
  // The server answers nothing for 20 s, so the worker sits in its first PING when SIGTERM comes.
  redis_cli(server.config(), {"CLIENT", "PAUSE", "20000", "ALL"});
  auto out = fmt::format("/tmp/jobrt-cli-early-{}.out", ::getpid());
  auto pid =
      start({"worker", "--redis", server.url(), "--queue", "early", "--plugin", JOBRT_HANDLERS "/jobrt_noop.so"}, out);
  // Its log says when it connects; a SIGTERM sent before the process gets that far would only
  // test the kernel's default action.
  REQUIRE(wait_for_text(out, "connecting to redis at", std::chrono::seconds(20)));
  auto signalled = std::chrono::steady_clock::now();
  ::kill(pid, SIGTERM);
  auto f = wait_for(pid, out);
  CHECK(std::chrono::steady_clock::now() - signalled < std::chrono::seconds(10));  // not when the pause ends
  CHECK(f.status == 0);
  CHECK(f.output.find("SIGTERM before it started: stopping") != std::string::npos);
}

TEST_CASE("jobrt refuses bad plugins and bad input with a clear message and the right exit code") {
  auto url = url_of(shared_redis());
  auto abi = jobrt_cli({"worker", "--redis", url, "--plugin", JOBRT_TEST_PLUGINS "/jobrt_test_bad_abi.so"});
  CHECK(abi.status == 1);
  CHECK(abi.output.find("built for jobrt plugin ABI 999, but this jobrt has ABI 5") != std::string::npos);
  auto none = jobrt_cli({"worker", "--redis", url, "--plugin", JOBRT_TEST_PLUGINS "/jobrt_test_not_a_plugin.so"});
  CHECK(none.status == 1);
  CHECK(none.output.find("not a jobrt plugin") != std::string::npos);
  auto missing = jobrt_cli({"worker", "--redis", url, "--plugin", "/nonexistent/x.so"});
  CHECK(missing.status == 1);
  CHECK(missing.output.find("plugin /nonexistent/x.so: cannot load") != std::string::npos);

  std::string queue = key_prefix() + "bad";
  auto file = fmt::format("/tmp/jobrt-cli-{}.jsonl", ::getpid());
  std::ofstream(file) << R"({"type":"noop","payload":{"a":1}})"
                      << "\n"
                      << R"({"type":"noop","payload":)"
                      << "\n";
  auto lines = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--file", file});
  std::remove(file.c_str());
  CHECK(lines.status == 1);
  CHECK(lines.output.find(file + ":2: not JSON") != std::string::npos);
  CHECK(lines.output.find("nothing was enqueued") != std::string::npos);
  auto stats = jobrt_cli({"stats", "--redis", url, "--queue", queue, "--json"});  // nothing stored: no queue
  CHECK(stats.status == 1);
  CHECK(stats.output.find("is unknown") != std::string::npos);

  auto no_type = jobrt_cli({"enqueue", "--redis", url, "--queue", queue});
  CHECK(no_type.status == 2);
  CHECK(no_type.output.find("(see jobrt enqueue --help)") != std::string::npos);
  CHECK(no_type.output.find("commands:") == std::string::npos);  // not the list of commands
  CHECK(jobrt_cli({"worker", "--redis", "http://nope", "--plugin", "x.so"}).status == 2);
  auto follow = jobrt_cli({"worker", "--redis", url, "--plugin", "x.so", "--follow", "eager"});
  CHECK(follow.status == 2);
  CHECK(follow.output.find("worker: --follow: follow policy 'eager' is not one of after-commit, pipelined") !=
        std::string::npos);
  auto rate = jobrt_cli({"worker", "--redis", url, "--plugin", "x.so", "--rate-limit", "0/1000"});
  CHECK(rate.status == 2);
  CHECK(rate.output.find("worker: --rate-limit: rate limit '0/1000': MAX must be from 1 to 10000") !=
        std::string::npos);
  auto unknown = jobrt_cli({"frobnicate"});
  CHECK(unknown.status == 2);
  CHECK(unknown.output.find("unknown command 'frobnicate'") != std::string::npos);
  CHECK(unknown.output.find("commands:") != std::string::npos);
  auto down = jobrt_cli({"stats", "--redis", "redis://:secret@127.0.0.1:1"});
  CHECK(down.status == 1);
  CHECK(down.output.find("jobrt: connect to redis://127.0.0.1:1/0: Connection refused") != std::string::npos);
  CHECK(down.output.find("secret") == std::string::npos);  // the URL's password is not printed
}

TEST_CASE("jobrt refuses out-of-range options, empty names, stray arguments and directories before it connects") {
  // The server is a closed port: each of these fails on its arguments, before any connection.
  std::string down = "redis://127.0.0.1:1", noop = JOBRT_HANDLERS "/jobrt_noop.so";
  auto dir = fmt::format("/tmp/jobrt-cli-dir-{}", ::getpid());
  ::mkdir(dir.c_str(), 0755);
  struct refused {
    std::vector<std::string> args;
    int status;
    std::string says;
  };
  std::vector<refused> cases{
      {{"worker", "--plugin", noop, "--lease-ttl", "1"}, 2, "worker: --lease-ttl: '1' is not a number from 100 to"},
      {{"worker", "--plugin", noop, "--lease-ttl", "99999999999999"}, 2, "worker: --lease-ttl:"},
      {{"worker", "--plugin", noop, "--threads", "40000"},
       2,
       "worker: --threads: '40000' is not a number from 1 to 256"},
      {{"worker", "--plugin", noop, "--burst", "1001"}, 2, "worker: --burst: '1001' is not a number from 1 to 1000"},
      {{"worker", "--plugin", noop, "--config", dir}, 1, fmt::format("config {}: is a directory", dir)},
      {{"enqueue", "--type", "noop", "--count", "0"}, 2, "enqueue: --count: '0' is not a number from 1"},
      {{"enqueue", "--type", "noop", "--max-attempts", "0"}, 2, "enqueue: --max-attempts: '0' is not a number from 1"},
      {{"enqueue", "--type", "noop", "--id", "123"}, 2, "job id '123' is all digits"},
      {{"enqueue", "--type", "noop", "--group", ""}, 2, "job group is empty"},
      {{"enqueue", "--type", "noop", "--queue", ""}, 2, "enqueue: --queue: queue name is empty"},
      {{"enqueue", "--file", dir}, 1, fmt::format("enqueue: {} is a directory, not a file", dir)},
      {{"enqueue", "--file", dir, "--type", "noop"}, 2, "with --file, each line gives its job's options"},
      {{"stats", "q", "extra"}, 2, "stats: unexpected argument 'extra'"},
      {{"stats", "--queue", ""}, 2, "stats: --queue: queue name is empty"},
      {{"dlq", "list", "--head"}, 2, "dlq list: unknown option '--head'"},
      {{"group", "pause", ""}, 2, "group pause: GROUP: the group's name is empty"},
      {{"demo", "--commodities", "99999999999"}, 2, "demo: --commodities: '99999999999' is not a number from 1"},
      {{"demo", "--redis", "http://x"}, 2, "invalid Redis URL 'http://x'"},
      {{"stats", "--redis", "rediss://127.0.0.1:1/?ca=/nonexistent/ca.pem"},
       2,
       "stats: --redis: the CA file '/nonexistent/ca.pem' cannot be read: No such file or directory"},
      {{"stats", "--redis", "redis+sentinel://127.0.0.1:1"}, 2, "the primary's name is missing"},
      {{"stats", "--queue", "a}:b"}, 2, "stats: --queue: queue name 'a}:b' holds '{' or '}'"},
      {{"bridge", "-q", "q", "--from", "redis-stream://127.0.0.1:1/s"},
       2,
       "bridge: --from: stream URL 'redis-stream://127.0.0.1:1/s': the consumer group is missing (?group=<group>)"},
      {{"bridge", "-q", "q", "--from", "amqp://h/x"},
       2,
       "bridge: --from: AMQP URL 'amqp://h/x': the queue is missing (?queue=<queue>)"},
      {{"bridge", "-q", "q", "--from", "kafka://h/x"},
       2,
       "source URL: scheme 'kafka' is none of redis-stream://, rediss-stream://, redis-stream+sentinel://, "
       "rediss-stream+sentinel://, amqp:// and amqps://"},
      {{"bridge", "--from", "redis-stream://127.0.0.1:1/s?group=g"}, 2, "bridge: --to-queue is required"},
      {{"bridge", "-q", "q", "--from", "redis-stream://127.0.0.1:1/s?group=g", "--keep", "0"},
       2,
       "bridge: --keep: '0' is not a number from 1"},
      {{"check", "a{b"}, 2, "check: QUEUE: queue name 'a{b' holds '{' or '}'"},
      {{"stats", "--queue", "q#3"}, 2, "stats: --queue: queue name 'q#3' ends in '#' and digits"},
      {{"enqueue", "--shards", "0", "--type", "t"}, 2, "enqueue: --shards: '0' is not a number from 1"},
      {{"version", "extra"}, 2, "version: unexpected argument 'extra'"},
  };
  for (auto& c : cases) {
    auto args = c.args;
    if (args[0] != "demo" && args[0] != "version") args.insert(args.end(), {"--redis", down});
    auto f = jobrt_cli(args);
    CAPTURE(fmt::format("{}", fmt::join(args, " ")));
    CAPTURE(f.output);
    CHECK(f.status == c.status);
    CHECK(f.output.find(c.says) != std::string::npos);
  }
  ::rmdir(dir.c_str());
}

TEST_CASE("jobrt worker says why its server does not answer, asks again, and starts when it comes") {
  redis_server server;
  server.stop();  // its port is closed now
  auto out = fmt::format("/tmp/jobrt-cli-late-{}.out", ::getpid());
  auto pid =
      start({"worker", "--redis", server.url(), "--queue", "late", "--plugin", JOBRT_HANDLERS "/jobrt_noop.so"}, out);
  // One ask takes up to 10 s before it says why.
  CHECK(wait_for_text(out, "does not answer: connect to", std::chrono::seconds(20)));
  CHECK(wait_for_text(out, "Connection refused; asking again", std::chrono::seconds(1)));
  server.start();
  CHECK(wait_for_text(out, "running noop on queue late", std::chrono::seconds(25)));
  ::kill(pid, SIGTERM);
  auto f = wait_for(pid, out);
  CAPTURE(f.output);
  CHECK(f.status == 0);
}

TEST_CASE("jobrt worker on several threads stops with the message of an exception that escapes a handler") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  std::string queue = key_prefix() + "escape";
  // Several jobs: each posts a throw, so one lands on a thread other than the first (before,
  // that one ended the process with std::terminate, and one on the first left the others joinable).
  for (int i = 0; i < 8; ++i)
    REQUIRE(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "escape"}).status == 0);
  auto out = fmt::format("/tmp/jobrt-cli-escape-{}.out", ::getpid());
  auto pid = start({"worker", "--redis", url, "--queue", queue, "--threads", "4", "--plugin",
                    JOBRT_TEST_PLUGINS "/jobrt_test_escape.so"},
                   out);
  // Bounded: a worker that kept running is stopped after 20 s and fails the checks below.
  bool said = wait_for_text(out, "thrown by a plugin outside any job", std::chrono::seconds(20));
  if (!said) ::kill(pid, SIGKILL);
  auto f = wait_for(pid, out);
  CHECK(said);
  CHECK(f.status == 1);
  CHECK(f.output.find("jobrt: thrown by a plugin outside any job") != std::string::npos);
}

TEST_CASE("a mixed fleet: a worker without a job's handler hands it back and every job runs on one that has it") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  std::string queue = key_prefix() + "fleet";
  // One worker with only the noop plugin, one with only sleep: 1,000 sleep jobs (a rolling
  // deploy, where a new type reaches an old worker first). Before, most were dead-lettered.
  auto noop_out = fmt::format("/tmp/jobrt-cli-fleet-noop-{}.out", ::getpid());
  auto sleep_out = fmt::format("/tmp/jobrt-cli-fleet-sleep-{}.out", ::getpid());
  auto noop = start({"worker", "--redis", url, "--queue", queue, "--concurrency", "50", "--unhandled-delay", "100",
                     "--plugin", JOBRT_HANDLERS "/jobrt_noop.so"},
                    noop_out);
  auto sleeper = start(
      {"worker", "--redis", url, "--queue", queue, "--concurrency", "50", "--plugin", JOBRT_HANDLERS "/jobrt_sleep.so"},
      sleep_out);
  REQUIRE(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "sleep", "--payload", R"({"ms":2})",
                     "--count", "1000", "--groups", "10"})
              .status == 0);
  queue_counts counts;
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        redis_backend store(ctx.get_executor(), cfg);
        co_await eventually(
            [&]() -> awaitable<bool> {
              counts = co_await store.counts(queue);
              co_return counts.completed + counts.dead >= 1000;
            },
            60s);
      },
      std::chrono::seconds(90));
  ::kill(noop, SIGTERM);
  ::kill(sleeper, SIGTERM);
  CHECK(wait_for(noop, noop_out).status == 0);
  CHECK(wait_for(sleeper, sleep_out).status == 0);
  CHECK(counts.completed == 1000);
  CHECK(counts.dead == 0);
  CHECK(counts.started == 1000);
  MESSAGE("handed back: " << counts.unhandled);
  auto stats = jobrt_cli({"stats", "--redis", url, "--queue", queue, "--json"});
  CHECK(stats.output.find(fmt::format("\"unhandled\":{}", counts.unhandled)) != std::string::npos);
}

TEST_CASE("jobrt worker logs a dead letter with its job's id, grouped or not, and keeps a malformed lane whole") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  std::string queue = key_prefix() + "letters";
  CHECK(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "nosuch", "--group", "g1", "--id", "order-1"})
            .status == 0);
  CHECK(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "nosuch", "--id", "order-2"}).status == 0);
  // A lane another program wrote into the ready list, neither 'j:<record>' nor 'g:<group>'.
  redis_cli(cfg, {"RPUSH", redis_backend::key_prefix(queue) + "ready", "garbage-record"});
  auto out = fmt::format("/tmp/jobrt-cli-letters-{}.out", ::getpid());
  // (No worker has ever run type nosuch: dead-lettered as soon as the worker has asked.)
  auto pid = start({"worker", "--redis", url, "--queue", queue, "--unhandled-limit", "0", "--plugin",
                    JOBRT_HANDLERS "/jobrt_noop.so"},
                   out);
  CHECK(wait_for_text(out, "job order-1 dead-lettered: no handler for type nosuch", std::chrono::seconds(20)));
  CHECK(wait_for_text(out, "job order-2 dead-lettered: no handler for type nosuch", std::chrono::seconds(20)));
  std::vector<dead_letter> letters;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), cfg);
    co_await eventually([&]() -> awaitable<bool> {
      letters = co_await store.dead_letters(queue, 0, 10);
      co_return letters.size() >= 3;
    });
  });
  ::kill(pid, SIGTERM);
  CHECK(wait_for(pid, out).status == 0);
  REQUIRE(letters.size() == 3);
  auto garbage = std::find_if(letters.begin(), letters.end(), [](auto& d) { return d.record == "garbage-record"; });
  REQUIRE(garbage != letters.end());
  CHECK(garbage->error.find("malformed job") != std::string::npos);
}

TEST_CASE("jobrt worker and enqueue take a config file with several queues and grouping rules") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  auto a = key_prefix() + "imports", b = key_prefix() + "stock";
  auto file = fmt::format("/tmp/jobrt-config-{}.json", ::getpid());
  std::ofstream(file) << fmt::format(
      R"({{"redis": "{}", "plugins": ["{}/jobrt_tenant_import.so", "{}/jobrt_stock_arrival.so"],
          "queues": [{{"name": "{}", "concurrency": 4,
                      "grouping": {{"rules": [{{"match": {{"app": "crm"}}, "key": "{{entity}}:{{tenant}}"}}]}}}},
                     {{"name": "{}", "concurrency": 2, "on_failure": "skip"}}]}})",
      url, JOBRT_HANDLERS, JOBRT_HANDLERS, a, b);
  auto e1 = jobrt_cli({"enqueue", "--config", file, "--queue", a, "--type", "tenant_import", "--payload",
                       R"({"app":"crm","tenant":"t1","entity":"orders","rows":10})", "--count", "30"});
  CHECK(e1.status == 0);
  auto e2 = jobrt_cli({"enqueue", "--config", file, "--queue", b, "--type", "stock_arrival", "--payload",
                       R"({"commodity":"tin","qty":2})", "--count", "20", "--groups", "2"});
  CHECK(e2.status == 0);
  check_report before;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), cfg);
    before = co_await store.check(a, false);
  });
  CHECK(before.groups == 1);  // the rule grouped every import under "orders:t1"
  CHECK(before.jobs == 30);
  auto out = fmt::format("/tmp/jobrt-cli-config-{}.out", ::getpid());
  auto pid = start({"worker", "--config", file, "--grace", "5000"}, out);
  auto ca = wait_counts(cfg, a, [](const queue_counts& c) { return c.completed >= 30; });
  auto cb = wait_counts(cfg, b, [](const queue_counts& c) { return c.completed >= 20; });
  ::kill(pid, SIGTERM);
  auto f = wait_for(pid, out);
  CHECK(f.status == 0);
  CHECK(ca.completed == 30);
  CHECK(cb.completed == 20);
  CHECK(f.output.find("on queue " + a) != std::string::npos);
  CHECK(f.output.find("on queue " + b) != std::string::npos);

  auto elsewhere = jobrt_cli({"enqueue", "--config", file, "--queue", "other", "--type", "noop"});
  CHECK(elsewhere.status == 2);
  CHECK(elsewhere.output.find(fmt::format("enqueue: queue other is not in config {} (its queues: {}, {})", file, a,
                                          b)) != std::string::npos);

  std::ofstream(file) << R"({"queues": [{"name": "x", "concurrency": -1}]})";
  auto bad = jobrt_cli({"worker", "--config", file});
  CHECK(bad.status == 1);
  CHECK(bad.output.find("config.queues[0].concurrency: is not an integer from 1 to 100000") != std::string::npos);
  std::ofstream(file) << fmt::format(
      R"({{"redis": "redis://127.0.0.1:1", "plugins": ["{}/jobrt_noop.so"], "handlers": {{"nop": {{"retry": {{}}}}}},
          "queues": [{{"name": "x"}}]}})",
      JOBRT_HANDLERS);
  auto typo = jobrt_cli({"worker", "--config", file});  // refused before it connects
  CHECK(typo.status == 1);
  CHECK(typo.output.find(fmt::format(
            "config {}: handlers.nop: no loaded plugin registers type 'nop' (they register: noop)", file)) !=
        std::string::npos);
  std::remove(file.c_str());
}

TEST_CASE("jobrt worker serves Prometheus metrics on loopback") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  std::string queue = key_prefix() + "metrics";
  CHECK(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "noop", "--count", "25"}).status == 0);
  CHECK(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "sleep", "--payload",
                   R"({"ms":1,"fail":true})", "--max-attempts", "1"})
            .status == 0);
  auto out = fmt::format("/tmp/jobrt-cli-metrics-{}.out", ::getpid());
  auto pid = start({"worker", "--redis", url, "--queue", queue, "--plugin", JOBRT_HANDLERS "/jobrt_noop.so", "--plugin",
                    JOBRT_HANDLERS "/jobrt_sleep.so", "--metrics", ":0"},
                   out);
  std::string page, not_found;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    auto port = co_await metrics_port(out);
    REQUIRE(port != 0);
    redis_backend store(ctx.get_executor(), cfg);
    co_await eventually([&]() -> awaitable<bool> {  // both finished: the 25 noops and the failing sleep
      auto c = co_await store.counts(queue);
      co_return c.completed == 25 && c.dead == 1 && c.running == 0;
    });
    auto get = [&](std::string target) -> awaitable<std::string> {
      asio::ip::tcp::socket s(ctx);
      co_await s.async_connect({asio::ip::make_address("127.0.0.1"), port}, asio::use_awaitable);
      auto req = fmt::format("GET {} HTTP/1.0\r\nHost: localhost\r\n\r\n", target);
      co_await asio::async_write(s, asio::buffer(req), asio::use_awaitable);
      std::string body;
      auto [ec, n] = co_await asio::async_read(s, asio::dynamic_buffer(body), asio::as_tuple(asio::use_awaitable));
      CHECK(ec == asio::error::eof);  // HTTP/1.0: the server closes after its answer
      CHECK(n == body.size());
      co_return body;
    };
    page = co_await get("/metrics");
    not_found = co_await get("/other");
  });
  ::kill(pid, SIGTERM);
  CHECK(wait_for(pid, out).status == 0);
  CHECK(page.starts_with("HTTP/1.0 200 OK"));
  CHECK(page.find("Content-Type: text/plain; version=0.0.4") != std::string::npos);
  auto has = [&](const std::string& line) {
    bool found = page.find(line + "\n") != std::string::npos;
    if (!found) MESSAGE("missing: " << line);
    return found;
  };
  CHECK(has(fmt::format("jobrt_jobs_completed_total{{queue=\"{}\",type=\"noop\"}} 25", queue)));
  CHECK(has(fmt::format("jobrt_jobs_failed_total{{queue=\"{}\",type=\"sleep\"}} 1", queue)));
  CHECK(has(fmt::format("jobrt_job_run_seconds_count{{queue=\"{}\"}} 26", queue)));
  CHECK(has(fmt::format("jobrt_job_pickup_seconds_bucket{{queue=\"{}\",le=\"+Inf\"}} 26", queue)));
  CHECK(has(fmt::format("jobrt_queue_dead{{queue=\"{}\"}} 1", queue)));
  CHECK(has(fmt::format("jobrt_jobs_in_flight{{queue=\"{}\"}} 0", queue)));
  CHECK(has(fmt::format("jobrt_queue_latency_seconds{{queue=\"{}\"}} 0", queue)));  // nothing left
  CHECK(has(fmt::format("jobrt_build_info{{version=\"{}\"}} 1", jobrt::version())));
  CHECK(has(fmt::format("jobrt_job_run_seconds_bucket{{queue=\"{}\",le=\"3600\"}} 26", queue)));  // up to an hour
  CHECK(page.find("\nprocess_resident_memory_bytes ") != std::string::npos);
  CHECK(page.find("\nprocess_cpu_seconds_total ") != std::string::npos);
  CHECK(page.find("jobrt_leases_recovered_total") == std::string::npos);  // said once: jobrt_jobs_recovered_total
  CHECK(has(fmt::format("jobrt_queue_groups_active{{queue=\"{}\"}} 0", queue)));
  CHECK(page.find("# TYPE jobrt_job_run_seconds histogram") != std::string::npos);
  CHECK(not_found.starts_with("HTTP/1.0 404"));
  CHECK(jobrt_cli({"worker", "--plugin", "x.so", "--metrics", "nohost"}).status == 2);
}

TEST_CASE("jobrt worker's metrics answer with its server out of reach, without the queue-wide series") {
  redis_server server;  // private: stopped below
  std::string queue = key_prefix() + "metrics-down";
  auto out = fmt::format("/tmp/jobrt-cli-metrics-down-{}.out", ::getpid());
  auto pid = start({"worker", "--redis", server.url(), "--queue", queue, "--plugin", JOBRT_HANDLERS "/jobrt_noop.so",
                    "--metrics", ":0"},
                   out);
  std::string up, down;
  std::chrono::steady_clock::duration took{};
  run([&](asio::io_context& ctx) -> awaitable<void> {
    auto port = co_await metrics_port(out);
    REQUIRE(port != 0);
    auto get = [&]() -> awaitable<std::string> {  // (given up after 10 s)
      asio::ip::tcp::socket s(ctx);
      co_await s.async_connect({asio::ip::make_address("127.0.0.1"), port}, asio::use_awaitable);
      asio::steady_timer guard(ctx, std::chrono::seconds(10));
      guard.async_wait([&](boost::system::error_code ec) {
        if (!ec) s.close();
      });
      std::string req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n", body;
      co_await asio::async_write(s, asio::buffer(req), asio::use_awaitable);
      co_await asio::async_read(s, asio::dynamic_buffer(body), asio::as_tuple(asio::use_awaitable));
      guard.cancel();
      co_return body;
    };
    up = co_await get();
    server.stop();
    auto began = std::chrono::steady_clock::now();
    down = co_await get();
    took = std::chrono::steady_clock::now() - began;
  });
  server.start();
  ::kill(pid, SIGTERM);
  auto f = wait_at_most(pid, out, std::chrono::seconds(30));
  CHECK(f.status == 0);
  // The scrape without counts said why once (not also the cut-short call's own error).
  std::size_t said = 0;
  for (auto at = f.output.find("the counts of queue " + queue); at != std::string::npos;
       at = f.output.find("the counts of queue " + queue, at + 1))
    ++said;
  CHECK_MESSAGE(said == 1, f.output);
  CHECK(up.find(fmt::format("jobrt_queue_dead{{queue=\"{}\"}} 0\n", queue)) != std::string::npos);
  CHECK(down.starts_with("HTTP/1.0 200 OK"));
  CHECK(took < std::chrono::seconds(5));  // (the counts' bound: 2 s)
  CHECK(down.find("\njobrt_build_info{") != std::string::npos);
  CHECK(down.find("\nprocess_cpu_seconds_total ") != std::string::npos);
  CHECK(down.find("jobrt_queue_dead{") == std::string::npos);  // (the queue's counts: not known)
}

TEST_CASE("the example HTTP server enqueues a job per POST and runs them on its own io_context") {
  auto out = fmt::format("/tmp/jobrt-example-{}.out", ::getpid());
  std::vector<std::string> args{JOBRT_EXAMPLE_HTTP_SERVER};
  std::vector<char*> argv{args[0].data(), nullptr};
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  REQUIRE(::posix_spawn(&pid, JOBRT_EXAMPLE_HTTP_SERVER, &files, nullptr, argv.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&files);
  std::vector<std::string> answers;
  std::string stats;
  std::vector<std::string> mounted;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    unsigned short port = 0;
    co_await eventually([&] {
      std::ifstream in(out);
      std::string line;
      // "listening on PORT\n", read only once the whole line is there (the file is being written).
      if (!std::getline(in, line) || in.eof()) return false;
      std::istringstream words(line);
      std::string word;
      if (words >> word >> word >> port) return true;
      port = 0;
      return false;
    });
    REQUIRE(port != 0);
    auto call = [&](std::string method, std::string target, std::string body) -> awaitable<std::string> {
      asio::ip::tcp::socket s(ctx);
      co_await s.async_connect({asio::ip::make_address("127.0.0.1"), port}, asio::use_awaitable);
      auto req = fmt::format("{} {} HTTP/1.0\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{}", method, target,
                             body.size(), body);
      co_await asio::async_write(s, asio::buffer(req), asio::use_awaitable);
      std::string answer;
      auto [ec, n] = co_await asio::async_read(s, asio::dynamic_buffer(answer), asio::as_tuple(asio::use_awaitable));
      CHECK(ec == asio::error::eof);
      CHECK(n == answer.size());
      co_return answer;
    };
    for (int i = 0; i < 20; ++i)
      answers.push_back(co_await call(
          "POST", "/jobs", fmt::format(R"({{"type":"greet","payload":{{"i":{}}},"group":"g{}"}})", i, i % 3)));
    answers.push_back(co_await call("POST", "/jobs", "{not json"));
    answers.push_back(co_await call("POST", "/jobs", R"({"payload":{}})"));
    co_await eventually([&]() -> awaitable<bool> {
      stats = co_await call("GET", "/stats", "");
      // A handler is done before its finish reaches the queue's counters: wait for both.
      co_return stats.find(R"("done":20)") != std::string::npos&& stats.find(R"("completed":20)") != std::string::npos;
    });
    // The dashboard it mounts under /dashboard: its pages, its API, and no actions (read-only).
    mounted.push_back(co_await call("GET", "/dashboard", ""));
    mounted.push_back(co_await call("GET", "/dashboard/", ""));
    mounted.push_back(co_await call("GET", "/dashboard/api/overview", ""));
    mounted.push_back(co_await call("POST", "/dashboard/api/queues/http/group/pause?name=g1", ""));
  });
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  std::remove(out.c_str());
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  REQUIRE(answers.size() == 22);
  CHECK(answers[0].starts_with("HTTP/1.0 202"));
  CHECK(answers[0].find(R"({"id":"1"})") != std::string::npos);
  CHECK(answers[20].starts_with("HTTP/1.0 400"));
  CHECK(answers[20].find("body is not a JSON object") != std::string::npos);
  CHECK(answers[21].find("job type is empty") != std::string::npos);
  CHECK(stats.find(R"("done":20)") != std::string::npos);
  CHECK(stats.find(R"("completed":20)") != std::string::npos);
  REQUIRE(mounted.size() == 4);
  CHECK(mounted[0].starts_with("HTTP/1.0 301"));
  CHECK(mounted[0].find("Location: /dashboard/\r\n") != std::string::npos);
  CHECK(mounted[1].starts_with("HTTP/1.0 200"));
  CHECK(mounted[1].find("<title>jobrt</title>") != std::string::npos);
  CHECK(mounted[2].find(R"("name":"http")") != std::string::npos);
  CHECK(mounted[2].find(R"("completed":20)") != std::string::npos);
  CHECK(mounted[3].starts_with("HTTP/1.0 403"));
}

TEST_CASE("jobrt dashboard serves its API, prints a made-up token, and refuses a bad or taken address") {
  auto url = url_of(shared_redis());
  std::string queue = key_prefix() + "board";
  CHECK(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "noop", "--group", "g"}).status == 0);
  auto out = fmt::format("/tmp/jobrt-cli-dashboard-{}.out", ::getpid());
  auto pid = start({"dashboard", "--redis", url, "--queue", queue, "--listen", "127.0.0.1:0"}, out);
  unsigned short port = 0;
  std::string token, overview;
  run([&](asio::io_context& ctx) -> awaitable<void> {
    co_await eventually([&] {
      std::ifstream in(out);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      auto at = text.find("listening on http://127.0.0.1:");
      if (at != std::string::npos) port = static_cast<unsigned short>(std::stoi(text.substr(at + 30)));
      auto t = text.find("actions need this token");
      if (t != std::string::npos && text.find('\n', t) != std::string::npos) {
        auto colon = text.find(": ", t + 23);
        token = text.substr(colon + 2, text.find('\n', t) - colon - 2);
      }
      return port != 0 && !token.empty();
    });
    REQUIRE(port != 0);
    asio::ip::tcp::socket s(ctx);
    co_await s.async_connect({asio::ip::make_address("127.0.0.1"), port}, asio::use_awaitable);
    std::string req = "GET /api/overview HTTP/1.0\r\nHost: localhost\r\n\r\n";
    co_await asio::async_write(s, asio::buffer(req), asio::use_awaitable);
    co_await asio::async_read(s, asio::dynamic_buffer(overview), asio::as_tuple(asio::use_awaitable));
  });
  CHECK(token.size() == 32);
  CHECK(overview.starts_with("HTTP/1.0 200"));
  CHECK(overview.find(R"("enqueued":1)") != std::string::npos);
  // The address it has is taken: a second one cannot listen there.
  auto taken =
      jobrt_cli({"dashboard", "--redis", url, "--queue", queue, "--listen", fmt::format("127.0.0.1:{}", port)});
  CHECK(taken.status == 1);
  CHECK(taken.output.find(fmt::format("dashboard: cannot listen on 127.0.0.1:{}: Address already in use", port)) !=
        std::string::npos);
  ::kill(pid, SIGTERM);
  CHECK(wait_for(pid, out).status == 0);
  auto bad = jobrt_cli({"dashboard", "--listen", "nowhere"});
  CHECK(bad.status == 2);
  CHECK(bad.output.find("dashboard: --listen: listen address 'nowhere' has no :PORT") != std::string::npos);
  CHECK(jobrt_cli({"dashboard", "--queue", "a{b}"}).status == 2);
  CHECK(jobrt_cli({"dashboard", "--token", ""}).status == 2);
}

TEST_CASE("every jobrt command answers --help and version prints it and REDIS_URL is the default server") {
  for (std::string command :
       {"worker", "enqueue", "stats", "check", "dlq", "group", "queue", "protocol", "demo", "dashboard"}) {
    auto help = jobrt_cli({command, "--help"});
    CHECK_MESSAGE(help.status == 0, command);
    CHECK_MESSAGE(help.output.starts_with("usage: jobrt " + command), help.output);
  }
  auto top = jobrt_cli({"--help"});
  CHECK(top.status == 0);
  CHECK(top.output.find("Each command takes --help") != std::string::npos);
  auto version = jobrt_cli({"version"});
  CHECK(version.status == 0);
  CHECK(version.output == fmt::format("jobrt {}\n", jobrt::version()));
  auto version_help = jobrt_cli({"version", "--help"});  // every command takes --help
  CHECK(version_help.status == 0);
  CHECK(version_help.output.starts_with("usage: jobrt version"));

  auto url = url_of(shared_redis());
  std::string queue = key_prefix() + "env";
  auto enqueued = jobrt_cli({"enqueue", "--queue", queue, "--type", "noop"}, {"REDIS_URL=" + url});
  CHECK(enqueued.status == 0);
  auto stats = jobrt_cli({"stats", "--queue", queue, "--json"}, {"REDIS_URL=" + url});
  CHECK(stats.status == 0);
  CHECK(stats.output.find("\"enqueued\":1") != std::string::npos);
  auto elsewhere = jobrt_cli({"stats", "--queue", queue}, {"REDIS_URL=redis://127.0.0.1:1"});
  CHECK(elsewhere.status == 1);
  CHECK(elsewhere.output.find("connect to redis://127.0.0.1:1/0: Connection refused") != std::string::npos);
  auto given = jobrt_cli({"stats", "--redis", url, "--queue", queue}, {"REDIS_URL=redis://127.0.0.1:1"});
  CHECK(given.status == 0);  // --redis wins over the environment
}

TEST_CASE(
    "operators' commands from the command line: enqueue --file and group pause/show/resume and dlq show/requeue/purge "
    "and stats --watch") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  std::string queue = key_prefix() + "ops";
  auto file = fmt::format("/tmp/jobrt-cli-ops-{}.jsonl", ::getpid());
  std::ofstream(file) << R"({"type":"noop","payload":{"n":1},"group":"g","id":"g-1"})"
                      << "\n\n"  // a blank line is skipped
                      << R"({"type":"noop","payload":{"n":2},"group":"g","id":"g-2"})"
                      << "\n"
                      << R"({"type":"sleep","payload":{"ms":1,"fail":true},"max_attempts":1,"id":"bad-1"})"
                      << "\n"
                      << R"({"type":"sleep","payload":{"ms":1,"fail":true},"max_attempts":1,"id":"bad-2"})"
                      << "\n";
  auto lines = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--file", file});
  std::remove(file.c_str());
  CHECK(lines.status == 0);
  CHECK(lines.output == "enqueued 4 jobs on " + queue + " (0 duplicates)\n");

  auto paused = jobrt_cli({"group", "pause", "g", "--redis", url, "--queue", queue});
  CHECK(paused.output == "group g: paused\n");
  CHECK(jobrt_cli({"group", "pause", "g", "--redis", url, "--queue", queue}).output == "group g: already paused\n");
  auto shown = jobrt_cli({"group", "show", "--redis", url, "--queue", queue, "--json"});
  CHECK(shown.output.find(R"("group":"g","halted":false)") != std::string::npos);

  auto watch_out = fmt::format("/tmp/jobrt-cli-watch-{}.out", ::getpid());
  auto watcher = start({"stats", "--redis", url, "--queue", queue, "--json", "--watch", "1"}, watch_out);
  auto out = fmt::format("/tmp/jobrt-cli-ops-worker-{}.out", ::getpid());
  auto pid = start({"worker", "--redis", url, "--queue", queue, "--plugin", JOBRT_HANDLERS "/jobrt_noop.so", "--plugin",
                    JOBRT_HANDLERS "/jobrt_sleep.so"},
                   out);
  auto counts = wait_counts(cfg, queue, [](const queue_counts& c) { return c.dead == 2; });
  CHECK(counts.dead == 2);
  CHECK(counts.completed == 0);  // g is paused: neither of its jobs started
  CHECK(counts.started == 2);

  auto resumed = jobrt_cli({"group", "resume", "g", "--redis", url, "--queue", queue});
  CHECK(resumed.output == "group g: resumed\n");
  counts = wait_counts(cfg, queue, [](const queue_counts& c) { return c.completed == 2; });
  CHECK(counts.completed == 2);
  CHECK(jobrt_cli({"group", "show", "--redis", url, "--queue", queue}).output.empty());
  CHECK(wait_for_text(watch_out, R"("completed":2)", std::chrono::seconds(10)));
  ::kill(watcher, SIGTERM);
  auto watched = wait_for(watcher, watch_out);
  CHECK(watched.output.find(R"("completed_per_s":)") != std::string::npos);  // from the second report on
  ::kill(pid, SIGTERM);
  CHECK(wait_for(pid, out).status == 0);

  auto show = jobrt_cli({"dlq", "show", "bad-1", "--redis", url, "--queue", queue});
  CHECK(show.status == 0);
  CHECK(show.output.find("id bad-1\n") != std::string::npos);
  CHECK(show.output.find("runs 1\n") != std::string::npos);
  CHECK(show.output.find("error sleep: failed as asked (payload.fail)") != std::string::npos);
  auto show_json = jobrt_cli({"dlq", "show", "bad-2", "--redis", url, "--queue", queue, "--json"});
  auto letter = boost::json::parse(show_json.output).as_object();
  CHECK(letter.at("id").as_string() == "bad-2");
  CHECK(letter.at("runs").as_int64() == 1);
  CHECK(letter.at("type").as_string() == "sleep");
  CHECK(letter.at("payload") == boost::json::parse(R"({"ms":1,"fail":true})"));  // a JSON value, not text
  CHECK(letter.at("error").as_string() == "sleep: failed as asked (payload.fail)");
  CHECK(!letter.contains("record"));
  auto none = jobrt_cli({"dlq", "show", "nope", "--redis", url, "--queue", queue});
  CHECK(none.status == 1);
  CHECK(none.output.find("no dead letter nope in queue " + queue) != std::string::npos);

  auto requeued = jobrt_cli({"dlq", "requeue", "bad-1", "nope", "--head", "--redis", url, "--queue", queue});
  CHECK(requeued.status == 1);  // one of the two was not there
  CHECK(requeued.output.find("requeued 1 of 2\n") != std::string::npos);
  CHECK(requeued.output.find("dlq requeue: nope not requeued: no such dead letter in queue " + queue) !=
        std::string::npos);
  counts = wait_counts(cfg, queue, [](const queue_counts&) { return true; });
  CHECK(counts.dead == 1);
  CHECK(counts.ready_lanes == 1);  // bad-1 waits for a worker again
  CHECK(jobrt_cli({"dlq", "purge", "bad-2", "--redis", url, "--queue", queue}).output == "purged 1\n");
  auto unknown = jobrt_cli({"dlq", "purge", "nope", "--redis", url, "--queue", queue});
  CHECK(unknown.status == 1);
  CHECK(unknown.output.find("purged 0\n") != std::string::npos);
  CHECK(unknown.output.find("jobrt: dlq purge: no dead letter nope in queue " + queue) != std::string::npos);
  CHECK(jobrt_cli({"dlq", "purge", "--all", "--redis", url, "--queue", queue}).output == "purged 0\n");
  CHECK(jobrt_cli({"dlq", "purge", "--redis", url, "--queue", queue}).status == 2);  // neither ids nor --all
  CHECK(jobrt_cli({"dlq", "list", "--redis", url, "--queue", queue}).output.empty());
}

TEST_CASE("jobrt enqueue --max-group-size refuses a batch that would overfill a group, naming it, and stores none") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  std::string queue = key_prefix() + "limit";
  CHECK(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "t", "--count", "2", "--groups", "1",
                   "--max-group-size", "2"})
            .status == 0);
  auto file = fmt::format("/tmp/jobrt-cli-limit-{}.jsonl", ::getpid());
  std::ofstream(file) << R"({"type":"t","group":"other"})"
                      << "\n"
                      << R"({"type":"t","group":"g0"})"
                      << "\n";
  auto over = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--file", file, "--max-group-size", "2"});
  CHECK(over.status != 0);
  CHECK(
      over.output.find("group 'g0' would hold 3 jobs, over its max group size of 2 (job 2 of 2): nothing was stored") !=
      std::string::npos);
  std::ofstream(file) << R"({"type":"t","group":"other"})"
                      << "\n"
                      << R"({"type":"t","group":"g0","max_group_size":3})"
                      << "\n";
  CHECK(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--file", file, "--max-group-size", "2"}).status == 0);
  std::remove(file.c_str());
  CHECK(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "t", "--max-group-size", "0"}).status == 2);
  auto stats = boost::json::parse(jobrt_cli({"stats", queue, "--redis", url, "--json"}).output).as_object();
  CHECK(stats.at("enqueued").as_int64() == 4);
}

TEST_CASE("jobrt enqueue --group-rate stores each grouped job's limit, a line's own wins, bad ones are refused") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  std::string queue = key_prefix() + "rate";
  auto prefix = redis_backend::key_prefix(queue);
  CHECK(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "t", "--count", "2", "--groups", "1",
                   "--group-rate", "2/60000"})
            .status == 0);
  // (a raw reply: the records as stored, the limit first in each body)
  auto g0 = redis_cli(cfg, {"LRANGE", prefix + "g:g0", "0", "-1"});
  CHECK(g0.find(R"(|{"rate":[2,60000],"type":"t")") != std::string::npos);
  auto file = fmt::format("/tmp/jobrt-cli-rate-{}.jsonl", ::getpid());
  std::ofstream(file) << R"({"type":"t","group":"h","group_rate":{"max":1,"window_ms":5}})"
                      << "\n"
                      << R"({"type":"t"})"
                      << "\n";
  CHECK(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--file", file, "--group-rate", "2/60000"}).status ==
        0);
  CHECK(redis_cli(cfg, {"LRANGE", prefix + "g:h", "0", "-1"}).find(R"(|{"rate":[1,5],"type":"t")") !=
        std::string::npos);
  CHECK(redis_cli(cfg, {"LRANGE", prefix + "ready", "0", "-1"}).find("rate") == std::string::npos);  // ungrouped
  std::ofstream(file) << R"({"type":"t","group":"h","group_rate":{"max":0,"window_ms":5}})"
                      << "\n";
  auto bad_line = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--file", file});
  CHECK(bad_line.status != 0);
  CHECK(bad_line.output.find(":1: \"group_rate\".max is 0; it must be from 1 to 10000") != std::string::npos);
  std::remove(file.c_str());
  for (const char* bad : {"0/1000", "5/0", "ten", "5/1000/2"}) {
    auto refused = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "t", "--group-rate", bad});
    CHECK(refused.status == 2);
    CHECK(refused.output.find(fmt::format("group rate '{}'", bad)) != std::string::npos);
  }
  auto stats = boost::json::parse(jobrt_cli({"stats", queue, "--redis", url, "--json"}).output).as_object();
  CHECK(stats.at("enqueued").as_int64() == 4);
}

TEST_CASE("jobrt enqueue --group-concurrency stores each grouped job's concurrency, a line's own wins, 0 is refused") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  std::string queue = key_prefix() + "conc";
  auto prefix = redis_backend::key_prefix(queue);
  CHECK(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "t", "--count", "2", "--groups", "1",
                   "--group-concurrency", "3", "--group-rate", "2/60000"})
            .status == 0);
  auto g0 = redis_cli(cfg, {"LRANGE", prefix + "g:g0", "0", "-1"});
  CHECK(g0.find(R"(|{"rate":[2,60000],"conc":3,"type":"t")") != std::string::npos);
  auto file = fmt::format("/tmp/jobrt-cli-conc-{}.jsonl", ::getpid());
  std::ofstream(file) << R"({"type":"t","group":"h","group_concurrency":2})"
                      << "\n"
                      << R"({"type":"t","group":"i","group_concurrency":1})"
                      << "\n"
                      << R"({"type":"t"})"
                      << "\n";
  CHECK(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--file", file, "--group-concurrency", "5"}).status ==
        0);
  CHECK(redis_cli(cfg, {"LRANGE", prefix + "g:h", "0", "-1"}).find(R"(|{"conc":2,"type":"t")") != std::string::npos);
  CHECK(redis_cli(cfg, {"LRANGE", prefix + "g:i", "0", "-1"}).find("conc") == std::string::npos);    // 1: as ever
  CHECK(redis_cli(cfg, {"LRANGE", prefix + "ready", "0", "-1"}).find("conc") == std::string::npos);  // ungrouped
  std::ofstream(file) << R"({"type":"t","group":"h","group_concurrency":0})"
                      << "\n";
  auto bad_line = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--file", file});
  CHECK(bad_line.status != 0);
  CHECK(bad_line.output.find(":1: job group_concurrency is 0; it must be from 1 to 10000") != std::string::npos);
  std::remove(file.c_str());
  auto refused = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "t", "--group-concurrency", "0"});
  CHECK(refused.status == 2);
  CHECK(refused.output.find("--group-concurrency") != std::string::npos);
  auto stats = boost::json::parse(jobrt_cli({"stats", queue, "--redis", url, "--json"}).output).as_object();
  CHECK(stats.at("enqueued").as_int64() == 5);
}

TEST_CASE("jobrt enqueue --group-weight stores each grouped job's weight, a line's own wins, 0 is refused") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  std::string queue = key_prefix() + "weight";
  auto prefix = redis_backend::key_prefix(queue);
  CHECK(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "t", "--count", "2", "--groups", "1",
                   "--group-weight", "3", "--group-concurrency", "2"})
            .status == 0);
  CHECK(redis_cli(cfg, {"LRANGE", prefix + "g:g0", "0", "-1"}).find(R"(|{"conc":2,"weight":3,"type":"t")") !=
        std::string::npos);
  auto file = fmt::format("/tmp/jobrt-cli-weight-{}.jsonl", ::getpid());
  std::ofstream(file) << R"({"type":"t","group":"h","group_weight":2})"
                      << "\n"
                      << R"({"type":"t","group":"i","group_weight":1})"
                      << "\n";
  CHECK(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--file", file, "--group-weight", "5"}).status == 0);
  CHECK(redis_cli(cfg, {"LRANGE", prefix + "g:h", "0", "-1"}).find(R"(|{"weight":2,"type":"t")") != std::string::npos);
  CHECK(redis_cli(cfg, {"LRANGE", prefix + "g:i", "0", "-1"}).find("weight") == std::string::npos);  // 1: as ever
  std::ofstream(file) << R"({"type":"t","group":"h","group_weight":0})"
                      << "\n";
  auto bad_line = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--file", file});
  CHECK(bad_line.status != 0);
  CHECK(bad_line.output.find(":1: job group_weight is 0; it must be from 1 to 100") != std::string::npos);
  std::remove(file.c_str());
  auto refused = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "t", "--group-weight", "101"});
  CHECK(refused.status == 2);
  CHECK(refused.output.find("--group-weight") != std::string::npos);
  auto stats = boost::json::parse(jobrt_cli({"stats", queue, "--redis", url, "--json"}).output).as_object();
  CHECK(stats.at("enqueued").as_int64() == 4);
}

TEST_CASE("jobrt enqueue --priority puts a job's lane in its priority's list, a line's own too, and refuses others") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  std::string queue = key_prefix() + "priority";
  auto prefix = redis_backend::key_prefix(queue);
  CHECK(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "t", "--priority", "2"}).status == 0);
  CHECK(redis_cli(cfg, {"LRANGE", prefix + "ready:2", "0", "-1"}).find(R"(|{"prio":2,"type":"t")") !=
        std::string::npos);
  auto file = fmt::format("/tmp/jobrt-cli-priority-{}.jsonl", ::getpid());
  std::ofstream(file) << R"({"type":"t","priority":-1})"
                      << "\n"
                      << R"({"type":"t","priority":0})"
                      << "\n";
  CHECK(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--file", file}).status == 0);
  CHECK(redis_cli(cfg, {"LRANGE", prefix + "ready:-1", "0", "-1"}).find(R"(|{"prio":-1,"type":"t")") !=
        std::string::npos);
  CHECK(redis_cli(cfg, {"LRANGE", prefix + "ready", "0", "-1"}).find(R"(|{"type":"t")") != std::string::npos);
  std::ofstream(file) << R"({"type":"t","priority":5})"
                      << "\n";
  auto bad_line = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--file", file});
  CHECK(bad_line.status != 0);
  CHECK(bad_line.output.find(":1: \"priority\" is 5; it must be a whole number from -2 to 2") != std::string::npos);
  std::remove(file.c_str());
  auto refused = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "t", "--priority", "3"});
  CHECK(refused.status == 2);
  CHECK(refused.output.find("--priority") != std::string::npos);
  auto grouped =
      jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "t", "--group", "g", "--priority", "1"});
  CHECK(grouped.status == 0);
  CHECK(redis_cli(cfg, {"LRANGE", prefix + "ready:1", "0", "-1"}).find("g:g") != std::string::npos);
  auto stats = boost::json::parse(jobrt_cli({"stats", queue, "--redis", url, "--json"}).output).as_object();
  CHECK(stats.at("enqueued").as_int64() == 4);
  CHECK(stats.at("ready_lanes").as_int64() == 4);
}

TEST_CASE("jobrt cancel: pending kept jobs never start, a running one's handler is cancelled, its group goes on") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  std::string queue = key_prefix() + "cancel";
  auto file = fmt::format("/tmp/jobrt-cli-cancel-{}.jsonl", ::getpid());
  std::ofstream(file) << R"({"type":"sleep","group":"g","id":"x-run","payload":{"ms":60000}})"
                      << "\n"
                      << R"({"type":"noop","group":"g","id":"x-next"})"
                      << "\n"
                      << R"({"type":"noop","id":"x-alone"})"
                      << "\n"
                      << R"({"type":"noop","id":"x-plain","keep_ms":0})"
                      << "\n";
  auto stored = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--file", file, "--keep", "60000"});
  std::remove(file.c_str());
  REQUIRE(stored.status == 0);
  auto alone = jobrt_cli({"cancel", "x-alone", "--redis", url, "--queue", queue});
  CHECK(alone.status == 0);
  CHECK(alone.output == "x-alone cancelled\n");
  auto again = jobrt_cli({"cancel", "x-alone", "x-plain", "nobody", "--redis", url, "--queue", queue, "--json"});
  CHECK(again.status == 1);
  CHECK(again.output == R"([{"id":"x-alone","outcome":"already cancelled"},{"id":"x-plain","outcome":"not found"},)"
                        R"({"id":"nobody","outcome":"not found"}])"
                        "\n");

  auto out = fmt::format("/tmp/jobrt-cli-cancel-worker-{}.out", ::getpid());
  auto pid = start({"worker", "--redis", url, "--queue", queue, "--plugin", JOBRT_HANDLERS "/jobrt_noop.so", "--plugin",
                    JOBRT_HANDLERS "/jobrt_sleep.so"},
                   out);
  wait_counts(cfg, queue, [](const queue_counts& c) { return c.running == 1 && c.completed == 1; });  // x-plain too
  auto running = jobrt_cli({"cancel", "x-run", "--redis", url, "--queue", queue});
  CHECK(running.status == 0);
  CHECK(running.output == "x-run cancelled\n");
  wait_counts(cfg, queue, [](const queue_counts& c) { return c.running == 0 && c.completed == 2 && c.groups == 0; });
  ::kill(pid, SIGTERM);
  CHECK(wait_for(pid, out).status == 0);
  for (const char* id : {"x-run", "x-alone"}) {
    auto shown = jobrt_cli({"job", id, "--redis", url, "--queue", queue});
    CHECK(shown.output.find("state cancelled\n") != std::string::npos);
    CHECK(shown.output.find("\ncancelled ") != std::string::npos);
  }
  CHECK(jobrt_cli({"job", "x-next", "--redis", url, "--queue", queue}).output.find("state done\n") !=
        std::string::npos);
  auto late = jobrt_cli({"cancel", "x-next", "--redis", url, "--queue", queue});
  CHECK(late.status == 1);
  CHECK(late.output == "x-next done\n");
}

TEST_CASE("jobrt job finds a kept job pending behind others, delayed, done and dead, and names one it cannot find") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  std::string queue = key_prefix() + "kept";
  auto file = fmt::format("/tmp/jobrt-cli-kept-{}.jsonl", ::getpid());
  std::ofstream(file) << R"({"type":"noop","group":"g","id":"k-1","keep_ms":60000})"
                      << "\n"
                      << R"({"type":"noop","group":"g","id":"k-2","keep_ms":60000,"payload":{"n":2}})"
                      << "\n"
                      << R"({"type":"sleep","payload":{"ms":1,"fail":true},"max_attempts":1,"id":"k-bad"})"
                      << "\n"
                      << R"({"type":"noop","id":"k-late","delay_ms":600000})"
                      << "\n"
                      << R"({"type":"noop","id":"plain","keep_ms":0})"
                      << "\n";
  // --keep is every line's keep unless the line gives its own ("keep_ms":0 gives none).
  auto stored = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--file", file, "--keep", "60000"});
  std::remove(file.c_str());
  REQUIRE(stored.status == 0);
  auto behind = jobrt_cli({"job", "k-2", "--redis", url, "--queue", queue});
  CHECK(behind.status == 0);
  CHECK(behind.output.find("state pending\ngroup g (2 jobs pending or running)\ntype noop\npayload {\"n\":2}\n") !=
        std::string::npos);
  auto late = jobrt_cli({"job", "k-late", "--redis", url, "--queue", queue, "--json"});
  auto late_json = boost::json::parse(late.output).as_object();
  CHECK(late_json.at("state").as_string() == "delayed");
  CHECK(late_json.at("at").as_int64() > 0);
  auto plain = jobrt_cli({"job", "plain", "--redis", url, "--queue", queue});
  CHECK(plain.status == 1);
  CHECK(plain.output.find("jobrt: job: no job plain in queue " + queue + " that can be found") != std::string::npos);

  auto out = fmt::format("/tmp/jobrt-cli-kept-worker-{}.out", ::getpid());
  auto pid = start({"worker", "--redis", url, "--queue", queue, "--plugin", JOBRT_HANDLERS "/jobrt_noop.so", "--plugin",
                    JOBRT_HANDLERS "/jobrt_sleep.so"},
                   out);
  wait_counts(cfg, queue, [](const queue_counts& c) { return c.completed == 3 && c.dead == 1; });
  // --wait: the job's end, and an exit code that says it.
  auto waited = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "noop", "--wait", "20"});
  CHECK(waited.status == 0);
  CHECK(waited.output.find("\nstate done\n") != std::string::npos);
  auto failed = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "sleep", "--payload",
                           R"({"ms":1,"fail":true})", "--max-attempts", "1", "--wait", "20", "--json"});
  CHECK(failed.status == 1);
  CHECK(failed.output.find(R"("duplicate":false,"status":{)") != std::string::npos);
  CHECK(failed.output.find(R"("state":"dead")") != std::string::npos);
  ::kill(pid, SIGTERM);
  CHECK(wait_for(pid, out).status == 0);
  auto waiting = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "noop", "--wait", "1"});
  CHECK(waiting.status == 3);
  CHECK(waiting.output.find("is still pending after 1 s") != std::string::npos);
  CHECK(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "noop", "--count", "2", "--wait", "1"})
            .status == 2);
  auto done = jobrt_cli({"job", "k-2", "--redis", url, "--queue", queue});
  CHECK(done.output.find("state done\n") != std::string::npos);
  CHECK(done.output.find("\ncompleted ") != std::string::npos);
  auto dead = jobrt_cli({"job", "k-bad", "--redis", url, "--queue", queue});
  CHECK(dead.output.find("state dead\n") != std::string::npos);
  CHECK(dead.output.find("error sleep: failed as asked (payload.fail)") != std::string::npos);
  CHECK(jobrt_cli({"job", "plain", "--redis", url, "--queue", queue}).status == 1);  // done, and not kept
}

TEST_CASE("jobrt schedule adds, lists and removes schedules, names a bad value, and lists an unreadable one") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  std::string queue = key_prefix() + "sched";
  auto nightly = jobrt_cli({"schedule", "add", "nightly", "--redis", url, "--queue", queue, "--cron", "0 3 * * *",
                            "--tz", "Europe/Paris", "--type", "report", "--group", "tenant:7"});
  CAPTURE(nightly.output);
  REQUIRE(nightly.status == 0);
  CHECK(nightly.output.find("schedule nightly: ") != std::string::npos);
  auto tick = jobrt_cli({"schedule", "add", "tick", "--redis", url, "--queue", queue, "--every", "10s", "--type",
                         "sleep", "--catch-up", "5", "--json"});
  CAPTURE(tick.output);
  REQUIRE(tick.status == 0);
  auto added = boost::json::parse(tick.output).as_object();
  CHECK(added.at("every_ms").as_int64() == 10000);
  CHECK(added.at("catch_up").as_int64() == 5);

  auto cron =
      jobrt_cli({"schedule", "add", "x", "--redis", url, "--queue", queue, "--cron", "61 * * * *", "--type", "t"});
  CHECK(cron.status == 1);
  CHECK(cron.output.find("cron expression '61 * * * *'") != std::string::npos);
  auto zone = jobrt_cli({"schedule", "add", "x", "--redis", url, "--queue", queue, "--cron", "* * * * *", "--tz",
                         "Mars/Olympus", "--type", "t"});
  CHECK(zone.status == 1);
  CHECK(zone.output.find("unknown time zone 'Mars/Olympus'") != std::string::npos);
  auto both = jobrt_cli({"schedule", "add", "x", "--redis", url, "--queue", queue, "--cron", "* * * * *", "--every",
                         "1s", "--type", "t"});
  CHECK(both.status == 2);
  CHECK(both.output.find("give --cron or --every (one of them)") != std::string::npos);

  // One stored by another version, or by hand: listed with why, beside the others.
  run([&](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), cfg);
    stored_schedule broken;
    broken.name = "broken";
    broken.spec = "{not json\n" + std::string(500, 'x');  // (quoted as one line, cut short)
    broken.next_ms = 1;
    co_await store.put_schedule(queue, broken);
  });
  auto text = jobrt_cli({"schedule", "list", "--redis", url, "--queue", queue});
  CAPTURE(text.output);
  REQUIRE(text.status == 0);
  auto broken_at = text.output.find(
      "broken  unreadable (schedule 'broken': its stored form is not a JSON object: "
      "{not json " +
      std::string(70, 'x') + "...)  next 1970-01-01");
  auto nightly_at = text.output.find("nightly  ");
  auto tick_at = text.output.find("tick  ");
  CHECK(broken_at != std::string::npos);
  CHECK(nightly_at != std::string::npos);
  CHECK(tick_at != std::string::npos);
  CHECK((broken_at < nightly_at && nightly_at < tick_at));
  CHECK(text.output.find("group tenant:7") != std::string::npos);
  CHECK(text.output.find("catch-up 5") != std::string::npos);
  auto listed = jobrt_cli({"schedule", "list", "--redis", url, "--queue", queue, "--json"});
  CAPTURE(listed.output);
  REQUIRE(listed.status == 0);
  auto all = boost::json::parse(listed.output).as_array();
  REQUIRE(all.size() == 3);
  CHECK(all[0].at("name").as_string() == "broken");
  CHECK(all[0].as_object().contains("error"));
  CHECK(all[1].at("cron").as_string() == "0 3 * * *");
  CHECK(all[1].at("tz").as_string() == "Europe/Paris");
  CHECK(all[1].at("job").at("group").as_string() == "tenant:7");
  CHECK(!all[1].as_object().contains("error"));
  CHECK(all[2].at("every_ms").as_int64() == 10000);

  auto removed = jobrt_cli({"schedule", "remove", "tick", "--redis", url, "--queue", queue});
  CHECK(removed.status == 0);
  CHECK(removed.output.find("schedule tick: removed") != std::string::npos);
  auto again = jobrt_cli({"schedule", "remove", "tick", "--redis", url, "--queue", queue});
  CHECK(again.status == 1);
  CHECK(again.output.find(fmt::format("queue '{}' has no schedule 'tick'", queue)) != std::string::npos);
  auto fixed =
      jobrt_cli({"schedule", "add", "broken", "--redis", url, "--queue", queue, "--every", "1h", "--type", "t"});
  CHECK(fixed.status == 0);
  auto left = boost::json::parse(jobrt_cli({"schedule", "list", "--redis", url, "--queue", queue, "--json"}).output);
  REQUIRE(left.as_array().size() == 2);
  CHECK(left.as_array()[0].at("every_ms").as_int64() == 3600000);
  CHECK(left.as_array()[1].at("name").as_string() == "nightly");
}

TEST_CASE("jobrt check reports a stuck group with exit code 1 and --repair fixes it") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  std::string queue = key_prefix() + "stuck";
  CHECK(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "noop", "--group", "fine"}).status == 0);
  // A producer in another language pushed a job but not its group's lane.
  redis_cli(cfg, {"RPUSH", "jobrt:{" + queue + "}:g:orphan", R"(0|orphan-1|{"type":"noop","payload":{}})"});
  auto found = jobrt_cli({"check", queue, "--redis", url});
  CHECK(found.status == 1);
  CHECK(found.output.find("problem: group orphan has 1 jobs and no lane, lease or parked lane") != std::string::npos);
  auto repaired = jobrt_cli({"check", queue, "--redis", url, "--repair", "--json"});
  CHECK(repaired.status == 0);
  auto report = boost::json::parse(repaired.output).as_object();
  CHECK(report.at("repaired").as_int64() >= 1);
  CHECK(report.at("groups").as_int64() == 2);
  auto again = jobrt_cli({"check", queue, "--redis", url});
  CHECK(again.status == 0);
  CHECK(again.output.find("no problems") != std::string::npos);
  auto counts = wait_counts(cfg, queue, [](const queue_counts&) { return true; });
  CHECK(counts.ready_lanes == 2);  // both groups can be claimed now
}

TEST_CASE(
    "jobrt demo passes its checks grouped on the embedded backend and on Redis and --no-groups shows lost updates") {
  auto grouped = jobrt_cli({"demo", "--jobs", "2000", "--commodities", "40"});
  CHECK_MESSAGE(grouped.status == 0, grouped.output);
  CHECK_MESSAGE(grouped.output.find("40/40 commodities   ok") != std::string::npos, grouped.output);
  CHECK_MESSAGE(grouped.output.find("FAILED") == std::string::npos, grouped.output);
  CHECK(grouped.output.find('\r') == std::string::npos);  // to a file: no progress bar redrawn in place
  auto loose = jobrt_cli({"demo", "--jobs", "2000", "--commodities", "40", "--no-groups"});
  CHECK_MESSAGE(loose.status == 0, loose.output);
  CHECK_MESSAGE(loose.output.find("Without groups, concurrent read-yield-write runs lost") != std::string::npos,
                loose.output);
  auto on_redis = jobrt_cli(
      {"demo", "--jobs", "1000", "--commodities", "20", "--redis", url_of(shared_redis()), "--processes", "2"});
  CHECK_MESSAGE(on_redis.status == 0, on_redis.output);
  CHECK_MESSAGE(on_redis.output.find("20/20 commodities   ok") != std::string::npos, on_redis.output);
  CHECK(on_redis.output.find('\r') == std::string::npos);
  // It leaves nothing behind (it left 610 keys before) but the queue's fence and id counters,
  // which a purge keeps: a token or id given out before must never be given out again.
  auto left = redis_cli(shared_redis(), {"KEYS", redis_backend::key_prefix("demo") + "*"});
  CHECK_MESSAGE(left.starts_with("*2\r\n"), left);
  CHECK(left.find("jobrt:{demo}:fence") != std::string::npos);
  CHECK(left.find("jobrt:{demo}:seq") != std::string::npos);
}

TEST_CASE("jobrt demo passes its checks on a Redis Cluster given two of its nodes") {
  auto node = shared_cluster();  // (scripts/cluster.sh's nodes are on consecutive ports)
  auto url = fmt::format("redis://127.0.0.1:{},127.0.0.1:{}", node.port, std::stoi(node.port) + 1);
  // (A queue of its own: the cluster is shared with tests that may run meanwhile.)
  auto out = jobrt_cli({"demo", "--jobs", "1000", "--commodities", "20", "--redis", url, "--processes", "2", "--queue",
                        key_prefix() + "demo"});
  CHECK_MESSAGE(out.status == 0, out.output);
  CHECK(out.output.find("20/20 commodities   ok") != std::string::npos);
  CHECK(out.output.find("FAILED") == std::string::npos);
}

TEST_CASE("jobrt demo passes its checks on a Redis Cluster with its queue over 16 shards") {
  auto node = shared_cluster();
  auto url = fmt::format("redis://127.0.0.1:{}", node.port);
  auto out = jobrt_cli({"demo", "--jobs", "2000", "--commodities", "50", "--redis", url, "--processes", "2", "--shards",
                        "16", "--queue", key_prefix() + "demo"});
  CHECK_MESSAGE(out.status == 0, out.output);
  CHECK(out.output.find("the queue over 16 shards") != std::string::npos);
  CHECK(out.output.find("50/50 commodities   ok") != std::string::npos);
  CHECK(out.output.find("2 of 2 worker processes ran jobs") != std::string::npos);
}

TEST_CASE("jobrt given a cluster's nodes goes on when the first one does not answer, and names each when none does") {
  auto node = shared_cluster();
  auto url = fmt::format("redis://127.0.0.1:1,127.0.0.1:{}", node.port);  // (nothing listens on port 1)
  auto out = jobrt_cli({"demo", "--jobs", "200", "--commodities", "5", "--redis", url, "--processes", "1", "--queue",
                        key_prefix() + "demo"});
  CHECK_MESSAGE(out.status == 0, out.output);
  CHECK(out.output.find("5/5 commodities   ok") != std::string::npos);
  auto down = jobrt_cli({"stats", "--redis", "redis://127.0.0.1:1,127.0.0.1:2", "--queue", "q"});
  CHECK_MESSAGE(down.status == 1, down.output);
  CHECK_MESSAGE(down.output.find("127.0.0.1:1") != std::string::npos, down.output);
  CHECK_MESSAGE(down.output.find("127.0.0.1:2") != std::string::npos, down.output);
}

TEST_CASE("jobrt enqueue --durability replicated fails naming the missing replica, and refuses other values") {
  auto cfg = shared_redis();  // (a server without replicas)
  auto url = url_of(cfg);
  std::string queue = key_prefix() + "durable";
  auto out = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "t", "--durability", "replicated"});
  CHECK(out.status == 1);
  CHECK_MESSAGE(out.output.find("but 0 of 1 replicas acknowledged it within 1000 ms") != std::string::npos, out.output);
  auto bad = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "t", "--durability", "sync"});
  CHECK(bad.status == 2);
  CHECK_MESSAGE(bad.output.find("--durability") != std::string::npos, bad.output);
}

TEST_CASE("jobrt queue purge removes every key of a queue, and refuses while jobs run unless --force") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  std::string queue = key_prefix() + "purged";
  auto prefix = redis_backend::key_prefix(queue);
  REQUIRE(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "sleep", "--payload", R"({"ms":60000})",
                     "--count", "30", "--groups", "3"})
              .status == 0);
  auto out = fmt::format("/tmp/jobrt-cli-purged-{}.out", ::getpid());
  auto pid = start({"worker", "--redis", url, "--queue", queue, "--plugin", JOBRT_HANDLERS "/jobrt_sleep.so"}, out);
  REQUIRE(wait_counts(cfg, queue, [](const queue_counts& c) { return c.running == 3; }).running == 3);
  auto refused = jobrt_cli({"queue", "purge", "--redis", url, "--queue", queue});
  CHECK(refused.status == 1);
  CHECK(refused.output.find("has 3 jobs running") != std::string::npos);
  ::kill(pid, SIGTERM);
  ::kill(pid, SIGTERM);  // forced: the sleeps go back
  wait_for(pid, out);
  CHECK(redis_cli(cfg, {"KEYS", prefix + "*"}) != "*0\r\n");
  auto purged = jobrt_cli({"queue", "purge", "--redis", url, "--queue", queue});
  CAPTURE(purged.output);
  CHECK(purged.status == 0);
  CHECK(purged.output.starts_with(fmt::format("queue {}: purged (", queue)));
  auto left = redis_cli(cfg, {"KEYS", prefix + "*"});  // (a raw reply) the fence and id counters only
  CHECK(left.starts_with("*2\r\n"));
  CHECK(left.find(prefix + "fence") != std::string::npos);
  CHECK(jobrt_cli({"stats", "--redis", url, "--queue", queue}).status == 1);  // unknown now
  CHECK(jobrt_cli({"queue", "--redis", url, "--queue", queue}).status == 2);
}

TEST_CASE("jobrt worker with --queue given twice runs a worker on each queue") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  auto a = key_prefix() + "first", b = key_prefix() + "second";
  for (auto& q : {a, b})
    CHECK(jobrt_cli({"enqueue", "--redis", url, "--queue", q, "--type", "noop", "--count", "5"}).status == 0);
  auto out = fmt::format("/tmp/jobrt-cli-queues-{}.out", ::getpid());
  auto pid = start({"worker", "--redis", url, "--queue", a, "--queue", b, "--concurrency", "2", "--plugin",
                    JOBRT_HANDLERS "/jobrt_noop.so"},
                   out);
  auto ca = wait_counts(cfg, a, [](const queue_counts& c) { return c.completed == 5; });
  auto cb = wait_counts(cfg, b, [](const queue_counts& c) { return c.completed == 5; });
  ::kill(pid, SIGTERM);
  auto f = wait_for(pid, out);
  CHECK(f.status == 0);
  CHECK(ca.completed == 5);
  CHECK(cb.completed == 5);
  CHECK(f.output.find("on queue " + a + " (concurrency 2)") != std::string::npos);
  CHECK(f.output.find("on queue " + b + " (concurrency 2)") != std::string::npos);
  auto twice = jobrt_cli({"worker", "--redis", url, "--queue", a, "--queue", a, "--plugin", "x.so"});
  CHECK(twice.status == 2);
  CHECK(twice.output.find("--queue " + a + " is given twice") != std::string::npos);
}

TEST_CASE(
    "jobrt enqueue and worker spread a queue over --shards, refuse another count or a rate limit, and the tools see "
    "them all") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  auto q = key_prefix() + "sharded";
  CHECK(jobrt_cli({"enqueue", "--redis", url, "--queue", q, "--shards", "4", "--type", "noop", "--count", "40",
                   "--groups", "8"})
            .status == 0);
  CHECK(redis_cli(cfg, {"GET", "jobrt:{" + q + "}:shards"}).find('4') != std::string::npos);
  for (int k = 0; k < 4; ++k)  // eight groups over four shards: each has some (FNV-1a of g0..g7)
    CHECK(redis_cli(cfg, {"EXISTS", fmt::format("jobrt:{{{}#{}}}:stats", q, k)}).find('1') != std::string::npos);
  auto other = jobrt_cli({"enqueue", "--redis", url, "--queue", q, "--shards", "2", "--type", "noop"});
  CHECK(other.status == 1);
  CHECK_MESSAGE(other.output.find("queue '" + q + "' has 4 shards; this process was given 2") != std::string::npos,
                other.output);
  auto refused =
      jobrt_cli({"worker", "--redis", url, "--queue", q, "--shards", "8", "--plugin", JOBRT_HANDLERS "/jobrt_noop.so"});
  CHECK(refused.status == 1);
  CHECK(refused.output.find("has 4 shards; this process was given 8") != std::string::npos);
  auto limited = jobrt_cli(
      {"worker", "--redis", url, "--queue", q, "--rate-limit", "10/1000", "--plugin", JOBRT_HANDLERS "/jobrt_noop.so"});
  CHECK(limited.status == 1);
  CHECK_MESSAGE(limited.output.find("queue '" + q +
                                    "' has 4 shards: a rate limit (--rate-limit, a queue's rate_limit) needs a "
                                    "queue of one shard") != std::string::npos,
                limited.output);
  // A worker given no count takes the stored one.
  auto out = fmt::format("/tmp/jobrt-cli-shards-{}.out", ::getpid());
  auto pid = start({"worker", "--redis", url, "--queue", q, "--plugin", JOBRT_HANDLERS "/jobrt_noop.so"}, out);
  auto c = wait_counts(cfg, q, [](const queue_counts& x) { return x.completed == 40; });
  ::kill(pid, SIGTERM);
  CHECK(wait_for(pid, out).status == 0);
  CHECK(c.completed == 40);
  auto stats = jobrt_cli({"stats", "--redis", url, "--queue", q, "--json"});
  CHECK(stats.status == 0);
  CHECK(stats.output.find("\"completed\":40") != std::string::npos);
  auto check = jobrt_cli({"check", "--redis", url, "--queue", q});
  CHECK(check.status == 0);
}

TEST_CASE("jobrt enqueue --file checks every line, sizes and job options included, before it stores any job") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  std::string queue = key_prefix() + "whole";
  auto file = fmt::format("/tmp/jobrt-cli-whole-{}.jsonl", ::getpid());
  auto write = [&](std::string_view last) {
    std::ofstream out(file);
    for (int i = 0; i < 2500; ++i) out << R"({"type":"noop","payload":{"n":)" << i << "}}\n";
    out << last << "\n";
  };
  // Before, 2,000 of these were stored (two calls of 1,000) before the third call refused the
  // big one, naming it "job 501 of 501".
  write(R"({"type":"noop","payload":")" + std::string(2 << 20, 'x') + R"("})");
  auto big = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--file", file});
  CHECK(big.status == 1);
  CHECK(big.output.find(file + ":2501: job of type 'noop' is 2097") != std::string::npos);
  CHECK(big.output.find("the limit is 1048576; nothing was enqueued") != std::string::npos);
  write(R"({"type":"noop","max_attempts":0})");  // refused by the producer's own check
  auto attempts = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--file", file});
  CHECK(attempts.status == 1);
  CHECK(attempts.output.find(file + ":2501: job max_attempts is 0") != std::string::npos);
  CHECK(wait_counts(cfg, queue, [](const queue_counts&) { return true; }).enqueued == 0);

  // "-" reads standard input.
  std::ofstream(file) << R"({"type":"noop","id":"in-1"})"
                      << "\n"
                      << R"({"type":"noop","id":"in-2"})"
                      << "\n";
  auto piped = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--file", "-"}, {}, file);
  CHECK(piped.output == "enqueued 2 jobs on " + queue + " (0 duplicates)\n");
  std::ofstream(file) << R"({"type":"noop","id":"in-3"})"
                      << "\n"
                      << R"({"type":""})"
                      << "\n";
  auto bad = jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--file", "-"}, {}, file);
  CHECK(bad.status == 1);
  CHECK(bad.output.find("enqueue: stdin:2: job type is empty; nothing was enqueued") != std::string::npos);
  std::remove(file.c_str());
  CHECK(wait_counts(cfg, queue, [](const queue_counts&) { return true; }).enqueued == 2);
}

TEST_CASE("jobrt dlq prints letters as JSON and requeues and purges every letter a filter selects, page by page") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  std::string shards = "1";
  SUBCASE("one queue") {}
  SUBCASE("over 4 shards (the selection walks them by cursor)") { shards = "4"; }
  std::string queue = key_prefix() + "select" + shards;
  auto file = fmt::format("/tmp/jobrt-cli-select-{}.jsonl", ::getpid());
  {
    std::ofstream out(file);
    out << R"({"type":"nosuch-a","group":"ga","id":"a1"})"
        << "\n"
        << R"({"type":"nosuch-a","group":"gb","id":"a2"})"
        << "\n"
        << R"({"type":"nosuch-b","id":"b1"})"
        << "\n"
        << R"({"type":"sleep","payload":{"ms":1,"fail":true},"max_attempts":1,"id":"s1"})"
        << "\n";
    // More than one page of dead_letters (500) and more than one requeue call (500).
    for (int i = 0; i < 1100; ++i) out << R"({"type":"nosuch-c","payload":{"n":)" << i << "}}\n";
  }
  REQUIRE(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--shards", shards, "--file", file}).status == 0);
  std::remove(file.c_str());
  auto out = fmt::format("/tmp/jobrt-cli-select-worker-{}.out", ::getpid());
  // (No worker runs the nosuch types: dead-lettered once the worker has asked.)
  auto pid = start({"worker", "--redis", url, "--queue", queue, "--concurrency", "50", "--unhandled-limit", "0",
                    "--unhandled-delay", "10", "--plugin", JOBRT_HANDLERS "/jobrt_sleep.so"},
                   out);
  auto counts = wait_counts(cfg, queue, [](const queue_counts& c) { return c.dead == 1104; });
  ::kill(pid, SIGTERM);  // requeued letters stay queued from here on
  CHECK(wait_for(pid, out).status == 0);
  REQUIRE(counts.dead == 1104);
  auto dead = [&] { return wait_counts(cfg, queue, [](const queue_counts&) { return true; }).dead; };
  auto dlq = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "dlq");
    args.insert(args.end(), {"--redis", url, "--queue", queue});
    return jobrt_cli(args);
  };

  auto listed = dlq({"list", "--limit", "2000", "--json"});
  std::istringstream lines(listed.output);
  std::map<std::string, boost::json::object> letters;  // by id: workers finish in no set order
  for (std::string line; std::getline(lines, line);) {
    auto o = boost::json::parse(line).as_object();
    letters[std::string(o.at("id").as_string())] = o;
  }
  REQUIRE(letters.size() == 1104);
  CHECK(letters["a1"].at("group").as_string() == "ga");
  CHECK(letters["a1"].at("type").as_string() == "nosuch-a");
  CHECK(letters["a1"].at("error").as_string().starts_with("no handler for type nosuch-a: no worker has been able"));
  CHECK(letters["s1"].at("payload").at("fail").as_bool());
  CHECK(letters["s1"].at("runs").as_int64() == 1);
  // list and show give ages in the same unit.
  CHECK(dlq({"list", "--limit", "2000"}).output.find(" s ago  no handler for type nosuch-a") != std::string::npos);
  auto shown = dlq({"show", "s1"});
  CHECK(shown.output.find("\nfailed ") != std::string::npos);
  CHECK(shown.output.find(" s ago\n") != std::string::npos);
  CHECK(shown.output.find(" ms ago") == std::string::npos);
  CHECK(shown.output.find(R"(payload {"ms":1,"fail":true})") != std::string::npos);

  CHECK(dlq({"requeue", "--type", "nosuch-a"}).output == "requeued 2 of 2\n");
  CHECK(dead() == 1102);
  CHECK(dlq({"purge", "--error", "failed as asked"}).output == "purged 1\n");
  CHECK(dlq({"purge", "--group", "nope"}).output == "purged 0\n");  // matching nothing purges nothing
  CHECK(dlq({"requeue", "--group", "nope", "--type", "nosuch-b"}).output == "requeued 0 of 0\n");
  CHECK(dead() == 1101);
  // Requeueing removes letters as it goes: every one of three pages is found all the same.
  auto many = dlq({"requeue", "--type", "nosuch-c", "--head"});
  CHECK(many.status == 0);
  CHECK(many.output == "requeued 1100 of 1100\n");
  CHECK(dead() == 1);
  CHECK(dlq({"requeue", "--all"}).output == "requeued 1 of 1\n");
  CHECK(dead() == 0);

  struct refused {
    std::vector<std::string> args;
    std::string says;
  };
  for (auto& r : std::vector<refused>{{{"list", "--type", "x"}, "dlq list: unknown option '--type'"},
                                      {{"requeue", "a1", "--all"}, "dlq requeue: give the ids, or --all, or filters"},
                                      {{"purge"}, "dlq purge: give the ids, or --all, or filters"},
                                      {{"purge", "--error", ""}, "dlq purge: --error: the text is empty"}}) {
    auto f = dlq(r.args);
    CAPTURE(f.output);
    CHECK(f.status == 2);
    CHECK(f.output.find(r.says) != std::string::npos);
  }
}

TEST_CASE("jobrt commands fail within about a second on a refused port, a refused password or an unknown host") {
  redis_server server({"--requirepass", "secret"});
  redis_server down;
  down.stop();  // its port is closed now
  auto ask = [](std::vector<std::string> args) {
    auto began = std::chrono::steady_clock::now();
    auto f = jobrt_cli(args);
    return std::pair{f, std::chrono::steady_clock::now() - began};
  };
  auto wrong = fmt::format("redis://:wrong@127.0.0.1:{}", server.port());
  auto nobody = fmt::format("redis://nobody:secret@127.0.0.1:{}", server.port());
  struct unreachable {
    std::string url;
    std::string says;
  };
  // Before, each of these took the PING's 10 s.
  for (auto& u : std::vector<unreachable>{
           {down.url(), fmt::format("jobrt: connect to redis://127.0.0.1:{}/0: Connection refused", down.port())},
           {wrong, "AUTH refused: WRONGPASS"},
           {nobody, "AUTH refused: WRONGPASS"},
           {"redis://nosuch.invalid:6379", "jobrt: connect to redis://nosuch.invalid:6379/0: cannot resolve"}}) {
    for (std::vector<std::string> args : {std::vector<std::string>{"stats"},
                                          {"check"},
                                          {"dlq", "list"},
                                          {"group", "show"},
                                          {"enqueue", "--type", "noop"}}) {
      args.insert(args.end(), {"--redis", u.url});
      auto [f, took] = ask(args);
      CAPTURE(fmt::format("{}", fmt::join(args, " ")));
      CAPTURE(f.output);
      CHECK(f.status == 1);
      CHECK(f.output.find(u.says) != std::string::npos);
      CHECK(f.output.find("wrong") == std::string::npos);  // the password is not printed
      CHECK(took < std::chrono::seconds(3));
    }
  }
  // The worker outlives a server that is down (asked again every 10 s), but not a refusal of
  // who it is: that would not change by waiting.
  for (auto& url : {wrong, std::string("redis://nosuch.invalid:6379")}) {
    auto out = fmt::format("/tmp/jobrt-cli-refused-{}.out", ::getpid());
    auto began = std::chrono::steady_clock::now();
    auto f = wait_at_most(start({"worker", "--redis", url, "--plugin", JOBRT_HANDLERS "/jobrt_noop.so"}, out), out,
                          std::chrono::seconds(15));
    CAPTURE(f.output);
    CHECK(f.status == 1);
    CHECK(std::chrono::steady_clock::now() - began < std::chrono::seconds(3));
    CHECK(f.output.find(url == wrong ? "AUTH refused: WRONGPASS" : "cannot resolve 'nosuch.invalid'") !=
          std::string::npos);
  }
}

TEST_CASE("jobrt commands wait for a server that accepts and does not answer yet, and say so") {
  redis_server server;  // private: paused below
  REQUIRE(jobrt_cli({"enqueue", "--redis", server.url(), "--queue", "paused", "--type", "t"}).status == 0);
  redis_cli(server.config(), {"CLIENT", "PAUSE", "3000", "ALL"});
  auto f = jobrt_cli({"stats", "--redis", server.url(), "--queue", "paused"});
  CAPTURE(f.output);
  CHECK(f.status == 0);
  CHECK(f.output.find(fmt::format("jobrt: redis at {}/0 is not ready (", server.url())) != std::string::npos);
  CHECK(f.output.find("waiting up to 10 s") != std::string::npos);
  CHECK(f.output.find("queue paused: 1 ready lanes") != std::string::npos);
}

TEST_CASE("typos are errors: an unknown queue, a group with no jobs, a group that is not paused") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  std::string queue = key_prefix() + "typos";
  REQUIRE(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "t", "--group", "real"}).status == 0);
  for (std::vector<std::string> command :
       {std::vector<std::string>{"stats"}, {"check"}, {"dlq", "list"}, {"group", "show"}}) {
    command.insert(command.end(), {"--redis", url, "--queue", queue + "-typo"});
    auto f = jobrt_cli(command);
    CAPTURE(f.output);
    CHECK(f.status == 1);
    CHECK(f.output.find(fmt::format("queue '{}-typo' is unknown", queue)) != std::string::npos);
  }
  auto typo = jobrt_cli({"group", "pause", "no-such-group", "--redis", url, "--queue", queue});
  CHECK(typo.status == 1);
  CHECK(typo.output.find("group 'no-such-group' of queue") != std::string::npos);
  CHECK(typo.output.find("has no jobs") != std::string::npos);
  CHECK(jobrt_cli({"group", "show", "--redis", url, "--queue", queue}).output.empty());  // nothing stored
  auto ahead = jobrt_cli({"group", "pause", "later", "--force", "--redis", url, "--queue", queue});
  CHECK(ahead.status == 0);
  CHECK(ahead.output == "group later: paused\n");
  CHECK(jobrt_cli({"group", "pause", "real", "--redis", url, "--queue", queue}).status == 0);
  auto not_paused = jobrt_cli({"group", "resume", "other", "--redis", url, "--queue", queue});
  CHECK(not_paused.status == 1);
  CHECK(not_paused.output.find("group 'other' of queue") != std::string::npos);
  CHECK(not_paused.output.find("is not paused") != std::string::npos);
  CHECK(jobrt_cli({"group", "resume", "real", "--redis", url, "--queue", queue}).output == "group real: resumed\n");
}

TEST_CASE("a second SIGTERM or SIGINT while jobrt worker stops forces the stop: running jobs are handed back") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  for (int signal : {SIGTERM, SIGINT}) {
    CAPTURE(signal);
    std::string queue = key_prefix() + (signal == SIGTERM ? "forced-term" : "forced-int");
    // One attempt only: a run that counted as failed would dead-letter it.
    REQUIRE(jobrt_cli({"enqueue", "--redis", url, "--queue", queue, "--type", "sleep", "--payload", R"({"ms":60000})",
                       "--group", "g", "--max-attempts", "1"})
                .status == 0);
    auto out = fmt::format("/tmp/jobrt-cli-forced-{}.out", ::getpid());
    auto pid = start(
        {"worker", "--redis", url, "--queue", queue, "--grace", "60000", "--plugin", JOBRT_HANDLERS "/jobrt_sleep.so"},
        out);
    REQUIRE(wait_counts(cfg, queue, [](const queue_counts& c) { return c.running == 1; }).running == 1);
    ::kill(pid, signal);
    REQUIRE(wait_for_text(out, "stopping (grace 60000 ms", std::chrono::seconds(10)));
    auto forced = std::chrono::steady_clock::now();
    ::kill(pid, signal);  // before, it waited out the grace: a minute
    auto f = wait_at_most(pid, out, std::chrono::seconds(15));
    CAPTURE(f.output);
    CHECK(std::chrono::steady_clock::now() - forced < std::chrono::seconds(5));
    CHECK(f.status == 128 + signal);
    CHECK(f.output.find("again: forcing the stop") != std::string::npos);
    auto counts = wait_counts(cfg, queue, [](const queue_counts&) { return true; });
    CHECK(counts.running == 0);
    CHECK(counts.started == 0);  // handed back: no run, no attempt counted
    CHECK(counts.dead == 0);
    CHECK(counts.completed == 0);
    CHECK(counts.ready_lanes == 1);
    CHECK(jobrt_cli({"check", "--redis", url, "--queue", queue}).status == 0);
  }
}

TEST_CASE("the command line takes --opt=value, short options, environment variables, - for stdin and --json") {
  auto cfg = shared_redis();
  auto url = url_of(cfg);
  std::string queue = key_prefix() + "habits";
  auto json_of = [](const finished& f) {
    CAPTURE(f.output);
    return boost::json::parse(f.output).as_object();
  };
  auto payload = fmt::format("/tmp/jobrt-cli-payload-{}.json", ::getpid());
  std::ofstream(payload) << R"({"from": "stdin"})"
                         << "\n";
  auto one =
      jobrt_cli({"enqueue", "--redis=" + url, "--queue=" + queue, "-t", "noop", "-g", "g1", "--payload", "-", "--json"},
                {}, payload);
  std::remove(payload.c_str());
  REQUIRE(one.status == 0);
  auto enqueued = json_of(one);
  CHECK(enqueued.at("queue") == queue.c_str());
  CHECK(enqueued.at("duplicate") == false);
  CHECK(!enqueued.at("id").as_string().empty());
  CHECK(redis_cli(cfg, {"LRANGE", redis_backend::key_prefix(queue) + "g:g1", "0", "-1"}).find(R"("from":"stdin")") !=
        std::string::npos);

  // REDIS_URL and JOBRT_QUEUE stand in for --redis and --queue; the command line wins over them.
  std::vector<std::string> env{"REDIS_URL=" + url, "JOBRT_QUEUE=" + queue};
  auto second = jobrt_cli({"enqueue", "-t", "noop", "-g", "g1", "--json"}, env);
  CHECK(json_of(second).at("queue") == queue.c_str());
  auto stats = jobrt_cli({"stats", "--json"}, env);
  CHECK(json_of(stats).at("enqueued") == 2);
  CHECK(json_of(jobrt_cli({"stats", queue, "--json"}, {"REDIS_URL=" + url})).at("enqueued") == 2);  // an argument
  CHECK(jobrt_cli({"stats", "-q", queue + "-other"}, env).status == 1);  // unknown: --queue won over JOBRT_QUEUE

  auto paused = json_of(jobrt_cli({"group", "pause", "g1", "--json"}, env));
  CHECK(paused.at("group") == "g1");
  CHECK(paused.at("paused") == true);
  CHECK(paused.at("changed") == true);
  CHECK(json_of(jobrt_cli({"group", "resume", "g1", "--json"}, env)).at("paused") == false);

  // Ids from standard input, one per line; those that are no dead letter are named.
  auto ids = fmt::format("/tmp/jobrt-cli-ids-{}.txt", ::getpid());
  std::ofstream(ids) << "nope-1\n\nnope-2 \n";
  auto requeued = jobrt_cli({"dlq", "requeue", "-", "--json"}, env, ids);
  std::remove(ids.c_str());
  CHECK(requeued.status == 1);
  auto report = json_of(finished{0, requeued.output.substr(requeued.output.rfind('{'))});
  CHECK(report.at("requeued") == 0);
  CHECK(report.at("of") == 2);
  CHECK(report.at("not_requeued") == boost::json::array{"nope-1", "nope-2"});
  auto purged = jobrt_cli({"dlq", "purge", "nope-3", "--json"}, env);
  CHECK(purged.status == 1);
  CHECK(purged.output.find(R"({"purged":0,"not_found":["nope-3"]})") != std::string::npos);

  // Only the chosen command reads its variables; an option given twice takes its last value.
  CHECK(jobrt_cli({"version"}, {"JOBRT_CONCURRENCY=0", "JOBRT_QUEUE=a{b"}).status == 0);
  CHECK(json_of(jobrt_cli({"stats", "-q", "nope", "--queue", queue, "--json"}, env)).at("queue") == queue.c_str());
  CHECK(jobrt_cli({"help"}).status == 0);

  // Every worker option has its JOBRT_ variable, range-checked as the option is.
  auto help = jobrt_cli({"worker", "--help"});
  CHECK(help.output.find("[$JOBRT_CONCURRENCY]") != std::string::npos);
  auto zero = jobrt_cli({"worker", "--plugin", JOBRT_HANDLERS "/jobrt_noop.so"}, {"JOBRT_CONCURRENCY=0"});
  CHECK(zero.status == 2);
  CHECK(zero.output.find("worker: --concurrency: '0' is not a number from 1 to 100000") != std::string::npos);
  auto out = fmt::format("/tmp/jobrt-cli-habits-{}.out", ::getpid());
  auto pid = start({"worker"}, out,
                   {"REDIS_URL=" + url, "JOBRT_QUEUE=" + queue, "JOBRT_CONCURRENCY=3",
                    "JOBRT_PLUGIN=" JOBRT_HANDLERS "/jobrt_noop.so"});
  CHECK(wait_for_text(out, fmt::format("running noop on queue {} (concurrency 3)", queue), std::chrono::seconds(20)));
  CHECK(wait_counts(cfg, queue, [](const queue_counts& c) { return c.completed == 2; }).completed == 2);
  ::kill(pid, SIGTERM);
  CHECK(wait_at_most(pid, out, std::chrono::seconds(20)).status == 0);

  auto gone = json_of(jobrt_cli({"queue", "purge", queue, "--json"}, {"REDIS_URL=" + url}));
  CHECK(gone.at("queue") == queue.c_str());
  CHECK(gone.at("purged") == true);
  CHECK(gone.at("keys").as_int64() > 0);
  CHECK(json_of(jobrt_cli({"version", "--json"})).at("version").as_string() == jobrt::version());
}

TEST_CASE("jobrt protocol prints the enqueue script this jobrt runs, its SHA1 as Redis has it, and a queue's keys") {
  auto cfg = shared_redis();
  std::ifstream in(JOBRT_LUA_DIR "/enqueue.lua");
  std::string source(std::istreambuf_iterator<char>(in), {});
  auto script = jobrt_cli({"protocol", "script"});
  CHECK(script.status == 0);
  CHECK(script.output == source);
  auto sha = jobrt_cli({"protocol", "sha"});
  CHECK(sha.status == 0);
  auto loaded = redis_cli(cfg, {"SCRIPT", "LOAD", source});  // a raw reply: $40\r\n<sha>\r\n
  CHECK(loaded.find(sha.output.substr(0, 40)) != std::string::npos);
  CHECK(sha.output.size() == 41);
  CHECK(jobrt_cli({"protocol", "keys", "imports"}).output ==
        "jobrt:{imports}:ready\njobrt:{imports}:seq\njobrt:{imports}:ids\njobrt:{imports}:stats\n"
        "jobrt:{imports}:delayed\n");
  auto keys = boost::json::parse(jobrt_cli({"protocol", "keys", "imports", "--json"}).output).as_array();
  CHECK(keys.size() == 5);
  CHECK(keys[4] == "jobrt:{imports}:delayed");
  CHECK(jobrt_cli({"protocol", "keys"}).status == 2);
}
