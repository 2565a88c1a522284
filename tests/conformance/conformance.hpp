// What the conformance suites share: backends made per test, the CONFORMANCE macro that runs a
// case on both backends, and small helpers.
#pragma once

#include "support/records.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"
#include "support/run.hpp"

#include <jobrt/memory_backend.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/sharded_backend.hpp>
#include <jobrt/worker.hpp>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/parse.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string_view>

namespace asio = boost::asio;
using namespace jobrt;
using namespace jobrt::test;
using asio::awaitable;
using asio::use_awaitable;

namespace {  // each suite is one translation unit

// The Redis backend runs on a plain server (also over TLS) and on a Redis Cluster (where it finds
// out by itself);
// each also holds queues of many shards (sharded_backend): 8 in memory and on a plain server, 16
// on a cluster.
enum class backend_kind { memory, redis, cluster, tls_redis, sharded_memory, sharded_redis, sharded_cluster };

bool sharded(backend_kind kind) { return kind >= backend_kind::sharded_memory; }
// Whether the queue's keys are those of an unsharded queue on Redis (tests that read them).
[[maybe_unused]] bool plain_keys(backend_kind kind) {
  return kind == backend_kind::redis || kind == backend_kind::cluster || kind == backend_kind::tls_redis;
}

std::size_t shards_of(backend_kind kind) { return kind == backend_kind::sharded_cluster ? 16 : sharded(kind) ? 8 : 1; }

// The token of a grouped job's lease, as a worker's lease keeper sends it ('<fence>|g:<group>',
// led by its shard on a sharded queue).
[[maybe_unused]] std::string group_token(backend_kind kind, std::int64_t fence, const std::string& group) {
  auto token = fmt::format("{}|g:{}", fence, group);
  if (sharded(kind)) token = fmt::format("{}/{}", sharded_backend::shard_of(group, shards_of(kind)), token);
  return token;
}

// `name`, or on a sharded queue the first of name, name-1, name-2, ... that hashes to the shard
// of `anchor`: for a test of order or fences across groups (or producer-given ids), which a
// sharded queue keeps within a shard.
[[maybe_unused]] std::string beside(backend_kind kind, const std::string& name, const std::string& anchor) {
  if (!sharded(kind)) return name;
  auto k = sharded_backend::shard_of(anchor, shards_of(kind));
  auto out = name;
  for (int i = 1; sharded_backend::shard_of(out, shards_of(kind)) != k; ++i) out = fmt::format("{}-{}", name, i);
  return out;
}

// The n-th id a queue assigns to jobs of `group` (a shard's n-th: n * shards + the shard).
[[maybe_unused]] std::string assigned_id(backend_kind kind, std::size_t n, const std::string& group) {
  if (!sharded(kind)) return std::to_string(n);
  return std::to_string(n * shards_of(kind) + sharded_backend::shard_of(group, shards_of(kind)));
}

// A new backend of that kind, on `ex`.
std::unique_ptr<backend> new_backend(backend_kind kind, asio::any_io_executor ex) {
  switch (kind) {
    case backend_kind::memory: return std::make_unique<memory_backend>(ex);
    case backend_kind::redis: return std::make_unique<redis_backend>(ex, shared_redis());
    case backend_kind::cluster: return std::make_unique<redis_backend>(ex, shared_cluster());
    case backend_kind::tls_redis: return std::make_unique<redis_backend>(ex, shared_tls_redis());
    case backend_kind::sharded_memory:
      return std::make_unique<sharded_backend>(std::make_shared<memory_backend>(ex), shards_of(kind));
    case backend_kind::sharded_redis:
      return std::make_unique<sharded_backend>(std::make_shared<redis_backend>(ex, shared_redis()), shards_of(kind));
    case backend_kind::sharded_cluster: break;
  }
  return std::make_unique<sharded_backend>(std::make_shared<redis_backend>(ex, shared_cluster()), shards_of(kind));
}

// Backends for one test: the memory backend is one shared object (its state is the queue); on
// Redis every call makes a new backend with connections of its own, as another process would.
class backends {
 public:
  backends(asio::io_context& ctx, backend_kind kind) : ctx_(ctx), kind_(kind), queue_(key_prefix() + "q") {}

