// Group concurrency on every backend (job_spec::group_concurrency, a grouping rule's, the
// producer's): up to N jobs of a group run at once, they start in enqueue order, and never N + 1
// run, also across retries, lost leases and releases.
#include "conformance/conformance.hpp"

#include <sstream>

namespace {

using std::chrono::milliseconds;

job_spec wide(std::string name, std::string group, std::size_t n) {
  auto s = make_job("t", {{"name", std::move(name)}}, std::move(group));
  s.group_concurrency = n;
  return s;
}

// Jobs a1 .. a<count> of group "a", up to n of them at once.
awaitable<void> enqueue_wide(backend& store, const std::string& queue, int count, std::size_t n) {
  producer p(store, queue);
  std::vector<job_spec> specs;
  for (int i = 1; i <= count; ++i) specs.push_back(wide(fmt::format("a{}", i), "a", n));
  co_await p.enqueue_bulk(std::move(specs));
}

std::string name_of(const job_record& r) {
  auto body = boost::json::parse(r.body);
  return std::string(body.at("payload").at("name").as_string());
}

// What a claim of up to 10 leased, in lease order: "a1 a2".
awaitable<std::string> claim_names(backend& store, const std::string& queue, std::vector<claimed_job>& claimed,
                                   milliseconds ttl = milliseconds(30000)) {
  claim_options o;
  o.worker = "w";
  o.max = 10;
  o.ahead = 4;
  o.lease_ttl = ttl;
  claimed = co_await store.claim(queue, o);
  std::vector<std::string> names;
  for (auto& c : claimed) {
    names.push_back(name_of(c.job));
    CHECK(c.ahead.empty());  // a group that runs several at once hands over no followers
  }
  co_return fmt::format("{}", fmt::join(names, " "));
}

// Finishes one claimed job.
awaitable<void> end(backend& store, const std::string& queue, const claimed_job& c, finish_kind kind,
                    milliseconds delay = milliseconds(0)) {
  std::vector<finish_item> items(1);
  items[0].token = c.token;
  items[0].kind = kind;
  items[0].delay = delay;
  items[0].error = "failed on purpose";
  auto r = co_await store.finish(queue, "w", std::move(items), std::chrono::seconds(30));
  CHECK(r.at(0).lease_held);
}

const claimed_job& named(const std::vector<claimed_job>& claimed, const std::string& name) {
  for (auto& c : claimed)
    if (name_of(c.job) == name) return c;
  throw std::runtime_error("no claimed job " + name);
}

// The names of claim_names, sorted (a sharded queue claims its shards' jobs in no set order).
std::string sorted(const std::string& names) {
  std::vector<std::string> words;
  std::istringstream in(names);
  for (std::string w; in >> w;) words.push_back(w);
  std::sort(words.begin(), words.end());
  return fmt::format("{}", fmt::join(words, " "));
}

awaitable<void> pause_for(milliseconds d) {
  asio::steady_timer t(co_await asio::this_coro::executor, d);
  co_await t.async_wait(use_awaitable);
}

}  // namespace

