#include <jobrt/log.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/sharded_backend.hpp>

#include "backend/check_walk.hpp"
#include "backend/finish_parts.hpp"
#include "backend/job_codec.hpp"
#include "backend/lua_scripts.hpp"
#include "backend/views.hpp"
#include "backend/wakeups.hpp"
#include "clock.hpp"
#include "redis/cluster_map.hpp"
#include "redis/redis_link.hpp"
#include "redis/shard_listener.hpp"

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/parse.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <random>
#include <unordered_set>

namespace jobrt {
namespace {

namespace asio = boost::asio;
using redis::reply;
using redis::request;

// A token is '<fence>|<lane>'; an ungrouped lane carries the record: 'j:<record>', and so does
// the lane of a job whose group runs several at once. Then, from
// e[at]: the number of the job's followers and their records.
claimed_job from_token(std::string token, const reply& record, const std::vector<reply>& e, std::size_t& at) {
  claimed_job out;
  auto bar = token.find('|');
  std::from_chars(token.data(), token.data() + bar, out.fence);
  std::string_view lane = std::string_view(token).substr(bar + 1);
  if (lane.starts_with("g:")) {
    out.group = std::string(lane.substr(2));
    out.job = detail::split_record(record.as_string());
  } else if (lane.starts_with("c:")) {  // a job of a group that runs several at once
    auto [group, rec] = detail::conc_parts(lane);
    out.group = std::string(group);
    out.job = detail::split_record(rec);
  } else {
    out.job = detail::split_record(lane.substr(2));
  }
  out.token = std::move(token);
  auto followers = static_cast<std::size_t>(e.at(at++).as_integer());
  out.ahead.reserve(followers);
  for (std::size_t i = 0; i < followers; ++i) out.ahead.push_back(detail::split_record(e.at(at++).as_string()));
  return out;
}

// The reply to TIME, in milliseconds since the epoch.
std::int64_t server_ms(const reply& time) {
  const auto& e = time.as_array();
  return std::stoll(e.at(0).as_string()) * 1000 + std::stoll(e.at(1).as_string()) / 1000;
}

// claim.lua's reply; `more` when it ends with 'more': the script stopped at its bound of lanes
// passed over with room left, and a claim goes on with another call.
std::vector<claimed_job> parse_claimed(const reply& r, bool& more) {
  std::vector<claimed_job> out;
  const auto& e = r.as_array();
  more = false;
  if (e.size() == 2 && e[0].as_string() == "limited") {  // (a token starts with digits)
    std::int64_t ms = 1;
    auto text = e[1].as_string();
    std::from_chars(text.data(), text.data() + text.size(), ms);
    throw rate_limited(std::chrono::milliseconds(ms));
  }
  out.reserve(e.size() / 3);
  std::size_t at = 0;
  while (at + 2 < e.size()) {
    const auto& token = e[at];
    const auto& record = e[at + 1];
    at += 2;
    out.push_back(from_token(token.as_string(), record, e, at));
  }
  more = at + 1 == e.size() && e[at].as_string() == "more";
  return out;
}

}  // namespace

namespace {
// Whether `text` is a SCAN cursor: an unsigned 64-bit number (the server refuses a larger one).
bool scan_cursor(std::string_view text) {
  std::uint64_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  return !text.empty() && ec == std::errc() && end == text.data() + text.size();
}

std::vector<redis::config> one(redis::config cfg) {
  std::vector<redis::config> seeds;
  seeds.push_back(std::move(cfg));
  return seeds;
}
}  // namespace

durability durability_of(std::string_view name) {
  if (name == "primary") return durability::primary;
  if (name == "replicated") return durability::replicated;
  throw std::invalid_argument(fmt::format("'{}' is not a durability: 'primary' or 'replicated'", name));
}

namespace {

// enqueue.lua's arguments after its count: id, group, body and due of each job, then, when one
// of them has one, their max group sizes. `held` keeps the strings `args` points into.
void add_job_args(std::vector<std::string_view>& args, const std::vector<encoded_job>& jobs,
                  std::vector<std::string>& held) {
  held.reserve(jobs.size() * 2);  // (no reallocation: args points into these strings)
  for (auto& j : jobs) {
    args.push_back(j.id);
    args.push_back(j.group);
    args.push_back(j.body);
    // '' now, '+<ms>' from now, '<ms>' since the epoch
    args.push_back(held.emplace_back(j.run_at_ms > 0  ? std::to_string(j.run_at_ms)
                                     : j.delay_ms > 0 ? fmt::format("+{}", j.delay_ms)
                                                      : std::string()));
  }
  if (std::none_of(jobs.begin(), jobs.end(), [](const encoded_job& j) { return j.max_group_size > 0; })) return;
  for (auto& j : jobs)
    args.push_back(held.emplace_back(j.max_group_size > 0 ? std::to_string(j.max_group_size) : std::string()));
}

// schedule_fire.lua with enqueue.lua's text in place of its line '--@enqueue.lua'.
std::string with_enqueue(std::string_view fire) {
  constexpr std::string_view line = "--@enqueue.lua\n";
  auto at = fire.find(line);
  if (at == std::string_view::npos) throw std::logic_error("schedule_fire.lua lacks its line '--@enqueue.lua'");
  return fmt::format("{}{}\n{}", fire.substr(0, at), lua::enqueue, fire.substr(at + line.size()));
}

// A schedule's value in <prefix>schedules: '<length of group>:<group><spec>'.
std::string schedule_value(const stored_schedule& s) { return fmt::format("{}:{}{}", s.group.size(), s.group, s.spec); }

stored_schedule schedule_from(std::string name, std::string_view value, std::int64_t next_ms) {
  stored_schedule s{std::move(name), {}, {}, next_ms};
  auto colon = value.find(':');
  std::size_t length = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + std::min(colon, value.size()), length);
  if (colon == std::string_view::npos || ec != std::errc() || end != value.data() + colon ||
      length > value.size() - colon - 1)
    throw std::runtime_error(fmt::format("schedule '{}': its stored value is malformed: '{}'", s.name, value));
  s.group = value.substr(colon + 1, length);
  s.spec = value.substr(colon + 1 + length);
  return s;
}

}  // namespace

redis_backend::redis_backend(asio::any_io_executor ex, redis::config cfg) : redis_backend(ex, one(std::move(cfg))) {}

redis_backend::redis_backend(asio::any_io_executor ex, std::vector<redis::config> seeds, redis_backend_options o)
    : ex_(ex),
      cfg_(seeds.at(0)),
      opts_(o),
      link_(std::make_shared<detail::redis_link>(ex, std::move(seeds))),
      enqueue_(lua::enqueue),
      claim_(lua::claim),
      finish_(lua::finish),
      extend_(lua::extend),
      release_(lua::release),
      reap_(lua::reap),
      promote_(lua::promote),
      pause_(lua::pause),
      resume_(lua::resume),
      cancel_(lua::cancel),
      requeue_(lua::requeue),
      purge_(lua::purge),
      check_fix_(lua::check_fix),
      advertise_(lua::advertise),
      expire_own_(lua::expire_own),
      reap_turn_(lua::reap_turn),
      reports_(lua::reports),
      history_(lua::history),
      schedule_put_(lua::schedule_put),
      schedule_fire_(with_enqueue(lua::schedule_fire)),
      wakeups_(std::make_shared<detail::wakeups>()) {
  std::random_device random;
  call_nonce_ = (std::uint64_t{random()} << 32) ^ random();
}

redis::connection& redis_backend::connection() noexcept { return link_->plain(); }

asio::awaitable<reply> redis_backend::exec(request req, std::string key) {
  co_return co_await link_->exec(std::move(req), key);
}

asio::awaitable<redis::config> redis_backend::node_of(std::string key) { co_return co_await link_->node_of(key); }

redis_backend::~redis_backend() {
  wakeups_->close();
  if (listener_) listener_->close();
}

std::string redis_backend::key_prefix(std::string_view queue) { return fmt::format("jobrt:{{{}}}:", queue); }

std::string_view redis_backend::enqueue_script() noexcept { return lua::enqueue; }

std::array<std::string, 5> redis_backend::enqueue_keys(std::string_view queue) {
  auto p = key_prefix(queue);
  return {p + "ready", p + "seq", p + "ids", p + "stats", p + "delayed"};
}

asio::awaitable<std::vector<enqueue_result>> redis_backend::enqueue(std::string queue, std::vector<encoded_job> jobs) {
  co_return co_await store_jobs(std::move(queue), jobs, std::string());
}

asio::awaitable<shard_enqueued> redis_backend::enqueue_in_shard(std::string queue, std::size_t shard,
                                                                std::vector<encoded_job> jobs) {
  shard_enqueued out;
  bool known;  // (the shard form of the script's count, which the mark needs: see store_jobs)
  {
    std::lock_guard lock(shards_mutex_);
    known = shards_.contains(queue);
  }
  // On one server every key is at hand. (A proxy that says it is one but keeps to one slot a
  // call, as some managed services do, refuses that with CROSSSLOT, and nothing is run: the
  // call goes again without the marks key, and so do the next.)
  out.marked = known && !marks_refused_ && (co_await link_->cluster()) == nullptr;
  auto name = sharded_backend::shard_queue(queue, shard);
  if (out.marked) {
    std::string refused;
    try {
      out.results = co_await store_jobs(name, jobs, key_prefix(queue) + "marks");
      co_return out;
    } catch (const boost::system::system_error& e) {
      if (e.code() != errc::server_error || std::string_view(e.what()).find("CROSSSLOT") == std::string_view::npos)
        throw;
      refused = e.what();
    }
    out.marked = false;
    if (!marks_refused_.exchange(true))
      jobrt::log(log_level::warn, "shards", "the server refused an enqueue that marks its shard ({}): marking apart",
                 refused);
  }
  out.results = co_await store_jobs(name, jobs, std::string());
  co_return out;
}

