#include <jobrt/worker.hpp>

#include "backend/job_codec.hpp"
#include "backend/views.hpp"
#include "clock.hpp"
#include "strand.hpp"
#include "worker/claimer.hpp"
#include "worker/finisher.hpp"
#include "worker/lease_keeper.hpp"
#include "worker/loops.hpp"
#include "worker/maintenance.hpp"

#include <jobrt/log.hpp>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/serialize.hpp>

#include <unistd.h>

#include <algorithm>
#include <deque>
#include <list>
#include <mutex>
#include <random>
#include <unordered_map>
#include <unordered_set>

namespace jobrt {

namespace asio = boost::asio;
using clock = std::chrono::steady_clock;

void job_context::log(std::string_view message) const {
  log_fields fields{job_.id, job_.group, job_.type, job_.attempt, worker_};
  if (job_.group.empty())
    jobrt::log(log_level::info, fields, "job", "{}: {}", job_.id, message);
  else
    jobrt::log(log_level::info, fields, "job", "{} (group {}): {}", job_.id, job_.group, message);
}

void job_context::set_result(const boost::json::value& result) {
  auto text = boost::json::serialize(result);
  if (text.size() > max_result_)
    throw std::invalid_argument(fmt::format("job {} result is {} bytes encoded; the limit is {} (max_result_bytes)",
                                            job_.id, text.size(), max_result_));
  result_ = std::move(text);
}

bool job_context::throttle_group(std::chrono::milliseconds pause) {
  if (pause.count() < 1 || pause > max_rate_window)
    throw std::invalid_argument(fmt::format("job {} throttle_group pause is {} ms; it must be from 1 to {}", job_.id,
                                            pause.count(), max_rate_window.count()));
  if (job_.group.empty()) return false;
  throttle_ = std::max(throttle_, pause);
  return true;
}

void histogram::observe(double seconds) noexcept {
  std::size_t i = 0;
  while (i < bounds.size() && seconds > bounds[i]) ++i;
  ++counts[i];
  sum += seconds;
  ++count;
}

follow_policy parse_follow_policy(std::string_view text) {
  if (text == "after-commit") return follow_policy::after_commit;
  if (text == "pipelined") return follow_policy::pipelined;
  throw std::invalid_argument(fmt::format("follow policy '{}' is not one of after-commit, pipelined", text));
}

namespace {

std::string this_host() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "host");
  return host;
}

}  // namespace

std::string make_worker_id() {
  std::random_device rd;
  return fmt::format("{}:{}:{:08x}", this_host(), ::getpid(), rd());
}

