// The memory backend against the semantics of the Lua scripts (runtime/lua/), without a server.
#include <jobrt/memory_backend.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/sharded_backend.hpp>
#include <jobrt/worker.hpp>

#include "support/records.hpp"
#include "support/run.hpp"

#include <doctest/doctest.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace asio = boost::asio;
using namespace std::chrono_literals;
using namespace boost::asio::experimental::awaitable_operators;
using jobrt::claim_options;
using jobrt::claimed_job;
using jobrt::encoded_job;
using jobrt::finish_item;
using jobrt::finish_kind;
using jobrt::memory_backend;
using jobrt::test::text;

namespace {

constexpr auto ttl = std::chrono::milliseconds(30000);

encoded_job job(std::string id, std::string group, std::string body) {
  return {std::move(id), std::move(group), std::move(body)};
}

claim_options opts(std::size_t max, std::string worker = "w1") {
  claim_options o;
  o.worker = std::move(worker);
  o.max = max;
  return o;
}

finish_item ack(std::string token, bool want_next = false, std::string unique_id = "") {
  finish_item f;
  f.token = std::move(token);
  f.kind = finish_kind::ack;
  f.unique_id = std::move(unique_id);
  f.want_next = want_next ? finish_item::next_policy::yes : finish_item::next_policy::no;
  return f;
}

finish_item fail(std::string token, std::string error, std::string unique_id = "") {
  finish_item f;
  f.token = std::move(token);
  f.kind = finish_kind::fail;
  f.unique_id = std::move(unique_id);
  f.error = std::move(error);
  return f;
}

std::vector<std::string> records(const std::vector<claimed_job>& jobs) {
  std::vector<std::string> out;
  for (auto& j : jobs) out.push_back(text(j.job));
  return out;
}

using jobrt::test::sleep_for;

// Acks one job with a one-item finish and returns whether the lease was held.
asio::awaitable<bool> ack_one(memory_backend& b, std::string queue, std::string token, bool want_next = false) {
  std::vector<finish_item> items;
  items.push_back(ack(std::move(token), want_next));
  auto out = co_await b.finish(std::move(queue), "w1", std::move(items), ttl);
  co_return out.at(0).lease_held;
}

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

TEST_CASE("memory backend - enqueue keeps order and assigns ids per queue from 1") {
  jobrt::test::run([](asio::io_context& ctx) -> asio::awaitable<void> {
    memory_backend b(ctx.get_executor());
    std::vector<encoded_job> first{job("", "", "a"), job("", "", "b"), job("", "", "c")};
    auto ids = co_await b.enqueue("q", std::move(first));
    REQUIRE(ids.size() == 3);
    CHECK(ids[0].id == "1");
    CHECK(ids[1].id == "2");
    CHECK(ids[2].id == "3");
    CHECK_FALSE(ids[2].duplicate);

    std::vector<encoded_job> second{job("", "", "d"), job("given", "", "e"), job("", "", "f")};
    ids = co_await b.enqueue("q", std::move(second));
    CHECK(ids[0].id == "4");
    CHECK(ids[1].id == "given");
    CHECK(ids[2].id == "5");

    std::vector<encoded_job> other{job("", "", "x")};
    auto other_ids = co_await b.enqueue("other", std::move(other));
    CHECK(other_ids.at(0).id == "1");  // each queue has its own sequence

    auto c = co_await b.counts("q");
    CHECK(c.ready_lanes == 6);
    CHECK(c.enqueued == 6);
    CHECK(c.started == 0);

    auto jobs = co_await b.claim("q", opts(4));
    std::vector<std::string> expected{"0|1|a", "0|2|b", "0|3|c", "0|4|d"};
    CHECK(records(jobs) == expected);
    CHECK(jobs[0].token == "1|j:0|1|a");
    CHECK(jobs[0].group.empty());
    CHECK(jobs[0].fence == 1);
    CHECK(jobs[3].fence == 4);
    jobs = co_await b.claim("q", opts(10));
    std::vector<std::string> rest{"0|given|e", "0|5|f"};
    CHECK(records(jobs) == rest);
    CHECK(jobs[0].fence == 5);  // fences grow across claims
    CHECK(jobs[1].fence == 6);
    CHECK((co_await b.claim("q", opts(10))).empty());

    c = co_await b.counts("q");
    CHECK(c.ready_lanes == 0);
    CHECK(c.running == 6);
    CHECK(c.started == 6);
    CHECK((co_await b.counts("other")).ready_lanes == 1);
    CHECK((co_await b.counts("unknown")).enqueued == 0);
  });
}

TEST_CASE("memory backend - a producer-given id is a duplicate while pending or running") {
  jobrt::test::run([](asio::io_context& ctx) -> asio::awaitable<void> {
    memory_backend b(ctx.get_executor());
    std::vector<encoded_job> first{job("x", "", "one"), job("y", "g", "two"), job("y", "g", "three")};
    auto ids = co_await b.enqueue("q", std::move(first));
    CHECK_FALSE(ids[0].duplicate);
    CHECK_FALSE(ids[1].duplicate);
    CHECK(ids[2].duplicate);  // given twice in one batch
    CHECK(ids[2].id == "y");

    std::vector<encoded_job> again{job("x", "", "four")};
    ids = co_await b.enqueue("q", std::move(again));
    CHECK(ids.at(0).duplicate);
    auto c = co_await b.counts("q");
    CHECK(c.enqueued == 2);
    CHECK(c.ready_lanes == 2);

    auto jobs = co_await b.claim("q", opts(1));
    REQUIRE(jobs.size() == 1);
    CHECK(text(jobs[0].job) == "0|x|one");
    std::vector<encoded_job> while_running{job("x", "", "five")};
    CHECK((co_await b.enqueue("q", std::move(while_running))).at(0).duplicate);

    // Finishing forgets the id the worker names, so it may be enqueued again.
    std::vector<finish_item> items{ack(jobs[0].token, false, "x")};
    CHECK((co_await b.finish("q", "w1", std::move(items), ttl)).at(0).lease_held);
    std::vector<encoded_job> after{job("x", "", "six")};
    ids = co_await b.enqueue("q", std::move(after));
    CHECK_FALSE(ids.at(0).duplicate);
    CHECK((co_await b.counts("q")).enqueued == 3);
  });
}

TEST_CASE("memory backend - jobs of a group are claimed one at a time and in order") {
  jobrt::test::run([](asio::io_context& ctx) -> asio::awaitable<void> {
    memory_backend b(ctx.get_executor());
    std::vector<encoded_job> batch{job("", "A", "a1"), job("", "", "u1"), job("", "B", "b1"), job("", "A", "a2"),
                                   job("", "A", "a3")};
    co_await b.enqueue("q", std::move(batch));
    // One lane per group, in the place of the group's first job.
    CHECK((co_await b.counts("q")).ready_lanes == 3);

    auto jobs = co_await b.claim("q", opts(10));
    std::vector<std::string> expected{"0|1|a1", "0|2|u1", "0|3|b1"};
    REQUIRE(records(jobs) == expected);
    CHECK(jobs[0].group == "A");
    CHECK(jobs[0].token == "1|g:A");
    CHECK(jobs[1].group.empty());
    CHECK(jobs[2].token == "3|g:B");
    CHECK((co_await b.claim("q", opts(10))).empty());  // a2 waits for a1

    std::vector<encoded_job> more{job("", "A", "a4")};
    co_await b.enqueue("q", std::move(more));
    CHECK((co_await b.counts("q")).ready_lanes == 0);  // A is busy: no second lane

    std::string token = jobs[0].token;
    std::vector<std::string> following{"0|4|a2", "0|5|a3", "0|6|a4"};
    for (const std::string& next : following) {
      CHECK((co_await ack_one(b, "q", token)));
      auto claimed = co_await b.claim("q", opts(10));
      REQUIRE(claimed.size() == 1);
      CHECK(text(claimed[0].job) == next);
      CHECK(claimed[0].group == "A");
      CHECK((co_await b.claim("q", opts(10))).empty());
      token = claimed[0].token;
    }
    CHECK((co_await ack_one(b, "q", token)));
    auto c = co_await b.counts("q");
    CHECK(c.ready_lanes == 0);  // A has no more work
    CHECK(c.running == 2);      // u1 and b1
    CHECK(c.completed == 4);
  });
}

TEST_CASE("memory backend - finishing a grouped job puts its lane at the tail of ready") {
  jobrt::test::run([](asio::io_context& ctx) -> asio::awaitable<void> {
    memory_backend b(ctx.get_executor());
    std::vector<encoded_job> batch{job("", "A", "a1"), job("", "A", "a2"), job("", "B", "b1"), job("", "B", "b2"),
                                   job("", "C", "c1")};
    co_await b.enqueue("q", std::move(batch));
    auto first = co_await b.claim("q", opts(1));
    REQUIRE(records(first) == std::vector<std::string>{"0|1|a1"});
    CHECK((co_await ack_one(b, "q", first[0].token)));
    auto jobs = co_await b.claim("q", opts(3));
    std::vector<std::string> expected{"0|3|b1", "0|5|c1", "0|2|a2"};  // A went behind B and C
    CHECK(records(jobs) == expected);

    CHECK((co_await ack_one(b, "q", jobs[0].token)));  // B: b2 goes to ready
    std::vector<encoded_job> late{job("", "", "u")};
    co_await b.enqueue("q", std::move(late));
    auto rest = co_await b.claim("q", opts(3));
    std::vector<std::string> in_order{"0|4|b2", "0|6|u"};
    CHECK(records(rest) == in_order);
  });
}

TEST_CASE("memory backend - want_next leases the next job of the group in the same finish") {
  jobrt::test::run([](asio::io_context& ctx) -> asio::awaitable<void> {
    memory_backend b(ctx.get_executor());
    std::vector<encoded_job> batch{job("", "A", "a1"), job("", "A", "a2"), job("", "A", "a3"), job("", "", "u")};
    co_await b.enqueue("q", std::move(batch));
    auto jobs = co_await b.claim("q", opts(2));
    REQUIRE(jobs.size() == 2);

    std::vector<finish_item> items{ack(jobs[0].token, true), ack(jobs[1].token, true)};
    auto out = co_await b.finish("q", "w1", std::move(items), ttl);
    REQUIRE(out.size() == 2);
    CHECK(out[0].lease_held);
    REQUIRE(out[0].next.has_value());
    CHECK(text(out[0].next->job) == "0|2|a2");
    CHECK(out[0].next->group == "A");
    CHECK(out[0].next->fence == 3);
    CHECK(out[0].next->token == "3|g:A");
    CHECK(out[1].lease_held);
    CHECK_FALSE(out[1].next.has_value());  // ungrouped: no next
    auto c = co_await b.counts("q");
    CHECK(c.ready_lanes == 0);  // the lane was not put back
    CHECK(c.running == 1);
    CHECK(c.started == 3);
    CHECK(c.completed == 2);

    std::vector<finish_item> second{ack(out[0].next->token, true)};
    out = co_await b.finish("q", "w1", std::move(second), ttl);
    REQUIRE(out.at(0).next.has_value());
    CHECK(text(out[0].next->job) == "0|3|a3");
    std::vector<finish_item> last{ack(out[0].next->token, true)};
    out = co_await b.finish("q", "w1", std::move(last), ttl);
    CHECK(out.at(0).lease_held);
    CHECK_FALSE(out[0].next.has_value());  // the group is empty
    c = co_await b.counts("q");
    CHECK(c.ready_lanes == 0);
    CHECK(c.running == 0);
    CHECK(c.completed == 4);
  });
}

TEST_CASE("memory backend - a failed job with want_next gives no next job and its group goes back to ready") {
  jobrt::test::run([](asio::io_context& ctx) -> asio::awaitable<void> {
    memory_backend b(ctx.get_executor());
    std::vector<encoded_job> batch{job("", "A", "a1"), job("", "A", "a2")};
    co_await b.enqueue("q", std::move(batch));
    auto jobs = co_await b.claim("q", opts(1));
    finish_item f = fail(jobs.at(0).token, "boom");
    f.want_next = finish_item::next_policy::yes;
    std::vector<finish_item> items{f};
    auto out = co_await b.finish("q", "w1", std::move(items), ttl);
    CHECK(out.at(0).lease_held);
    CHECK_FALSE(out[0].next.has_value());
    CHECK((co_await b.counts("q")).ready_lanes == 1);
    auto next = co_await b.claim("q", opts(1));
    CHECK(records(next) == std::vector<std::string>{"0|2|a2"});
  });
}

TEST_CASE("memory backend - a lost lease cannot finish or extend and changes nothing") {
  jobrt::test::run([](asio::io_context& ctx) -> asio::awaitable<void> {
    memory_backend b(ctx.get_executor());
    std::vector<encoded_job> batch{job("k", "", "one"), job("", "", "two")};
    co_await b.enqueue("q", std::move(batch));
    auto jobs = co_await b.claim("q", opts(2));
    REQUIRE(jobs.size() == 2);

    // The lease of "k" is lost (here: released), then its worker tries to finish it.
    std::vector<std::string> lost{jobs[0].token};
    co_await b.release("q", "w1", lost);
    auto before = co_await b.counts("q");
    std::vector<finish_item> items{ack(jobs[0].token, false, "k")};
    auto out = co_await b.finish("q", "w1", std::move(items), ttl);
    CHECK_FALSE(out.at(0).lease_held);
    CHECK_FALSE(out[0].next.has_value());
    auto after = co_await b.counts("q");
    CHECK(after.ready_lanes == before.ready_lanes);
    CHECK(after.running == before.running);
    CHECK(after.completed == before.completed);
    std::vector<encoded_job> again{job("k", "", "dup")};
    CHECK((co_await b.enqueue("q", std::move(again))).at(0).duplicate);  // the id was not forgotten

    std::vector<std::string> tokens{jobs[0].token, jobs[1].token};
    auto held = co_await b.extend("q", "w1", tokens, ttl);
    CHECK(held == std::vector<bool>{false, true});

    // A batch with a held and a lost token: the held one is finished.
    std::vector<finish_item> mixed{ack(jobs[0].token), fail(jobs[1].token, "e")};
    out = co_await b.finish("q", "w1", std::move(mixed), ttl);
    CHECK_FALSE(out.at(0).lease_held);
    CHECK(out.at(1).lease_held);
    std::vector<finish_item> twice{ack(jobs[1].token)};
    CHECK_FALSE((co_await b.finish("q", "w1", std::move(twice), ttl)).at(0).lease_held);
    auto c = co_await b.counts("q");
    CHECK(c.failed == 1);
    CHECK(c.completed == 0);
    CHECK(c.running == 0);
    CHECK(c.ready_lanes == 1);  // "k" is still there, as released
    std::vector<std::string> no_tokens;
    auto none = co_await b.extend("q", "w1", no_tokens, ttl);
    CHECK(none.empty());
  });
}

TEST_CASE("memory backend - a failed job is dead-lettered with its record and error") {
  jobrt::test::run([](asio::io_context& ctx) -> asio::awaitable<void> {
    memory_backend b(ctx.get_executor());
    std::vector<encoded_job> batch{job("job-7", "", "xyz"), job("", "G", "grouped")};
    co_await b.enqueue("q", std::move(batch));
    auto jobs = co_await b.claim("q", opts(2));
    REQUIRE(jobs.size() == 2);
    auto start = now_ms();
    std::vector<finish_item> items{fail(jobs[0].token, "boom", "job-7"), fail(jobs[1].token, "bang")};
    auto out = co_await b.finish("q", "w1", std::move(items), ttl);
    CHECK(out.at(0).lease_held);
    CHECK(out.at(1).lease_held);
    auto c = co_await b.counts("q");
    CHECK(c.dead == 2);
    CHECK(c.failed == 2);
    CHECK(c.completed == 0);
    CHECK(c.running == 0);
    CHECK(c.ready_lanes == 0);

    auto dead = co_await b.dead_letters("q", 0, 100);
    REQUIRE(dead.size() == 2);
    // Same time: ordered by id, as a zset orders equal scores.
    auto& first = dead[0].id == "1" ? dead[0] : dead[1];
    auto& second = dead[0].id == "1" ? dead[1] : dead[0];
    CHECK(first.record == "0|1|grouped");
    CHECK(first.error == "bang");
    CHECK(second.id == "job-7");
    CHECK(second.record == "0|job-7|xyz");
    CHECK(second.error == "boom");
    CHECK(second.at_ms >= start);
    CHECK(second.at_ms <= now_ms());
    CHECK((co_await b.dead_letters("unknown", 0, 100)).empty());
    CHECK(first.group == "G");
    CHECK(second.group.empty());

    std::vector<encoded_job> again{job("job-7", "", "retry")};
    CHECK_FALSE((co_await b.enqueue("q", std::move(again))).at(0).duplicate);
  });
}

TEST_CASE("memory backend - release puts jobs back at the head in the order of the tokens") {
  jobrt::test::run([](asio::io_context& ctx) -> asio::awaitable<void> {
    memory_backend b(ctx.get_executor());
    std::vector<encoded_job> batch{job("", "", "1"), job("", "", "2"), job("", "G", "3"), job("", "G", "4"),
                                   job("", "", "5")};
    co_await b.enqueue("q", std::move(batch));
    auto jobs = co_await b.claim("q", opts(3));
    REQUIRE(records(jobs) == std::vector<std::string>{"0|1|1", "0|2|2", "0|3|3"});
    CHECK((co_await b.counts("q")).started == 3);

    std::vector<std::string> tokens{jobs[2].token, jobs[0].token, "99|j:0|9|unknown"};
    co_await b.release("q", "w1", tokens);
    auto c = co_await b.counts("q");
    CHECK(c.started == 1);  // no attempt counted for the two released
    CHECK(c.running == 1);
    CHECK(c.ready_lanes == 3);

    auto again = co_await b.claim("q", opts(10));
    // Records unchanged ('0|'): a release is not an attempt.
    std::vector<std::string> expected{"0|3|3", "0|1|1", "0|5|5"};
    CHECK(records(again) == expected);
    CHECK(again[0].group == "G");
    CHECK(again[0].fence > jobs[2].fence);  // a new lease, a new fence
    // Releasing again (the old tokens) does nothing.
    co_await b.release("q", "w1", tokens);
    CHECK((co_await b.counts("q")).ready_lanes == 0);
  });
}

TEST_CASE("memory backend - claim_wait wakes within milliseconds when another coroutine enqueues") {
  jobrt::test::run([](asio::io_context& ctx) -> asio::awaitable<void> {
    memory_backend b(ctx.get_executor());
    std::chrono::steady_clock::time_point enqueued_at;
    auto produce = [](memory_backend& backend, std::chrono::steady_clock::time_point& at) -> asio::awaitable<void> {
      co_await sleep_for(50ms);
      std::vector<encoded_job> batch{job("", "", "late")};
      at = std::chrono::steady_clock::now();
      co_await backend.enqueue("q", std::move(batch));
    };
    auto start = std::chrono::steady_clock::now();
    auto jobs = co_await (b.claim_wait("q", opts(5), 10s) && produce(b, enqueued_at));
    auto woke = std::chrono::steady_clock::now();
    REQUIRE(jobs.size() == 1);
    CHECK(text(jobs[0].job) == "0|1|late");
    CHECK(woke - start >= 50ms);
    CHECK(woke - enqueued_at < 200ms);
    MESSAGE("woken " << std::chrono::duration_cast<std::chrono::microseconds>(woke - enqueued_at).count()
                     << " us after the enqueue");

    // Ready work is claimed at once, without waiting.
    std::vector<encoded_job> batch{job("", "", "now")};
    co_await b.enqueue("q", std::move(batch));
    start = std::chrono::steady_clock::now();
    auto at_once = co_await b.claim_wait("q", opts(5), 10s);
    CHECK(at_once.size() == 1);
    CHECK(std::chrono::steady_clock::now() - start < 200ms);

    // A group lane made ready by finish wakes a waiter too.
    std::vector<encoded_job> grouped{job("", "G", "g1"), job("", "G", "g2")};
    co_await b.enqueue("q", std::move(grouped));
    auto g1 = co_await b.claim("q", opts(1));
    REQUIRE(g1.size() == 1);
    auto finish_later = [](memory_backend& backend, std::string token) -> asio::awaitable<void> {
      co_await sleep_for(20ms);
      std::vector<finish_item> items{ack(std::move(token))};
      co_await backend.finish("q", "w1", std::move(items), ttl);
    };
    auto g2 = co_await (b.claim_wait("q", opts(5), 10s) && finish_later(b, g1[0].token));
    CHECK(records(g2) == std::vector<std::string>{"0|4|g2"});
  });
}

TEST_CASE("memory backend - claim_wait returns empty after its wait when nothing arrives") {
  jobrt::test::run([](asio::io_context& ctx) -> asio::awaitable<void> {
    memory_backend b(ctx.get_executor());
    auto start = std::chrono::steady_clock::now();
    auto jobs = co_await b.claim_wait("q", opts(5), 100ms);
    auto waited = std::chrono::steady_clock::now() - start;
    CHECK(jobs.empty());
    CHECK(waited >= 100ms);
    CHECK(waited < 2s);
    CHECK((co_await b.claim_wait("q", opts(5), 0ms)).empty());
  });
}

TEST_CASE("memory backend - a cancelled claim_wait takes nothing and ends at once") {
  jobrt::test::run([](asio::io_context& ctx) -> asio::awaitable<void> {
    memory_backend b(ctx.get_executor());
    auto start = std::chrono::steady_clock::now();
    auto result = co_await (b.claim_wait("q", opts(5), 10s) || sleep_for(30ms));
    CHECK(result.index() == 1);
    CHECK(std::chrono::steady_clock::now() - start < 2s);

    // The cancelled waiter is gone: the next enqueue's wake is not spent on it.
    std::vector<encoded_job> batch{job("", "", "x")};
    auto take_later = [](memory_backend& backend) -> asio::awaitable<std::vector<claimed_job>> {
      co_return co_await backend.claim_wait("q", opts(5), 10s);
    };
    auto enqueue_later = [](memory_backend& backend, std::vector<encoded_job> jobs) -> asio::awaitable<void> {
      co_await sleep_for(20ms);
      co_await backend.enqueue("q", std::move(jobs));
    };
    start = std::chrono::steady_clock::now();
    auto jobs = co_await (take_later(b) && enqueue_later(b, std::move(batch)));
    CHECK(jobs.size() == 1);
    CHECK(std::chrono::steady_clock::now() - start < 2s);
  });
}

namespace {

struct stress_state {
  std::atomic<int> done{0};
  std::mutex mutex;
  std::set<std::string> seen;
  std::map<std::string, long> last_in_group;
  bool in_order = true;
  int duplicates = 0;
};

constexpr int stress_jobs = 2000;

asio::awaitable<void> stress_claimer(memory_backend& b, stress_state& s, std::string worker) {
  auto give_up = std::chrono::steady_clock::now() + 15s;
  while (s.done.load() < stress_jobs && std::chrono::steady_clock::now() < give_up) {
    auto jobs = co_await b.claim_wait("q", opts(3, worker), 50ms);
    std::vector<finish_item> items;
    for (auto& j : jobs) {
      {
        std::lock_guard lock(s.mutex);
        auto id = j.job.id;
        if (!s.seen.insert(id).second) ++s.duplicates;
        if (!j.group.empty()) {
          long n = std::stol(id);
          auto& last = s.last_in_group[j.group];
          if (n <= last) s.in_order = false;
          last = n;
        }
      }
      items.push_back(ack(j.token));
    }
    if (items.empty()) continue;
    auto out = co_await b.finish("q", worker, std::move(items), ttl);
    s.done += static_cast<int>(out.size());
  }
}

asio::awaitable<void> stress_producer(memory_backend& b) {
  for (int i = 0; i < stress_jobs; i += 10) {
    std::vector<encoded_job> batch;
    for (int k = 0; k < 10; ++k) {
      int n = i + k;
      batch.push_back(job("", n % 3 == 0 ? "" : "g" + std::to_string(n % 7), "body"));
    }
    co_await b.enqueue("q", std::move(batch));
    if (i % 100 == 0) co_await sleep_for(1ms);  // let the claimers drain and fall asleep
  }
}

}  // namespace

namespace {

asio::awaitable<void> stress_all(memory_backend& b, stress_state& s, asio::thread_pool& pool) {
  auto ex = pool.get_executor();
  co_await (asio::co_spawn(ex, stress_claimer(b, s, "w1"), asio::use_awaitable) &&
            asio::co_spawn(ex, stress_claimer(b, s, "w2"), asio::use_awaitable) &&
            asio::co_spawn(ex, stress_claimer(b, s, "w3"), asio::use_awaitable) &&
            asio::co_spawn(ex, stress_producer(b), asio::use_awaitable));
  // The pool's threads may still hold copies of this io_context's executor while they finish the
  // co_spawns, and run() destroys the io_context as soon as this coroutine returns.
  pool.join();
}

asio::awaitable<void> check_stress_counts(memory_backend& b) {
  auto c = co_await b.counts("q");
  CHECK(c.completed == stress_jobs);
  CHECK(c.started == stress_jobs);
  CHECK(c.running == 0);
  CHECK(c.ready_lanes == 0);
}

}  // namespace

TEST_CASE("memory backend - claim_wait and finish from several threads") {
  asio::thread_pool pool(2);
  memory_backend b(pool.get_executor());
  stress_state s;
  // The claimers run on the pool's two threads, with no strand: wakes cross threads.
  jobrt::test::run([&](asio::io_context&) { return stress_all(b, s, pool); });
  CHECK(s.done.load() == stress_jobs);
  CHECK(s.seen.size() == static_cast<std::size_t>(stress_jobs));
  CHECK(s.duplicates == 0);
  CHECK(s.in_order);
  jobrt::test::run([&](asio::io_context&) { return check_stress_counts(b); });
}

TEST_CASE("a queue's name may not be empty, hold a brace or name a shard: producers and workers refuse it, naming it") {
  boost::asio::io_context ctx;
  jobrt::memory_backend b(ctx.get_executor());
  CHECK_THROWS_WITH_AS(jobrt::producer(b, ""), "queue name is empty", std::invalid_argument);
  CHECK_THROWS_WITH_AS(jobrt::producer(b, "a}:b"),
                       "queue name 'a}:b' holds '{' or '}', which would break its keys' hash tag",
                       std::invalid_argument);
  jobrt::worker_options o;
  o.queue = "{x";
  CHECK_THROWS_WITH_AS(jobrt::worker(ctx.get_executor(), b, o),
                       "queue name '{x' holds '{' or '}', which would break its keys' hash tag", std::invalid_argument);
  // A shard's name: "<queue>#<k>" (sharded_backend).
  CHECK_THROWS_WITH_AS(jobrt::producer(b, "orders#12"),
                       "queue name 'orders#12' ends in '#' and digits, which name a shard of queue 'orders'",
                       std::invalid_argument);
  CHECK_NOTHROW(jobrt::producer(b, "orders#eu"));
  CHECK_NOTHROW(jobrt::producer(b, "orders#"));
  CHECK_NOTHROW(jobrt::producer(b, "orders:eu|1 x"));  // anything else goes
}

TEST_CASE(
    "a sharded_backend that looks at a queue before its producers stored a shard count follows the count they store") {
  jobrt::test::run([](asio::io_context& ctx) -> asio::awaitable<void> {
    memory_backend inner(ctx.get_executor());
    jobrt::sharded_backend looks(inner, 0, jobrt::sharded_backend::when_unknown::look);  // (a dashboard)
    CHECK((co_await looks.counts("orders")).enqueued == 0);
    CHECK(co_await looks.shards_of("orders") == 1);
    jobrt::sharded_backend writes(inner, 4);
    jobrt::producer p(writes, "orders");
    std::vector<jobrt::job_spec> specs(6);
    for (auto& s : specs) s.type = "t";
    co_await p.enqueue_bulk(std::move(specs));
    CHECK(co_await looks.shards_of("orders") == 4);
    CHECK((co_await looks.counts("orders")).enqueued == 6);
    CHECK((co_await looks.counts("orders")).ready_lanes == 6);
  });
}
