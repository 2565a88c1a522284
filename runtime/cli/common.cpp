// The jobrt command: what its commands share (option helpers, reaching the server, threads).
#include "cli.hpp"

#include <jobrt/backend.hpp>
#include <jobrt/redis/cluster.hpp>
#include <jobrt/redis/config.hpp>
#include <jobrt/redis/request.hpp>

#include <fmt/format.h>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace jobrt::cli {

CLI::Option* number_option(CLI::App& cmd, const std::string& names, std::size_t& value, std::size_t min,
                           std::size_t max, const std::string& what) {
  auto check = [min, max](std::string& text) -> std::string {
    std::size_t n = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
    if (ec != std::errc{} || end != text.data() + text.size() || n < min || n > max)
      return fmt::format("'{}' is not a number from {} to {}", text, min, max);
    return {};
  };
  return cmd.add_option(names, value, what)->check(CLI::Validator(check, ""))->option_text("N");
}

CLI::Validator not_empty(const std::string& what) {
  auto check = [what](std::string& text) -> std::string { return text.empty() ? what + " is empty" : ""; };
  return CLI::Validator(check, "");
}

CLI::Validator queue_name() {
  auto check = [](std::string& text) -> std::string {
    try {
      check_queue_name(text);
      return {};
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
  };
  return CLI::Validator(check, "");
}

CLI::Option* redis_option(CLI::App& cmd, std::string& url, const std::string& what, bool env) {
  auto check = [](std::string& text) -> std::string {
    try {
      check_redis_url(text);
      return {};
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
  };
  auto* option = cmd.add_option("-u,--redis", url, what)->check(CLI::Validator(check, ""))->option_text("URL");
  return env ? option->envname("REDIS_URL") : option;
}

CLI::Option* durability_option(CLI::App& cmd, std::string& durability) {
  return cmd
      .add_option("--durability", durability,
                  "when an enqueue and a finish return: once the primary has them (primary, the\n"
                  "default), or a replica too (replicated: WAIT 1, at most 1 s, else an error)")
      ->check(CLI::IsMember({"primary", "replicated"}))
      ->option_text("primary|replicated");
}

std::istream& open_input(const std::string& path, std::ifstream& file, std::string_view command) {
  if (path == "-") return std::cin;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw std::runtime_error(fmt::format("{}: {} is a directory, not a file", command, path));
  file.open(path);
  if (!file) throw std::runtime_error(fmt::format("{}: cannot open {}", command, path));
  return file;
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

boost::asio::awaitable<ping_result> ping_seeds(redis::connection& conn, const std::string& url,
                                               std::chrono::milliseconds limit) {
  auto r = co_await ping_within(conn, limit);
  auto seeds = seeds_of(url);
  bool all_final = final_failure(r.failure);
  for (std::size_t i = 1; i < seeds.size() && !r.answered; ++i) {
    redis::connection other(conn.get_executor(), seeds[i]);
    other.start();
    auto o = co_await ping_within(other, limit);
    other.close();
    if (o.answered) co_return o;
    all_final = all_final && final_failure(o.failure);
    r.why += "; " + o.why;
  }
  if (!all_final) r.failure = redis::connect_failure::none;  // (one of them may come up yet)
  co_return r;
}

bool final_failure(redis::connect_failure f) {
  using redis::connect_failure;
  return f == connect_failure::unresolved || f == connect_failure::refused || f == connect_failure::denied;
}

std::vector<redis::config> seeds_of(const std::string& url) { return redis::cluster_seeds(url); }

void check_redis_url(const std::string& url) {
  auto seeds = redis::cluster_seeds(url);
  // The files a rediss:// URL names are read at each connect: one that cannot be read when the
  // command starts is refused, by name, rather than failing every attempt. (Every seed has the
  // same parameters.)
  const auto& c = seeds.front();
  for (auto [what, path] :
       {std::pair{"CA", &c.tls_ca_file}, {"certificate", &c.tls_cert_file}, {"key", &c.tls_key_file}})
    if (!path->empty() && ::access(path->c_str(), R_OK) != 0)
      throw std::invalid_argument(
          fmt::format("the {} file '{}' cannot be read: {}", what, *path, std::strerror(errno)));
}

std::string address_of(const std::string& url) {
  std::string out;
  for (const auto& s : seeds_of(url)) out += (out.empty() ? "" : ",") + s.address();
  return out;
}

boost::asio::awaitable<void> check_reachable(redis::connection& conn, const std::string& url) {
  // A first look, short: a refused port or password fails its first attempt to connect at once.
  // Only a server that is there and not ready yet is worth the longer wait.
  constexpr std::chrono::milliseconds first_look{1000}, whole_wait{10000};
  auto r = co_await ping_seeds(conn, url, first_look);
  if (r.answered) co_return;
  if (final_failure(r.failure)) throw std::runtime_error(r.why);  // it names the address, without password
  auto address = address_of(url);
  fmt::print(stderr, "jobrt: redis at {} is not ready ({}); waiting up to {} s\n", address, r.why,
             std::chrono::duration_cast<std::chrono::seconds>(whole_wait).count());
  r = co_await ping_seeds(conn, url, whole_wait - first_look);
  if (!r.answered) throw std::runtime_error(fmt::format("redis at {} does not answer: {}", address, r.why));
}

const char* signal_name(int signal) { return signal == SIGINT ? "SIGINT" : "SIGTERM"; }

boost::asio::awaitable<void> stop_workers(std::vector<std::unique_ptr<worker>>& workers,
                                          std::chrono::milliseconds grace) {
  namespace asio = boost::asio;
  if (workers.empty()) co_return;
  // (A caller cancelled already would have the spawn below throw before any stop began.)
  bool throws = co_await asio::this_coro::throw_if_cancelled();
  co_await asio::this_coro::throw_if_cancelled(false);
  // On a strand: a ranged parallel_group reads its operations while it launches them, and on an
  // executor of several threads a stop that ended at once could free them under it. Launched
  // from the strand, the stops' ends wait for the launch.
  auto strand = asio::make_strand(co_await asio::this_coro::executor);
  auto all = [&]() -> asio::awaitable<void> {
    using stop_op = decltype(asio::co_spawn(strand, workers.front()->stop(grace), asio::deferred));
    std::vector<stop_op> ops;
    ops.reserve(workers.size());
    for (auto& w : workers) ops.push_back(asio::co_spawn(strand, w->stop(grace), asio::deferred));
    co_await asio::experimental::make_parallel_group(std::move(ops))
        .async_wait(asio::experimental::wait_for_all(), asio::use_awaitable);
  };
  // Bound to no cancellation slot: the caller's cancellation must not cut a stop short.
  co_await asio::co_spawn(strand, all(), asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable));
  co_await asio::this_coro::throw_if_cancelled(throws);
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

namespace {
std::vector<std::string>& command_line() {
  static std::vector<std::string> words;
  return words;
}
}  // namespace

void remember_command_line(int argc, char** argv) { command_line().assign(argv + 1, argv + argc); }

bool given_on_command_line(const CLI::Option* option) {
  if (option->count() == 0) return false;
  for (const auto& word : command_line()) {
    if (word == "--") return false;  // arguments only from here on
    for (const auto& name : option->get_lnames())
      if (word == "--" + name || word.starts_with("--" + name + "=")) return true;
    for (const auto& name : option->get_snames())
      if (word.starts_with("-" + name)) return true;
  }
  return false;
}

std::string default_redis_url() {
  const char* url = std::getenv("REDIS_URL");
  return url && *url ? url : "redis://127.0.0.1:6379";
}

}  // namespace jobrt::cli
