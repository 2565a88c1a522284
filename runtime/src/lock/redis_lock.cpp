// The lock on Redis: three scripts (runtime/lua/lock_*.lua) on one shared connection (on a Redis
// Cluster, at the primary serving each lock's slot), and the wake-ups by sharded pub/sub: on a
// plain server one channel, on a cluster one for each slot where this service's waiters wait,
// heard at the node serving that slot (detail::shard_listener).
#include "lock/lock_core.hpp"
#include "lock/lock_lua.hpp"
#include "redis/cluster_map.hpp"
#include "redis/redis_link.hpp"
#include "redis/shard_listener.hpp"
#include "strand.hpp"

#include <jobrt/redis/connection.hpp>
#include <jobrt/redis/script.hpp>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <span>
#include <unordered_map>

namespace asio = boost::asio;
using boost::system::system_error;

namespace jobrt {
namespace detail {
namespace {

std::string_view order_arg(lock_order o) { return o == lock_order::fifo ? "fifo" : "any"; }

// Calls and receives as deferred operations: co_await runs them without a coroutine frame of
// their own (use_awaitable allocates one per operation), with errors as values.
constexpr auto use_tuple = asio::as_tuple(asio::deferred);

// The keys of a lock that a call of lock_acquire.lua or lock_release.lua touches, side by side
// in one buffer: <prefix>{<name>} and <prefix>{<name>}:fence, then :fq (the queue) in FIFO
// order, :ws (the waiting services) in "any" order. No allocation for usual names; the request
// copies them.
class lock_keys {
 public:
  lock_keys(std::string_view prefix, std::string_view name, lock_order order) {
    // (The FIFO queue was ":q" with a hash ":qi" beside it before tickets moved into the tokens,
    // and the waiting services one string ":w": new names, so that older services' scripts never
    // read the new keys as theirs.)
    static constexpr std::array<std::string_view, 2> any_suffixes{":fence", ":ws"};
    static constexpr std::array<std::string_view, 2> fifo_suffixes{":fence", ":fq"};
    const auto& suffixes = order == lock_order::fifo ? fifo_suffixes : any_suffixes;
    const std::size_t base = prefix.size() + name.size() + 2;
    std::size_t total = base;
    for (std::size_t i = 0; i + 1 < count_; ++i) total += base + suffixes[i].size();
    char* p = inline_.data();
    if (total > inline_.size()) {
      heap_.resize(total);
      p = heap_.data();
    }
    // The lock's key, then the others as copies of it with their suffix.
    char* first = p;
    std::memcpy(p, prefix.data(), prefix.size());
    p += prefix.size();
    *p++ = '{';
    std::memcpy(p, name.data(), name.size());
    p += name.size();
    *p++ = '}';
    views_[0] = std::string_view(first, base);
    for (std::size_t i = 1; i < count_; ++i) {
      char* start = p;
      std::memcpy(p, first, base);
      p += base;
      for (char c : suffixes[i - 1]) *p++ = c;
      views_[i] = std::string_view(start, base + suffixes[i - 1].size());
    }
  }
  lock_keys(const lock_keys&) = delete;
  lock_keys& operator=(const lock_keys&) = delete;

  std::span<const std::string_view> views() const noexcept { return {views_.data(), count_}; }
  std::size_t size() const noexcept { return count_; }

 private:
  std::array<char, 256> inline_;
  std::string heap_;
  std::array<std::string_view, 3> views_;
  static constexpr std::size_t count_ = 3;
};

class redis_lock_core final : public lock_core {
 public:
  redis_lock_core(asio::any_io_executor ex, std::vector<redis::config> seeds, redis_lock_options o)
      : lock_core(ex),
        opts_(std::move(o)),
        channel_(opts_.prefix + "wake"),
        link_(std::make_shared<redis_link>(ex, seeds)),
        acquire_(lua::lock_acquire),
        release_(lua::lock_release),
        extend_(lua::lock_extend) {}

