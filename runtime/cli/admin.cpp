// Operators' commands: stats, check, dlq, group.
#include "cli.hpp"

#include <jobrt/job.hpp>
#include <jobrt/redis_backend.hpp>

#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/serialize.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>

namespace jobrt::cli {
namespace {

namespace asio = boost::asio;
namespace json = boost::json;

// What every operator command takes: the server, the queue, --json; the rest are positionals
// and the command's own flags.
struct common {
  std::string url = default_redis_url();
  std::string queue = "default";
  bool json = false;
  bool help = false;
  std::vector<std::string> positional;
  std::set<std::string> flags;                 // seen flags without values
  std::map<std::string, std::size_t> numbers;  // seen numeric options
  std::map<std::string, std::string> strings;  // seen options with a text value
};

common parse(const args& a, std::string_view command, const std::set<std::string>& flags,
             const std::set<std::string>& numbers, const std::set<std::string>& strings = {}) {
  common c;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto& arg = a[i];
    if (arg == "--help" || arg == "-h")
      c.help = true;
    else if (arg == "--redis")
      c.url = string_arg(a, i);
    else if (arg == "--queue") {
      c.queue = string_arg(a, i);
      if (c.queue.empty()) throw usage_error(fmt::format("{}: --queue is empty", command));
    } else if (arg == "--json")
      c.json = true;
    else if (flags.contains(arg))
      c.flags.insert(arg);
    else if (numbers.contains(arg))
      c.numbers[arg] = number_arg(a, i);
    else if (strings.contains(arg))
      c.strings[arg] = string_arg(a, i);
    else if (arg.starts_with("--"))
      throw usage_error(fmt::format("{}: unknown option '{}'", command, arg));
    else
      c.positional.push_back(arg);
  }
  check_url(c.url);
  return c;
}

// Whether anything was ever enqueued to the queue (or is in it: a job written by hand).
bool known(const queue_counts& q) {
  return q.enqueued > 0 || q.dead > 0 || q.ready_lanes > 0 || q.running > 0 || q.delayed > 0 || q.paused > 0 ||
         q.groups > 0;
}

enum class queue_must { exist, may_be_new };

// Runs body against the server, once it answers, on a queue that exists: a name with a typo
// is an error naming it, not a report of zeros.
template <class Body>
void with_store(const common& c, Body body, queue_must must = queue_must::exist) {
  asio::io_context ctx(1);
  redis_backend store(ctx.get_executor(), redis::config::from_url(c.url));
  std::exception_ptr failure;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        co_await check_reachable(store.connection(), c.url);
        if (must == queue_must::exist && !known(co_await store.counts(c.queue)))
          throw std::runtime_error(
              fmt::format("queue '{}' is unknown at {}: nothing was ever enqueued to it", c.queue, c.url));
        co_await body(store);
      },
      [&](std::exception_ptr e) {
        failure = e;
        ctx.stop();
      });
  ctx.run();
  if (failure) std::rethrow_exception(failure);
}

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

json::object to_json(const queue_counts& q) {
  return {{"ready_lanes", q.ready_lanes}, {"running", q.running},     {"delayed", q.delayed},
          {"groups", q.groups},           {"paused", q.paused},       {"dead", q.dead},
          {"enqueued", q.enqueued},       {"started", q.started},     {"completed", q.completed},
          {"failed", q.failed},           {"retried", q.retried},     {"deferred", q.deferred},
          {"halted", q.halted},           {"recovered", q.recovered}, {"unhandled", q.unhandled}};
}

// How long ago a time (ms since the epoch) was, in the one unit list and show both use.
std::string age(std::int64_t at_ms) {
  if (at_ms <= 0) return "unknown";
  return fmt::format("{:.1f} s ago", static_cast<double>(now_ms() - at_ms) / 1000.0);
}

// A dead letter's job, decoded; nullopt for a record that does not decode (written by another
// program): it is shown as it is stored.
std::optional<job> job_of(const dead_letter& d) {
  try {
    return decode_job(d.record, d.group);
  } catch (const std::runtime_error&) {
    return std::nullopt;
  }
}

json::object to_json(const dead_letter& d) {
  json::object o{{"id", d.id}, {"group", d.group}};
  if (auto j = job_of(d)) {
    o["type"] = j->type;
    o["payload"] = j->payload;
    o["max_attempts"] = j->max_attempts;
    o["enqueued_at_ms"] = j->enqueued_at_ms;
  } else {
    o["record"] = d.record;
  }
  o["runs"] = d.runs;
  o["error"] = d.error;
  o["at_ms"] = d.at_ms;
  return o;
}

