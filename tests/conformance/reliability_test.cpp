// One suite, two backends: retries and failure policies, delayed jobs, dead letters, paused
// groups.
#include "conformance/conformance.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/detached.hpp>

#include <algorithm>

namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Due times are whole milliseconds of the system clock, runs are timed with the steady clock.
constexpr milliseconds slack{3};

// Fast, exact backoff for tests: 80 ms, then 160 ms, ...
worker_options quick_retries(const backends& b, std::size_t concurrency) {
  auto o = b.worker_opts(concurrency);
  o.retry_backoff = backoff{milliseconds(80), 2.0, milliseconds(1000), 0.0};
  return o;
}

// Runs of a handler: what ran, in order, with the attempt and when.
struct run_log {
  struct entry {
    std::string name;
    int attempt;
    clock_type::time_point at;
  };
  std::vector<entry> entries;
  void add(const job_context& c) {
    entries.push_back({std::string(c.payload().at("name").as_string()), c.attempt(), clock_type::now()});
  }
  std::string names() const {
    std::string out;
    for (auto& e : entries) out += (out.empty() ? "" : " ") + e.name + "#" + std::to_string(e.attempt);
    return out;
  }
};

job_spec named(std::string name, std::optional<std::string> group = "g") {
  return make_job("t", {{"name", std::move(name)}}, std::move(group));
}

}  // namespace

CONFORMANCE("hold: a failed job runs again after its backoff before anything after it in its group") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    std::vector<job_spec> specs{named("a"), named("b"), named("c"), named("other", "h")};
    co_await p.enqueue_bulk(std::move(specs));
    worker w(ctx.get_executor(), b.make(), quick_retries(b, 4));
    run_log log;
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      log.add(c);
      if (c.payload().at("name") == "a" && c.attempt() < 3) throw std::runtime_error("not yet");
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return log.entries.size() == 6; }));
    co_await w.stop(std::chrono::seconds(5));
    std::vector<std::string> group_g;
    const run_log::entry* first_a = nullptr;
    const run_log::entry* second_a = nullptr;
    const run_log::entry* third_a = nullptr;
    for (auto& e : log.entries) {
      if (e.name == "other") continue;
      group_g.push_back(e.name + "#" + std::to_string(e.attempt));
      if (e.name == "a") (e.attempt == 1 ? first_a : e.attempt == 2 ? second_a : third_a) = &e;
    }
    CHECK(fmt::format("{}", fmt::join(group_g, " ")) == "a#1 a#2 a#3 b#1 c#1");
    REQUIRE(first_a);
    REQUIRE(second_a);
    REQUIRE(third_a);
    CHECK(second_a->at - first_a->at >= milliseconds(80) - slack);
    CHECK(third_a->at - second_a->at >= milliseconds(160) - slack);
    auto c = w.counters();
    CHECK(c.retried == 2);
    CHECK(c.completed == 4);
    auto counts = co_await b.make().counts(b.queue());
    CHECK(counts.retried == 2);
    CHECK(counts.dead == 0);
    CHECK(counts.delayed == 0);
  });
}

CONFORMANCE("hold: out of attempts the job is dead-lettered and its group goes on") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    auto a = named("a");
    a.max_attempts = 2;
    a.id = "job-a";
    std::vector<job_spec> specs{a, named("b")};
    co_await p.enqueue_bulk(std::move(specs));
    worker w(ctx.get_executor(), b.make(), quick_retries(b, 2));
    run_log log;
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      log.add(c);
      if (c.payload().at("name") == "a") throw std::runtime_error("always fails");
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return log.entries.size() == 3; }));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(log.names() == "a#1 a#2 b#1");
    auto dead = co_await b.make().dead_letters(b.queue(), 0, 10);
    REQUIRE(dead.size() == 1);
    CHECK(dead[0].id == "job-a");
    CHECK(dead[0].group == "g");
    CHECK(dead[0].error == "always fails");
    CHECK(dead[0].record.starts_with("1|job-a|"));  // one failed attempt before the last
    // The id is free again: the job is no longer pending.
    auto again = co_await p.enqueue(a);
    CHECK_FALSE(again.duplicate);
  });
}

CONFORMANCE("skip: a failed grouped job goes to the dead letters at once and the group goes on") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer_options po;
    po.rules.add(
        {{{"type", "t"}}, "{name}", failure_policy::skip, std::nullopt, std::nullopt, std::nullopt, std::nullopt});
    producer p(b.make(), b.queue(), po);
    // Grouped by the rule: the group is the job's name; both in one group "x".
    auto first = make_job("t", {{"name", "x"}, {"n", 1}});
    auto second = make_job("t", {{"name", "x"}, {"n", 2}});
    std::vector<job_spec> specs{first, second};
    co_await p.enqueue_bulk(std::move(specs));
    worker w(ctx.get_executor(), b.make(), quick_retries(b, 2));
    std::vector<std::int64_t> ran;
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      ran.push_back(c.payload().at("n").as_int64());
      if (c.payload().at("n") == 1) throw std::runtime_error("bad data");
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return ran.size() == 2; }));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(ran == std::vector<std::int64_t>{1, 2});
    auto dead = co_await b.make().dead_letters(b.queue(), 0, 10);
    REQUIRE(dead.size() == 1);
    CHECK(dead[0].group == "x");
    CHECK(dead[0].error == "bad data");
    CHECK(w.counters().retried == 0);
  });
}

CONFORMANCE("halt: out of attempts the group stops until resumed and then goes on in order") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    auto a = named("a");
    a.max_attempts = 2;
    a.on_failure = failure_policy::halt;
    std::vector<job_spec> specs{a, named("b"), named("other", "h")};
    co_await p.enqueue_bulk(std::move(specs));
    worker w(ctx.get_executor(), b.make(), quick_retries(b, 2));
    run_log log;
    bool fix = false;
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      log.add(c);
      if (c.payload().at("name") == "a" && !fix) throw std::runtime_error("broken until fixed");
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return log.entries.size() == 3; }));
    co_await sleep_for(milliseconds(400));  // the group stays halted: b does not run
    std::string before = log.names();
    CHECK(before.find("b#") == std::string::npos);
    CHECK(before.find("other#1") != std::string::npos);
    auto paused = co_await b.make().paused_groups(b.queue());
    REQUIRE(paused.size() == 1);
    CHECK(paused[0].group == "g");
    CHECK(paused[0].halted);
    CHECK(paused[0].error == "broken until fixed");
    auto counts = co_await b.make().counts(b.queue());
    CHECK(counts.halted == 1);
    CHECK(counts.paused == 1);
    CHECK(counts.dead == 0);

    fix = true;
    CHECK(co_await b.make().resume(b.queue(), "g", resume_mode::retry));
    CHECK(co_await eventually([&] { return log.entries.size() == 5; }));
    co_await w.stop(std::chrono::seconds(5));
    auto n = log.entries.size();
    CHECK(log.entries[n - 2].name == "a");
    CHECK(log.entries[n - 2].attempt == 1);  // its attempts were reset
    CHECK(log.entries[n - 1].name == "b");
    CHECK((co_await b.make().paused_groups(b.queue())).empty());
    CHECK_FALSE(co_await b.make().resume(b.queue(), "g", resume_mode::retry));  // not paused any more
  });
}