  void begin() {
    // The listener holds the core only while it handles a message: the core owns the listener.
    auto weak = std::weak_ptr<redis_lock_core>(std::static_pointer_cast<redis_lock_core>(shared_from_this()));
    listener_ = std::make_shared<shard_listener>(get_executor(), link_, "locks", [weak](const redis::message& m) {
      if (auto self = weak.lock(); self && !self->closed()) self->on_message(m);
    });
  }

  void on_close() override {
    link_->plain().close();
    if (auto* c = link_->known_cluster()) c->close();
    listener_->close();
  }

  asio::awaitable<acquire_result> acquire(const std::string& name, const std::string& token, const lock_options& o,
                                          bool queue, std::chrono::milliseconds left,
                                          std::chrono::milliseconds) override {
    // (A FIFO waiter's ticket is in its token: see lock_core::lock.)
    if (queue && o.order == lock_order::fifo) co_return co_await join_batch(name, token, o);
    std::array<std::string_view, 1> one{token};
    auto results = co_await call_acquire(name, o.ttl, o.order, queue, one, left);
    co_return results.at(0);
  }

  asio::awaitable<release_result> release(const std::string& name, const std::string& token, lock_order order,
                                          const local_handoff* next) override {
    auto channel = wake_channel(name);
    auto make = [&] {
      lock_keys keys(opts_.prefix, name, order);
      auto hint = next ? next->token() : std::string_view();
      auto hint_ttl = next ? next->ttl.count() : 0;
      // (FIFO reads no service id and no streak: two arguments fewer to send and to hand to Lua.)
      redis::request req =
          order == lock_order::fifo
              ? redis::request("EVALSHA", release_.sha1(), keys.size(), keys.views(), token, channel, name,
                               order_arg(order), hint, hint_ttl)
              : redis::request("EVALSHA", release_.sha1(), keys.size(), keys.views(), token, channel, name,
                               order_arg(order), hint, hint_ttl, service_id_, next ? next->streak : 0);
      req.options.timeout = opts_.io_timeout;
      // Resending is safe (the token check); a resent release only answers "not owned".
      req.options.resend_safe = true;
      return req;
    };
    // (No coroutine frame on a plain server: g++ 12 takes no co_await inside ?: either.)
    boost::system::error_code ec;
    redis::reply r;
    if (plain_server())
      std::tie(ec, r) = co_await link_->plain().async_exec(make(), use_tuple);
    else
      std::tie(ec, r) = co_await routed_call(make(), lock_key(name));
    if (needs_reload(ec, r)) {
      if (plain_server())
        std::tie(ec, r) = co_await link_->plain().async_exec(with_load(release_, make()), use_tuple);
      else
        std::tie(ec, r) = co_await routed_call(with_load(release_, make()), lock_key(name));
      unpack_reload(ec, r);
    }
    check(ec, r, name);
    const auto& a = r.as_array();
    release_result out;
    out.owned = a.at(0).as_integer() == 1;
    if (a.size() > 2)
      out.fifo_handed.emplace(a[2].as_string(), a[1].as_integer());
    else if (a.size() > 1 && a[1].as_integer() >= 0)  // (-1: reserved for another service)
      out.handed = a[1].as_integer();
    co_return out;
  }