CONFORMANCE("group concurrency: up to N jobs of a group lease at once, in enqueue order, and never N + 1") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    co_await enqueue_wide(store, b.queue(), 6, 3);
    CHECK(co_await store.group_size(b.queue(), "a") == 6);

    std::vector<claimed_job> first, more;
    CHECK(co_await claim_names(store, b.queue(), first) == "a1 a2 a3");
    for (auto& c : first) CHECK(c.group == "a");
    CHECK(first[1].fence > first[0].fence);
    CHECK(first[2].fence > first[1].fence);
    CHECK(co_await claim_names(store, b.queue(), more) == "");  // three run: the group is full
    auto counts = co_await store.counts(b.queue());
    CHECK(counts.running == 3);
    CHECK(counts.ready_lanes == 0);
    // Its size counts its running jobs, which left its list.
    CHECK(co_await store.group_size(b.queue(), "a") == 6);

    // An end makes room for the next one; a job that goes back starts again before it.
    co_await end(store, b.queue(), named(first, "a2"), finish_kind::ack);
    CHECK(co_await store.group_size(b.queue(), "a") == 5);
    CHECK(co_await claim_names(store, b.queue(), more) == "a4");
    co_await end(store, b.queue(), named(first, "a1"), finish_kind::retry);
    std::vector<claimed_job> again;
    CHECK(co_await claim_names(store, b.queue(), again) == "a1");
    CHECK(again[0].job.attempts == 1);
    CHECK(again[0].fence > more[0].fence);
    CHECK(co_await claim_names(store, b.queue(), more) == "");

    // A job given back unstarted (release) comes back first, with no attempt counted.
    std::vector<std::string> unstarted;
    unstarted.push_back(named(first, "a3").token);
    co_await store.release(b.queue(), "w", std::move(unstarted));
    std::vector<claimed_job> back;
    CHECK(co_await claim_names(store, b.queue(), back) == "a3");
    CHECK(back[0].job.attempts == 0);
    CHECK((co_await store.counts(b.queue())).running == 3);
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
  });
}

CONFORMANCE("group concurrency: lost leases go back to the group's head, attempts counted, and N still bounds") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    co_await enqueue_wide(store, b.queue(), 4, 2);
    std::vector<claimed_job> first, more;
    CHECK(co_await claim_names(store, b.queue(), first, milliseconds(50)) == "a1 a2");
    co_await pause_for(milliseconds(120));
    reap_options ro;
    ro.max = 100;
    auto reaped = co_await store.reap(b.queue(), ro);
    CHECK(reaped.leases == 2);
    CHECK((co_await store.counts(b.queue())).running == 0);
    CHECK(co_await store.group_size(b.queue(), "a") == 4);
    // Both back before a3, in the order they were leased: the next claim leases them again, then
    // nothing.
    CHECK(co_await claim_names(store, b.queue(), more) == "a1 a2");
    for (auto& c : more) CHECK(c.job.attempts == 1);
    std::vector<claimed_job> none;
    CHECK(co_await claim_names(store, b.queue(), none) == "");
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
    // A finish under a lease that was lost changes nothing.
    std::vector<finish_item> stale(1);
    stale[0].token = first[0].token;
    auto r = co_await store.finish(b.queue(), "w", std::move(stale), std::chrono::seconds(30));
    CHECK_FALSE(r.at(0).lease_held);
    CHECK((co_await store.counts(b.queue())).running == 2);
  });
}

CONFORMANCE("group concurrency: a retry's backoff holds the whole group, and a halt pauses it") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    co_await enqueue_wide(store, b.queue(), 5, 3);
    std::vector<claimed_job> first, more;
    CHECK(co_await claim_names(store, b.queue(), first) == "a1 a2 a3");
    // a1 retries in 300 ms: its group starts nothing before, though two slots are free.
    co_await end(store, b.queue(), named(first, "a2"), finish_kind::ack);
    co_await end(store, b.queue(), named(first, "a1"), finish_kind::retry, milliseconds(300));
    CHECK(co_await claim_names(store, b.queue(), more) == "");
    co_await pause_for(milliseconds(350));
    co_await store.promote(b.queue(), 100);
    CHECK(co_await claim_names(store, b.queue(), more) == "a1 a4");
    // A halt pauses the group: its job back at the head, nothing more starts until a resume.
    co_await end(store, b.queue(), named(more, "a4"), finish_kind::halt);
    std::vector<claimed_job> none;
    CHECK(co_await claim_names(store, b.queue(), none) == "");
    auto paused = co_await store.paused_groups(b.queue());
    REQUIRE(paused.size() == 1);
    CHECK(paused[0].halted);
    co_await end(store, b.queue(), named(first, "a3"), finish_kind::ack);
    co_await end(store, b.queue(), named(more, "a1"), finish_kind::ack);
    CHECK(co_await claim_names(store, b.queue(), none) == "");
    CHECK(co_await store.resume(b.queue(), "a", resume_mode::retry));
    CHECK(co_await claim_names(store, b.queue(), more) == "a4 a5");
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
  });
}