CONFORMANCE("halt then resume with skip: the head job is dead-lettered and the rest runs") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    auto a = named("a");
    a.max_attempts = 1;
    a.on_failure = failure_policy::halt;
    a.id = "a-id";
    std::vector<job_spec> specs{a, named("b"), named("c")};
    co_await p.enqueue_bulk(std::move(specs));
    worker w(ctx.get_executor(), b.make(), quick_retries(b, 2));
    run_log log;
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      log.add(c);
      if (c.payload().at("name") == "a") throw std::runtime_error("poison");
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return log.entries.size() == 1; }));
    CHECK(
        co_await eventually([&]() -> awaitable<bool> { co_return (co_await b.make().counts(b.queue())).halted == 1; }));
    CHECK(co_await b.make().resume(b.queue(), "g", resume_mode::skip));
    CHECK(co_await eventually([&] { return log.entries.size() == 3; }));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(log.names() == "a#1 b#1 c#1");
    auto dead = co_await b.make().dead_letters(b.queue(), 0, 10);
    REQUIRE(dead.size() == 1);
    CHECK(dead[0].id == "a-id");
    CHECK(dead[0].error == "skipped by an operator after it halted its group: poison");
    CHECK(dead[0].record.starts_with("0|a-id|"));  // as its one run saw it: no attempt before
    CHECK(dead[0].runs == 1);
    CHECK_FALSE((co_await p.enqueue(a)).duplicate);  // its id was released
  });
}

CONFORMANCE("retry_after: the job runs again later with no attempt counted and keeps its place") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    std::vector<job_spec> specs{named("a"), named("b"), named("u", std::nullopt)};
    co_await p.enqueue_bulk(std::move(specs));
    worker w(ctx.get_executor(), b.make(), quick_retries(b, 4));
    run_log log;
    std::map<std::string, int> seen;
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      log.add(c);
      auto name = std::string(c.payload().at("name").as_string());
      if (seen[name]++ < 2 && name != "b") c.retry_after(milliseconds(150));
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return log.entries.size() == 7; }));
    co_await w.stop(std::chrono::seconds(5));
    std::vector<std::string> group_g;
    std::vector<clock_type::time_point> u_runs;
    for (auto& e : log.entries) {
      CHECK(e.attempt == 1);
      if (e.name == "u")
        u_runs.push_back(e.at);
      else
        group_g.push_back(e.name);
    }
    CHECK(fmt::format("{}", fmt::join(group_g, " ")) == "a a a b");
    REQUIRE(u_runs.size() == 3);
    CHECK(u_runs[1] - u_runs[0] >= milliseconds(150) - slack);
    CHECK(w.counters().deferred == 4);
    CHECK((co_await b.make().counts(b.queue())).deferred == 4);
  });
}

CONFORMANCE("ungrouped retries back off and count attempts") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    auto u = named("u", std::nullopt);
    u.retry_backoff = backoff{milliseconds(200), 1.0, milliseconds(200), 0.0};  // the job's own
    co_await p.enqueue(u);
    worker w(ctx.get_executor(), b.make(), quick_retries(b, 2));
    run_log log;
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      log.add(c);
      if (c.attempt() == 1) throw std::runtime_error("first time fails");
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return log.entries.size() == 2; }));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(log.names() == "u#1 u#2");
    CHECK(log.entries[1].at - log.entries[0].at >= milliseconds(200) - slack);
  });
}

CONFORMANCE("a job type's own backoff wins over the worker's, and a job's own over both") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    // Each fails its first run, in a group of its own (so they fail and retry side by side).
    auto typed = make_job("typed", {{"name", "typed"}}, "g1");
    auto own = make_job("typed", {{"name", "own"}}, "g2");
    own.retry_backoff = backoff{milliseconds(700), 1.0, milliseconds(700), 0.0};
    auto plain = make_job("plain", {{"name", "plain"}}, "g3");
    std::vector<job_spec> specs{typed, own, plain};
    co_await p.enqueue_bulk(std::move(specs));
    auto o = b.worker_opts(4);
    o.retry_backoff = backoff{milliseconds(1500), 2.0, milliseconds(10000), 0.0};  // the worker's default
    worker w(ctx.get_executor(), b.make(), o);
    run_log log;
    auto fail_first = [&](job_context& c) -> awaitable<void> {
      log.add(c);
      if (c.attempt() == 1) throw std::runtime_error("first run fails");
      co_return;
    };
    w.add_handler("typed", fail_first, backoff{milliseconds(100), 2.0, milliseconds(1000), 0.0});
    w.add_handler("plain", fail_first);
    w.start();
    CHECK(co_await eventually([&] { return log.entries.size() == 6; }, std::chrono::seconds(10)));
    co_await w.stop(std::chrono::seconds(5));
    std::map<std::string, std::vector<clock_type::time_point>> runs;
    for (auto& e : log.entries) {
      CHECK(e.attempt == static_cast<int>(runs[e.name].size()) + 1);
      runs[e.name].push_back(e.at);
    }
    auto gap = [&](const std::string& name) {
      REQUIRE(runs[name].size() == 2);
      return std::chrono::duration_cast<milliseconds>(runs[name][1] - runs[name][0]);
    };
    auto typed_gap = gap("typed"), own_gap = gap("own"), plain_gap = gap("plain");
    INFO("retry after " << typed_gap.count() << " ms (type), " << own_gap.count() << " ms (job), " << plain_gap.count()
                        << " ms (worker)");
    // The type's 100 ms, not the worker's 1500 ms (generous: a loaded machine may be slow to
    // start the retry, never early).
    CHECK(typed_gap >= milliseconds(100) - slack);
    CHECK(typed_gap < milliseconds(1000));
    // The job's own 700 ms wins over its type's 100 ms.
    CHECK(own_gap >= milliseconds(700) - slack);
    CHECK(own_gap < milliseconds(1400));
    // A type without a backoff of its own gets the worker's.
    CHECK(plain_gap >= milliseconds(1500) - slack);
    CHECK(w.counters().retried == 3);
    CHECK(w.counters().completed == 3);
  });
}

