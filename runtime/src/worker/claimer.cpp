#include "worker/claimer.hpp"

#include "worker/loops.hpp"

#include <jobrt/log.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>

#include <algorithm>
#include <utility>
#include <vector>

namespace jobrt::detail {

claimer::claimer(asio::any_io_executor strand, backend& b, claimer_options opts, std::string source,
                 claimer_hooks hooks)
    : strand_(std::move(strand)),
      backend_(b),
      opts_(std::move(opts)),
      source_(std::move(source)),
      hooks_(std::move(hooks)),
      slot_timer_(strand_),
      pause_(strand_),
      ended_(strand_, clock::time_point::max()) {}

void claimer::start(std::shared_ptr<const void> owner) {
  if (started_ || stopped_) return;
  started_ = true;
  asio::co_spawn(strand_, claim_loop(shared_from_this(), std::move(owner)), rethrow_if_died(source_, "claim"));
}

void claimer::slot_freed() { slot_timer_.cancel(); }

void claimer::request_stop() {
  if (std::exchange(stopped_, true)) return;
  stop_.emit(asio::cancellation_type::terminal);
  slot_timer_.cancel();
  pause_.cancel();
}

asio::awaitable<void> claimer::stop() {
  request_stop();
  while (started_ && claiming_) co_await ended_.async_wait(use_tuple);
}

// A heartbeat before the first claim: a worker that dies between a BLMOVE and its claim must
// already be known to the reaper, or the lane in its claimed list would be nobody's. A worker
// that ran before under this id gets its leases back at once: they expire now and the reaper,
// told through hooks_.expired, sends their jobs back (its claimed lanes it takes at its first
// claim).
asio::awaitable<void> claimer::before_first_claim() {
  try {
    auto expired = co_await stoppable(stop_, strand_,
                                      bounded(strand_, backend_.expire_own(opts_.queue, opts_.worker), opts_.lease_ttl,
                                              "expiring this worker's previous leases"));
    if (expired > 0) {
      jobrt::log(log_level::info, source_, "{} leases of this worker's previous run expired", expired);
      if (hooks_.expired) hooks_.expired(expired);
    }
  } catch (const std::exception& e) {
    if (!stopped_) jobrt::log(log_level::warn, source_, "expiring this worker's previous leases failed: {}", e.what());
  }
  try {
    std::vector<std::string> none;
    co_await stoppable(stop_, strand_,
                       bounded(strand_, backend_.extend(opts_.queue, opts_.worker, std::move(none), opts_.lease_ttl),
                               opts_.lease_ttl, "the first heartbeat"));
  } catch (const std::exception& e) {
    if (!stopped_) jobrt::log(log_level::warn, source_, "first heartbeat failed: {}", e.what());
  }
}

asio::awaitable<void> claimer::claim_loop(std::shared_ptr<claimer> self, std::shared_ptr<const void> owner) {
  co_await self->before_first_claim();
  auto backoff = std::chrono::milliseconds(100);
  while (!self->stopped_) {
    std::size_t free = self->hooks_.free_slots ? self->hooks_.free_slots() : 0;
    if (free == 0) {
      co_await wait_on(self->slot_timer_);
      continue;
    }
    // Under load a claim asks for at most half the slots: the next claim goes out as soon as
    // this one's jobs start, and the backend serves it while this process runs them. Claims
    // for every free slot keep both sides in step, each idle while the other works (bench:
    // about 20% more jobs/s with half; a third or a quarter gained less, their calls cost more).
    auto want = self->drained_ ? free : std::min(free, (self->opts_.concurrency + 1) / 2);
    claim_options co{self->opts_.worker, want, self->opts_.lease_ttl, self->opts_.burst - 1, self->opts_.rate};
    if (self->hooks_.claiming) self->hooks_.claiming(true);
    std::vector<claimed_job> jobs;
    std::string failure;
    std::optional<std::chrono::milliseconds> limited;  // the queue's rate limit: when to ask again
    try {
      // claim_wait claims at once when work is ready and otherwise waits inside the backend
      // (BLMOVE); a stop cuts the wait short through this slot. Jobs a claim leased just as the
      // stop came still come back (the backend's reply wins over the cancellation).
      auto [claim_error, claimed] = co_await asio::co_spawn(
          self->strand_, self->backend_.claim_wait(self->opts_.queue, co, self->opts_.claim_wait),
          asio::bind_cancellation_slot(self->stop_.slot(), asio::as_tuple(asio::use_awaitable)));
      jobs = std::move(claimed);
      if (claim_error && !self->stopped_) std::rethrow_exception(claim_error);
      backoff = std::chrono::milliseconds(100);
    } catch (const rate_limited& e) {
      limited = e.retry_after();
    } catch (const std::exception& e) {
      failure = e.what();
    }
    if (self->hooks_.claiming) self->hooks_.claiming(false);
    if (limited) {  // no failure: a timer to the time the limit names (stop cuts it short)
      if (self->stopped_) break;
      co_await wait_on(self->pause_, clock::now() + *limited);
      continue;
    }
    if (!failure.empty()) {
      if (self->stopped_) break;
      jobrt::log(log_level::warn, self->source_, "claim failed: {} (retrying in {} ms)", failure, backoff.count());
      // A timer, not a poll: the backend is failing, and hammering it helps nobody. (Stop cuts
      // it short.)
      co_await wait_on(self->pause_, clock::now() + backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
      continue;
    }
    self->drained_ = jobs.size() < want;  // nothing else was ready
    if (self->hooks_.claimed)
      for (auto& j : jobs) self->hooks_.claimed(std::move(j));
  }
  self->claiming_ = false;
  self->ended_.cancel();
  owner.reset();  // (last: the worker may go with it)
}

}  // namespace jobrt::detail
