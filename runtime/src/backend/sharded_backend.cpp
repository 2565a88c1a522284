// A queue as S queues of another backend; see sharded_backend.hpp.
#include <jobrt/sharded_backend.hpp>

#include "backend/job_codec.hpp"
#include "backend/views.hpp"
#include "clock.hpp"
#include "reason.hpp"
#include "strand.hpp"

#include <jobrt/error.hpp>
#include <jobrt/log.hpp>

#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>

#include <algorithm>
#include <charconv>
#include <deque>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <unordered_set>

namespace jobrt {

namespace asio = boost::asio;
using asio::awaitable;
using clock = std::chrono::steady_clock;

// --- the backend's defaults: no shards ---

namespace {
[[noreturn]] void no_shards(const char* what) {
  throw std::logic_error(fmt::format("this backend keeps no sharded queues ({})", what));
}
}  // namespace

awaitable<std::size_t> backend::shard_count(std::string) { co_return 1; }
awaitable<queue_counts> backend::counters(std::string queue) { co_return co_await counts(std::move(queue)); }
awaitable<std::vector<enqueue_result>> backend::enqueue_parts(std::string queue, std::vector<encoded_job> jobs,
                                                              std::size_t) {
  co_return co_await enqueue(std::move(queue), std::move(jobs));
}
awaitable<std::size_t> backend::stored_shards(std::string, std::size_t) { no_shards("stored_shards"); }
awaitable<void> backend::mark_shards(std::string, std::vector<std::size_t>) { no_shards("mark_shards"); }
awaitable<std::vector<finish_result>> backend::finish_part(std::string queue, std::string worker,
                                                           std::vector<finish_item> items,
                                                           std::chrono::milliseconds lease_ttl,
                                                           std::vector<std::string>&) {
  co_return co_await finish(std::move(queue), std::move(worker), std::move(items), lease_ttl);
}
void backend::finish_answered(const std::string&, const std::string&, std::vector<std::string>) {}
awaitable<shard_enqueued> backend::enqueue_in_shard(std::string queue, std::size_t shard,
                                                    std::vector<encoded_job> jobs) {
  shard_enqueued out;
  out.results = co_await enqueue(sharded_backend::shard_queue(queue, shard), std::move(jobs));
  co_return out;
}
awaitable<std::optional<std::size_t>> backend::take_shard_mark(std::string, std::string, std::chrono::milliseconds) {
  no_shards("take_shard_mark");
}
awaitable<bool> backend::has_ready(std::string) { no_shards("has_ready"); }
awaitable<void> backend::note_leases(std::string, std::vector<std::pair<std::string, std::int64_t>>) {
  no_shards("note_leases");
}
awaitable<std::optional<std::vector<std::string>>> backend::take_reap_turn(std::string, std::string,
                                                                           std::chrono::milliseconds, std::int64_t) {
  no_shards("take_reap_turn");
}

// --- per queue ---

struct sharded_backend::queue_state {
  std::size_t shards = 1;
  std::vector<std::string> names;  // each shard's queue (with one shard, the queue itself)
  std::size_t next_spread = 0;     // the shard of the next ungrouped job without an id
  std::deque<std::size_t> full;    // shards whose last claim here got all it asked for, in turn
  std::vector<bool> in_full;
  std::size_t next_reap = 0;  // the shard the reaper's walk looks at next
  // Until when this process noted that it holds leases in each shard (ms since the epoch).
  std::vector<std::int64_t> noted_until;
  std::vector<bool> reap_again;  // shards whose last reap here did not finish (a batch full, a failure)
  // Promotion: per shard, its delayed version when it was last promoted, and when its next
  // entry is due then (time_point::max(): none; min(): not known, promote it).
  std::vector<std::uint64_t> promoted_version;
  std::vector<clock::time_point> next_due;
  std::size_t next_sweep = 0;  // the shard every promote looks at besides (a missed wake-up)
};

namespace {

std::size_t start_offset() {
  std::random_device random;
  return random();
}

// "<k>/<token>" -> k and the token; a token without one stays whole, in shard 0 (where it is
// not held: it answers as a lost lease).
std::pair<std::size_t, std::string> split_token(const std::string& token, std::size_t shards) {
  auto slash = token.find('/');
  std::size_t k = 0;
  if (slash == std::string::npos) return {0, token};
  auto [end, ec] = std::from_chars(token.data(), token.data() + slash, k);
  if (ec != std::errc{} || end != token.data() + slash || k >= shards) return {0, token};
  return {k, token.substr(slash + 1)};
}

// The shards that may hold job `id`: an id the queue gave is m * S + k, from shard k; a
// producer's id may be in any shard (its group's, or its own when ungrouped), in several even.
std::vector<std::size_t> every_shard(std::size_t shards) {
  std::vector<std::size_t> all(shards);
  std::iota(all.begin(), all.end(), std::size_t{0});
  return all;
}

std::vector<std::size_t> shards_of_id(const std::string& id, std::size_t shards) {
  if (detail::assigned_id(id) && id.size() < 19) return std::vector<std::size_t>(1, std::stoull(id) % shards);
  return every_shard(shards);
}

// Items split by shard, each remembering its place in the call.
template <class T>
struct per_shard {
  std::vector<std::vector<T>> items;
  std::vector<std::vector<std::size_t>> places;
  explicit per_shard(std::size_t shards) : items(shards), places(shards) {}
  void add(std::size_t k, T item, std::size_t place) {
    items[k].push_back(std::move(item));
    places[k].push_back(place);
  }
  // The shards with items.
  std::vector<std::size_t> used() const {
    std::vector<std::size_t> out;
    for (std::size_t k = 0; k < places.size(); ++k)
      if (!places[k].empty()) out.push_back(k);
    return out;
  }
};

// Each of `ids` under every shard that may hold it.
per_shard<std::string> ids_by_shard(const std::vector<std::string>& ids, std::size_t shards) {
  per_shard<std::string> out(shards);
  for (std::size_t i = 0; i < ids.size(); ++i)
    for (auto k : shards_of_id(ids[i], shards)) out.add(k, ids[i], i);
  return out;
}

void prefix_token(std::string& token, std::size_t k) { token = fmt::format("{}/{}", k, token); }

// What at_once's calls gave, in the order of its shards: a failure, or else a result.
template <class T>
struct outcomes : detail::all_outcomes<T> {
  // The first failure, thrown (after all have ended: the others' results are in).
  void rethrow() const {
    for (const auto& e : this->errors)
      if (e) std::rethrow_exception(e);
  }
  // Which call failed first (its place in the shards given), if one did.
  std::optional<std::size_t> first_failed() const {
    for (std::size_t u = 0; u < this->errors.size(); ++u)
      if (this->errors[u]) return u;
    return std::nullopt;
  }
  // The first failure thrown with its words after `before` (what went through all the same) and
  // ": ": a system_error keeps its code, another exception is thrown as it was.
  void rethrow(const std::string& before) const {
    auto u = first_failed();
    if (!u) return;
    try {
      std::rethrow_exception(this->errors[*u]);
    } catch (const boost::system::system_error& failure) {
      auto why = detail::reason_of(failure);
      throw boost::system::system_error(failure.code(), why.empty() ? before : before + ": " + why);
    }
  }
};

// Runs `call(k)` for each of `shards` at once and waits for all: on a cluster they go to several
// nodes together, on one server down one connection in one write. (One shard: called here.)
template <class T, class Call>
awaitable<outcomes<T>> at_once(std::vector<std::size_t> shards, Call call) {
  outcomes<T> out;
  if (shards.size() == 1) {
    try {
      out.results.push_back(co_await call(shards[0]));
      out.errors.emplace_back();
    } catch (...) {
      out.errors.push_back(std::current_exception());
      out.results.emplace_back();
    }
    co_return out;
  }
  auto ex = co_await asio::this_coro::executor;
  auto all = co_await detail::all_at_once<T>(ex, shards.size(), [&](std::size_t i) { return call(shards[i]); });
  out.errors = std::move(all.errors);
  out.results = std::move(all.results);
  co_return out;
}

}  // namespace

namespace {
std::string holder_name() {
  std::random_device random;
  return fmt::format("{:08x}{:08x}", random(), random());
}
}  // namespace

sharded_backend::sharded_backend(backend& inner, std::size_t shards, when_unknown unknown)
    : inner_(inner), shards_(shards), unknown_(unknown), holder_(holder_name()) {}

sharded_backend::sharded_backend(std::shared_ptr<backend> inner, std::size_t shards, when_unknown unknown)
    : owned_(std::move(inner)), inner_(*owned_), shards_(shards), unknown_(unknown), holder_(holder_name()) {}

std::string sharded_backend::shard_queue(std::string_view queue, std::size_t k) {
  return fmt::format("{}#{}", queue, k);
}

std::size_t sharded_backend::shard_of(std::string_view key, std::size_t shards) noexcept {
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a, 64 bits: the same in every process and build
  for (char c : key) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return shards <= 1 ? 0 : static_cast<std::size_t>(h % shards);
}

awaitable<std::shared_ptr<sharded_backend::queue_state>> sharded_backend::state_of(const std::string& queue) {
  {
    std::lock_guard lock(mutex_);
    if (auto found = queues_.find(queue); found != queues_.end()) co_return found->second;
  }
  // (A process given none stores one: a producer given S later is refused, where it would
  // otherwise fill shards this process never looks at.)
  std::size_t wanted = unknown_ == when_unknown::look ? 0 : std::max<std::size_t>(shards_, 1);
  auto stored = co_await inner_.stored_shards(queue, wanted);
  if (shards_ != 0 && stored != shards_)
    throw boost::system::system_error(
        errc::shards_mismatch,
        fmt::format("queue '{}' has {} shards; this process was given {} (--shards, or `shards` in its config)", queue,
                    stored, shards_));
  auto q = std::make_shared<queue_state>();
  q->shards = std::max<std::size_t>(stored, 1);
  if (q->shards == 1) {
    q->names.push_back(queue);
  } else {
    for (std::size_t k = 0; k < q->shards; ++k) q->names.push_back(shard_queue(queue, k));
  }
  q->in_full.assign(q->shards, false);
  q->noted_until.assign(q->shards, 0);
  q->reap_again.assign(q->shards, false);
  // Processes start their walks at different shards, so that together they cover them sooner.
  q->next_spread = start_offset() % q->shards;
  q->next_reap = start_offset() % q->shards;
  q->next_sweep = start_offset() % q->shards;
  q->promoted_version.assign(q->shards, 0);
  q->next_due.assign(q->shards, clock::time_point::min());
  // A queue with no count stored yet, only looked at (a dashboard started before the queue's
  // first producer): not kept, so that a later call follows the count its producers store.
  if (stored == 0) co_return q;
  std::lock_guard lock(mutex_);
  co_return queues_.try_emplace(queue, std::move(q)).first->second;
}

awaitable<std::size_t> sharded_backend::shards_of(std::string queue) { co_return (co_await state_of(queue))->shards; }

// A mark that fails, or is cut short by the caller's cancellation, is not the caller's failure
// (what it marks for is stored): the reaper's walk over the shards finds that work instead.
awaitable<void> sharded_backend::mark(const std::string& queue, std::vector<std::size_t> shards) {
  if (shards.empty()) co_return;
  if ((co_await asio::this_coro::cancellation_state).cancelled() != asio::cancellation_type::none) co_return;
  auto count = shards.size();
  try {
    co_await inner_.mark_shards(queue, std::move(shards));
  } catch (const std::exception& e) {
    auto* failure = dynamic_cast<const boost::system::system_error*>(&e);
    if (!failure || failure->code() != asio::error::operation_aborted)
      jobrt::log(log_level::warn, "shards", "marking {} shards of queue '{}' failed: {}", count, queue, e.what());
  }
}

awaitable<void> sharded_backend::mark(const std::string& queue, std::size_t k) {
  std::vector<std::size_t> one(1, k);
  co_await mark(queue, std::move(one));
}

// Leases taken or renewed in these shards last `ttl` from now: noted for the reaper (see
// reap), each until a third of a TTL past that, so that the noting goes with the watchdog's
// renewals (every third of a TTL) and claims in between note nothing. A failed note is not the
// caller's failure: the reaper's walk over the shards finds those leases too, later.
awaitable<void> sharded_backend::note(const std::string& queue, queue_state& q, const std::vector<std::size_t>& shards,
                                      std::chrono::milliseconds ttl) {
  auto now = detail::unix_ms();
  auto at = now + ttl.count() + ttl.count() / 3;
  std::vector<std::pair<std::string, std::int64_t>> until;
  std::vector<std::size_t> noting;
  {
    std::lock_guard lock(mutex_);
    for (auto k : shards) {
      if (q.noted_until[k] >= now + ttl.count()) continue;
      until.emplace_back(fmt::format("{}|{}", k, holder_), at);
      noting.push_back(k);
    }
  }
  if (until.empty()) co_return;
  if ((co_await asio::this_coro::cancellation_state).cancelled() != asio::cancellation_type::none) co_return;
  try {
    co_await inner_.note_leases(queue, std::move(until));
    std::lock_guard lock(mutex_);
    for (auto k : noting) q.noted_until[k] = std::max(q.noted_until[k], at);
  } catch (const std::exception& e) {
    auto* failure = dynamic_cast<const boost::system::system_error*>(&e);
    if (!failure || failure->code() != asio::error::operation_aborted)
      jobrt::log(log_level::warn, "shards", "noting the leases of queue '{}' failed: {}", queue, e.what());
  }
}

// --- jobs ---

namespace {
// Jobs in one enqueue call to a shard at most, when the caller gives no limit (enqueue_parts):
// a shard's part of a batch bigger than that goes in calls of this size, one after the other (in
// order, so a group's jobs keep theirs). As a producer's default batch, for the same reason: each
// script stays short.
constexpr std::size_t max_enqueue_call = 500;

// Stores shard k's part in calls of at most per_call jobs; `marked` only when every call marked
// the shard.
awaitable<shard_enqueued> enqueue_part(backend& inner, std::string queue, std::size_t k, std::vector<encoded_job> jobs,
                                       std::size_t per_call) {
  if (jobs.size() <= per_call) co_return co_await inner.enqueue_in_shard(std::move(queue), k, std::move(jobs));
  shard_enqueued all;
  all.marked = true;
  for (std::size_t first = 0; first < jobs.size(); first += per_call) {
    auto from = jobs.begin() + static_cast<std::ptrdiff_t>(first);
    auto to = jobs.begin() + static_cast<std::ptrdiff_t>(std::min(jobs.size(), first + per_call));
    std::vector<encoded_job> part(std::make_move_iterator(from), std::make_move_iterator(to));
    auto stored = co_await inner.enqueue_in_shard(queue, k, std::move(part));
    all.marked = all.marked && stored.marked;
    all.results.insert(all.results.end(), std::make_move_iterator(stored.results.begin()),
                       std::make_move_iterator(stored.results.end()));
  }
  co_return all;
}
}  // namespace

awaitable<std::size_t> sharded_backend::shard_count(std::string queue) { co_return (co_await state_of(queue))->shards; }

awaitable<std::vector<enqueue_result>> sharded_backend::enqueue(std::string queue, std::vector<encoded_job> jobs) {
  co_return co_await enqueue_parts(std::move(queue), std::move(jobs), max_enqueue_call);
}

awaitable<std::vector<enqueue_result>> sharded_backend::enqueue_parts(std::string queue, std::vector<encoded_job> jobs,
                                                                      std::size_t per_call) {
  per_call = std::max<std::size_t>(per_call, 1);
  auto q = co_await state_of(queue);
  if (q->shards == 1) co_return co_await inner_.enqueue(q->names[0], std::move(jobs));
  // The whole batch is checked before any shard stores a part (as one script checks it).
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (auto problem = detail::id_refusal(jobs[i].id); !problem.empty())
      throw boost::system::system_error(errc::bad_job_id, problem);
    if (auto problem = detail::body_refusal(jobs[i].body); !problem.empty())
      throw boost::system::system_error(errc::bad_max_attempts, problem);
    if (auto problem = detail::due_refusal(jobs[i], i); !problem.empty())
      throw boost::system::system_error(errc::bad_due, problem);
  }
  co_await check_group_sizes(*q, jobs);
  per_shard<encoded_job> split(q->shards);
  auto now_ms = detail::unix_ms();
  std::vector<bool> due_now(q->shards, false), due_later(q->shards, false);
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    auto& j = jobs[i];
    std::size_t k;
    if (!j.group.empty()) {
      k = shard_of(j.group, q->shards);
    } else if (!j.id.empty()) {
      k = shard_of(j.id, q->shards);
    } else {
      std::lock_guard lock(mutex_);
      k = q->next_spread++ % q->shards;
    }
    // (A time already past, or about to be by the server's clock, is due now.)
    bool later = j.delay_ms > 0 || j.run_at_ms > now_ms + 1000;
    (later ? due_later : due_now)[k] = true;
    split.add(k, std::move(j), i);
  }
  // The shards' parts all at once: a failure leaves the other shards' jobs stored (a producer's
  // retry of the batch finds those with ids it gave as duplicates). Then one mark for the shards
  // given a job due now, where their calls did not mark them (a failed part may have stored some).
  auto used = split.used();
  auto stored = co_await at_once<shard_enqueued>(
      used, [&](std::size_t k) { return enqueue_part(inner_, queue, k, std::move(split.items[k]), per_call); });
  std::vector<std::size_t> marking;
  for (std::size_t u = 0; u < used.size(); ++u)
    if (due_now[used[u]] && (stored.errors[u] || !stored.results[u].marked)) marking.push_back(used[u]);
  co_await mark(queue, std::move(marking));
  {
    std::lock_guard lock(mutex_);
    for (std::size_t k = 0; k < q->shards; ++k)
      if (due_later[k]) q->next_due[k] = clock::time_point::min();  // this process's promoter looks there next
  }
  stored.rethrow();
  std::vector<enqueue_result> out(jobs.size());
  for (std::size_t u = 0; u < used.size(); ++u)
    for (std::size_t i = 0; i < stored.results[u].results.size(); ++i)
      out[split.places[used[u]][i]] = std::move(stored.results[u].results[i]);
  co_return out;
}

