// Repeatable jobs on every backend: as the backend keeps them (put_schedule ... fire_schedule: a
// step enqueues its firings and moves the schedule on in one call, once, whoever else tries it),
// and as workers' schedulers fire them.
#include "conformance/conformance.hpp"

#include <jobrt/scheduler.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/experimental/parallel_group.hpp>

namespace {

stored_schedule schedule(std::string name, std::int64_t next_ms, std::string group = {}) {
  return {std::move(name), R"({"every_ms":1000})", std::move(group), next_ms};
}

// (g++ 12: no braced lists of temporaries in a coroutine: the firings come as arguments.)
template <class... Firings>
schedule_step step(const stored_schedule& was, std::int64_t next_ms, Firings... firings) {
  schedule_step s;
  s.was = was;
  s.firings = std::vector<std::int64_t>{firings...};
  s.job.group = was.group;
  s.job.body = R"({"type":"tick","payload":{}})";
  s.next_ms = next_ms;
  return s;
}

awaitable<std::vector<stored_schedule>> all_schedules(backend& store, const std::string& queue) {
  std::vector<stored_schedule> out;
  std::string cursor;
  do {
    auto p = co_await store.schedules(queue, cursor, 2);
    out.insert(out.end(), p.items.begin(), p.items.end());
    cursor = p.cursor;
  } while (!cursor.empty());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  co_return out;
}

// The ids of every job a claim gives now (each finished at once).
awaitable<std::vector<std::string>> claim_all(backend& store, const std::string& queue) {
  std::vector<std::string> ids;
  claim_options o;
  o.worker = "w";
  o.max = 100;
  while (true) {
    auto got = co_await store.claim(queue, o);
    if (got.empty()) break;
    std::vector<finish_item> done;
    for (auto& c : got) {
      ids.push_back(c.job.id);
      finish_item f;
      f.token = c.token;
      done.push_back(std::move(f));
    }
    co_await store.finish(queue, "w", std::move(done), std::chrono::seconds(30));
  }
  std::sort(ids.begin(), ids.end());
  co_return ids;
}

// (g++ 12: no braced lists of temporaries in a coroutine.)
template <class... T>
std::vector<std::string> list_of(const T&... s) {
  return {std::string(s)...};
}

}  // namespace

CONFORMANCE("schedules: put, list, find the next, replace and remove") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    CHECK_FALSE((co_await store.next_schedule(b.queue())).has_value());
    co_await store.put_schedule(b.queue(), schedule("hourly", 3000));
    co_await store.put_schedule(b.queue(), schedule("tenant-7", 1000, "tenant:7"));
    co_await store.put_schedule(b.queue(), schedule("daily", 2000));

    auto listed = co_await all_schedules(b.make(), b.queue());
    REQUIRE(listed.size() == 3);
    CHECK(listed[0].name == "daily");
    CHECK(listed[1].name == "hourly");
    CHECK(listed[1].next_ms == 3000);
    CHECK(listed[1].spec == R"({"every_ms":1000})");
    CHECK(listed[2].name == "tenant-7");
    CHECK(listed[2].group == "tenant:7");

    auto next = co_await b.make().next_schedule(b.queue());
    REQUIRE(next.has_value());
    CHECK(next->name == "tenant-7");
    CHECK(next->group == "tenant:7");
    CHECK(next->next_ms == 1000);

    // Put again under its name: replaced (in whichever shard its new group has), not added.
    auto moved = schedule("hourly", 500, "elsewhere");
    moved.spec = R"({"every_ms":60000})";
    co_await store.put_schedule(b.queue(), moved);
    next = co_await store.next_schedule(b.queue());
    REQUIRE(next.has_value());
    CHECK(next->name == "hourly");
    CHECK(next->spec == R"({"every_ms":60000})");
    CHECK(next->group == "elsewhere");
    CHECK((co_await all_schedules(store, b.queue())).size() == 3);

    CHECK(co_await store.remove_schedule(b.queue(), "hourly"));
    CHECK_FALSE(co_await store.remove_schedule(b.queue(), "hourly"));
    CHECK_FALSE(co_await store.remove_schedule(b.queue(), "never-was"));
    next = co_await store.next_schedule(b.queue());
    REQUIRE(next.has_value());
    CHECK(next->name == "tenant-7");
    CHECK((co_await all_schedules(store, b.queue())).size() == 2);

    // A purge removes everything of the queue, its schedules too.
    co_await store.purge_queue(b.queue());
    CHECK((co_await all_schedules(store, b.queue())).empty());
    CHECK_FALSE((co_await store.next_schedule(b.queue())).has_value());
  });
}

