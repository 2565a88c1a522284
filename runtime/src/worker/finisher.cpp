#include "worker/finisher.hpp"

#include "worker/loops.hpp"

#include <jobrt/log.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/this_coro.hpp>

#include <algorithm>
#include <utility>

namespace jobrt::detail {

finisher::finisher(asio::any_io_executor strand, backend& b, finisher_options opts, std::string source,
                   finisher_hooks hooks)
    : strand_(std::move(strand)),
      backend_(b),
      opts_(std::move(opts)),
      source_(std::move(source)),
      hooks_(std::move(hooks)),
      wake_(strand_),
      ended_(strand_, clock::time_point::max()) {}

void finisher::start() {
  if (started_ || stopped_) return;
  started_ = true;
  asio::co_spawn(strand_, flush_loop(shared_from_this()), rethrow_if_died(source_, "finish"));
}

void finisher::add(finish_item item, finish_note note) {
  if (stopped_) {  // the backend may be gone: the lease expires and the job runs again
    jobrt::log(log_level::warn, source_, "lease {} ended after stop; not finished", item.token);
    return;
  }
  pending_.push_back(std::move(item));
  notes_.push_back(std::move(note));
  if (idle_) wake_.cancel();
}

bool finisher::has(const std::string& token) const {
  return in_calls_.contains(token) ||
         std::any_of(pending_.begin(), pending_.end(), [&](const finish_item& item) { return item.token == token; });
}

std::vector<std::string> finisher::tokens() const {
  std::vector<std::string> tokens(in_calls_.begin(), in_calls_.end());
  for (const auto& item : pending_) tokens.push_back(item.token);
  return tokens;
}

void finisher::request_stop() {
  if (std::exchange(stopped_, true)) return;
  wake_.cancel();
  asking_stop_.emit(asio::cancellation_type::terminal);
  for (auto& call : calls_) call.stop.emit(asio::cancellation_type::terminal);
}

asio::awaitable<void> finisher::stop() {
  request_stop();
  while (started_ && flushing_) co_await ended_.async_wait(use_tuple);
}

// A sharded queue's call goes to its shards at once already: one call at a time there makes each
// shard's part bigger (half the calls, less Redis CPU a job; bench/cluster.sh). Asked before a
// flush until known, bounded, cut short by a stop, and after a failure not again for 5 s.
asio::awaitable<void> finisher::learn_shards() {
  try {
    auto shards = co_await stoppable(
        asking_stop_, strand_,
        bounded(strand_, backend_.shard_count(opts_.queue), std::chrono::seconds(1), "the shard count"));
    if (shards > 1) opts_.calls_max = 1;
    shards_known_ = true;
  } catch (const std::exception& e) {
    ask_shards_after_ = clock::now() + std::chrono::seconds(5);  // flushes do not wait on it meanwhile
    jobrt::log(log_level::debug, source_, "the shards of queue '{}' are not known yet: {}", opts_.queue, e.what());
  }
}

asio::awaitable<void> finisher::flush_loop(std::shared_ptr<finisher> self) {
  for (;;) {
    if (!self->shards_known_ && !self->stopped_ && clock::now() >= self->ask_shards_after_)
      co_await self->learn_shards();
    if (self->stopped_ && !self->pending_.empty()) {  // stop ended the calls; no new one starts
      jobrt::log(log_level::error, self->source_,
                 "{} results came too late to finish before stop; their leases expire and they run again",
                 self->pending_.size());
      self->pending_.clear();
      self->notes_.clear();
    }
    std::vector<finish_item> items;
    std::vector<finish_note> notes;
    if (self->calls_.size() < self->opts_.calls_max) self->take_sendable(items, notes);
    if (items.empty()) {
      if (self->stopped_ && self->calls_.empty()) break;
      self->idle_ = true;
      co_await wait_on(self->wake_);  // until add, a call's end or stop
      self->idle_ = false;
      continue;
    }
    auto call = self->calls_.emplace(self->calls_.end());
    for (auto& item : items)
      if (self->in_calls_.insert(item.token).second) call->tokens.push_back(item.token);
    asio::co_spawn(self->strand_, finish_call(self, std::move(items), std::move(notes)),
                   asio::bind_cancellation_slot(call->stop.slot(), [self, call](std::exception_ptr e) {
                     for (auto& token : call->tokens) self->in_calls_.erase(token);
                     self->calls_.erase(call);
                     if (self->idle_) self->wake_.cancel();
                     if (e) std::rethrow_exception(e);
                   }));
  }
  self->flushing_ = false;
  self->ended_.cancel();
}

// The pending results whose tokens are in no call on its way, in the order they came; the others
// stay.
void finisher::take_sendable(std::vector<finish_item>& items, std::vector<finish_note>& notes) {
  if (in_calls_.empty()) {
    items = std::exchange(pending_, {});
    notes = std::exchange(notes_, {});
    return;
  }
  std::size_t kept = 0;
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    if (in_calls_.contains(pending_[i].token)) {
      if (kept != i) {
        pending_[kept] = std::move(pending_[i]);
        notes_[kept] = std::move(notes_[i]);
      }
      ++kept;
    } else {
      items.push_back(std::move(pending_[i]));
      notes.push_back(std::move(notes_[i]));
    }
  }
  pending_.resize(kept);
  notes_.resize(kept);
}

// One finish call, sent again after a failure until it gets through or the finisher stops;
// request_stop() cuts short a call the backend does not answer.
asio::awaitable<void> finisher::finish_call(std::shared_ptr<finisher> self, std::vector<finish_item> items,
                                            std::vector<finish_note> notes) {
  co_await asio::this_coro::throw_if_cancelled(false);  // a cancelled call fails like any other
  auto backoff = std::chrono::milliseconds(100);
  asio::steady_timer pause(self->strand_);
  for (;;) {
    std::vector<finish_result> results;
    std::string failure;
    try {
      results = co_await self->backend_.finish(self->opts_.queue, self->opts_.worker, items, self->opts_.lease_ttl);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    if (failure.empty()) {
      if (self->hooks_.finished)
        for (std::size_t i = 0; i < items.size() && i < results.size(); ++i)
          self->hooks_.finished(items[i], notes[i], results[i]);
      co_return;
    }
    if (self->stopped_) {
      jobrt::log(log_level::error, self->source_,
                 "finishing {} jobs failed after stop: {}; their leases expire and they run again", items.size(),
                 failure);
      co_return;
    }
    // The same batch again: the same call, which the backend answers from its record of the call
    // if the first one got through.
    jobrt::log(log_level::warn, self->source_, "finishing {} jobs failed: {} (retrying in {} ms)", items.size(),
               failure, backoff.count());
    co_await wait_on(pause, clock::now() + backoff);  // stop cuts it short through the call's signal
    if (self->stopped_) {
      jobrt::log(log_level::error, self->source_,
                 "finishing {} jobs stopped with the worker; their leases expire and they run again", items.size());
      co_return;
    }
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
}

}  // namespace jobrt::detail