CONFORMANCE("delayed jobs run when due and an earlier one wakes the promoter") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    worker w(ctx.get_executor(), b.make(), b.worker_opts(4));
    run_log log;
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      log.add(c);
      co_return;
    });
    w.start();
    co_await sleep_for(milliseconds(100));  // the promoter now sleeps: nothing is delayed
    auto late = named("late", std::nullopt);
    late.delay = std::chrono::seconds(30);
    co_await p.enqueue(late);  // the promoter arms its timer for 30 s...
    co_await sleep_for(milliseconds(50));
    auto start = clock_type::now();
    auto soon = named("soon", std::nullopt);
    soon.delay = milliseconds(600);
    auto grouped = named("grouped");  // joins group g when due, behind what g has then
    grouped.delay = milliseconds(600);
    auto now_in_g = named("now");
    auto past = named("past", std::nullopt);
    past.run_at = std::chrono::system_clock::now() - std::chrono::seconds(5);
    std::vector<job_spec> specs{soon, grouped, now_in_g, past};
    co_await p.enqueue_bulk(std::move(specs));  // ...and is woken for one due in 600 ms
    CHECK((co_await b.make().counts(b.queue())).delayed == 3);
    CHECK(co_await eventually([&] { return log.entries.size() == 4; }, std::chrono::seconds(5)));
    co_await w.stop(std::chrono::seconds(5));
    std::map<std::string, clock_type::duration> when;
    for (auto& e : log.entries) when[e.name] = e.at - start;
    CHECK(when.count("late") == 0);
    // (Those due now run long before those due in 600 ms, with room for a loaded ASan run:
    // a sharded cluster's bulk enqueue and pickup took 330 ms there.)
    CHECK(when["now"] < milliseconds(500));
    CHECK(when["past"] < milliseconds(500));
    CHECK(when["soon"] >= milliseconds(600) - slack);
    CHECK(when["soon"] < milliseconds(1800));
    CHECK(when["grouped"] >= milliseconds(600) - slack);
    CHECK(w.counters().promoted == 2);
    CHECK((co_await b.make().counts(b.queue())).delayed == 1);
  });
}

CONFORMANCE("grouped jobs due at the same time join their group in enqueue order") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    // The ids sort against enqueue order: the order must come from enqueueing, not from the ids.
    auto due = std::chrono::system_clock::now() + milliseconds(300);
    std::vector<job_spec> first, second;
    for (int i = 9; i >= 5; --i) {
      auto s = named(fmt::format("k{}", i));
      s.id = fmt::format("k{}", i);
      s.run_at = due;
      (i >= 7 ? first : second).push_back(std::move(s));
    }
    co_await p.enqueue_bulk(std::move(first));
    co_await p.enqueue_bulk(std::move(second));
    auto last = named("a0");  // a third call, the smallest id of all
    last.id = "a0";
    last.run_at = due;
    co_await p.enqueue(last);
    worker w(ctx.get_executor(), b.make(), b.worker_opts(4));
    run_log log;
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      log.add(c);
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return log.entries.size() == 6; }, std::chrono::seconds(5)));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(log.names() == "k9#1 k8#1 k7#1 k6#1 k5#1 a0#1");
  });
}

CONFORMANCE("a dead letter never replaces another: a producer-given id that fails again gets a key of its own") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    claim_options co{"w", 10, std::chrono::seconds(30)};
    std::vector<std::string> fences;
    for (int round = 0; round < 2; ++round) {  // the same id, enqueued again once the first has failed
      auto s = named(fmt::format("run{}", round), std::nullopt);
      s.id = "same";
      s.max_attempts = 1;
      CHECK_FALSE((co_await p.enqueue(s)).duplicate);
      auto claimed = co_await store.claim(b.queue(), co);
      REQUIRE(claimed.size() == 1);
      fences.push_back(std::to_string(claimed[0].fence));
      std::vector<finish_item> items(1);
      items[0].token = claimed[0].token;
      items[0].kind = finish_kind::fail;
      items[0].error = fmt::format("failure {}", round);
      items[0].unique_id = "same";
      CHECK((co_await store.finish(b.queue(), "w", std::move(items), std::chrono::seconds(30))).at(0).lease_held);
    }
    auto all = co_await store.dead_letters(b.queue(), 0, 10);
    REQUIRE(all.size() == 2);
    CHECK(all[0].id == "same");
    CHECK(all[0].error == "failure 0");
    CHECK(all[0].record.find("run0") != std::string::npos);
    CHECK(all[1].id == "same#" + fences[1]);
    CHECK(all[1].error == "failure 1");
    CHECK(all[1].record.find("run1") != std::string::npos);
    // Requeued by its key, the second takes the id back: a third enqueue of it is a duplicate.
    std::vector<std::string> second{all[1].id};
    CHECK(co_await store.requeue(b.queue(), second, false) == second);
    auto again = named("run2", std::nullopt);
    again.id = "same";
    CHECK((co_await p.enqueue(again)).duplicate);
    std::vector<std::string> first{"same"};
    CHECK((co_await store.requeue(b.queue(), first, false)).empty());  // its id is taken
    auto claimed = co_await store.claim(b.queue(), co);
    REQUIRE(claimed.size() == 1);
    CHECK(claimed[0].job.body.find("run1") != std::string::npos);
    CHECK((co_await store.dead_letters(b.queue(), 0, 10)).size() == 1);
  });
}