// Which dead letters `dlq requeue` and `dlq purge` take without ids: all (--all), or those that
// match every filter given.
struct letter_filter {
  std::optional<std::string> group, type, error;

  bool matches(const dead_letter& d) const {
    if (group && d.group != *group) return false;
    if (error && d.error.find(*error) == std::string::npos) return false;
    if (type) {
      auto j = job_of(d);
      if (!j || j->type != *type) return false;
    }
    return true;
  }
};

// The keys of the matching dead letters, read page by page. They are all read before any is
// requeued or purged: those calls remove letters, which would shift the pages still to read.
asio::awaitable<std::vector<std::string>> matching_letters(redis_backend& store, const std::string& queue,
                                                           const letter_filter& filter) {
  constexpr std::size_t page = 500;
  std::vector<std::string> ids;
  for (std::size_t offset = 0;; offset += page) {
    auto letters = co_await store.dead_letters(queue, offset, page);
    for (auto& d : letters)
      if (filter.matches(d)) ids.push_back(d.id);
    if (letters.size() < page) break;
  }
  co_return ids;
}

// Requeue and purge take this many keys a call: one script call each, short enough not to keep
// Redis busy for long.
constexpr std::size_t keys_per_call = 500;

}  // namespace

int stats(const args& a) {
  auto c = parse(a, "stats", {}, {"--watch"});
  if (c.help) {
    fmt::print(
        "usage: jobrt stats [--redis URL] [--queue NAME] [--json] [--watch SECONDS]\n"
        "A queue's counts (ready lanes, running, delayed, paused groups, dead letters) and counters\n"
        "(enqueued, started, completed, failed, retried, deferred, halted, recovered, and unhandled:\n"
        "jobs handed back by a worker with no handler for their type). --watch prints\n"
        "them again every SECONDS, with the completion rate since the last report (jobs/s; in JSON\n"
        "\"completed_per_s\"), until interrupted. The queue has drained (nothing pending, delayed or\n"
        "running) when ready_lanes, running, delayed and groups are all 0; paused groups keep their\n"
        "jobs (groups stays above 0) until resumed.\n");
    return 0;
  }
  no_more(c.positional, 0, "stats");
  auto watch = c.numbers.contains("--watch") ? c.numbers["--watch"] : 0;
  with_store(c, [&](redis_backend& store) -> asio::awaitable<void> {
    std::int64_t last_completed = -1;
    asio::steady_timer timer(co_await asio::this_coro::executor);
    for (;;) {
      auto q = co_await store.counts(c.queue);
      // The completion rate since the last report (so from the second on).
      std::optional<double> rate;
      if (last_completed >= 0) rate = static_cast<double>(q.completed - last_completed) / static_cast<double>(watch);
      if (c.json) {
        auto o = to_json(q);
        o["queue"] = c.queue;
        if (rate) o["completed_per_s"] = *rate;
        fmt::print("{}\n", json::serialize(o));
      } else {
        fmt::print(
            "queue {}: {} ready lanes, {} running, {} delayed, {} groups with jobs, {} paused groups, {} dead | "
            "enqueued {}, started {}, "
            "completed {}, failed {}, retried {}, deferred {}, halted {}, recovered {}, unhandled {}",
            c.queue, q.ready_lanes, q.running, q.delayed, q.groups, q.paused, q.dead, q.enqueued, q.started,
            q.completed, q.failed, q.retried, q.deferred, q.halted, q.recovered, q.unhandled);
        if (rate) fmt::print(" | {:.0f} jobs/s", *rate);
        fmt::print("\n");
      }
      if (watch == 0) break;
      std::fflush(stdout);
      last_completed = q.completed;
      timer.expires_after(std::chrono::seconds(watch));
      co_await timer.async_wait(asio::use_awaitable);
    }
  });
  return 0;
}