CONFORMANCE("group concurrency: a head of N = 1 behind several runs waits for all of them to end") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    std::vector<job_spec> specs;
    specs.push_back(wide("a1", "a", 2));
    specs.push_back(wide("a2", "a", 2));
    specs.push_back(wide("a3", "a", 1));
    specs.push_back(wide("a4", "a", 2));
    co_await p.enqueue_bulk(std::move(specs));
    std::vector<claimed_job> first, more;
    CHECK(co_await claim_names(store, b.queue(), first) == "a1 a2");
    co_await end(store, b.queue(), named(first, "a1"), finish_kind::ack);
    CHECK(co_await claim_names(store, b.queue(), more) == "");  // a3 runs alone
    co_await end(store, b.queue(), named(first, "a2"), finish_kind::fail);
    CHECK(co_await claim_names(store, b.queue(), more) == "a3");
    CHECK(more[0].token.find("|g:a") != std::string::npos);  // an exclusive lease, as before
    std::vector<claimed_job> none;
    CHECK(co_await claim_names(store, b.queue(), none) == "");
    co_await end(store, b.queue(), more[0], finish_kind::ack);
    CHECK(co_await claim_names(store, b.queue(), more) == "a4");
    CHECK((co_await store.counts(b.queue())).dead == 1);
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
  });
}

CONFORMANCE("group concurrency: a dead letter requeued to the head starts next, before the jobs that wait") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    co_await enqueue_wide(store, b.queue(), 5, 2);
    std::vector<claimed_job> first, more, none;
    CHECK(co_await claim_names(store, b.queue(), first) == "a1 a2");
    co_await end(store, b.queue(), named(first, "a1"), finish_kind::fail);
    CHECK(co_await claim_names(store, b.queue(), more) == "a3");  // a2 and a3 run, a4 and a5 wait
    // The group's head is a4, which has not started: a1 goes in front of it, not behind.
    std::vector<std::string> back(1, named(first, "a1").job.id);  // (no braced list in a coroutine: GCC 12)
    CHECK((co_await store.requeue(b.queue(), back, true)) == back);
    CHECK(co_await claim_names(store, b.queue(), none) == "");  // two run still
    co_await end(store, b.queue(), named(first, "a2"), finish_kind::ack);
    std::vector<claimed_job> next;
    CHECK(co_await claim_names(store, b.queue(), next) == "a1");
    CHECK(next[0].job.attempts == 0);
    co_await end(store, b.queue(), more[0], finish_kind::ack);
    CHECK(co_await claim_names(store, b.queue(), none) == "a4");
    CHECK((co_await store.counts(b.queue())).running == 2);
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
  });
}

CONFORMANCE("group concurrency: a worker runs up to N of a group at once and one of an exclusive group") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer_options po;
    grouping_rule rule;  // every tenant's group runs up to 3 at once
    rule.key = "tenant-{tenant}";
    rule.concurrency = 3;
    po.rules.add(std::move(rule));
    producer p(b.make(), b.queue(), po);
    std::vector<job_spec> specs;
    for (int i = 0; i < 12; ++i) specs.push_back(make_job("t", {{"n", i}, {"tenant", "acme"}}));
    for (int i = 0; i < 4; ++i) specs.push_back(make_job("t", {{"n", i}}, beside(kind, "solo", "tenant-acme")));
    co_await p.enqueue_bulk(std::move(specs));
    std::map<std::string, int> live, most;
    std::vector<std::int64_t> order;
    std::size_t ran = 0;
    worker w(ctx.get_executor(), b.make(), b.worker_opts(8));
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      auto group = c.group();
      if (group == "tenant-acme") order.push_back(c.payload().at("n").as_int64());
      most[group] = std::max(most[group], ++live[group]);
      co_await pause_for(milliseconds(40));
      --live[group];
      ++ran;
    });
    w.start();
    CHECK(co_await eventually([&] { return ran == 16; }, std::chrono::seconds(20)));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(most["tenant-acme"] == 3);
    CHECK(most[beside(kind, "solo", "tenant-acme")] == 1);
    REQUIRE(order.size() == 12);
    CHECK(std::is_sorted(order.begin(), order.end()));  // first starts in enqueue order
    CHECK((co_await b.make().check(b.queue(), false)).problems.empty());
  });
}

