// Priorities on every backend (job_spec::priority): ungrouped jobs of a higher priority start
// first, those of one priority in enqueue order; groups by their next job's priority, each
// keeping its own order; a job that goes back keeps its priority; an idle blocking claim wakes
// for a job of any priority.
#include "conformance/conformance.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

namespace {

// An ungrouped job named `name`; its id puts it on one shard of a sharded queue (priorities
// order the jobs of a shard).
job_spec prioritised(backend_kind kind, const std::string& name, int priority) {
  auto s = make_job("t", boost::json::object{{"name", name}});
  s.id = beside(kind, "p-" + name, "p-a");
  s.priority = priority;
  return s;
}

// A job named `name` of group `group` (on a sharded queue, a group on the shard of the ungrouped
// jobs above).
job_spec grouped(backend_kind kind, const std::string& group, const std::string& name, int priority) {
  auto s = make_job("t", boost::json::object{{"name", name}});
  s.id = "p-" + name;
  s.group = beside(kind, group, "p-a");
  s.priority = priority;
  return s;
}

std::string name_of(const claimed_job& c) {
  return std::string(boost::json::parse(c.job.body).at("payload").at("name").as_string());
}

std::string names(const std::vector<claimed_job>& claimed) {
  std::vector<std::string> out;
  for (auto& c : claimed) out.push_back(name_of(c));
  return fmt::format("{}", fmt::join(out, " "));
}

finish_item ended(const claimed_job& c, finish_kind kind) {
  finish_item i;
  i.token = c.token;
  i.kind = kind;
  i.unique_id = c.job.id;
  return i;
}

const std::array<int, 4> other_levels{-2, -1, 1, 2};
const std::vector<std::pair<std::string, int>> mixed{{"a", 0}, {"b", -1}, {"c", 2}, {"d", 1}, {"e", 0},
                                                     {"f", 2}, {"g", -2}, {"h", 1}, {"i", -1}};

std::vector<finish_item> one_item(const claimed_job& c, finish_kind kind) {
  std::vector<finish_item> out;
  out.push_back(ended(c, kind));
  return out;
}

job_spec tenant_job(int priority) {
  auto s = make_job("t", boost::json::object{{"tenant", "acme"}});
  s.priority = priority;
  return s;
}

}  // namespace

CONFORMANCE("priority: higher first, in enqueue order within one, 0 by default") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    std::vector<job_spec> specs;
    for (auto& [name, priority] : mixed) specs.push_back(prioritised(kind, name, priority));
    co_await p.enqueue_bulk(std::move(specs));
    CHECK((co_await store.counts(b.queue())).ready_lanes == 9);
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
    claim_options one{"w", 1, std::chrono::seconds(30)};
    std::string order;
    for (int i = 0; i < 3; ++i) order += names(co_await store.claim(b.queue(), one)) + " ";
    claim_options rest{"w", 10, std::chrono::seconds(30)};
    auto last = co_await store.claim(b.queue(), rest);
    order += names(last);
    CHECK(order == "c f d h a e b i g");
    REQUIRE(last.size() == 6);
    CHECK(decode_job(jobrt::test::text(last[0].job), "").priority == 1);   // h
    CHECK(decode_job(jobrt::test::text(last[1].job), "").priority == 0);   // a
    CHECK(decode_job(jobrt::test::text(last[5].job), "").priority == -2);  // g
    auto counts = co_await store.counts(b.queue());
    CHECK(counts.ready_lanes == 0);
    CHECK(counts.running == 9);
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
  });
}

