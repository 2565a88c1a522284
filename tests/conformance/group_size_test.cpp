// A group's maximum size (job_spec::max_group_size, a grouping rule's, the producer's) on every
// backend: a job over it refuses its whole batch, and nothing of the batch is stored.
#include "conformance/conformance.hpp"

namespace {

job_spec in_group(std::string group, std::string id = {}) {
  auto s = make_job("t", boost::json::object{}, std::move(group));
  s.id = std::move(id);
  return s;
}

// The refusal's code and text, or "" when the call went through.
awaitable<std::string> refusal(producer& p, std::vector<job_spec> specs) {
  try {
    co_await p.enqueue_bulk(std::move(specs));
  } catch (const boost::system::system_error& e) {
    CHECK(e.code() == errc::group_full);
    co_return std::string(e.what());
  }
  co_return std::string();
}

}  // namespace

CONFORMANCE("max group size: a job over its group's limit refuses its batch, and nothing of it is stored") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer_options po;
    po.max_group_size = 3;
    producer p(store, b.queue(), po);
    std::vector<job_spec> three;
    three.push_back(in_group("g", "g-1"));
    three.push_back(in_group("g"));
    three.push_back(in_group("g"));
    co_await p.enqueue_bulk(std::move(three));
    CHECK(co_await store.group_size(b.queue(), "g") == 3);

    // A batch whose third job is over g's limit: its jobs for h are not stored either.
    std::vector<job_spec> batch;
    batch.push_back(in_group("h"));
    batch.push_back(in_group("h"));
    batch.push_back(in_group("g"));
    batch.push_back(make_job("t", boost::json::object{}));  // ungrouped: no limit
    auto said = co_await refusal(p, std::move(batch));
    CHECK(said.find("group 'g' would hold 4 jobs, over its max group size of 3 (job 3 of 4): nothing was stored") !=
          std::string::npos);
    CHECK(co_await store.group_size(b.queue(), "h") == 0);
    CHECK((co_await store.counts(b.queue())).enqueued == 3);

    // A duplicate of a pending id adds nothing, so it is no refusal; a job's own limit wins.
    CHECK((co_await p.enqueue(in_group("g", "g-1"))).duplicate);
    auto roomier = in_group("g");
    roomier.max_group_size = 4;
    CHECK_FALSE((co_await p.enqueue(roomier)).duplicate);
    CHECK((co_await refusal(p, std::vector<job_spec>(1, in_group("g")))).find("would hold 5 jobs") !=
          std::string::npos);

    // Once a job of g completes, there is room for one.
    claim_options o;
    o.worker = "w";
    auto claimed = co_await store.claim(b.queue(), o);
    REQUIRE(claimed.size() == 1);
    std::vector<finish_item> acks(1);
    acks[0].token = claimed[0].token;
    acks[0].unique_id = claimed[0].job.id == "g-1" ? "g-1" : "";
    co_await store.finish(b.queue(), "w", std::move(acks), std::chrono::seconds(30));
    auto fits = in_group("g");
    fits.max_group_size = 4;
    CHECK_FALSE((co_await p.enqueue(fits)).duplicate);
    CHECK(co_await store.group_size(b.queue(), "g") == 4);

    // A grouping rule's limit, for the groups it makes.
    producer_options ruled;
    grouping_rule rule;
    rule.key = "{tenant}";
    rule.max_group_size = 1;
    ruled.rules.add(std::move(rule));
    producer r(store, b.queue(), ruled);
    boost::json::object payload;
    payload["tenant"] = "acme";
    CHECK_FALSE((co_await r.enqueue(make_job("t", payload))).duplicate);
    auto over = co_await refusal(r, std::vector<job_spec>(1, make_job("t", payload)));
    CHECK(over.find("group 'acme' would hold 2 jobs, over its max group size of 1") != std::string::npos);

    // A limit of 0 names itself.
    auto zero = in_group("g");
    zero.max_group_size = 0;
    CHECK_THROWS_WITH_AS(producer::check(zero),
                         "job max_group_size is 0; it must be from 1 to 1000000000 (leave it unset for none)",
                         std::invalid_argument);
  });
}
