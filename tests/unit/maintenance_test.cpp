// The worker's maintenance part (runtime/src/worker/maintenance.hpp) on its own, over the memory
// backend: the reaper recovers an expired lease, the promoter moves a delayed job when it comes
// due, the reaper says which types run here and asks about others, and stop() ends both loops
// promptly, with a reap held at a gate, and leaves nothing that calls the backend.
#include "worker/maintenance.hpp"

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
using jobrt::detail::maintenance;
using jobrt::detail::maintenance_hooks;
using jobrt::detail::maintenance_options;
using jobrt::test::counting_backend;
using jobrt::test::eventually;

namespace {

maintenance_options options() {
  maintenance_options o;
  o.queue = "q";
  o.lease_ttl = 30s;  // the bound of each reaper call: longer than any test
  o.reap_period = 5ms;
  o.promote_backstop = 60s;
  return o;
}

jobrt::encoded_job job(std::string id, std::string type) {
  jobrt::encoded_job j;
  j.id = std::move(id);
  j.body = "{\"type\":\"" + type + "\"}";
  return j;
}

}  // namespace

TEST_CASE("maintenance - the reaper recovers an expired lease and tells the worker") {
  jobrt::test::run(
      [](asio::io_context& ctx) -> awaitable<void> {
        counting_backend b(ctx.get_executor());
        std::vector<jobrt::encoded_job> jobs;
        jobs.push_back(job("j1", "t"));
        co_await b.enqueue("q", std::move(jobs));
        jobrt::claim_options co;
        co.worker = "w1";
        co.lease_ttl = 1ms;
        auto claimed = co_await b.claim("q", co);
        REQUIRE(claimed.size() == 1);
        CHECK((co_await b.counts("q")).ready_lanes == 0);

        std::int64_t recovered = 0;
        std::vector<std::string> types;
        maintenance_hooks hooks;
        hooks.recovered = [&](const jobrt::reap_result& r) {
          recovered += r.leases;
          types.insert(types.end(), r.recovered_types.begin(), r.recovered_types.end());
        };
        auto part = std::make_shared<maintenance>(ctx.get_executor(), b, options(), "worker test", std::move(hooks));
        part->start(std::vector<std::string>());
        CHECK(co_await eventually([&] { return recovered == 1; }, 5s));
        REQUIRE(types.size() == 1);
        CHECK(types[0] == "t");
        auto counts = co_await b.counts("q");
        CHECK(counts.ready_lanes == 1);  // the job is ready again
        CHECK(counts.running == 0);
        CHECK(counts.recovered == 1);
        co_await part->stop();
        auto again = co_await b.claim("q", co);
        REQUIRE(again.size() == 1);
        CHECK(again[0].job.id == "j1");
        CHECK(again[0].job.attempts == 1);  // the expired lease counted an attempt
      },
      10s);
}

TEST_CASE("maintenance - the promoter moves a delayed job when it comes due") {
  jobrt::test::run(
      [](asio::io_context& ctx) -> awaitable<void> {
        counting_backend b(ctx.get_executor());
        std::int64_t promoted = 0;
        maintenance_hooks hooks;
        hooks.promoted = [&](std::int64_t moved) { promoted += moved; };
        auto part = std::make_shared<maintenance>(ctx.get_executor(), b, options(), "worker test", std::move(hooks));
        part->start(std::vector<std::string>());
        // Enqueued after the promoter found the delayed set empty: the backend wakes it, and it
        // waits for the due time, not for its backstop (a minute).
        CHECK(co_await eventually([&] { return b.delayed_waits() == 1; }, 5s));
        std::vector<jobrt::encoded_job> jobs;
        jobs.push_back(job("d1", "t"));
        jobs.back().delay_ms = 50;
        co_await b.enqueue("q", std::move(jobs));
        auto counts = co_await b.counts("q");
        CHECK(counts.delayed == 1);
        CHECK(counts.ready_lanes == 0);
        CHECK(co_await eventually([&] { return promoted == 1; }, 5s));
        counts = co_await b.counts("q");
        CHECK(counts.delayed == 0);
        CHECK(counts.ready_lanes == 1);
        co_await part->stop();
      },
      10s);
}

TEST_CASE("maintenance - the reaper advertises the handled types and asks about the unhandled ones") {
  jobrt::test::run(
      [](asio::io_context& ctx) -> awaitable<void> {
        counting_backend b(ctx.get_executor());
        std::vector<std::pair<std::string, std::chrono::milliseconds>> heard;
        std::size_t asked = 0;
        maintenance_hooks hooks;
        hooks.unhandled_types = [&](std::chrono::steady_clock::time_point) {
          ++asked;
          return std::vector<std::string>(1, "x");
        };
        hooks.unrunnable = [&](const std::string& type, std::chrono::milliseconds none_for) {
          heard.emplace_back(type, none_for);
        };
        auto part = std::make_shared<maintenance>(ctx.get_executor(), b, options(), "worker test", std::move(hooks));
        part->start(std::vector<std::string>(1, "a"));
        CHECK(co_await eventually([&] { return !heard.empty(); }, 5s));
        CHECK(heard.front().first == "x");
        CHECK(heard.front().second == std::chrono::milliseconds::max());  // nobody ever ran it
        CHECK(co_await b.inner().unrunnable_for("q", "a") == 0ms);        // advertised
        CHECK(asked >= 1);
        co_await part->stop();
      },
      10s);
}

TEST_CASE("maintenance - stop ends a reap the backend does not answer and leaves no call behind") {
  jobrt::test::run(
      [](asio::io_context& ctx) -> awaitable<void> {
        counting_backend b(ctx.get_executor());
        b.shut_reaps();
        auto part = std::make_shared<maintenance>(ctx.get_executor(), b, options(), "worker test", maintenance_hooks{});
        part->start(std::vector<std::string>(1, "a"));
        // The reaper waits at the gate (its bound is 30 s); the promoter waits on the backend's
        // wake-ups (its backstop is a minute).
        CHECK(co_await eventually([&] { return b.reaps_held() == 1 && b.in_flight() == 2; }, 5s));
        auto began = std::chrono::steady_clock::now();
        co_await part->stop();
        CHECK(std::chrono::steady_clock::now() - began < 2s);
        CHECK(b.in_flight() == 0);  // both calls ended before stop() returned
        CHECK(b.reaps_held() == 0);
        auto calls = b.calls();
        // Nothing of the loops is left to call the backend: they held the part, and it is gone.
        std::weak_ptr<maintenance> left = part;
        part.reset();
        CHECK(co_await eventually([&] { return left.expired(); }, 1s));
        CHECK(b.calls() == calls);
        // A second stop, and start after stop, do nothing.
        auto again =
            std::make_shared<maintenance>(ctx.get_executor(), b, options(), "worker test", maintenance_hooks{});
        co_await again->stop();
        again->start(std::vector<std::string>());
        co_await again->stop();
        CHECK(b.calls() == calls);
      },
      10s);
}
