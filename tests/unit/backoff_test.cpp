// backoff::delay_after: the delay between a failed run and the next (exponential, capped, with
// jitter), as the worker computes it for every retry.
#include <jobrt/job.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <random>

using namespace jobrt;
using std::chrono::milliseconds;

namespace {

backoff exact(milliseconds initial, double factor, milliseconds max) { return backoff{initial, factor, max, 0.0}; }

}  // namespace

TEST_CASE("backoff - attempt 1 waits the initial delay, later ones grow by the factor") {
  auto b = exact(milliseconds(100), 2.0, milliseconds(100000));
  CHECK(b.delay_after(1, 0.5) == milliseconds(100));
  CHECK(b.delay_after(2, 0.5) == milliseconds(200));
  CHECK(b.delay_after(3, 0.5) == milliseconds(400));
  CHECK(b.delay_after(4, 0.5) == milliseconds(800));
  CHECK(b.delay_after(10, 0.5) == milliseconds(51200));
  // Without jitter the random number does not matter.
  CHECK(b.delay_after(3, 0.0) == milliseconds(400));
  CHECK(b.delay_after(3, 0.999) == milliseconds(400));

  auto triple = exact(milliseconds(50), 3.0, milliseconds(100000));
  CHECK(triple.delay_after(1, 0.5) == milliseconds(50));
  CHECK(triple.delay_after(2, 0.5) == milliseconds(150));
  CHECK(triple.delay_after(5, 0.5) == milliseconds(4050));

  auto fractional = exact(milliseconds(1000), 1.5, milliseconds(100000));
  CHECK(fractional.delay_after(2, 0.5) == milliseconds(1500));
  CHECK(fractional.delay_after(3, 0.5) == milliseconds(2250));

  auto constant = exact(milliseconds(300), 1.0, milliseconds(100000));
  for (int attempt = 1; attempt <= 20; ++attempt) CHECK(constant.delay_after(attempt, 0.5) == milliseconds(300));

  // Every further attempt waits at least as long as the one before (factor >= 1).
  for (int attempt = 1; attempt < 40; ++attempt) CHECK(b.delay_after(attempt + 1, 0.5) >= b.delay_after(attempt, 0.5));
}

TEST_CASE("backoff - the cap bounds every delay, from the attempt that reaches it on") {
  auto b = exact(milliseconds(100), 2.0, milliseconds(1000));
  CHECK(b.delay_after(4, 0.5) == milliseconds(800));
  CHECK(b.delay_after(5, 0.5) == milliseconds(1000));  // 1600, capped
  CHECK(b.delay_after(6, 0.5) == milliseconds(1000));
  CHECK(b.delay_after(1000, 0.5) == milliseconds(1000));
  CHECK(b.delay_after(std::numeric_limits<int>::max(), 0.5) == milliseconds(1000));  // no overflow, no long loop

  // A cap below the initial delay caps the first delay too.
  CHECK(exact(milliseconds(5000), 2.0, milliseconds(1000)).delay_after(1, 0.5) == milliseconds(1000));
  // A cap of 0: retry at once.
  CHECK(exact(milliseconds(100), 2.0, milliseconds(0)).delay_after(3, 0.5) == milliseconds(0));

  // The worker's default: 1 s, x2, at most 10 min.
  backoff def;
  def.jitter = 0.0;
  CHECK(def.delay_after(1, 0.5) == milliseconds(1000));
  CHECK(def.delay_after(10, 0.5) == milliseconds(512000));
  CHECK(def.delay_after(11, 0.5) == std::chrono::minutes(10));
  CHECK(def.delay_after(50, 0.5) == std::chrono::minutes(10));
}

