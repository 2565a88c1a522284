// Group controls on every backend: a group's rate limit (job_spec::group_rate, a grouping
// rule's, the producer's) and a handler's throttle of its group (job_context::throttle_group).
#include "conformance/conformance.hpp"

#include <boost/asio/steady_timer.hpp>

#include <array>

namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Due times are whole milliseconds of the backend's clock, runs are timed with the steady clock.
constexpr milliseconds slack{3};

job_spec named(std::string name, std::optional<std::string> group) {
  return make_job("t", {{"name", std::move(name)}}, std::move(group));
}

std::string name_of(const job_record& r) {
  auto body = boost::json::parse(r.body);
  return std::string(body.at("payload").at("name").as_string());
}

// Acks every claimed job, asking for no next one.
awaitable<void> ack_all(backend& store, const std::string& queue, const std::vector<claimed_job>& claimed) {
  std::vector<finish_item> acks;
  for (auto& c : claimed) {
    finish_item item;
    item.token = c.token;
    acks.push_back(std::move(item));
  }
  co_await store.finish(queue, "w", std::move(acks), std::chrono::seconds(30));
}

// The names of what a claim of up to 10 leased, with followers asked for: "a1 b1".
awaitable<std::string> claim_names(backend& store, const std::string& queue, std::vector<claimed_job>& claimed) {
  claim_options o;
  o.worker = "w";
  o.max = 10;
  o.ahead = 4;
  claimed = co_await store.claim(queue, o);
  std::vector<std::string> names;
  for (auto& c : claimed) {
    names.push_back(name_of(c.job));
    for (auto& f : c.ahead) names.push_back(name_of(f) + "(follower)");
  }
  std::sort(names.begin(), names.end());
  co_return fmt::format("{}", fmt::join(names, " "));
}

awaitable<void> pause_for(milliseconds d) {
  asio::steady_timer t(co_await asio::this_coro::executor, d);
  co_await t.async_wait(use_awaitable);
}

}  // namespace

CONFORMANCE("group rate: a limited group starts at most max jobs a window and waits in delayed while others go on") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    const auto window = milliseconds(500);
    std::vector<job_spec> specs;
    for (int i = 1; i <= 4; ++i) {
      auto a = named(fmt::format("a{}", i), "a");
      a.group_rate = rate_limit{2, window};
      specs.push_back(std::move(a));
      specs.push_back(named(fmt::format("b{}", i), "b"));  // no limit
    }
    co_await p.enqueue_bulk(std::move(specs));

    // A limited head comes without followers; b's head brings its own.
    std::vector<claimed_job> claimed;
    auto first = clock_type::now();
    CHECK(co_await claim_names(store, b.queue(), claimed) == "a1 b1 b2(follower) b3(follower) b4(follower)");
    std::vector<claimed_job> a_only;
    for (auto& c : claimed)
      if (c.group == "a") a_only.push_back(c);
    co_await ack_all(store, b.queue(), a_only);
    CHECK(co_await claim_names(store, b.queue(), claimed) == "a2");
    co_await ack_all(store, b.queue(), claimed);

    // Two starts in the window: a waits in delayed until the first of them leaves it.
    CHECK(co_await claim_names(store, b.queue(), claimed) == "");
    auto counts = co_await store.counts(b.queue());
    CHECK(counts.delayed == 1);
    auto promoted = co_await store.promote(b.queue(), 100);
    CHECK(promoted.moved == 0);
    REQUIRE(promoted.next_due);
    CHECK(*promoted.next_due <= window);
    CHECK(*promoted.next_due + (clock_type::now() - first) >= window - slack);

    co_await pause_for(*promoted.next_due + milliseconds(5));
    CHECK((co_await store.promote(b.queue(), 100)).moved == 1);
    CHECK(clock_type::now() - first >= window - slack);
    CHECK(co_await claim_names(store, b.queue(), claimed) == "a3");
    co_await ack_all(store, b.queue(), claimed);
    CHECK(co_await store.group_size(b.queue(), "a") == 1);
  });
}