CONFORMANCE("priority: a job that goes back keeps its priority, released to its head, retried to its tail") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    std::vector<job_spec> specs;
    specs.push_back(prioritised(kind, "a", 1));
    specs.push_back(prioritised(kind, "b", 1));
    specs.push_back(prioritised(kind, "c", 0));
    co_await p.enqueue_bulk(std::move(specs));
    claim_options one{"w", 1, std::chrono::seconds(30)};
    auto a = co_await store.claim(b.queue(), one);
    REQUIRE(a.size() == 1);
    CHECK(name_of(a[0]) == "a");
    std::vector<std::string> tokens(1, a[0].token);
    co_await store.release(b.queue(), "w", std::move(tokens));  // back to the head of its priority
    a = co_await store.claim(b.queue(), one);
    REQUIRE(a.size() == 1);
    CHECK(name_of(a[0]) == "a");
    // A retry goes to the tail of its priority.
    co_await store.finish(b.queue(), "w", one_item(a[0], finish_kind::retry), std::chrono::seconds(30));
    std::string order;
    for (int i = 0; i < 3; ++i) {
      auto got = co_await store.claim(b.queue(), one);
      REQUIRE(got.size() == 1);
      order += name_of(got[0]) + "#" + std::to_string(got[0].job.attempts) + " ";
      co_await store.finish(b.queue(), "w", one_item(got[0], finish_kind::ack), std::chrono::seconds(30));
    }
    CHECK(order == "b#0 a#1 c#0 ");
    CHECK((co_await store.claim(b.queue(), one)).empty());
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
  });
}

CONFORMANCE("priority: a delayed or requeued job waits at its priority, and check finds nothing wrong") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    auto later = prioritised(kind, "late", 2);
    later.delay = std::chrono::milliseconds(50);
    co_await p.enqueue(later);
    co_await p.enqueue(prioritised(kind, "low", -1));
    co_await p.enqueue(prioritised(kind, "dead", -2));
    claim_options one{"w", 1, std::chrono::seconds(30)};
    // "low" waits in its level; the one lane of ready is none: a wake entry.
    CHECK((co_await store.counts(b.queue())).ready_lanes == 2);
    auto low = co_await store.claim(b.queue(), one);
    REQUIRE(low.size() == 1);
    CHECK(name_of(low[0]) == "low");
    auto dead = co_await store.claim(b.queue(), one);
    REQUIRE(dead.size() == 1);
    auto fail = one_item(dead[0], finish_kind::fail);
    fail[0].error = "boom";
    co_await store.finish(b.queue(), "w", std::move(fail), std::chrono::seconds(30));
    co_await p.enqueue(prioritised(kind, "normal", 0));
    std::vector<std::string> back(1, dead[0].job.id);
    CHECK((co_await store.requeue(b.queue(), back, true)) == back);
    asio::steady_timer t(ctx, std::chrono::milliseconds(80));
    co_await t.async_wait(use_awaitable);
    co_await store.promote(b.queue(), 100);
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
    claim_options all{"w", 10, std::chrono::seconds(30)};
    CHECK(names(co_await store.claim(b.queue(), all)) == "late normal dead");
    CHECK((co_await store.counts(b.queue())).ready_lanes == 0);
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
  });
}

CONFORMANCE("priority: a blocking claim on an empty queue wakes for a job of any priority") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(b.make(), b.queue());
    for (int priority : other_levels) {
      std::optional<std::vector<claimed_job>> got;
      asio::co_spawn(
          ctx,
          [&]() -> awaitable<void> {
            claim_options o{"w", 4, std::chrono::seconds(30)};
            got = co_await store.claim_wait(b.queue(), o, std::chrono::seconds(5));
          },
          asio::detached);
      asio::steady_timer t(ctx, std::chrono::milliseconds(100));  // (the claim waits by then)
      co_await t.async_wait(use_awaitable);
      co_await p.enqueue(prioritised(kind, "x" + std::to_string(priority + 2), priority));
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(4);
      while (!got && std::chrono::steady_clock::now() < until) {
        t.expires_after(std::chrono::milliseconds(5));
        co_await t.async_wait(use_awaitable);
      }
      INFO("priority " << priority);
      REQUIRE(got);
      REQUIRE(got->size() == 1);
      co_await store.finish(b.queue(), "w", one_item(got->front(), finish_kind::ack), std::chrono::seconds(30));
      CHECK((co_await store.counts(b.queue())).ready_lanes == 0);
    }
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
  });
}