CONFORMANCE("dead letters: list, show, requeue to the tail or the head, purge, retention") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    std::vector<job_spec> specs;
    // (Sharded, d3 and d4 are in g's shard: the count limit of dead letters is each shard's share.)
    auto d3_id = beside(kind, "d3", "g"), d4_id = beside(kind, "d4", "g");
    for (int i = 0; i < 5; ++i) {
      auto s = named(fmt::format("d{}", i), i < 3 ? std::optional<std::string>("g") : std::nullopt);
      s.id = i == 3 ? d3_id : i == 4 ? d4_id : fmt::format("d{}", i);
      s.max_attempts = 1;
      specs.push_back(s);
    }
    co_await p.enqueue_bulk(std::move(specs));
    claim_options co{"w", 10, std::chrono::seconds(30)};
    std::vector<finish_item> fails;
    for (int round = 0; round < 3; ++round) {  // group g gives one job per claim
      auto claimed = co_await store.claim(b.queue(), co);
      for (auto& j : claimed) {
        finish_item f;
        f.token = j.token;
        f.kind = finish_kind::fail;
        f.error = "e";
        f.unique_id = j.job.id;
        std::vector<finish_item> items(1, f);
        auto done = co_await store.finish(b.queue(), "w", std::move(items), std::chrono::seconds(30));
        CHECK(done.at(0).lease_held);
      }
    }
    auto all = co_await store.dead_letters(b.queue(), 0, 100);
    CHECK(all.size() == 5);
    CHECK((co_await store.dead_letters(b.queue(), 1, 2)).size() == 2);
    auto one = co_await store.dead_letter_of(b.queue(), "d1");
    REQUIRE(one);
    CHECK(one->group == "g");
    CHECK_FALSE(co_await store.dead_letter_of(b.queue(), "nope"));

    // Group g has a pending job now; d1 requeued to the head runs next after it, d0 to the tail last.
    auto pending = named("pending");
    co_await p.enqueue(pending);
    std::vector<std::string> to_head{"d1"}, to_tail{"d0", "missing"}, d2{"d2"}, d3{d3_id};
    auto head = co_await store.requeue(b.queue(), to_head, true);
    auto tail = co_await store.requeue(b.queue(), to_tail, false);
    CHECK(head == std::vector<std::string>{"d1"});
    CHECK(tail == std::vector<std::string>{"d0"});
    CHECK((co_await p.enqueue(named("x"))).duplicate == false);
    auto dup = named("dup");
    dup.id = "d2";
    CHECK_FALSE((co_await p.enqueue(dup)).duplicate);               // d2's id is free while it is dead
    CHECK((co_await store.requeue(b.queue(), d2, false)).empty());  // ...and then taken
    std::vector<std::string> order;
    claim_options one_at_a_time{"w", 1, std::chrono::seconds(30)};
    for (int i = 0; i < 6; ++i) {
      auto got = co_await store.claim(b.queue(), one_at_a_time);
      if (got.empty()) break;
      auto job = got[0];
      order.push_back(fmt::format("{}:{}|{}", job.group, job.job.attempts, job.job.id));
      std::vector<finish_item> ack(1);
      ack[0].token = job.token;
      co_await store.finish(b.queue(), "w", std::move(ack), std::chrono::seconds(30));
    }
    // All in group g: 'pending' (id 1), d1 (requeued to run next after the head), d0 (to the
    // tail), x (id 2), and the newcomer with d2's id.
    REQUIRE(order.size() == 5);
    CHECK(order[0] == "g:0|" + assigned_id(kind, 1, "g"));
    CHECK(order[1] == "g:0|d1");
    CHECK(order[2] == "g:0|d0");
    CHECK(order[3] == "g:0|" + assigned_id(kind, 2, "g"));
    CHECK(order[4] == "g:0|d2");

    CHECK(co_await store.purge(b.queue(), d3) == 1);
    CHECK((co_await store.dead_letters(b.queue(), 0, 100)).size() == 2);  // d2 and d4
    reap_options keep_one;
    keep_one.dead_max_count = 1;
    auto r = co_await store.reap(b.queue(), keep_one);
    CHECK(r.dead_removed == 1);
    auto left = co_await store.dead_letters(b.queue(), 0, 100);
    REQUIRE(left.size() == 1);
    reap_options by_age;
    by_age.dead_max_age = milliseconds(1);
    co_await sleep_for(milliseconds(5));
    CHECK((co_await store.reap(b.queue(), by_age)).dead_removed == 1);
    CHECK(co_await store.purge(b.queue(), std::vector<std::string>()) == 0);
  });
}

CONFORMANCE("requeue by a producer's id brings back every job dead under it (sharded: in groups of two shards)") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    // A second group in another shard: there the id is free, as ids are kept shard by shard.
    std::string other = "h";
    for (int i = 1; sharded(kind) && sharded_backend::shard_of(other, shards_of(kind)) ==
                                         sharded_backend::shard_of("g", shards_of(kind));
         ++i)
      other = fmt::format("h{}", i);
    std::size_t stored = 0;
    std::vector<std::string> groups{"g", other};
    for (const auto& group : groups) {
      auto s = named("twin", group);
      s.id = "twin";
      s.max_attempts = 1;
      if (!(co_await p.enqueue(s)).duplicate) ++stored;
    }
    CHECK(stored == (sharded(kind) ? 2u : 1u));
    claim_options co{"w", 10, std::chrono::seconds(30)};
    std::size_t failed = 0;
    for (int round = 0; round < 20 && failed < stored; ++round) {  // (sharded claims: in no set order)
      auto claimed = co_await store.claim(b.queue(), co);
      for (auto& j : claimed) {
        std::vector<finish_item> items(1);
        items[0].token = j.token;
        items[0].kind = finish_kind::fail;
        items[0].error = "e";
        items[0].unique_id = j.job.id;
        CHECK((co_await store.finish(b.queue(), "w", std::move(items), std::chrono::seconds(30))).at(0).lease_held);
        ++failed;
      }
    }
    REQUIRE(failed == stored);
    REQUIRE((co_await store.dead_letters(b.queue(), 0, 10)).size() == stored);
    std::vector<std::string> twin{"twin"};
    CHECK(co_await store.requeue(b.queue(), twin, false) == twin);  // the key once, however many came back
    CHECK((co_await store.dead_letters(b.queue(), 0, 10)).empty());
    CHECK((co_await store.counts(b.queue())).dead == 0);
    std::size_t back = 0;
    for (int round = 0; round < 20 && back < stored; ++round) back += (co_await store.claim(b.queue(), co)).size();
    CHECK(back == stored);
  });
}

CONFORMANCE("dead letters by page: the pages put together are the whole list, oldest first (sharded: merged)") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    constexpr std::size_t total = 30;
    std::vector<job_spec> specs;
    for (std::size_t i = 0; i < total; ++i) {  // (ungrouped: over every shard)
      auto s = named(fmt::format("d{}", i), std::nullopt);
      s.max_attempts = 1;
      specs.push_back(s);
    }
    co_await p.enqueue_bulk(std::move(specs));
    claim_options co{"w", 4, std::chrono::seconds(30)};  // (a few a call: letters of several times)
    std::size_t failed = 0;
    for (int round = 0; round < 100 && failed < total; ++round) {
      std::vector<finish_item> items;
      for (auto& j : co_await store.claim(b.queue(), co)) {
        finish_item f;
        f.token = j.token;
        f.kind = finish_kind::fail;
        f.error = "e";
        f.unique_id = j.job.id;
        items.push_back(std::move(f));
      }
      failed += items.size();
      if (!items.empty()) co_await store.finish(b.queue(), "w", std::move(items), std::chrono::seconds(30));
      asio::steady_timer t(ctx, std::chrono::milliseconds(2));
      co_await t.async_wait(asio::use_awaitable);
    }
    REQUIRE(failed == total);
    auto all = co_await store.dead_letters(b.queue(), 0, 100);
    REQUIRE(all.size() == total);
    CHECK(std::is_sorted(all.begin(), all.end(),
                         [](const dead_letter& x, const dead_letter& y) { return x.at_ms < y.at_ms; }));
    std::vector<std::string> whole, paged;
    for (auto& d : all) whole.push_back(d.id);
    for (std::size_t offset = 0; offset < total + 4; offset += 4)
      for (auto& d : co_await store.dead_letters(b.queue(), offset, 4)) paged.push_back(d.id);
    CHECK(paged == whole);
    CHECK((co_await store.dead_letters(b.queue(), total - 1, 10)).size() == 1);
    CHECK((co_await store.dead_letters(b.queue(), total, 10)).empty());
    CHECK((co_await store.dead_letters(b.queue(), 3, 0)).empty());
  });
}

