#include "worker/lease_keeper.hpp"

#include "worker/loops.hpp"

#include <jobrt/log.hpp>

#include <boost/asio/co_spawn.hpp>

#include <algorithm>
#include <utility>

namespace jobrt::detail {

lease_keeper::lease_keeper(asio::any_io_executor strand, backend& b, lease_keeper_options opts, std::string source,
                           lease_keeper_hooks hooks)
    : strand_(std::move(strand)),
      backend_(b),
      opts_(std::move(opts)),
      source_(std::move(source)),
      hooks_(std::move(hooks)),
      timer_(strand_),
      ended_(strand_, clock::time_point::max()) {}

void lease_keeper::start() {
  if (started_ || stopped_) return;
  started_ = true;
  asio::co_spawn(strand_, renew_loop(shared_from_this()), rethrow_if_died(source_, "watchdog"));
}

void lease_keeper::request_stop() {
  if (std::exchange(stopped_, true)) return;
  timer_.cancel();
  stop_.emit(asio::cancellation_type::terminal);
}

asio::awaitable<void> lease_keeper::stop() {
  request_stop();
  while (started_ && renewing_) co_await ended_.async_wait(use_tuple);
}

// Every period, one call renews every lease. A call gets one period to answer; while none does,
// the leases run out here as they do in the backend (hooks_.overdue), and the worker cancels
// their handlers.
asio::awaitable<void> lease_keeper::renew_loop(std::shared_ptr<lease_keeper> self) {
  auto period = self->opts_.period;
  auto tick = clock::now();
  while (!self->stopped_) {
    tick = std::max(tick + period, clock::now());
    co_await wait_on(self->timer_, tick);
    if (self->stopped_) break;
    std::vector<std::string> tokens;
    if (self->hooks_.tokens) tokens = self->hooks_.tokens();
    auto sent = clock::now();
    try {
      auto held = co_await stoppable(
          self->stop_, self->strand_,
          bounded(self->strand_,
                  self->backend_.extend(self->opts_.queue, self->opts_.worker, tokens, self->opts_.lease_ttl), period,
                  "lease renewal"));
      if (self->hooks_.answered) self->hooks_.answered();
      for (std::size_t i = 0; i < tokens.size() && i < held.size(); ++i) {
        if (held[i]) {
          if (self->hooks_.held) self->hooks_.held(tokens[i], sent + self->opts_.lease_ttl);
        } else {
          if (self->hooks_.lost) self->hooks_.lost(tokens[i]);
        }
      }
    } catch (const std::exception& e) {
      // Said out loud: a renewal that did not happen is how leases get lost.
      if (!self->stopped_) jobrt::log(log_level::warn, self->source_, "lease renewal failed: {}", e.what());
    }
    if (self->hooks_.overdue) self->hooks_.overdue();
    std::vector<held_job> kept;
    if (self->hooks_.kept_ids && !self->stopped_) kept = self->hooks_.kept_ids();
    if (kept.empty()) continue;
    try {
      // (Half a period at most: the next renewal is not to wait for it.)
      auto cancelled = co_await stoppable(self->stop_, self->strand_,
                                          bounded(self->strand_, self->backend_.cancelled(self->opts_.queue, kept),
                                                  period / 2, "asking after cancels"));
      for (std::size_t i = 0; i < kept.size() && i < cancelled.size(); ++i)
        if (cancelled[i] && self->hooks_.cancelled) self->hooks_.cancelled(kept[i]);
    } catch (const std::exception& e) {
      if (!self->stopped_) jobrt::log(log_level::warn, self->source_, "asking after cancels failed: {}", e.what());
    }
  }
  self->renewing_ = false;
  self->ended_.cancel();
}

}  // namespace jobrt::detail
