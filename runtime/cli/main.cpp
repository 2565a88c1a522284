// The jobrt command.
#include "cli.hpp"

#include <jobrt/metrics.hpp>
#include <jobrt/redis/config.hpp>
#include <jobrt/redis/request.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <cstdlib>
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

CLI::Option* name_option(CLI::App& cmd, const std::string& names, std::string& value, const std::string& what) {
  return cmd.add_option(names, value, what)->check(not_empty("the name"))->option_text("NAME");
}

CLI::Option* redis_option(CLI::App& cmd, std::string& url, const std::string& what) {
  auto check = [](std::string& text) -> std::string {
    try {
      redis::config::from_url(text);
      return {};
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
  };
  return cmd.add_option("-u,--redis", url, what)->check(CLI::Validator(check, ""))->option_text("URL");
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

}  // namespace jobrt::cli

namespace {

// Help as jobrt prints it: "usage:" first, then what the command does, its arguments and
// options (with the environment variable that stands in for an option), its commands, and
// the longer notes of its footer.
class help_format : public CLI::Formatter {
 public:
  help_format() {
    column_width(30);
    label("Usage", "usage");
    label("OPTIONS", "options");
    label("SUBCOMMAND", "COMMAND");
    label("Positionals", "arguments");
  }
  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
    if (mode == CLI::AppFormatMode::Sub) return make_expanded(app);
    auto notes = make_footer(app);
    auto part = [](std::string text) { return text.empty() ? text : "\n" + text; };
    return make_usage(app, name) + make_description(app) + part(make_positionals(app)) + part(make_groups(app, mode)) +
           make_subcommands(app, mode) + part(notes);
  }
  std::string make_group(std::string group, bool positional, std::vector<const CLI::Option*> opts) const override {
    auto out = CLI::Formatter::make_group(std::move(group), positional, std::move(opts));
    return out.starts_with("\n") ? out.substr(1) : out;  // one blank line between parts, not two
  }
  std::string make_description(const CLI::App* app) const override {
    auto text = app->get_description();
    return text.empty() ? text : text + "\n";
  }
  std::string make_option_opts(const CLI::Option* opt) const override {
    return opt->get_option_text().empty() ? "" : " " + opt->get_option_text();
  }
  std::string make_option_desc(const CLI::Option* opt) const override {
    auto env = opt->get_envname();
    return opt->get_description() + (env.empty() ? "" : " [$" + env + "]");
  }
};

// The command the line chose, as far as it got: the last of them.
CLI::App* chosen_command(CLI::App& app) {
  auto* at = &app;
  while (!at->get_subcommands().empty()) at = at->get_subcommands().front();
  return at;
}

// Its names: "dlq list".
std::string chosen_path(CLI::App& app) {
  std::string path;
  for (auto* at = chosen_command(app); at->get_parent() != nullptr; at = at->get_parent())
    path = at->get_name() + (path.empty() ? "" : " " + path);
  return path;
}

// What a command with commands of its own says when none of them was given (or a wrong one):
// "say list, show, requeue or purge" or "unknown command 'frob'".
std::string no_command(CLI::App& app, int argc, char** argv) {
  auto* at = chosen_command(app);
  std::vector<std::string> names;
  for (auto* sub : at->get_subcommands([](const CLI::App* s) { return !s->get_group().empty(); }))
    names.push_back(sub->get_name());
  auto say = fmt::format("say {}", fmt::join(names, ", "));
  if (names.size() > 1) {
    auto last = say.rfind(", ");
    say.replace(last, 2, " or ");
  }
  for (int i = 1; i + 1 < argc; ++i)  // the word after this command's name
    if (argv[i] == at->get_name() && argv[i + 1][0] != '-')
      return fmt::format("unknown command '{}'; {}", argv[i + 1], say);
  return say;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace jobrt::cli;
  CLI::App app("Runs jobs from Redis queues: workers, producers and operators' tools.", "jobrt");
  app.formatter(std::make_shared<help_format>());
  app.footer(
      "Each command takes --help. The server is --redis URL, else $REDIS_URL, else\n"
      "redis://127.0.0.1:6379. Options take their value as --opt VALUE or --opt=VALUE.");
  app.option_defaults()->group("options");  // commands made from here on take these defaults
  app.set_help_flag("-h,--help", "print this help");
  bool version_flag = false;
  app.add_flag("--version", version_flag, "print the version");
  action chosen;
  add_worker(app, chosen);
  add_enqueue(app, chosen);
  add_admin(app, chosen);
  add_demo(app, chosen);
  bool version_json = false;
  auto* version = add_command(app, chosen, "version", "print the version", [&] {
    if (version_json)
      fmt::print("{{\"version\":\"{}\"}}\n", jobrt::version());
    else
      fmt::print("jobrt {}\n", jobrt::version());
    return 0;
  });
  version->add_flag("--json", version_json, "as JSON: {\"version\": ...}");
  app.require_subcommand(argc == 2 && std::string_view(argv[1]) == "--version" ? 0 : 1);
  auto named = [&](CLI::App& parent, std::string_view word) {
    return !parent.get_subcommands([&](const CLI::App* sub) { return sub->get_name() == word; }).empty();
  };
  if (argc >= 2 && argv[1][0] != '-' && !named(app, argv[1])) {
    fmt::print(stderr, "jobrt: unknown command '{}'\n{}", argv[1], app.help());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    auto path = chosen_path(app);
    std::string what = e.what();
    if (dynamic_cast<const CLI::ExtrasError*>(&e)) {  // in jobrt's words, naming the first
      auto extra = what.substr(what.find(": ") + 2);  // listed last to first
      extra = extra.substr(extra.rfind(' ') + 1);
      what = fmt::format("{} '{}'", extra.starts_with("-") ? "unknown option" : "unexpected argument", extra);
    }
    if (what == "A subcommand is required") what = no_command(app, argc, argv);
    if (path.empty() && argc < 2) {  // no command at all: the list of them
      fmt::print(stderr, "{}", app.help());
      return 2;
    }
    if (path == "demo-worker") path = "demo";  // started by jobrt demo; it has no help of its own
    fmt::print(stderr, "jobrt: {}{}\n(see jobrt {}--help)\n", path.empty() ? "" : path + ": ", what,
               path.empty() ? "" : path + " ");
    return 2;
  }
  if (version_flag) {
    fmt::print("jobrt {}\n", jobrt::version());
    return 0;
  }
  try {
    return chosen();
  } catch (const usage_error& e) {
    auto path = chosen_path(app);
    if (path == "demo-worker") path = "demo";
    fmt::print(stderr, "jobrt: {}\n(see jobrt {} --help)\n", e.what(), path);
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "jobrt: {}\n", e.what());
    return 1;
  }
}