asio::awaitable<std::vector<enqueue_result>> redis_backend::store_jobs(std::string queue,
                                                                       const std::vector<encoded_job>& jobs,
                                                                       std::string marks) {
  if (jobs.empty()) co_return std::vector<enqueue_result>{};
  for (std::size_t i = 0; i < jobs.size(); ++i)
    if (auto problem = detail::due_refusal(jobs[i], i); !problem.empty())
      throw boost::system::system_error(errc::bad_due, problem);
  auto p = key_prefix(queue);
  std::vector<std::string_view> args;
  args.reserve(1 + jobs.size() * 4);
  // A shard's ids: n * shards + k ("<count>:<shards>:<k>", see enqueue.lua).
  std::string n = std::to_string(jobs.size());
  if (auto hash = queue.rfind('#'); hash != std::string::npos) {
    std::lock_guard lock(shards_mutex_);
    if (auto found = shards_.find(std::string_view(queue).substr(0, hash)); found != shards_.end())
      n = fmt::format("{}:{}:{}", jobs.size(), found->second, std::string_view(queue).substr(hash + 1));
  }
  args.push_back(n);
  std::vector<std::string> held;
  add_job_args(args, jobs, held);
  auto named = enqueue_keys(queue);
  std::vector<std::string> keys(named.begin(), named.end());
  if (!marks.empty()) keys.push_back(std::move(marks));
  reply r;
  if (opts_.durability == durability::replicated)
    r = co_await link_->run_replicated(enqueue_, enqueue_.make_request(keys, args), p, opts_.replicas,
                                       opts_.replica_wait);
  else
    r = co_await link_->run(enqueue_, enqueue_.make_request(keys, args), p);
  const auto& e = r.as_array();
  std::vector<enqueue_result> out;
  out.reserve(jobs.size());
  for (std::size_t i = 0; i + 1 < e.size(); i += 2) out.push_back({e[i].as_string(), e[i + 1].as_integer() == 1});
  co_return out;
}

// How long a stopping worker's claim may take to answer once written: a blocking one once
// CLIENT UNBLOCK is sent, any other once cancelled (an answer that comes later is dropped, and
// the jobs it leased go back when their leases expire, as a crashed worker's do).
constexpr std::chrono::milliseconds unblock_wait{500};

// Lua's unpack() takes a few thousand values at most, and a script that fails halfway does not
// roll back: calls stay below that.

// The most items of one finish, promote or requeue call.
constexpr std::size_t max_batch = 1000;

request redis_backend::claim_request(const std::string& p, const claim_options& opts) const {
  if (opts.rate) check_rate_limit(*opts.rate, "claim rate");
  std::array<std::string, 7> keys{p + "ready",  p + "active", p + "fence", p + "stats", p + "claimed:" + opts.worker,
                                  p + "paused", p + "parked"};
  std::array<std::string, 4> args{std::to_string(std::min(opts.max, max_claim)), std::to_string(opts.lease_ttl.count()),
                                  std::to_string(std::min(opts.ahead, max_ahead)),
                                  opts.rate ? fmt::format("{}:{}", opts.rate->max, opts.rate->window.count()) : ""};
  auto req = claim_.make_request(keys, args);
  // Cut short after it was written, it could lease jobs that nobody would run until their
  // leases expire: once written, the caller gets its reply - unless the server keeps it
  // waiting (a stop must not wait for a server that answers nothing).
  req.options.keep_once_written = true;
  req.options.written_cancel_wait = unblock_wait;
  return req;
}

asio::awaitable<std::vector<claimed_job>> redis_backend::claim(std::string queue, claim_options opts) {
  std::vector<claimed_job> jobs;
  co_await claim_more(key_prefix(queue), std::move(opts), jobs);
  co_return jobs;
}

// Calls claim.lua, and again while a call stopped at its bound of lanes passed over with room
// left, each call bounded, until `jobs` has what was asked for or a call stopped short of the
// bound. A failure after jobs were leased (or the caller's stop then) returns them: they are the
// caller's; before, it is the caller's failure.
// (That answer is short with work left: on a sharded queue the shard's mark is gone with it, and
// the reapers' walk over the shards finds that work, as after a mark that failed.)
asio::awaitable<void> redis_backend::claim_more(const std::string& p, claim_options opts,
                                                std::vector<claimed_job>& jobs) {
  auto want = std::min(opts.max, max_claim);
  bool more = false;
  do {
    opts.max = want - jobs.size();
    std::vector<claimed_job> next;
    try {
      auto r = co_await link_->run(claim_, claim_request(p, opts), p);
      next = parse_claimed(r, more);
    } catch (const std::exception& e) {
      if (jobs.empty()) throw;
      jobrt::log(log_level::debug, "claim", "a claim's next step failed: {}", e.what());
      co_return;
    }
    std::move(next.begin(), next.end(), std::back_inserter(jobs));
  } while (more && jobs.size() < want);
}

redis::blocking_connection& redis_backend::blocking_for(const std::string& worker, const redis::config& node) {
  std::lock_guard lock(blocking_mutex_);
  auto& c = blocking_[worker];
  // On a cluster, the queue's primary may have changed since (a failover, a slot moved): the
  // old connection goes. (A worker has one claim on its way at most: nothing else uses it.)
  if (c && (c->get_config().host != node.host || c->get_config().port != node.port)) c.reset();
  if (!c) {
    auto cfg = node;
    cfg.client_name = fmt::format("{}:blocking", cfg_.client_name);
    c = std::make_unique<redis::blocking_connection>(ex_, cfg);
    c->start();
  }
  return *c;
}

asio::awaitable<std::vector<claimed_job>> redis_backend::claim_wait(std::string queue, claim_options opts,
                                                                    std::chrono::milliseconds wait) {
  if (opts.max == 0) co_return std::vector<claimed_job>{};  // (BLMOVE would take a lane for nobody)
  // Right after a claim that drained the queue (it got fewer jobs than it asked for), the claim
  // below would find nothing either: whatever arrived since makes BLMOVE return at once. So a
  // worker woken for a few jobs goes back to waiting with no claim in between.
  // (A cancellation cuts the claim short only before it is written: see claim_request.)
  // (Not under the queue's rate limit: BLMOVE would return at once while lanes wait for room.)
  if (opts.rate || !take_idle_mark(opts.worker)) {
    auto jobs = co_await claim(queue, opts);
    auto cs = co_await asio::this_coro::cancellation_state;
    if (!jobs.empty() || wait.count() <= 0 || cs.cancelled() != asio::cancellation_type::none) {
      if (jobs.size() < std::min(opts.max, max_claim) && wait.count() > 0) set_idle_mark(opts.worker);
      co_return jobs;  // (BLMOVE with timeout 0 would block forever)
    }
  }
  // Wait inside Redis: BLMOVE moves the next lane to this worker's claimed list (where a crash
  // cannot lose it). The claim script goes in the same write, right behind it: Redis runs it the
  // moment BLMOVE returns, so a woken worker holds its lease with no further round trip. (A
  // BLMOVE that times out is followed by a claim that finds nothing, or what arrived just then.)
  auto p = key_prefix(queue);
  request wait_and_claim("BLMOVE", p + "ready", p + "claimed:" + opts.worker, "LEFT", "RIGHT",
                         fmt::format("{:.3f}", static_cast<double>(wait.count()) / 1000.0));
  wait_and_claim.append(claim_request(p, opts));
  wait_and_claim.options.timeout = wait + cfg_.health_interval * 2 + std::chrono::seconds(1);
  // A cancellation (a worker's stop) cuts the request short only while it waits to be written.
  // Once written, BLMOVE may have returned and the claim leased jobs, whose reply must come:
  // abandoned, they would run only after their leases expired, with an attempt counted. So the
  // wait is ended instead: CLIENT UNBLOCK makes BLMOVE return as if it timed out, and the claim
  // behind it runs and answers at once. When no reply comes soon after all (UNBLOCK refused by
  // an ACL or sent before BLMOVE arrived, or the server silent), the request is abandoned and
  // the connection made again, as for any cancellation: a stop takes that long at most.
  auto waited = co_await exec_blocking(opts.worker, p, std::move(wait_and_claim));
  auto& r = waited.r;
  if (waited.ec) {
    // The connection dropped: the caller comes again. On a cluster its primary may have died:
    // the claim goes the cluster's way, which waits for a replica to take over.
    if (auto* cluster = co_await link_->cluster()) {
      co_await cluster->refresh();
      co_return co_await claim(std::move(queue), std::move(opts));
    }
    co_return std::vector<claimed_job>{};
  }
  // A reply in hand wins over a cancellation that came meanwhile: those leases are ours now.
  // On a cluster, the queue's slot moved, is moving, or has no primary for now (a BLMOVE that
  // waited there is answered so too): the slot map is read again, and the claim goes the
  // cluster's way, which follows redirects and waits out the rest; the next wait is where the
  // slot is then.
  auto redirected = [&](const reply& e) -> asio::awaitable<bool> {
    auto* cluster = co_await link_->cluster();
    if (!cluster || redis::detail::classify(e.error_message()).kind == redis::detail::cluster_error::other)
      co_return false;
    co_await cluster->refresh();
    co_return true;
  };
  const auto& claimed = r.as_array().at(1);
  if (claimed.is_error()) {  // NOSCRIPT there, or a redirect: claim the usual way (which loads it)
    bool again = claimed.error_message().starts_with("NOSCRIPT");
    if (!again) again = co_await redirected(claimed);  // (g++ 12: no co_await inside && or ?:)
    if (!again) throw boost::system::system_error(errc::server_error, std::string(claimed.error_message()));
    co_return co_await claim(std::move(queue), std::move(opts));
  }
  bool more = false;
  auto jobs = parse_claimed(claimed, more);
  if (more) co_await claim_more(p, opts, jobs);
  // A BLMOVE the server refuses (a user without it in its ACL, a proxy without blocking
  // commands) returns at once: taken for an empty wait, the worker would ask again and again.
  // The claim behind it still ran; its jobs come first, and the next call fails.
  const auto& moved = r.as_array().at(0);
  if (moved.is_error() && jobs.empty()) {
    if (co_await redirected(moved)) co_return co_await claim(std::move(queue), std::move(opts));
    throw boost::system::system_error(errc::server_error,
                                      fmt::format("BLMOVE on {} refused: {}", waited.address, moved.error_message()));
  }
  if (jobs.size() < std::min(opts.max, max_claim)) set_idle_mark(opts.worker);
  co_return jobs;
}

asio::awaitable<redis_backend::blocked_reply> redis_backend::exec_blocking(const std::string& worker,
                                                                           const std::string& prefix, request req) {
  req.options.keep_once_written = true;
  req.options.written_cancel_wait = unblock_wait;
  auto& blocking = blocking_for(worker, co_await link_->node_of(prefix));
  auto stop = (co_await asio::this_coro::cancellation_state).slot();
  auto inner = std::make_shared<asio::cancellation_signal>();
  if (stop.is_connected()) {
    stop.assign([this, inner, &blocking](asio::cancellation_type type) {
      inner->emit(type);
      unblock(blocking.get_config(), blocking.client_id());
    });
  }
  auto [ec, r] = co_await blocking.async_exec(
      std::move(req), asio::bind_cancellation_slot(inner->slot(), asio::as_tuple(asio::use_awaitable)));
  if (stop.is_connected()) stop.clear();
  if (ec) {
    auto cs = co_await asio::this_coro::cancellation_state;
    if (cs.cancelled() != asio::cancellation_type::none)
      throw boost::system::system_error(asio::error::operation_aborted);
  }
  co_return blocked_reply{ec, std::move(r), blocking.get_config().address()};
}

