#include <jobrt/redis_backend.hpp>

#include "backend/lua_scripts.hpp"

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <atomic>
#include <charconv>
#include <random>

namespace jobrt {
namespace {

namespace asio = boost::asio;
using redis::reply;
using redis::request;

// A token is '<fence>|<lane>'; an ungrouped lane carries the record: 'j:<record>'.
claimed_job from_token(std::string token, const reply& record) {
  claimed_job out;
  auto bar = token.find('|');
  std::from_chars(token.data(), token.data() + bar, out.fence);
  std::string_view lane = std::string_view(token).substr(bar + 1);
  if (lane.starts_with("g:")) {
    out.group = std::string(lane.substr(2));
    out.record = record.as_string();
  } else {
    out.record = std::string(lane.substr(2));
  }
  out.token = std::move(token);
  return out;
}

std::vector<claimed_job> parse_claimed(const reply& r) {
  std::vector<claimed_job> out;
  const auto& e = r.as_array();
  out.reserve(e.size() / 2);
  for (std::size_t i = 0; i + 1 < e.size(); i += 2) out.push_back(from_token(e[i].as_string(), e[i + 1]));
  return out;
}

}  // namespace

redis_backend::redis_backend(asio::any_io_executor ex, redis::config cfg)
    : ex_(ex),
      cfg_(std::move(cfg)),
      conn_(ex, cfg_),
      enqueue_(lua::enqueue),
      claim_(lua::claim),
      finish_(lua::finish),
      extend_(lua::extend),
      release_(lua::release),
      reap_(lua::reap) {
  conn_.start();
}

redis_backend::~redis_backend() = default;

std::string redis_backend::key_prefix(std::string_view queue) { return fmt::format("jobrt:{{{}}}:", queue); }

asio::awaitable<std::vector<enqueue_result>> redis_backend::enqueue(std::string queue, std::vector<encoded_job> jobs) {
  if (jobs.empty()) co_return std::vector<enqueue_result>{};
  auto p = key_prefix(queue);
  std::vector<std::string_view> args;
  args.reserve(1 + jobs.size() * 3);
  std::string n = std::to_string(jobs.size());
  args.push_back(n);
  for (auto& j : jobs) {
    args.push_back(j.id);
    args.push_back(j.group);
    args.push_back(j.body);
  }
  std::array<std::string, 4> keys{p + "ready", p + "seq", p + "ids", p + "stats"};
  reply r = co_await enqueue_.run(conn_, keys, args);
  const auto& e = r.as_array();
  std::vector<enqueue_result> out;
  out.reserve(jobs.size());
  for (std::size_t i = 0; i + 1 < e.size(); i += 2) out.push_back({e[i].as_string(), e[i + 1].as_integer() == 1});
  co_return out;
}

// Lua's unpack() takes a few thousand values at most, and a script that fails halfway does not
// roll back: calls stay below that.
constexpr std::size_t max_batch = 1000;

request redis_backend::claim_request(const std::string& p, const claim_options& opts) const {
  std::array<std::string, 5> keys{p + "ready", p + "active", p + "fence", p + "stats", p + "claimed:" + opts.worker};
  std::array<std::string, 2> args{std::to_string(std::min(opts.max, max_batch)),
                                  std::to_string(opts.lease_ttl.count())};
  return claim_.make_request(keys, args);
}

asio::awaitable<std::vector<claimed_job>> redis_backend::claim(std::string queue, claim_options opts) {
  reply r = co_await claim_.run(conn_, claim_request(key_prefix(queue), opts));
  co_return parse_claimed(r);
}

redis::blocking_connection& redis_backend::blocking_for(const std::string& worker) {
  std::lock_guard lock(blocking_mutex_);
  auto& c = blocking_[worker];
  if (!c) {
    auto cfg = cfg_;
    cfg.client_name = fmt::format("{}:blocking", cfg_.client_name);
    c = std::make_unique<redis::blocking_connection>(ex_, cfg);
    c->start();
  }
  return *c;
}

asio::awaitable<std::vector<claimed_job>> redis_backend::claim_wait(std::string queue, claim_options opts,
                                                                    std::chrono::milliseconds wait) {
  // The claim script runs shielded from the caller's cancellation: cut short after it was
  // written, it could lease jobs that nobody would run until their leases expire.
  auto shielded = asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable);
  // Right after a wait that found nothing, the claim below would find nothing either: whatever
  // arrived since makes BLMOVE return at once. So an idle worker sends one claim per wait.
  if (!take_idle_mark(opts.worker)) {
    auto jobs = co_await asio::co_spawn(ex_, claim(queue, opts), shielded);
    if (!jobs.empty() || wait.count() <= 0) co_return jobs;  // (BLMOVE with timeout 0 would block forever)
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
  auto [ec, r] =
      co_await blocking_for(opts.worker).async_exec(std::move(wait_and_claim), asio::as_tuple(asio::use_awaitable));
  if (ec) {
    auto cs = co_await asio::this_coro::cancellation_state;
    if (cs.cancelled() != asio::cancellation_type::none)
      throw boost::system::system_error(asio::error::operation_aborted);
    co_return std::vector<claimed_job>{};  // the connection dropped: the caller comes again
  }
  // A reply in hand wins over a cancellation that came meanwhile: those leases are ours now.
  const auto& claimed = r.as_array().at(1);
  if (claimed.is_error()) {  // NOSCRIPT on that connection's server: claim the usual way, which loads it
    if (!claimed.error_message().starts_with("NOSCRIPT"))
      throw boost::system::system_error(error::server_error, std::string(claimed.error_message()));
    co_return co_await asio::co_spawn(ex_, claim(std::move(queue), std::move(opts)), shielded);
  }
  auto jobs = parse_claimed(claimed);
  if (jobs.empty()) set_idle_mark(opts.worker);
  co_return jobs;
}

std::uint64_t redis_backend::next_call_id() {
  // Unique per call of this process; with the worker in the key, unique enough across processes.
  static std::atomic<std::uint64_t> counter{std::random_device{}()};
  return counter.fetch_add(1, std::memory_order_relaxed);
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
  if (items.empty()) co_return std::vector<finish_result>{};
  if (items.size() > max_batch) {
    std::vector<finish_result> all;
    for (std::size_t first = 0; first < items.size(); first += max_batch) {
      auto last = std::min(items.size(), first + max_batch);
      std::vector<finish_item> part(items.begin() + static_cast<std::ptrdiff_t>(first),
                                    items.begin() + static_cast<std::ptrdiff_t>(last));
      auto done = co_await finish(queue, worker, std::move(part), lease_ttl);
      all.insert(all.end(), std::make_move_iterator(done.begin()), std::make_move_iterator(done.end()));
    }
    co_return all;
  }
  auto p = key_prefix(queue);
  std::array<std::string, 8> keys{p + "ready", p + "active", p + "fence",     p + "stats",
                                  p + "ids",   p + "dead",   p + "dead:info", p + "finished:" + worker};
  std::string ttl = std::to_string(lease_ttl.count()), n = std::to_string(items.size());
  std::string call = fmt::format("{:016x}", next_call_id());
  std::vector<std::string_view> args{ttl, n, call};
  args.reserve(2 + items.size() * 5);
  for (auto& it : items) {
    args.push_back(it.token);
    args.push_back(it.kind == finish_kind::ack ? "a" : "f");
    args.push_back(it.unique_id);
    args.push_back(it.error);
    args.push_back(it.want_next == finish_item::next_policy::yes               ? "1"
                   : it.want_next == finish_item::next_policy::if_nobody_waits ? "2"
                                                                               : "0");
  }
  auto req = finish_.make_request(keys, args);
  req.options.resend_safe = true;  // the script answers a resent call from its cache
  reply r = co_await finish_.run(conn_, std::move(req));
  const auto& e = r.as_array();
  std::vector<finish_result> out;
  out.reserve(items.size());
  for (std::size_t i = 0; i + 2 < e.size(); i += 3) {
    finish_result f;
    f.lease_held = e[i].as_integer() == 1;
    if (!e[i + 1].as_string().empty()) f.next = from_token(e[i + 1].as_string(), e[i + 2]);
    out.push_back(std::move(f));
  }
  co_return out;
}

asio::awaitable<std::vector<bool>> redis_backend::extend(std::string queue, std::string worker,
                                                         std::vector<std::string> tokens,
                                                         std::chrono::milliseconds lease_ttl) {
  if (tokens.size() > max_batch) {
    std::vector<bool> all;
    for (std::size_t first = 0; first < tokens.size(); first += max_batch) {
      auto last = std::min(tokens.size(), first + max_batch);
      std::vector<std::string> part(tokens.begin() + static_cast<std::ptrdiff_t>(first),
                                    tokens.begin() + static_cast<std::ptrdiff_t>(last));
      auto held = co_await extend(queue, worker, std::move(part), lease_ttl);
      all.insert(all.end(), held.begin(), held.end());
    }
    co_return all;
  }
  auto p = key_prefix(queue);
  std::array<std::string, 2> keys{p + "active", p + "workers"};
  std::string ttl = std::to_string(lease_ttl.count());
  std::vector<std::string_view> args{worker, ttl};
  for (auto& t : tokens) args.push_back(t);
  reply r = co_await extend_.run(conn_, keys, args);
  std::vector<bool> out;
  for (const auto& e : r.as_array()) out.push_back(e.as_integer() == 1);
  co_return out;
}

asio::awaitable<void> redis_backend::release(std::string queue, std::string worker, std::vector<std::string> tokens) {
  auto p = key_prefix(queue);
  std::array<std::string, 4> keys{p + "ready", p + "active", p + "stats", p + "claimed:" + worker};
  co_await release_.run(conn_, keys, tokens);
}

asio::awaitable<reap_result> redis_backend::reap(std::string queue, std::size_t max) {
  auto p = key_prefix(queue);
  std::array<std::string, 4> keys{p + "ready", p + "active", p + "stats", p + "workers"};
  std::array<std::string, 1> args{std::to_string(max)};
  reply r = co_await reap_.run(conn_, keys, args);
  const auto& e = r.as_array();
  co_return reap_result{e.at(0).as_integer(), e.at(1).as_integer(), e.at(2).as_integer()};
}

asio::awaitable<queue_counts> redis_backend::counts(std::string queue) {
  auto p = key_prefix(queue);
  request req;
  req.push("LLEN", p + "ready").push("ZCARD", p + "active").push("ZCARD", p + "dead").push("HGETALL", p + "stats");
  req.options.resend_safe = true;
  reply r = co_await redis::exec(conn_, std::move(req));
  const auto& e = r.as_array();
  queue_counts c;
  c.ready_lanes = e.at(0).as_integer();
  c.running = e.at(1).as_integer();
  c.dead = e.at(2).as_integer();
  const auto& fields = e.at(3).as_array();
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
  }
  co_return c;
}

}  // namespace jobrt