CONFORMANCE("group rate: a worker keeps a limited group to max starts a window, a rule's and the producer's too") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    const auto window = milliseconds(600);
    // A rule's limit for tenant groups; the producer's for the rest (here "solo").
    producer_options po;
    grouping_rule rule;
    rule.key = "tenant-{tenant}";
    rule.rate = rate_limit{3, window};
    po.rules.add(std::move(rule));
    po.group_rate = rate_limit{1, window};
    producer p(b.make(), b.queue(), po);
    std::vector<job_spec> specs;
    std::vector<job_spec> free;  // through a producer with no limits
    auto free_group = beside(kind, "free", "tenant-acme");
    for (int i = 0; i < 7; ++i) {
      specs.push_back(make_job("t", {{"name", fmt::format("t{}", i)}, {"tenant", "acme"}}));
      free.push_back(named(fmt::format("free{}", i), free_group));
    }
    specs.push_back(named("solo0", "solo"));
    specs.push_back(named("solo1", "solo"));
    // An ungrouped job has no group to limit: the producer's limit does not touch it.
    specs.push_back(named("u", std::nullopt));
    co_await p.enqueue_bulk(std::move(specs));
    producer plain(b.make(), b.queue());
    co_await plain.enqueue_bulk(std::move(free));
    CHECK(co_await b.make().group_size(b.queue(), "tenant-acme") == 7);
    CHECK(co_await b.make().group_size(b.queue(), "solo") == 2);

    std::map<std::string, std::vector<clock_type::time_point>> starts;
    std::size_t ran = 0;
    worker w(ctx.get_executor(), b.make(), b.worker_opts(4));
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      starts[c.group()].push_back(clock_type::now());
      ++ran;
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return ran == 17; }, std::chrono::seconds(20)));
    co_await w.stop(std::chrono::seconds(5));

    // Server-side, a start is counted at its claim; the handler starts a little after (longer
    // under a sanitizer). So any max + 1 starts of a group span at least a window, less the slack
    // of those few steps; with no limit they would span a few milliseconds.
    auto check_limit = [&](const std::string& group, std::size_t max) {
      auto& s = starts[group];
      for (std::size_t i = 0; i + max < s.size(); ++i) CHECK(s[i + max] - s[i] >= window - milliseconds(200));
    };
    REQUIRE(starts["tenant-acme"].size() == 7);
    check_limit("tenant-acme", 3);
    REQUIRE(starts["solo"].size() == 2);
    check_limit("solo", 1);
    // The free group ran all its jobs before the limited one's third window began.
    REQUIRE(starts[free_group].size() == 7);
    CHECK(starts[free_group].back() < starts["tenant-acme"][6]);
    CHECK(starts[""].size() == 1);
  });
}

CONFORMANCE("throttle_group: the group waits that long after the run while the others go on") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    const auto pause = milliseconds(400);
    std::vector<job_spec> specs{named("a1", "a"),
                                named("a2", "a"),
                                named("b1", beside(kind, "b", "a")),
                                named("b2", beside(kind, "b", "a")),
                                named("c1", "c"),
                                named("d1", "d"),
                                named("d2", "d"),
                                named("u", std::nullopt)};
    co_await p.enqueue_bulk(std::move(specs));
    std::map<std::string, clock_type::time_point> started, ended;
    std::map<std::string, bool> answered;
    worker_options wo = b.worker_opts(4);
    wo.retry_backoff = backoff{milliseconds(0), 1.0, milliseconds(0), 0.0};
    worker w(ctx.get_executor(), b.make(), wo);
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      auto name = std::string(c.payload().at("name").as_string());
      if (c.attempt() > 1) name += "#" + std::to_string(c.attempt());
      started[name] = clock_type::now();
      // a1 completes throttled; c1 too, its group left empty; d1 fails throttled (retried after
      // the throttle, not its backoff of 0); the ungrouped job has no group to throttle.
      if (name == "a1" || name == "c1" || name == "d1") answered[name] = c.throttle_group(pause);
      if (name == "u") answered[name] = c.throttle_group(pause);
      ended[name] = clock_type::now();
      if (name == "d1") throw std::runtime_error("429 too many requests");
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return started.size() >= 6; }, std::chrono::seconds(10)));
    // c's job enqueued after its group emptied (c1's end stored) waits for the throttle too.
    auto& store = b.make();
    for (int i = 0; i < 1000 && co_await store.group_size(b.queue(), "c") != 0; ++i)
      co_await pause_for(milliseconds(2));
    CHECK(co_await store.group_size(b.queue(), "c") == 0);
    co_await p.enqueue(named("c2", "c"));
    CHECK(co_await eventually([&] { return started.size() == 10; }, std::chrono::seconds(10)));
    co_await w.stop(std::chrono::seconds(5));

    CHECK(answered["a1"]);
    CHECK(answered["c1"]);
    CHECK(answered["d1"]);
    CHECK_FALSE(answered["u"]);
    REQUIRE(started.contains("a2"));
    CHECK(started["a2"] - ended["a1"] >= pause - slack);
    REQUIRE(started.contains("c2"));
    CHECK(started["c2"] - ended["c1"] >= pause - slack);
    REQUIRE(started.contains("d1#2"));
    CHECK(started["d1#2"] - ended["d1"] >= pause - slack);
    CHECK(started["d2"] > started["d1#2"]);  // the retried job kept its place
    // b went on meanwhile.
    CHECK(started["b2"] < started["a2"]);
  });
}