void redis_backend::unblock(const redis::config& node, std::int64_t client_id) {
  if (client_id == 0) return;  // not connected: the request waits, and the cancellation removes it
  link_->exec_at(node, request("CLIENT", "UNBLOCK", client_id),
                 [address = node.address()](boost::system::error_code ec, reply r) {
                   if (ec == errc::server_error)
                     jobrt::log(log_level::warn, "redis",
                                "CLIENT UNBLOCK refused by {}: {}; a stopping worker drops its blocking connection "
                                "after {} ms instead",
                                address, r.is_error() ? r.error_message() : std::string_view(), unblock_wait.count());
                 });
}

bool redis_backend::take_idle_mark(const std::string& worker) {
  std::lock_guard lock(blocking_mutex_);
  return idle_.erase(worker) > 0;
}

void redis_backend::set_idle_mark(const std::string& worker) {
  std::lock_guard lock(blocking_mutex_);
  idle_.insert(worker);
}

asio::awaitable<std::vector<finish_result>> redis_backend::finish(std::string queue, std::string worker,
                                                                  std::vector<finish_item> items,
                                                                  std::chrono::milliseconds lease_ttl) {
  std::vector<std::string> calls;
  auto all = co_await finish_part(queue, worker, std::move(items), lease_ttl, calls);
  finish_answered(queue, worker, std::move(calls));
  co_return all;
}

void redis_backend::finish_answered(const std::string& queue, const std::string& worker,
                                    std::vector<std::string> calls) {
  std::lock_guard lock(blocking_mutex_);
  auto& answered = answered_[key_prefix(queue) + "answers:" + worker];
  answered.insert(answered.end(), std::make_move_iterator(calls.begin()), std::make_move_iterator(calls.end()));
}

asio::awaitable<std::vector<finish_result>> redis_backend::finish_part(std::string queue, std::string worker,
                                                                       std::vector<finish_item> items,
                                                                       std::chrono::milliseconds lease_ttl,
                                                                       std::vector<std::string>& calls) {
  // A batch too big for one call goes in parts, a token's items in one (finish_parts). A part's
  // answer counts as come only once every part's has: a batch that fails partway is sent again
  // whole, and its first parts must find their records.
  std::vector<finish_result> all;
  if (items.size() <= max_batch) {
    all = co_await finish_call(queue, worker, std::move(items), lease_ttl, calls);
  } else {
    all.resize(items.size());
    for (const auto& indices : detail::finish_parts(items, max_batch)) {
      std::vector<finish_item> part;
      part.reserve(indices.size());
      for (auto i : indices) part.push_back(items[i]);
      auto done = co_await finish_call(queue, worker, std::move(part), lease_ttl, calls);
      for (std::size_t k = 0; k < indices.size(); ++k) all[indices[k]] = std::move(done.at(k));
    }
  }
  co_return all;
}

