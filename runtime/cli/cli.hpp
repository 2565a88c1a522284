// The jobrt command: shared pieces of its subcommands.
#pragma once

#include <jobrt/redis/connection.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace jobrt::cli {

using args = std::vector<std::string>;

/// Wrong use of the command line: printed with the usage, exit code 2.
class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The value after option a[i] (advances i); throws usage_error when missing.
std::string string_arg(const args& a, std::size_t& i);
/// The same, as a non-negative integer.
std::size_t number_arg(const args& a, std::size_t& i);
/// The same, from min to max (the usage_error names the range).
std::size_t number_arg(const args& a, std::size_t& i, std::size_t min, std::size_t max);
/// Throws usage_error when a command got a positional argument it does not take.
void no_more(const std::vector<std::string>& positional, std::size_t takes, std::string_view command);

/// The default server: $REDIS_URL, else redis://127.0.0.1:6379.
std::string default_redis_url();
/// Throws usage_error naming what is wrong with a Redis URL.
void check_url(const std::string& url);
/// What a PING with a time limit found: answered, or why not (the connection's account).
struct ping_result {
  bool answered = false;
  redis::connect_failure failure = redis::connect_failure::none;
  std::string why;
};
boost::asio::awaitable<ping_result> ping_within(redis::connection& conn, std::chrono::milliseconds limit);
/// Whether a failure to connect is final: waiting for the server would not change it.
bool final_failure(redis::connect_failure f);
/// A PING before a command's work. A server that cannot be reached (final_failure) is an error
/// naming it within about a second; one that is not ready (loading, paused) is waited for a
/// while, saying so on stderr, then an error naming it (requests have no timeout of their own).
boost::asio::awaitable<void> check_reachable(redis::connection& conn, const std::string& url);
/// Runs `ctx` on `threads` threads, this one among them, until it runs out of work or is
/// stopped. An exception that escapes a handler on any thread stops it on all (a thread of its
/// own that it left would end the process); the first one is rethrown once every thread is back.
void run_threads(boost::asio::io_context& ctx, std::size_t threads);

int demo(const args& a);
int worker_command(const args& a);
int enqueue_command(const args& a);
int stats(const args& a);
int check(const args& a);
int dlq(const args& a);
int group(const args& a);
int queue(const args& a);
/// Hidden: a worker process of `jobrt demo --redis` (not in the usage).
int demo_worker(const args& a);

}  // namespace jobrt::cli
