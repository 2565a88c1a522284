// The jobrt command: shared pieces of its subcommands.
#pragma once

#include <jobrt/redis/connection.hpp>
#include <jobrt/worker.hpp>

#include <CLI/CLI.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <cstddef>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace jobrt::cli {

using args = std::vector<std::string>;

/// Wrong use of the command line found after parsing (options that do not go together):
/// printed with a pointer to the command's help, exit code 2.
class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The work of the command that the command line chose: its exit code.
using action = std::function<int()>;

// Each adds its commands to `jobrt`; when the command line chooses one of them, `chosen`
// becomes its work (run once the whole line parsed).
void add_worker(CLI::App& jobrt, action& chosen);
void add_enqueue(CLI::App& jobrt, action& chosen);
void add_admin(CLI::App& jobrt, action& chosen);  // stats, check, dlq, group, schedule, queue
void add_demo(CLI::App& jobrt, action& chosen);   // demo, and the hidden demo-worker
void add_dashboard(CLI::App& jobrt, action& chosen);
void add_bridge(CLI::App& jobrt, action& chosen);  // bridge: a Redis Stream into a queue

/// Adds command `name` to `parent`: chosen on the command line, `run` becomes the work.
template <class Run>
CLI::App* add_command(CLI::App& parent, action& chosen, const std::string& name, const std::string& summary, Run run) {
  auto* cmd = parent.add_subcommand(name, summary)->group("commands");
  cmd->set_help_flag("-h,--help", "print this help");  // in the group "options", as the parent's
  cmd->footer("");                                     // not the parent's
  // Called once this command's part of the line is parsed. With it, CLI11 reads this command's
  // environment variables and checks its options only when the line chose it.
  cmd->parse_complete_callback([&chosen, run] { chosen = run; });
  return cmd;
}

// Options as every command spells them (README.md, "The command line").
/// A whole number from min to max; the error names the range.
CLI::Option* number_option(CLI::App& cmd, const std::string& names, std::size_t& value, std::size_t min,
                           std::size_t max, const std::string& what);
/// Refuses an empty text: "<what> is empty".
CLI::Validator not_empty(const std::string& what);
/// Refuses what cannot name a queue (check_queue_name).
CLI::Validator queue_name();
/// -u/--redis URL: checked as a Redis URL (an error names what is wrong, never the password);
/// $REDIS_URL stands in for it unless `env` is false.
CLI::Option* redis_option(CLI::App& cmd, std::string& url, const std::string& what, bool env = true);
/// One of some words (a policy, a log level): `parse` checks it, throwing std::invalid_argument
/// that names the words it knows.
template <class Parse>
CLI::Option* word_option(CLI::App& cmd, const std::string& names, std::string& value, const std::string& what,
                         Parse parse) {
  auto check = [parse](std::string& text) -> std::string {
    try {
      parse(text);
      return {};
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
  };
  return cmd.add_option(names, value, what)->check(CLI::Validator(check, ""))->option_text("WORD");
}
/// Standard input for "-", else the file at `path` opened into `file`; a directory or an
/// unreadable path is an error naming it.
std::istream& open_input(const std::string& path, std::ifstream& file, std::string_view command);

/// The default server: $REDIS_URL, else redis://127.0.0.1:6379.
std::string default_redis_url();
/// Keeps the command line, for given_on_command_line.
void remember_command_line(int argc, char** argv);
/// Whether the command line itself gave the option (not its environment variable).
bool given_on_command_line(const CLI::Option* option);
/// What a PING with a time limit found: answered, or why not (the connection's account).
struct ping_result {
  bool answered = false;
  redis::connect_failure failure = redis::connect_failure::none;
  std::string why;
};
boost::asio::awaitable<ping_result> ping_within(redis::connection& conn, std::chrono::milliseconds limit);
/// The same for a --redis URL that may name several seeds: `conn` is the first one's; when it
/// does not answer, each other seed is asked in turn over a connection of its own (each within
/// `limit`). Answered when one answers; the failure is final only when every seed's is.
boost::asio::awaitable<ping_result> ping_seeds(redis::connection& conn, const std::string& url,
                                               std::chrono::milliseconds limit);
/// Whether a failure to connect is final: waiting for the server would not change it.
bool final_failure(redis::connect_failure f);
/// A PING before a command's work. A server that cannot be reached (final_failure) is an error
/// naming it within about a second; one that is not ready (loading, paused) is waited for a
/// while, saying so on stderr, then an error naming it (requests have no timeout of their own).
boost::asio::awaitable<void> check_reachable(redis::connection& conn, const std::string& url);
/// --durability primary|replicated (redis_backend_options::durability).
CLI::Option* durability_option(CLI::App& cmd, std::string& durability);
/// The servers a --redis URL names (several for a Redis Cluster's seeds: redis://h1:p1,h2:p2).
std::vector<redis::config> seeds_of(const std::string& url);
/// Throws std::invalid_argument for a URL that does not parse, or that names a TLS file (ca,
/// cert, key) that cannot be read now: for a URL as a command receives it, not at each use.
void check_redis_url(const std::string& url);
/// Their addresses, for messages: host:port[,host:port...] (never a password).
std::string address_of(const std::string& url);
/// Runs `ctx` on `threads` threads, this one among them, until it runs out of work or is
/// stopped. An exception that escapes a handler on any thread stops it on all (a thread of its
/// own that it left would end the process); the first one is rethrown once every thread is back.
void run_threads(boost::asio::io_context& ctx, std::size_t threads);
/// "SIGINT" or "SIGTERM", the signals the long-running commands stop on.
const char* signal_name(int signal);
/// Stops all of `workers` at once, each with `grace`, and waits for every one. The caller's
/// cancellation does not cut it short (a worker would be left half stopped): to force a stop
/// under way, stop them again with no grace.
boost::asio::awaitable<void> stop_workers(std::vector<std::unique_ptr<worker>>& workers,
                                          std::chrono::milliseconds grace);

}  // namespace jobrt::cli