asio::awaitable<std::vector<finish_result>> redis_backend::finish_call(const std::string& queue,
                                                                       const std::string& worker,
                                                                       std::vector<finish_item> items,
                                                                       std::chrono::milliseconds lease_ttl,
                                                                       std::vector<std::string>& calls) {
  auto p = key_prefix(queue);
  std::array<std::string, 12> keys{p + "ready",   p + "active", p + "fence",     p + "stats",
                                   p + "ids",     p + "dead",   p + "dead:info", p + "answers:" + worker,
                                   p + "delayed", p + "paused", p + "parked",    p + "jumped"};
  std::string ttl = std::to_string(lease_ttl.count()), n = std::to_string(items.size());
  // The call's id comes from what it carries: the same batch sent again (a retry after a lost
  // reply or a timeout) is the same call, and the script answers it from its record. Two calls
  // on their way at once never carry the same items: a token is in one of them at most.
  std::uint64_t id = 14695981039346656037ull;  // FNV-1a
  auto mix = [&](std::string_view text) {
    for (char ch : text) id = (id ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
    id = (id ^ 0xff) * 1099511628211ull;
  };
  mix(std::string_view(reinterpret_cast<const char*>(&call_nonce_), sizeof call_nonce_));
  std::vector<std::string> forget;
  {
    std::lock_guard lock(blocking_mutex_);
    forget = answered_[keys[7]];  // (answers:<worker> of this queue: another's ids mean nothing here)
  }
  for (auto& it : items) {
    mix(it.token);
    mix(it.id);
    mix(std::string_view(reinterpret_cast<const char*>(&it.kind), sizeof it.kind));
  }
  std::string call = fmt::format("{:016x}", id);
  // A call sent again after a failure that came after its answer (a later part of the batch
  // failed) must still find its record: its own id is not among those to drop.
  std::erase(forget, call);
  auto forgotten = fmt::format("{}", fmt::join(forget, " "));
  std::vector<std::string_view> args{ttl, n, call, forgotten};
  args.reserve(4 + items.size() * 4);
  // Four arguments an item: token, kind, producer-given id, and what its kind needs (finish.lua).
  std::vector<std::string> extras;
  extras.reserve(items.size());
  for (auto& it : items) {
    switch (it.kind) {
      case finish_kind::ack: {
        char want = it.want_next == finish_item::next_policy::yes               ? '1'
                    : it.want_next == finish_item::next_policy::if_nobody_waits ? '2'
                                                                                : '0';
        extras.push_back(want + std::to_string(std::min(it.ahead, max_ahead)));
        if (!it.result.empty()) extras.back() += '|' + it.result;
        break;
      }
      case finish_kind::keep: extras.push_back(it.result.empty() ? it.id : it.id + '|' + it.result); break;
      case finish_kind::fail:
      case finish_kind::give_up:
      case finish_kind::halt: extras.push_back(it.error); break;
      case finish_kind::retry:
      case finish_kind::defer:
      case finish_kind::hand_back: extras.push_back(std::to_string(it.delay.count())); break;
      case finish_kind::release:
      case finish_kind::cancel: extras.emplace_back(); break;
    }
  }
  // An ack or a fail that throttles its group: 'a<ms>', 'f<ms>'.
  std::vector<std::string> throttles;
  throttles.reserve(items.size());
  for (auto& it : items)
    if ((it.kind == finish_kind::ack || it.kind == finish_kind::fail) && it.throttle.count() > 0)
      throttles.push_back(fmt::format("{}{}", it.kind == finish_kind::ack ? 'a' : 'f', it.throttle.count()));
  auto throttle = throttles.begin();
  for (std::size_t i = 0; i < items.size(); ++i) {
    auto& it = items[i];
    args.push_back(it.token);
    bool throttled = it.throttle.count() > 0 && (it.kind == finish_kind::ack || it.kind == finish_kind::fail);
    switch (it.kind) {
      case finish_kind::ack: args.push_back(throttled ? std::string_view(*throttle++) : std::string_view("a")); break;
      case finish_kind::keep: args.push_back("k"); break;
      case finish_kind::fail: args.push_back(throttled ? std::string_view(*throttle++) : std::string_view("f")); break;
      case finish_kind::give_up: args.push_back("g"); break;
      case finish_kind::retry: args.push_back("r"); break;
      case finish_kind::defer: args.push_back("d"); break;
      case finish_kind::hand_back: args.push_back("u"); break;
      case finish_kind::halt: args.push_back("h"); break;
      case finish_kind::release: args.push_back("b"); break;
      case finish_kind::cancel: args.push_back("c"); break;
    }
    args.push_back(it.unique_id);
    args.push_back(extras[i]);
  }
  auto req = finish_.make_request(keys, args);
  req.options.resend_safe = true;  // the script answers a resent call from its cache
  reply r;
  if (opts_.durability == durability::replicated)
    r = co_await link_->run_replicated(finish_, std::move(req), p, opts_.replicas, opts_.replica_wait);
  else
    r = co_await link_->run(finish_, std::move(req), p);
  {
    std::lock_guard lock(blocking_mutex_);
    auto& answered = answered_[keys[7]];
    std::erase_if(answered,
                  [&](const std::string& a) { return std::find(forget.begin(), forget.end(), a) != forget.end(); });
  }
  calls.push_back(std::move(call));
  const auto& e = r.as_array();
  std::vector<finish_result> out;
  out.reserve(items.size());
  for (std::size_t at = 0; at < e.size();) {  // see finish.lua for the reply's shape
    finish_result f;
    auto held = e[at++].as_integer();
    f.lease_held = held % 2 == 1;
    if (held >= 2) {
      const auto& token = e.at(at);
      const auto& record = e.at(at + 1);
      at += 2;
      f.next = from_token(token.as_string(), record, e, at);
    }
    out.push_back(std::move(f));
  }
  co_return out;
}

asio::awaitable<std::vector<bool>> redis_backend::extend(std::string queue, std::string worker,
                                                         std::vector<std::string> tokens,
                                                         std::chrono::milliseconds lease_ttl) {
  // One call however many tokens (the script takes them 1000 at a time): the list of leases it
  // records for expire_own must be the whole of them.
  auto p = key_prefix(queue);
  std::array<std::string, 3> keys{p + "active", p + "workers", p + "leases:" + worker};
  std::string ttl = std::to_string(lease_ttl.count());
  std::vector<std::string_view> args{worker, ttl};
  for (auto& t : tokens) args.push_back(t);
  reply r = co_await link_->run(extend_, extend_.make_request(keys, args), p);
  std::vector<bool> out;
  for (const auto& e : r.as_array()) out.push_back(e.as_integer() == 1);
  co_return out;
}

asio::awaitable<void> redis_backend::advertise(std::string queue, std::vector<std::string> types,
                                               std::chrono::milliseconds ttl) {
  if (types.empty()) co_return;
  auto p = key_prefix(queue);
  std::array<std::string, 1> keys{p + "types"};
  std::vector<std::string> args{std::to_string(ttl.count())};
  args.insert(args.end(), std::make_move_iterator(types.begin()), std::make_move_iterator(types.end()));
  auto req = advertise_.make_request(keys, args);
  req.options.resend_safe = true;  // (ZADD GT: the same deadline twice changes nothing)
  co_await link_->run(advertise_, std::move(req), p);
}

asio::awaitable<std::chrono::milliseconds> redis_backend::unrunnable_for(std::string queue, std::string type) {
  auto p = key_prefix(queue);
  request req;
  req.push("TIME").push("ZSCORE", p + "types", type);  // the server's clock, as the deadlines are
  req.options.resend_safe = true;
  reply r = co_await link_->exec(std::move(req), p);
  const auto& e = r.as_array();
  if (e.at(1).is_nil()) co_return std::chrono::milliseconds::max();
  auto now = server_ms(e.at(0));
  co_return std::chrono::milliseconds(std::max<std::int64_t>(0, now - std::stoll(e.at(1).as_string())));
}

asio::awaitable<std::int64_t> redis_backend::expire_own(std::string queue, std::string worker) {
  auto p = key_prefix(queue);
  std::array<std::string, 3> keys{p + "active", p + "leases:" + worker, p + "answers:" + worker};
  reply r = co_await link_->run(expire_own_, expire_own_.make_request(keys, std::array<std::string, 0>{}), p);
  co_return r.as_integer();
}

asio::awaitable<void> redis_backend::release(std::string queue, std::string worker, std::vector<std::string> tokens) {
  auto p = key_prefix(queue);
  std::array<std::string, 5> keys{p + "ready", p + "active", p + "stats", p + "claimed:" + worker, p + "jumped"};
  co_await link_->run(release_, release_.make_request(keys, tokens), p);
}

asio::awaitable<reap_result> redis_backend::reap(std::string queue, reap_options opts) {
  auto p = key_prefix(queue);
  std::array<std::string, 9> keys{p + "ready",  p + "active", p + "stats",     p + "workers", p + "paused",
                                  p + "parked", p + "dead",   p + "dead:info", p + "jumped"};
  std::array<std::string, 4> args{std::to_string(opts.max), std::to_string(opts.dead_max_count),
                                  std::to_string(opts.dead_max_age.count()), opts.drop_kept ? "1" : "0"};
  reply r = co_await link_->run(reap_, reap_.make_request(keys, args), p);
  const auto& e = r.as_array();
  reap_result out{e.at(0).as_integer(), e.at(1).as_integer(), e.at(2).as_integer(), e.at(3).as_integer(), {}};
  for (std::size_t i = 4; i < e.size(); ++i) out.recovered_types.push_back(e[i].as_string());
  co_return out;
}

namespace {

// The counters of a queue's `stats` hash (HGETALL's reply) into `c`.
void read_stats(const reply& fields_reply, queue_counts& c) {
  const auto& fields = fields_reply.as_array();
  for (std::size_t i = 0; i + 1 < fields.size(); i += 2) {
    const auto& name = fields[i].as_string();
    std::int64_t value = std::stoll(fields[i + 1].as_string());
    if (name == "enqueued")
      c.enqueued = value;
    else if (name == "started")
      c.started = value;
    else if (name == "completed")
      c.completed = value;
    else if (name == "failed")
      c.failed = value;
    else if (name == "recovered")
      c.recovered = value;
    else if (name == "retried")
      c.retried = value;
    else if (name == "deferred")
      c.deferred = value;
    else if (name == "unhandled")
      c.unhandled = value;
    else if (name == "halted")
      c.halted = value;
    else if (name == "groups")
      c.groups = value;
  }
}

}  // namespace

asio::awaitable<queue_counts> redis_backend::counters(std::string queue) {
  auto p = key_prefix(queue);
  request req("HGETALL", p + "stats");
  req.options.resend_safe = true;
  reply r = co_await link_->exec(std::move(req), p);
  queue_counts c;
  read_stats(r, c);
  co_return c;
}

asio::awaitable<queue_counts> redis_backend::counts(std::string queue) {
  auto p = key_prefix(queue);
  request req;
  req.push("ZCOUNT", p + "active", "-inf", "(+inf")  // (the member at +inf is no lease: claim.lua)
      .push("ZCARD", p + "dead")
      .push("HGETALL", p + "stats")
      .push("ZCARD", p + "delayed")
      .push("HLEN", p + "paused");
  // Each priority's list, in the order claims read them (ready is level 0): its length and head.
  constexpr std::array<int, 5> order{2, 1, 0, -1, -2};
  for (int level : order)
    req.push("LLEN", detail::level_key(p, level)).push("LRANGE", detail::level_key(p, level), 0, 1);
  req.options.resend_safe = true;
  reply r = co_await link_->exec(std::move(req), p);
  const auto& e = r.as_array();
  queue_counts c;
  c.running = e.at(0).as_integer();
  c.dead = e.at(1).as_integer();
  c.delayed = e.at(3).as_integer();
  c.paused = e.at(4).as_integer();
  read_stats(e.at(2), c);
  const reply* head = nullptr;  // the next lane a claim takes (a wake entry is none)
  for (std::size_t i = 0; i < order.size(); ++i) {
    c.ready_lanes += e.at(5 + 2 * i).as_integer();
    const auto& first = e.at(6 + 2 * i).as_array();
    std::size_t at = 0;
    if (!first.empty() && first[0].as_string() == "w:") {  // (a wake entry is no lane)
      --c.ready_lanes;
      ++at;
    }
    if (!head && at < first.size()) head = &first[at];
  }
  // The next job to start: inline in an ungrouped lane, else its group's head (one more read).
  if (head) {
    std::string_view lane = head->as_string();
    if (!lane.starts_with("g:")) {
      c.next_enqueued_ms = detail::enqueued_at(lane);
    } else {
      request first("LINDEX", p + std::string(lane), 0);
      first.options.resend_safe = true;
      reply record = co_await link_->exec(std::move(first), p);
      if (!record.is_nil()) c.next_enqueued_ms = detail::enqueued_at(record.as_string());
    }
  }
  co_return c;
}

asio::awaitable<promote_result> redis_backend::promote(std::string queue, std::size_t max) {
  auto p = key_prefix(queue);
  std::array<std::string, 5> keys{p + "ready", p + "delayed", p + "paused", p + "parked", p + "stats"};
  std::array<std::string, 1> args{std::to_string(std::min(max, max_batch))};
  reply r = co_await link_->run(promote_, promote_.make_request(keys, args), p);
  const auto& e = r.as_array();
  promote_result out;
  out.moved = e.at(0).as_integer();
  if (auto wait = e.at(1).as_integer(); wait >= 0) out.next_due = std::chrono::milliseconds(wait);
  co_return out;
}

std::uint64_t redis_backend::delayed_version(const std::string& queue) {
  return listened(key_prefix(queue) + "delayed");
}

std::uint64_t redis_backend::ended_version(const std::string& queue) { return listened(key_prefix(queue) + "ended"); }

asio::awaitable<std::optional<kept_job>> redis_backend::wait_ended(std::string queue, std::string id,
                                                                   std::uint64_t seen,
                                                                   std::chrono::milliseconds timeout) {
  auto channel = key_prefix(queue) + "ended";
  auto w = wakeups_;  // (the wait may outlast this backend)
  auto deadline = std::chrono::steady_clock::now() + timeout;
  // Each end of a kept job in the queue wakes it: while every message since `seen` is kept and
  // none is about this job, it waits on, with no look.
  std::optional<std::string> said;
  while (!said) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    co_await w->wait(channel, seen, left);
    auto heard = w->said_since(channel, seen, id);
    said = std::move(heard.said);
    if (said) break;
    auto cs = co_await asio::this_coro::cancellation_state;
    if (id.empty() || !heard.all_kept || heard.version == seen || cs.cancelled() != asio::cancellation_type::none ||
        std::chrono::steady_clock::now() >= deadline)
      co_return std::nullopt;
    seen = heard.version;
  }
  // The message of an end is '<id>|<its entry in the jobs hash>' when finish.lua sent the entry
  // (a completed or cancelled job's, up to a size), else '<id>' (an id has no '|'): the newest
  // about this job must carry the entry.
  if (said->size() <= id.size() + 1) co_return std::nullopt;
  auto entry = std::string_view(*said).substr(id.size() + 1);
  if (entry[0] != 'c' && entry[0] != 'k') co_return std::nullopt;  // (an end is one of these)
  co_return detail::parse_kept_entry(std::move(id), entry, 0, std::nullopt);
}

std::uint64_t redis_backend::listened(const std::string& channel) {
  {
    std::lock_guard lock(blocking_mutex_);
    if (!listener_) {
      // Each message comes on a queue's channel (its delayed set's, or its kept jobs' ends); a
      // notice that messages may have been missed wakes the waiters of the channel it names
      // (its subscription, also at a node it moved to), or everyone after a reconnect.
      listener_ =
          std::make_shared<detail::shard_listener>(ex_, link_, "wakeups", [w = wakeups_](const redis::message& m) {
            if (m.confirmation && m.channel.empty())
              w->bump_all();
            else  // a message (with what it said), or the notice that this channel's subscription holds
              w->bump(m.channel, m.confirmation ? std::string_view() : std::string_view(m.payload));
          });
    }
    if (subscribed_.insert(channel).second) listener_->listen(channel);
  }
  return wakeups_->version(channel);
}

asio::awaitable<void> redis_backend::wait_delayed(std::string queue, std::uint64_t seen,
                                                  std::chrono::milliseconds timeout) {
  co_await wakeups_->wait(key_prefix(queue) + "delayed", seen, timeout);
}

namespace {

dead_letter parse_dead_letter(std::string id, std::string_view info, std::int64_t at_ms) {
  dead_letter out;
  out.id = std::move(id);
  out.at_ms = at_ms;
  boost::system::error_code ec;
  auto v = boost::json::parse(info, ec);
  if (ec || !v.is_object()) {
    out.error = fmt::format("(unreadable dead letter: {:.60})", info);
    return out;
  }
  auto& o = v.as_object();
  auto text = [&](std::string_view name) {
    auto* f = o.if_contains(name);
    return f && f->is_string() ? std::string(f->as_string()) : std::string();
  };
  out.record = text("record");
  out.group = text("group");
  out.error = text("error");
  // A letter that says how often its job ran (a skip: resume.lua); else its header and last run.
  auto* runs = o.if_contains("runs");
  out.runs = runs && runs->is_int64() ? runs->as_int64() : detail::attempts_before(out.record) + 1;
  return out;
}

}  // namespace

asio::awaitable<void> redis_backend::put_schedule(std::string queue, stored_schedule s) {
  auto p = key_prefix(queue);
  std::array<std::string, 2> keys{p + "schedules", p + "schedule_due"};
  std::array<std::string, 3> args{s.name, schedule_value(s), std::to_string(s.next_ms)};
  co_await link_->run(schedule_put_, schedule_put_.make_request(keys, args), p);
}

asio::awaitable<bool> redis_backend::remove_schedule(std::string queue, std::string name) {
  auto p = key_prefix(queue);
  std::array<std::string, 2> keys{p + "schedules", p + "schedule_due"};
  std::array<std::string, 3> args{std::move(name), "", "0"};
  reply r = co_await link_->run(schedule_put_, schedule_put_.make_request(keys, args), p);
  co_return r.as_integer() == 1;
}