CONFORMANCE("a dead letter never overwrites another, even one whose id looks like '<id>#<fence>'") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    claim_options one{"w", 1, std::chrono::seconds(30)};
    auto fail_next = [&]() -> awaitable<std::int64_t> {  // returns the lease's fence
      auto got = co_await store.claim(b.queue(), one);
      REQUIRE(got.size() == 1);
      std::vector<finish_item> fail(1);
      fail[0].token = got[0].token;
      fail[0].kind = finish_kind::fail;
      fail[0].error = "e";
      fail[0].unique_id = got[0].job.id;
      co_await store.finish(b.queue(), "w", std::move(fail), std::chrono::seconds(30));
      co_return got[0].fence;
    };
    auto x = named("x", std::nullopt);
    x.id = "x";
    co_await p.enqueue(x);
    auto fence = co_await fail_next();  // dead letter "x"
    // The next two leases get fence + 1 and fence + 2: a job whose id is what the second x's
    // dead letter would be keyed by, then x again.
    // (Sharded, fences are a shard's: the look-alike goes to x's shard, in a group there.)
    auto lookalike =
        named("lookalike", sharded(kind) ? std::optional<std::string>(beside(kind, "l", "x")) : std::nullopt);
    lookalike.id = fmt::format("x#{}", fence + 2);
    co_await p.enqueue(lookalike);
    co_await p.enqueue(x);
    CHECK(co_await fail_next() == fence + 1);
    CHECK(co_await fail_next() == fence + 2);
    CHECK((co_await store.dead_letters(b.queue(), 0, 10)).size() == 3);
    auto kept = co_await store.dead_letter_of(b.queue(), lookalike.id);
    REQUIRE(kept);
    CHECK(kept->record.find("lookalike") != std::string::npos);
  });
}

CONFORMANCE("dead letters requeued to the head together run in the order given, grouped and ungrouped") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    std::vector<job_spec> specs;
    std::vector<std::string> keys;  // (sharded, the ungrouped ones are in g's shard: order is a shard's)
    for (std::string id : {"a0", "a1", "b0", "b1"}) {
      auto s = named(id, id[0] == 'a' ? std::optional<std::string>("g") : std::nullopt);
      s.id = id[0] == 'a' ? id : beside(kind, id, "g");
      s.max_attempts = 1;
      keys.push_back(s.id);
      specs.push_back(s);
    }
    co_await p.enqueue_bulk(std::move(specs));
    claim_options co{"w", 10, std::chrono::seconds(30)};
    for (int round = 0; round < 2; ++round) {  // group g gives one job per claim
      for (auto& j : co_await store.claim(b.queue(), co)) {
        std::vector<finish_item> fail(1);
        fail[0].token = j.token;
        fail[0].kind = finish_kind::fail;
        fail[0].error = "e";
        fail[0].unique_id = j.job.id;
        co_await store.finish(b.queue(), "w", std::move(fail), std::chrono::seconds(30));
      }
    }
    REQUIRE((co_await store.dead_letters(b.queue(), 0, 10)).size() == 4);
    co_await p.enqueue(named("head", std::optional<std::string>("g")));  // the group's head
    auto loose = named("loose", std::nullopt);
    if (sharded(kind)) loose.id = beside(kind, "loose", "g");
    co_await p.enqueue(loose);
    CHECK(co_await store.requeue(b.queue(), keys, true) == keys);
    std::vector<std::string> order;
    claim_options one_at_a_time{"w", 1, std::chrono::seconds(30)};
    for (int i = 0; i < 7; ++i) {
      auto got = co_await store.claim(b.queue(), one_at_a_time);
      if (got.empty()) break;
      auto& record = got[0].job.body;  // its payload is {"name": ...}
      auto name = record.find("\"name\":\"") + 8;
      order.push_back(record.substr(name, record.find('"', name) - name));
      std::vector<finish_item> ack(1);
      ack[0].token = got[0].token;
      co_await store.finish(b.queue(), "w", std::move(ack), std::chrono::seconds(30));
    }
    auto seen = fmt::format("{}", fmt::join(order, " "));
    CAPTURE(seen);
    REQUIRE(order.size() == 6);
    auto at = [&](const std::string& name) { return std::find(order.begin(), order.end(), name) - order.begin(); };
    CHECK(at("b0") < at("b1"));  // at the head of the ready list, in the order given
    CHECK(at("b1") < at("loose"));
    CHECK(at("head") < at("a0"));  // next in their group, behind its head, in the order given
    CHECK(at("a0") < at("a1"));
  });
}

CONFORMANCE("pause and resume a group: nothing of it starts while paused") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    std::vector<job_spec> specs{named("a"), named("b"), named("o", "other")};
    co_await p.enqueue_bulk(std::move(specs));
    CHECK(co_await b.make().pause(b.queue(), "g"));
    CHECK_FALSE(co_await b.make().pause(b.queue(), "g"));
    worker w(ctx.get_executor(), b.make(), b.worker_opts(2));
    run_log log;
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      log.add(c);
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return log.entries.size() == 1; }));
    co_await sleep_for(milliseconds(300));
    CHECK(log.names() == "o#1");
    CHECK(co_await b.make().resume(b.queue(), "g", resume_mode::retry));
    CHECK(co_await eventually([&] { return log.entries.size() == 3; }));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(log.names() == "o#1 a#1 b#1");
  });
}