  backend& make() {
    if (kind_ == backend_kind::memory || kind_ == backend_kind::sharded_memory) {
      if (made_.empty()) made_.push_back(new_backend(kind_, ctx_.get_executor()));
      return *made_.front();
    }
    made_.push_back(new_backend(kind_, ctx_.get_executor()));
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

job_spec make_job(std::string type, boost::json::value payload, std::optional<std::string> group = {}) {
  job_spec s;
  s.type = std::move(type);
  s.payload = std::move(payload);
  s.group = std::move(group);
  return s;
}

// What `f` refuses: the text of the std::invalid_argument it throws ("" when it throws none).
inline std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// A job enqueued with a keep of an hour (job_spec::keep): found by id, and cancellable.
inline job_spec kept(std::string type, std::optional<std::string> group, std::string id = {}) {
  auto s = make_job(std::move(type), boost::json::object{}, std::move(group));
  s.id = std::move(id);
  s.keep = std::chrono::hours(1);
  return s;
}

// A backend that passes every call on to another, except that finish calls wait while the gate
// is shut: a worker's results (a keep, an ack) are held back for as long as a test wants. Its
// blocking claims have a gate of their own.
class gated_backend final : public backend {
 public:
  gated_backend(asio::any_io_executor ex, backend& inner)
      : inner_(inner), opened_(ex), claims_opened_(ex), looks_opened_(ex) {}

  void shut() { open_ = false; }
  void open() {
    open_ = true;
    opened_.cancel();
  }
  std::size_t held_back() const { return held_back_; }                      // finish calls waiting at the gate now
  void fail_next_finish() { fail_next_ = true; }                            // as a call whose connection broke
  void fail_enqueue_after(int calls) { enqueues_before_failure_ = calls; }  // the next one after them throws
  void shut_claims() { claims_open_ = false; }
  void open_claims() {
    claims_open_ = true;
    claims_opened_.cancel();
  }
  std::size_t claims_held() const { return claims_held_; }  // blocking claims waiting at the gate now
  std::size_t looks() const { return looks_; }              // kept_job_of calls so far
  // While shut, a kept_job_of's answer, in hand, waits: the store is read, the caller told later.
  void shut_looks() { looks_open_ = false; }
  void open_looks() {
    looks_open_ = true;
    looks_opened_.cancel();
  }
  std::size_t looks_held() const { return looks_held_; }

  awaitable<std::vector<finish_result>> finish(std::string queue, std::string worker, std::vector<finish_item> items,
                                               std::chrono::milliseconds lease_ttl) override {
    if (std::exchange(fail_next_, false)) throw std::runtime_error("finish failed (injected)");
    while (!open_) {
      ++held_back_;
      opened_.expires_at(std::chrono::steady_clock::time_point::max());
      co_await opened_.async_wait(asio::as_tuple(use_awaitable));
      --held_back_;
      auto state = co_await asio::this_coro::cancellation_state;  // (g++ 12: not inside the condition)
      if (state.cancelled() != asio::cancellation_type::none)
        throw boost::system::system_error(asio::error::operation_aborted);  // a worker's stop ends the call
    }
    co_return co_await inner_.finish(std::move(queue), std::move(worker), std::move(items), lease_ttl);
  }

  awaitable<std::vector<enqueue_result>> enqueue(std::string q, std::vector<encoded_job> jobs) override {
    if (enqueues_before_failure_ && (*enqueues_before_failure_)-- == 0) {
      enqueues_before_failure_.reset();
      throw std::runtime_error("enqueue failed (injected)");
    }
    return inner_.enqueue(std::move(q), std::move(jobs));
  }
  awaitable<std::vector<claimed_job>> claim(std::string q, claim_options o) override {
    return inner_.claim(std::move(q), std::move(o));
  }
  awaitable<std::vector<claimed_job>> claim_wait(std::string q, claim_options o,
                                                 std::chrono::milliseconds wait) override {
    if (claims_open_) co_return co_await inner_.claim_wait(std::move(q), std::move(o), wait);
    // Shut: the claim is on its way and comes back when the gate opens, a cancellation or not
    // (as the Redis backend's reply, once in hand, wins over a stop).
    co_await asio::this_coro::throw_if_cancelled(false);
    ++claims_held_;
    while (!claims_open_) {
      claims_opened_.expires_at(std::chrono::steady_clock::time_point::max());
      co_await claims_opened_.async_wait(asio::as_tuple(use_awaitable));
    }
    --claims_held_;
    co_return co_await asio::co_spawn(claims_opened_.get_executor(), inner_.claim(std::move(q), std::move(o)),
                                      use_awaitable);
  }
  awaitable<std::vector<bool>> extend(std::string q, std::string w, std::vector<std::string> tokens,
                                      std::chrono::milliseconds ttl) override {
    return inner_.extend(std::move(q), std::move(w), std::move(tokens), ttl);
  }
  awaitable<void> advertise(std::string q, std::vector<std::string> types, std::chrono::milliseconds ttl) override {
    return inner_.advertise(std::move(q), std::move(types), ttl);
  }
  awaitable<std::chrono::milliseconds> unrunnable_for(std::string q, std::string type) override {
    return inner_.unrunnable_for(std::move(q), std::move(type));
  }
  awaitable<std::int64_t> purge_queue(std::string q) override { return inner_.purge_queue(std::move(q)); }
  awaitable<std::int64_t> group_size(std::string q, std::string g) override {
    return inner_.group_size(std::move(q), std::move(g));
  }
  awaitable<std::int64_t> expire_own(std::string q, std::string w) override {
    return inner_.expire_own(std::move(q), std::move(w));
  }
  awaitable<void> release(std::string q, std::string w, std::vector<std::string> tokens) override {
    return inner_.release(std::move(q), std::move(w), std::move(tokens));
  }
  awaitable<reap_result> reap(std::string q, reap_options o) override { return inner_.reap(std::move(q), o); }
  awaitable<queue_counts> counts(std::string q) override { return inner_.counts(std::move(q)); }
  awaitable<promote_result> promote(std::string q, std::size_t max) override {
    return inner_.promote(std::move(q), max);
  }
  std::uint64_t delayed_version(const std::string& q) override { return inner_.delayed_version(q); }
  awaitable<void> wait_delayed(std::string q, std::uint64_t seen, std::chrono::milliseconds timeout) override {
    return inner_.wait_delayed(std::move(q), seen, timeout);
  }
  awaitable<std::vector<dead_letter>> dead_letters(std::string q, std::size_t offset, std::size_t limit) override {
    return inner_.dead_letters(std::move(q), offset, limit);
  }
  awaitable<std::optional<dead_letter>> dead_letter_of(std::string q, std::string id) override {
    return inner_.dead_letter_of(std::move(q), std::move(id));
  }
  awaitable<std::vector<std::string>> requeue(std::string q, std::vector<std::string> ids, bool at_head) override {
    return inner_.requeue(std::move(q), std::move(ids), at_head);
  }
  awaitable<std::int64_t> purge(std::string q, std::vector<std::string> ids) override {
    return inner_.purge(std::move(q), std::move(ids));
  }
  awaitable<bool> pause(std::string q, std::string group) override {
    return inner_.pause(std::move(q), std::move(group));
  }
  awaitable<bool> resume(std::string q, std::string group, resume_mode mode) override {
    return inner_.resume(std::move(q), std::move(group), mode);
  }
  awaitable<std::vector<paused_group>> paused_groups(std::string q) override {
    return inner_.paused_groups(std::move(q));
  }
  awaitable<void> report_worker(std::string q, worker_report r, std::chrono::milliseconds ttl) override {
    return inner_.report_worker(std::move(q), std::move(r), ttl);
  }
  awaitable<page<worker_report>> workers(std::string q, std::string c, std::size_t n) override {
    return inner_.workers(std::move(q), std::move(c), n);
  }
  awaitable<bool> claim_history(std::string q) override { return inner_.claim_history(std::move(q)); }
  awaitable<bool> record_history(std::string q, queue_counts c) override {
    return inner_.record_history(std::move(q), c);
  }
  awaitable<std::vector<history_point>> history(std::string q, std::chrono::minutes span) override {
    return inner_.history(std::move(q), span);
  }
  awaitable<page<std::string>> groups(std::string q, std::string prefix, std::string c, std::size_t n) override {
    return inner_.groups(std::move(q), std::move(prefix), std::move(c), n);
  }
  awaitable<group_status> group_of(std::string q, std::string g) override {
    return inner_.group_of(std::move(q), std::move(g));
  }
  awaitable<page<dead_letter>> find_dead(std::string q, dead_filter f, std::string c, std::size_t n) override {
    return inner_.find_dead(std::move(q), std::move(f), std::move(c), n);
  }
  awaitable<std::optional<kept_job>> kept_job_of(std::string q, std::string id) override {
    ++looks_;
    auto found = co_await inner_.kept_job_of(std::move(q), std::move(id));
    ++looks_held_;
    while (!looks_open_) {
      looks_opened_.expires_at(std::chrono::steady_clock::time_point::max());
      co_await looks_opened_.async_wait(asio::as_tuple(use_awaitable));
    }
    --looks_held_;
    co_return found;
  }
  awaitable<cancel_outcome> cancel(std::string q, std::string id) override {
    return inner_.cancel(std::move(q), std::move(id));
  }
  awaitable<std::vector<bool>> cancelled(std::string q, std::vector<held_job> jobs) override {
    return inner_.cancelled(std::move(q), std::move(jobs));
  }
  boost::asio::awaitable<void> put_schedule(std::string q, jobrt::stored_schedule s) override {
    return inner_.put_schedule(std::move(q), std::move(s));
  }
  boost::asio::awaitable<bool> remove_schedule(std::string q, std::string name) override {
    return inner_.remove_schedule(std::move(q), std::move(name));
  }
  boost::asio::awaitable<jobrt::page<jobrt::stored_schedule>> schedules(std::string q, std::string cursor,
                                                                        std::size_t limit) override {
    return inner_.schedules(std::move(q), std::move(cursor), limit);
  }
  boost::asio::awaitable<std::optional<jobrt::stored_schedule>> next_schedule(std::string q) override {
    return inner_.next_schedule(std::move(q));
  }
  boost::asio::awaitable<jobrt::schedule_fired> fire_schedule(std::string q, jobrt::schedule_step s) override {
    return inner_.fire_schedule(std::move(q), std::move(s));
  }
  std::uint64_t schedules_version(const std::string& q) override { return inner_.schedules_version(q); }
  boost::asio::awaitable<void> wait_schedules(std::string q, std::uint64_t seen,
                                              std::chrono::milliseconds timeout) override {
    return inner_.wait_schedules(std::move(q), seen, timeout);
  }
  std::uint64_t ended_version(const std::string& q) override { return inner_.ended_version(q); }
  awaitable<std::optional<kept_job>> wait_ended(std::string q, std::string id, std::uint64_t seen,
                                                std::chrono::milliseconds timeout) override {
    return inner_.wait_ended(std::move(q), std::move(id), seen, timeout);
  }
  awaitable<check_report> check(std::string q, bool repair) override { return inner_.check(std::move(q), repair); }

 private:
  backend& inner_;
  bool open_ = true;
  bool fail_next_ = false;
  std::size_t held_back_ = 0;
  asio::steady_timer opened_;  // parked at time_point::max(); open() wakes every waiter
  std::optional<int> enqueues_before_failure_;
  bool claims_open_ = true;
  std::size_t claims_held_ = 0;
  asio::steady_timer claims_opened_;  // the same, for claims
  std::size_t looks_ = 0;
  bool looks_open_ = true;
  std::size_t looks_held_ = 0;
  asio::steady_timer looks_opened_;  // the same, for the answers of kept_job_of
};

struct event {
  std::string group;
  std::int64_t seq;
  std::int64_t fence;
  bool start;
};

}  // namespace

// doctest_discover_tests hands the names to CMake, which splits a list at ';': a name with one
// becomes two tests that match no case, and fail.
#define CONFORMANCE(name)                                                                                             \
  static_assert(std::string_view(name).find(';') == std::string_view::npos, "no ';' in a test name");                 \
  static void DOCTEST_CAT(conformance_, __LINE__)(backend_kind);                                                      \
  TEST_CASE("memory backend: " name) { DOCTEST_CAT(conformance_, __LINE__)(backend_kind::memory); }                   \
  TEST_CASE("redis backend: " name) { DOCTEST_CAT(conformance_, __LINE__)(backend_kind::redis); }                     \
  TEST_CASE("cluster backend: " name) { DOCTEST_CAT(conformance_, __LINE__)(backend_kind::cluster); }                 \
  TEST_CASE("redis backend over TLS: " name) { DOCTEST_CAT(conformance_, __LINE__)(backend_kind::tls_redis); }        \
  TEST_CASE("sharded memory backend: " name) { DOCTEST_CAT(conformance_, __LINE__)(backend_kind::sharded_memory); }   \
  TEST_CASE("sharded redis backend: " name) { DOCTEST_CAT(conformance_, __LINE__)(backend_kind::sharded_redis); }     \
  TEST_CASE("sharded cluster backend: " name) { DOCTEST_CAT(conformance_, __LINE__)(backend_kind::sharded_cluster); } \
  static void DOCTEST_CAT(conformance_, __LINE__)(backend_kind kind)