// A batch with max group sizes (encoded_job::max_group_size) over several shards: the limited
// groups' sizes are read first, and a job over its limit refuses the batch before any shard
// stores a part. Each part's script checks again and decides: a producer that filled a group in
// between makes that part fail alone, as any failed part does. A job with an id is not counted
// here (it may be a duplicate, which does not count): the script counts it.
awaitable<void> sharded_backend::check_group_sizes(const queue_state& q, const std::vector<encoded_job>& jobs) {
  if (jobs.size() < 2) co_return;                           // (one shard's part: its script alone decides)
  std::unordered_map<std::string_view, std::int64_t> held;  // limited group -> its size, then counted on
  for (const auto& j : jobs)
    if (!j.group.empty() && j.max_group_size > 0) held.try_emplace(j.group, 0);
  if (held.empty()) co_return;
  std::vector<std::string_view> groups;
  for (auto& [g, n] : held) groups.push_back(g);
  std::vector<std::size_t> all(groups.size());
  std::iota(all.begin(), all.end(), std::size_t{0});
  auto sizes = co_await at_once<std::int64_t>(std::move(all), [&](std::size_t i) {
    return inner_.group_size(q.names[shard_of(groups[i], q.shards)], std::string(groups[i]));
  });
  sizes.rethrow();
  for (std::size_t i = 0; i < groups.size(); ++i) held[groups[i]] = sizes.results[i];
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const auto& j = jobs[i];
    auto it = held.find(j.group);
    if (j.group.empty() || !j.id.empty() || it == held.end()) continue;
    ++it->second;
    if (j.max_group_size > 0 && it->second > j.max_group_size)
      throw boost::system::system_error(
          errc::group_full, detail::group_full_message(j.group, it->second, j.max_group_size, i, jobs.size()));
  }
}