asio::awaitable<page<stored_schedule>> redis_backend::schedules(std::string queue, std::string cursor,
                                                                std::size_t limit) {
  auto p = key_prefix(queue);
  if (cursor.empty()) cursor = "0";
  if (!scan_cursor(cursor))
    throw std::invalid_argument("schedule cursor '" + cursor + "' is not one that a listing gave");
  // One HSCAN step (bounded), then the next firings of what it found.
  request scan("HSCAN", p + "schedules", cursor, "COUNT", std::clamp<std::size_t>(limit, 1, 1000));
  scan.options.resend_safe = true;
  reply r = co_await link_->exec(std::move(scan), p);
  page<stored_schedule> out;
  if (auto next = r.as_array().at(0).as_string(); next != "0") out.cursor = next;
  const auto& found = r.as_array().at(1).as_array();
  if (found.empty()) co_return out;
  std::vector<std::string_view> names;
  for (std::size_t i = 0; i < found.size(); i += 2) names.push_back(found[i].as_string());
  request scores("ZMSCORE", p + "schedule_due", names);
  scores.options.resend_safe = true;
  reply next = co_await link_->exec(std::move(scores), p);
  for (std::size_t i = 0; i < found.size(); i += 2) {
    const auto& score = next.as_array().at(i / 2);
    if (score.is_nil()) continue;  // (removed between the two reads)
    out.items.push_back(schedule_from(found[i].as_string(), found[i + 1].as_string(),
                                      static_cast<std::int64_t>(std::stod(score.as_string()))));
  }
  co_return out;
}

asio::awaitable<std::optional<stored_schedule>> redis_backend::next_schedule(std::string queue) {
  auto p = key_prefix(queue);
  // Two reads: a schedule removed between them is looked past (a few times, then none).
  for (int attempt = 0; attempt < 3; ++attempt) {
    request first("ZRANGE", p + "schedule_due", 0, 0, "WITHSCORES");
    first.options.resend_safe = true;
    reply r = co_await link_->exec(std::move(first), p);
    const auto& e = r.as_array();
    if (e.empty()) co_return std::nullopt;
    request value("HGET", p + "schedules", e.at(0).as_string());
    value.options.resend_safe = true;
    reply v = co_await link_->exec(std::move(value), p);
    if (!v.is_nil())
      co_return schedule_from(e.at(0).as_string(), v.as_string(),
                              static_cast<std::int64_t>(std::stod(e.at(1).as_string())));
  }
  co_return std::nullopt;
}

asio::awaitable<schedule_fired> redis_backend::fire_schedule(std::string queue, schedule_step step) {
  auto p = key_prefix(queue);
  std::vector<encoded_job> jobs;
  for (auto at : step.firings) {
    auto& j = jobs.emplace_back(step.job);
    j.id = fmt::format("{}@{}", step.was.name, at);
    j.delay_ms = j.run_at_ms = 0;
  }
  auto seen = schedule_value(step.was);
  auto seen_next = std::to_string(step.was.next_ms), after = std::to_string(step.next_ms);
  auto count = std::to_string(jobs.size());
  std::vector<std::string_view> args;
  args.push_back(step.was.name);
  args.push_back(seen);
  args.push_back(seen_next);
  args.push_back(after);
  args.push_back(count);
  std::vector<std::string> held;
  add_job_args(args, jobs, held);
  auto named = enqueue_keys(queue);
  auto req = schedule_fire_.make_request(named, args);
  reply r;
  if (opts_.durability == durability::replicated)
    r = co_await link_->run_replicated(schedule_fire_, std::move(req), p, opts_.replicas, opts_.replica_wait);
  else
    r = co_await link_->run(schedule_fire_, std::move(req), p);
  schedule_fired out;
  const auto& e = r.as_array();
  auto outcome = e.at(0).as_integer();
  out.taken = outcome != 0;
  if (outcome == 2) {
    std::string_view said = e.at(1).as_string();
    out.refused = said.substr(std::min(said.find(' ') + 1, said.size()));  // (without 'JOBRT:<n> ')
  } else if (outcome == 1) {
    const auto& stored = e.at(1).as_array();
    for (std::size_t i = 0; i + 1 < stored.size(); i += 2) {
      auto& one = out.results.emplace_back();
      one.id = stored[i].as_string();
      one.duplicate = stored[i + 1].as_integer() == 1;
    }
  }
  co_return out;
}

std::uint64_t redis_backend::schedules_version(const std::string& queue) {
  return listened(key_prefix(queue) + "schedules");
}

asio::awaitable<void> redis_backend::wait_schedules(std::string queue, std::uint64_t seen,
                                                    std::chrono::milliseconds timeout) {
  co_await wakeups_->wait(key_prefix(queue) + "schedules", seen, timeout);
}

asio::awaitable<std::vector<dead_letter>> redis_backend::dead_letters(std::string queue, std::size_t offset,
                                                                      std::size_t limit) {
  std::vector<dead_letter> out;
  if (limit == 0) co_return out;
  auto p = key_prefix(queue);
  request ids("ZRANGE", p + "dead", std::to_string(offset), std::to_string(offset + limit - 1), "WITHSCORES");
  ids.options.resend_safe = true;
  reply r = co_await link_->exec(std::move(ids), p);
  const auto& e = r.as_array();
  if (e.empty()) co_return out;
  std::vector<std::string_view> names;
  for (std::size_t i = 0; i + 1 < e.size(); i += 2) names.push_back(e[i].as_string());
  request infos("HMGET", p + "dead:info", names);
  infos.options.resend_safe = true;
  reply info = co_await link_->exec(std::move(infos), p);
  const auto& texts = info.as_array();
  for (std::size_t i = 0; i + 1 < e.size(); i += 2) {
    const auto& text = texts.at(i / 2);
    if (text.is_nil()) continue;  // purged meanwhile
    out.push_back(parse_dead_letter(e[i].as_string(), text.as_string(), std::stoll(e[i + 1].as_string())));
  }
  co_return out;
}

asio::awaitable<std::optional<dead_letter>> redis_backend::dead_letter_of(std::string queue, std::string id) {
  auto p = key_prefix(queue);
  request req;
  req.push("ZSCORE", p + "dead", id).push("HGET", p + "dead:info", id);
  req.options.resend_safe = true;
  reply r = co_await link_->exec(std::move(req), p);
  const auto& e = r.as_array();
  if (e.at(0).is_nil() || e.at(1).is_nil()) co_return std::nullopt;
  co_return parse_dead_letter(std::move(id), e.at(1).as_string(), std::stoll(e.at(0).as_string()));
}

asio::awaitable<std::vector<std::string>> redis_backend::requeue(std::string queue, std::vector<std::string> ids,
                                                                 bool at_head) {
  std::vector<std::string> out;
  auto p = key_prefix(queue);
  std::array<std::string, 8> keys{p + "ready",  p + "dead",   p + "dead:info", p + "ids",
                                  p + "paused", p + "parked", p + "stats",     p + "jumped"};
  // To the tails in parts; to the heads in one call: a later call's jobs would go in front of an
  // earlier one's. (requeue.lua unpacks nothing, and an operator's call may hold the server a while.)
  const std::size_t part = at_head ? std::max<std::size_t>(ids.size(), 1) : max_batch;
  for (std::size_t first = 0; first < ids.size(); first += part) {
    std::vector<std::string_view> args{at_head ? "head" : "tail"};
    for (std::size_t i = first; i < std::min(ids.size(), first + part); ++i) args.push_back(ids[i]);
    reply r = co_await link_->run(requeue_, requeue_.make_request(keys, args), p);
    for (const auto& id : r.as_array()) out.push_back(id.as_string());
  }
  co_return out;
}

asio::awaitable<std::int64_t> redis_backend::purge(std::string queue, std::vector<std::string> ids) {
  auto p = key_prefix(queue);
  std::array<std::string, 2> keys{p + "dead", p + "dead:info"};
  reply r = co_await link_->run(purge_, purge_.make_request(keys, ids), p);
  co_return r.as_integer();
}

asio::awaitable<bool> redis_backend::pause(std::string queue, std::string group) {
  auto p = key_prefix(queue);
  std::array<std::string, 4> keys{p + "ready", p + "paused", p + "parked", p + "delayed"};
  auto now = std::chrono::milliseconds(detail::unix_ms());
  std::array<std::string, 2> args{group, fmt::format(R"({{"state":"paused","at":{}}})", now.count())};
  reply r = co_await link_->run(pause_, pause_.make_request(keys, args), p);
  co_return r.as_integer() == 1;
}

asio::awaitable<bool> redis_backend::resume(std::string queue, std::string group, resume_mode mode) {
  auto p = key_prefix(queue);
  std::array<std::string, 9> keys{p + "ready", p + "paused", p + "parked", p + "dead",  p + "dead:info",
                                  p + "ids",   p + "stats",  p + "fence",  p + "jumped"};
  std::array<std::string, 2> args{group, mode == resume_mode::skip ? "skip" : "retry"};
  reply r = co_await link_->run(resume_, resume_.make_request(keys, args), p);
  co_return r.as_integer() == 1;
}

namespace {

// A group's entry of `paused` (pause.lua, finish.lua's halt).
paused_group paused_of(std::string group, std::string_view entry) {
  paused_group g;
  g.group = std::move(group);
  boost::system::error_code ec;
  auto v = boost::json::parse(entry, ec);
  if (!ec && v.is_object()) {
    auto& o = v.as_object();
    if (auto* s = o.if_contains("state"); s && s->is_string()) g.halted = s->as_string() == "halted";
    if (auto* m = o.if_contains("error"); m && m->is_string()) g.error = std::string(m->as_string());
    if (auto* at = o.if_contains("at"); at && at->is_number()) g.at_ms = at->to_number<std::int64_t>();
  }
  return g;
}

}  // namespace

asio::awaitable<std::vector<paused_group>> redis_backend::paused_groups(std::string queue) {
  // HSCAN in pages, not HGETALL: an operator may have paused a great many groups.
  auto p = key_prefix(queue);
  std::vector<paused_group> out;
  std::unordered_set<std::string> seen;
  std::string cursor = "0";
  do {
    request req("HSCAN", p + "paused", cursor, "COUNT", 1000);
    req.options.resend_safe = true;
    reply r = co_await link_->exec(std::move(req), p);
    cursor = r.as_array().at(0).as_string();
    const auto& e = r.as_array().at(1).as_array();
    for (std::size_t i = 0; i + 1 < e.size(); i += 2) {
      if (!seen.insert(e[i].as_string()).second) continue;
      out.push_back(paused_of(e[i].as_string(), e[i + 1].as_string()));
    }
  } while (cursor != "0");
  std::sort(out.begin(), out.end(), [](const paused_group& a, const paused_group& b) { return a.group < b.group; });
  co_return out;
}