CONFORMANCE("group concurrency: values out of range are refused, naming them") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    auto zero = wide("a", "a", 0);
    auto said = [&](auto&& f) -> std::string {
      try {
        f();
      } catch (const std::invalid_argument& e) {
        return e.what();
      }
      return "";
    };
    CHECK(said([&] { producer::check(zero); }) == "job group_concurrency is 0; it must be from 1 to 10000");
    CHECK(said([&] { producer::check(wide("a", "a", 10001)); }) ==
          "job group_concurrency is 10001; it must be from 1 to 10000");
    producer_options po;
    po.group_concurrency = 0;
    CHECK(said([&] { producer::check(make_job("t", {}, "g"), po); }) ==
          "producer group_concurrency is 0; it must be from 1 to 10000");
    CHECK(said([&] {
            grouping_rules::from_json(boost::json::parse(R"({"rules": [{"key": "x", "concurrency": -2}]})"));
          }) == "grouping rules[0].concurrency is -2; it must be a whole number from 1 to 10000");
    co_return;
  });
}

CONFORMANCE("group concurrency: check reports a wrong count of runs and a lane left in full, and repairs both") {
  if (!plain_keys(kind)) return;  // (it writes the keys of an unsharded queue on Redis)
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    auto& r = static_cast<redis_backend&>(b.make());
    auto p = redis_backend::key_prefix(b.queue());
    co_await enqueue_wide(store, b.queue(), 3, 2);
    std::vector<claimed_job> first;
    CHECK(co_await claim_names(store, b.queue(), first) == "a1 a2");
    CHECK((co_await store.check(b.queue(), false)).problems.empty());

    co_await r.exec(redis::request("HSET", p + "running", "a", "5"), p);
    auto found = co_await store.check(b.queue(), true);
    REQUIRE(found.problems.size() == 1);
    CHECK(found.problems[0] == "group a counts 5 jobs running at once; 2 leases run them");
    CHECK((co_await store.check(b.queue(), false)).problems.empty());

    // Both runs end, but their ends never put the lane back (a lane left in full by hand).
    co_await end(store, b.queue(), first[0], finish_kind::ack);
    co_await end(store, b.queue(), first[1], finish_kind::ack);
    co_await r.exec(redis::request("LREM", p + "ready", "0", "g:a"), p);
    co_await r.exec(redis::request("SADD", p + "full", "a"), p);
    found = co_await store.check(b.queue(), true);
    REQUIRE(found.problems.size() == 1);
    CHECK(found.problems[0] == "group a has 1 jobs and no lane, lease or parked lane");
    std::vector<claimed_job> last;
    CHECK(co_await claim_names(store, b.queue(), last) == "a3");
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
  });
}

CONFORMANCE(
    "group concurrency: jobs going back in one call stand at their group's head in the order they were leased") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    co_await enqueue_wide(store, b.queue(), 4, 3);
    std::vector<claimed_job> first, again, last;
    CHECK(co_await claim_names(store, b.queue(), first) == "a1 a2 a3");
    // Handed back by a worker with no handler for them, all in one call (its batch of results).
    std::vector<finish_item> items;
    for (auto& c : first) {
      finish_item item;
      item.token = c.token;
      item.kind = finish_kind::hand_back;
      items.push_back(std::move(item));
    }
    co_await store.finish(b.queue(), "w", std::move(items), std::chrono::seconds(30));
    CHECK(co_await claim_names(store, b.queue(), again) == "a1 a2 a3");
    // Given back unstarted by a stopping worker, all in one call, in another order.
    std::vector<std::string> tokens;
    for (auto it = again.rbegin(); it != again.rend(); ++it) tokens.push_back(it->token);
    co_await store.release(b.queue(), "w", std::move(tokens));
    CHECK(co_await claim_names(store, b.queue(), last) == "a1 a2 a3");
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
  });
}