awaitable<std::vector<claimed_job>> sharded_backend::claim_in(const std::string& queue, queue_state& q, std::size_t k,
                                                              const claim_options& opts) {
  auto jobs = co_await inner_.claim(q.names[k], opts);
  for (auto& j : jobs) prefix_token(j.token, k);
  if (!jobs.empty()) {
    std::vector<std::size_t> at(1, k);
    co_await note(queue, q, at, opts.lease_ttl);
  }
  bool full = opts.max > 0 && jobs.size() >= std::min(opts.max, max_claim);
  {
    std::lock_guard lock(mutex_);
    if (full && !q.in_full[k]) q.full.push_back(k);
    if (full) q.in_full[k] = true;
    if (!full && q.in_full[k]) {
      q.in_full[k] = false;
      q.full.erase(std::find(q.full.begin(), q.full.end(), k));
    }
  }
  // More may be ready there: the next idle worker anywhere looks too.
  if (full) co_await mark(queue, k);
  co_return jobs;
}

// Claims in the shards known here to have work, then in marked ones, until it has what it asked
// for or no mark is left.
awaitable<std::vector<claimed_job>> sharded_backend::claim_more(const std::string& queue, queue_state& q,
                                                                const claim_options& opts, std::vector<claimed_job> got,
                                                                bool known_first) {
  auto want = std::min(opts.max, max_claim);
  std::vector<std::size_t> known;
  if (known_first) {
    std::lock_guard lock(mutex_);
    known.assign(q.full.begin(), q.full.end());
  }
  auto add = [&](std::vector<claimed_job> jobs) {
    got.insert(got.end(), std::make_move_iterator(jobs.begin()), std::make_move_iterator(jobs.end()));
  };
  // Jobs leased are the caller's whatever comes after: a failure (or the caller's stop) in a
  // later shard returns them rather than leaving them leased to nobody.
  std::exception_ptr failure;
  try {
    for (auto k : known) {
      if (got.size() >= want) break;
      auto rest = opts;
      rest.max = want - got.size();
      add(co_await claim_in(queue, q, k, rest));
    }
    while (got.size() < want) {
      auto k = co_await inner_.take_shard_mark(queue, opts.worker, std::chrono::milliseconds(0));
      if (!k) break;
      if (*k >= q.shards) continue;  // (not one of ours: a mark written by hand)
      auto rest = opts;
      rest.max = want - got.size();
      add(co_await claim_in(queue, q, *k, rest));
    }
  } catch (...) {
    failure = std::current_exception();
  }
  if (failure && got.empty()) std::rethrow_exception(failure);
  co_return got;
}

// A queue's rate limit counts every start in one key (a zset), which no script of a shard may reach on a
// Redis Cluster (another slot).
void sharded_backend::refuse_queue_rate(const std::string& queue, const queue_state& q, const claim_options& opts) {
  if (opts.rate)
    throw std::invalid_argument(
        fmt::format("queue {} has {} shards: a queue-wide rate limit (worker rate_limit) needs a queue of one shard",
                    queue, q.shards));
}

awaitable<std::vector<claimed_job>> sharded_backend::claim(std::string queue, claim_options opts) {
  auto q = co_await state_of(queue);
  if (q->shards == 1) co_return co_await inner_.claim(q->names[0], std::move(opts));
  refuse_queue_rate(queue, *q, opts);
  if (opts.max == 0) co_return std::vector<claimed_job>{};
  std::vector<claimed_job> none;
  co_return co_await claim_more(queue, *q, opts, std::move(none), true);
}

awaitable<std::vector<claimed_job>> sharded_backend::claim_wait(std::string queue, claim_options opts,
                                                                std::chrono::milliseconds wait) {
  auto q = co_await state_of(queue);
  if (q->shards == 1) co_return co_await inner_.claim_wait(q->names[0], std::move(opts), wait);
  refuse_queue_rate(queue, *q, opts);
  if (opts.max == 0) co_return std::vector<claimed_job>{};
  auto deadline = clock::now() + wait;
  for (;;) {
    auto state = co_await asio::this_coro::cancellation_state;
    if (state.cancelled() != asio::cancellation_type::none)
      throw boost::system::system_error(asio::error::operation_aborted, "claim_wait");
    // First the shards whose last claim here was full, in turn (no mark to wait for).
    std::optional<std::size_t> next;
    {
      std::lock_guard lock(mutex_);
      if (!q->full.empty()) {
        next = q->full.front();
        q->full.pop_front();
        q->full.push_back(*next);
      }
    }
    if (next) {
      auto jobs = co_await claim_in(queue, *q, *next, opts);
      if (!jobs.empty()) co_return jobs;
      continue;
    }
    // Then a mark, waited for (BZPOPMIN returns at once while there is one).
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    if (left.count() <= 0) co_return std::vector<claimed_job>{};
    auto k = co_await inner_.take_shard_mark(queue, opts.worker, left);
    if (!k) co_return std::vector<claimed_job>{};
    if (*k >= q->shards) continue;  // (not one of ours: a mark written by hand)
    auto cs = co_await asio::this_coro::cancellation_state;
    if (cs.cancelled() != asio::cancellation_type::none) {
      co_await asio::this_coro::reset_cancellation_state();  // (or the mark would be cut short too)
      co_await mark(queue, *k);                              // for another worker
      throw boost::system::system_error(asio::error::operation_aborted, "claim_wait");
    }
    std::vector<claimed_job> jobs;
    std::exception_ptr failure;
    try {
      jobs = co_await claim_in(queue, *q, *k, opts);
    } catch (...) {
      failure = std::current_exception();
    }
    if (failure) {  // the shard's work is still there: its mark goes back, for whoever comes next
      co_await mark(queue, *k);
      std::rethrow_exception(failure);
    }
    if (jobs.empty()) continue;
    co_return jobs;
  }
}

