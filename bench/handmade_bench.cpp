// The design jobrt replaces, rebuilt as a baseline (docs/BENCHMARKS.md, "What is compared").
//
// A shared Redis list of jobs (producers LPUSH, so the oldest job is at the right); worker
// threads, each with a blocking connection of its own, loop over rounds:
//   1. take the global queue lock: SETNX, then EXPIRE (two commands, not atomic); when taken by
//      another thread, sleep the retry pause (800 ms) and try again;
//   2. scan the list from the right with LINDEX -1, -2, ... for a job whose group lock can be
//      taken: SETNX lock:<group>, then EXPIRE;
//   3. store the job under the thread's own key (crash recovery), remove it with LREM;
//   4. release the queue lock (DEL, whoever holds it), run the job (a no-op), delete the group
//      lock (DEL, whoever holds it);
//   5. sleep the round pause (2 s).
// The sleeps are scaled by SLEEP_SCALE: 1 is the design as deployed, 0 shows what the scan and
// the locks cost on their own. The threads use hiredis' blocking client, as such a design would:
// this program rebuilds the baseline, it is no part of jobrt (whose connection is Asio's).
//
//   jobrt_bench_handmade HOST PORT throughput DEPTH THREADS GROUPS SLEEP_SCALE SECONDS
//     fills the list with DEPTH jobs over GROUPS groups, runs THREADS threads for SECONDS (or
//     until the list is empty); prints jobs/s, Redis commands and CPU per job.
//   jobrt_bench_handmade HOST PORT depth DEPTH CLAIMS
//     fills the list with DEPTH jobs (1,000 groups), then one thread without sleeps makes CLAIMS
//     claims (steps 1-4); prints the median server time of a claim (the sum of `usec` over every
//     command of the claim in INFO commandstats, reset before each) and its median wall time.
// Output: one line of key=value pairs. The server must be a throw-away one: it is flushed.
#include <hiredis.h>

#include "server_stats.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

struct reply_deleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using reply_ptr = std::unique_ptr<redisReply, reply_deleter>;

class client {
 public:
  client(const std::string& host, int port) : ctx_(redisConnect(host.c_str(), port)) {
    if (!ctx_ || ctx_->err) throw std::runtime_error(fmt::format("connect: {}", ctx_ ? ctx_->errstr : "no memory"));
  }
  ~client() { redisFree(ctx_); }
  client(const client&) = delete;
  client& operator=(const client&) = delete;

  reply_ptr command(const std::vector<std::string>& args) {
    append(args);
    return read();
  }
  void append(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    if (redisAppendCommandArgv(ctx_, static_cast<int>(args.size()), argv.data(), lens.data()) != REDIS_OK)
      throw std::runtime_error(fmt::format("append: {}", ctx_->errstr));
  }
  reply_ptr read() {
    void* r = nullptr;
    if (redisGetReply(ctx_, &r) != REDIS_OK || !r) throw std::runtime_error(fmt::format("reply: {}", ctx_->errstr));
    reply_ptr out(static_cast<redisReply*>(r));
    if (out->type == REDIS_REPLY_ERROR) throw std::runtime_error(fmt::format("redis: {}", out->str));
    return out;
  }

 private:
  redisContext* ctx_;
};

using jobrt::bench::server_stats;

server_stats read_stats(client& c) {
  auto r = c.command({"INFO", "all"});
  return jobrt::bench::parse_server_stats(std::string(r->str, r->len));
}

const std::string queue_key = "handmade:queue";
const std::string queue_lock = "handmade:queue:lock";

std::string group_of(const std::string& job) {
  auto at = job.find("\"group\":\"");
  if (at == std::string::npos) return {};
  at += 9;
  return job.substr(at, job.find('"', at) - at);
}

void fill(client& c, long depth, long groups) {
  c.command({"FLUSHALL"});
  for (long first = 0; first < depth; first += 1000) {
    std::vector<std::string> args{"LPUSH", queue_key};
    for (long i = first; i < std::min(depth, first + 1000); ++i)
      args.push_back(fmt::format(R"({{"id":{},"type":"noop","group":"g{}","payload":{{}}}})", i, i % groups));
    c.command(args);
  }
}