CONFORMANCE("resume with skip while the group's head job runs is refused with errc::group_busy") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    std::vector<job_spec> specs{named("a"), named("b")};
    co_await p.enqueue_bulk(std::move(specs));
    claim_options co{"w", 1, std::chrono::seconds(30)};
    auto running = co_await store.claim(b.queue(), co);
    REQUIRE(running.size() == 1);
    CHECK(co_await store.pause(b.queue(), "g"));
    boost::system::error_code code;
    std::string what;
    try {
      co_await store.resume(b.queue(), "g", resume_mode::skip);
    } catch (const boost::system::system_error& e) {
      code = e.code();
      what = e.what();
    }
    CHECK(code == errc::group_busy);
    CHECK_MESSAGE(what.starts_with("group 'g' is running or waiting to run"), what);
    CHECK((co_await store.paused_groups(b.queue())).size() == 1);  // nothing changed
    std::vector<finish_item> ack(1);
    ack[0].token = running[0].token;
    CHECK((co_await store.finish(b.queue(), "w", std::move(ack), std::chrono::seconds(30))).at(0).lease_held);
    CHECK(co_await store.resume(b.queue(), "g", resume_mode::skip));  // parked now: b is skipped
    auto dead = co_await store.dead_letters(b.queue(), 0, 10);
    REQUIRE(dead.size() == 1);
    CHECK(dead[0].error == "skipped by an operator");
  });
}

CONFORMANCE("resume with skip of a paused group: its dead letter counts the runs its job had, none since") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    // g: a fails once, then g is paused during a's backoff. h: paused before anything ran.
    std::vector<job_spec> specs{named("a"), named("b"), named("c", "h"), named("o", "other")};
    co_await p.enqueue_bulk(std::move(specs));
    CHECK(co_await b.make().pause(b.queue(), "h"));
    auto o = b.worker_opts(2);
    o.retry_backoff = backoff{milliseconds(200), 2.0, milliseconds(1000), 0.0};
    worker w(ctx.get_executor(), b.make(), o);
    run_log log;
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      log.add(c);
      if (c.payload().at("name") == "a") throw std::runtime_error("fails");
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return w.counters().retried == 1; }));
    CHECK(co_await b.make().pause(b.queue(), "g"));
    co_await sleep_for(milliseconds(600));  // a's retry came due: parked, as h's lane was
    CHECK(log.entries.size() == 2);         // a#1 and o#1, in either order
    CHECK(co_await b.make().resume(b.queue(), "g", resume_mode::skip));
    CHECK(co_await b.make().resume(b.queue(), "h", resume_mode::skip));
    CHECK(co_await eventually([&] { return log.entries.size() == 3; }));
    co_await sleep_for(milliseconds(100));
    co_await w.stop(std::chrono::seconds(5));
    REQUIRE(log.entries.size() == 3);
    CHECK(log.entries[2].name == "b");  // c never ran
    CHECK(log.entries[2].attempt == 1);
    auto dead = co_await b.make().dead_letters(b.queue(), 0, 10);
    REQUIRE(dead.size() == 2);
    std::sort(dead.begin(), dead.end(), [](auto& x, auto& y) { return x.group < y.group; });
    CHECK(dead[0].group == "g");
    CHECK(dead[0].error == "skipped by an operator");
    CHECK(dead[0].runs == 1);  // its failed run (the header counts it), none since
    CHECK(dead[0].record.starts_with("1|"));
    CHECK(dead[1].group == "h");
    CHECK(dead[1].runs == 0);  // it never ran
    CHECK(dead[1].record.starts_with("0|"));
  });
}

CONFORMANCE("pause and resume during a retry's backoff keep the backoff") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    std::vector<job_spec> specs{named("a"), named("b")};
    co_await p.enqueue_bulk(std::move(specs));
    auto o = b.worker_opts(2);
    o.retry_backoff = backoff{milliseconds(800), 2.0, milliseconds(1000), 0.0};
    worker w(ctx.get_executor(), b.make(), o);
    run_log log;
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      log.add(c);
      if (c.attempt() == 1 && c.payload().at("name") == "a") throw std::runtime_error("first time fails");
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return log.entries.size() == 1; }));
    CHECK(co_await eventually([&] { return w.counters().retried == 1; }));
    // The group's lane waits for the backoff: a pause and a resume now must not cut it short.
    CHECK(co_await b.make().pause(b.queue(), "g"));
    CHECK(co_await b.make().resume(b.queue(), "g", resume_mode::retry));
    CHECK(co_await eventually([&] { return log.entries.size() == 3; }, std::chrono::seconds(5)));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(log.names() == "a#1 a#2 b#1");
    CHECK(log.entries[1].at - log.entries[0].at >= milliseconds(800) - slack);
    CHECK((co_await b.make().check(b.queue(), false)).problems.empty());
  });
}

CONFORMANCE("a group paused during a retry's backoff stays parked when the retry comes due") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    std::vector<job_spec> specs{named("a"), named("b")};
    co_await p.enqueue_bulk(std::move(specs));
    auto o = b.worker_opts(2);
    o.retry_backoff = backoff{milliseconds(200), 2.0, milliseconds(1000), 0.0};
    worker w(ctx.get_executor(), b.make(), o);
    run_log log;
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      log.add(c);
      if (c.attempt() == 1 && c.payload().at("name") == "a") throw std::runtime_error("first time fails");
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return w.counters().retried == 1; }));
    CHECK(co_await b.make().pause(b.queue(), "g"));
    co_await sleep_for(milliseconds(600));  // the retry came due meanwhile: parked, not run
    CHECK(log.names() == "a#1");
    CHECK((co_await b.make().check(b.queue(), false)).problems.empty());
    CHECK(co_await b.make().resume(b.queue(), "g", resume_mode::retry));
    CHECK(co_await eventually([&] { return log.entries.size() == 3; }, std::chrono::seconds(5)));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(log.names() == "a#1 a#2 b#1");
  });
}

CONFORMANCE("a retry whose group is paused meanwhile keeps its backoff when the group is resumed") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    co_await p.enqueue(named("a"));
    claim_options co{"w", 1, std::chrono::seconds(30)};
    auto retry = [&](const claimed_job& j, milliseconds backoff) -> awaitable<void> {
      std::vector<finish_item> items(1);
      items[0].token = j.token;
      items[0].kind = finish_kind::retry;
      items[0].delay = backoff;
      co_await store.finish(b.queue(), "w", std::move(items), std::chrono::seconds(30));
    };
    auto running = co_await store.claim(b.queue(), co);
    REQUIRE(running.size() == 1);
    CHECK(co_await store.pause(b.queue(), "g"));  // while a runs
    co_await retry(running[0], milliseconds(400));
    CHECK(co_await store.resume(b.queue(), "g", resume_mode::retry));
    CHECK((co_await store.claim(b.queue(), co)).empty());  // not before its backoff
    co_await sleep_for(milliseconds(450));
    co_await store.promote(b.queue(), 100);
    auto again = co_await store.claim(b.queue(), co);
    REQUIRE(again.size() == 1);
    CHECK(again[0].job.attempts == 1);  // its second attempt

    // Paused while its retry waits, and due meanwhile: promote parks the lane.
    co_await retry(again[0], milliseconds(50));
    CHECK(co_await store.pause(b.queue(), "g"));
    co_await sleep_for(milliseconds(100));
    co_await store.promote(b.queue(), 100);
    CHECK((co_await store.claim(b.queue(), co)).empty());
    CHECK(co_await store.resume(b.queue(), "g", resume_mode::retry));
    CHECK((co_await store.claim(b.queue(), co)).size() == 1);
  });
}