  // One pipelined request of one script call per lock: one round trip for all of them, and each
  // call touches one lock's slot only, so it works on Redis Cluster too (a single script over
  // every lock's key would not).
  asio::awaitable<std::vector<bool>> renew(std::vector<renew_item> items, std::chrono::milliseconds limit) override {
    if (!link_->known()) co_await link_->cluster(std::min(limit, opts_.io_timeout));
    if (link_->known_cluster()) co_return co_await renew_each(std::move(items), limit);
    redis::request req;
    for (auto& item : items) {
      std::array<std::string, 1> keys{lock_key(item.name)};
      std::array<std::string, 2> args{item.token, std::to_string(item.ttl.count())};
      req.append(extend_.make_request(keys, args));
    }
    req.options.timeout = std::min(limit, opts_.io_timeout);
    req.options.resend_safe = true;
    auto again = req;
    auto [ec, r] = co_await link_->plain().async_exec(std::move(req), asio::as_tuple(asio::use_awaitable));
    // One command's reply comes alone, a pipeline's as an array: make both an array.
    auto as_list = [n = items.size()](boost::system::error_code& code, redis::reply& rep) {
      if (n == 1 && (!code || code == errc::server_error)) {
        code = {};
        std::vector<redis::reply> one;
        one.push_back(std::move(rep));
        rep = redis::reply::make_array(std::move(one));
      }
    };
    as_list(ec, r);
    if (!ec && needs_load(r)) {
      // The server lost its scripts (restarted, SCRIPT FLUSH): load and run the pipeline again.
      redis::request load("SCRIPT", "LOAD", extend_.source());
      load.options = again.options;
      load.append(again);
      std::tie(ec, r) = co_await link_->plain().async_exec(std::move(load), asio::as_tuple(asio::use_awaitable));
      if (!ec) {
        auto& all = r.as_array();
        all.erase(all.begin());
      }
    }
    if (ec) throw system_error(ec, ec == errc::not_connected ? link_->plain().last_error() : std::string());
    std::vector<bool> out;
    for (auto& e : r.as_array()) {
      if (e.is_error()) throw system_error(errc::server_error, std::string(e.error_message()));
      out.push_back(e.as_integer() == 1);
    }
    co_return out;
  }

 private:
  // A script call where the lock lives: on a plain server straight on the shared connection;
  // else (on a cluster, or before the first answer says which) through the link.
  bool plain_server() const noexcept { return link_->known() && !link_->known_cluster(); }
  asio::awaitable<std::tuple<boost::system::error_code, redis::reply>> routed_call(redis::request req,
                                                                                   const std::string& route) {
    if (!link_->known()) {
      try {
        co_await link_->cluster(req.options.timeout);
      } catch (const system_error& e) {
        co_return std::tuple(e.code(), detail::reply_of(e));
      }
    }
    auto [ec, r] = co_await link_->try_exec(std::move(req), route);
    co_return std::tuple(ec, std::move(r));
  }

  // On a cluster: each lock's renewal a call of its own (its slot's primary), all at once. (Its
  // caller, the watchdog, is never cancelled: each ends by its timeout.)
  asio::awaitable<std::vector<bool>> renew_each(std::vector<renew_item> items, std::chrono::milliseconds limit) {
    auto one_lock = [](redis_lock_core* self, renew_item item,
                       std::chrono::milliseconds within) -> asio::awaitable<bool> {
      std::vector<std::string> keys;
      keys.push_back(self->lock_key(item.name));
      std::array<std::string, 2> args{item.token, std::to_string(item.ttl.count())};
      auto req = self->extend_.make_request(keys, args);
      req.options.timeout = within;
      req.options.resend_safe = true;
      auto r = co_await self->extend_.run(*self->link_->known_cluster(), std::move(keys), std::move(req));
      co_return r.as_integer() == 1;
    };
    auto within = std::min(limit, opts_.io_timeout);
    auto all = co_await detail::all_at_once<bool>(get_executor(), items.size(),
                                                  [&](std::size_t i) { return one_lock(this, items[i], within); });
    for (auto& f : all.errors)
      if (f) std::rethrow_exception(f);
    co_return std::move(all.results);
  }

  static std::string make_service_id() {
    std::random_device rd;
    return fmt::format("{:08x}{:08x}", rd(), rd());
  }

  static bool needs_load(const redis::reply& r) {
    if (r.kind() != redis::reply_kind::array) return false;
    for (auto& e : r.as_array())
      if (e.is_error() && e.error_message().starts_with("NOSCRIPT")) return true;
    return false;
  }

  std::string lock_key(std::string_view name) const { return fmt::format("{}{{{}}}", opts_.prefix, name); }

  // acquire() and release() call their script as redis::script::run does (EVALSHA; after
  // NOSCRIPT, SCRIPT LOAD and the same EVALSHA in one round trip), but inline in their own
  // coroutine and without keeping a copy of every request for the rare reload: they build it again.
  static bool needs_reload(const boost::system::error_code& ec, const redis::reply& r) {
    return ec == errc::server_error && r.error_message().starts_with("NOSCRIPT");
  }