CONFORMANCE("priority: one out of range is refused with its value, grouped or not") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    CHECK(refusal([&] { producer::check(prioritised(kind, "a", 3)); }) == "job priority is 3; it must be from -2 to 2");
    CHECK(refusal([&] { producer::check(prioritised(kind, "a", -3)); }) ==
          "job priority is -3; it must be from -2 to 2");
    CHECK(refusal([&] { producer::check(grouped(kind, "acme", "a", 3)); }) ==
          "job priority is 3; it must be from -2 to 2");
    producer p(store, b.queue());
    std::string said;
    try {
      co_await p.enqueue(grouped(kind, "acme", "a", -3));
    } catch (const std::invalid_argument& e) {
      said = e.what();
    }
    CHECK(said == "job priority is -3; it must be from -2 to 2");
    CHECK((co_await store.counts(b.queue())).enqueued == 0);
    // A group a rule gives: the job's priority orders it.
    producer_options po;
    grouping_rule rule;
    rule.key = "tenant-{tenant}";
    po.rules.add(std::move(rule));
    producer ruled(store, b.queue(), po);
    co_await ruled.enqueue(tenant_job(-1));
    co_await p.enqueue(prioritised(kind, "b", 0));
    claim_options all{"w", 10, std::chrono::seconds(30)};
    auto got = co_await store.claim(b.queue(), all);
    REQUIRE(got.size() == 2);
    if (!sharded(kind)) CHECK(name_of(got[0]) == "b");  // (on a sharded queue, the shards' order is none)
    auto& tenant = got[0].group.empty() ? got[1] : got[0];
    CHECK(tenant.group == "tenant-acme");
    CHECK(decode_job(jobrt::test::text(tenant.job), "").priority == -1);
  });
}

CONFORMANCE("priority: groups start by their next job's priority, and each keeps its jobs' order") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    std::vector<job_spec> specs;
    specs.push_back(grouped(kind, "A", "a1", 0));
    specs.push_back(grouped(kind, "B", "b1", 2));
    specs.push_back(grouped(kind, "A", "a2", 2));  // behind a1: it waits its turn
    specs.push_back(grouped(kind, "B", "b2", 0));
    specs.push_back(grouped(kind, "C", "c1", -1));
    specs.push_back(prioritised(kind, "u", 1));
    specs.push_back(prioritised(kind, "v", 0));
    co_await p.enqueue_bulk(std::move(specs));
    CHECK((co_await store.counts(b.queue())).ready_lanes == 5);
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
    claim_options one{"w", 1, std::chrono::seconds(30)};
    std::vector<claimed_job> leased;
    std::string order;
    for (int i = 0; i < 5; ++i) {
      auto got = co_await store.claim(b.queue(), one);
      REQUIRE(got.size() == 1);
      order += name_of(got[0]) + " ";
      leased.push_back(std::move(got[0]));
    }
    CHECK(order == "b1 u a1 v c1 ");
    CHECK((co_await store.claim(b.queue(), one)).empty());
    // b1 ends: B goes on at b2's priority (0); a1 ends: A goes on at a2's (2), first.
    co_await store.finish(b.queue(), "w", one_item(leased[0], finish_kind::ack), std::chrono::seconds(30));
    co_await store.finish(b.queue(), "w", one_item(leased[2], finish_kind::ack), std::chrono::seconds(30));
    CHECK((co_await store.counts(b.queue())).ready_lanes == 2);
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
    claim_options all{"w", 10, std::chrono::seconds(30)};
    auto rest = co_await store.claim(b.queue(), all);
    CHECK(names(rest) == "a2 b2");
    REQUIRE(rest.size() == 2);
    CHECK(decode_job(jobrt::test::text(rest[0].job), "").priority == 2);
    CHECK(rest[0].group == beside(kind, "A", "p-a"));
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
  });
}

CONFORMANCE(
    "priority: a group is paused and resumed at its next job's, and a released job takes its group back there") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    std::vector<job_spec> specs;
    specs.push_back(grouped(kind, "P", "x1", 2));
    specs.push_back(grouped(kind, "P", "x2", 0));
    co_await p.enqueue_bulk(std::move(specs));
    auto group = beside(kind, "P", "p-a");
    CHECK(co_await store.pause(b.queue(), group));
    CHECK((co_await store.counts(b.queue())).ready_lanes == 0);
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
    co_await p.enqueue(prioritised(kind, "z", 1));
    CHECK(co_await store.resume(b.queue(), group, resume_mode::retry));
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
    claim_options one{"w", 1, std::chrono::seconds(30)};
    auto x1 = co_await store.claim(b.queue(), one);
    REQUIRE(x1.size() == 1);
    CHECK(name_of(x1[0]) == "x1");
    std::vector<std::string> tokens(1, x1[0].token);
    co_await store.release(b.queue(), "w", std::move(tokens));  // back at its group's head, and at 2
    x1 = co_await store.claim(b.queue(), one);
    REQUIRE(x1.size() == 1);
    CHECK(name_of(x1[0]) == "x1");
    co_await store.finish(b.queue(), "w", one_item(x1[0], finish_kind::ack), std::chrono::seconds(30));
    claim_options all{"w", 10, std::chrono::seconds(30)};
    CHECK(names(co_await store.claim(b.queue(), all)) == "z x2");
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
  });
}