CONFORMANCE("check finds nothing wrong in a queue in every state") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    std::vector<job_spec> specs{named("a"), named("b"), named("c", "h"), named("d", "paused"),
                                named("u", std::nullopt)};
    specs[4].id = "unique-u";
    auto later = named("later", "g2");
    later.delay = std::chrono::seconds(60);
    specs.push_back(later);
    co_await p.enqueue_bulk(std::move(specs));
    CHECK(co_await store.pause(b.queue(), "paused"));
    claim_options co{"w", 2, std::chrono::seconds(30)};
    auto running = co_await store.claim(b.queue(), co);  // g and h run
    REQUIRE(running.size() == 2);
    std::vector<finish_item> retry(1);
    retry[0].token = running[1].token;
    retry[0].kind = finish_kind::retry;
    retry[0].delay = std::chrono::seconds(60);  // h waits for its retry
    co_await store.finish(b.queue(), "w", std::move(retry), std::chrono::seconds(30));
    co_await store.extend(b.queue(), "w", std::vector<std::string>(), std::chrono::seconds(30));

    auto report = co_await store.check(b.queue(), false);
    for (auto& line : report.problems) MESSAGE(line);
    CHECK(report.problems.empty());
    CHECK(report.groups == 3);  // g, h, paused (g2's job is delayed, not in its group yet)
    CHECK((co_await store.counts(b.queue())).groups == 3);
    CHECK(report.jobs == 6);
    CHECK(report.stuck_groups == 0);
    CHECK(report.oldest_enqueued_ms > 0);
    CHECK((co_await store.check(b.queue(), true)).repaired == 0);
  });
}

CONFORMANCE("a payload the handler cannot parse is dead-lettered at once and the worker goes on") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    auto bad = make_job("parse", {{"qty", "not a number"}}, "g");
    auto good = make_job("parse", {{"qty", 3}}, "g");
    std::vector<job_spec> specs{bad, good};
    co_await p.enqueue_bulk(std::move(specs));
    worker w(ctx.get_executor(), b.make(), quick_retries(b, 2));
    int runs = 0, parsed = 0;
    w.add_handler("parse", [&](job_context& c) -> awaitable<void> {
      ++runs;
      const auto* qty = c.payload().as_object().if_contains("qty");
      if (!qty || !qty->is_int64()) throw permanent_failure("payload.qty is not an integer");
      ++parsed;
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return parsed == 1; }));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(runs == 2);  // no retry of the bad one
    auto dead = co_await b.make().dead_letters(b.queue(), 0, 10);
    REQUIRE(dead.size() == 1);
    CHECK(dead[0].error == "payload.qty is not an integer");
    CHECK(w.counters().retried == 0);
  });
}

CONFORMANCE("a worker started again under its id gets its previous leases back at once") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    std::vector<job_spec> specs{named("a"), named("u", std::nullopt)};
    co_await p.enqueue_bulk(std::move(specs));
    // The previous run of worker "same" leased both for 30 s, told its heartbeat, and died.
    claim_options co{"same", 2, std::chrono::seconds(30)};
    auto held = co_await store.claim(b.queue(), co);
    REQUIRE(held.size() == 2);
    std::vector<std::string> tokens{held[0].token, held[1].token};
    co_await store.extend(b.queue(), "same", std::move(tokens), std::chrono::seconds(30));

    auto o = b.worker_opts(4);
    o.id = "same";
    o.lease_ttl = std::chrono::seconds(30);
    worker w(ctx.get_executor(), b.make(), o);
    run_log log;
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      log.add(c);
      co_return;
    });
    auto start = clock_type::now();
    w.start();
    CHECK(co_await eventually([&] { return log.entries.size() == 2; }, std::chrono::seconds(5)));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(clock_type::now() - start < std::chrono::seconds(5));  // not the 30 s TTL
    for (auto& e : log.entries) CHECK(e.attempt == 2);           // the lost run counted
    CHECK((co_await b.make().counts(b.queue())).recovered == 2);
    CHECK(w.metrics().by_type["t"].recovered == 2);  // this worker's reaper sent them back
  });
}

CONFORMANCE("a mixed fleet: a worker hands back the jobs it has no handler for, and every job runs where it can") {
  run(
      [kind](asio::io_context& ctx) -> awaitable<void> {
        backends b(ctx, kind);
        // Worker a runs only type a, worker b only type b (a rolling deploy, two services on one
        // queue). Groups mix the two types: order must hold across the hand-backs.
        std::map<std::string, std::vector<std::int64_t>> order;  // by group
        std::map<std::string, int> ran;                          // by job id
        int wrong = 0, done = 0;
        auto handler_for = [&](std::string type) {
          return [&, type](job_context& c) -> awaitable<void> {
            if (c.job().type != type) ++wrong;
            ++ran[c.id()];
            if (!c.group().empty()) order[c.group()].push_back(c.payload().at("n").as_int64());
            ++done;
            co_return;
          };
        };
        std::vector<std::unique_ptr<worker>> workers;
        for (std::string type : {"a", "b"}) {
          auto o = b.worker_opts(8);
          o.unhandled_delay = std::chrono::milliseconds(20);
          o.reap_period = std::chrono::milliseconds(50);
          workers.push_back(std::make_unique<worker>(ctx.get_executor(), b.make(), o));
          workers.back()->add_handler(type, handler_for(type));
          workers.back()->start();
        }
        producer p(b.make(), b.queue());
        std::vector<job_spec> specs;
        constexpr int jobs = 400;
        for (int n = 0; n < jobs; ++n) {
          std::optional<std::string> group;
          if (n % 2 == 0) group = fmt::format("g{}", n % 10);
          specs.push_back(make_job(n % 3 == 0 ? "a" : "b", {{"n", n}}, group));
        }
        co_await p.enqueue_bulk(std::move(specs));
        CHECK(co_await eventually([&] { return done >= jobs; }, std::chrono::seconds(60)));
        for (auto& w : workers) co_await w->stop(std::chrono::seconds(5));
        CHECK(done == jobs);
        CHECK(wrong == 0);
        int twice = 0;
        for (auto& [id, n] : ran) twice += n != 1;
        CHECK(twice == 0);
        for (auto& [group, seen] : order) CHECK_MESSAGE(std::is_sorted(seen.begin(), seen.end()), group);
        auto counts = co_await b.make().counts(b.queue());
        CHECK(counts.dead == 0);
        CHECK(counts.started == jobs);  // a hand-back is no start
        CHECK(counts.completed == jobs);
        CHECK(counts.retried == 0);
        auto handed = workers[0]->counters().unhandled + workers[1]->counters().unhandled;
        CHECK(counts.unhandled == static_cast<std::int64_t>(handed));
        MESSAGE("handed back: " << handed);
      },
      std::chrono::seconds(90));
}