int check(const args& a) {
  auto c = parse(a, "check", {"--repair"}, {});
  if (c.help) {
    fmt::print(
        "usage: jobrt check [--redis URL] [--queue NAME] [--repair] [--json]\n"
        "Verifies the queue's invariants: every group with jobs has exactly one lane, lease or\n"
        "parked lane; no lane names a group without jobs; no id is taken without a pending job; no\n"
        "job is in two places; no dead worker holds lanes. Reads the queue in small steps (pages of\n"
        "at most 1,000 entries), so workers and other clients carry on meanwhile; what it suspects\n"
        "is confirmed by one short atomic call each before it is reported. On a queue that workers\n"
        "change meanwhile, the counts are as the walk saw them. --repair fixes what it confirms.\n"
        "Exit code 1 when problems were found and not repaired.\n");
    return 0;
  }
  no_more(c.positional, 1, "check");
  if (!c.positional.empty()) c.queue = c.positional.front();  // `jobrt check QUEUE`
  if (c.queue.empty()) throw usage_error("check: the queue's name is empty");
  bool repair = c.flags.contains("--repair");
  check_report r;
  with_store(c, [&](redis_backend& store) -> asio::awaitable<void> { r = co_await store.check(c.queue, repair); });
  auto oldest_age = r.oldest_enqueued_ms > 0 ? now_ms() - r.oldest_enqueued_ms : 0;
  if (c.json) {
    json::array problems;
    for (auto& p : r.problems) problems.emplace_back(p);
    json::object o{{"queue", c.queue},
                   {"groups", r.groups},
                   {"jobs", r.jobs},
                   {"stuck_groups", r.stuck_groups},
                   {"oldest_job_age_ms", oldest_age},
                   {"repaired", r.repaired},
                   {"calls", r.calls},
                   {"problems", problems}};
    fmt::print("{}\n", json::serialize(o));
  } else {
    fmt::print(
        "queue {}: {} groups with jobs, {} jobs, {} stuck groups, oldest job {} ms old ({} calls to the server)\n",
        c.queue, r.groups, r.jobs, r.stuck_groups, oldest_age, r.calls);
    for (auto& p : r.problems) fmt::print("  problem: {}\n", p);
    if (r.problems.empty()) fmt::print("  no problems\n");
    if (repair) fmt::print("  repaired {}\n", r.repaired);
  }
  return r.problems.empty() || repair ? 0 : 1;
}