CONFORMANCE("schedules: a step enqueues each firing once, under its id, and moves the schedule on") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    for (int grouped = 0; grouped < 2; ++grouped) {
      std::string group = grouped ? "g" : "";
      std::string name = grouped ? "grouped" : "plain";
      co_await store.put_schedule(b.queue(), schedule(name, 1000, group));
      auto was = co_await store.next_schedule(b.queue());
      REQUIRE(was.has_value());
      auto fired = co_await b.make().fire_schedule(b.queue(), step(*was, 2000, 1000));
      CHECK(fired.taken);
      CHECK(fired.refused.empty());
      REQUIRE(fired.results.size() == 1);
      CHECK(fired.results[0].id == name + "@1000");
      CHECK_FALSE(fired.results[0].duplicate);

      // The same step again, as a second worker that read the schedule before it moved: not taken.
      auto again = co_await b.make().fire_schedule(b.queue(), step(*was, 2000, 1000));
      CHECK_FALSE(again.taken);
      CHECK(again.results.empty());

      // From where it is now: two firings (a catch-up), then one with every firing skipped.
      was = co_await store.next_schedule(b.queue());
      REQUIRE(was.has_value());
      CHECK(was->next_ms == 2000);
      fired = co_await store.fire_schedule(b.queue(), step(*was, 4000, 2000, 3000));
      CHECK(fired.taken);
      REQUIRE(fired.results.size() == 2);
      CHECK(fired.results[1].id == name + "@3000");
      was = co_await store.next_schedule(b.queue());
      REQUIRE(was.has_value());
      fired = co_await store.fire_schedule(b.queue(), step(*was, 9000));
      CHECK(fired.taken);
      CHECK(fired.results.empty());
      CHECK((co_await store.next_schedule(b.queue()))->next_ms == 9000);

      auto ids = co_await claim_all(store, b.queue());
      CHECK(ids == list_of(name + "@1000", name + "@2000", name + "@3000"));
      co_await store.remove_schedule(b.queue(), name);
    }
  });
}

CONFORMANCE("schedules: a firing whose id is taken is a duplicate, and a changed schedule is not stepped") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    co_await store.put_schedule(b.queue(), schedule("s", 1000));
    auto was = *co_await store.next_schedule(b.queue());
    CHECK((co_await store.fire_schedule(b.queue(), step(was, 2000, 1000))).taken);

    // Put back at 1000 (an operator's mistake, say): the firing still pending is not doubled.
    co_await store.put_schedule(b.queue(), schedule("s", 1000));
    was = *co_await store.next_schedule(b.queue());
    auto fired = co_await store.fire_schedule(b.queue(), step(was, 2000, 1000));
    CHECK(fired.taken);
    REQUIRE(fired.results.size() == 1);
    CHECK(fired.results[0].duplicate);

    // Changed after it was read (same next firing, another spec): the step is not taken.
    was = *co_await store.next_schedule(b.queue());
    auto changed = schedule("s", 2000);
    changed.spec = R"({"every_ms":5})";
    co_await store.put_schedule(b.queue(), changed);
    fired = co_await store.fire_schedule(b.queue(), step(was, 3000, 2000));
    CHECK_FALSE(fired.taken);
    // Removed: not taken either.
    was = *co_await store.next_schedule(b.queue());
    co_await store.remove_schedule(b.queue(), "s");
    CHECK_FALSE((co_await store.fire_schedule(b.queue(), step(was, 3000, 2000))).taken);
    auto ids = co_await claim_all(store, b.queue());
    CHECK(ids == list_of("s@1000"));
  });
}