asio::awaitable<std::int64_t> redis_backend::group_size(std::string queue, std::string group) {
  auto p = key_prefix(queue);
  // Its pending jobs, and those running while it runs several at once (which left its list).
  request req;
  req.push("LLEN", p + "g:" + group).push("HGET", p + "running", group);
  req.options.resend_safe = true;
  reply r = co_await link_->exec(std::move(req), p);
  const auto& e = r.as_array();
  std::int64_t running = 0;
  if (!e.at(1).is_nil()) {
    auto text = e.at(1).as_string();
    std::from_chars(text.data(), text.data() + text.size(), running);
  }
  co_return e.at(0).as_integer() + running;
}

namespace {

// check's walk: every structure of a queue read in pages, each call bounded (a list's page, a
// SCAN step) so that no call holds the server up, however big the queue is.
constexpr std::size_t walk_page = 1000;
// How far check_fix.lua searches a long list from each end in one call: LPOS compares about 45
// million entries a second here, so two searches of this many take about 10 ms.
constexpr std::size_t search_bound = 200000;

// A SCAN MATCH pattern matching `text` literally (a queue's name may hold glob characters).
std::string glob_literal(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// (`route`: any key of the queue, for the node that serves it)
asio::awaitable<reply> read(detail::redis_link& link, request req, const std::string& route, std::int64_t& calls) {
  req.options.resend_safe = true;
  calls += static_cast<std::int64_t>(req.size());
  co_return co_await link.exec(std::move(req), route);
}

// A whole list, page by page; on a list that changes meanwhile an entry may be missed or read
// twice (check confirms what it suspects).
asio::awaitable<std::vector<std::string>> read_list(detail::redis_link& link, std::string key, std::int64_t& calls) {
  std::vector<std::string> out;
  for (std::size_t at = 0;; at += walk_page) {
    reply r = co_await read(link, request("LRANGE", key, at, at + walk_page - 1), key, calls);
    for (auto& e : r.as_array()) out.push_back(e.as_string());
    if (r.as_array().size() < walk_page) co_return out;
  }
}

// A whole set, zset or hash by (S|Z|H)SCAN: every element present from start to end is seen at
// least once; `stride` 2 keeps the members of a zset's or hash's pairs.
asio::awaitable<std::vector<std::string>> read_scan(detail::redis_link& link, std::string_view command, std::string key,
                                                    std::size_t stride, std::int64_t& calls) {
  std::vector<std::string> out;
  std::unordered_set<std::string> seen;
  std::string cursor = "0";
  do {
    reply r = co_await read(link, request(command, key, cursor, "COUNT", walk_page), key, calls);
    cursor = r.as_array().at(0).as_string();
    const auto& items = r.as_array().at(1).as_array();
    for (std::size_t i = 0; i < items.size(); i += stride)
      if (seen.insert(items[i].as_string()).second) out.push_back(items[i].as_string());
  } while (cursor != "0");
  co_return out;
}

asio::awaitable<std::vector<std::string>> read_stats(detail::redis_link& link, const std::string& key,
                                                     std::int64_t& calls) {
  reply r = co_await read(link, request("HGETALL", key), key, calls);
  std::vector<std::string> out;
  for (auto& e : r.as_array()) out.push_back(e.as_string());
  co_return out;
}

asio::awaitable<detail::queue_walk> walk(detail::redis_link& link, std::string p, std::vector<std::string>& stats) {
  detail::queue_walk w;
  stats = co_await read_stats(link, p + "stats", w.calls);
  w.ready = co_await read_list(link, p + "ready", w.calls);
  for (int level : detail::priority_levels)
    w.levels.emplace_back(std::to_string(level), co_await read_list(link, detail::level_key(p, level), w.calls));
  // The queue's group lists and claimed lists: one SCAN of its keys, a page at a time.
  std::vector<std::string> groups, claimed;
  std::unordered_set<std::string> keys;
  std::string cursor = "0";
  do {
    reply r =
        co_await read(link, request("SCAN", cursor, "MATCH", glob_literal(p) + "*", "COUNT", walk_page), p, w.calls);
    cursor = r.as_array().at(0).as_string();
    for (auto& k : r.as_array().at(1).as_array()) {
      std::string_view name = std::string_view(k.as_string()).substr(p.size());
      if (!keys.insert(k.as_string()).second) continue;
      if (name.starts_with("g:")) groups.emplace_back(name.substr(2));
      if (name.starts_with("claimed:")) claimed.emplace_back(name.substr(8));
    }
  } while (cursor != "0");
  for (auto& worker : claimed)
    w.claimed.emplace_back(worker, co_await read_list(link, p + "claimed:" + worker, w.calls));
  w.delayed = co_await read_scan(link, "ZSCAN", p + "delayed", 2, w.calls);
  w.active = co_await read_scan(link, "ZSCAN", p + "active", 2, w.calls);
  w.parked = co_await read_scan(link, "SSCAN", p + "parked", 1, w.calls);
  w.full = co_await read_scan(link, "SSCAN", p + "full", 1, w.calls);
  std::string cursor_of_running = "0";  // (a hash's fields with their values)
  do {
    reply r = co_await read(link, request("HSCAN", p + "running", cursor_of_running, "COUNT", walk_page), p, w.calls);
    cursor_of_running = r.as_array().at(0).as_string();
    const auto& items = r.as_array().at(1).as_array();
    for (std::size_t i = 0; i + 1 < items.size(); i += 2) {
      std::int64_t n = 0;
      auto text = items[i + 1].as_string();
      std::from_chars(text.data(), text.data() + text.size(), n);
      w.running[items[i].as_string()] = n;
    }
  } while (cursor_of_running != "0");
  for (auto& g : co_await read_scan(link, "HSCAN", p + "paused", 2, w.calls)) w.paused.insert(std::move(g));
  for (auto& worker : co_await read_scan(link, "ZSCAN", p + "workers", 2, w.calls)) w.workers.insert(std::move(worker));
  // Groups in pipelines of up to 100 first pages of 100 records; a longer group reads on alone.
  for (std::size_t first = 0; first < groups.size(); first += 100) {
    auto last = std::min(groups.size(), first + 100);
    request req;
    for (auto i = first; i < last; ++i) req.push("LRANGE", p + "g:" + groups[i], 0, 99);
    reply r = co_await read(link, std::move(req), p, w.calls);
    for (auto i = first; i < last; ++i) {
      const auto& head = req.size() == 1 ? r : r.as_array().at(i - first);
      std::vector<std::string> records;
      for (auto& e : head.as_array()) records.push_back(e.as_string());
      if (records.size() == 100) {
        for (std::size_t at = 100;; at += walk_page) {
          reply more = co_await read(link, request("LRANGE", p + "g:" + groups[i], at, at + walk_page - 1), p, w.calls);
          for (auto& e : more.as_array()) records.push_back(e.as_string());
          if (more.as_array().size() < walk_page) break;
        }
      }
      w.groups.emplace_back(groups[i], std::move(records));
    }
  }
  w.ids = co_await read_scan(link, "SSCAN", p + "ids", 1, w.calls);
  auto after = co_await read_stats(link, p + "stats", w.calls);
  if (after == stats) {  // nothing changed the count while the walk went on
    for (std::size_t i = 0; i + 1 < stats.size(); i += 2)
      if (stats[i] == "groups") w.counted_groups = std::stoll(stats[i + 1]);
    if (!w.counted_groups) w.counted_groups = 0;
  }
  co_return w;
}

// Runs check_fix.lua once; returns the problems it confirmed, each {code, values...}.
asio::awaitable<std::vector<std::vector<reply>>> confirm_one(detail::redis_link& link, const redis::script& fix,
                                                             const std::array<std::string, 8>& keys,
                                                             std::vector<std::string> args, check_report& out) {
  reply r = co_await link.run(fix, fix.make_request(keys, args), keys[0]);
  ++out.calls;
  auto& e = r.as_array();
  out.stuck_groups += e.at(0).as_integer();
  out.repaired += e.at(1).as_integer();
  std::vector<std::vector<reply>> problems;
  for (std::size_t i = 2; i < e.size(); ++i) problems.push_back(std::move(e[i].as_array()));
  co_return problems;
}

}  // namespace

asio::awaitable<check_report> redis_backend::check(std::string queue, bool repair) {
  auto p = key_prefix(queue);
  std::vector<std::string> stats;
  auto w = co_await walk(*link_, p, stats);
  check_report out;
  auto suspects = detail::analyse(w, out);
  out.calls = w.calls;
  if (!suspects.ids.empty()) {  // an ungrouped job may have moved past the walk: look again
    std::vector<std::string> ignored;
    auto again = co_await walk(*link_, p, ignored);
    out.calls += again.calls;
    suspects.ids = detail::missing_twice(suspects.ids, again);
  }
  std::array<std::string, 8> keys{p + "ready",  p + "active", p + "delayed", p + "paused",
                                  p + "parked", p + "ids",    p + "workers", p + "stats"};
  std::vector<std::string> claimed_workers;
  for (auto& [worker, lanes] : w.claimed) claimed_workers.push_back(worker);
  // One confirmation by check_fix.lua: the problems it confirmed, each {code, values...}.
  // (GCC 12 miscompiles an initializer list in a coroutine: the arguments are built by a
  // function that is not one.)
  auto confirm = [&](std::string what, auto... rest) {
    std::vector<std::string> args{repair ? "1" : "0", std::move(what), std::to_string(search_bound)};
    auto add = [&](auto&& r) {
      if constexpr (std::is_convertible_v<decltype(r), std::string_view>)
        args.emplace_back(r);
      else
        args.insert(args.end(), r.begin(), r.end());
    };
    (add(rest), ...);
    return confirm_one(*link_, check_fix_, keys, std::move(args), out);
  };
  for (auto& group : suspects.groups) {
    auto found = co_await confirm("group", group, claimed_workers);
    for (auto& r : found) {
      const auto& code = r.at(0).as_string();
      if (code == "stuck") {
        out.problems.push_back(detail::stuck_problem(group, r.at(1).as_integer()));
      } else if (code == "parked") {
        out.problems.push_back(detail::parked_problem(group));
      } else if (code == "empty") {
        out.problems.push_back(detail::empty_group_problem(group, r.at(1).as_string()));
      } else if (code == "runs") {
        out.problems.push_back(detail::runs_problem(group, r.at(1).as_integer(), r.at(2).as_integer()));
      } else if (code == "unsure") {
        out.problems.push_back(
            fmt::format("group {} has jobs and no lane, lease or parked lane in what one call searches (a list of "
                        "ready lanes holds {}; its first and last {} were searched): not confirmed",
                        group, r.at(1).as_integer(), search_bound));
      } else {
        std::vector<std::string> where;
        for (std::size_t i = 1; i < r.size(); ++i) where.push_back(r[i].as_string());
        out.problems.push_back(detail::lanes_problem(group, where));
      }
    }
  }
  for (auto& c : suspects.copies) {
    std::vector<std::string> args{c.id,         c.first.name(), c.first.key, c.first.member, c.second.name(),
                                  c.second.key, c.second.member};
    if (!(co_await confirm("copy", std::move(args))).empty())
      out.problems.push_back(detail::copy_problem(c.id, c.first, c.second));
  }
  for (auto& worker : suspects.dead_workers) {
    auto found = co_await confirm("worker", worker);
    for (auto& r : found)
      out.problems.push_back(detail::dead_worker_problem(worker, static_cast<std::size_t>(r.at(1).as_integer())));
  }
  for (auto& id : suspects.ids) {
    auto found = co_await confirm("id", id);
    if (!found.empty()) out.problems.push_back(detail::id_problem(id));
  }
  if (suspects.groups_seen) {
    auto found = co_await confirm("count", std::to_string(*suspects.groups_seen), stats);
    for (auto& r : found) out.problems.push_back(detail::count_problem(r.at(1).as_integer(), r.at(2).as_integer()));
  }
  co_return out;
}

asio::awaitable<std::size_t> redis_backend::stored_shards(std::string queue, std::size_t wanted) {
  auto p = key_prefix(queue);
  request req;
  if (wanted > 0) req.push("SET", p + "shards", wanted, "NX");
  req.push("GET", p + "shards");
  req.options.resend_safe = true;
  reply r = co_await link_->exec(std::move(req), p);
  const reply& got = wanted > 0 ? r.as_array().at(1) : r;
  if (got.is_nil()) co_return 0;
  std::size_t stored = 0;
  auto text = got.as_string();
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), stored);
  if (ec != std::errc{} || end != text.data() + text.size() || stored == 0)
    throw boost::system::system_error(errc::shards_mismatch,
                                      fmt::format("{}shards holds '{}', which is not a number of shards", p, text));
  std::lock_guard lock(shards_mutex_);
  shards_.insert_or_assign(queue, stored);
  co_return stored;
}

