// The worker's lease keeper (runtime/src/worker/lease_keeper.hpp) on its own, over the memory
// backend: it renews a lease before it would expire (the reaper finds nothing of it to recover
// long after its first TTL), reports a lease that was taken away through its hook, and stop()
// ends a renewal the backend does not answer promptly, with no call made after it.
#include "worker/lease_keeper.hpp"

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
using jobrt::detail::lease_keeper;
using jobrt::detail::lease_keeper_hooks;
using jobrt::detail::lease_keeper_options;
using jobrt::test::counting_backend;
using jobrt::test::eventually;
using steady = std::chrono::steady_clock;

namespace {

lease_keeper_options options(std::chrono::milliseconds ttl, std::chrono::milliseconds period) {
  lease_keeper_options o;
  o.queue = "q";
  o.worker = "w1";
  o.lease_ttl = ttl;
  o.period = period;
  return o;
}

// Enqueues `count` jobs and claims them as w1, each with a lease of `ttl`: their tokens.
awaitable<std::vector<std::string>> claim(jobrt::backend& b, std::size_t count, std::chrono::milliseconds ttl) {
  std::vector<jobrt::encoded_job> jobs;
  for (std::size_t i = 0; i < count; ++i) {
    jobrt::encoded_job j;
    j.id = "j" + std::to_string(i + 1);
    j.body = "{\"type\":\"t\"}";
    jobs.push_back(std::move(j));
  }
  co_await b.enqueue("q", std::move(jobs));
  jobrt::claim_options co;
  co.worker = "w1";
  co.max = count;
  co.lease_ttl = ttl;
  auto claimed = co_await b.claim("q", co);
  std::vector<std::string> tokens;
  for (auto& c : claimed) tokens.push_back(c.token);
  co_return tokens;
}

// What the keeper told the test through its hooks.
struct heard {
  std::size_t asked = 0;     // tokens
  std::size_t answered = 0;  // renewals answered
  std::size_t held = 0;      // of the kept token
  steady::time_point valid_until{};
  std::vector<std::string> lost;
  std::size_t overdue = 0;
};

lease_keeper_hooks hooks_for(heard& h, const std::vector<std::string>& tokens) {
  lease_keeper_hooks hooks;
  hooks.tokens = [&h, &tokens] {
    ++h.asked;
    return tokens;
  };
  hooks.answered = [&h] { ++h.answered; };
  hooks.held = [&h](const std::string&, steady::time_point valid_until) {
    ++h.held;
    h.valid_until = valid_until;
  };
  hooks.lost = [&h](const std::string& token) { h.lost.push_back(token); };
  hooks.overdue = [&h] { ++h.overdue; };
  return hooks;
}

}  // namespace

TEST_CASE("lease keeper - renews a held lease before it would expire") {
  jobrt::test::run(
      [](asio::io_context& ctx) -> awaitable<void> {
        counting_backend b(ctx.get_executor());
        constexpr auto ttl = 300ms;
        // Two leases of one TTL: the keeper renews the first; the second, which nobody renews,
        // shows that a lease left alone does expire meanwhile.
        auto claimed = co_await claim(b, 2, ttl);
        REQUIRE(claimed.size() == 2);
        std::vector<std::string> kept(1, claimed[0]);
        heard h;
        auto began = steady::now();
        auto keeper = std::make_shared<lease_keeper>(ctx.get_executor(), b, options(ttl, ttl / 3), "worker test",
                                                     hooks_for(h, kept));
        keeper->start();
        // Several TTLs, and a renewal at least every period meanwhile.
        CHECK(co_await eventually([&] { return steady::now() - began > 3 * ttl && h.held >= 9; }, 10s));
        CHECK(h.lost.empty());
        CHECK(h.answered == h.held);
        CHECK(h.asked >= h.answered);
        CHECK(h.overdue >= h.answered);
        CHECK(h.valid_until > steady::now());  // (the last renewal was sent less than a TTL ago)
        auto r = co_await b.inner().reap("q", jobrt::reap_options{});
        CHECK(r.leases == 1);  // the lease nobody renewed, not the kept one
        auto still = co_await b.inner().extend("q", "w1", kept, ttl);
        REQUIRE(still.size() == 1);
        CHECK(still[0]);
        co_await keeper->stop();
        CHECK(b.in_flight() == 0);
      },
      20s);
}

TEST_CASE("lease keeper - reports a lease taken away through its hook") {
  jobrt::test::run(
      [](asio::io_context& ctx) -> awaitable<void> {
        counting_backend b(ctx.get_executor());
        auto claimed = co_await claim(b, 2, 30s);
        REQUIRE(claimed.size() == 2);
        heard h;
        auto keeper = std::make_shared<lease_keeper>(ctx.get_executor(), b, options(30s, 10ms), "worker test",
                                                     hooks_for(h, claimed));
        keeper->start();
        CHECK(co_await eventually([&] { return h.held >= 2; }, 5s));
        CHECK(h.lost.empty());
        // The first job is finished behind the keeper's back: its lease is gone.
        std::vector<jobrt::finish_item> items(1);
        items[0].token = claimed[0];
        items[0].kind = jobrt::finish_kind::ack;
        auto done = co_await b.inner().finish("q", "w1", std::move(items), 30s);
        REQUIRE(done.size() == 1);
        CHECK(done[0].lease_held);
        CHECK(co_await eventually([&] { return !h.lost.empty(); }, 5s));
        CHECK(h.lost.front() == claimed[0]);
        // The other is still held, and still renewed.
        auto held_before = h.held;
        CHECK(co_await eventually([&] { return h.held > held_before; }, 5s));
        co_await keeper->stop();
        for (auto& token : h.lost) CHECK(token == claimed[0]);
      },
      10s);
}

TEST_CASE("lease keeper - stop ends a renewal the backend does not answer and no call follows") {
  jobrt::test::run(
      [](asio::io_context& ctx) -> awaitable<void> {
        counting_backend b(ctx.get_executor());
        auto claimed = co_await claim(b, 1, 30s);
        REQUIRE(claimed.size() == 1);
        b.shut_extends();
        heard h;
        // Each renewal's bound is the period, a second: far longer than stop may take.
        auto keeper = std::make_shared<lease_keeper>(ctx.get_executor(), b, options(3s, 1s), "worker test",
                                                     hooks_for(h, claimed));
        keeper->start();
        CHECK(co_await eventually([&] { return b.extends_held() == 1; }, 5s));
        auto began = steady::now();
        co_await keeper->stop();
        CHECK(steady::now() - began < 500ms);
        CHECK(b.in_flight() == 0);  // the renewal ended before stop() returned
        CHECK(b.extends_held() == 0);
        CHECK(h.answered == 0);
        CHECK(h.held == 0);
        CHECK(h.lost.empty());
        auto calls = b.calls();
        auto asked = h.asked;
        auto overdue = h.overdue;
        // Nothing of the loop is left to call the backend or a hook: it held the keeper, and it
        // is gone.
        std::weak_ptr<lease_keeper> left = keeper;
        keeper.reset();
        CHECK(co_await eventually([&] { return left.expired(); }, 1s));
        CHECK(b.calls() == calls);
        CHECK(b.extends() == 1);
        CHECK(h.asked == asked);
        CHECK(h.overdue == overdue);
        // A second stop, and start after stop, do nothing.
        auto again = std::make_shared<lease_keeper>(ctx.get_executor(), b, options(3s, 1ms), "worker test",
                                                    hooks_for(h, claimed));
        co_await again->stop();
        again->start();
        co_await again->stop();
        CHECK(b.calls() == calls);
      },
      10s);
}