CONFORMANCE("group controls refuse limits and pauses that are zero, negative or too big, naming the value") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto zero = named("z", "g");
    zero.group_rate = rate_limit{0, milliseconds(1000)};
    CHECK_THROWS_WITH_AS(producer::check(zero), "job group_rate max is 0; it must be from 1 to 10000",
                         std::invalid_argument);
    zero.group_rate = rate_limit{5, milliseconds(-1)};
    CHECK_THROWS_WITH_AS(producer::check(zero), "job group_rate window is -1 ms; it must be from 1 to 86400000",
                         std::invalid_argument);
    producer_options po;
    po.group_rate = rate_limit{20000, milliseconds(1000)};
    producer p(b.make(), b.queue(), po);
    std::string said;
    try {
      co_await p.enqueue(named("x", "g"));
    } catch (const std::invalid_argument& e) {
      said = e.what();
    }
    CHECK(said == "producer group_rate max is 20000; it must be from 1 to 10000");
    CHECK((co_await b.make().counts(b.queue())).enqueued == 0);
    CHECK_THROWS_WITH_AS(grouping_rules::from_json(boost::json::parse(
                             R"({"rules": [{"key": "{t}", "rate": {"max": 3, "window_ms": "1s"}}]})")),
                         "grouping rules[0].rate.window_ms is \"1s\", not a whole number", std::invalid_argument);
    CHECK_THROWS_WITH_AS(
        grouping_rules::from_json(boost::json::parse(R"({"rules": [{"key": "{t}", "rate": {"max": 3, "per": 1}}]})")),
        "grouping rules[0].rate: unknown field \"per\" (known: max, window_ms)", std::invalid_argument);

    std::vector<std::string> refusals;
    producer plain(b.make(), b.queue());
    co_await plain.enqueue(named("g1", "g"));
    worker w(ctx.get_executor(), b.make(), b.worker_opts(1));
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      for (auto ms : std::array<int, 3>{0, -5, 86'400'001}) {
        try {
          c.throttle_group(milliseconds(ms));
        } catch (const std::invalid_argument& e) {
          refusals.push_back(e.what());
        }
      }
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return refusals.size() == 3; }, std::chrono::seconds(10)));
    co_await w.stop(std::chrono::seconds(5));
    REQUIRE(refusals.size() == 3);
    CHECK(refusals[0].find("throttle_group pause is 0 ms") != std::string::npos);
    CHECK(refusals[1].find("throttle_group pause is -5 ms; it must be from 1 to 86400000") != std::string::npos);
    CHECK(refusals[2].find("throttle_group pause is 86400001 ms") != std::string::npos);
  });
}

