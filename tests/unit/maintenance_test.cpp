// The worker's maintenance part (runtime/src/worker/maintenance.hpp) on its own, over the memory
// backend: the reaper recovers an expired lease, the promoter moves a delayed job when it comes
// due, the reaper says which types run here and asks about others, and stop() ends both loops
// promptly, with a reap held at a gate, and leaves nothing that calls the backend.
#include "worker/maintenance.hpp"

#include <jobrt/memory_backend.hpp>

#include "support/run.hpp"

#include <doctest/doctest.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace asio = boost::asio;
using namespace std::chrono_literals;
using asio::awaitable;
using jobrt::memory_backend;
using jobrt::detail::maintenance;
using jobrt::detail::maintenance_hooks;
using jobrt::detail::maintenance_options;
using jobrt::test::eventually;

namespace {

// Passes every call on to a memory backend. Counts the calls the maintenance part makes (and
// those of them still on their way), and holds reaps at a gate while it is shut: a reap the
// backend does not answer. Everything runs on one thread.
class counting_backend final : public jobrt::backend {
 public:
  explicit counting_backend(asio::any_io_executor ex) : inner_(ex), opened_(ex) {}

  memory_backend& inner() { return inner_; }
  void shut_reaps() { reaps_open_ = false; }
  std::size_t reaps_held() const { return reaps_held_; }
  std::size_t calls() const { return calls_; }                  // of the maintenance part's, so far
  std::size_t in_flight() const { return in_flight_; }          // of those, still on their way
  std::size_t delayed_waits() const { return delayed_waits_; }  // wait_delayed calls on their way

  awaitable<jobrt::reap_result> reap(std::string q, jobrt::reap_options o) override {
    flight f(*this);
    while (!reaps_open_) {
      ++reaps_held_;
      opened_.expires_at(std::chrono::steady_clock::time_point::max());
      co_await opened_.async_wait(asio::as_tuple(asio::use_awaitable));
      --reaps_held_;
      auto state = co_await asio::this_coro::cancellation_state;  // (g++ 12: not inside the condition)
      if (state.cancelled() != asio::cancellation_type::none)
        throw boost::system::system_error(asio::error::operation_aborted);
    }
    co_return co_await inner_.reap(std::move(q), o);
  }
  awaitable<void> advertise(std::string q, std::vector<std::string> types, std::chrono::milliseconds ttl) override {
    flight f(*this);
    co_await inner_.advertise(std::move(q), std::move(types), ttl);
  }
  awaitable<std::chrono::milliseconds> unrunnable_for(std::string q, std::string type) override {
    flight f(*this);
    co_return co_await inner_.unrunnable_for(std::move(q), std::move(type));
  }
  awaitable<jobrt::promote_result> promote(std::string q, std::size_t max) override {
    flight f(*this);
    co_return co_await inner_.promote(std::move(q), max);
  }
  std::uint64_t delayed_version(const std::string& q) override {
    ++calls_;
    return inner_.delayed_version(q);
  }
  awaitable<void> wait_delayed(std::string q, std::uint64_t seen, std::chrono::milliseconds timeout) override {
    flight f(*this);
    ++delayed_waits_;
    co_await inner_.wait_delayed(std::move(q), seen, timeout);
    --delayed_waits_;
  }

  // Not the maintenance part's: passed on uncounted.
  awaitable<std::vector<jobrt::enqueue_result>> enqueue(std::string q, std::vector<jobrt::encoded_job> jobs) override {
    return inner_.enqueue(std::move(q), std::move(jobs));
  }
  awaitable<std::vector<jobrt::claimed_job>> claim(std::string q, jobrt::claim_options o) override {
    return inner_.claim(std::move(q), std::move(o));
  }
  awaitable<std::vector<jobrt::claimed_job>> claim_wait(std::string q, jobrt::claim_options o,
                                                        std::chrono::milliseconds wait) override {
    return inner_.claim_wait(std::move(q), std::move(o), wait);
  }
  awaitable<std::vector<jobrt::finish_result>> finish(std::string q, std::string w,
                                                      std::vector<jobrt::finish_item> items,
                                                      std::chrono::milliseconds ttl) override {
    return inner_.finish(std::move(q), std::move(w), std::move(items), ttl);
  }
  awaitable<std::vector<bool>> extend(std::string q, std::string w, std::vector<std::string> tokens,
                                      std::chrono::milliseconds ttl) override {
    return inner_.extend(std::move(q), std::move(w), std::move(tokens), ttl);
  }
  awaitable<std::int64_t> expire_own(std::string q, std::string w) override {
    return inner_.expire_own(std::move(q), std::move(w));
  }
  awaitable<void> release(std::string q, std::string w, std::vector<std::string> tokens) override {
    return inner_.release(std::move(q), std::move(w), std::move(tokens));
  }
  awaitable<jobrt::queue_counts> counts(std::string q) override { return inner_.counts(std::move(q)); }
  awaitable<std::vector<jobrt::dead_letter>> dead_letters(std::string q, std::size_t offset,
                                                          std::size_t limit) override {
    return inner_.dead_letters(std::move(q), offset, limit);
  }
  awaitable<std::optional<jobrt::dead_letter>> dead_letter_of(std::string q, std::string id) override {
    return inner_.dead_letter_of(std::move(q), std::move(id));
  }
  awaitable<std::vector<std::string>> requeue(std::string q, std::vector<std::string> ids, bool at_head) override {
    return inner_.requeue(std::move(q), std::move(ids), at_head);
  }
  awaitable<std::int64_t> purge(std::string q, std::vector<std::string> ids) override {
    return inner_.purge(std::move(q), std::move(ids));
  }
  awaitable<bool> pause(std::string q, std::string g) override { return inner_.pause(std::move(q), std::move(g)); }
  awaitable<bool> resume(std::string q, std::string g, jobrt::resume_mode mode) override {
    return inner_.resume(std::move(q), std::move(g), mode);
  }
  awaitable<std::vector<jobrt::paused_group>> paused_groups(std::string q) override {
    return inner_.paused_groups(std::move(q));
  }
  awaitable<std::int64_t> purge_queue(std::string q) override { return inner_.purge_queue(std::move(q)); }
  awaitable<std::int64_t> group_size(std::string q, std::string g) override {
    return inner_.group_size(std::move(q), std::move(g));
  }
  awaitable<jobrt::check_report> check(std::string q, bool repair) override {
    return inner_.check(std::move(q), repair);
  }

 private:
  struct flight {
    explicit flight(counting_backend& b) : owner(b) {
      ++owner.calls_;
      ++owner.in_flight_;
    }
    ~flight() { --owner.in_flight_; }
    flight(const flight&) = delete;
    flight& operator=(const flight&) = delete;
    counting_backend& owner;
  };

  memory_backend inner_;
  bool reaps_open_ = true;
  std::size_t reaps_held_ = 0;
  std::size_t calls_ = 0;
  std::size_t in_flight_ = 0;
  std::size_t delayed_waits_ = 0;
  asio::steady_timer opened_;  // parked at time_point::max(): a reap waits here while the gate is shut
};

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
