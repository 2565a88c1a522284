// Test support: a backend that passes every call on to a memory backend, counts the calls the
// worker's loops make (its parts: maintenance, the lease keeper, the claimer, the finisher),
// holds reaps, lease renewals or finishes at a gate while it is shut (a backend that does not
// answer them), and fails the next claims or finishes it is told to.
#pragma once

#include <jobrt/memory_backend.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace jobrt::test {

// Passes every call on to a memory backend. Counts the calls of the kinds the worker's
// maintenance and lease keeper make (reap, advertise, unrunnable_for, promote, delayed_version,
// wait_delayed, extend), and those of them still on their way; counts claims and finishes on
// their own. Holds reaps, extends or finishes at a gate while it is shut: a call the backend does
// not answer, which only cancellation ends. Everything runs on one thread.
class counting_backend final : public jobrt::backend {
 public:
  explicit counting_backend(boost::asio::any_io_executor ex)
      : inner_(ex), reaps_(ex), extends_(ex), finishes_(ex), shard_counts_(ex) {}

  memory_backend& inner() { return inner_; }
  void shut_reaps() { reaps_.open = false; }
  void shut_extends() { extends_.open = false; }
  void shut_finishes() { finishes_.open = false; }
  void open_finishes() {
    finishes_.open = true;
    finishes_.opened.cancel();
  }
  void shut_shard_counts() { shard_counts_.open = false; }  // shard_count waits (until cancelled)
  void report_shards(std::size_t n) { shards_ = n; }        // what shard_count says (1)
  std::size_t shard_counts_held() const { return shard_counts_.held; }
  void fail_claims(std::size_t n) { claims_to_fail_ = n; }      // the next n claim_wait calls throw
  void fail_finishes(std::size_t n) { finishes_to_fail_ = n; }  // the next n finish calls throw
  std::size_t finishes_held() const { return finishes_.held; }
  std::size_t finishes() const { return finishes_.calls; }  // finish calls, so far
  std::size_t claims() const { return claims_; }            // claim_wait calls, so far
  std::size_t claims_in_flight() const { return claims_in_flight_; }
  std::size_t reaps_held() const { return reaps_.held; }
  std::size_t extends_held() const { return extends_.held; }
  std::size_t extends() const { return extends_.calls; }        // extend calls, so far
  std::size_t calls() const { return calls_; }                  // of the counted kinds, so far
  std::size_t in_flight() const { return in_flight_; }          // of those, still on their way
  std::size_t delayed_waits() const { return delayed_waits_; }  // wait_delayed calls on their way

  boost::asio::awaitable<jobrt::reap_result> reap(std::string q, jobrt::reap_options o) override {
    flight f(*this);
    co_await pass(reaps_);
    co_return co_await inner_.reap(std::move(q), o);
  }
  boost::asio::awaitable<std::vector<bool>> extend(std::string q, std::string w, std::vector<std::string> tokens,
                                                   std::chrono::milliseconds ttl) override {
    flight f(*this);
    ++extends_.calls;
    co_await pass(extends_);
    co_return co_await inner_.extend(std::move(q), std::move(w), std::move(tokens), ttl);
  }
  boost::asio::awaitable<void> advertise(std::string q, std::vector<std::string> types,
                                         std::chrono::milliseconds ttl) override {
    flight f(*this);
    co_await inner_.advertise(std::move(q), std::move(types), ttl);
  }
  boost::asio::awaitable<std::chrono::milliseconds> unrunnable_for(std::string q, std::string type) override {
    flight f(*this);
    co_return co_await inner_.unrunnable_for(std::move(q), std::move(type));
  }
  boost::asio::awaitable<jobrt::promote_result> promote(std::string q, std::size_t max) override {
    flight f(*this);
    co_return co_await inner_.promote(std::move(q), max);
  }
  std::uint64_t delayed_version(const std::string& q) override {
    ++calls_;
    return inner_.delayed_version(q);
  }
  boost::asio::awaitable<void> wait_delayed(std::string q, std::uint64_t seen,
                                            std::chrono::milliseconds timeout) override {
    flight f(*this);
    ++delayed_waits_;
    co_await inner_.wait_delayed(std::move(q), seen, timeout);
    --delayed_waits_;
  }

