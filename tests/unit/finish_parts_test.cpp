#include "backend/finish_parts.hpp"

#include <jobrt/memory_backend.hpp>
#include <jobrt/worker.hpp>

#include <doctest/doctest.h>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <string>
#include <vector>

using jobrt::finish_item;
using jobrt::detail::finish_parts;

namespace {

std::vector<finish_item> items_of(const std::vector<std::string>& tokens) {
  std::vector<finish_item> items;
  for (const auto& t : tokens) {
    finish_item it;
    it.token = t;
    items.push_back(it);
  }
  return items;
}

std::vector<std::string> distinct(int n, const std::string& prefix) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(prefix + std::to_string(i));
  return out;
}

}  // namespace

TEST_CASE("finish batch parts: at most max items each, in order") {
  auto parts = finish_parts(items_of(distinct(25, "t")), 10);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].size() == 10);
  CHECK(parts[1].size() == 10);
  CHECK(parts[2].size() == 5);
  std::size_t next = 0;
  for (const auto& part : parts)
    for (auto i : part) CHECK(i == next++);
  CHECK(finish_parts(items_of({}), 10).empty());
}

TEST_CASE("finish batch parts: a token's items stay together, in their order") {
  // A keep as the part's last item and its lease's end right behind it (a pipelined burst).
  auto tokens = distinct(9, "t");
  tokens.push_back("burst");  // index 9: the keep
  tokens.push_back("burst");  // index 10: the end of the same lease
  for (auto& t : distinct(12, "u")) tokens.push_back(t);
  tokens.push_back("t3");  // a token of the first part again, after it filled up: it joins it
  auto parts = finish_parts(items_of(tokens), 10);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0] == std::vector<std::size_t>{0, 1, 2, 3, 23, 4, 5, 6, 7, 8});
  // The keep and the end do not fit in what is left of the first part: both go to the next.
  CHECK(parts[1] == std::vector<std::size_t>{9, 10, 11, 12, 13, 14, 15, 16, 17, 18});
  CHECK(parts[2] == std::vector<std::size_t>{19, 20, 21, 22});
}

TEST_CASE("finish batch parts: a part grows by whole tokens and stays within max") {
  // Results that queued up behind a failing call, interleaved: each token's first item comes
  // before any token's second (a review found parts of 9,000 items from 1,000 tokens this way).
  std::vector<std::string> tokens;
  for (int round = 0; round < 9; ++round)
    for (auto& t : distinct(100, "t")) tokens.push_back(t);
  auto items = items_of(tokens);
  auto parts = finish_parts(items, 100);
  std::vector<int> seen(items.size(), 0);
  for (const auto& part : parts) {
    CHECK(part.size() <= 100);
    std::string_view token;
    for (std::size_t k = 0; k < part.size(); ++k) {
      ++seen[part[k]];
      if (k % 9 == 0) token = items[part[k]].token;
      CHECK(items[part[k]].token == token);                 // a token's 9 items together...
      if (k % 9 != 0) CHECK(part[k] == part[k - 1] + 100);  // ...in their order
    }
  }
  CHECK(parts.size() == 10);  // 11 tokens of 9 items fit in 100, 100 tokens need 10 parts
  CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  // A token with more items than a part holds gets a part of its own.
  auto big = finish_parts(items_of({"a", "b", "b", "b", "c"}), 2);
  REQUIRE(big.size() == 3);
  CHECK(big[0] == std::vector<std::size_t>{0});
  CHECK(big[1] == std::vector<std::size_t>{1, 2, 3});
  CHECK(big[2] == std::vector<std::size_t>{4});
}

TEST_CASE("a worker refuses a burst longer than a finish call takes") {
  boost::asio::io_context ctx;
  jobrt::memory_backend store(ctx.get_executor());
  jobrt::worker_options o;
  o.queue = "q";
  o.burst = 1001;
  CHECK_THROWS_WITH_AS(jobrt::worker(ctx.get_executor(), store, o), "worker burst is 1001; the largest is 1000",
                       std::invalid_argument);
  o.burst = 1000;
  CHECK_NOTHROW(jobrt::worker(ctx.get_executor(), store, o));
}

TEST_CASE("a worker refuses a lease TTL or a period past a day, whose times would overflow the clock") {
  boost::asio::io_context ctx;
  jobrt::memory_backend store(ctx.get_executor());
  jobrt::worker_options o;
  o.queue = "q";
  o.lease_ttl = std::chrono::milliseconds(99'999'999'999'999);
  CHECK_THROWS_WITH_AS(jobrt::worker(ctx.get_executor(), store, o),
                       "worker lease_ttl is 99999999999999 ms; it must be from 1 ms to a day", std::invalid_argument);
  o.lease_ttl = std::chrono::hours(24);
  CHECK_NOTHROW(jobrt::worker(ctx.get_executor(), store, o));
  o.watchdog_period = std::chrono::hours(25);
  CHECK_THROWS_AS(jobrt::worker(ctx.get_executor(), store, o), std::invalid_argument);
}

TEST_CASE("a worker refuses a claim_wait of 0 and a negative period, naming the field and the value") {
  boost::asio::io_context ctx;
  jobrt::memory_backend store(ctx.get_executor());
  jobrt::worker_options o;
  o.queue = "q";
  o.claim_wait = std::chrono::milliseconds(0);  // no wait: the claim loop would spin
  CHECK_THROWS_WITH_AS(jobrt::worker(ctx.get_executor(), store, o),
                       "worker claim_wait is 0 ms; it must be from 1 ms to a day", std::invalid_argument);
  o.claim_wait = std::chrono::milliseconds(1);
  CHECK_NOTHROW(jobrt::worker(ctx.get_executor(), store, o));
  o.reap_period = std::chrono::milliseconds(-5);
  CHECK_THROWS_WITH_AS(jobrt::worker(ctx.get_executor(), store, o),
                       "worker reap_period is -5 ms; it must be from 0 ms to a day", std::invalid_argument);
}