asio::awaitable<void> redis_backend::mark_shards(std::string queue, std::vector<std::size_t> shards) {
  if (shards.empty()) co_return;
  auto p = key_prefix(queue);
  auto now = std::chrono::milliseconds(detail::unix_ms());
  std::vector<std::string> scored;  // score, member, ...
  scored.reserve(shards.size() * 2);
  for (auto shard : shards) {
    scored.push_back(std::to_string(now.count()));
    scored.push_back(std::to_string(shard));
  }
  request req("ZADD", p + "marks", "NX", scored);
  req.options.resend_safe = true;
  co_await link_->exec(std::move(req), p);
}

namespace {
std::optional<std::size_t> shard_in(const reply& member) {
  std::size_t k = 0;
  auto text = member.as_string();
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), k);
  if (ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return k;
}
}  // namespace

asio::awaitable<std::optional<std::size_t>> redis_backend::take_shard_mark(std::string queue, std::string worker,
                                                                           std::chrono::milliseconds wait) {
  auto p = key_prefix(queue);
  if (wait.count() <= 0) {  // (BZPOPMIN with timeout 0 would block for ever)
    reply r = co_await link_->exec(request("ZPOPMIN", p + "marks"), p);
    if (r.kind() != redis::reply_kind::array || r.as_array().size() < 2) co_return std::nullopt;
    co_return shard_in(r.as_array()[0]);
  }
  request pop("BZPOPMIN", p + "marks", fmt::format("{:.3f}", static_cast<double>(wait.count()) / 1000.0));
  pop.options.timeout = wait + cfg_.health_interval * 2 + std::chrono::seconds(1);
  // (A mark taken just as a stop comes still comes back: the caller marks it again.)
  auto waited = co_await exec_blocking(worker, p, std::move(pop));
  auto& r = waited.r;
  if (waited.ec) {
    if (auto* cluster = co_await link_->cluster()) co_await cluster->refresh();  // (its node may have died)
    co_return std::nullopt;  // the connection dropped: the caller comes again
  }
  if (r.is_error()) {
    auto* cluster = co_await link_->cluster();
    if (!cluster || redis::detail::classify(r.error_message()).kind == redis::detail::cluster_error::other)
      throw boost::system::system_error(errc::server_error,
                                        fmt::format("BZPOPMIN on {} refused: {}", waited.address, r.error_message()));
    co_await cluster->refresh();  // the queue's slot moved: the next wait goes where it is now
    co_return std::nullopt;
  }
  if (r.kind() != redis::reply_kind::array || r.as_array().size() < 3) co_return std::nullopt;
  co_return shard_in(r.as_array()[1]);
}

asio::awaitable<bool> redis_backend::has_ready(std::string queue) {
  auto p = key_prefix(queue);
  request req("LLEN", p + "ready");
  req.options.resend_safe = true;
  reply r = co_await link_->exec(std::move(req), p);
  co_return r.as_integer() > 0;
}

asio::awaitable<void> redis_backend::note_leases(std::string queue,
                                                 std::vector<std::pair<std::string, std::int64_t>> until) {
  if (until.empty()) co_return;
  auto p = key_prefix(queue);
  std::vector<std::string> scored;
  for (auto& [member, at] : until) {
    scored.push_back(std::to_string(at));
    scored.push_back(std::move(member));
  }
  request req("ZADD", p + "leased", "GT", scored);
  req.options.resend_safe = true;  // (GT: the same times twice change nothing)
  co_await link_->exec(std::move(req), p);
}

asio::awaitable<std::optional<std::vector<std::string>>> redis_backend::take_reap_turn(std::string queue,
                                                                                       std::string holder,
                                                                                       std::chrono::milliseconds ttl,
                                                                                       std::int64_t now_ms) {
  auto p = key_prefix(queue);
  std::array<std::string, 2> keys{p + "turn:reap", p + "leased"};
  std::array<std::string, 3> args{std::move(holder), std::to_string(ttl.count()), std::to_string(now_ms)};
  // (Sent again after a lost reply, the entries it took are gone: the holder's walk over the
  // shards, one a turn, reaps them in time.)
  auto req = reap_turn_.make_request(keys, args);
  reply r = co_await link_->run(reap_turn_, std::move(req), p);
  const auto& e = r.as_array();
  if (e.empty() || e[0].as_integer() != 1) co_return std::nullopt;
  std::vector<std::string> due;
  for (std::size_t i = 1; i < e.size(); ++i) due.push_back(e[i].as_string());
  co_return due;
}

asio::awaitable<std::int64_t> redis_backend::purge_queue(std::string queue) {
  // SCAN of the queue's keys and UNLINK of each page (freed in the background): every call is
  // bounded, however big the queue. A key SCAN returns twice is unlinked twice, harmlessly. The
  // fence and id counters stay: a lease token ('<fence>|<lane>') or an id given out before must
  // never be given out again, or a worker that held a lease then could take a new one for its own.
  auto prefix = key_prefix(queue);
  auto pattern = glob_literal(prefix) + "*";
  std::int64_t removed = 0;
  std::string cursor = "0";
  do {
    request scan("SCAN", cursor, "MATCH", pattern, "COUNT", walk_page);
    scan.options.resend_safe = true;
    reply r = co_await link_->exec(std::move(scan), prefix);
    cursor = r.as_array().at(0).as_string();
    std::vector<std::string> keys;
    for (auto& k : r.as_array().at(1).as_array())
      if (k.as_string() != prefix + "fence" && k.as_string() != prefix + "seq") keys.push_back(k.as_string());
    if (keys.empty()) continue;
    request unlink("UNLINK", keys);
    unlink.options.resend_safe = true;
    removed += (co_await link_->exec(std::move(unlink), prefix)).as_integer();
  } while (cursor != "0");
  co_return removed;
}

// --- the operators' views ---

asio::awaitable<void> redis_backend::report_worker(std::string queue, worker_report report,
                                                   std::chrono::milliseconds ttl) {
  auto p = key_prefix(queue);
  std::array<std::string, 2> keys{p + "reports", p + "reports:until"};
  std::array<std::string, 3> args{report.id, std::to_string(ttl.count()), detail::report_json(report)};
  co_await link_->run(reports_, reports_.make_request(keys, args), p);
}

asio::awaitable<page<worker_report>> redis_backend::workers(std::string queue, std::string cursor, std::size_t limit) {
  auto p = key_prefix(queue);
  if (cursor.empty()) cursor = "0";
  if (!scan_cursor(cursor))
    throw std::invalid_argument("worker cursor '" + cursor + "' is not one that a listing gave");
  // Read only (a replica or a read-only user may list): the reports that ran out are skipped by
  // the server's clock, and removed by the next report (reports.lua).
  request req;
  req.push("TIME").push("HSCAN", p + "reports", cursor, "COUNT", std::max<std::size_t>(limit, 1));
  req.options.resend_safe = true;
  reply r = co_await link_->exec(std::move(req), p);
  auto now = server_ms(r.as_array().at(0));
  const auto& scan = r.as_array().at(1).as_array();
  page<worker_report> out;
  if (scan.at(0).as_string() != "0") out.cursor = scan.at(0).as_string();
  const auto& found = scan.at(1).as_array();
  for (std::size_t i = 0; i + 1 < found.size(); i += 2) {
    std::string_view entry = found[i + 1].as_string();
    auto first = entry.find('|');
    auto second = first == std::string_view::npos ? first : entry.find('|', first + 1);
    if (second == std::string_view::npos) continue;
    std::int64_t until = 0;
    std::from_chars(entry.data(), entry.data() + first, until);
    if (until <= now) continue;
    auto report = detail::parse_report(entry.substr(second + 1));
    std::from_chars(entry.data() + first + 1, entry.data() + second, report.at_ms);
    out.items.push_back(std::move(report));
  }
  co_return out;
}

asio::awaitable<bool> redis_backend::claim_history(std::string queue) {
  auto p = key_prefix(queue);
  std::array<std::string, 2> keys{p + "history", p + "history:claim"};
  std::array<std::string, 1> args{"claim"};
  reply r = co_await link_->run(history_, history_.make_request(keys, args), p);
  co_return r.as_integer() == 1;
}