  // Not of the counted kinds: passed on uncounted.
  boost::asio::awaitable<std::vector<jobrt::enqueue_result>> enqueue(std::string q,
                                                                     std::vector<jobrt::encoded_job> jobs) override {
    return inner_.enqueue(std::move(q), std::move(jobs));
  }
  boost::asio::awaitable<std::vector<jobrt::claimed_job>> claim(std::string q, jobrt::claim_options o) override {
    return inner_.claim(std::move(q), std::move(o));
  }

  // As a sharded queue's backend would say (the calls themselves go to the memory backend).
  boost::asio::awaitable<std::size_t> shard_count(std::string) override {
    co_await pass(shard_counts_);
    co_return shards_;
  }

  // Counted on their own, and failed when told to.
  boost::asio::awaitable<std::vector<jobrt::claimed_job>> claim_wait(std::string q, jobrt::claim_options o,
                                                                     std::chrono::milliseconds wait) override {
    ++claims_;
    if (claims_to_fail_ > 0) {
      --claims_to_fail_;
      throw std::runtime_error("claim refused by the test");
    }
    ++claims_in_flight_;
    struct done {
      std::size_t& n;
      ~done() { --n; }
    } d{claims_in_flight_};
    co_return co_await inner_.claim_wait(std::move(q), std::move(o), wait);
  }
  boost::asio::awaitable<std::vector<jobrt::finish_result>> finish(std::string q, std::string w,
                                                                   std::vector<jobrt::finish_item> items,
                                                                   std::chrono::milliseconds ttl) override {
    ++finishes_.calls;
    if (finishes_to_fail_ > 0) {
      --finishes_to_fail_;
      throw std::runtime_error("finish refused by the test");
    }
    co_await pass(finishes_);
    co_return co_await inner_.finish(std::move(q), std::move(w), std::move(items), ttl);
  }
  boost::asio::awaitable<std::int64_t> expire_own(std::string q, std::string w) override {
    return inner_.expire_own(std::move(q), std::move(w));
  }
  boost::asio::awaitable<void> release(std::string q, std::string w, std::vector<std::string> tokens) override {
    return inner_.release(std::move(q), std::move(w), std::move(tokens));
  }
  boost::asio::awaitable<jobrt::queue_counts> counts(std::string q) override { return inner_.counts(std::move(q)); }
  boost::asio::awaitable<std::vector<jobrt::dead_letter>> dead_letters(std::string q, std::size_t offset,
                                                                       std::size_t limit) override {
    return inner_.dead_letters(std::move(q), offset, limit);
  }
  boost::asio::awaitable<std::optional<jobrt::dead_letter>> dead_letter_of(std::string q, std::string id) override {
    return inner_.dead_letter_of(std::move(q), std::move(id));
  }
  boost::asio::awaitable<std::vector<std::string>> requeue(std::string q, std::vector<std::string> ids,
                                                           bool at_head) override {
    return inner_.requeue(std::move(q), std::move(ids), at_head);
  }
  boost::asio::awaitable<std::int64_t> purge(std::string q, std::vector<std::string> ids) override {
    return inner_.purge(std::move(q), std::move(ids));
  }
  boost::asio::awaitable<bool> pause(std::string q, std::string g) override {
    return inner_.pause(std::move(q), std::move(g));
  }
  boost::asio::awaitable<bool> resume(std::string q, std::string g, jobrt::resume_mode mode) override {
    return inner_.resume(std::move(q), std::move(g), mode);
  }
  boost::asio::awaitable<std::vector<jobrt::paused_group>> paused_groups(std::string q) override {
    return inner_.paused_groups(std::move(q));
  }
  boost::asio::awaitable<std::int64_t> purge_queue(std::string q) override { return inner_.purge_queue(std::move(q)); }
  boost::asio::awaitable<std::int64_t> group_size(std::string q, std::string g) override {
    return inner_.group_size(std::move(q), std::move(g));
  }
  boost::asio::awaitable<void> report_worker(std::string q, jobrt::worker_report r,
                                             std::chrono::milliseconds ttl) override {
    return inner_.report_worker(std::move(q), std::move(r), ttl);
  }
  boost::asio::awaitable<jobrt::page<jobrt::worker_report>> workers(std::string q, std::string c,
                                                                    std::size_t n) override {
    return inner_.workers(std::move(q), std::move(c), n);
  }
  boost::asio::awaitable<bool> claim_history(std::string q) override { return inner_.claim_history(std::move(q)); }
  boost::asio::awaitable<bool> record_history(std::string q, jobrt::queue_counts c) override {
    return inner_.record_history(std::move(q), c);
  }
  boost::asio::awaitable<std::vector<jobrt::history_point>> history(std::string q, std::chrono::minutes span) override {
    return inner_.history(std::move(q), span);
  }
  boost::asio::awaitable<jobrt::page<std::string>> groups(std::string q, std::string prefix, std::string c,
                                                          std::size_t n) override {
    return inner_.groups(std::move(q), std::move(prefix), std::move(c), n);
  }
  boost::asio::awaitable<jobrt::group_status> group_of(std::string q, std::string g) override {
    return inner_.group_of(std::move(q), std::move(g));
  }
  boost::asio::awaitable<jobrt::page<jobrt::dead_letter>> find_dead(std::string q, jobrt::dead_filter f, std::string c,
                                                                    std::size_t n) override {
    return inner_.find_dead(std::move(q), std::move(f), std::move(c), n);
  }
  boost::asio::awaitable<std::optional<jobrt::kept_job>> kept_job_of(std::string q, std::string id) override {
    return inner_.kept_job_of(std::move(q), std::move(id));
  }
  boost::asio::awaitable<jobrt::cancel_outcome> cancel(std::string q, std::string id) override {
    return inner_.cancel(std::move(q), std::move(id));
  }
  boost::asio::awaitable<std::vector<bool>> cancelled(std::string q, std::vector<jobrt::held_job> jobs) override {
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
  boost::asio::awaitable<std::optional<jobrt::kept_job>> wait_ended(std::string q, std::string id, std::uint64_t seen,
                                                                    std::chrono::milliseconds timeout) override {
    return inner_.wait_ended(std::move(q), std::move(id), seen, timeout);
  }
  boost::asio::awaitable<jobrt::check_report> check(std::string q, bool repair) override {
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

  struct gate {
    explicit gate(boost::asio::any_io_executor ex) : opened(ex) {}
    bool open = true;
    std::size_t held = 0;              // calls waiting at it now
    std::size_t calls = 0;             // (extend's: every call)
    boost::asio::steady_timer opened;  // parked at time_point::max(): a call waits here while the gate is shut
  };

  // Waits while the gate is shut; cancelled, it throws (as a backend call ended by cancellation).
  static boost::asio::awaitable<void> pass(gate& g) {
    while (!g.open) {
      ++g.held;
      g.opened.expires_at(std::chrono::steady_clock::time_point::max());
      co_await g.opened.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
      --g.held;
      auto state = co_await boost::asio::this_coro::cancellation_state;  // (g++ 12: not inside the condition)
      if (state.cancelled() != boost::asio::cancellation_type::none)
        throw boost::system::system_error(boost::asio::error::operation_aborted);
    }
  }

  memory_backend inner_;
  gate reaps_;
  gate extends_;
  gate finishes_;
  gate shard_counts_;
  std::size_t shards_ = 1;
  std::size_t claims_ = 0;
  std::size_t claims_in_flight_ = 0;
  std::size_t claims_to_fail_ = 0;
  std::size_t finishes_to_fail_ = 0;
  std::size_t calls_ = 0;
  std::size_t in_flight_ = 0;
  std::size_t delayed_waits_ = 0;
};

}  // namespace jobrt::test