int dlq(const args& a) {
  auto c = parse(a, "dlq", {"--head", "--all"}, {"--offset", "--limit"}, {"--group", "--type", "--error"});
  constexpr const char* usage =
      "usage: jobrt dlq list [--offset N] [--limit N]   oldest first (default limit 100)\n"
      "       jobrt dlq show ID\n"
      "       jobrt dlq requeue ID... [--head]          back to their group's tail (--head: next)\n"
      "       jobrt dlq requeue SELECTION [--head]\n"
      "       jobrt dlq purge ID... | SELECTION\n"
      "each with [--redis URL] [--queue NAME] [--json]\n"
      "SELECTION is --all (every dead letter), or filters that a dead letter must all match:\n"
      "  --group G       its group is G\n"
      "  --type T        its job's type is T\n"
      "  --error TEXT    its error contains TEXT\n"
      "With --json, list prints one JSON object per line and show one object, each with: id, group, type,\n"
      "payload, max_attempts, enqueued_at_ms, runs, error and at_ms (when it failed; times in ms\n"
      "since the epoch). Ages are in seconds.\n";
  if (c.help) {
    fmt::print("{}", usage);
    return 0;
  }
  if (c.positional.empty()) throw usage_error("dlq: say list, show, requeue or purge");
  auto verb = c.positional.front();
  std::vector<std::string> ids(c.positional.begin() + 1, c.positional.end());
  letter_filter filter;
  const std::pair<const char*, std::optional<std::string>*> filters[] = {
      {"--group", &filter.group}, {"--type", &filter.type}, {"--error", &filter.error}};
  for (auto [name, field] : filters) {
    auto it = c.strings.find(name);
    if (it == c.strings.end()) continue;
    if (it->second.empty()) throw usage_error(fmt::format("dlq {}: {} is empty", verb, name));
    *field = it->second;
  }
  bool filtered = filter.group || filter.type || filter.error;
  bool selection = filtered || c.flags.contains("--all");
  if (c.flags.contains("--head") && verb != "requeue") throw usage_error(fmt::format("dlq {}: no --head", verb));
  if (selection && verb != "requeue" && verb != "purge")
    throw usage_error(fmt::format("dlq {}: --all, --group, --type and --error are requeue's and purge's", verb));
  if ((c.numbers.contains("--offset") || c.numbers.contains("--limit")) && verb != "list")
    throw usage_error(fmt::format("dlq {}: --offset and --limit are list's", verb));
  if ((verb == "requeue" || verb == "purge") && ids.empty() == !selection)
    throw usage_error(fmt::format("dlq {}: give the ids, or --all, or filters (--group, --type, --error)", verb));
  int rc = 0;
  if (verb == "list") {
    no_more(c.positional, 1, "dlq list");
    auto offset = c.numbers.contains("--offset") ? c.numbers["--offset"] : 0;
    auto limit = c.numbers.contains("--limit") ? c.numbers["--limit"] : 100;
    with_store(c, [&](redis_backend& store) -> asio::awaitable<void> {
      auto letters = co_await store.dead_letters(c.queue, offset, limit);
      for (auto& d : letters) {
        if (c.json)
          fmt::print("{}\n", json::serialize(to_json(d)));
        else
          fmt::print("{}  group {}  {}  {}\n", d.id, d.group.empty() ? "-" : d.group, age(d.at_ms), d.error);
      }
    });
  } else if (verb == "show") {
    if (ids.size() != 1) throw usage_error("dlq show: give one id");
    with_store(c, [&](redis_backend& store) -> asio::awaitable<void> {
      auto d = co_await store.dead_letter_of(c.queue, ids[0]);
      if (!d) {
        fmt::print(stderr, "jobrt: dlq show: no dead letter {} in queue {}\n", ids[0], c.queue);
        rc = 1;
        co_return;
      }
      if (c.json) {
        fmt::print("{}\n", json::serialize(to_json(*d)));
        co_return;
      }
      fmt::print("id {}\ngroup {}\n", d->id, d->group.empty() ? "-" : d->group);
      if (auto j = job_of(*d))
        fmt::print("type {}\npayload {}\nmax attempts {}\nenqueued {}\n", j->type, json::serialize(j->payload),
                   j->max_attempts, age(j->enqueued_at_ms));
      else
        fmt::print("record {}\n", d->record);
      fmt::print("runs {}\nfailed {}\nerror {}\n", d->runs, age(d->at_ms), d->error);
    });
  } else if (verb == "requeue") {
    bool head = c.flags.contains("--head");
    with_store(c, [&](redis_backend& store) -> asio::awaitable<void> {
      if (selection) ids = co_await matching_letters(store, c.queue, filter);
      // In calls of keys_per_call. --head puts each call's letters in front of those already
      // requeued: the last call goes first so that the letters keep their order.
      std::vector<std::vector<std::string>> calls;
      for (std::size_t i = 0; i < ids.size(); i += keys_per_call)
        calls.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(i),
                           ids.begin() + static_cast<std::ptrdiff_t>(std::min(ids.size(), i + keys_per_call)));
      if (head) std::reverse(calls.begin(), calls.end());
      std::set<std::string> requeued;
      for (auto& call : calls)
        for (auto& id : co_await store.requeue(c.queue, call, head)) requeued.insert(id);
      fmt::print("requeued {} of {}\n", requeued.size(), ids.size());
      for (auto& id : ids) {
        if (requeued.contains(id)) continue;
        fmt::print(
            stderr,
            "jobrt: dlq requeue: {} not requeued: no such dead letter in queue {}, or a pending job has its id\n", id,
            c.queue);
        rc = 1;
      }
    });
  } else if (verb == "purge") {
    with_store(c, [&](redis_backend& store) -> asio::awaitable<void> {
      if (selection && !filtered) {  // --all: one call (purge takes no ids as every one)
        fmt::print("purged {}\n", co_await store.purge(c.queue, {}));
        co_return;
      }
      std::vector<std::string> missing;  // named, as show and requeue name theirs
      if (selection)
        ids = co_await matching_letters(store, c.queue, filter);
      else
        for (auto& id : ids)
          if (!co_await store.dead_letter_of(c.queue, id)) missing.push_back(id);
      std::int64_t purged = 0;
      // Never an empty call: that would purge every dead letter.
      for (std::size_t i = 0; i < ids.size(); i += keys_per_call)
        purged += co_await store.purge(
            c.queue, std::vector<std::string>(
                         ids.begin() + static_cast<std::ptrdiff_t>(i),
                         ids.begin() + static_cast<std::ptrdiff_t>(std::min(ids.size(), i + keys_per_call))));
      fmt::print("purged {}\n", purged);
      for (auto& id : missing) fmt::print(stderr, "jobrt: dlq purge: no dead letter {} in queue {}\n", id, c.queue);
      if (!missing.empty()) rc = 1;
    });
  } else {
    throw usage_error(fmt::format("dlq: unknown subcommand '{}'", verb));
  }
  return rc;
}

