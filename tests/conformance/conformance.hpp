// What the conformance suites share: backends made per test, the CONFORMANCE macro that runs a
// case on both backends, and small helpers.
#pragma once

#include "support/redis_server.hpp"
#include "support/run.hpp"

#include <jobrt/memory_backend.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/worker.hpp>

#include <fmt/format.h>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/parse.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>

namespace asio = boost::asio;
using namespace jobrt;
using namespace jobrt::test;
using asio::awaitable;
using asio::use_awaitable;

namespace {  // each suite is one translation unit

enum class backend_kind { memory, redis };

// Backends for one test: the memory backend is one shared object (its state is the queue); on
// Redis every call makes a new backend with connections of its own, as another process would.
class backends {
 public:
  backends(asio::io_context& ctx, backend_kind kind) : ctx_(ctx), kind_(kind), queue_(key_prefix() + "q") {}

  backend& make() {
    if (kind_ == backend_kind::memory) {
      if (made_.empty()) made_.push_back(std::make_unique<memory_backend>(ctx_.get_executor()));
      return *made_.front();
    }
    made_.push_back(std::make_unique<redis_backend>(ctx_.get_executor(), shared_redis()));
    return *made_.back();
  }

  const std::string& queue() const { return queue_; }
  backend_kind kind() const { return kind_; }

  worker_options worker_opts(std::size_t concurrency) const {
    worker_options o;
    o.queue = queue_;
    o.concurrency = concurrency;
    o.claim_wait = std::chrono::milliseconds(300);
    return o;
  }

 private:
  asio::io_context& ctx_;
  backend_kind kind_;
  std::string queue_;
  std::vector<std::unique_ptr<backend>> made_;
};

// Waits until cond() holds, checking every few ms (test code: the runtime itself never polls).
template <class Cond>
awaitable<bool> eventually(Cond cond, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) co_return false;
    co_await sleep_for(std::chrono::milliseconds(5));
  }
  co_return true;
}

job_spec make_job(std::string type, boost::json::value payload, std::optional<std::string> group = {}) {
  job_spec s;
  s.type = std::move(type);
  s.payload = std::move(payload);
  s.group = std::move(group);
  return s;
}

struct event {
  std::string group;
  std::int64_t seq;
  std::int64_t fence;
  bool start;
};

}  // namespace

#define CONFORMANCE(name)                                                                           \
  static void DOCTEST_CAT(conformance_, __LINE__)(backend_kind);                                    \
  TEST_CASE("memory backend: " name) { DOCTEST_CAT(conformance_, __LINE__)(backend_kind::memory); } \
  TEST_CASE("redis backend: " name) { DOCTEST_CAT(conformance_, __LINE__)(backend_kind::redis); }   \
  static void DOCTEST_CAT(conformance_, __LINE__)(backend_kind kind)