CONFORMANCE("schedules: of steps taken at once by many callers, one is taken") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    co_await store.put_schedule(b.queue(), schedule("race", 1000, "g"));
    auto was = *co_await store.next_schedule(b.queue());
    using op = decltype(asio::co_spawn(ctx, store.fire_schedule(b.queue(), step(was, 2000, 1000)), asio::deferred));
    std::vector<op> ops;
    for (int i = 0; i < 6; ++i)
      ops.push_back(asio::co_spawn(ctx, b.make().fire_schedule(b.queue(), step(was, 2000, 1000)), asio::deferred));
    auto [order, errors, results] = co_await asio::experimental::make_parallel_group(std::move(ops))
                                        .async_wait(asio::experimental::wait_for_all(), use_awaitable);
    int taken = 0;
    for (std::size_t i = 0; i < results.size(); ++i) {
      CHECK_FALSE(errors[i]);
      taken += results[i].taken ? 1 : 0;
    }
    CHECK(taken == 1);
    auto ids = co_await claim_all(store, b.queue());
    CHECK(ids == list_of("race@1000"));
  });
}

CONFORMANCE("schedules: a step a full group refuses moves the schedule on and says why") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    encoded_job holder;
    holder.group = "full";
    holder.body = R"({"type":"t","payload":{}})";
    co_await store.enqueue(b.queue(), std::vector<encoded_job>(1, holder));
    co_await store.put_schedule(b.queue(), schedule("s", 1000, "full"));
    auto was = *co_await store.next_schedule(b.queue());
    auto s = step(was, 2000, 1000);
    s.job.max_group_size = 1;
    auto fired = co_await store.fire_schedule(b.queue(), s);
    CHECK(fired.taken);
    CHECK(fired.results.empty());
    CHECK(fired.refused.find("group 'full' would hold 2 jobs, over its max group size of 1") != std::string::npos);
    CHECK((co_await store.next_schedule(b.queue()))->next_ms == 2000);
    CHECK(co_await store.group_size(b.queue(), "full") == 1);
  });
}

CONFORMANCE("schedules: a put or a removal wakes a waiting scheduler") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& waiter = b.make();
    auto& store = b.make();
    co_await waiter.next_schedule(b.queue());  // (the queue is known: its wake-ups are listened to)
    for (int change = 0; change < 2; ++change) {
      auto seen = waiter.schedules_version(b.queue());
      // (On Redis the subscription may still be on its way: the first wait is short.)
      if (change == 0) co_await waiter.wait_schedules(b.queue(), seen, std::chrono::milliseconds(200));
      seen = waiter.schedules_version(b.queue());
      auto start = std::chrono::steady_clock::now();
      // The wait starts first; the change goes out after it.
      auto wait = asio::co_spawn(ctx, waiter.wait_schedules(b.queue(), seen, std::chrono::seconds(20)), asio::deferred);
      auto put = asio::co_spawn(ctx, store.put_schedule(b.queue(), schedule("woken", 1000)), asio::deferred);
      auto remove = asio::co_spawn(ctx, store.remove_schedule(b.queue(), "woken"), asio::deferred);
      if (change == 0)
        co_await asio::experimental::make_parallel_group(std::move(wait), std::move(put))
            .async_wait(asio::experimental::wait_for_all(), use_awaitable);
      else
        co_await asio::experimental::make_parallel_group(std::move(wait), std::move(remove))
            .async_wait(asio::experimental::wait_for_all(), use_awaitable);
      CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
      CHECK(waiter.schedules_version(b.queue()) != seen);
    }
  });
}

CONFORMANCE("scheduler: two workers fire an every-100ms schedule, each firing once, none missed") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    std::vector<std::string> ran;
    auto tick = [&ran](job_context& j) -> awaitable<void> {
      ran.push_back(j.job().id);
      co_return;
    };
    worker first(ctx.get_executor(), b.make(), b.worker_opts(2));
    worker second(ctx.get_executor(), b.make(), b.worker_opts(2));
    first.add_handler("tick", tick);
    second.add_handler("tick", tick);
    first.start();
    second.start();
    schedule_spec s;
    s.name = "tick";
    s.timing = schedule_timing::every(std::chrono::milliseconds(100));
    s.job.type = "tick";
    s.job.group = "ticks";
    s.catch_up = 20;  // (a slow machine's late wake-up misses none)
    schedule_book book(b.make(), b.queue());
    auto first_firing = (co_await book.add(s)).next;
    CHECK(co_await eventually([&] { return ran.size() >= 15; }, std::chrono::seconds(20)));
    co_await book.remove("tick");
    co_await first.stop(std::chrono::seconds(5));
    co_await second.stop(std::chrono::seconds(5));

    // Firings 100 ms apart from the first, each once, in order (one group), none skipped.
    REQUIRE(ran.size() >= 15);
    for (std::size_t i = 0; i < ran.size(); ++i)
      CHECK(ran[i] ==
            fmt::format("tick@{}", (first_firing + std::chrono::milliseconds(100 * i)).time_since_epoch().count()));
  });
}

