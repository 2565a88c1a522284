// Group weights on every backend (job_spec::group_weight, a grouping rule's, the producer's): a
// weighted group's lease brings its weight times the followers an unweighted one's does, up to
// 1,000 jobs a lease, and stops where any lease's followers stop.
#include "conformance/conformance.hpp"

namespace {

job_spec weighted(int n, std::string group, std::optional<std::size_t> weight) {
  auto s = make_job("t", {{"n", n}}, std::move(group));
  s.group_weight = weight;
  return s;
}

int n_of(const job_record& r) { return static_cast<int>(boost::json::parse(r.body).at("payload").at("n").as_int64()); }

// The n of a lease's head and followers: "1 2 3".
std::string numbers(const claimed_job& c) {
  std::vector<int> out{n_of(c.job)};
  for (auto& f : c.ahead) out.push_back(n_of(f));
  return fmt::format("{}", fmt::join(out, " "));
}

const claimed_job& of_group(const std::vector<claimed_job>& claimed, const std::string& group) {
  for (auto& c : claimed)
    if (c.group == group) return c;
  throw std::runtime_error("no lease of group " + group);
}

}  // namespace

CONFORMANCE(
    "group weight: a weighted group's lease brings its weight times the followers, from job, rule or producer") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer_options po;
    grouping_rule rule;  // every tenant's group has weight 2
    rule.key = "tenant-{tenant}";
    rule.weight = 2;
    po.rules.add(std::move(rule));
    po.group_weight = 4;  // for the grouped jobs the job and the rule give no weight
    producer p(store, b.queue(), po);
    std::vector<job_spec> specs;
    for (int i = 1; i <= 12; ++i) specs.push_back(weighted(i, "w3", 3));
    for (int i = 1; i <= 12; ++i) specs.push_back(weighted(i, beside(kind, "w1", "w3"), 1));
    for (int i = 1; i <= 12; ++i) specs.push_back(make_job("t", {{"n", i}, {"tenant", "acme"}}));
    for (int i = 1; i <= 12; ++i) specs.push_back(weighted(i, "dflt", std::nullopt));
    co_await p.enqueue_bulk(std::move(specs));
    claim_options co{"w", 10, std::chrono::seconds(30), 1};  // a burst of 2
    auto claimed = co_await store.claim(b.queue(), co);
    REQUIRE(claimed.size() == 4);
    CHECK(numbers(of_group(claimed, "w3")) == "1 2 3 4 5 6");  // 3 × 2
    CHECK(numbers(of_group(claimed, beside(kind, "w1", "w3"))) == "1 2");
    CHECK(numbers(of_group(claimed, "tenant-acme")) == "1 2 3 4");
    CHECK(numbers(of_group(claimed, "dflt")) == "1 2 3 4 5 6 7 8");
    // The fences a weighted lease takes: the next lease's starts after all of them.
    auto& w3 = of_group(claimed, "w3");
    auto& w1 = of_group(claimed, beside(kind, "w1", "w3"));
    CHECK(w1.fence == w3.fence + 6);
    auto head = decode_job(jobrt::test::text(w3.job), "w3");
    CHECK(head.group_weight == 3);
    CHECK(decode_job(jobrt::test::text(w1.job), w1.group).group_weight == 1);
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
  });
}

CONFORMANCE("group weight: a lease holds at most 1,000 jobs, and its followers stop at a job that runs apart") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    std::vector<job_spec> specs;
    for (int i = 1; i <= 1100; ++i) specs.push_back(weighted(i, "heavy", 100));
    for (int i = 1; i <= 5; ++i) specs.push_back(weighted(i, beside(kind, "cut", "heavy"), 4));
    specs.back().group_concurrency = 2;  // cut's 5th job runs apart: followers stop before it
    co_await p.enqueue_bulk(std::move(specs));
    claim_options co{"w", 10, std::chrono::seconds(30), 9};  // a burst of 10: 100 × 10 is over the bound
    auto claimed = co_await store.claim(b.queue(), co);
    REQUIRE(claimed.size() == 2);
    auto& heavy = of_group(claimed, "heavy");
    REQUIRE(heavy.ahead.size() == 999);
    CHECK(n_of(heavy.ahead.back()) == 1000);
    CHECK(numbers(of_group(claimed, beside(kind, "cut", "heavy"))) == "1 2 3 4");
    // A finish that asks for the group's next job with as many followers: the bound holds there
    // too.
    std::vector<finish_item> items(1);
    items[0].token = heavy.token;
    items[0].kind = finish_kind::ack;
    items[0].want_next = finish_item::next_policy::yes;
    items[0].ahead = 5000;
    auto done = co_await store.finish(b.queue(), "w", std::move(items), std::chrono::seconds(30));
    REQUIRE(done.size() == 1);
    CHECK(done[0].lease_held);
    REQUIRE(done[0].next);
    CHECK(n_of(done[0].next->job) == 2);  // (a finish ends the lease's head only: the test's shortcut)
    CHECK(done[0].next->ahead.size() == 999);
  });
}