// Sleeps that end early when the run is over, so the run's length is what it says.
class stopper {
 public:
  bool sleep_for(std::chrono::milliseconds d) {
    std::unique_lock lock(m_);
    return !cv_.wait_for(lock, d, [&] { return stopped_; });
  }
  void stop() {
    {
      std::lock_guard lock(m_);
      stopped_ = true;
    }
    cv_.notify_all();
  }
  bool stopped() {
    std::lock_guard lock(m_);
    return stopped_;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool stopped_ = false;
};

enum class claim_outcome { claimed, empty, queue_locked };

// Steps 1-4 of a round. On `claimed`, `job` holds the job and its group lock is held.
claim_outcome claim(client& c, const std::string& me, std::string& job) {
  if (c.command({"SETNX", queue_lock, me})->integer == 0) return claim_outcome::queue_locked;
  c.command({"EXPIRE", queue_lock, "30"});
  bool found = false;
  for (long i = -1;; --i) {
    auto item = c.command({"LINDEX", queue_key, std::to_string(i)});
    if (item->type == REDIS_REPLY_NIL) break;
    std::string candidate(item->str, item->len);
    auto lock = "handmade:lock:" + group_of(candidate);
    if (c.command({"SETNX", lock, me})->integer == 1) {
      c.command({"EXPIRE", lock, "60"});
      job = std::move(candidate);
      found = true;
      break;
    }
  }
  if (found) {
    c.command({"SET", "handmade:current:" + me, job});
    c.command({"LREM", queue_key, "1", job});
  }
  c.command({"DEL", queue_lock});
  return found ? claim_outcome::claimed : claim_outcome::empty;
}

void finish(client& c, const std::string& me, const std::string& job) {
  c.command({"DEL", "handmade:lock:" + group_of(job)});
  c.command({"DEL", "handmade:current:" + me});
}

int throughput(const std::string& host, int port, long depth, int threads, long groups, double scale, double seconds) {
  client admin(host, port);
  fill(admin, depth, groups);
  admin.command({"CONFIG", "RESETSTAT"});
  auto round_pause = std::chrono::milliseconds(static_cast<long>(2000 * scale));
  auto retry_pause = std::chrono::milliseconds(static_cast<long>(800 * scale));
  std::atomic<long> done{0};
  std::atomic<bool> empty{false};
  stopper stop;
  std::vector<std::string> errors(static_cast<std::size_t>(threads));
  auto s0 = read_stats(admin);
  auto t0 = clock_type::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      try {
        client c(host, port);
        auto me = fmt::format("w{}", t);
        std::string job;
        while (!stop.stopped()) {
          auto outcome = claim(c, me, job);
          if (outcome == claim_outcome::queue_locked) {
            if (retry_pause.count()) stop.sleep_for(retry_pause);
            continue;
          }
          if (outcome == claim_outcome::claimed) {
            finish(c, me, job);  // the job itself is a no-op
            if (done.fetch_add(1) + 1 == depth) {
              empty = true;
              stop.stop();
            }
          }
          if (round_pause.count()) stop.sleep_for(round_pause);
        }
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(t)] = e.what();
        stop.stop();
      }
    });
  auto deadline = t0 + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
  while (!stop.stopped() && clock_type::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  stop.stop();
  auto t1 = clock_type::now();
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (!e.empty()) {
      fmt::print(stderr, "error: {}\n", e);
      return 1;
    }
  auto s1 = read_stats(admin);
  auto n = static_cast<double>(std::max(1L, done.load()));
  auto secs = std::chrono::duration<double>(t1 - t0).count();
  fmt::print(
      "handmade depth={} threads={} groups={} sleep_scale={} seconds={:.2f} jobs={} drained={} jobs_per_sec={:.2f} "
      "cmds_per_job={:.1f} redis_cpu_us_per_job={:.1f}\n",
      depth, threads, groups, scale, secs, done.load(), empty.load(), static_cast<double>(done.load()) / secs,
      static_cast<double>(s1.commands - s0.commands) / n, (s1.cpu_seconds - s0.cpu_seconds) * 1e6 / n);
  return 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int depth_mode(const std::string& host, int port, long depth, int claims) {
  client c(host, port);
  fill(c, depth, 1000);
  std::vector<double> server, wall;
  std::string job;
  for (int i = 0; i < claims; ++i) {
    c.command({"CONFIG", "RESETSTAT"});
    auto t0 = clock_type::now();
    if (claim(c, "w0", job) != claim_outcome::claimed) throw std::runtime_error("depth: nothing claimed");
    auto t1 = clock_type::now();
    server.push_back(read_stats(c).usec);
    wall.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    finish(c, "w0", job);
  }
  fmt::print("handmade_depth queued={} claims={} claim_usec_p50={:.0f} claim_wall_us_p50={:.0f}\n", depth, claims,
             median(server), median(wall));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    fmt::print(stderr, "usage: {} HOST PORT throughput DEPTH THREADS GROUPS SLEEP_SCALE SECONDS | depth DEPTH CLAIMS\n",
               argv[0]);
    return 2;
  }
  std::string host = argv[1];
  int port = std::atoi(argv[2]);
  std::string mode = argv[3];
  auto arg = [&](int i, const char* fallback) { return std::string(argc > i ? argv[i] : fallback); };
  try {
    if (mode == "throughput")
      return throughput(host, port, std::stol(arg(4, "100000")), std::stoi(arg(5, "100")), std::stol(arg(6, "1000")),
                        std::stod(arg(7, "1")), std::stod(arg(8, "10")));
    if (mode == "depth") return depth_mode(host, port, std::stol(arg(4, "1000")), std::stoi(arg(5, "50")));
    fmt::print(stderr, "unknown mode {}\n", mode);
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