CONFORMANCE("scheduler: a worker told not to fire schedules (schedules = false) leaves them to the others") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    std::vector<std::string> ran;
    auto tick = [&ran](job_context& j) -> awaitable<void> {
      ran.push_back(j.job().id);
      co_return;
    };
    auto quiet_opts = b.worker_opts(2);
    quiet_opts.schedules = false;
    worker quiet(ctx.get_executor(), b.make(), quiet_opts);
    quiet.add_handler("tick", tick);
    quiet.start();
    schedule_spec s;
    s.name = "soon";
    s.timing = schedule_timing::every(std::chrono::milliseconds(50));
    s.job.type = "tick";
    schedule_book book(b.make(), b.queue());
    auto due = (co_await book.add(s)).next;
    // Due, and past due by far more than a firing takes: the quiet worker fired none.
    co_await sleep_for(std::chrono::milliseconds(300));
    CHECK(std::chrono::system_clock::now() > due);
    CHECK(ran.empty());
    auto listed = co_await book.list("", 10);
    REQUIRE(listed.items.size() == 1);
    CHECK(listed.items[0].next == due);
    // A worker that fires them.
    worker firing(ctx.get_executor(), b.make(), b.worker_opts(2));
    firing.add_handler("tick", tick);
    firing.start();
    CHECK(co_await eventually([&] { return !ran.empty(); }, std::chrono::seconds(10)));
    co_await book.remove("soon");
    co_await firing.stop(std::chrono::seconds(5));
    co_await quiet.stop(std::chrono::seconds(5));
  });
}

CONFORMANCE("scheduler: a schedule's job is decided when it is added, and bad schedules are refused") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer_options po;
    grouping_rule rule;  // (g++ 12: no braced lists of temporaries in a coroutine)
    rule.match["type"] = "report";
    rule.key = "{tenant}";
    rule.on_failure = failure_policy::skip;
    rule.max_group_size = 5;
    po.rules.add(rule);
    po.keep = std::chrono::minutes(1);
    schedule_book book(b.make(), b.queue(), po);
    schedule_spec s;
    s.name = "nightly";
    s.timing = schedule_timing::cron("0 3 * * *", "Europe/Paris");
    s.job.type = "report";
    boost::json::object payload;
    payload["tenant"] = "t7";
    s.job.payload = payload;
    s.catch_up = 2;
    auto added = co_await book.add(s);
    auto next = added.next;
    CHECK(next > std::chrono::system_clock::now());
    CHECK(added.spec.job.group == std::optional<std::string>("t7"));
    auto listed = co_await book.list("", 10);
    REQUIRE(listed.items.size() == 1);
    const auto& kept = listed.items[0];
    CHECK(kept.next == next);
    CHECK(kept.spec.timing.describe() == "cron '0 3 * * *' in Europe/Paris");
    CHECK(kept.spec.catch_up == 2);
    CHECK(kept.spec.job.group == std::optional<std::string>("t7"));  // the rule's group, and the rest of it
    CHECK(kept.spec.job.on_failure == std::optional(failure_policy::skip));
    CHECK(kept.spec.job.max_group_size == std::optional<std::size_t>(5));
    CHECK(kept.spec.job.keep == std::optional(std::chrono::milliseconds(std::chrono::minutes(1))));

    auto refusal = [&](schedule_spec bad) -> awaitable<std::string> {
      try {
        co_await book.add(std::move(bad));
      } catch (const std::invalid_argument& e) {
        co_return std::string(e.what());
      }
      co_return std::string("accepted");
    };
    auto bad = s;
    bad.name = "";
    auto said = co_await refusal(bad);
    CHECK(said == "schedule name '' must be 1 to 200 bytes");
    bad.name = "a|b";
    said = co_await refusal(bad);
    CHECK(said == "schedule name 'a|b' holds a '|'");
    bad = s;
    bad.catch_up = max_catch_up + 1;
    said = co_await refusal(bad);
    CHECK(said == "schedule 'nightly': catch_up 1001 is over the most, 1000");
    bad = s;
    bad.job.type = "";
    said = co_await refusal(bad);
    CHECK(said.find("type") != std::string::npos);
    CHECK((co_await book.list("", 10)).items.size() == 1);
  });
}
