#include "worker/maintenance.hpp"

#include "worker/loops.hpp"

#include <jobrt/log.hpp>
#include <jobrt/scheduler.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>

#include <algorithm>
#include <utility>

namespace jobrt::detail {

maintenance::maintenance(asio::any_io_executor strand, backend& b, maintenance_options opts, std::string source,
                         maintenance_hooks hooks)
    : strand_(std::move(strand)),
      backend_(b),
      opts_(std::move(opts)),
      source_(std::move(source)),
      hooks_(std::move(hooks)),
      reap_timer_(strand_),
      retry_timer_(strand_),
      schedule_retry_timer_(strand_),
      ended_(strand_, clock::time_point::max()) {}

void maintenance::start(std::vector<std::string> handled_types) {
  if (started_ || stopped_) return;
  started_ = true;
  handled_types_ = std::move(handled_types);
  asio::co_spawn(strand_, reap_loop(shared_from_this()), rethrow_if_died(source_, "reaper"));
  asio::co_spawn(strand_, promote_loop(shared_from_this()), rethrow_if_died(source_, "promoter"));
  if (opts_.schedules) {
    scheduling_ = true;
    asio::co_spawn(strand_, schedule_loop(shared_from_this()), rethrow_if_died(source_, "scheduler"));
  }
}

void maintenance::reap_now() {
  reap_now_ = true;  // seen by the reaper even if it is in a call now
  reap_timer_.cancel();
}

void maintenance::request_stop() {
  if (std::exchange(stopped_, true)) return;
  reap_timer_.cancel();
  reap_stop_.emit(asio::cancellation_type::terminal);
  retry_timer_.cancel();
  promote_stop_.emit(asio::cancellation_type::terminal);
  schedule_retry_timer_.cancel();
  schedule_stop_.emit(asio::cancellation_type::terminal);
}

asio::awaitable<void> maintenance::stop() {
  request_stop();
  while (started_ && (reaping_ || promoting_ || scheduling_)) co_await ended_.async_wait(use_tuple);
}

// Recovery is every live worker's job, on a timer: what a crashed worker held goes back within
// one lease TTL plus one period. The reap script is atomic and idempotent, so workers racing
// each other only find less to do.
asio::awaitable<void> maintenance::reap_loop(std::shared_ptr<maintenance> self) {
  constexpr std::size_t batch = 100;
  reap_options ro{batch, self->opts_.dead_max_count, self->opts_.dead_max_age};
  bool all = false;  // reap_now came: every shard of a sharded queue
  auto drop_kept_at = std::chrono::steady_clock::now();
  while (!self->stopped_) {
    // Once a minute, the entries of completed kept jobs that ran out too (finish removes most).
    ro.drop_kept = std::chrono::steady_clock::now() >= drop_kept_at;
    if (ro.drop_kept) drop_kept_at = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    reap_result r;
    std::string failure;
    // A sharded queue is reaped by one worker at a time (the one whose turn it is), but every
    // shard of it at once by this one when leases were made reapable now.
    ro.turn = std::exchange(all, false) ? std::chrono::milliseconds(0) : self->opts_.reap_period * 2;
    try {
      r = co_await stoppable(
          self->reap_stop_, self->strand_,
          bounded(self->strand_, self->backend_.reap(self->opts_.queue, ro), self->opts_.lease_ttl, "reaping"));
    } catch (const std::exception& e) {
      failure = e.what();
    }
    if (!failure.empty() && !self->stopped_) jobrt::log(log_level::warn, self->source_, "reaping failed: {}", failure);
    if (r.leases > 0 || r.lanes > 0) {
      jobrt::log(log_level::info, self->source_, "recovered {} expired leases and {} lanes of {} dead workers",
                 r.leases, r.lanes, r.workers);
      if (self->hooks_.recovered) self->hooks_.recovered(r);
    }
    if (r.leases == static_cast<std::int64_t>(batch) || r.workers == static_cast<std::int64_t>(batch) ||
        r.dead_removed == static_cast<std::int64_t>(batch))
      continue;  // more to do: at once
    if ((all = std::exchange(self->reap_now_, false))) continue;
    co_await self->about_types();
    co_await self->for_operators();
    if (self->stopped_) break;  // (stop's cancel of the timer came while about_types was in a call)
    // reap_now's cancel of the timer, too, may have come during that call, before the wait
    // below: the flag says so.
    if ((all = std::exchange(self->reap_now_, false))) continue;
    co_await wait_on(self->reap_timer_, clock::now() + self->opts_.reap_period);
    all = std::exchange(self->reap_now_, false);
  }
  self->reaping_ = false;
  self->ended_.cancel();
}

// Says which job types the worker runs (every ten seconds or reaper period, whichever is longer,
// for three of those: unhandled_limit is minutes), and asks the backend about the types met
// without a handler (hooks_.unhandled_types; the worker forgets those not met for ten minutes).
// Each call starts only while the loops run: stop cancels the one on its way (reap_stop_).
asio::awaitable<void> maintenance::about_types() {
  auto now = clock::now();
  auto period = std::max<std::chrono::milliseconds>(opts_.reap_period, std::chrono::seconds(10));
  try {
    if (now - advertised_ >= period && !handled_types_.empty() && !stopped_) {
      std::vector<std::string> types = handled_types_;
      co_await stoppable(reap_stop_, strand_,
                         bounded(strand_, backend_.advertise(opts_.queue, std::move(types), 3 * period),
                                 opts_.lease_ttl, "saying which job types this worker runs"));
      advertised_ = now;
    }
    std::vector<std::string> names;
    if (hooks_.unhandled_types) names = hooks_.unhandled_types(now);
    for (auto& type : names) {
      if (stopped_) break;
      auto none_for = co_await stoppable(
          reap_stop_, strand_,
          bounded(strand_, backend_.unrunnable_for(opts_.queue, type), opts_.lease_ttl, "asking who runs a type"));
      if (hooks_.unrunnable) hooks_.unrunnable(type, none_for);
    }
  } catch (const std::exception& e) {
    if (!stopped_) jobrt::log(log_level::warn, source_, "job types: {}", e.what());
  }
}

// What operators see (the dashboard): the worker's report of itself, every ten seconds, or at
// the next reaper period when what it runs changed (at most one a second), kept for three
// reaper periods and at least 30 s (it outlasts the wait to the next); and once a minute, the
// queue's counts as the minute's history point, when no process has stored one yet. An idle
// worker so costs a call every ten seconds.
asio::awaitable<void> maintenance::for_operators() {
  auto now = clock::now();
  try {
    if (hooks_.report && !stopped_) {
      auto report = hooks_.report();
      std::size_t sig = std::hash<std::int64_t>{}(report.running);
      for (const auto& j : report.jobs) sig = sig * 31 + std::hash<std::string>{}(j.id);
      auto since = now - reported_;
      if (since >= std::chrono::seconds(10) || (sig != reported_sig_ && since >= std::chrono::seconds(1))) {
        auto keep = 3 * std::max<std::chrono::milliseconds>(opts_.reap_period, std::chrono::seconds(10));
        co_await stoppable(reap_stop_, strand_,
                           bounded(strand_, backend_.report_worker(opts_.queue, std::move(report), keep),
                                   opts_.lease_ttl, "reporting the worker"));
        reported_ = now;
        reported_sig_ = sig;
      }
    }
    auto minute =
        std::chrono::duration_cast<std::chrono::minutes>(std::chrono::system_clock::now().time_since_epoch()).count();
    if (minute != history_minute_ && !stopped_) {
      bool due = co_await stoppable(
          reap_stop_, strand_,
          bounded(strand_, backend_.claim_history(opts_.queue), opts_.lease_ttl, "looking at the queue's history"));
      if (due && !stopped_) {
        auto counts = co_await stoppable(
            reap_stop_, strand_,
            bounded(strand_, backend_.counters(opts_.queue), opts_.lease_ttl, "counting the queue for its history"));
        co_await stoppable(reap_stop_, strand_,
                           bounded(strand_, backend_.record_history(opts_.queue, counts), opts_.lease_ttl,
                                   "recording the queue's history"));
      }
      history_minute_ = minute;
    }
  } catch (const std::exception& e) {
    if (!stopped_) jobrt::log(log_level::warn, source_, "reports for operators: {}", e.what());
  }
}

// Delayed jobs and retries waiting for their backoff: moved when due, by a timer armed for the
// earliest due time; the backend wakes it early when an earlier entry arrives (from any
// process). Every live worker runs it; the promote script is atomic, so they only share work.
asio::awaitable<void> maintenance::promote_loop(std::shared_ptr<maintenance> self) {
  constexpr std::size_t batch = 1000;
  auto backoff = std::chrono::milliseconds(100);
  // Both steps are cancelled by stop() (promote_stop_), which waits for this loop to end.
  auto stoppable = asio::bind_cancellation_slot(self->promote_stop_.slot(), use_tuple);
  while (!self->stopped_) {
    auto seen = self->backend_.delayed_version(self->opts_.queue);
    auto [error, r] =
        co_await asio::co_spawn(self->strand_, self->backend_.promote(self->opts_.queue, batch), stoppable);
    if (self->stopped_) break;
    if (error) {
      jobrt::log(log_level::warn, self->source_, "promoting delayed jobs failed: {} (retrying in {} ms)", what(error),
                 backoff.count());
      co_await wait_on(self->retry_timer_, clock::now() + backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
      continue;
    }
    backoff = std::chrono::milliseconds(100);
    if (r.moved > 0 && self->hooks_.promoted) self->hooks_.promoted(r.moved);
    if (r.moved == static_cast<std::int64_t>(batch)) continue;  // more are due: at once
    auto wait = std::min(r.next_due.value_or(self->opts_.promote_backstop), self->opts_.promote_backstop);
    co_await asio::co_spawn(self->strand_, self->backend_.wait_delayed(self->opts_.queue, seen, wait), stoppable);
  }
  self->promoting_ = false;
  self->ended_.cancel();
}

// Every worker's scheduler fires what is due (backend::fire_schedule takes each step once), then
// sleeps until the next firing, or until a schedule is put or removed.
asio::awaitable<void> maintenance::schedule_loop(std::shared_ptr<maintenance> self) {
  scheduler fires(self->backend_, self->opts_.queue);
  auto backoff = std::chrono::milliseconds(100);
  auto stoppable = asio::bind_cancellation_slot(self->schedule_stop_.slot(), use_tuple);
  while (!self->stopped_) {
    auto seen = self->backend_.schedules_version(self->opts_.queue);
    auto [error, next] = co_await asio::co_spawn(self->strand_, fires.fire_due(), stoppable);
    if (self->stopped_) break;
    if (error) {
      jobrt::log(log_level::warn, self->source_, "firing repeatable jobs failed: {} (retrying in {} ms)", what(error),
                 backoff.count());
      co_await wait_on(self->schedule_retry_timer_, clock::now() + backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
      continue;
    }
    backoff = std::chrono::milliseconds(100);
    auto wait = self->opts_.promote_backstop;
    if (next)
      wait = std::clamp(std::chrono::ceil<std::chrono::milliseconds>(*next - std::chrono::system_clock::now()),
                        std::chrono::milliseconds(0), wait);
    if (wait.count() > 0)
      co_await asio::co_spawn(self->strand_, self->backend_.wait_schedules(self->opts_.queue, seen, wait), stoppable);
  }
  self->scheduling_ = false;
  self->ended_.cancel();
}

}  // namespace jobrt::detail