CONFORMANCE("group concurrency: a group's view and the group listing count its runs, also when all its jobs run") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    co_await enqueue_wide(store, b.queue(), 3, 2);
    // Every page of the listing, as name -> times listed.
    auto listed = [&]() -> awaitable<std::map<std::string, int>> {
      std::map<std::string, int> out;
      std::string cursor;
      for (int pages = 0; pages < 100; ++pages) {
        auto page = co_await store.groups(b.queue(), "", cursor, 1);
        for (auto& g : page.items) ++out[g];
        cursor = page.cursor;
        if (cursor.empty()) break;
      }
      co_return out;
    };

    std::vector<claimed_job> first, second;
    CHECK(co_await claim_names(store, b.queue(), first) == "a1 a2");
    auto a = co_await store.group_of(b.queue(), "a");
    CHECK(a.depth == 3);
    CHECK(a.running == 2);
    REQUIRE(a.head);
    CHECK(name_of(*a.head) == "a3");
    auto seen = co_await listed();  // (on Redis twice: it has a list, and runs)
    CHECK(seen.size() == 1);
    CHECK(seen["a"] >= 1);

    co_await end(store, b.queue(), named(first, "a1"), finish_kind::ack);
    CHECK(co_await claim_names(store, b.queue(), second) == "a3");
    a = co_await store.group_of(b.queue(), "a");  // both run, none waits: no list
    CHECK(a.depth == 2);
    CHECK(a.running == 2);
    CHECK_FALSE(a.head);
    seen = co_await listed();
    CHECK(seen.size() == 1);
    CHECK(seen["a"] == 1);

    co_await end(store, b.queue(), named(first, "a2"), finish_kind::ack);
    co_await end(store, b.queue(), named(second, "a3"), finish_kind::ack);
    a = co_await store.group_of(b.queue(), "a");
    CHECK(a.depth == 0);
    CHECK(a.running == 0);
    CHECK((co_await listed()).empty());
  });
}

CONFORMANCE("group concurrency: a head that may not start, held by its rate limit or by N, counts no run") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    std::vector<job_spec> specs;
    for (int i = 1; i <= 4; ++i) {
      specs.push_back(wide(fmt::format("a{}", i), "a", 3));
      specs.back().group_rate = rate_limit{2, std::chrono::hours(1)};
    }
    for (int i = 1; i <= 3; ++i) specs.push_back(wide(fmt::format("b{}", i), "b", 2));
    co_await p.enqueue_bulk(std::move(specs));
    std::vector<claimed_job> first, none;
    CHECK(sorted(co_await claim_names(store, b.queue(), first)) == "a1 a2 b1 b2");
    // a3 waits for a start of its window, b3 for a run of its group to end: neither counts.
    CHECK(co_await claim_names(store, b.queue(), none) == "");
    CHECK((co_await store.group_of(b.queue(), "a")).running == 2);
    CHECK((co_await store.group_of(b.queue(), "b")).running == 2);
    co_await end(store, b.queue(), named(first, "a1"), finish_kind::ack);
    co_await end(store, b.queue(), named(first, "b1"), finish_kind::ack);
    CHECK((co_await store.group_of(b.queue(), "a")).running == 1);
    CHECK((co_await store.group_of(b.queue(), "b")).running == 1);
    CHECK(co_await claim_names(store, b.queue(), none) == "b3");  // (a's window is an hour)
    CHECK((co_await store.group_of(b.queue(), "a")).running == 1);
    CHECK((co_await store.group_of(b.queue(), "b")).running == 2);
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
  });
}
