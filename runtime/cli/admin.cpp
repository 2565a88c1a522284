// Operators' commands: stats, check, job, dlq, group.
#include "cli.hpp"

#include <jobrt/job.hpp>
#include <jobrt/job_status.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/scheduler.hpp>
#include <jobrt/settings.hpp>
#include <jobrt/sharded_backend.hpp>

#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <map>
#include <optional>
#include <set>

namespace jobrt::cli {
namespace {

namespace asio = boost::asio;
namespace json = boost::json;

// What every operator command takes: the server, the queue, --json.
struct common {
  std::string url = default_redis_url();
  std::string queue = "default";
  bool json = false;
};

void add_common(CLI::App& cmd, common& c) {
  redis_option(cmd, c.url, "the server (default: redis://127.0.0.1:6379)");
  cmd.add_option("-q,--queue", c.queue, "the queue (default: default)")
      ->envname("JOBRT_QUEUE")
      ->check(queue_name())
      ->option_text("NAME");
  cmd.add_flag("--json", c.json, "print JSON");
}

// A command whose subject is a queue takes it as an argument too: `jobrt check orders`. Declared
// after --queue, into the same string: given both, the argument wins.
void add_queue_argument(CLI::App& cmd, std::string& queue) {
  cmd.add_option("QUEUE", queue, "the queue, in place of --queue")->check(queue_name());
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
  redis_backend store(ctx.get_executor(), seeds_of(c.url));
  std::exception_ptr failure;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        co_await check_reachable(store.connection(), c.url);
        // The queue through its shards, as many as it is stored with (1 when it is not).
        sharded_backend queue(store, 0, sharded_backend::when_unknown::look);
        if (must == queue_must::exist && !known(co_await queue.counts(c.queue)))
          throw std::runtime_error(
              fmt::format("queue '{}' is unknown at {}: nothing was ever enqueued to it", c.queue, address_of(c.url)));
        co_await body(queue);
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

// The keys of the matching dead letters, oldest first. They are all read before any is requeued
// or purged (those calls remove letters), by find_dead's cursor: each call reads a bounded number
// from where the last stopped (pages by offset would read every letter before each page again).
asio::awaitable<std::vector<std::string>> matching_letters(backend& store, const std::string& queue,
                                                           const letter_filter& filter) {
  constexpr std::size_t page = 500;
  std::vector<std::string> ids;  // newest first
  std::string cursor;
  const dead_filter any;  // (a named one: GCC 12 frees a braced temporary in a co_await twice)
  do {
    auto letters = co_await store.find_dead(queue, any, std::move(cursor), page);
    for (auto& d : letters.items)
      if (filter.matches(d)) ids.push_back(std::move(d.id));
    cursor = std::move(letters.cursor);
  } while (!cursor.empty());
  std::reverse(ids.begin(), ids.end());
  co_return ids;
}

// Requeue and purge take this many keys a call: one script call each, short enough not to keep
// Redis busy for long.
constexpr std::size_t keys_per_call = 500;

struct stats_options {
  common c;
  std::size_t watch = 0;
};

int stats(const stats_options& o) {
  auto c = o.c;
  auto watch = o.watch;
  with_store(c, [&](backend& store) -> asio::awaitable<void> {
    std::int64_t last_completed = -1;
    asio::steady_timer timer(co_await asio::this_coro::executor);
    for (;;) {
      auto q = co_await store.counts(c.queue);
      // The completion rate since the last report (so from the second on).
      std::optional<double> rate;
      if (last_completed >= 0) rate = static_cast<double>(q.completed - last_completed) / static_cast<double>(watch);
      if (c.json) {
        auto js = to_json(q);
        js["queue"] = c.queue;
        if (rate) js["completed_per_s"] = *rate;
        fmt::print("{}\n", json::serialize(js));
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

struct check_options {
  common c;
  bool repair = false;
};

int check(const check_options& o) {
  auto c = o.c;
  check_report r;
  with_store(c, [&](backend& store) -> asio::awaitable<void> { r = co_await store.check(c.queue, o.repair); });
  auto oldest_age = r.oldest_enqueued_ms > 0 ? now_ms() - r.oldest_enqueued_ms : 0;
  if (c.json) {
    json::array problems;
    for (auto& p : r.problems) problems.emplace_back(p);
    json::object js{{"queue", c.queue},
                    {"groups", r.groups},
                    {"jobs", r.jobs},
                    {"stuck_groups", r.stuck_groups},
                    {"oldest_job_age_ms", oldest_age},
                    {"repaired", r.repaired},
                    {"calls", r.calls},
                    {"problems", problems}};
    fmt::print("{}\n", json::serialize(js));
  } else {
    fmt::print(
        "queue {}: {} groups with jobs, {} jobs, {} stuck groups, oldest job {} ms old ({} calls to the server)\n",
        c.queue, r.groups, r.jobs, r.stuck_groups, oldest_age, r.calls);
    for (auto& p : r.problems) fmt::print("  problem: {}\n", p);
    if (r.problems.empty()) fmt::print("  no problems\n");
    if (o.repair) fmt::print("  repaired {}\n", r.repaired);
  }
  return r.problems.empty() || o.repair ? 0 : 1;
}

// What `dlq requeue` and `dlq purge` take: ids (or "-": one per line on standard input), or a
// selection.
struct letters_options {
  common c;
  std::vector<std::string> ids;
  bool all = false, head = false;
  letter_filter filter;
  std::string group, type, error;  // the filter's options as given

  bool selection() const { return all || filter.group || filter.type || filter.error; }

  // Checks what was given and reads "-"; `verb` names the command in errors.
  void settle(std::string_view verb) {
    const std::pair<const std::string*, std::optional<std::string>*> given[] = {
        {&group, &filter.group}, {&type, &filter.type}, {&error, &filter.error}};
    for (auto [text, field] : given)
      if (!text->empty()) *field = *text;
    if (ids.empty() == !selection())
      throw usage_error(fmt::format("dlq {}: give the ids, or --all, or filters (--group, --type, --error)", verb));
    if (ids.size() == 1 && ids.front() == "-") {
      ids.clear();
      std::ifstream unused;
      auto& in = open_input("-", unused, "dlq");
      for (std::string line; std::getline(in, line);) {
        auto end = line.find_last_not_of(" \t\r");
        if (end != std::string::npos) ids.push_back(line.substr(0, end + 1));
      }
    }
  }
};

void add_selection(CLI::App& cmd, letters_options& o) {
  cmd.add_option("ID", o.ids, "dead letters by id; - reads them from standard input, one per line");
  cmd.add_flag("--all", o.all, "every dead letter");
  cmd.add_option("-g,--group", o.group, "those of group G")->check(not_empty("the group"))->option_text("G");
  cmd.add_option("-t,--type", o.type, "those whose job's type is T")->check(not_empty("the type"))->option_text("T");
  cmd.add_option("--error", o.error, "those whose error contains TEXT")
      ->check(not_empty("the text"))
      ->option_text("TEXT");
}

int dlq_list(const common& c, std::size_t offset, std::size_t limit) {
  with_store(c, [&](backend& store) -> asio::awaitable<void> {
    auto letters = co_await store.dead_letters(c.queue, offset, limit);
    for (auto& d : letters) {
      if (c.json)
        fmt::print("{}\n", json::serialize(to_json(d)));
      else
        fmt::print("{}  group {}  {}  {}\n", d.id, d.group.empty() ? "-" : d.group, age(d.at_ms), d.error);
    }
  });
  return 0;
}

int dlq_show(const common& c, const std::string& id) {
  int rc = 0;
  with_store(c, [&](backend& store) -> asio::awaitable<void> {
    auto d = co_await store.dead_letter_of(c.queue, id);
    if (!d) {
      fmt::print(stderr, "jobrt: dlq show: no dead letter {} in queue {}\n", id, c.queue);
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
  return rc;
}

// How long until a time (ms since the epoch).
std::string in(std::int64_t at_ms) {
  return fmt::format("in {:.1f} s", static_cast<double>(std::max<std::int64_t>(0, at_ms - now_ms())) / 1000.0);
}

int job_cancel(const common& c, const std::vector<std::string>& ids) {
  int rc = 0;
  with_store(c, [&](backend& store) -> asio::awaitable<void> {
    json::array out;
    for (const auto& id : ids) {
      auto outcome = co_await store.cancel(c.queue, id);
      std::string said(to_string(outcome));
      if (outcome == cancel_outcome::not_found) {
        auto dead = co_await store.dead_letter_of(c.queue, id);
        if (dead) said = "dead";
      }
      if (outcome != cancel_outcome::cancelled && outcome != cancel_outcome::already) rc = 1;
      if (c.json) {
        json::object o;
        o["id"] = id;
        o["outcome"] = said;
        out.push_back(std::move(o));
      } else if (said == "not found") {
        fmt::print("{} not found: no kept job of queue {} has this id (enqueued without --keep, or its keep ran out)\n",
                   id, c.queue);
      } else {
        fmt::print("{} {}\n", id, said);
      }
    }
    if (c.json) fmt::print("{}\n", json::serialize(out));
  });
  return rc;
}

int job_show(const common& c, const std::string& id, const std::string& group) {
  int rc = 0;
  with_store(c, [&](backend& store) -> asio::awaitable<void> {
    auto found = co_await find_job(store, c.queue, id, group);
    if (!found) {
      fmt::print(stderr,
                 "jobrt: job: no job {} in queue {} that can be found: it is not dead-lettered nor running, and not "
                 "kept (enqueued without --keep, or its keep ran out){}\n",
                 id, c.queue, group.empty() ? "" : fmt::format(", nor group {}'s next", group));
      rc = 1;
      co_return;
    }
    const auto& s = *found;
    if (c.json) {
      fmt::print("{}\n", json::serialize(to_json(s)));
      co_return;
    }
    fmt::print("id {}\nstate {}\n", s.id, to_string(s.status));
    if (!s.group.empty())
      fmt::print("group {}{}\n", s.group,
                 s.group_state ? fmt::format(" ({} jobs pending or running)", s.group_state->depth) : "");
    if (s.status == job_status::state::delayed) fmt::print("due {}\n", in(s.at_ms));
    if (s.status == job_status::state::done) fmt::print("completed {}\n", age(s.at_ms));
    if (s.status == job_status::state::cancelled) fmt::print("cancelled {}\n", age(s.at_ms));
    if (!s.result.empty()) fmt::print("result {}\n", s.result);
    if (s.running)
      fmt::print("running on {} (host {}, pid {}) since {}\n", s.running_on->id, s.running_on->host, s.running_on->pid,
                 age(s.running->since_ms));
    if (s.cancelling) fmt::print("cancelling: its worker cancels it at its next lease renewal\n");
    if (s.record) {
      try {
        auto j = decode_job(fmt::format("{}|{}|{}", s.record->attempts, s.record->id, s.record->body), s.group);
        fmt::print("type {}\npayload {}\nattempts {} of {}\nenqueued {}\n", j.type, json::serialize(j.payload),
                   s.record->attempts, j.max_attempts, age(j.enqueued_at_ms));
      } catch (const std::runtime_error& e) {
        fmt::print("record {}\nmalformed {}\n", s.record->body, e.what());
      }
    }
    if (s.dead) {
      if (auto j = job_of(*s.dead))
        fmt::print("type {}\npayload {}\nmax attempts {}\nenqueued {}\n", j->type, json::serialize(j->payload),
                   j->max_attempts, age(j->enqueued_at_ms));
      fmt::print("runs {}\nfailed {}\nerror {}\n", s.dead->runs, age(s.dead->at_ms), s.dead->error);
    }
  });
  return rc;
}

// Those of `wanted` not in `done`, each named on stderr by `says`.
template <class Says>
json::array report_missing(const std::vector<std::string>& wanted, const std::set<std::string>& done, Says says) {
  json::array missing;
  for (auto& id : wanted) {
    if (done.contains(id)) continue;
    fmt::print(stderr, "jobrt: {}\n", says(id));
    missing.emplace_back(id);
  }
  return missing;
}

int dlq_requeue(letters_options o) {
  o.settle("requeue");
  int rc = 0;
  with_store(o.c, [&](backend& store) -> asio::awaitable<void> {
    auto& ids = o.ids;
    if (o.selection()) ids = co_await matching_letters(store, o.c.queue, o.filter);
    // In calls of keys_per_call. --head puts each call's letters in front of those already
    // requeued: the last call goes first so that the letters keep their order.
    std::vector<std::vector<std::string>> calls;
    for (std::size_t i = 0; i < ids.size(); i += keys_per_call)
      calls.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(i),
                         ids.begin() + static_cast<std::ptrdiff_t>(std::min(ids.size(), i + keys_per_call)));
    if (o.head) std::reverse(calls.begin(), calls.end());
    std::set<std::string> requeued;
    for (auto& call : calls)
      for (auto& id : co_await store.requeue(o.c.queue, call, o.head)) requeued.insert(id);
    auto missing = report_missing(ids, requeued, [&](const std::string& id) {
      return fmt::format("dlq requeue: {} not requeued: no such dead letter in queue {}, or a pending job has its id",
                         id, o.c.queue);
    });
    if (o.c.json)
      fmt::print("{}\n", json::serialize(json::object{
                             {"requeued", requeued.size()}, {"of", ids.size()}, {"not_requeued", missing}}));
    else
      fmt::print("requeued {} of {}\n", requeued.size(), ids.size());
    if (!missing.empty()) rc = 1;
  });
  return rc;
}

int dlq_purge(letters_options o) {
  o.settle("purge");
  int rc = 0;
  with_store(o.c, [&](backend& store) -> asio::awaitable<void> {
    auto& ids = o.ids;
    std::int64_t purged = 0;
    json::array missing;
    if (o.all && !(o.filter.group || o.filter.type || o.filter.error)) {
      purged = co_await store.purge(o.c.queue, {});  // every one, in one call
    } else {
      std::set<std::string> found;
      if (o.selection()) {
        ids = co_await matching_letters(store, o.c.queue, o.filter);
        found.insert(ids.begin(), ids.end());
      } else {
        for (auto& id : ids)
          if (co_await store.dead_letter_of(o.c.queue, id)) found.insert(id);
      }
      missing = report_missing(ids, found, [&](const std::string& id) {
        return fmt::format("dlq purge: no dead letter {} in queue {}", id, o.c.queue);
      });
      // Never an empty call: that would purge every dead letter.
      for (std::size_t i = 0; i < ids.size(); i += keys_per_call)
        purged += co_await store.purge(
            o.c.queue, std::vector<std::string>(
                           ids.begin() + static_cast<std::ptrdiff_t>(i),
                           ids.begin() + static_cast<std::ptrdiff_t>(std::min(ids.size(), i + keys_per_call))));
    }
    if (o.c.json)
      fmt::print("{}\n", json::serialize(json::object{{"purged", purged}, {"not_found", missing}}));
    else
      fmt::print("purged {}\n", purged);
    if (!missing.empty()) rc = 1;
  });
  return rc;
}

void add_dlq(CLI::App& jobrt, action& chosen) {
  auto* dlq = jobrt.add_subcommand("dlq", "dead letters: list, show, requeue, purge")->group("commands");
  dlq->require_subcommand(1);
  dlq->set_help_flag("-h,--help", "print this help");
  dlq->footer(
      "Each command takes --help. With --json, list prints one JSON object per line and show one\n"
      "object, each with: id, group, type, payload, max_attempts, enqueued_at_ms, runs, error and\n"
      "at_ms (when it failed; times in ms since the epoch). Ages are in seconds.");

  struct list_options {
    common c;
    std::size_t offset = 0, limit = 100;
  };
  auto list = std::make_shared<list_options>();
  auto* cmd = add_command(*dlq, chosen, "list", "dead letters, oldest first",
                          [list] { return dlq_list(list->c, list->offset, list->limit); });
  add_common(*cmd, list->c);
  number_option(*cmd, "--offset", list->offset, 0, 1'000'000'000, "skip the first N (default 0)");
  number_option(*cmd, "-n,--limit", list->limit, 0, 1'000'000'000, "at most N (default 100)");

  struct show_options {
    common c;
    std::string id;
  };
  auto show = std::make_shared<show_options>();
  cmd = add_command(*dlq, chosen, "show", "one dead letter: its job, runs and error",
                    [show] { return dlq_show(show->c, show->id); });
  add_common(*cmd, show->c);
  cmd->add_option("ID", show->id, "the dead letter's id")->required();

  auto requeue = std::make_shared<letters_options>();
  cmd = add_command(*dlq, chosen, "requeue", "back to their group's tail (--head: next)",
                    [requeue] { return dlq_requeue(*requeue); });
  add_common(*cmd, requeue->c);
  add_selection(*cmd, *requeue);
  cmd->add_flag("--head", requeue->head, "to the head of their group: they run next");
  cmd->footer(
      "Give the ids, or --all, or filters (--group, --type, --error) that a letter must all match.\n"
      "Ids that start with '-' go after --.");

  auto purge = std::make_shared<letters_options>();
  cmd = add_command(*dlq, chosen, "purge", "remove dead letters", [purge] { return dlq_purge(*purge); });
  add_common(*cmd, purge->c);
  add_selection(*cmd, *purge);
  cmd->footer(
      "Give the ids, or --all, or filters (--group, --type, --error) that a letter must all match.\n"
      "Ids that start with '-' go after --.");
}

struct group_options {
  common c;
  std::string group;
  bool force = false, skip = false;
};

int group_show(const common& c) {
  with_store(c, [&](backend& store) -> asio::awaitable<void> {
    for (auto& g : co_await store.paused_groups(c.queue)) {
      if (c.json)
        fmt::print("{}\n", json::serialize(json::object{
                               {"group", g.group}, {"halted", g.halted}, {"error", g.error}, {"at_ms", g.at_ms}}));
      else
        fmt::print("{}  {}{}\n", g.group, g.halted ? "halted: " : "paused", g.error);
    }
  });
  return 0;
}

int group_pause(const group_options& o) {
  with_store(
      o.c,
      [&](backend& store) -> asio::awaitable<void> {
        if (!o.force && co_await store.group_size(o.c.queue, o.group) == 0)
          throw std::runtime_error(fmt::format(
              "group '{}' of queue '{}' has no jobs; --force pauses it ahead of its first", o.group, o.c.queue));
        bool changed = co_await store.pause(o.c.queue, o.group);
        if (o.c.json)
          fmt::print("{}\n", json::serialize(json::object{{"group", o.group}, {"paused", true}, {"changed", changed}}));
        else
          fmt::print("group {}: {}\n", o.group, changed ? "paused" : "already paused");
      },
      o.force ? queue_must::may_be_new : queue_must::exist);
  return 0;
}

int group_resume(const group_options& o) {
  with_store(o.c, [&](backend& store) -> asio::awaitable<void> {
    if (!co_await store.resume(o.c.queue, o.group, o.skip ? resume_mode::skip : resume_mode::retry))
      throw std::runtime_error(fmt::format("group '{}' of queue '{}' is not paused", o.group, o.c.queue));
    if (o.c.json)
      fmt::print("{}\n", json::serialize(json::object{{"group", o.group}, {"paused", false}, {"changed", true}}));
    else
      fmt::print("group {}: resumed\n", o.group);
  });
  return 0;
}

void add_group(CLI::App& jobrt, action& chosen) {
  auto* group = jobrt.add_subcommand("group", "paused and halted groups: show, pause, resume")->group("commands");
  group->require_subcommand(1);
  group->set_help_flag("-h,--help", "print this help");
  group->footer(
      "Each command takes --help. An unknown queue is an error (exit 1). A group whose name starts\n"
      "with '-' goes after --: jobrt group pause -- -g.");

  auto show = std::make_shared<common>();
  auto* cmd = add_command(*group, chosen, "show", "paused and halted groups", [show] { return group_show(*show); });
  add_common(*cmd, *show);

  auto group_argument = [](CLI::App& command, std::string& name) {
    command.add_option("GROUP", name, "the group")->required()->check(not_empty("the group's name"));
  };
  auto pause = std::make_shared<group_options>();
  cmd = add_command(*group, chosen, "pause", "nothing more of the group starts (its running job finishes)",
                    [pause] { return group_pause(*pause); });
  add_common(*cmd, pause->c);
  group_argument(*cmd, pause->group);
  cmd->add_flag("--force", pause->force, "pause a group with no jobs (a typo, unless you mean it), ahead of its first");

  auto resume = std::make_shared<group_options>();
  cmd = add_command(*group, chosen, "resume", "the group goes on; a group that is not paused is an error",
                    [resume] { return group_resume(*resume); });
  add_common(*cmd, resume->c);
  group_argument(*cmd, resume->group);
  cmd->add_flag("--skip", resume->skip, "dead-letter its head job first");
}

struct purge_options {
  common c;
  bool force = false;
};

int queue_purge(const purge_options& o) {
  auto c = o.c;
  with_store(c, [&](backend& store) -> asio::awaitable<void> {
    auto q = co_await store.counts(c.queue);
    if (q.running > 0 && !o.force)
      throw std::runtime_error(
          fmt::format("queue '{}' has {} jobs running; stop its workers first, or --force (they lose their leases)",
                      c.queue, q.running));
    auto removed = co_await store.purge_queue(c.queue);
    if (c.json)
      fmt::print("{}\n", json::serialize(json::object{{"queue", c.queue}, {"purged", true}, {"keys", removed}}));
    else
      fmt::print("queue {}: purged ({} keys)\n", c.queue, removed);
  });
  return 0;
}

// What a producer in another language needs (docs/PROTOCOL.md), from this very jobrt: no server.
void add_protocol(CLI::App& jobrt, action& chosen) {
  auto* protocol =
      jobrt.add_subcommand("protocol", "the enqueue script for producers in other languages")->group("commands");
  protocol->require_subcommand(1);
  protocol->set_help_flag("-h,--help", "print this help");
  protocol->footer(
      "docs/PROTOCOL.md says how to call the script. Installed, it is also in\n"
      "<prefix>/share/jobrt/lua/enqueue.lua.");
  add_command(*protocol, chosen, "script", "print enqueue.lua, as this jobrt runs it", [] {
    fmt::print("{}", redis_backend::enqueue_script());
    return 0;
  });
  add_command(*protocol, chosen, "sha", "print its SHA1, as EVALSHA takes it", [] {
    fmt::print("{}\n", redis::script(std::string(redis_backend::enqueue_script())).sha1());
    return 0;
  });
  struct keys_options {
    std::string queue;
    bool json = false;
  };
  auto keys = std::make_shared<keys_options>();
  auto* cmd = add_command(*protocol, chosen, "keys", "print the keys it takes for a queue, in order", [keys] {
    auto all = redis_backend::enqueue_keys(keys->queue);
    if (keys->json)
      fmt::print("{}\n", json::serialize(json::array(all.begin(), all.end())));
    else
      for (auto& k : all) fmt::print("{}\n", k);
    return 0;
  });
  cmd->add_option("QUEUE", keys->queue, "the queue")->required()->check(queue_name());
  cmd->add_flag("--json", keys->json, "as a JSON array");
}

// --- jobrt schedule: repeatable jobs (scheduler.hpp) ---

struct schedule_options {
  common c;
  std::string name, cron, tz = "UTC", every, type, payload, group, job, config_file;
  std::size_t catch_up = 0, max_attempts = 3;
};

// "100ms", "5s", "10m", "2h", "1d": a positive whole number and its unit.
std::chrono::milliseconds interval_of(const std::string& text) {
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  auto unit = std::string_view(text).substr(digits);
  static const std::map<std::string_view, std::int64_t, std::less<>> units{
      {"ms", 1}, {"s", 1000}, {"m", 60'000}, {"h", 3'600'000}, {"d", 86'400'000}};
  auto found = units.find(unit);
  if (digits == 0 || digits > 9 || found == units.end())
    throw std::invalid_argument(
        fmt::format("--every '{}' is not a whole number and a unit (ms, s, m, h, d), as 100ms or 5s", text));
  auto ms = std::stoll(text.substr(0, digits)) * found->second;
  if (ms <= 0) throw std::invalid_argument(fmt::format("--every '{}' is not positive", text));
  return std::chrono::milliseconds(ms);
}

// A time as UTC, to the millisecond: 2026-11-28T12:00:00.100Z.
std::string utc_text(sys_ms t) {
  auto ms = t.time_since_epoch().count();
  auto seconds = static_cast<std::time_t>(ms / 1000);
  std::tm parts{};
  gmtime_r(&seconds, &parts);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &parts);
  return fmt::format("{}.{:03}Z", text, ms % 1000);
}

json::object to_json(const schedule_info& s) {
  if (!s.error.empty())
    return {{"name", s.spec.name},
            {"next", utc_text(s.next)},
            {"next_ms", s.next.time_since_epoch().count()},
            {"error", s.error}};
  json::object o{{"name", s.spec.name},
                 {"next", utc_text(s.next)},
                 {"next_ms", s.next.time_since_epoch().count()},
                 {"catch_up", s.spec.catch_up},
                 {"job", to_json(s.spec.job)}};
  if (s.spec.timing.is_cron()) {
    o["cron"] = s.spec.timing.expression();
    o["tz"] = s.spec.timing.time_zone();
  } else {
    o["every_ms"] = s.spec.timing.interval().count();
  }
  return o;
}

int schedule_add(const schedule_options& o) {
  schedule_spec s;
  s.name = o.name;
  if (o.cron.empty() == o.every.empty()) throw usage_error("give --cron or --every (one of them)");
  if (!o.cron.empty())
    s.timing = schedule_timing::cron(o.cron, o.tz);
  else
    s.timing = schedule_timing::every(interval_of(o.every));
  if (!o.job.empty()) {
    if (!o.type.empty() || !o.payload.empty() || !o.group.empty())
      throw usage_error("--job gives the whole job: not with --type, --payload or --group");
    boost::system::error_code ec;
    auto v = json::parse(o.job, ec);
    if (ec) throw std::invalid_argument(fmt::format("--job is not JSON: {}", ec.message()));
    s.job = job_spec_from_json(v);
  } else {
    if (o.type.empty()) throw usage_error("give the job's --type (or the whole --job)");
    s.job.type = o.type;
    if (!o.payload.empty()) s.job.payload = producer::parse_payload(o.payload);
    if (!o.group.empty()) s.job.group = o.group;
    s.job.max_attempts = static_cast<int>(o.max_attempts);
  }
  s.catch_up = o.catch_up;
  // The queue's grouping rules and defaults from a worker config, as `jobrt enqueue --config`.
  producer_options po;
  if (!o.config_file.empty()) {
    auto cfg = settings::from_file(o.config_file);
    auto q =
        std::find_if(cfg.queues.begin(), cfg.queues.end(), [&](const auto& c) { return c.worker.queue == o.c.queue; });
    if (q == cfg.queues.end())
      throw usage_error(fmt::format("schedule add: queue {} is not in config {}", o.c.queue, o.config_file));
    po.rules = q->rules;
    po.max_group_size = q->max_group_size;
    po.group_rate = q->group_rate;
    po.group_concurrency = q->group_concurrency;
    po.group_weight = q->group_weight;
  }
  with_store(
      o.c,
      [&](backend& store) -> asio::awaitable<void> {
        schedule_book book(store, o.c.queue, po);
        auto added = co_await book.add(s);
        if (o.c.json)
          fmt::print("{}\n", json::serialize(to_json(added)));
        else
          fmt::print("schedule {}: {}, next at {}\n", s.name, s.timing.describe(), utc_text(added.next));
      },
      queue_must::may_be_new);
  return 0;
}

int schedule_list(const common& c) {
  with_store(
      c,
      [&](backend& store) -> asio::awaitable<void> {
        schedule_book book(store, c.queue);
        std::vector<schedule_info> all;
        std::string cursor;
        do {
          auto p = co_await book.list(cursor, 100);
          all.insert(all.end(), std::make_move_iterator(p.items.begin()), std::make_move_iterator(p.items.end()));
          cursor = std::move(p.cursor);
        } while (!cursor.empty());
        std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.spec.name < b.spec.name; });
        if (c.json) {
          json::array out;
          for (const auto& s : all) out.push_back(to_json(s));
          fmt::print("{}\n", json::serialize(out));
          co_return;
        }
        if (all.empty()) fmt::print("queue {}: no schedules\n", c.queue);
        for (const auto& s : all) {
          if (!s.error.empty()) {
            fmt::print("{}  unreadable ({})  next {}\n", s.spec.name, s.error, utc_text(s.next));
            continue;
          }
          std::string group = s.spec.job.group ? "  group " + *s.spec.job.group : std::string();
          std::string catch_up = s.spec.catch_up > 0 ? fmt::format("  catch-up {}", s.spec.catch_up) : std::string();
          fmt::print("{}  {}  next {}  type {}{}{}\n", s.spec.name, s.spec.timing.describe(), utc_text(s.next),
                     s.spec.job.type, group, catch_up);
        }
      },
      queue_must::may_be_new);
  return 0;
}

std::string removed_json(const std::string& name) {
  return json::serialize(json::object{{"name", name}, {"removed", true}});
}

int schedule_remove(const schedule_options& o) {
  with_store(
      o.c,
      [&](backend& store) -> asio::awaitable<void> {
        schedule_book book(store, o.c.queue);
        if (!co_await book.remove(o.name))
          throw std::runtime_error(fmt::format("queue '{}' has no schedule '{}'", o.c.queue, o.name));
        if (o.c.json)
          fmt::print("{}\n", removed_json(o.name));
        else
          fmt::print("schedule {}: removed\n", o.name);
      },
      queue_must::may_be_new);
  return 0;
}

void add_schedule(CLI::App& jobrt, action& chosen) {
  auto* schedule = jobrt.add_subcommand("schedule", "repeatable jobs: add, list, remove")->group("commands");
  schedule->require_subcommand(1);
  schedule->set_help_flag("-h,--help", "print this help");
  schedule->footer(
      "The queue's workers fire each schedule when it is due; each firing is enqueued once, with\n"
      "the id <name>@<firing time in ms>, however many workers run. Each command takes --help.");

  auto add = std::make_shared<schedule_options>();
  auto* cmd = add_command(*schedule, chosen, "add", "store a schedule (replacing one of that name)",
                          [add] { return schedule_add(*add); });
  add_common(*cmd, add->c);
  cmd->add_option("NAME", add->name, "the schedule's name")->required();
  cmd->add_option("--cron", add->cron, "fire at these times: 'minute hour day month weekday' (6 fields: seconds first)")
      ->option_text("EXPR");
  cmd->add_option("--tz", add->tz, "the time zone of --cron's times (default UTC)")->option_text("ZONE");
  cmd->add_option("--every", add->every, "fire every so long, at its multiples since the epoch: 100ms, 5s, 10m, 2h, 1d")
      ->option_text("DURATION");
  cmd->add_option("-t,--type", add->type, "the job's type (its handler)")->option_text("TYPE");
  cmd->add_option("--payload", add->payload, "the job's payload, JSON")->option_text("JSON");
  cmd->add_option("-g,--group", add->group, "its group: one at a time, in order")->option_text("G");
  number_option(*cmd, "--max-attempts", add->max_attempts, 1, 1'000'000, "runs before it is dead (default 3)");
  cmd->add_option("--job", add->job, "the whole job, as a line of `jobrt enqueue --file`")->option_text("JSON");
  cmd->add_option("-C,--config", add->config_file, "the queue's grouping rules from a worker config (docs/CONFIG.md)")
      ->option_text("FILE");
  number_option(*cmd, "--catch-up", add->catch_up, 0, max_catch_up,
                "missed firings (no worker ran) to enqueue besides the latest (default 0: skip them)");

  auto list = std::make_shared<common>();
  cmd = add_command(*schedule, chosen, "list", "the queue's schedules and their next firings",
                    [list] { return schedule_list(*list); });
  add_common(*cmd, *list);

  auto remove = std::make_shared<schedule_options>();
  cmd = add_command(*schedule, chosen, "remove", "remove a schedule (its firings already enqueued stay)",
                    [remove] { return schedule_remove(*remove); });
  add_common(*cmd, remove->c);
  cmd->add_option("NAME", remove->name, "the schedule's name")->required();
}

}  // namespace

void add_admin(CLI::App& jobrt, action& chosen) {
  auto stats_o = std::make_shared<stats_options>();
  auto* cmd =
      add_command(jobrt, chosen, "stats", "a queue's counts and counters", [stats_o] { return stats(*stats_o); });
  add_common(*cmd, stats_o->c);
  add_queue_argument(*cmd, stats_o->c.queue);
  number_option(*cmd, "-w,--watch", stats_o->watch, 0, 86'400,
                "print them again every N seconds (0: once), with the completion rate, until interrupted");
  cmd->footer(
      "The counts: ready lanes, running, delayed, paused groups, dead letters; the counters:\n"
      "enqueued, started, completed, failed, retried, deferred, halted, recovered, and unhandled\n"
      "(jobs handed back by a worker with no handler for their type). --watch adds the completion\n"
      "rate since the last report (jobs/s; in JSON \"completed_per_s\"). The queue has drained\n"
      "(nothing pending, delayed or running) when ready_lanes, running, delayed and groups are all 0;\n"
      "paused groups keep their jobs (groups stays above 0) until resumed.");

  auto check_o = std::make_shared<check_options>();
  cmd = add_command(jobrt, chosen, "check", "verify a queue's invariants (--repair fixes what it finds)",
                    [check_o] { return check(*check_o); });
  add_common(*cmd, check_o->c);
  add_queue_argument(*cmd, check_o->c.queue);
  cmd->add_flag("--repair", check_o->repair, "fix what it confirms");
  cmd->footer(
      "Verifies the queue's invariants: every group with jobs has exactly one lane, lease or\n"
      "parked lane; no lane names a group without jobs; no id is taken without a pending job; no\n"
      "job is in two places; no dead worker holds lanes. Reads the queue in small steps (pages of\n"
      "at most 1,000 entries), so workers and other clients carry on meanwhile; what it suspects\n"
      "is confirmed by one short atomic call each before it is reported. On a queue that workers\n"
      "change meanwhile, the counts are as the walk saw them. Exit code 1 when problems were found\n"
      "and not repaired.");

  struct job_options {
    common c;
    std::string id, group;
  };
  auto job_o = std::make_shared<job_options>();
  cmd = add_command(jobrt, chosen, "job", "a job by id: pending, delayed, running, done or dead",
                    [job_o] { return job_show(job_o->c, job_o->id, job_o->group); });
  add_common(*cmd, job_o->c);
  cmd->add_option("ID", job_o->id, "the job's id")->required();
  cmd->add_option("-g,--group", job_o->group, "its group: finds it as the group's next job also when it is not kept")
      ->option_text("G");
  cmd->footer(
      "Finds a job enqueued with a keep (jobrt enqueue --keep MS) in any state: pending, delayed or\n"
      "waiting for a retry, running (which worker, since when), done (for its keep) or dead. A job\n"
      "enqueued without a keep is found dead-lettered, running, or as its group's next (--group).\n"
      "Exit code 1 when it is not found. --json prints the object the dashboard's API gives.");

  struct cancel_options {
    common c;
    std::vector<std::string> ids;
  };
  auto cancel_o = std::make_shared<cancel_options>();
  cmd = add_command(jobrt, chosen, "cancel", "cancel kept jobs by id: pending, delayed or running",
                    [cancel_o] { return job_cancel(cancel_o->c, cancel_o->ids); });
  add_common(*cmd, cancel_o->c);
  cmd->add_option("ID", cancel_o->ids, "the jobs' ids")->required();
  cmd->footer(
      "Cancels jobs enqueued with a keep (jobrt enqueue --keep MS). A pending or delayed one never\n"
      "starts; a running one's handler is cancelled at its worker's next lease renewal (a third of\n"
      "the lease TTL at most), unless it completes first. Its state is then cancelled (jobrt job),\n"
      "for its keep. Prints one line per id: cancelled, already cancelled, done (too late), dead\n"
      "(in the dead letters) or not found. Exit code 1 when any was not cancelled.");

  add_dlq(jobrt, chosen);
  add_group(jobrt, chosen);
  add_schedule(jobrt, chosen);

  add_protocol(jobrt, chosen);

  auto* queue = jobrt.add_subcommand("queue", "a whole queue: purge")->group("commands");
  queue->require_subcommand(1);
  queue->set_help_flag("-h,--help", "print this help");
  auto purge_o = std::make_shared<purge_options>();
  cmd =
      add_command(*queue, chosen, "purge", "remove everything of a queue", [purge_o] { return queue_purge(*purge_o); });
  add_common(*cmd, purge_o->c);
  add_queue_argument(*cmd, purge_o->c.queue);
  cmd->add_flag("--force", purge_o->force, "even while jobs run (their workers lose their leases)");
  cmd->footer(
      "Removes the queue's jobs, dead letters, counters and worker records, in small steps (SCAN\n"
      "and UNLINK: the server is never held up). Refused while jobs are running, unless --force.");
}

}  // namespace jobrt::cli