awaitable<std::vector<finish_result>> sharded_backend::finish(std::string queue, std::string worker,
                                                              std::vector<finish_item> items,
                                                              std::chrono::milliseconds lease_ttl) {
  auto q = co_await state_of(queue);
  if (q->shards == 1) co_return co_await inner_.finish(q->names[0], std::move(worker), std::move(items), lease_ttl);
  per_shard<finish_item> split(q->shards);
  for (std::size_t i = 0; i < items.size(); ++i) {
    auto at = split_token(items[i].token, q->shards);
    items[i].token = std::move(at.second);
    split.add(at.first, std::move(items[i]), i);
  }
  // Each shard's results, and whether a lane went back to its ready list.
  struct shard_finished {
    std::vector<finish_result> results;
    bool ready = false;
    std::vector<std::string> calls;  // (finish_part's: answered once every shard's call got through)
  };
  auto used = split.used();
  auto done = co_await at_once<shard_finished>(used, [&](std::size_t k) -> awaitable<shard_finished> {
    // Whether a lane may go back to ready: a grouped job's lane (a token is '<fence>|<lane>',
    // 'g:<group>' for a group's) unless its next job came back with the answer or its handler
    // throttled the group, an ungrouped job's for a release or a retry.
    std::vector<bool> may_ready;
    bool handed_back = false;
    for (const auto& item : split.items[k]) {
      // (a group's lane, 'g:', or a job of a group that runs several at once, 'c:', whose end may
      // put the group's lane back)
      auto lane = item.token.find('|') + 1;
      bool grouped = item.token.compare(lane, 2, "g:") == 0 || item.token.compare(lane, 2, "c:") == 0;
      bool again = item.kind == finish_kind::retry || item.kind == finish_kind::defer ||
                   item.kind == finish_kind::hand_back;  // (after a delay: the promoter marks it)
      bool now = item.kind == finish_kind::release || (again && item.delay.count() <= 0);
      bool ends = item.kind == finish_kind::ack || item.kind == finish_kind::keep || item.kind == finish_kind::fail ||
                  item.kind == finish_kind::give_up || item.kind == finish_kind::cancel;
      bool throttled = item.throttle.count() > 0;  // its group's lane waits in delayed: the promoter marks it
      may_ready.push_back(now || (grouped && ends && !throttled));
      handed_back = handed_back || item.kind == finish_kind::hand_back;
    }
    // A job this process cannot run came from that shard: it leaves the shard to the others' marks
    // rather than claiming there first again, and taking that job back before they can.
    if (handed_back) {
      std::lock_guard lock(mutex_);
      if (q->in_full[k]) {
        q->in_full[k] = false;
        q->full.erase(std::find(q->full.begin(), q->full.end(), k));
      }
    }
    shard_finished out;
    out.results = co_await inner_.finish_part(q->names[k], worker, std::move(split.items[k]), lease_ttl, out.calls);
    for (std::size_t i = 0; i < out.results.size(); ++i) {
      if (out.results[i].next) prefix_token(out.results[i].next->token, k);
      out.ready = out.ready || (may_ready[i] && out.results[i].lease_held && !out.results[i].next);
    }
    co_return out;
  });
  std::vector<finish_result> out(items.size());
  std::vector<std::size_t> marking, leased;  // (a burst's next lease, noted for the reaper as a claim's)
  for (std::size_t u = 0; u < used.size(); ++u) {
    if (done.results[u].ready) marking.push_back(used[u]);
    for (std::size_t i = 0; i < done.results[u].results.size(); ++i) {
      auto& r = done.results[u].results[i];
      if (r.next && (leased.empty() || leased.back() != used[u])) leased.push_back(used[u]);
      out[split.places[used[u]][i]] = std::move(r);
    }
  }
  co_await mark(queue, std::move(marking));
  co_await note(queue, *q, leased, lease_ttl);
  done.rethrow();
  // Every shard's call got through: their records may go (a resend of this batch after a
  // failure in one shard finds the others' records, and gets their first answers again).
  for (std::size_t u = 0; u < used.size(); ++u)
    inner_.finish_answered(q->names[used[u]], worker, std::move(done.results[u].calls));
  co_return out;
}

awaitable<std::vector<bool>> sharded_backend::extend(std::string queue, std::string worker,
                                                     std::vector<std::string> tokens,
                                                     std::chrono::milliseconds lease_ttl) {
  auto q = co_await state_of(queue);
  if (q->shards == 1) co_return co_await inner_.extend(q->names[0], std::move(worker), std::move(tokens), lease_ttl);
  // A heartbeat without tokens goes nowhere: it is for lanes a blocking claim took and no
  // claim leased yet, and a sharded queue's claims never block in a shard.
  per_shard<std::string> split(q->shards);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    auto at = split_token(tokens[i], q->shards);
    split.add(at.first, std::move(at.second), i);
  }
  std::vector<bool> out(tokens.size(), false);
  auto holding = split.used();
  co_await note(queue, *q, holding, lease_ttl);
  auto held = co_await at_once<std::vector<bool>>(
      holding, [&](std::size_t k) { return inner_.extend(q->names[k], worker, std::move(split.items[k]), lease_ttl); });
  held.rethrow();
  for (std::size_t u = 0; u < holding.size(); ++u)
    for (std::size_t i = 0; i < held.results[u].size(); ++i) out[split.places[holding[u]][i]] = held.results[u][i];
  co_return out;
}

awaitable<void> sharded_backend::advertise(std::string queue, std::vector<std::string> types,
                                           std::chrono::milliseconds ttl) {
  co_await state_of(queue);
  co_await inner_.advertise(std::move(queue), std::move(types), ttl);  // (the queue's own: one record)
}

awaitable<std::chrono::milliseconds> sharded_backend::unrunnable_for(std::string queue, std::string type) {
  co_await state_of(queue);
  co_return co_await inner_.unrunnable_for(std::move(queue), std::move(type));
}

awaitable<std::int64_t> sharded_backend::expire_own(std::string queue, std::string worker) {
  auto q = co_await state_of(queue);
  std::int64_t expired = 0;
  for (const auto& name : q->names) expired += co_await inner_.expire_own(name, worker);
  co_return expired;
}

awaitable<void> sharded_backend::release(std::string queue, std::string worker, std::vector<std::string> tokens) {
  auto q = co_await state_of(queue);
  if (q->shards == 1) co_return co_await inner_.release(q->names[0], std::move(worker), std::move(tokens));
  per_shard<std::string> split(q->shards);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    auto at = split_token(tokens[i], q->shards);
    split.add(at.first, std::move(at.second), i);
  }
  for (std::size_t k = 0; k < q->shards; ++k) {
    if (split.items[k].empty()) continue;
    co_await inner_.release(q->names[k], worker, std::move(split.items[k]));
    co_await mark(queue, k);
  }
}

