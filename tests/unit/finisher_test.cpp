// The worker's finisher (runtime/src/worker/finisher.hpp) on its own, over the memory backend: one
// call carries every result that came while the calls before it were on their way, a token's
// results reach the backend in the order they came, a failed call is sent again, and stop() ends
// a call the backend does not answer, drops what waits, and calls nothing after.
#include "worker/finisher.hpp"

#include <jobrt/memory_backend.hpp>

#include "support/counting_backend.hpp"
#include "support/run.hpp"

#include <doctest/doctest.h>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace asio = boost::asio;
using namespace std::chrono_literals;
using asio::awaitable;
using jobrt::detail::finish_note;
using jobrt::detail::finisher;
using jobrt::detail::finisher_hooks;
using jobrt::detail::finisher_options;
using jobrt::test::counting_backend;
using jobrt::test::eventually;
using steady = std::chrono::steady_clock;

namespace {

finisher_options options() {
  finisher_options o;
  o.queue = "q";
  o.worker = "w1";
  o.lease_ttl = 30s;
  o.calls_max = 2;
  return o;
}

// Enqueues `count` jobs and claims them as w1: their tokens, in the order of their ids j1, j2, ...
awaitable<std::vector<std::string>> claim(jobrt::backend& b, std::size_t count) {
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
  co.lease_ttl = 30s;
  auto claimed = co_await b.claim("q", co);
  std::vector<std::string> tokens;
  for (auto& c : claimed) tokens.push_back(c.token);
  co_return tokens;
}

jobrt::finish_item ack(std::string token) {
  jobrt::finish_item item;
  item.token = std::move(token);
  item.kind = jobrt::finish_kind::ack;
  return item;
}

// What came back, in order: "<note id>:<held or lost>".
finisher_hooks hooks_for(std::vector<std::string>& answers) {
  finisher_hooks h;
  h.finished = [&answers](const jobrt::finish_item&, const finish_note& note, jobrt::finish_result& r) {
    answers.push_back(note.id + (r.lease_held ? ":held" : ":lost"));
  };
  return h;
}

}  // namespace

TEST_CASE("finisher - one call carries every result that came while the calls before it were on their way") {
  jobrt::test::run(
      [](asio::io_context& ctx) -> awaitable<void> {
        counting_backend b(ctx.get_executor());
        auto tokens = co_await claim(b, 5);
        REQUIRE(tokens.size() == 5);
        std::vector<std::string> answers;
        auto part = std::make_shared<finisher>(ctx.get_executor(), b, options(), "worker test", hooks_for(answers));
        part->start();
        b.shut_finishes();
        part->add(ack(tokens[0]), {"t", "j1"});
        CHECK(co_await eventually([&] { return b.finishes_held() == 1; }, 5s));
        part->add(ack(tokens[1]), {"t", "j2"});
        CHECK(co_await eventually([&] { return b.finishes_held() == 2; }, 5s));
        // Two calls are on their way: the rest wait, and go together.
        for (std::size_t i = 2; i < 5; ++i) part->add(ack(tokens[i]), {"t", "j" + std::to_string(i + 1)});
        CHECK(b.finishes() == 2);
        for (auto& token : tokens) CHECK(part->has(token));
        auto listed = part->tokens();
        std::sort(listed.begin(), listed.end());
        auto all = tokens;
        std::sort(all.begin(), all.end());
        CHECK(listed == all);
        b.open_finishes();
        CHECK(co_await eventually([&] { return answers.size() == 5; }, 5s));
        CHECK(b.finishes() == 3);
        for (auto& a : answers) CHECK(a.ends_with(":held"));
        for (auto& token : tokens) CHECK_FALSE(part->has(token));
        CHECK((co_await b.inner().counts("q")).completed == 5);
        co_await part->stop();
      },
      10s);
}