int group(const args& a) {
  auto c = parse(a, "group", {"--skip", "--force"}, {});
  if (c.help) {
    fmt::print(
        "usage: jobrt group show                 paused and halted groups\n"
        "       jobrt group pause GROUP [--force]  nothing more of it starts (its running job\n"
        "                                        finishes); a group with no jobs (a typo?) is an\n"
        "                                        error unless --force, which pauses it ahead of them\n"
        "       jobrt group resume GROUP [--skip]  goes on; --skip dead-letters its head job first;\n"
        "                                        a group that is not paused is an error\n"
        "each with [--redis URL] [--queue NAME] [--json]. An unknown queue is an error (exit 1).\n");
    return 0;
  }
  if (c.positional.empty()) throw usage_error("group: say show, pause or resume");
  auto verb = c.positional.front();
  int rc = 0;
  if (verb == "show") {
    no_more(c.positional, 1, "group show");
    with_store(c, [&](redis_backend& store) -> asio::awaitable<void> {
      for (auto& g : co_await store.paused_groups(c.queue)) {
        if (c.json)
          fmt::print("{}\n", json::serialize(json::object{
                                 {"group", g.group}, {"halted", g.halted}, {"error", g.error}, {"at_ms", g.at_ms}}));
        else
          fmt::print("{}  {}{}\n", g.group, g.halted ? "halted: " : "paused", g.error);
      }
    });
  } else if (verb == "pause" || verb == "resume") {
    if (c.positional.size() != 2) throw usage_error(fmt::format("group {}: give one group", verb));
    auto name = c.positional[1];
    if (name.empty()) throw usage_error(fmt::format("group {}: the group's name is empty", verb));
    if (c.flags.contains("--skip") && verb != "resume") throw usage_error("group pause: no --skip");
    if (c.flags.contains("--force") && verb != "pause") throw usage_error("group resume: no --force");
    bool force = c.flags.contains("--force");
    with_store(
        c,
        [&](redis_backend& store) -> asio::awaitable<void> {
          if (verb == "pause" && !force && co_await store.group_size(c.queue, name) == 0)
            throw std::runtime_error(fmt::format(
                "group '{}' of queue '{}' has no jobs; --force pauses it ahead of its first", name, c.queue));
          bool changed = verb == "pause"
                             ? co_await store.pause(c.queue, name)
                             : co_await store.resume(
                                   c.queue, name, c.flags.contains("--skip") ? resume_mode::skip : resume_mode::retry);
          if (verb == "resume" && !changed)
            throw std::runtime_error(fmt::format("group '{}' of queue '{}' is not paused", name, c.queue));
          fmt::print("group {}: {}\n", name, changed ? (verb == "pause" ? "paused" : "resumed") : "already paused");
        },
        force ? queue_must::may_be_new : queue_must::exist);
  } else {
    throw usage_error(fmt::format("group: unknown subcommand '{}'", verb));
  }
  return rc;
}

int queue(const args& a) {
  auto c = parse(a, "queue", {"--force"}, {});
  if (c.help) {
    fmt::print(
        "usage: jobrt queue purge [--redis URL] [--queue NAME] [--force]\n"
        "Removes everything of the queue: its jobs, dead letters, counters and worker records, in\n"
        "small steps (SCAN and UNLINK: the server is never held up). Refused while workers run on\n"
        "it or jobs are running, unless --force (those workers then lose their leases).\n");
    return 0;
  }
  if (c.positional.empty() || c.positional.front() != "purge") throw usage_error("queue: say purge");
  no_more(c.positional, 1, "queue purge");
  with_store(c, [&](redis_backend& store) -> asio::awaitable<void> {
    auto q = co_await store.counts(c.queue);
    if (q.running > 0 && !c.flags.contains("--force"))
      throw std::runtime_error(
          fmt::format("queue '{}' has {} jobs running; stop its workers first, or --force (they lose their leases)",
                      c.queue, q.running));
    auto removed = co_await store.purge_queue(c.queue);
    fmt::print("queue {}: purged ({} keys)\n", c.queue, removed);
  });
  return 0;
}

}  // namespace jobrt::cli
