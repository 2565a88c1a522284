// The jobrt command.
#include "cli.hpp"

#include <jobrt/metrics.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <exception>
#include <string>
#include <string_view>
#include <vector>

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
  // Commands made from here on take these defaults; an option given twice: the last wins.
  app.option_defaults()->group("options")->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_help_flag("-h,--help", "print this help");
  bool version_flag = false;
  app.add_flag("--version", version_flag, "print the version");
  action chosen;
  add_worker(app, chosen);
  add_enqueue(app, chosen);
  add_admin(app, chosen);
  add_demo(app, chosen);
  add_dashboard(app, chosen);
  add_bridge(app, chosen);
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
  if (argc == 2 && std::string_view(argv[1]) == "help") {  // as --help
    fmt::print("{}", app.help());
    return 0;
  }
  if (argc >= 2 && argv[1][0] != '-' && !named(app, argv[1])) {
    fmt::print(stderr, "jobrt: unknown command '{}'\n{}", argv[1], app.help());
    return 2;
  }
  remember_command_line(argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    auto path = chosen_path(app);
    std::string what = e.what();
    if (dynamic_cast<const CLI::ExtrasError*>(&e)) {  // in jobrt's words, naming the first
      auto extra = what.substr(what.find(": ") + 2);  // listed last to first
      while (extra.ends_with(" --")) extra.resize(extra.size() - 3);
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