  static redis::request with_load(const redis::script& s, redis::request evalsha) {
    redis::request load("SCRIPT", "LOAD", s.source());
    load.options = evalsha.options;
    load.append(evalsha);
    return load;
  }

  static void unpack_reload(boost::system::error_code& ec, redis::reply& r) {
    if (ec) return;
    // A script that does not compile fails at SCRIPT LOAD: that error is the one to show.
    auto& both = r.as_array();
    redis::reply answer = std::move(both.at(both.at(0).is_error() ? 0 : 1));
    r = std::move(answer);
    if (r.is_error()) ec = errc::server_error;
  }

  // Throws for a failed call, with the connection's own words on why (e.g. "connect to
  // redis://...: Connection refused") or the server's error.
  void check(const boost::system::error_code& ec, const redis::reply& r, const std::string& name) const {
    if (!ec) return;
    std::string failure = r.is_error() ? std::string(r.error_message()) : std::string();
    if (ec == errc::not_connected) failure = link_->plain().last_error();
    throw system_error(ec, fmt::format("lock '{}'", name) + (failure.empty() ? "" : ": " + failure));
  }

  // The channel a lock's wake-ups go to. On a cluster, one of its slot: SPUBLISH in a script must
  // name a channel of the script's slot, and a channel per slot (not per lock) bounds what a
  // service subscribes to. (A prefix with a brace in it that moves the tag: the lock's own.)
  std::string wake_channel(std::string_view name) const {
    if (!link_->known_cluster()) return channel_;
    auto key = lock_key(name);
    auto slot = redis::detail::key_slot(key);
    auto channel = fmt::format("{}wake{{{}}}", opts_.prefix, redis::detail::slot_tag(slot));
    return redis::detail::key_slot(channel) == slot ? channel : key + ":wake";
  }

  // A waiter of this service waits for `name`: its wake-ups are listened to (once a channel). The
  // subscription's confirmation wakes the waiters it is about: a wake-up sent before it held is
  // not lost.
  void listen_for(std::string_view name) {
    auto channel = wake_channel(name);
    std::lock_guard lock(batch_mutex_);
    if (listened_.insert(channel).second) listener_->listen(std::move(channel));
  }

  // Wake-ups: 'r|<name>' (released: one local waiter retries) or 'g|<token>|<fence>|<name>'
  // (handed to that FIFO waiter). After a (re)subscription, the waiters it is about retry:
  // messages published while it was not in place are lost.
  void on_message(const redis::message& m) {
    if (m.confirmation) {
      if (m.channel.empty() || m.channel == channel_)
        wake_all();
      else
        wake_all([&](std::string_view name) { return wake_channel(name) == m.channel; });
      return;
    }
    std::string_view p = m.payload;
    if (p.starts_with("r|")) {
      wake(p.substr(2));
    } else if (p.starts_with("g|")) {
      p.remove_prefix(2);
      auto bar = p.find('|');
      if (bar == std::string_view::npos) return;
      auto token = p.substr(0, bar);
      p.remove_prefix(bar + 1);
      bar = p.find('|');
      if (bar == std::string_view::npos) return;
      std::int64_t fence = 0;
      auto [ptr, err] = std::from_chars(p.data(), p.data() + bar, fence);
      if (err != std::errc() || ptr != p.data() + bar) return;
      grant(p.substr(bar + 1), token, fence);
    }
  }