CONFORMANCE("a job no worker can run is dead-lettered once no worker has run its type for unhandled_limit") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto o = b.worker_opts(4);
    o.unhandled_delay = std::chrono::milliseconds(20);
    o.unhandled_limit = std::chrono::milliseconds(1000);  // (room for hand-backs on a slow ASan run)
    o.reap_period = std::chrono::milliseconds(50);
    worker w(ctx.get_executor(), b.make(), o);
    w.add_handler("known", [](job_context&) -> awaitable<void> { co_return; });
    w.start();
    producer p(b.make(), b.queue());
    auto started = std::chrono::steady_clock::now();
    co_await p.enqueue(make_job("unknown", {}, "g"));
    co_await p.enqueue(make_job("known", {}, "g"));  // behind it in its group: waits for it
    CHECK(co_await eventually([&] { return w.counters().completed == 1; }, std::chrono::seconds(10)));
    auto waited = std::chrono::steady_clock::now() - started;
    CHECK(waited >= std::chrono::milliseconds(1000));  // not before the limit
    CHECK(w.counters().unhandled >= 2);                // handed back meanwhile
    co_await w.stop(std::chrono::seconds(5));
    auto dead = co_await b.make().dead_letters(b.queue(), 0, 10);
    REQUIRE(dead.size() == 1);
    CHECK(dead[0].group == "g");
    CHECK(dead[0].error.starts_with("no handler for type unknown: no worker has been able to run it for"));
  });
}

CONFORMANCE("a forced stop does not give a handler that ignores cancellation the first stop's grace again") {
  run(
      [kind](asio::io_context& ctx) -> awaitable<void> {
        backends b(ctx, kind);
        worker w(ctx.get_executor(), b.make(), b.worker_opts(1));
        bool running = false;
        w.add_handler("deaf", [&](job_context&) -> awaitable<void> {
          running = true;
          asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::seconds(20));
          // Bound to no slot: the stop's cancellation does not reach this wait.
          co_await t.async_wait(asio::bind_cancellation_slot(asio::cancellation_slot(), asio::as_tuple(use_awaitable)));
        });
        w.start();
        producer p(b.make(), b.queue());
        co_await p.enqueue(make_job("deaf", {}));
        CHECK(co_await eventually([&] { return running; }));
        asio::co_spawn(ctx, w.stop(std::chrono::minutes(1)), asio::detached);
        CHECK(co_await eventually([&] { return w.state() == worker_state::draining; }));  // in its grace
        auto forced = std::chrono::steady_clock::now();
        co_await w.stop(std::chrono::milliseconds(0));
        // One second for handlers that ignore cancellation, not the first stop's minute.
        CHECK(std::chrono::steady_clock::now() - forced < std::chrono::seconds(5));
      },
      std::chrono::seconds(40));
}

CONFORMANCE("a second stop with a shorter grace cuts the stop under way short: running jobs are handed back") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    worker w(ctx.get_executor(), b.make(), b.worker_opts(2));
    bool running = false;
    w.add_handler("long", [&](job_context&) -> awaitable<void> {
      running = true;
      co_await sleep_for(std::chrono::minutes(1));  // cancelled by the stop
    });
    w.start();
    producer p(b.make(), b.queue());
    co_await p.enqueue(make_job("long", {}, "g"));
    CHECK(co_await eventually([&] { return running; }));
    bool first_done = false;
    asio::co_spawn(ctx, w.stop(std::chrono::minutes(1)), [&](std::exception_ptr) { first_done = true; });
    CHECK(co_await eventually([&] { return w.state() == worker_state::draining; }));
    CHECK_FALSE(first_done);  // the grace runs
    auto forced = std::chrono::steady_clock::now();
    co_await w.stop(std::chrono::milliseconds(0));
    CHECK(std::chrono::steady_clock::now() - forced < std::chrono::seconds(5));
    CHECK(co_await eventually([&] { return first_done; }, std::chrono::seconds(5)));
    CHECK(w.counters().released == 1);
    auto counts = co_await b.make().counts(b.queue());
    CHECK(counts.started == 0);  // handed back: no attempt counted
    CHECK(counts.ready_lanes == 1);
    CHECK(counts.running == 0);
  });
}

CONFORMANCE("purge_queue leaves nothing of a queue, and the queue works again after") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    std::vector<job_spec> specs;
    for (int i = 0; i < 20; ++i) {
      specs.push_back(make_job("t", {{"i", i}}, i % 2 ? std::optional<std::string>("g") : std::nullopt));
      // (Fences are a shard's: sharded, the ungrouped jobs go to g's shard too.)
      if (sharded(kind) && i % 2 == 0) specs.back().id = beside(kind, fmt::format("u{}", i), "g");
    }
    co_await p.enqueue_bulk(std::move(specs));
    claim_options co{"w", 3, std::chrono::seconds(30)};
    auto claimed = co_await store.claim(b.queue(), co);
    REQUIRE(claimed.size() == 3);
    auto last_fence = claimed.back().fence;
    finish_item dead;
    dead.token = claimed[0].token;
    dead.kind = finish_kind::fail;
    dead.error = "no";
    std::vector<finish_item> items(1, dead);  // (not a braced list: GCC 12 miscompiles one in a coroutine)
    co_await store.finish(b.queue(), "w", std::move(items), std::chrono::seconds(30));
    CHECK(co_await store.purge_queue(b.queue()) > 0);
    auto counts = co_await store.counts(b.queue());
    CHECK(counts.enqueued == 0);
    CHECK(counts.ready_lanes == 0);
    CHECK(counts.running == 0);
    CHECK(counts.dead == 0);
    CHECK(counts.groups == 0);
    CHECK((co_await store.dead_letters(b.queue(), 0, 10)).empty());
    co_await p.enqueue(make_job("t", {}, "g"));  // a fresh start
    auto again = co_await store.claim(b.queue(), co);
    REQUIRE(again.size() == 1);
    CHECK(again[0].fence > last_fence);  // fences go on: an old token never matches a new lease
  });
}