awaitable<reap_result> sharded_backend::reap(std::string queue, reap_options opts) {
  auto q = co_await state_of(queue);
  if (q->shards == 1) co_return co_await inner_.reap(q->names[0], opts);
  reap_result sum;
  // The shards to reap: all of them, or for a worker's reaper, while its process has the turn,
  // those where a lease may have run out (its holder noted leases there, and stopped renewing
  // the note), and one more in turn: the walk that applies the dead letters' limits, and looks
  // at that shard's ready list (a mark lost with a worker that took it and crashed). The others
  // only ask whose turn it is. So the reaping of an idle queue costs a few calls a period, not
  // one per shard, and a crashed worker's leases come back within a TTL, a third and a period.
  // Asked to drop the kept jobs' entries that ran out (once a minute), every shard.
  std::vector<bool> reaping(q->shards, opts.turn.count() == 0 || opts.drop_kept);
  std::size_t walk;
  {
    std::lock_guard lock(mutex_);
    walk = q->next_reap++ % q->shards;
  }
  reaping[walk] = true;
  if (opts.turn.count() > 0) {
    auto due = co_await inner_.take_reap_turn(queue, holder_, opts.turn, detail::unix_ms());
    if (!due) co_return sum;
    {
      std::lock_guard lock(mutex_);
      for (std::size_t k = 0; k < q->shards; ++k)
        if (q->reap_again[k]) {
          q->reap_again[k] = false;
          reaping[k] = true;
        }
    }
    for (const auto& member : *due) {
      std::size_t k = 0;
      auto read = std::from_chars(member.data(), member.data() + member.size(), k);  // ('<k>|<holder>')
      if (read.ec == std::errc{} && read.ptr != member.data() && k < q->shards) reaping[k] = true;
    }
  }
  // The dead letters' count limit is the queue's: each shard keeps its part.
  if (opts.dead_max_count > 0) opts.dead_max_count = (opts.dead_max_count + q->shards - 1) / q->shards;
  std::vector<std::size_t> which;
  for (std::size_t k = 0; k < q->shards; ++k)
    if (reaping[k]) which.push_back(k);
  auto reaped = co_await at_once<reap_result>(which, [&](std::size_t k) { return inner_.reap(q->names[k], opts); });
  auto& errors = reaped.errors;
  auto& results = reaped.results;
  std::exception_ptr failure;
  std::vector<std::size_t> marking;
  for (std::size_t i = 0; i < which.size(); ++i) {
    auto k = which[i];
    auto& r = results[i];
    // Not done there (its note is gone): the next turn of this process reaps it again.
    auto batch = static_cast<std::int64_t>(opts.max);
    if (errors[i] || r.leases >= batch || r.workers >= batch || r.dead_removed >= batch) {
      std::lock_guard lock(mutex_);
      q->reap_again[k] = true;
    }
    if (errors[i]) {
      if (!failure) failure = errors[i];
      continue;
    }
    bool ready = r.leases > 0 || r.lanes > 0;
    if (!ready && k == walk) {
      try {  // (a failure here still marks what the others put back, below)
        ready = co_await inner_.has_ready(q->names[k]);
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
    }
    if (ready) marking.push_back(k);
    sum.leases += r.leases;
    sum.workers += r.workers;
    sum.lanes += r.lanes;
    sum.dead_removed += r.dead_removed;
    sum.recovered_types.insert(sum.recovered_types.end(), std::make_move_iterator(r.recovered_types.begin()),
                               std::make_move_iterator(r.recovered_types.end()));
  }
  co_await mark(queue, std::move(marking));
  if (failure) std::rethrow_exception(failure);  // (the shards reaped are marked)
  co_return sum;
}

awaitable<queue_counts> sharded_backend::counts(std::string queue) {
  co_return co_await summed(std::move(queue), false);
}

awaitable<queue_counts> sharded_backend::counters(std::string queue) {
  co_return co_await summed(std::move(queue), true);
}

// The shards' counts (or counters alone), asked at once and summed; the next job to start is
// the earliest enqueued of the shards' next ones.
awaitable<queue_counts> sharded_backend::summed(std::string queue, bool counters_only) {
  auto q = co_await state_of(queue);
  auto ask = [&](std::size_t k) { return counters_only ? inner_.counters(q->names[k]) : inner_.counts(q->names[k]); };
  if (q->shards == 1) co_return co_await ask(0);
  std::vector<std::size_t> all(q->shards);
  for (std::size_t k = 0; k < q->shards; ++k) all[k] = k;
  auto each = co_await at_once<queue_counts>(all, ask);
  each.rethrow();
  queue_counts sum;
  for (const auto& c : each.results) {
    sum.ready_lanes += c.ready_lanes;
    sum.running += c.running;
    sum.delayed += c.delayed;
    sum.paused += c.paused;
    sum.groups += c.groups;
    sum.dead += c.dead;
    sum.enqueued += c.enqueued;
    sum.started += c.started;
    sum.completed += c.completed;
    sum.failed += c.failed;
    sum.retried += c.retried;
    sum.deferred += c.deferred;
    sum.unhandled += c.unhandled;
    sum.halted += c.halted;
    sum.recovered += c.recovered;
    if (c.next_enqueued_ms != 0 && (sum.next_enqueued_ms == 0 || c.next_enqueued_ms < sum.next_enqueued_ms))
      sum.next_enqueued_ms = c.next_enqueued_ms;
  }
  co_return sum;
}

// --- delayed jobs ---

awaitable<promote_result> sharded_backend::promote(std::string queue, std::size_t max) {
  auto q = co_await state_of(queue);
  if (q->shards == 1) co_return co_await inner_.promote(q->names[0], max);
  // The shards with an entry due, one whose wake-up came (its version moved), one whose next
  // due time is not known here, and one more in turn (a wake-up missed).
  promote_result sum;
  auto now = clock::now();
  std::size_t sweep;
  {
    std::lock_guard lock(mutex_);
    sweep = q->next_sweep++ % q->shards;
  }
  for (std::size_t k = 0; k < q->shards; ++k) {
    auto version = inner_.delayed_version(q->names[k]);
    bool due;
    {
      std::lock_guard lock(mutex_);
      due = k == sweep || q->next_due[k] <= now || version != q->promoted_version[k];
    }
    if (!due) continue;
    auto r = co_await inner_.promote(q->names[k], max);
    if (r.moved > 0) co_await mark(queue, k);
    {
      std::lock_guard lock(mutex_);
      q->promoted_version[k] = version;
      q->next_due[k] = r.next_due ? clock::now() + *r.next_due : clock::time_point::max();
      if (r.moved >= static_cast<std::int64_t>(max)) q->next_due[k] = clock::time_point::min();  // more are due
    }
    sum.moved += r.moved;
  }
  std::lock_guard lock(mutex_);
  auto first = *std::min_element(q->next_due.begin(), q->next_due.end());
  auto now_then = clock::now();
  if (first <= now_then)  // (more due now: time_point::min() marks a shard that moved `max`)
    sum.next_due = std::chrono::milliseconds(0);
  else if (first != clock::time_point::max())
    sum.next_due = std::chrono::duration_cast<std::chrono::milliseconds>(first - now_then);
  co_return sum;
}

namespace {

// What wait_delayed and wait_ended share: waits until the sum over the shards `names` of
// version(name) is not `seen`, or `timeout` has passed. Each version only grows: while their sum
// is `seen`, each is what it was then. (Read once: a wake-up between the sum and a shard's wait
// makes that wait return at once.)
template <class Version, class Wait>
awaitable<void> wait_versions(const std::vector<std::string>& names, std::uint64_t seen,
                              std::chrono::milliseconds timeout, Version version, Wait wait, const char* what) {
  if (names.size() == 1) {
    if (version(names[0]) != seen) co_return;
    co_await wait(names[0], seen, timeout);
    co_return;
  }
  std::vector<std::uint64_t> versions;
  std::uint64_t sum = 0;
  for (const auto& name : names) sum += versions.emplace_back(version(name));
  if (sum != seen) co_return;
  // On a strand, as at_once: a wait that ends at once (its version moved) must not end, on
  // another thread, while the ranged group still launches the others.
  auto strand = asio::make_strand(co_await asio::this_coro::executor);
  auto group = [&]() -> awaitable<void> {
    using wait_op = decltype(asio::co_spawn(strand, wait(std::string(), std::uint64_t{0}, timeout), asio::deferred));
    std::vector<wait_op> waits;
    waits.reserve(names.size());
    for (std::size_t k = 0; k < names.size(); ++k)
      waits.push_back(asio::co_spawn(strand, wait(names[k], versions[k], timeout), asio::deferred));
    co_await asio::experimental::make_parallel_group(std::move(waits))
        .async_wait(asio::experimental::wait_for_one(), asio::use_awaitable);
  };
  co_await detail::run_on(strand, group());
  auto cs = co_await asio::this_coro::cancellation_state;
  if (cs.cancelled() != asio::cancellation_type::none)
    throw boost::system::system_error(asio::error::operation_aborted, what);
}

}  // namespace

// The sum of a version over the shards of `queue`; 0 while the queue is not known here (promote
// or a wait reads its state first, and the versions then).
template <class Version>
std::uint64_t sharded_backend::summed_version(const std::string& queue, Version version) {
  std::shared_ptr<queue_state> q;
  {
    std::lock_guard lock(mutex_);
    if (auto found = queues_.find(queue); found != queues_.end()) q = found->second;
  }
  if (!q) return 0;
  std::uint64_t sum = 0;
  for (const auto& name : q->names) sum += version(name);
  return sum;
}

std::uint64_t sharded_backend::delayed_version(const std::string& queue) {
  return summed_version(queue, [this](const std::string& name) { return inner_.delayed_version(name); });
}

awaitable<void> sharded_backend::wait_delayed(std::string queue, std::uint64_t seen,
                                              std::chrono::milliseconds timeout) {
  auto q = co_await state_of(queue);
  // (delayed_version, called before promote knew the queue, said 0 without asking the inner
  // backend: its versions are read here, which on Redis subscribes to the wake-ups.)
  co_await wait_versions(
      q->names, seen, timeout, [this](const std::string& name) { return inner_.delayed_version(name); },
      [this](std::string name, std::uint64_t v, std::chrono::milliseconds t) {
        return inner_.wait_delayed(std::move(name), v, t);
      },
      "wait_delayed");
}

std::uint64_t sharded_backend::ended_version(const std::string& queue) {
  return summed_version(queue, [this](const std::string& name) { return inner_.ended_version(name); });
}

awaitable<std::optional<kept_job>> sharded_backend::wait_ended(std::string queue, std::string id, std::uint64_t seen,
                                                               std::chrono::milliseconds timeout) {
  auto q = co_await state_of(queue);
  if (q->shards == 1) {
    // (The inner version is read first, as wait_versions does: ended_version, called before
    // the queue was known here, said 0 without asking the inner backend, which on Redis
    // subscribes then. A version moved since `seen` returns at once, with any news in it.)
    inner_.ended_version(q->names[0]);
    co_return co_await inner_.wait_ended(q->names[0], std::move(id), seen, timeout);
  }
  // (Over several shards each waits for news of this job, or a wake-up that may hide some, in
  // its shard. News of the job comes from its own shard only: the caller gets it, as from one
  // shard, and need not look the job up.)
  std::optional<kept_job> told;  // (the shards' waits resume on wait_versions' strand, one at a time)
  co_await wait_versions(
      q->names, seen, timeout, [this](const std::string& name) { return inner_.ended_version(name); },
      [this, &id, &told](std::string name, std::uint64_t v, std::chrono::milliseconds t) -> awaitable<void> {
        auto news = co_await inner_.wait_ended(std::move(name), id, v, t);
        if (news) told = std::move(news);
      },
      "wait_ended");
  co_return told;
}

// --- dead letters ---
//
// A dead letter's key is its shard's (the job's id, unique in the queue unless a producer gave
// one id to jobs of different groups): calls about keys ask every shard, each once per call.

awaitable<std::vector<dead_letter>> sharded_backend::dead_letters(std::string queue, std::size_t offset,
                                                                  std::size_t limit) {
  auto q = co_await state_of(queue);
  if (q->shards == 1) co_return co_await inner_.dead_letters(q->names[0], offset, limit);
  // The shards' lists merged oldest first (of one time, the lower shard first), each read in
  // pages of at most `step` as the merge reaches its end: offset + limit letters in all, in
  // bounded calls, not offset + limit from every shard.
  constexpr std::size_t max_step = 500;
  const auto step = std::clamp<std::size_t>(offset + limit, 1, max_step);
  std::vector<std::deque<dead_letter>> read(q->shards);
  std::vector<std::size_t> next(q->shards, step);  // where each shard's next page starts
  std::vector<bool> ended(q->shards);
  auto first = co_await at_once<std::vector<dead_letter>>(
      every_shard(q->shards), [&](std::size_t k) { return inner_.dead_letters(q->names[k], 0, step); });
  first.rethrow();
  for (std::size_t k = 0; k < q->shards; ++k) {
    ended[k] = first.results[k].empty();
    read[k].assign(std::make_move_iterator(first.results[k].begin()), std::make_move_iterator(first.results[k].end()));
  }
  std::vector<dead_letter> out;
  for (std::size_t taken = 0; out.size() < limit; ++taken) {
    std::optional<std::size_t> oldest;
    for (std::size_t k = 0; k < q->shards; ++k) {
      while (read[k].empty() && !ended[k]) {  // (a page may come short: letters purged meanwhile)
        auto more = co_await inner_.dead_letters(q->names[k], next[k], step);
        next[k] += step;
        ended[k] = more.empty();
        read[k].assign(std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
      }
      if (!read[k].empty() && (!oldest || read[k].front().at_ms < read[*oldest].front().at_ms)) oldest = k;
    }
    if (!oldest) break;
    if (taken >= offset) out.push_back(std::move(read[*oldest].front()));
    read[*oldest].pop_front();
  }
  co_return out;
}

awaitable<std::optional<dead_letter>> sharded_backend::dead_letter_of(std::string queue, std::string id) {
  auto q = co_await state_of(queue);
  for (const auto& name : q->names)
    if (auto d = co_await inner_.dead_letter_of(name, id)) co_return d;
  co_return std::nullopt;
}

awaitable<std::vector<std::string>> sharded_backend::requeue(std::string queue, std::vector<std::string> ids,
                                                             bool at_head) {
  auto q = co_await state_of(queue);
  if (q->shards == 1) co_return co_await inner_.requeue(q->names[0], std::move(ids), at_head);
  // Each key asked of every shard that may hold it, all shards at once (a producer's id may be
  // dead in several, in groups of different shards: each goes back). The shards that requeued
  // are marked before a failure of another is thrown.
  auto asked = ids_by_shard(ids, q->shards);
  auto used = asked.used();
  auto done = co_await at_once<std::vector<std::string>>(
      used, [&](std::size_t k) { return inner_.requeue(q->names[k], asked.items[k], at_head); });
  std::vector<std::size_t> moved;
  std::unordered_set<std::string> requeued;
  for (std::size_t u = 0; u < used.size(); ++u) {
    if (done.errors[u] || done.results[u].empty()) continue;
    moved.push_back(used[u]);
    requeued.insert(done.results[u].begin(), done.results[u].end());
  }
  co_await mark(queue, std::move(moved));
  if (auto u = done.first_failed(); u && !requeued.empty())
    done.rethrow(fmt::format("requeue in queue '{}': {} of the {} ids went back, then shard {} failed", queue,
                             requeued.size(), ids.size(), used[*u]));
  done.rethrow();
  std::erase_if(ids, [&](const std::string& id) { return requeued.erase(id) == 0; });  // in the order given, once
  co_return ids;
}

awaitable<std::int64_t> sharded_backend::purge(std::string queue, std::vector<std::string> ids) {
  auto q = co_await state_of(queue);
  if (q->shards == 1) co_return co_await inner_.purge(q->names[0], std::move(ids));
  // (As requeue: each key asked of every shard that may hold it, all shards at once.)
  auto asked = ids_by_shard(ids, q->shards);
  auto used = asked.used();
  auto purged =
      co_await at_once<std::int64_t>(used, [&](std::size_t k) { return inner_.purge(q->names[k], asked.items[k]); });
  auto removed = std::accumulate(purged.results.begin(), purged.results.end(), std::int64_t{0});
  if (auto u = purged.first_failed(); u && removed > 0)
    purged.rethrow(fmt::format("purge in queue '{}': shard {} failed after the others removed {} dead letters", queue,
                               used[*u], removed));
  purged.rethrow();
  co_return removed;
}

// --- groups ---

awaitable<bool> sharded_backend::pause(std::string queue, std::string group) {
  auto q = co_await state_of(queue);
  co_return co_await inner_.pause(q->names[shard_of(group, q->shards)], std::move(group));
}

awaitable<bool> sharded_backend::resume(std::string queue, std::string group, resume_mode mode) {
  auto q = co_await state_of(queue);
  auto k = shard_of(group, q->shards);
  bool resumed = co_await inner_.resume(q->names[k], std::move(group), mode);
  if (resumed && q->shards > 1) co_await mark(queue, k);
  co_return resumed;
}

awaitable<std::vector<paused_group>> sharded_backend::paused_groups(std::string queue) {
  auto q = co_await state_of(queue);
  std::vector<paused_group> all;
  for (const auto& name : q->names) {
    auto some = co_await inner_.paused_groups(name);
    all.insert(all.end(), std::make_move_iterator(some.begin()), std::make_move_iterator(some.end()));
  }
  co_return all;
}

awaitable<std::int64_t> sharded_backend::purge_queue(std::string queue) {
  auto q = co_await state_of(queue);
  std::int64_t removed = 0;
  if (q->shards > 1)
    for (const auto& name : q->names) removed += co_await inner_.purge_queue(name);
  removed += co_await inner_.purge_queue(queue);  // (its own keys: the stored count, the marks, the types)
  std::lock_guard lock(mutex_);
  queues_.erase(queue);
  co_return removed;
}

awaitable<std::int64_t> sharded_backend::group_size(std::string queue, std::string group) {
  auto q = co_await state_of(queue);
  co_return co_await inner_.group_size(q->names[shard_of(group, q->shards)], std::move(group));
}

awaitable<check_report> sharded_backend::check(std::string queue, bool repair) {
  auto q = co_await state_of(queue);
  if (q->shards == 1) co_return co_await inner_.check(q->names[0], repair);
  check_report sum;
  for (std::size_t k = 0; k < q->shards; ++k) {
    auto r = co_await inner_.check(q->names[k], repair);
    sum.groups += r.groups;
    sum.jobs += r.jobs;
    if (r.oldest_enqueued_ms != 0 && (sum.oldest_enqueued_ms == 0 || r.oldest_enqueued_ms < sum.oldest_enqueued_ms))
      sum.oldest_enqueued_ms = r.oldest_enqueued_ms;
    sum.stuck_groups += r.stuck_groups;
    sum.repaired += r.repaired;
    for (auto& p : r.problems) sum.problems.push_back(fmt::format("shard {}: {}", k, p));
    sum.calls += r.calls;
    // Repaired lanes, or work that waits unmarked: an idle worker is to look there.
    if (!repair) continue;
    bool ready = r.repaired > 0;
    if (!ready) ready = co_await inner_.has_ready(q->names[k]);  // (g++ 12: no co_await inside ||)
    if (ready) co_await mark(queue, k);
  }
  co_return sum;
}

// --- the operators' views: workers and history are the queue's own (its first shard's keys
// when it has one), groups and dead letters are listed a shard after another ---

awaitable<void> sharded_backend::report_worker(std::string queue, worker_report report, std::chrono::milliseconds ttl) {
  co_await inner_.report_worker(std::move(queue), std::move(report), ttl);
}

awaitable<page<worker_report>> sharded_backend::workers(std::string queue, std::string cursor, std::size_t limit) {
  co_return co_await inner_.workers(std::move(queue), std::move(cursor), limit);
}

awaitable<bool> sharded_backend::claim_history(std::string queue) {
  co_return co_await inner_.claim_history(std::move(queue));
}

awaitable<bool> sharded_backend::record_history(std::string queue, queue_counts counts) {
  co_return co_await inner_.record_history(std::move(queue), counts);
}

awaitable<std::vector<history_point>> sharded_backend::history(std::string queue, std::chrono::minutes span) {
  co_return co_await inner_.history(std::move(queue), span);
}

namespace {

// A listing's cursor over shards: '<shard>/<the shard's cursor>'.
std::pair<std::size_t, std::string> split_cursor(const std::string& cursor, std::size_t shards) {
  if (cursor.empty()) return {0, ""};
  auto slash = cursor.find('/');
  std::size_t k = 0;
  auto [end, ec] = std::from_chars(cursor.data(), cursor.data() + (slash == std::string::npos ? 0 : slash), k);
  if (slash == std::string::npos || ec != std::errc() || end != cursor.data() + slash || k >= shards)
    throw std::invalid_argument("cursor '" + cursor + "' is not one that a listing of this queue gave");
  return {k, cursor.substr(slash + 1)};
}

// Lists the shards one after another from the cursor's, until `limit` items came or every shard
// has been asked once in this call.
template <class T, class List>
awaitable<page<T>> over_shards(std::size_t shards, const std::string& cursor, std::size_t limit, List list) {
  auto [k, inner] = split_cursor(cursor, shards);
  page<T> out;
  for (; k < shards; ++k, inner.clear()) {
    auto some = co_await list(k, inner, limit - out.items.size());
    out.items.insert(out.items.end(), std::make_move_iterator(some.items.begin()),
                     std::make_move_iterator(some.items.end()));
    if (!some.cursor.empty()) {
      out.cursor = fmt::format("{}/{}", k, some.cursor);
      co_return out;
    }
    if (out.items.size() >= limit && k + 1 < shards) {
      out.cursor = fmt::format("{}/", k + 1);
      co_return out;
    }
  }
  co_return out;
}

}  // namespace

awaitable<page<std::string>> sharded_backend::groups(std::string queue, std::string prefix, std::string cursor,
                                                     std::size_t limit) {
  auto q = co_await state_of(queue);
  if (q->shards == 1) co_return co_await inner_.groups(q->names[0], std::move(prefix), std::move(cursor), limit);
  co_return co_await over_shards<std::string>(q->shards, cursor, limit,
                                              [&](std::size_t k, std::string at, std::size_t n) {
                                                return inner_.groups(q->names[k], prefix, std::move(at), n);
                                              });
}

awaitable<group_status> sharded_backend::group_of(std::string queue, std::string group) {
  auto q = co_await state_of(queue);
  co_return co_await inner_.group_of(q->names[shard_of(group, q->shards)], std::move(group));
}

awaitable<std::optional<kept_job>> sharded_backend::kept_job_of(std::string queue, std::string id) {
  auto q = co_await state_of(queue);
  if (q->shards == 1) co_return co_await inner_.kept_job_of(q->names[0], std::move(id));
  auto found = co_await at_once<std::optional<kept_job>>(
      shards_of_id(id, q->shards), [&](std::size_t k) { return inner_.kept_job_of(q->names[k], id); });
  // (A shard that found it answers, whatever another one met; without one, a failure says more
  // than "not found".)
  for (auto& k : found.results)
    if (k) co_return std::move(k);
  found.rethrow();
  co_return std::nullopt;
}

awaitable<cancel_outcome> sharded_backend::cancel(std::string queue, std::string id) {
  auto q = co_await state_of(queue);
  auto found = co_await at_once<cancel_outcome>(shards_of_id(id, q->shards),
                                                [&](std::size_t k) { return inner_.cancel(q->names[k], id); });
  // (A producer's id may be in several shards, in groups of different shards: the first of
  // cancelled, already cancelled, done says what happened, among the shards that answered. A
  // failure is thrown unless a job was cancelled: a shard that did not answer may hold one that
  // runs on.)
  auto out = cancel_outcome::not_found;
  for (std::size_t i = 0; i < found.results.size(); ++i)
    if (!found.errors[i] && found.results[i] < out) out = found.results[i];
  if (out != cancel_outcome::cancelled) found.rethrow();
  co_return out;
}

awaitable<std::vector<bool>> sharded_backend::cancelled(std::string queue, std::vector<held_job> jobs) {
  auto q = co_await state_of(queue);
  // Each job asked of the shard its lease is in (a producer's id may name jobs in several
  // shards); one given without a lease, of the shard its id names when the queue gave it, else
  // of every shard.
  std::vector<std::vector<std::size_t>> asked(q->shards);  // shard -> indices into jobs
  std::vector<held_job> inner(jobs.size());
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    auto [k, token] = split_token(jobs[i].token, q->shards);
    if (jobs[i].token.find('/') != std::string::npos) {
      asked[k].push_back(i);
    } else {
      for (auto s : shards_of_id(jobs[i].id, q->shards)) asked[s].push_back(i);
    }
    inner[i].token = std::move(token);  // (no braced list in a coroutine: GCC 12)
    inner[i].id = jobs[i].id;
  }
  std::vector<std::size_t> used;
  for (std::size_t k = 0; k < asked.size(); ++k)
    if (!asked[k].empty()) used.push_back(k);
  auto found = co_await at_once<std::vector<bool>>(used, [&](std::size_t k) {
    std::vector<held_job> part;
    for (auto i : asked[k]) part.push_back(inner[i]);
    return inner_.cancelled(q->names[k], std::move(part));
  });
  found.rethrow();
  std::vector<bool> out(jobs.size());
  for (std::size_t u = 0; u < used.size(); ++u) {
    const auto& indices = asked[used[u]];
    const auto& said = found.results[u];
    for (std::size_t j = 0; j < indices.size() && j < said.size(); ++j)
      if (said[j]) out[indices[j]] = true;
  }
  co_return out;
}

// find_dead over several shards: their lists merged newest first. The cursor holds each shard's
// place: 'm', then for each shard 'x' (listed to its end) or '<length>.<its own cursor>' ("" to
// start).
namespace {

std::vector<std::optional<std::string>> parse_merged_cursor(const std::string& cursor, std::size_t shards) {
  std::vector<std::optional<std::string>> at(shards, std::string());
  if (cursor.empty()) return at;
  auto bad = [&] {
    return std::invalid_argument("cursor '" + cursor + "' is not one that a listing of this queue gave");
  };
  if (!cursor.starts_with('m')) throw bad();
  std::size_t pos = 1;
  for (std::size_t k = 0; k < shards; ++k) {
    if (pos < cursor.size() && cursor[pos] == 'x') {
      at[k].reset();
      ++pos;
      continue;
    }
    std::size_t length = 0;
    auto [end, ec] = std::from_chars(cursor.data() + pos, cursor.data() + cursor.size(), length);
    pos = static_cast<std::size_t>(end - cursor.data());
    if (ec != std::errc() || pos >= cursor.size() || cursor[pos] != '.' || length > cursor.size() - pos - 1)
      throw bad();
    at[k] = cursor.substr(pos + 1, length);
    pos += 1 + length;
  }
  if (pos != cursor.size()) throw bad();
  return at;
}

std::string merged_cursor(const std::vector<std::optional<std::string>>& at) {
  std::string out = "m";
  for (const auto& c : at) out += c ? fmt::format("{}.{}", c->size(), *c) : std::string("x");
  return out;
}

}  // namespace

awaitable<page<dead_letter>> sharded_backend::find_dead(std::string queue, dead_filter filter, std::string cursor,
                                                        std::size_t limit) {
  auto q = co_await state_of(queue);
  if (q->shards == 1) co_return co_await inner_.find_dead(q->names[0], std::move(filter), std::move(cursor), limit);
  limit = std::max<std::size_t>(limit, 1);
  auto at = parse_merged_cursor(cursor, q->shards);
  std::vector<std::size_t> open;
  for (std::size_t k = 0; k < q->shards; ++k)
    if (at[k]) open.push_back(k);
  // A page from each shard not listed to its end, all at once.
  auto pages = co_await at_once<page<dead_letter>>(
      open, [&](std::size_t k) { return inner_.find_dead(q->names[k], filter, *at[k], limit); });
  pages.rethrow();
  // A shard's page holds its letters newer than where its cursor stopped (at or after `since`);
  // older ones of other shards wait for its next page. So the letters at or after the latest
  // such place go out, newest first, up to `limit`.
  std::int64_t since = std::numeric_limits<std::int64_t>::min();
  for (const auto& p : pages.results)
    if (auto c = detail::parse_dead_cursor(p.cursor)) since = std::max(since, c->at_ms);
  std::vector<std::size_t> taken(open.size());  // of each page's items (the first ones: newest first)
  page<dead_letter> out;
  while (out.items.size() < limit) {
    std::optional<std::size_t> next;  // the newest letter left; of one time, the lower shard's
    for (std::size_t u = 0; u < open.size(); ++u) {
      const auto& items = pages.results[u].items;
      if (taken[u] < items.size() && items[taken[u]].at_ms >= since &&
          (!next || items[taken[u]].at_ms > pages.results[*next].items[taken[*next]].at_ms))
        next = u;
    }
    if (!next) break;
    out.items.push_back(pages.results[*next].items[taken[*next]++]);
  }
  // Each shard goes on after its page when all of it went out, else after the last letter that
  // did (its skip counts the letters of that time this listing has seen there; a fallback for
  // when that letter is gone meanwhile), else from where it was.
  for (std::size_t u = 0; u < open.size(); ++u) {
    auto k = open[u];
    auto& p = pages.results[u];
    if (taken[u] == p.items.size()) {
      at[k] = p.cursor.empty() ? std::nullopt : std::optional<std::string>(std::move(p.cursor));
    } else if (taken[u] > 0) {
      const auto& last = p.items[taken[u] - 1];
      detail::dead_cursor c;
      c.at_ms = last.at_ms;
      c.last_id = last.id;
      auto was = detail::parse_dead_cursor(*at[k]);
      c.skip = was && was->at_ms == last.at_ms ? was->skip : 0;
      for (std::size_t i = 0; i < taken[u]; ++i) c.skip += p.items[i].at_ms == last.at_ms ? 1 : 0;
      at[k] = detail::to_string(c);
    }
  }
  if (std::any_of(at.begin(), at.end(), [](const auto& c) { return c.has_value(); })) out.cursor = merged_cursor(at);
  co_return out;
}

// --- repeatable jobs ---
//
// A schedule is kept in one shard, its group's (an ungrouped one's: its name's), so that a firing
// and the step of its schedule are one call there.

namespace {
std::size_t schedule_shard(const stored_schedule& s, std::size_t shards) {
  return sharded_backend::shard_of(s.group.empty() ? s.name : s.group, shards);
}
}  // namespace

awaitable<void> sharded_backend::put_schedule(std::string queue, stored_schedule s) {
  auto q = co_await state_of(queue);
  auto k = schedule_shard(s, q->shards);
  // (One of that name in another shard, before its group changed, goes first.)
  std::vector<std::size_t> others;
  for (std::size_t i = 0; i < q->shards; ++i)
    if (i != k) others.push_back(i);
  auto removed = co_await at_once<bool>(std::move(others),
                                        [&](std::size_t i) { return inner_.remove_schedule(q->names[i], s.name); });
  removed.rethrow();
  co_await inner_.put_schedule(q->names[k], std::move(s));
}

awaitable<bool> sharded_backend::remove_schedule(std::string queue, std::string name) {
  auto q = co_await state_of(queue);
  auto removed = co_await at_once<bool>(every_shard(q->shards),
                                        [&](std::size_t k) { return inner_.remove_schedule(q->names[k], name); });
  removed.rethrow();
  co_return std::find(removed.results.begin(), removed.results.end(), true) != removed.results.end();
}

awaitable<page<stored_schedule>> sharded_backend::schedules(std::string queue, std::string cursor, std::size_t limit) {
  auto q = co_await state_of(queue);
  if (q->shards == 1) co_return co_await inner_.schedules(q->names[0], std::move(cursor), limit);
  co_return co_await over_shards<stored_schedule>(
      q->shards, cursor, limit,
      [&](std::size_t k, std::string at, std::size_t n) { return inner_.schedules(q->names[k], std::move(at), n); });
}

awaitable<std::optional<stored_schedule>> sharded_backend::next_schedule(std::string queue) {
  auto q = co_await state_of(queue);
  auto firsts = co_await at_once<std::optional<stored_schedule>>(
      every_shard(q->shards), [&](std::size_t k) { return inner_.next_schedule(q->names[k]); });
  firsts.rethrow();
  std::optional<stored_schedule> out;
  for (auto& s : firsts.results)
    if (s && (!out || s->next_ms < out->next_ms)) out = std::move(s);
  co_return out;
}

awaitable<schedule_fired> sharded_backend::fire_schedule(std::string queue, schedule_step step) {
  auto q = co_await state_of(queue);
  auto k = schedule_shard(step.was, q->shards);
  auto out = co_await inner_.fire_schedule(q->names[k], std::move(step));
  if (std::any_of(out.results.begin(), out.results.end(), [](const enqueue_result& r) { return !r.duplicate; }))
    co_await mark(queue, k);
  co_return out;
}

std::uint64_t sharded_backend::schedules_version(const std::string& queue) {
  return summed_version(queue, [this](const std::string& name) { return inner_.schedules_version(name); });
}

awaitable<void> sharded_backend::wait_schedules(std::string queue, std::uint64_t seen,
                                                std::chrono::milliseconds timeout) {
  auto q = co_await state_of(queue);
  co_await wait_versions(
      q->names, seen, timeout, [this](const std::string& name) { return inner_.schedules_version(name); },
      [this](std::string name, std::uint64_t v, std::chrono::milliseconds t) {
        return inner_.wait_schedules(std::move(name), v, t);
      },
      "wait_schedules");
}

}  // namespace jobrt