  // One call of lock_acquire.lua for one or more callers of one lock: their tokens, in arrival
  // order. One answer per caller. `left`: how long a waiting caller in "any" order still waits.
  asio::awaitable<std::vector<acquire_result>> call_acquire(const std::string& name, std::chrono::milliseconds ttl,
                                                            lock_order order, bool queue,
                                                            std::span<const std::string_view> tokens,
                                                            std::chrono::milliseconds left = {}) {
    // ('0': no wait; FIFO '1'; any: the ms the script marks the wait for, at least 1)
    auto waits = !queue                      ? std::string("0")
                 : order == lock_order::fifo ? std::string("1")
                                             : std::to_string(std::max(left, std::chrono::milliseconds(1)).count());
    auto make = [&] {
      lock_keys keys(opts_.prefix, name, order);
      redis::request req("EVALSHA", acquire_.sha1(), keys.size(), keys.views(), ttl.count(), order_arg(order), waits,
                         service_id_, tokens);
      req.options.timeout = opts_.io_timeout;
      req.options.resend_safe = true;  // a second run finds the lock ours and answers its fence
      return req;
    };
    // (No coroutine frame on a plain server: g++ 12 takes no co_await inside ?: either.)
    boost::system::error_code ec;
    redis::reply r;
    if (plain_server())
      std::tie(ec, r) = co_await link_->plain().async_exec(make(), use_tuple);
    else
      std::tie(ec, r) = co_await routed_call(make(), lock_key(name));
    if (needs_reload(ec, r)) {
      if (plain_server())
        std::tie(ec, r) = co_await link_->plain().async_exec(with_load(acquire_, make()), use_tuple);
      else
        std::tie(ec, r) = co_await routed_call(with_load(acquire_, make()), lock_key(name));
      unpack_reload(ec, r);
    }
    check(ec, r, name);
    if (queue) listen_for(name);
    const auto& a = r.as_array();
    std::vector<acquire_result> out(tokens.size());
    for (std::size_t i = 0; i < out.size(); ++i) {
      out[i].acquired = a.at(2 * i).as_integer() == 1;
      if (out[i].acquired)
        out[i].fence = a.at(2 * i + 1).as_integer();
      else
        out[i].backstop = std::chrono::milliseconds(a.at(2 * i + 1).as_integer());
    }
    co_return out;
  }

  // FIFO waiters of one lock that ask at once (a burst that arrives together) leave their
  // tickets in one call: a batch, open from the first one's attempt until its call goes out from
  // a handler of its own (posted when it opened), takes every waiter of the lock (with the same
  // TTL) that asks meanwhile, in arrival order. A waiter cancelled before the call went out is
  // taken out of it: a ticket it left after its own release had run would stay until its wait
  // ended, at the queue's head, in everyone's way.
  struct fifo_batch {
    fifo_batch(asio::any_io_executor ex, std::string n, std::chrono::milliseconds t)
        : name(std::move(n)), ttl(t), done(std::move(ex), lock_clock::time_point::max()) {}
    std::string name;
    std::chrono::milliseconds ttl;
    std::vector<std::string> tokens;  // per waiter
    std::vector<bool> withdrawn;
    std::vector<acquire_result> results;
    std::exception_ptr failure;
    bool sent = false;
    bool finished = false;
    asio::steady_timer done;  // expires (at min) when finished: waits started after still end
  };

  asio::awaitable<acquire_result> join_batch(const std::string& name, const std::string& token, const lock_options& o) {
    std::shared_ptr<fifo_batch> b;
    std::size_t index = 0;
    bool opened = false;
    {
      std::lock_guard lock(batch_mutex_);
      auto& open = open_batches_[name];
      if (!open) {
        open = std::make_shared<fifo_batch>(get_executor(), name, o.ttl);
        opened = true;
      }
      if (open->ttl == o.ttl) {
        b = open;
        index = b->withdrawn.size();
        b->tokens.push_back(token);
        b->withdrawn.push_back(false);
      }
    }
    if (!b) {  // a batch of another TTL is open: a call of its own
      std::array<std::string_view, 1> one{token};
      auto results = co_await call_acquire(name, o.ttl, o.order, true, one);
      co_return results.at(0);
    }
    if (opened)
      asio::co_spawn(get_executor(), send_batch(std::static_pointer_cast<redis_lock_core>(shared_from_this()), b),
                     asio::detached);
    // Cancelled, the wait ends early (the batch is not finished then). A waiter whose batch is
    // on its way waits for its answer all the same (a wait nothing cancels): the release that
    // follows its leaving must come after the batch's call, which may have queued its ticket or
    // given it the lock.
    auto wait_done = [this, &b](auto how) {
      return asio::async_initiate<decltype(how), void(boost::system::error_code)>(
          [this, &b](auto handler) {
            std::lock_guard lock(batch_mutex_);
            b->done.async_wait(std::move(handler));
          },
          how);
    };
    co_await wait_done(use_tuple);
    bool cancelled = false;
    {
      std::lock_guard lock(batch_mutex_);
      if (!b->finished) {
        cancelled = true;
        if (!b->sent) {
          b->withdrawn[index] = true;
          throw system_error(asio::error::operation_aborted, fmt::format("lock '{}'", name));
        }
      }
    }
    if (cancelled) {
      // (Without the throw a cancelled coroutine's co_await makes: the answer is waited for.)
      bool throws = co_await asio::this_coro::throw_if_cancelled();
      co_await asio::this_coro::throw_if_cancelled(false);
      co_await wait_done(asio::bind_cancellation_slot(asio::cancellation_slot(), asio::as_tuple(asio::use_awaitable)));
      co_await asio::this_coro::throw_if_cancelled(throws);
      throw system_error(asio::error::operation_aborted, fmt::format("lock '{}'", name));
    }
    std::lock_guard lock(batch_mutex_);
    if (b->failure) std::rethrow_exception(b->failure);
    co_return b->results.at(index);
  }

