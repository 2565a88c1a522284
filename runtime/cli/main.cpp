// The jobrt command.
#include "cli.hpp"

#include <jobrt/metrics.hpp>
#include <jobrt/redis/config.hpp>
#include <jobrt/redis/request.hpp>

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace jobrt::cli {

std::string string_arg(const args& a, std::size_t& i) {
  if (i + 1 >= a.size()) throw usage_error(fmt::format("option {} needs a value", a[i]));
  return a[++i];
}

std::size_t number_arg(const args& a, std::size_t& i) {
  std::string name = a[i];
  std::string text = string_arg(a, i);
  std::size_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size())
    throw usage_error(fmt::format("option {}: '{}' is not a non-negative number", name, text));
  return value;
}

std::size_t number_arg(const args& a, std::size_t& i, std::size_t min, std::size_t max) {
  std::string name = a[i];
  std::string text = a.size() > i + 1 ? a[i + 1] : std::string();
  auto value = number_arg(a, i);
  if (value < min || value > max)
    throw usage_error(fmt::format("option {}: '{}' is not a number from {} to {}", name, text, min, max));
  return value;
}

void no_more(const std::vector<std::string>& positional, std::size_t takes, std::string_view command) {
  if (positional.size() > takes)
    throw usage_error(fmt::format("{}: unexpected argument '{}'", command, positional[takes]));
}

boost::asio::awaitable<ping_result> ping_within(redis::connection& conn, std::chrono::milliseconds limit) {
  redis::request ping("PING");
  ping.options.timeout = limit;
  ping_result r;
  try {
    co_await redis::exec(conn, std::move(ping));
    r.answered = true;
    co_return r;
  } catch (const std::exception& e) {
    // The connection's own account says why (refused, timed out, AUTH refused...); else the request's.
    r.why = conn.last_error();
    if (r.why.empty()) r.why = e.what();
  }
  r.failure = conn.last_failure();
  co_return r;
}

bool final_failure(redis::connect_failure f) {
  using redis::connect_failure;
  return f == connect_failure::unresolved || f == connect_failure::refused || f == connect_failure::denied;
}

boost::asio::awaitable<void> check_reachable(redis::connection& conn, const std::string& url) {
  // A first look, short: a refused port or password fails its first attempt to connect at once.
  // Only a server that is there and not ready yet is worth the longer wait.
  constexpr std::chrono::milliseconds first_look{1000}, whole_wait{10000};
  auto r = co_await ping_within(conn, first_look);
  if (r.answered) co_return;
  if (final_failure(r.failure)) throw std::runtime_error(r.why);  // it names the address, without password
  auto address = redis::config::from_url(url).address();
  fmt::print(stderr, "jobrt: redis at {} is not ready ({}); waiting up to {} s\n", address, r.why,
             std::chrono::duration_cast<std::chrono::seconds>(whole_wait).count());
  r = co_await ping_within(conn, whole_wait - first_look);
  if (!r.answered) throw std::runtime_error(fmt::format("redis at {} does not answer: {}", address, r.why));
}

void run_threads(boost::asio::io_context& ctx, std::size_t threads) {
  std::mutex mutex;
  std::exception_ptr first;
  auto run = [&] {
    try {
      ctx.run();
    } catch (...) {
      std::lock_guard lock(mutex);
      if (!first) first = std::current_exception();
      ctx.stop();
    }
  };
  std::vector<std::thread> extra;
  for (std::size_t t = 1; t < threads; ++t) extra.emplace_back(run);
  run();
  for (auto& t : extra) t.join();
  if (first) std::rethrow_exception(first);
}

std::string default_redis_url() {
  const char* url = std::getenv("REDIS_URL");
  return url && *url ? url : "redis://127.0.0.1:6379";
}

void check_url(const std::string& url) {
  try {
    redis::config::from_url(url);
  } catch (const std::invalid_argument& e) {
    throw usage_error(e.what());
  }
}

}  // namespace jobrt::cli

namespace {

constexpr const char* usage =
    "usage: jobrt <command> [options]\n"
    "commands:\n"
    "  worker    run handlers from plugins on a queue\n"
    "  enqueue   put jobs on a queue: one, a JSON-lines file, or N generated\n"
    "  stats     a queue's counts and counters\n"
    "  check     verify a queue's invariants (--repair fixes what it finds)\n"
    "  dlq       dead letters: list, show, requeue, purge\n"
    "  group     paused and halted groups: show, pause, resume\n"
    "  queue     purge: remove everything of a queue\n"
    "  demo      stock arrivals on the embedded backend (or --redis URL)\n"
    "  version   print the version\n"
    "Each command takes --help. The server is --redis URL, else $REDIS_URL, else\n"
    "redis://127.0.0.1:6379.\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace jobrt::cli;
  if (argc < 2) {
    fmt::print(stderr, "{}", usage);
    return 2;
  }
  std::string command = argv[1];
  args rest(argv + 2, argv + argc);
  try {
    if (command == "demo") return demo(rest);
    if (command == "worker") return worker_command(rest);
    if (command == "enqueue") return enqueue_command(rest);
    if (command == "stats") return stats(rest);
    if (command == "check") return check(rest);
    if (command == "dlq") return dlq(rest);
    if (command == "group") return group(rest);
    if (command == "queue") return queue(rest);
    if (command == "demo-worker") return demo_worker(rest);  // hidden: jobrt demo --redis starts it
    if (command == "version" || command == "--version") {
      if (rest.size() == 1 && (rest[0] == "--help" || rest[0] == "-h")) {
        fmt::print("usage: jobrt version\nPrints jobrt's version.\n");
        return 0;
      }
      if (!rest.empty()) {
        fmt::print(stderr, "jobrt: version takes no arguments\n");
        return 2;
      }
      fmt::print("jobrt {}\n", jobrt::version());
      return 0;
    }
    if (command == "help" || command == "--help" || command == "-h") {
      fmt::print("{}", usage);
      return 0;
    }
    fmt::print(stderr, "jobrt: unknown command '{}'\n{}", command, usage);
    return 2;
  } catch (const usage_error& e) {
    // The command's own options are what went wrong: point at them, not at the command list
    // (demo-worker, which jobrt demo starts, has no help of its own).
    if (command == "demo-worker") command = "demo";
    fmt::print(stderr, "jobrt: {}\n(see jobrt {} --help)\n", e.what(), command);
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "jobrt: {}\n", e.what());
    return 1;
  }
}