TEST_CASE("backoff - a huge cap or factor never turns the delay negative") {
  // "No cap" written as the largest duration: the delay must not overflow into a negative one
  // (which would retry at once, in a loop).
  for (double jitter : {0.0, 0.2, 1.0}) {
    backoff b{milliseconds(1000), 2.0, milliseconds::max(), jitter};
    for (int attempt : {1, 30, 60, 64, 100, 10000}) {
      for (double random : {0.0, 0.5, 0.999999}) {
        auto d = b.delay_after(attempt, random);
        CAPTURE(jitter);
        CAPTURE(attempt);
        CAPTURE(random);
        CHECK(d >= milliseconds(0));
        CHECK(d >= b.delay_after(1, 0.0));
      }
    }
  }
  // 0 ms grows to nothing, even by an infinite factor (0 * inf is NaN).
  backoff zero{milliseconds(0), std::numeric_limits<double>::infinity(), milliseconds(5000), 0.2};
  CHECK(zero.delay_after(3, 0.5) == milliseconds(0));
  backoff steep{milliseconds(1), 1e300, milliseconds(5000), 0.2};
  CHECK(steep.delay_after(2, 0.5) == milliseconds(5000));
  CHECK(steep.delay_after(5, 0.0) == milliseconds(4000));
}

TEST_CASE("backoff - jitter moves each delay by at most +-jitter of itself") {
  backoff b{milliseconds(1000), 2.0, milliseconds(60000), 0.2};
  // The ends: random 0 gives the shortest, random close to 1 the longest, 0.5 the exact delay.
  CHECK(b.delay_after(1, 0.0) == milliseconds(800));
  CHECK(b.delay_after(1, 0.5) == milliseconds(1000));
  CHECK(b.delay_after(1, 0.999999) >= milliseconds(1199));
  CHECK(b.delay_after(1, 0.999999) <= milliseconds(1200));
  CHECK(b.delay_after(3, 0.0) == milliseconds(3200));
  CHECK(b.delay_after(3, 0.75) == milliseconds(4400));

  // Over many random numbers, as the worker draws them: inside the bounds, spread over them, and
  // never shorter for a larger random number.
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int attempt : {1, 2, 4, 7, 20}) {
    auto exact_delay = exact(b.initial, b.factor, b.max).delay_after(attempt, 0.5).count();
    auto low = static_cast<std::int64_t>(std::floor(static_cast<double>(exact_delay) * (1.0 - b.jitter)));
    auto high = static_cast<std::int64_t>(std::ceil(static_cast<double>(exact_delay) * (1.0 + b.jitter)));
    std::int64_t seen_min = std::numeric_limits<std::int64_t>::max(), seen_max = 0;
    for (int i = 0; i < 2000; ++i) {
      auto d = b.delay_after(attempt, uniform(gen)).count();
      CAPTURE(attempt);
      REQUIRE(d >= low);
      REQUIRE(d <= high);
      seen_min = std::min(seen_min, d);
      seen_max = std::max(seen_max, d);
    }
    // 2000 draws cover most of the +-20 % band (a draw in each end's outer 5 % is missed with p = 0.95^2000).
    CHECK(seen_min < exact_delay - (exact_delay - low) * 9 / 10);
    CHECK(seen_max > exact_delay + (high - exact_delay) * 9 / 10);
    std::int64_t previous = 0;
    for (int step = 0; step < 100; ++step) {
      auto d = b.delay_after(attempt, step / 100.0).count();
      CHECK(d >= previous);
      previous = d;
    }
  }

  // Jitter moves the capped delay: around the cap, within +-jitter of it.
  CHECK(b.delay_after(30, 0.0) == milliseconds(48000));
  CHECK(b.delay_after(30, 0.5) == milliseconds(60000));
  CHECK(b.delay_after(30, 0.999999) <= milliseconds(72000));

  // Full jitter (1.0): anywhere from 0 to twice the delay, never negative.
  backoff full{milliseconds(1000), 2.0, milliseconds(60000), 1.0};
  CHECK(full.delay_after(1, 0.0) == milliseconds(0));
  CHECK(full.delay_after(2, 0.5) == milliseconds(2000));
  CHECK(full.delay_after(2, 0.999999) <= milliseconds(4000));
  // No jitter: the random number is ignored.
  auto none = exact(milliseconds(1000), 2.0, milliseconds(60000));
  CHECK(none.delay_after(2, 0.0) == none.delay_after(2, 0.999999));
}