  static asio::awaitable<void> send_batch(std::shared_ptr<redis_lock_core> self, std::shared_ptr<fifo_batch> b) {
    // co_spawn runs it at once, inside the opening waiter's attempt: a post first lets the
    // waiters that are ready to run (spawned in the same handler, woken by the same message) join.
    co_await asio::post(self->get_executor(), asio::deferred);
    std::vector<std::string_view> tokens;
    std::vector<std::size_t> who;  // the waiter of each token
    {
      std::lock_guard lock(self->batch_mutex_);
      if (auto it = self->open_batches_.find(b->name); it != self->open_batches_.end() && it->second == b)
        self->open_batches_.erase(it);
      b->sent = true;
      for (std::size_t i = 0; i < b->withdrawn.size(); ++i) {
        if (b->withdrawn[i]) continue;
        tokens.push_back(b->tokens[i]);
        who.push_back(i);
      }
    }
    std::vector<acquire_result> results(b->withdrawn.size());
    std::exception_ptr failure;
    if (!who.empty()) {
      try {
        auto answers = co_await self->call_acquire(b->name, b->ttl, lock_order::fifo, true, tokens);
        for (std::size_t k = 0; k < who.size(); ++k) results[who[k]] = answers[k];
      } catch (...) {
        failure = std::current_exception();
      }
    }
    std::lock_guard lock(self->batch_mutex_);
    b->results = std::move(results);
    b->failure = failure;
    b->finished = true;
    b->done.expires_at(lock_clock::time_point::min());
  }

  redis_lock_options opts_;
  std::string channel_;  // the wake-ups' channel on a plain server
  std::string service_id_ = make_service_id();
  std::shared_ptr<redis_link> link_;
  std::shared_ptr<shard_listener> listener_;
  redis::script acquire_, release_, extend_;
  std::mutex batch_mutex_;          // open_batches_ and every batch's state and timer; listened_
  std::set<std::string> listened_;  // wake-up channels listened to
  std::unordered_map<std::string, std::shared_ptr<fifo_batch>> open_batches_;  // by lock name, not sent yet
};

std::shared_ptr<lock_core> make_redis_core(asio::any_io_executor ex, std::vector<redis::config> seeds,
                                           redis_lock_options o) {
  auto core = std::make_shared<redis_lock_core>(std::move(ex), std::move(seeds), std::move(o));
  core->begin();
  return core;
}

std::vector<redis::config> one(redis::config cfg) {
  std::vector<redis::config> seeds;
  seeds.push_back(std::move(cfg));
  return seeds;
}

}  // namespace
}  // namespace detail

redis_lock_service::redis_lock_service(asio::any_io_executor ex, redis::config cfg, redis_lock_options o)
    : lock_service(detail::make_redis_core(std::move(ex), detail::one(std::move(cfg)), std::move(o))) {}

redis_lock_service::redis_lock_service(asio::any_io_executor ex, std::vector<redis::config> seeds, redis_lock_options o)
    : lock_service(detail::make_redis_core(std::move(ex), std::move(seeds), std::move(o))) {}

redis_lock_service::~redis_lock_service() = default;

}  // namespace jobrt