namespace {

using detail::bounded;
using detail::stoppable;
using detail::use_tuple;
using detail::wait_on;
using detail::what;

// Finish calls on their way at once: the backend runs one while the worker handles another's
// answer (bench: about 1.6x the jobs/s over 1,000 groups than one call at a time). On a sharded
// queue, one (the finisher's).
constexpr std::size_t finish_calls_max = 2;

bool is_permanent(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const permanent_failure&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

class worker::impl : public std::enable_shared_from_this<impl> {
 public:
  impl(asio::any_io_executor ex, backend& b, worker_options opts)
      : ex_(ex),
        strand_(detail::make_strand(ex)),
        backend_(b),
        opts_(std::move(opts)),
        idle_timer_(strand_),
        stopped_timer_(strand_, clock::time_point::max()) {
    if (opts_.id.empty()) opts_.id = make_worker_id();
    source_ = "worker " + opts_.id;
    check_queue_name(opts_.queue);
    if (opts_.concurrency == 0) throw std::invalid_argument("worker concurrency is 0");
    // Past a day, times made from these (TTL / 3 in the steady clock's nanoseconds) overflow.
    constexpr std::chrono::milliseconds day = std::chrono::hours(24);
    if (opts_.lease_ttl.count() <= 0 || opts_.lease_ttl > day)
      throw std::invalid_argument(
          fmt::format("worker lease_ttl is {} ms; it must be from 1 ms to a day", opts_.lease_ttl.count()));
    auto check = [&](const char* name, std::chrono::milliseconds value, std::chrono::milliseconds least) {
      if (value < least || value > day)
        throw std::invalid_argument(
            fmt::format("worker {} is {} ms; it must be from {} ms to a day", name, value.count(), least.count()));
    };
    // (0: the default, from lease_ttl; a claim_wait of 0 would ask again at once, for ever.)
    check("watchdog_period", opts_.watchdog_period, std::chrono::milliseconds(0));
    check("reap_period", opts_.reap_period, std::chrono::milliseconds(0));
    check("claim_wait", opts_.claim_wait, std::chrono::milliseconds(1));
    check("unhandled_delay", opts_.unhandled_delay, std::chrono::milliseconds(0));
    check("unhandled_limit", opts_.unhandled_limit, std::chrono::milliseconds(0));
    // Renewed less often than the lease lasts, a lease runs out between renewals: said, not
    // refused (a test may want no renewals at all).
    if (opts_.watchdog_period >= opts_.lease_ttl)
      jobrt::log(log_level::warn, source_, "watchdog_period is {} ms, not below lease_ttl, {} ms: leases will run out",
                 opts_.watchdog_period.count(), opts_.lease_ttl.count());
    if (opts_.burst == 0) opts_.burst = 1;
    if (opts_.rate_limit) {
      check_rate_limit(*opts_.rate_limit, "worker rate_limit");
      opts_.burst = 1;  // (every start goes through a claim, which counts it)
    }
    // A burst's results travel in one finish call (backend: finish_parts), which takes at most
    // about a thousand.
    if (opts_.burst > 1000)
      throw std::invalid_argument(fmt::format("worker burst is {}; the largest is 1000", opts_.burst));
    if (opts_.watchdog_period.count() <= 0) opts_.watchdog_period = opts_.lease_ttl / 3;
    if (opts_.reap_period.count() <= 0) opts_.reap_period = opts_.watchdog_period;
    detail::maintenance_options mo;
    mo.queue = opts_.queue;
    mo.lease_ttl = opts_.lease_ttl;
    mo.reap_period = opts_.reap_period;
    mo.dead_max_count = opts_.dead_max_count;
    mo.dead_max_age = opts_.dead_max_age;
    mo.promote_backstop = opts_.promote_backstop;
    mo.schedules = opts_.schedules;
    maintenance_ =
        std::make_shared<detail::maintenance>(strand_, backend_, std::move(mo), source_, maintenance_hooks());
    detail::lease_keeper_options lo;
    lo.queue = opts_.queue;
    lo.worker = opts_.id;
    lo.lease_ttl = opts_.lease_ttl;
    lo.period = opts_.watchdog_period;
    lease_keeper_ =
        std::make_shared<detail::lease_keeper>(strand_, backend_, std::move(lo), source_, lease_keeper_hooks());
    detail::claimer_options co;
    co.queue = opts_.queue;
    co.worker = opts_.id;
    co.concurrency = opts_.concurrency;
    co.burst = opts_.burst;
    co.lease_ttl = opts_.lease_ttl;
    co.claim_wait = opts_.claim_wait;
    co.rate = opts_.rate_limit;
    claimer_ = std::make_shared<detail::claimer>(strand_, backend_, std::move(co), source_, claimer_hooks());
    detail::finisher_options fo;
    fo.queue = opts_.queue;
    fo.worker = opts_.id;
    fo.lease_ttl = opts_.lease_ttl;
    fo.calls_max = finish_calls_max;
    detail::finisher_hooks fh;
    fh.finished = [this](const finish_item& item, const detail::finish_note& note, finish_result& result) {
      on_finished(item, note, result);
    };
    finisher_ = std::make_shared<detail::finisher>(strand_, backend_, std::move(fo), source_, std::move(fh));
  }

  const worker_options& options() const noexcept { return opts_; }

  worker_counters counters() const {
    std::lock_guard lock(counters_mutex_);
    return counters_;
  }

  std::size_t in_flight() const noexcept { return held_count_.load(std::memory_order_relaxed); }
  worker_state state() const noexcept { return state_.load(std::memory_order_relaxed); }
  bool waiting_for_work() const noexcept {
    return state() == worker_state::running && claim_out_.load(std::memory_order_relaxed) && in_flight() == 0;
  }
  // Stop has begun: nothing more is claimed or started.
  bool stopping() const noexcept { return state() >= worker_state::draining; }

  void add_handler(std::string type, handler h, std::optional<backoff> b) {
    handlers_[type] = std::move(h);
    if (b) backoffs_[std::move(type)] = *b;
  }

  void start() {
    asio::post(strand_, [self = shared_from_this()] {
      if (self->state_ != worker_state::created) return;  // (a stop came first: nothing starts)
      self->state_ = worker_state::running;
      self->started_ms_ = detail::unix_ms();
      // (A part whose loop dies: detail::rethrow_if_died.)
      self->claimer_->start(self);   // holds the impl until it ends, in stop (see claimer_hooks)
      self->lease_keeper_->start();  // the watchdog
      std::vector<std::string> types;
      for (auto& [type, h] : self->handlers_) types.push_back(type);
      self->maintenance_->start(std::move(types));  // the reaper and the promoter
      self->finisher_->start();
    });
  }

  static asio::awaitable<void> stop(std::shared_ptr<impl> self, std::chrono::milliseconds grace) {
    co_await detail::run_on(self->strand_, self->do_stop(grace));
  }

 private:
  enum class job_state { running, finishing, lost, stopping };

  struct running_job {
    explicit running_job(const asio::any_io_executor& s) : deadline(s) {}
    std::shared_ptr<job_context> ctx;
    asio::cancellation_signal signal;
    asio::any_io_executor executor;  // where the handler runs (its group's strand)
    // Its group, when its handler runs on the group's strand: one job of the group at a time in
    // this process. Empty for an ungrouped job and one whose group runs several at once.
    std::string strand_group;
    asio::steady_timer deadline;  // the job's timeout, on the worker's strand
    std::string unique_id;
    std::vector<job_record> ahead;  // its followers, run next under the same lease
    job_state state = job_state::running;
    bool timed_out = false;
    bool cancel_asked = false;  // its job was cancelled (backend::cancel): the run ends so
    // A job of this lease ran before (a crash or a lost lease replays it): its followers wait for
    // their predecessors' keeps even when follow is pipelined (see on_handler_done).
    bool replayed = false;
    clock::time_point started = clock::now();
    // Past this, no renewal has reached the backend for a whole TTL: the lease is gone or about
    // to go. Set from when the lease's reply came (it was made a round trip before), then from
    // when each renewal that found it held was sent.
    clock::time_point valid_until;
    // Counts against the concurrency until the handler is done; a job whose finish asks for its
    // group's next job keeps it until the answer (the next job takes it, unless a job that
    // waited for a slot comes first: see start_or_wait).
    bool holds_slot = true;
  };

  // Runs a claimed job's handler on its group's strand (or anywhere, ungrouped). A follower
  // (see on_kept) comes with its lease's validity.
  void launch(claimed_job c, std::optional<clock::time_point> valid_until = {}, bool replayed = false) {
    // A token this worker holds already: a failover lost the newest writes, the claim that leased
    // it among them, and the fence counter went back (docs/RELIABILITY.md), so a claim leased the
    // lane again under the same fence. When the job here is the one the claim gave, it is one
    // lease: that job goes on under it (its renewals and its end are the lease's), and the claim
    // adds nothing. Otherwise (a follower runs under the token, or the lease was found lost) the
    // job here is cancelled and the new lease goes back unrun, behind that job's results.
    if (auto it = running_.find(c.token); it != running_.end()) {
      const auto& r = *it->second;
      if ((r.state == job_state::running || r.state == job_state::finishing) && r.ctx->fence() == c.fence &&
          r.ctx->job().id == c.job.id) {
        jobrt::log(log_level::warn, source_, "a claim gave lease {} again, which its job here holds (a failover?)",
                   c.token);
        return;
      }
      lease_lost(c.token, "was leased again (a failover?)");
      give_back(std::move(c.token), "was leased again while another job ran under it (a failover?)");
      return;
    }
    ++held_;
    held_count_.store(held_, std::memory_order_relaxed);
    ++busy_;
    std::string token = c.token;
    job j;
    try {
      j = detail::decode(c.job, c.group);
    } catch (const std::exception& e) {
      // A record a buggy producer wrote: it fails with the reason; nothing else is touched. Its
      // id is released only when the body, as far as it reads, says the producer gave it.
      finish_now(token, c.job.id, finish_kind::fail, detail::producer_id(c.job),
                 fmt::format("malformed job: {}", e.what()));
      free_slot();
      return;
    }
    if (j.attempt > j.max_attempts) {  // its leases expired that often: a poison job, not a loop
      bool halt = !j.group.empty() && j.on_failure.value_or(opts_.on_failure) == failure_policy::halt;
      finish_now(token, c.job.id, halt ? finish_kind::halt : finish_kind::fail, j.unique_id ? j.id : std::string(),
                 fmt::format("gave up: attempt {} of at most {} (earlier attempts lost their leases)", j.attempt,
                             j.max_attempts));
      free_slot();
      return;
    }
    auto h = handlers_.find(j.type);
    if (h == handlers_.end()) {
      no_handler(std::move(token), j);
      free_slot();
      return;
    }
    auto r = std::make_shared<running_job>(strand_);
    r->unique_id = j.unique_id ? j.id : std::string();
    r->ahead = std::move(c.ahead);
    r->valid_until = valid_until.value_or(clock::now() + opts_.lease_ttl);
    r->replayed = replayed || j.attempt > 1;
    // A strand even for an ungrouped job: its cancellation is emitted there, and that must not
    // race with the handler on a multi-threaded io_context. A job whose group runs several at
    // once (job::group_concurrency) gets one of its own too.
    if (!j.group.empty() && j.group_concurrency <= 1) r->strand_group = j.group;
    r->executor = r->strand_group.empty() ? detail::make_strand(ex_) : acquire_strand(j.group);
    r->ctx = std::make_shared<job_context>(std::move(j), c.fence, opts_.id);
    r->ctx->max_result_ = opts_.max_result_bytes;
    running_[token] = r;
    {
      std::lock_guard lock(counters_mutex_);
      ++counters_.started;
      ++by_type_[r->ctx->job().type].started;
      if (auto at = r->ctx->job().enqueued_at_ms; at > 0 && r->ctx->attempt() == 1) {
        auto now = detail::unix_ms();
        pickup_.observe(static_cast<double>(std::max<std::int64_t>(0, now - at)) / 1000.0);
      }
    }
    if (auto limit = r->ctx->job().timeout; limit.count() > 0) {
      // At the deadline the handler is cancelled, and the attempt fails. (The producer takes
      // at most a year; a record written elsewhere may say more, which the clock's nanoseconds
      // could not hold.)
      r->deadline.expires_after(std::min(limit, max_job_timeout));
      r->deadline.async_wait([self = shared_from_this(), r](boost::system::error_code ec) {
        if (ec || r->state != job_state::running) return;
        r->timed_out = true;
        self->cancel_handler(r);
      });
    }
    asio::co_spawn(
        r->executor, run_handler(h->second, r->ctx),
        asio::bind_cancellation_slot(r->signal.slot(), [self = shared_from_this(), token](std::exception_ptr e) {
          asio::post(self->strand_, [self, token, e] { self->on_handler_done(token, e); });
        }));
  }

  static asio::awaitable<void> run_handler(handler h, std::shared_ptr<job_context> ctx) { co_await h(*ctx); }

  // A job of a type this worker has no handler for (a mixed fleet, a rolling deploy): handed back
  // with no attempt counted, for a worker that has one. Dead-lettered only once no worker has
  // said it can run the type for unhandled_limit (or since the job was enqueued, if later), as
  // the maintenance loop last heard from the backend; until it has asked, the job goes back.
  void no_handler(std::string token, const job& j) {
    auto& type = unhandled_types_[j.type];
    auto now = clock::now();
    type.met = now;
    std::optional<std::chrono::milliseconds> waited;
    if (type.unrunnable) {
      auto none_for = *type.unrunnable;
      if (none_for != std::chrono::milliseconds::max())
        none_for += std::chrono::duration_cast<std::chrono::milliseconds>(now - type.asked);
      waited = none_for;
      if (j.enqueued_at_ms > 0) {
        auto age = std::chrono::milliseconds(detail::unix_ms() - j.enqueued_at_ms);
        waited = std::min(*waited, std::max(age, std::chrono::milliseconds(0)));
      }
    }
    if (waited && *waited >= opts_.unhandled_limit) {
      finish_now(std::move(token), j.id, finish_kind::fail, j.unique_id ? j.id : std::string(),
                 fmt::format("no handler for type {}: no worker has been able to run it for {} s", j.type,
                             std::chrono::duration_cast<std::chrono::seconds>(*waited).count()));
      return;
    }
    {
      std::lock_guard lock(counters_mutex_);
      ++counters_.unhandled;
      ++by_type_[j.type].unhandled;
    }
    if (!type.warned) {  // once per type and run: the jobs themselves are fine
      type.warned = true;
      jobrt::log(log_level::warn, log_fields{j.id, j.group, j.type, j.attempt, opts_.id}, source_,
                 "no handler for type {} here: its jobs go back for other workers", j.type);
    }
    finish_item item;
    item.token = std::move(token);
    item.kind = finish_kind::hand_back;
    item.delay = opts_.unhandled_delay;
    finisher_->add(std::move(item), {j.type, j.id});
  }

  asio::any_io_executor acquire_strand(const std::string& group) {
    auto& entry = strands_[group];
    if (entry.users++ == 0) entry.strand = detail::make_strand(ex_);
    return entry.strand;
  }

  void release_strand(const std::string& group) {
    if (group.empty()) return;
    auto it = strands_.find(group);
    if (it != strands_.end() && --it->second.users == 0) strands_.erase(it);  // dropped when idle
  }

  void on_handler_done(const std::string& token, std::exception_ptr e) {
    auto it = running_.find(token);
    if (it == running_.end()) return;
    auto r = it->second;
    r->deadline.cancel();
    {
      std::lock_guard lock(counters_mutex_);
      run_time_.observe(std::chrono::duration<double>(clock::now() - r->started).count());
    }
    switch (r->state) {
      // (running_ first: a freed slot may launch a waiting job, and launch inserts into it.)
      case job_state::lost:  // not ours any more: no ack
        running_.erase(it);
        free_slot(*r);
        release_strand(r->strand_group);
        drop_held();
        return;
      case job_state::stopping:
        if (e) {  // interrupted by stop: hand it back, no attempt counted
          running_.erase(it);
          free_slot(*r);
          release_strand(r->strand_group);
          hand_back(token);
          drop_held();
          return;
        }
        break;
      case job_state::running:
      case job_state::finishing: break;
    }
    r->state = job_state::finishing;
    finish_item item;
    item.token = token;
    item.unique_id = r->unique_id;
    if (r->cancel_asked) {  // however the handler ended: its job was cancelled while it ran
      item.kind = finish_kind::cancel;
    } else if (e ||
               r->timed_out) {  // past its deadline the attempt fails, even if the handler ignored the cancellation
      decide_failure(r->ctx->job(),
                     r->timed_out ? fmt::format("timed out after {} ms", r->ctx->job().timeout.count()) : what(e),
                     !r->timed_out && is_permanent(e), item);
    } else if (r->ctx->retry_after_) {
      item.kind = finish_kind::defer;
      item.delay = *r->ctx->retry_after_;
    } else if (r->ctx->result_ && r->ctx->job().keep.count() > 0) {
      item.result = std::move(*r->ctx->result_);  // (kept with the job's status: see finish.lua)
    }
    // A throttled group: a job that runs again waits at least as long; an ack or a fail carries
    // the throttle, and the burst, if any, ends here.
    if (auto pause = r->ctx->throttle_; pause.count() > 0) {
      if (item.kind == finish_kind::retry || item.kind == finish_kind::defer)
        item.delay = std::max(item.delay, pause);
      else if (item.kind == finish_kind::ack || item.kind == finish_kind::fail)
        item.throttle = pause;
    }
    // The rest of the burst: its followers came with the lease and run one after another, while
    // the lease has at least half its TTL left when the job ends (so that, renewed as usual, it
    // outlives the keep's trip and the follower's start).
    if (item.kind == finish_kind::ack && item.throttle.count() == 0 && !r->ahead.empty() && !stopping() &&
        !giving_back_.contains(token) && r->valid_until - clock::now() > opts_.lease_ttl / 2) {
      item.kind = finish_kind::keep;
      auto& next = r->ahead.front();
      item.id = next.malformed.empty() ? next.id : std::string();  // as the script reads a record
      // Pipelined, the follower starts now, in this job's slot, and the keep travels behind it
      // (the finisher keeps a token's items in order); the job counts as held until the keep
      // lands. Not under a lease that replays (a job of it has attempt > 1: a lease was lost or
      // the job failed before), for the rest of the lease: the keep not stored yet, a crash
      // would charge the follower's attempt to this job, which succeeded. So a crash with several
      // keeps unstored charges the first of those jobs once, and the replay that follows runs
      // the rest of the lease keep by keep: a job that keeps crashing its workers is charged
      // itself from then on, as under after_commit.
      if (opts_.follow == follow_policy::pipelined && !r->replayed) {
        running_.erase(it);
        // The keep first: a follower that fails at once (malformed, no handler) queues its end
        // under the same token, which must come after the keep, or it would end this job.
        finisher_->add(std::move(item), {r->ctx->job().type, r->ctx->job().id, true});
        launch(follower_of(token, *r), r->valid_until, r->replayed);
        free_slot(*r);
        release_strand(r->strand_group);  // after launch took it: the strand lives on
        return;
      }
      // Each starts when its predecessor's keep has landed: started sooner, it would run before
      // a predecessor that a crash or a lost lease runs again. The keep travels with every other
      // result in the next finish call, and the slot serves other work meanwhile: the follower
      // takes the next free one (see on_kept).
      free_slot(*r);
      finisher_->add(std::move(item), {r->ctx->job().type, r->ctx->job().id});
      return;
    }
    // After a burst, the group's next job (and its followers) in the finish's answer, only when
    // nothing else was ready at the last claim (the script also checks that nobody waits).
    if (item.kind == finish_kind::ack && item.throttle.count() == 0 && !opts_.rate_limit && !stopping() &&
        !r->strand_group.empty() && claimer_->drained()) {
      item.want_next = finish_item::next_policy::if_nobody_waits;
      // (as many as a claim's lease of the group brings: claim.lua's weight_of)
      item.ahead = std::min(r->ctx->job().group_weight * opts_.burst, std::size_t{1000}) - 1;
    }
    // The slot is free for a claim while the finish is on its way, unless the answer may bring
    // a job to run in it.
    if (item.want_next == finish_item::next_policy::no) free_slot(*r);
    finisher_->add(std::move(item), {r->ctx->job().type, r->ctx->job().id});
  }

  // A burst's next job: the first follower, under the same lease with the next fence, and the
  // rest behind it.
  static claimed_job follower_of(const std::string& token, running_job& r) {
    claimed_job next{token, r.ctx->fence() + 1, r.ctx->group(), std::move(r.ahead.front()), {}};
    next.ahead.assign(std::make_move_iterator(r.ahead.begin() + 1), std::make_move_iterator(r.ahead.end()));
    return next;
  }

  // A failed run: run again after a backoff while attempts are left; then the dead letters, or a
  // halted group. A grouped job under `skip`, and a permanent failure, go to the dead letters at
  // once (a permanent failure halts a `halt` group).
  void decide_failure(const job& j, std::string error, bool permanent, finish_item& item) {
    auto policy = j.group.empty() ? failure_policy::hold : j.on_failure.value_or(opts_.on_failure);
    item.error = std::move(error);
    if (permanent) {
      item.kind = policy == failure_policy::halt ? finish_kind::halt : finish_kind::fail;
    } else if (policy == failure_policy::skip) {
      item.kind = finish_kind::fail;
    } else if (j.attempt < j.max_attempts) {
      item.kind = finish_kind::retry;
      const backoff* b = j.retry_backoff ? &*j.retry_backoff : nullptr;
      if (!b) {
        auto per_type = backoffs_.find(j.type);
        b = per_type != backoffs_.end() ? &per_type->second : &opts_.retry_backoff;
      }
      item.delay = b->delay_after(j.attempt, std::uniform_real_distribution<double>(0.0, 1.0)(random_));
    } else {
      item.kind = policy == failure_policy::halt ? finish_kind::halt : finish_kind::fail;
    }
  }

  // --- finishing, batched: one backend call carries every result that came in meanwhile ---

  void finish_now(std::string token, std::string_view id, finish_kind kind, std::string unique_id, std::string error) {
    finish_item item;
    item.token = std::move(token);
    item.kind = kind == finish_kind::fail ? finish_kind::give_up : kind;  // it never ran: its group keeps its place
    item.unique_id = std::move(unique_id);
    item.error = std::move(error);
    finisher_->add(std::move(item), {"(not started)", std::string(id)});  // failed before its handler ran
  }

  void on_finished(const finish_item& item, const detail::finish_note& note, finish_result& result) {
    const std::string& type = note.type;
    if (item.kind == finish_kind::keep) {
      if (note.follower_running)
        on_kept_behind(item.token, type, result.lease_held);
      else
        on_kept(item.token, type, result.lease_held);
      return;
    }
    if (item.kind == finish_kind::release) {  // a give_back's
      giving_back_.erase(item.token);
      {
        std::lock_guard lock(counters_mutex_);
        ++(result.lease_held ? counters_.released : counters_.leases_lost);
      }
      drop_held();
      return;
    }
    const std::string& job_id = note.id;
    std::int64_t fence = 0;  // the run's (a burst's follower runs under its lease's token with a fence of its own)
    if (auto it = running_.find(item.token); it != running_.end()) {
      auto r = it->second;
      fence = r->ctx->fence();
      running_.erase(it);  // first: a freed slot may launch a waiting job, which inserts here
      free_slot(*r);
      release_strand(r->strand_group);
    }
    {
      std::lock_guard lock(counters_mutex_);
      auto& t = by_type_[type];
      if (!result.lease_held) {
        ++counters_.leases_lost;
      } else if (item.kind == finish_kind::ack) {
        ++counters_.completed;
        ++t.completed;
      } else if (item.kind == finish_kind::retry) {
        ++counters_.retried;
        ++t.retried;
      } else if (item.kind == finish_kind::defer) {
        ++counters_.deferred;
        ++t.deferred;
      } else if (item.kind == finish_kind::hand_back) {  // (counted when handed back)
      } else if (item.kind == finish_kind::cancel) {
        ++counters_.cancelled;
        ++t.cancelled;
      } else {
        ++counters_.failed;
        ++t.failed;
      }
    }
    log_fields fields{job_id, {}, type, 0, opts_.id};
    if (result.lease_held && item.kind == finish_kind::retry)
      jobrt::log(log_level::info, fields, source_, "job {} failed: {}; runs again in {} ms", job_id, item.error,
                 item.delay.count());
    else if (result.lease_held &&
             (item.kind == finish_kind::fail || item.kind == finish_kind::give_up || item.kind == finish_kind::halt))
      jobrt::log(log_level::warn, fields, source_, "job {} {}: {}", job_id,
                 item.kind == finish_kind::halt ? "halted its group" : "dead-lettered", item.error);
    if (!result.lease_held) lease_lost_log(item.token, job_id, fence);
    drop_held();
    if (!result.next) return;
    if (stopping()) {  // leased to us as we stop: hand it back (stop does), do not start it
      to_release_.push_back(result.next->token);
      return;
    }
    // The group's next job, with its followers: a burst that went on because nobody waited. It
    // takes the slot just freed, unless a job that waited for one took it first.
    start_or_wait(std::move(*result.next));
  }

  // Names the job and its run's fence (0: it did not run here), which may not be the token's.
  void lease_lost_log(const std::string& token, const std::string& id, std::int64_t fence) {
    if (fence > 0)
      jobrt::log(log_level::warn, source_, "lease {} was lost before job {} (fence {}) finished; not acked", token, id,
                 fence);
    else
      jobrt::log(log_level::warn, source_, "lease {} was lost before job {} finished; not acked", token, id);
  }

  // A keep landed: the job under `token` is done and its first follower starts under the same
  // lease, on its group's strand, with the next fence: in a free slot, or in the next one that
  // frees (before any claim). Stopping, the follower goes back instead; a lease found lost
  // leaves the burst to whoever gets it next.
  void on_kept(const std::string& token, const std::string& type, bool held) {
    auto it = running_.find(token);
    if (it == running_.end()) return;
    auto r = it->second;
    running_.erase(it);
    {
      std::lock_guard lock(counters_mutex_);
      if (held) {
        ++counters_.completed;
        ++by_type_[type].completed;
      } else {
        ++counters_.leases_lost;
      }
    }
    free_slot(*r);
    drop_held();
    if (!held) {
      lease_lost_log(token, r->ctx->job().id, r->ctx->fence());
    } else if (stopping()) {
      to_release_.push_back(token);
    } else if (giving_back_.contains(token)) {
      // Leased again under this token (see launch): the lease goes back, its release behind.
    } else if (r->valid_until <= clock::now()) {
      // No renewal's answer came for a whole TTL while the keep was on its way: the lease may be
      // gone by now, and the follower must not run beside whoever gets it next.
      give_back(token, "ran out while its keep was on its way");
    } else {
      start_or_wait(follower_of(token, *r), r->valid_until, r->replayed);
    }
    release_strand(r->strand_group);  // after launch took it (if it started): the strand lives on
  }

  // A pipelined keep landed (follow_policy::pipelined): its follower started when the job
  // ended, and runs or ran under the same token. A lease found lost cancels whatever still runs
  // under it; later results under it find it lost too.
  void on_kept_behind(const std::string& token, const std::string& type, bool held) {
    if (held) {
      std::lock_guard lock(counters_mutex_);
      ++counters_.completed;
      ++by_type_[type].completed;
    } else {
      jobrt::log(log_level::warn, source_, "lease {} was lost before a job under it was acked", token);
      lease_lost(token, "lost");  // counted there, or by the result of the job that ran under it
    }
    drop_held();
  }

  // A leased job starts in a free slot, or waits for the next one that frees: a follower whose
  // keep landed while other work had every slot, or a claimed job whose slot a follower took
  // while the claim was on its way. Stopping, one with no slot goes back instead.
  void start_or_wait(claimed_job c, std::optional<clock::time_point> valid_until = {}, bool replayed = false) {
    // Once stopping, nothing new starts: a claim that came back as the stop cut it short, a
    // follower whose keep landed during the grace.
    if (stopping()) {
      to_release_.push_back(std::move(c.token));
      return;
    }
    waiting_.push_back({std::move(c), valid_until.value_or(clock::now() + opts_.lease_ttl), replayed});
    start_waiting();
  }

  // Waiting jobs take the slots that free, in the order they came.
  void start_waiting() {
    while (!waiting_.empty() && busy_ < opts_.concurrency) {
      auto w = std::move(waiting_.front());
      waiting_.pop_front();
      // As a running job's, a lease no renewal reached for a whole TTL is given up: handed back.
      if (w.valid_until <= clock::now()) {
        give_back(std::move(w.job.token), "ran out while it waited for a slot");
      } else if (w.cancelled) {
        ++held_;  // until its finish lands (on_finished drops it)
        held_count_.store(held_, std::memory_order_relaxed);
        const auto& id = w.job.job.id;
        finish_now(std::move(w.job.token), id, finish_kind::cancel, detail::producer_id(w.job.job), {});
      } else {
        launch(std::move(w.job), w.valid_until, w.replayed);
      }
    }
  }

  // A leased job that has not started and whose lease's local end has passed is handed back
  // (finish_kind::release): when the backend still holds the lease (the renewals ran, their
  // answers were late) the job goes back to the head of the ready list with no attempt counted;
  // otherwise the call changes nothing and the reaper sends the job back, as for any lease that
  // ran out. Left to the reaper, it would count an attempt for a run that never happened: a job
  // with max_attempts 1 would be dead-lettered unrun. The watchdog renews the lease until the
  // call lands (a late call must not find it reaped). Counted as released, or as a lost lease.
  void give_back(std::string token, std::string_view why) {
    jobrt::log(log_level::warn, source_, "lease {} {}; handing its job back", token, why);
    hand_back(std::move(token));
  }

  // Stopping, a lease goes back with the others (release_all), unless results under its token
  // are still on their way (a pipelined burst's keeps): then behind them, in a finish call.
  void hand_back(std::string token) {
    if (stopping() && !finisher_->has(token)) {
      to_release_.push_back(std::move(token));
      return;
    }
    ++held_;  // until its finish lands (on_finished drops it)
    held_count_.store(held_, std::memory_order_relaxed);
    giving_back_.insert(token);
    finish_item item;
    item.token = std::move(token);
    item.kind = finish_kind::release;
    finisher_->add(std::move(item), {"(not started)", {}});
  }

  void free_slot(running_job& r) {
    if (!std::exchange(r.holds_slot, false)) return;
    free_slot();
  }
  void free_slot() {
    --busy_;
    claimer_->slot_freed();
    start_waiting();
  }

  void drop_held() {
    --held_;
    held_count_.store(held_, std::memory_order_relaxed);
    claimer_->slot_freed();
    idle_timer_.cancel();
  }

  // --- leases ---

  // The watchdog (worker/lease_keeper.hpp) renews every lease each period. What it asks and
  // tells the worker, on its strand; it calls these only while its loop runs, between start()
  // and the end of its stop(), which do_stop awaits with the impl held (as maintenance_hooks).
  detail::lease_keeper_hooks lease_keeper_hooks() {
    detail::lease_keeper_hooks h;
    h.tokens = [this] {
      std::vector<std::string> tokens;
      for (auto& [token, r] : running_)
        if (r->state != job_state::lost) tokens.push_back(token);  // finishing too: a finish may be retrying
      for (auto& w : waiting_) tokens.push_back(w.job.token);
      tokens.insert(tokens.end(), giving_back_.begin(), giving_back_.end());
      // A lease is ours until its last result lands: one whose job no longer runs here (a
      // follower that failed at launch, its predecessor's keep still on its way) is renewed too,
      // or a finish call that keeps failing would let the reaper charge a job that succeeded.
      // (Reserved first: the views in `listed` point into the strings of `tokens`.)
      auto finishing = finisher_->tokens();
      tokens.reserve(tokens.size() + finishing.size());
      std::unordered_set<std::string_view> listed(tokens.begin(), tokens.end());
      for (auto& token : finishing)
        if (listed.insert(token).second) tokens.push_back(std::move(token));
      return tokens;
    };
    h.answered = [this] {
      std::lock_guard lock(counters_mutex_);
      ++counters_.renewals;
    };
    h.held = [this](const std::string& token, clock::time_point valid_until) {
      if (auto it = running_.find(token); it != running_.end()) {
        it->second->valid_until = std::max(it->second->valid_until, valid_until);
        return;
      }
      // A job that waits for a slot (or no longer does: it started, or stop sent it back).
      auto w =
          std::find_if(waiting_.begin(), waiting_.end(), [&](const waiting_job& j) { return j.job.token == token; });
      if (w != waiting_.end()) w->valid_until = std::max(w->valid_until, valid_until);
    };
    h.lost = [this](const std::string& token) {
      if (running_.contains(token)) {
        lease_lost(token, "lost");
        return;
      }
      auto w =
          std::find_if(waiting_.begin(), waiting_.end(), [&](const waiting_job& j) { return j.job.token == token; });
      if (w == waiting_.end()) return;
      {
        std::lock_guard lock(counters_mutex_);
        ++counters_.leases_lost;
      }
      jobrt::log(log_level::warn, source_, "lease {} was lost; its job is left to whoever gets it next", w->job.token);
      waiting_.erase(w);
    };
    // The kept jobs that run here, or come next in a burst: a cancel of one (backend::cancel)
    // is found by asking after them at each renewal.
    h.kept_ids = [this] {
      std::vector<held_job> held;
      auto followers = [&](const std::string& token, const std::vector<job_record>& ahead) {
        for (auto& f : ahead)
          if (!f.id.empty() && detail::keep_in_body(f.body)) held.push_back({token, f.id});
      };
      for (auto& [token, r] : running_) {
        if (r->state == job_state::lost || r->state == job_state::stopping) continue;
        const auto& j = r->ctx->job();
        if (r->state == job_state::running && j.keep.count() > 0 && !r->cancel_asked) held.push_back({token, j.id});
        followers(token, r->ahead);  // (also while its job's keep is on its way: finishing)
      }
      for (auto& w : waiting_) {
        if (!w.cancelled && !w.job.job.id.empty() && detail::keep_in_body(w.job.job.body))
          held.push_back({w.job.token, w.job.job.id});
        followers(w.job.token, w.job.ahead);
      }
      return held;
    };
    h.cancelled = [this](const held_job& c) {
      // A follower not started yet stays in its group (where a claim drops it), and so do those
      // behind it: the burst ends before it.
      auto cut = [&](std::vector<job_record>& ahead) {
        ahead.erase(std::find_if(ahead.begin(), ahead.end(), [&](const job_record& j) { return j.id == c.id; }),
                    ahead.end());
      };
      for (auto& w : waiting_) {
        if (w.job.token != c.token) continue;
        cut(w.job.ahead);
        if (w.job.job.id == c.id) w.cancelled = true;  // (it ends, when its turn comes, without a run)
      }
      auto it = running_.find(c.token);
      if (it == running_.end()) return;
      auto r = it->second;
      if (r->state == job_state::finishing && !r->ahead.empty()) {
        // Its keep, on its way, hands the lease to the first follower, which then runs or
        // waits for a slot, where the next round finds it: only those behind it are cut.
        std::vector<job_record> rest(std::make_move_iterator(r->ahead.begin() + 1),
                                     std::make_move_iterator(r->ahead.end()));
        cut(rest);
        r->ahead.resize(1);
        std::move(rest.begin(), rest.end(), std::back_inserter(r->ahead));
        return;
      }
      cut(r->ahead);
      const auto& j = r->ctx->job();
      if (r->state != job_state::running || j.id != c.id || r->cancel_asked || j.keep.count() == 0) return;
      r->cancel_asked = true;
      jobrt::log(log_level::info, log_fields{j.id, j.group, j.type, j.attempt, opts_.id}, source_,
                 "job {} was cancelled; cancelling its handler", j.id);
      cancel_handler(r);
    };
    // A lease no renewal's answer has reached for a whole TTL is gone, or about to go.
    h.overdue = [this] {
      std::vector<std::string> expired;
      for (auto& [token, r] : running_)
        if (r->state == job_state::running && r->valid_until <= clock::now()) expired.push_back(token);
      for (auto& token : expired) lease_lost(token, "not renewed for a whole lease TTL");
    };
    return h;
  }

  // --- claims (worker/claimer.hpp) ---

  // What the claimer asks and tells the worker, on its strand. Its loop holds the impl from
  // start() until stop() has ended it.
  detail::claimer_hooks claimer_hooks() {
    detail::claimer_hooks h;
    h.free_slots = [this] { return opts_.concurrency > busy_ ? opts_.concurrency - busy_ : 0; };
    h.claimed = [this](claimed_job c) { start_or_wait(std::move(c)); };
    h.expired = [this](std::int64_t) { maintenance_->reap_now(); };
    h.claiming = [this](bool out) { claim_out_.store(out, std::memory_order_relaxed); };
    return h;
  }

  // --- maintenance: the reaper and the promoter (worker/maintenance.hpp) ---

  // What they tell the worker, on its strand. They call these only while their loops run,
  // between start() and the end of their stop(), which do_stop awaits with the impl held; until
  // do_stop the claimer's loop holds it: `this` outlives every call.
  detail::maintenance_hooks maintenance_hooks() {
    detail::maintenance_hooks h;
    h.recovered = [this](const reap_result& r) {
      std::lock_guard lock(counters_mutex_);
      counters_.recovered += static_cast<std::uint64_t>(r.leases);
      for (auto& type : r.recovered_types) ++by_type_[type].recovered;
    };
    h.promoted = [this](std::int64_t moved) {
      std::lock_guard lock(counters_mutex_);
      counters_.promoted += static_cast<std::uint64_t>(moved);
    };
    // The types met here without a handler (no_handler); those not met for ten minutes are
    // forgotten.
    h.unhandled_types = [this](clock::time_point now) {
      std::erase_if(unhandled_types_, [&](const auto& t) { return now - t.second.met > std::chrono::minutes(10); });
      std::vector<std::string> names;
      for (auto& [type, seen] : unhandled_types_) names.push_back(type);
      return names;
    };
    h.unrunnable = [this](const std::string& type, std::chrono::milliseconds none_for) {
      auto& seen = unhandled_types_[type];
      seen.unrunnable = none_for;
      seen.asked = clock::now();
    };
    h.report = [this] {
      worker_report r;
      r.id = opts_.id;
      r.host = this_host();
      r.pid = ::getpid();
      r.concurrency = static_cast<std::int64_t>(opts_.concurrency);
      r.started_ms = started_ms_;
      r.running = static_cast<std::int64_t>(running_.size());
      auto now = clock::now();
      auto now_ms = detail::unix_ms();
      for (auto& [token, job] : running_) {
        const auto& j = job->ctx->job();
        auto ran = std::chrono::duration_cast<std::chrono::milliseconds>(now - job->started).count();
        r.jobs.push_back({j.id, j.group, j.type, now_ms - ran});
      }
      std::sort(r.jobs.begin(), r.jobs.end(), [](const auto& a, const auto& b) { return a.since_ms < b.since_ms; });
      if (r.jobs.size() > max_reported_jobs) r.jobs.resize(max_reported_jobs);
      return r;
    };
    return h;
  }

  void lease_lost(const std::string& token, std::string_view why) {
    auto it = running_.find(token);
    if (it == running_.end() || it->second->state == job_state::finishing || it->second->state == job_state::lost)
      return;
    auto r = it->second;
    r->state = job_state::lost;
    {
      std::lock_guard lock(counters_mutex_);
      ++counters_.leases_lost;
    }
    const auto& j = r->ctx->job();
    jobrt::log(log_level::warn, log_fields{j.id, j.group, j.type, j.attempt, opts_.id}, source_,
               "lease of job {} {}; cancelling its handler", j.id, why);
    cancel_handler(r);
  }

  void cancel_handler(const std::shared_ptr<running_job>& r) {
    r->ctx->cancelled_ = true;
    // The signal is emitted where the handler runs: its operations' cancellation is not
    // thread-safe.
    asio::post(r->executor, [r] { r->signal.emit(asio::cancellation_type::terminal); });
  }

  // --- stopping ---

  asio::awaitable<void> do_stop(std::chrono::milliseconds grace) {
    if (stopping()) {  // another stop() is at work: a shorter grace cuts its wait short (a forced stop)
      grace_ = std::min(grace_, grace);  // (the handlers that ignore cancellation get this much, too)
      if (auto until = clock::now() + grace; until < grace_until_) {
        grace_until_ = until;
        idle_timer_.cancel();
      }
      while (state_ != worker_state::stopped) co_await stopped_timer_.async_wait(use_tuple);
      co_return;
    }
    state_ = worker_state::draining;
    for (auto& w : waiting_) to_release_.push_back(w.job.token);  // nothing would start them now
    waiting_.clear();
    claimer_->request_stop();
    grace_ = grace;
    grace_until_ = clock::now() + grace;
    co_await claimer_->stop();
    co_await wait_for_handlers();
    if (held_ > 0) {
      for (auto& [token, r] : running_) {
        if (r->state != job_state::running) continue;
        r->state = job_state::stopping;
        cancel_handler(r);
      }
      // Handlers that ignore cancellation get one more grace period (a forced stop cuts this
      // one short too); their leases expire after.
      grace_until_ = std::min(grace_until_, clock::now()) + std::max(grace_, std::chrono::milliseconds(1000));
      co_await wait_for_handlers();
    }
    co_await release_all();
    // The loops end, and stop() waits for them: none touches the backend after it returns.
    // Their calls are bounded, so this ends even when the backend is unreachable.
    state_ = worker_state::closing;
    lease_keeper_->request_stop();  // the watchdog
    maintenance_->request_stop();   // the reaper and the promoter
    finisher_->request_stop();      // the calls on their way
    co_await lease_keeper_->stop();
    co_await finisher_->stop();
    co_await maintenance_->stop();
    co_await release_all();  // a late finish may have leased us a burst's next job
    state_ = worker_state::stopped;
    stopped_timer_.cancel();
  }

  // Stop's grace: waits until no handler runs, or grace_until_ (which a second stop() may bring
  // forward). A lease that comes to be handed back meanwhile (a keep's follower, a burst's next
  // job) goes back at once: nothing renews it, and a grace longer than the TTL would let the
  // reaper count an attempt for a job never run.
  asio::awaitable<void> wait_for_handlers() {
    while (held_ > 0 && clock::now() < grace_until_) {
      if (!to_release_.empty()) {
        co_await release_all();
        continue;  // handlers may have ended during the call: look again before waiting
      }
      co_await wait_on(idle_timer_, grace_until_);
    }
  }

  // Hands back what was leased and not started. Tokens may arrive while a release is in flight
  // (a burst's lease from an earlier finish): they go back in the next round.
  asio::awaitable<void> release_all() {
    while (!to_release_.empty()) {
      auto tokens = std::exchange(to_release_, {});
      try {
        co_await bounded(strand_, backend_.release(opts_.queue, opts_.id, tokens), opts_.lease_ttl,
                         "handing back jobs");
        std::lock_guard lock(counters_mutex_);
        counters_.released += tokens.size();
      } catch (const std::exception& e) {
        jobrt::log(log_level::error, source_, "handing back {} jobs failed: {}; their leases expire", tokens.size(),
                   e.what());
      }
    }
  }

  struct group_strand {
    asio::any_io_executor strand;
    std::size_t users = 0;
  };

  asio::any_io_executor ex_;
  asio::any_io_executor strand_;
  backend& backend_;
  worker_options opts_;
  std::string source_;  // how its log lines name it
  std::unordered_map<std::string, handler> handlers_;
  std::unordered_map<std::string, backoff> backoffs_;  // by job type
  // Job types met here without a handler: what the backend last said of them (no_handler).
  struct unhandled_type {
    std::optional<std::chrono::milliseconds> unrunnable;  // backend::unrunnable_for, when asked
    clock::time_point asked{};
    clock::time_point met{};
    bool warned = false;
  };
  std::unordered_map<std::string, unhandled_type> unhandled_types_;
  clock::time_point grace_until_{};                                        // the end of stop's grace under way
  std::chrono::milliseconds grace_{0};                                     // the shortest grace a stop() asked for
  std::minstd_rand random_{std::random_device{}()};                        // backoff jitter
  std::unordered_map<std::string, std::shared_ptr<running_job>> running_;  // by token
  std::int64_t started_ms_ = 0;                                            // when start() ran, in ms since the epoch
  std::unordered_map<std::string, group_strand> strands_;
  // Leased jobs that wait for a slot (see start_or_wait); their leases are renewed with the
  // running jobs'.
  struct waiting_job {
    claimed_job job;
    clock::time_point valid_until;
    bool replayed = false;   // (running_job::replayed)
    bool cancelled = false;  // its job (a kept one) was cancelled: it ends so instead of starting
  };
  std::deque<waiting_job> waiting_;
  std::unordered_set<std::string> giving_back_;  // tokens of give_back calls on their way
  std::vector<std::string> to_release_;
  asio::steady_timer idle_timer_;  // stop waits here for handlers to finish
  // The reaper (with what it asks about job types) and the promoter: they run from start() to
  // stop() on this strand; what they learn comes back through maintenance_hooks().
  std::shared_ptr<detail::maintenance> maintenance_;
  // The watchdog: renews the leases from start() to stop() on this strand; which leases, and what
  // becomes of one found lost or renewed, go through lease_keeper_hooks().
  std::shared_ptr<detail::lease_keeper> lease_keeper_;
  // The claims for free slots, from start() to stop() on this strand: claimer_hooks().
  std::shared_ptr<detail::claimer> claimer_;
  // The results, sent in batches from start() to stop() on this strand; their answers come back
  // to on_finished.
  std::shared_ptr<detail::finisher> finisher_;
  asio::steady_timer stopped_timer_;  // never expires: later stop() calls wait on it
  std::size_t held_ = 0;              // jobs started (or handed back) whose finish has not landed
  std::size_t busy_ = 0;              // slots taken (see running_job::holds_slot)
  std::atomic<std::size_t> held_count_{0};
  std::atomic<bool> claim_out_{false};                      // a claim is on its way (waiting_for_work)
  std::atomic<worker_state> state_{worker_state::created};  // changed on the strand; state() reads it anywhere
  mutable std::mutex counters_mutex_;
  worker_counters counters_;
  std::map<std::string, type_counters> by_type_;
  histogram run_time_, pickup_;

 public:
  worker_metrics metrics() const {
    worker_metrics m;
    std::lock_guard lock(counters_mutex_);
    m.totals = counters_;
    m.by_type = by_type_;
    m.run_seconds = run_time_;
    m.pickup_seconds = pickup_;
    m.in_flight = held_count_.load(std::memory_order_relaxed);
    return m;
  }
};

worker::worker(asio::any_io_executor ex, backend& b, worker_options opts)
    : impl_(std::make_shared<impl>(std::move(ex), b, std::move(opts))) {}

worker::~worker() = default;

void worker::add_handler(std::string type, handler h) {
  impl_->add_handler(std::move(type), std::move(h), std::nullopt);
}
void worker::add_handler(std::string type, handler h, backoff b) {
  impl_->add_handler(std::move(type), std::move(h), b);
}
void worker::start() { impl_->start(); }
asio::awaitable<void> worker::stop(std::chrono::milliseconds grace) { return impl::stop(impl_, grace); }
const worker_options& worker::options() const noexcept { return impl_->options(); }
worker_counters worker::counters() const { return impl_->counters(); }
std::size_t worker::in_flight() const { return impl_->in_flight(); }
worker_state worker::state() const noexcept { return impl_->state(); }
bool worker::waiting_for_work() const noexcept { return impl_->waiting_for_work(); }
worker_metrics worker::metrics() const { return impl_->metrics(); }

}  // namespace jobrt