CONFORMANCE("queue rate: a claim leases no more than the window's room, then says when one may start") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    std::vector<job_spec> specs;  // the group's lane first: its head comes without followers
    for (int i = 0; i < 3; ++i) specs.push_back(named(fmt::format("g{}", i), "g"));
    for (int i = 0; i < 6; ++i) specs.push_back(named(fmt::format("u{}", i), std::nullopt));
    co_await p.enqueue_bulk(std::move(specs));
    const auto window = milliseconds(500);
    claim_options o;
    o.worker = "w";
    o.max = 10;
    o.ahead = 4;
    o.rate = rate_limit{4, window};
    if (sharded(kind)) {  // one key counts the queue's starts: no shard's script may reach it
      std::string said;
      try {
        co_await store.claim(b.queue(), o);
      } catch (const std::invalid_argument& e) {
        said = e.what();
      }
      CHECK(said.find("shards: a queue-wide rate limit (worker rate_limit) needs a queue of one shard") !=
            std::string::npos);
      co_return;
    }
    auto first = clock_type::now();
    auto claimed = co_await store.claim(b.queue(), o);
    REQUIRE(claimed.size() == 4);
    CHECK(claimed[0].group == "g");
    for (auto& c : claimed) CHECK(c.ahead.empty());  // each follower would be a start
    auto ready = (co_await store.counts(b.queue())).ready_lanes;
    CHECK(ready == 3);
    std::optional<milliseconds> wait;
    try {
      co_await store.claim_wait(b.queue(), o, milliseconds(200));
    } catch (const rate_limited& e) {
      wait = e.retry_after();
    }
    REQUIRE(wait);
    CHECK(*wait <= window);
    CHECK(*wait + (clock_type::now() - first) >= window - slack);
    // Nothing else was taken, and a second blocking claim takes no lane aside either.
    try {
      co_await store.claim_wait(b.queue(), o, milliseconds(200));
    } catch (const rate_limited&) {
    }
    auto counts = co_await store.counts(b.queue());
    CHECK(counts.running == 4);
    CHECK(counts.ready_lanes == ready);
    // A lease that never starts gives its start back.
    std::vector<finish_item> back(1);
    back[0].token = claimed[3].token;
    back[0].kind = finish_kind::release;
    co_await store.finish(b.queue(), "w", std::move(back), std::chrono::seconds(30));
    auto one = co_await store.claim(b.queue(), o);
    CHECK(one.size() == 1);
    co_await pause_for(*wait + milliseconds(5));
    auto more = co_await store.claim(b.queue(), o);
    CHECK(more.size() == 3);  // the rest of the ungrouped jobs (the group's lane is leased)
    CHECK(clock_type::now() - first >= window - slack);
  });
}

CONFORMANCE("queue rate: workers keep the queue to max starts a window and wait on a timer meanwhile") {
  if (sharded(kind)) return;  // (refused: see above)
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    std::vector<job_spec> specs;
    for (int i = 0; i < 10; ++i) specs.push_back(named(fmt::format("u{}", i), std::nullopt));
    for (int i = 0; i < 5; ++i) specs.push_back(named(fmt::format("g{}", i), "g"));
    co_await p.enqueue_bulk(std::move(specs));
    const auto window = milliseconds(500);
    std::vector<clock_type::time_point> starts;
    auto opts = b.worker_opts(8);
    opts.rate_limit = rate_limit{5, window};
    worker one(ctx.get_executor(), b.make(), opts), two(ctx.get_executor(), b.make(), opts);
    for (auto* w : std::array<worker*, 2>{&one, &two})
      w->add_handler("t", [&](job_context&) -> awaitable<void> {
        starts.push_back(clock_type::now());
        co_return;
      });
    one.start();
    two.start();
    CHECK(co_await eventually([&] { return starts.size() == 15; }, std::chrono::seconds(20)));
    co_await one.stop(std::chrono::seconds(5));
    co_await two.stop(std::chrono::seconds(5));
    REQUIRE(starts.size() == 15);
    std::sort(starts.begin(), starts.end());
    // Any 6 starts span a window, less the slack between a claim and its handler's start; with no
    // limit all 15 start within a few milliseconds.
    for (std::size_t i = 0; i + 5 < starts.size(); ++i) CHECK(starts[i + 5] - starts[i] >= window - milliseconds(200));
    CHECK(starts.back() - starts.front() >= 2 * window - milliseconds(200));
  });
}
