// The worker's claimer (runtime/src/worker/claimer.hpp) on its own, over the memory backend: it
// sends the first heartbeat before its first claim, claims for the free slots only and again when
// one frees, says when a claim is on its way, expires an earlier run's leases, asks again after a
// failed claim, and stop() ends a claim waiting in the backend with no call made after it.
#include "worker/claimer.hpp"

#include <jobrt/memory_backend.hpp>

#include "support/counting_backend.hpp"
#include "support/run.hpp"

#include <doctest/doctest.h>
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace asio = boost::asio;
using namespace std::chrono_literals;
using asio::awaitable;
using jobrt::detail::claimer;
using jobrt::detail::claimer_hooks;
using jobrt::detail::claimer_options;
using jobrt::test::counting_backend;
using jobrt::test::eventually;
using steady = std::chrono::steady_clock;

namespace {

claimer_options options(std::size_t concurrency) {
  claimer_options o;
  o.queue = "q";
  o.worker = "w1";
  o.concurrency = concurrency;
  o.lease_ttl = 30s;
  o.claim_wait = 30s;  // longer than any test: a claim that waits ends only with work or stop
  return o;
}

// Jobs j<first> to j<first + count - 1>.
awaitable<void> enqueue(jobrt::backend& b, int first, int count) {
  std::vector<jobrt::encoded_job> jobs;
  for (int i = first; i < first + count; ++i) {
    jobrt::encoded_job j;
    j.id = "j" + std::to_string(i);
    j.body = "{\"type\":\"t\"}";
    jobs.push_back(std::move(j));
  }
  co_await b.enqueue("q", std::move(jobs));
}

// The worker's side: its free slots, and what the claimer told it.
struct slots {
  std::size_t free = 0;
  std::size_t refused = 0;  // free_slots calls told that none is free
  std::vector<std::string> claimed;
  std::size_t extends_at_first_claim = 0;
  std::vector<std::int64_t> expired;
  bool claiming = false;  // a claim is on its way
  std::size_t claims = 0;
};

claimer_hooks hooks_for(slots& s, counting_backend& b) {
  claimer_hooks h;
  h.free_slots = [&s] {
    if (s.free == 0) ++s.refused;
    return s.free;
  };
  h.claimed = [&s, &b](jobrt::claimed_job c) {
    if (s.claimed.empty()) s.extends_at_first_claim = b.extends();
    s.claimed.push_back(c.job.id);
    --s.free;
  };
  h.expired = [&s](std::int64_t n) { s.expired.push_back(n); };
  h.claiming = [&s](bool out) {
    CHECK(s.claiming != out);
    s.claiming = out;
    if (out) ++s.claims;
  };
  return h;
}

}  // namespace

TEST_CASE("claimer - claims for free slots only, again when one frees, and says when a claim is on its way") {
  jobrt::test::run(
      [](asio::io_context& ctx) -> awaitable<void> {
        counting_backend b(ctx.get_executor());
        co_await enqueue(b, 1, 3);
        slots s;
        s.free = 2;
        auto part = std::make_shared<claimer>(ctx.get_executor(), b, options(2), "worker test", hooks_for(s, b));
        auto owner = std::make_shared<int>(0);
        std::weak_ptr<int> held = owner;
        part->start(std::move(owner));
        CHECK(co_await eventually([&] { return s.claimed.size() == 2; }, 5s));
        CHECK(s.extends_at_first_claim == 1);  // the first heartbeat came before the first claim
        CHECK(s.claimed == std::vector<std::string>{"j1", "j2"});
        // No slot is free: the claimer waits for one (it asked, and was told none) and leaves j3.
        CHECK(co_await eventually([&] { return s.refused == 1; }, 5s));
        CHECK_FALSE(s.claiming);
        auto claims = b.claims();
        CHECK((co_await b.inner().counts("q")).ready_lanes == 1);
        s.free = 1;
        part->slot_freed();
        CHECK(co_await eventually([&] { return s.claimed.size() == 3; }, 5s));
        CHECK(b.claims() == claims + 1);
        CHECK(s.claimed.back() == "j3");
        // Nothing else is ready: the next claim waits in the backend until some comes.
        s.free = 1;
        part->slot_freed();
        CHECK(co_await eventually([&] { return s.claiming && b.claims_in_flight() == 1; }, 5s));
        claims = b.claims();
        co_await enqueue(b, 4, 1);
        CHECK(co_await eventually([&] { return s.claimed.size() == 4; }, 5s));
        CHECK(b.claims() == claims);    // the waiting claim took it
        CHECK(held.lock() != nullptr);  // the loop holds its owner while it runs
        co_await part->stop();
        CHECK(held.expired());  // ...and lets go of it when it ends
        CHECK(b.claims_in_flight() == 0);
      },
      20s);
}