TEST_CASE("finisher - a token's results reach the backend in the order they came, and a failed call goes again") {
  jobrt::test::run(
      [](asio::io_context& ctx) -> awaitable<void> {
        counting_backend b(ctx.get_executor());
        auto tokens = co_await claim(b, 2);
        REQUIRE(tokens.size() == 2);
        std::vector<std::string> answers;
        auto part = std::make_shared<finisher>(ctx.get_executor(), b, options(), "worker test", hooks_for(answers));
        part->start();
        b.fail_finishes(1);
        b.shut_finishes();
        auto began = steady::now();
        // The first ack's call fails and goes again after a pause; a second result under its
        // token, come meanwhile, waits for it (both acks: only the first finds the lease held),
        // while another token's result goes in a call of its own.
        part->add(ack(tokens[0]), {"t", "first"});
        CHECK(co_await eventually([&] { return b.finishes() == 1; }, 5s));
        part->add(ack(tokens[0]), {"t", "second"});
        part->add(ack(tokens[1]), {"t", "other"});
        CHECK(co_await eventually([&] { return b.finishes_held() == 2; }, 5s));
        CHECK(b.finishes() == 3);  // first (refused), other, first again
        CHECK(steady::now() - began >= 100ms);
        b.open_finishes();
        CHECK(co_await eventually([&] { return answers.size() == 3; }, 5s));
        auto first = std::find(answers.begin(), answers.end(), "first:held");
        auto second = std::find(answers.begin(), answers.end(), "second:lost");
        REQUIRE(second != answers.end());
        CHECK(first < second);
        CHECK(std::find(answers.begin(), answers.end(), "other:held") != answers.end());
        CHECK(b.finishes() == 4);
        co_await part->stop();
      },
      10s);
}

TEST_CASE("finisher - stop ends a call the backend does not answer, drops what waits, and calls nothing after") {
  jobrt::test::run(
      [](asio::io_context& ctx) -> awaitable<void> {
        counting_backend b(ctx.get_executor());
        auto tokens = co_await claim(b, 5);
        REQUIRE(tokens.size() == 5);
        std::vector<std::string> answers;
        auto part = std::make_shared<finisher>(ctx.get_executor(), b, options(), "worker test", hooks_for(answers));
        part->start();
        b.shut_finishes();
        for (std::size_t i = 0; i < 3; ++i) part->add(ack(tokens[i]), {"t", "j" + std::to_string(i + 1)});
        CHECK(co_await eventually([&] { return b.finishes_held() == 1; }, 5s));
        part->add(ack(tokens[3]), {"t", "j4"});
        CHECK(co_await eventually([&] { return b.finishes_held() == 2; }, 5s));
        part->add(ack(tokens[4]), {"t", "j5"});  // waits: two calls are on their way
        auto began = steady::now();
        co_await part->stop();
        CHECK(steady::now() - began < 1s);
        CHECK(b.finishes_held() == 0);
        part->add(ack(tokens[0]), {"t", "late"});  // dropped: said in the log
        CHECK_FALSE(part->has(tokens[0]));
        CHECK(part->tokens().empty());
        auto calls = b.finishes();
        b.open_finishes();
        std::weak_ptr<finisher> left = part;
        part.reset();
        CHECK(co_await eventually([&] { return left.expired(); }, 1s));
        CHECK(b.finishes() == calls);
        CHECK(answers.empty());
        CHECK((co_await b.inner().counts("q")).completed == 0);  // the leases expire; the jobs run again
      },
      10s);
}

TEST_CASE(
    "finisher - on a sharded queue one call is on its way at a time, and stop cuts short a shard count that "
    "never comes") {
  jobrt::test::run(
      [](asio::io_context& ctx) -> awaitable<void> {
        counting_backend b(ctx.get_executor());
        auto tokens = co_await claim(b, 3);
        REQUIRE(tokens.size() == 3);
        std::vector<std::string> answers;
        b.report_shards(4);
        auto part = std::make_shared<finisher>(ctx.get_executor(), b, options(), "worker test", hooks_for(answers));
        part->start();
        b.shut_finishes();
        part->add(ack(tokens[0]), {"t", "j1"});
        CHECK(co_await eventually([&] { return b.finishes_held() == 1; }, 5s));
        part->add(ack(tokens[1]), {"t", "j2"});
        part->add(ack(tokens[2]), {"t", "j3"});
        co_await jobrt::test::sleep_for(100ms);
        CHECK(b.finishes_held() == 1);  // (two on an unsharded queue: the test above)
        b.open_finishes();
        CHECK(co_await eventually([&] { return answers.size() == 3; }, 5s));
        CHECK(b.finishes() == 2);
        co_await part->stop();
        // A backend that never says how many shards: the finisher asks, and stop ends the asking.
        b.shut_shard_counts();
        auto silent = std::make_shared<finisher>(ctx.get_executor(), b, options(), "worker test", hooks_for(answers));
        silent->start();
        CHECK(co_await eventually([&] { return b.shard_counts_held() == 1; }, 5s));
        auto began = steady::now();
        co_await silent->stop();
        CHECK(steady::now() - began < 500ms);
        CHECK(b.shard_counts_held() == 0);
      },
      10s);
}