asio::awaitable<bool> redis_backend::record_history(std::string queue, queue_counts counts) {
  auto p = key_prefix(queue);
  std::array<std::string, 2> keys{p + "history", p + "history:claim"};
  std::array<std::string, 2> args{"put", detail::counts_json(counts)};
  reply r = co_await link_->run(history_, history_.make_request(keys, args), p);
  co_return r.as_integer() == 1;
}

asio::awaitable<std::vector<history_point>> redis_backend::history(std::string queue, std::chrono::minutes span) {
  auto p = key_prefix(queue);
  auto now = std::chrono::milliseconds(detail::unix_ms());
  auto from = now.count() - std::min<std::int64_t>(span.count() * detail::minute_ms, detail::history_keep_ms);
  // (At most a point a minute: a day's is 1,440 entries.)
  request req("ZRANGE", p + "history", std::to_string(from), "+inf", "BYSCORE");
  req.options.resend_safe = true;
  reply r = co_await link_->exec(std::move(req), p);
  std::vector<history_point> out;
  for (const auto& e : r.as_array()) {
    std::string_view entry = e.as_string();
    auto bar = entry.find('|');
    if (bar == std::string_view::npos) continue;
    history_point point;
    std::from_chars(entry.data(), entry.data() + bar, point.minute_ms);
    point.counts = detail::parse_counts(entry.substr(bar + 1));
    out.push_back(point);
  }
  co_return out;
}

asio::awaitable<page<std::string>> redis_backend::groups(std::string queue, std::string prefix, std::string cursor,
                                                         std::size_t limit) {
  auto p = key_prefix(queue);
  // Two walks in SCAN steps (each bounded), at most ten steps a page (about 5,000 keys or fields
  // of the server's looked at): the queue's group lists (SCAN), then the groups that run several
  // jobs at once (HSCAN of `running`, cursor 'r<n>'), for those whose jobs all run have no list.
  // A group in both is listed twice: leaving out those with a list when the second walk meets
  // them would miss one whose list came after the first walk passed it. A prefix few groups
  // have ends a page with fewer than asked and a cursor. The first step's COUNT is the limit,
  // and each next one's four times the last's (up to 1,000), so that a page holds about `limit`
  // groups (a step returns what it found: a page may hold some more, and a small `running`,
  // stored compactly, comes whole in one step).
  bool runs = cursor.starts_with('r');
  std::string at = runs ? cursor.substr(1) : cursor.empty() ? "0" : cursor;
  if (!scan_cursor(at)) throw std::invalid_argument("group cursor '" + cursor + "' is not one that a listing gave");
  limit = std::max<std::size_t>(limit, 1);
  auto lists = glob_literal(p + "g:" + prefix) + "*";
  auto names = glob_literal(prefix) + "*";
  page<std::string> out;
  std::size_t count = std::clamp<std::size_t>(limit, 10, 1000);
  for (int step = 0; step < 10 && out.items.size() < limit; ++step, count = std::min<std::size_t>(count * 4, 1000)) {
    request req;
    if (runs)
      req.push("HSCAN", p + "running", at, "MATCH", names, "COUNT", count);
    else
      req.push("SCAN", at, "MATCH", lists, "COUNT", count);
    req.options.resend_safe = true;
    reply r = co_await link_->exec(std::move(req), p);
    at = r.as_array().at(0).as_string();
    const auto& found = r.as_array().at(1).as_array();
    if (!runs) {
      for (const auto& k : found) out.items.emplace_back(std::string_view(k.as_string()).substr(p.size() + 2));
    } else {
      for (std::size_t i = 0; i < found.size(); i += 2) out.items.emplace_back(found[i].as_string());  // (field, count)
    }
    if (at != "0") continue;
    if (runs) co_return out;
    runs = true;
  }
  out.cursor = (runs ? "r" : "") + at;
  co_return out;
}

asio::awaitable<std::optional<kept_job>> redis_backend::kept_job_of(std::string queue, std::string id) {
  auto p = key_prefix(queue);
  request req;
  req.push("HGET", p + "jobs", id).push("ZSCORE", p + "done", id).push("TIME");
  req.options.resend_safe = true;
  reply r = co_await link_->exec(std::move(req), p);
  const auto& e = r.as_array();
  if (e.at(0).is_nil()) co_return std::nullopt;
  std::optional<std::int64_t> gone_at;
  if (!e.at(1).is_nil()) gone_at = std::stoll(e.at(1).as_string());
  co_return detail::parse_kept_entry(std::move(id), e.at(0).as_string(), server_ms(e.at(2)), gone_at);
}

asio::awaitable<cancel_outcome> redis_backend::cancel(std::string queue, std::string id) {
  auto p = key_prefix(queue);
  std::array<std::string, 1> keys{p + "jobs"};
  std::array<std::string, 1> args{std::move(id)};
  reply r = co_await link_->run(cancel_, cancel_.make_request(keys, args), p);
  const auto& was = r.as_string();
  if (was == "p" || was == "d") co_return cancel_outcome::cancelled;
  if (was == "c") co_return cancel_outcome::done;
  co_return was.empty() ? cancel_outcome::not_found : cancel_outcome::already;
}

asio::awaitable<std::vector<bool>> redis_backend::cancelled(std::string queue, std::vector<held_job> jobs) {
  std::vector<bool> out;
  if (jobs.empty()) co_return out;
  auto p = key_prefix(queue);
  std::vector<std::string_view> ids;
  for (auto& j : jobs) ids.push_back(j.id);
  request req;
  req.push("HMGET", p + "jobs", ids);
  req.options.resend_safe = true;
  reply r = co_await link_->exec(std::move(req), p);
  for (const auto& e : r.as_array()) {
    auto state = e.is_nil() ? std::string_view() : std::string_view(e.as_string());
    out.push_back(state.starts_with('n') || state.starts_with('k'));
  }
  co_return out;
}

asio::awaitable<group_status> redis_backend::group_of(std::string queue, std::string group) {
  auto p = key_prefix(queue);
  auto list = p + "g:" + group;
  request req;
  req.push("LLEN", list)
      .push("LINDEX", list, 0)
      .push("HGET", p + "paused", group)
      .push("SISMEMBER", p + "parked", group)
      .push("ZSCORE", p + "delayed", "g:" + group)
      .push("HGET", p + "running", group);
  req.options.resend_safe = true;
  reply r = co_await link_->exec(std::move(req), p);
  const auto& e = r.as_array();
  group_status out;
  if (!e.at(5).is_nil()) out.running = std::stoll(e.at(5).as_string());
  out.depth = e.at(0).as_integer() + out.running;
  if (!e.at(1).is_nil()) out.head = detail::split_record(e.at(1).as_string());
  if (!e.at(2).is_nil()) out.paused = paused_of(group, e.at(2).as_string());
  out.parked = e.at(3).as_integer() == 1;
  if (!e.at(4).is_nil()) out.waiting_until_ms = std::stoll(e.at(4).as_string());
  out.group = std::move(group);
  co_return out;
}

asio::awaitable<page<dead_letter>> redis_backend::find_dead(std::string queue, dead_filter filter, std::string cursor,
                                                            std::size_t limit) {
  auto p = key_prefix(queue);
  auto from = detail::parse_dead_cursor(cursor);
  detail::dead_cursor at = from.value_or(detail::dead_cursor{});
  bool started = from.has_value();
  page<dead_letter> out;
  std::size_t looked = 0;
  constexpr std::size_t step = 500;
  limit = std::max<std::size_t>(limit, 1);
  // Newest first (ZRANGE BYSCORE REV), from the cursor: the letters of its time past those seen
  // (at most as many as there are: a letter of that time requeued meanwhile skips no older one),
  // then the older ones, in one round trip; their texts by HMGET; up to dead_scan_bound letters
  // a call.
  for (;;) {
    // Right after the letter last seen, by its rank, while it is there (with the time it had).
    std::optional<std::int64_t> rank;
    if (started) {
      request where;
      where.push("ZREVRANK", p + "dead", at.last_id).push("ZSCORE", p + "dead", at.last_id);
      where.options.resend_safe = true;
      reply w = co_await link_->exec(std::move(where), p);
      const auto& e = w.as_array();
      if (!e.at(0).is_nil() && !e.at(1).is_nil() && std::stoll(e.at(1).as_string()) == at.at_ms)
        rank = e.at(0).as_integer();
    }
    request req;
    if (rank) {
      req.push("ZRANGE", p + "dead", *rank + 1, *rank + static_cast<std::int64_t>(step), "REV", "WITHSCORES");
    } else if (started) {
      auto t = std::to_string(at.at_ms);
      req.push("ZRANGE", p + "dead", t, t, "BYSCORE", "REV", "LIMIT", at.skip, step, "WITHSCORES")
          .push("ZRANGE", p + "dead", "(" + t, "-inf", "BYSCORE", "REV", "LIMIT", 0, step, "WITHSCORES");
    } else {
      req.push("ZRANGE", p + "dead", "+inf", "-inf", "BYSCORE", "REV", "LIMIT", 0, step, "WITHSCORES");
    }
    req.options.resend_safe = true;
    reply r = co_await link_->exec(std::move(req), p);
    std::vector<reply> e;  // (member, score) pairs, at most a step's
    auto take = [&](reply& part) {
      for (auto& x : part.as_array())
        if (e.size() < 2 * step) e.push_back(std::move(x));
    };
    if (started && !rank) {
      take(r.as_array().at(0));
      take(r.as_array().at(1));
    } else {
      take(r);
    }
    if (e.empty()) co_return out;  // the end: no cursor
    std::vector<std::string_view> names;
    for (std::size_t i = 0; i + 1 < e.size(); i += 2) names.push_back(e[i].as_string());
    request infos("HMGET", p + "dead:info", names);
    infos.options.resend_safe = true;
    reply info = co_await link_->exec(std::move(infos), p);
    const auto& texts = info.as_array();
    for (std::size_t i = 0; i + 1 < e.size(); i += 2) {
      if (out.items.size() == limit || looked == detail::dead_scan_bound) {
        out.cursor = detail::to_string(at);
        co_return out;
      }
      ++looked;
      std::int64_t ms = std::stoll(e[i + 1].as_string());
      if (started && ms == at.at_ms) {
        ++at.skip;
      } else {
        at.at_ms = ms;  // (no braced list in a coroutine: GCC 12)
        at.skip = 1;
        started = true;
      }
      at.last_id = e[i].as_string();
      const auto& text = texts.at(i / 2);
      if (text.is_nil()) continue;  // purged meanwhile
      auto d = parse_dead_letter(e[i].as_string(), text.as_string(), ms);
      if (detail::passes(filter, d)) out.items.push_back(std::move(d));
    }
    if (e.size() / 2 < step) co_return out;
  }
}

}  // namespace jobrt