TEST_CASE("claimer - expires an earlier run's leases first, and asks again after a failed claim") {
  jobrt::test::run(
      [](asio::io_context& ctx) -> awaitable<void> {
        counting_backend b(ctx.get_executor());
        co_await enqueue(b, 1, 2);
        jobrt::claim_options earlier;
        earlier.worker = "w1";
        earlier.max = 1;
        earlier.lease_ttl = 30s;
        auto earlier_run = co_await b.inner().claim("q", earlier);  // j1, by w1's earlier run
        REQUIRE(earlier_run.size() == 1);
        std::vector<std::string> renewed(1, earlier_run[0].token);
        co_await b.inner().extend("q", "w1", renewed, 30s);
        b.fail_claims(2);
        slots s;
        s.free = 4;
        auto part = std::make_shared<claimer>(ctx.get_executor(), b, options(4), "worker test", hooks_for(s, b));
        auto began = steady::now();
        part->start(nullptr);
        CHECK(co_await eventually([&] { return s.claimed.size() == 1; }, 5s));
        CHECK(s.expired == std::vector<std::int64_t>{1});
        CHECK(s.claimed.front() == "j2");  // j1's lease expired; the reaper (not here) sends it back
        CHECK(b.claims() >= 3);            // two refused, then one that got through
        CHECK(s.claims == b.claims());
        // After each failure a pause: 100 ms, then 200 ms.
        CHECK(steady::now() - began >= 300ms);
        CHECK((co_await b.inner().reap("q", jobrt::reap_options{})).leases == 1);
        CHECK(co_await eventually([&] { return s.claimed.size() == 2; }, 5s));
        CHECK(s.claimed.back() == "j1");
        co_await part->stop();
      },
      20s);
}

TEST_CASE("claimer - stop ends a claim waiting in the backend, and no call follows") {
  jobrt::test::run(
      [](asio::io_context& ctx) -> awaitable<void> {
        counting_backend b(ctx.get_executor());
        slots s;
        s.free = 1;
        auto part = std::make_shared<claimer>(ctx.get_executor(), b, options(1), "worker test", hooks_for(s, b));
        part->start(nullptr);
        CHECK(co_await eventually([&] { return s.claiming && b.claims_in_flight() == 1; }, 5s));
        auto began = steady::now();
        co_await part->stop();
        CHECK(steady::now() - began < 1s);  // not claim_wait's 30 s
        CHECK(b.claims_in_flight() == 0);
        CHECK_FALSE(s.claiming);
        auto claims = b.claims();
        auto extends = b.extends();
        std::weak_ptr<claimer> left = part;
        part.reset();
        CHECK(co_await eventually([&] { return left.expired(); }, 1s));
        co_await enqueue(b, 1, 1);  // nobody claims it
        CHECK(b.claims() == claims);
        CHECK(b.extends() == extends);
        CHECK(s.claimed.empty());
        CHECK((co_await b.inner().counts("q")).ready_lanes == 1);
        // A second stop, and start after stop, do nothing.
        auto again = std::make_shared<claimer>(ctx.get_executor(), b, options(1), "worker test", hooks_for(s, b));
        co_await again->stop();
        again->start(nullptr);
        co_await again->stop();
        CHECK(b.claims() == claims);
        CHECK(b.extends() == extends);
      },
      10s);
}