CONFORMANCE("group weight: values out of range are refused, naming them") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    CHECK(refusal([&] { producer::check(weighted(1, "g", 0)); }) == "job group_weight is 0; it must be from 1 to 100");
    CHECK(refusal([&] { producer::check(weighted(1, "g", 101)); }) ==
          "job group_weight is 101; it must be from 1 to 100");
    producer_options po;
    po.group_weight = 0;
    CHECK(refusal([&] { producer::check(make_job("t", {}, "g"), po); }) ==
          "producer group_weight is 0; it must be from 1 to 100");
    CHECK(refusal([&] {
            grouping_rules::from_json(boost::json::parse(R"({"rules": [{"key": "x", "weight": 2.5}]})"));
          }) == "grouping rules[0].weight is 2.5; it must be a whole number from 1 to 100");
    // Nothing of a refused batch is stored.
    producer p(b.make(), b.queue());
    std::vector<job_spec> specs{weighted(1, "g", 2), weighted(2, "g", 200)};
    CHECK(refusal([&] { producer::check(specs[1]); }) == "job group_weight is 200; it must be from 1 to 100");
    std::string error;
    try {
      co_await p.enqueue_bulk(std::move(specs));
    } catch (const std::invalid_argument& e) {
      error = e.what();
    }
    CHECK(error.find("job group_weight is 200") != std::string::npos);
    CHECK((co_await b.make().counts(b.queue())).enqueued == 0);
  });
}

CONFORMANCE("group weight: a group that runs several at once starts its weight of heads a turn, in one claim or many") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    auto other = beside(kind, "b", "a");
    std::vector<job_spec> specs;
    for (int i = 1; i <= 12; ++i) {
      specs.push_back(weighted(i, "a", 3));
      specs.back().group_concurrency = 20;
    }
    for (int i = 1; i <= 12; ++i) {
      specs.push_back(weighted(i, other, std::nullopt));
      specs.back().group_concurrency = 20;
    }
    co_await p.enqueue_bulk(std::move(specs));
    auto names = [](const std::vector<claimed_job>& claimed) {
      std::vector<std::string> out;
      for (auto& c : claimed) out.push_back(fmt::format("{}{}", c.group.substr(0, 1), n_of(c.job)));
      return fmt::format("{}", fmt::join(out, " "));
    };
    std::vector<std::string> one_by_one;
    for (int i = 0; i < 8; ++i) {
      claim_options co{"w", 1, std::chrono::seconds(30), 0};
      one_by_one.push_back(names(co_await store.claim(b.queue(), co)));
    }
    CHECK(fmt::format("{}", fmt::join(one_by_one, " ")) == "a1 a2 a3 b1 a4 a5 a6 b2");
    claim_options co{"w", 8, std::chrono::seconds(30), 0};
    CHECK(names(co_await store.claim(b.queue(), co)) == "a7 a8 a9 b3 a10 a11 a12 b4");
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
  });
}

CONFORMANCE("group weight: a turn cut short by a claim's room goes on first in the next claim") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    auto other = beside(kind, "b", "a");
    std::vector<job_spec> specs;
    for (int i = 1; i <= 6; ++i) {
      specs.push_back(weighted(i, "a", 3));
      specs.back().group_concurrency = 20;
      specs.push_back(weighted(i, other, std::nullopt));
      specs.back().group_concurrency = 20;
    }
    co_await p.enqueue_bulk(std::move(specs));
    std::vector<std::string> claims;
    for (char room : std::string("21122")) {  // (each claim's max)
      claim_options co{"w", static_cast<std::size_t>(room - '0'), std::chrono::seconds(30), 0};
      std::vector<std::string> names;
      for (auto& c : co_await store.claim(b.queue(), co))
        names.push_back(fmt::format("{}{}", c.group.substr(0, 1), n_of(c.job)));
      claims.push_back(fmt::format("{}", fmt::join(names, " ")));
    }
    CHECK(fmt::format("{}", fmt::join(claims, " | ")) == "a1 a2 | a3 | b1 | a4 a5 | a6 b2");
    CHECK((co_await store.check(b.queue(), false)).problems.empty());
  });
}