CONFORMANCE(
    "priority: a group that runs several at once goes on at its next job's, in the same claim when there is room") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    std::vector<job_spec> specs;
    for (auto [name, priority] : {std::pair<const char*, int>{"k1", -1}, {"k2", 2}, {"k3", 0}}) {
      auto s = grouped(kind, "K", name, priority);
      s.group_concurrency = 3;
      specs.push_back(std::move(s));
    }
    specs.push_back(prioritised(kind, "u", 1));
    specs.push_back(prioritised(kind, "y", -2));
    co_await p.enqueue_bulk(std::move(specs));
    // K waits at -1 (k1's): after u. As k1 starts, K goes on at 2 (k2's), read again before y's
    // level, then at 0 (k3's).
    claim_options three{"w", 3, std::chrono::seconds(30)};
    CHECK(names(co_await store.claim(b.queue(), three)) == "u k1 k2");
    CHECK((co_await store.counts(b.queue())).ready_lanes == 2);
    CHECK(names(co_await store.claim(b.queue(), three)) == "k3 y");
    CHECK((co_await store.counts(b.queue())).ready_lanes == 0);
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
  });
}

CONFORMANCE("priority: counts skip a wake entry, and the next job's age is of the first job a claim would take") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    co_await p.enqueue(prioritised(kind, "a", 2));  // (into an empty queue: a wake entry goes to ready)
    co_await p.enqueue(prioritised(kind, "b", 0));  // behind the wake entry
    claim_options one{"w", 1, std::chrono::seconds(30)};
    auto a = co_await store.claim(b.queue(), one);
    REQUIRE(a.size() == 1);
    CHECK(name_of(a[0]) == "a");
    auto counts = co_await store.counts(b.queue());
    CHECK(counts.ready_lanes == 1);
    auto next = co_await store.claim(b.queue(), one);
    REQUIRE(next.size() == 1);
    CHECK(name_of(next[0]) == "b");
    CHECK(counts.next_enqueued_ms == decode_job(jobrt::test::text(next[0].job), "").enqueued_at_ms);
    CHECK(counts.next_enqueued_ms > 0);
    CHECK((co_await store.counts(b.queue())).next_enqueued_ms == 0);
  });
}

CONFORMANCE(
    "priority: a lane that goes to ready's head in front of a wake entry replaces it (counts: no lane too many)") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    auto dead = prioritised(kind, "dead", 0);
    dead.max_attempts = 1;
    co_await p.enqueue(dead);
    claim_options one{"w", 1, std::chrono::seconds(30)};
    auto claimed = co_await store.claim(b.queue(), one);
    REQUIRE(claimed.size() == 1);
    co_await store.finish(b.queue(), "w", one_item(claimed[0], finish_kind::fail), std::chrono::seconds(30));
    co_await p.enqueue(prioritised(kind, "high", 1));  // (ready empty: a wake entry there)
    CHECK((co_await store.counts(b.queue())).ready_lanes == 1);
    // To ready's head, and so does a job a worker hands back.
    std::vector<std::string> back(1, claimed[0].job.id);
    CHECK((co_await store.requeue(b.queue(), back, true)) == back);
    CHECK((co_await store.counts(b.queue())).ready_lanes == 2);
    auto first = co_await store.claim(b.queue(), one);
    REQUIRE(first.size() == 1);
    CHECK(name_of(first[0]) == "high");
    std::vector<std::string> tokens(1, first[0].token);
    co_await store.release(b.queue(), "w", tokens);
    CHECK((co_await store.counts(b.queue())).ready_lanes == 2);
    claim_options all{"w", 10, std::chrono::seconds(30)};
    CHECK(names(co_await store.claim(b.queue(), all)) == "high dead");
    CHECK((co_await store.counts(b.queue())).ready_lanes == 0);
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
  });
}
