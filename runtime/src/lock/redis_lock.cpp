// The lock on Redis: three scripts (runtime/lua/lock_*.lua) on one shared connection, and one
// subscriber connection that carries every lock's wake-ups to the waiters of this service.
#include "lock/lock_core.hpp"
#include "lock/lock_lua.hpp"

#include <jobrt/redis/connection.hpp>
#include <jobrt/redis/script.hpp>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <random>
#include <span>

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
// in one buffer: <prefix>{<name>} and <prefix>{<name>}:fence, then :q and :qi in FIFO order, :w in
// "any" order. No allocation for usual names; the request copies them.
class lock_keys {
 public:
  lock_keys(std::string_view prefix, std::string_view name, lock_order order) {
    static constexpr std::array<std::string_view, 3> any_suffixes{":fence", ":w"};
    static constexpr std::array<std::string_view, 3> fifo_suffixes{":fence", ":q", ":qi"};
    const auto& suffixes = order == lock_order::fifo ? fifo_suffixes : any_suffixes;
    count_ = order == lock_order::fifo ? 4 : 3;
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
  std::array<std::string_view, 4> views_;
  std::size_t count_;
};

class redis_lock_core final : public lock_core {
 public:
  redis_lock_core(asio::any_io_executor ex, redis::config cfg, redis_lock_options o)
      : lock_core(ex),
        opts_(std::move(o)),
        channel_(opts_.prefix + "wake"),
        conn_(ex, cfg),
        sub_(ex, cfg),
        acquire_(lua::lock_acquire),
        release_(lua::lock_release),
        extend_(lua::lock_extend) {}

  void begin() {
    conn_.start();
    std::vector<std::string> channels{channel_};
    sub_.subscribe(std::move(channels));
    sub_.start();
    asio::co_spawn(get_executor(), receive_loop(std::static_pointer_cast<redis_lock_core>(shared_from_this())),
                   asio::detached);
  }

  void on_close() override {
    conn_.close();
    sub_.close();
  }

  asio::awaitable<acquire_result> acquire(const std::string& name, const std::string& token, const lock_options& o,
                                          bool queue, std::chrono::milliseconds ticket,
                                          std::chrono::milliseconds) override {
    auto make = [&] {
      lock_keys keys(opts_.prefix, name, o.order);
      redis::request req("EVALSHA", acquire_.sha1(), keys.size(), keys.views(), token, o.ttl.count(),
                         order_arg(o.order), queue ? "1" : "0", ticket.count(), service_id_);
      req.options.timeout = opts_.io_timeout;
      req.options.resend_safe = true;  // a second run finds the lock ours and answers its fence
      return req;
    };
    auto [ec, r] = co_await conn_.async_exec(make(), use_tuple);
    if (needs_reload(ec, r)) {
      std::tie(ec, r) = co_await conn_.async_exec(with_load(acquire_, make()), use_tuple);
      unpack_reload(ec, r);
    }
    check(ec, r, name);
    const auto& a = r.as_array();
    acquire_result out;
    out.acquired = a.at(0).as_integer() == 1;
    if (out.acquired)
      out.fence = a.at(1).as_integer();
    else
      out.backstop = std::chrono::milliseconds(a.at(1).as_integer());
    co_return out;
  }

  asio::awaitable<release_result> release(const std::string& name, const std::string& token, lock_order order,
                                          const local_handoff* next) override {
    auto make = [&] {
      lock_keys keys(opts_.prefix, name, order);
      redis::request req("EVALSHA", release_.sha1(), keys.size(), keys.views(), token, channel_, name, order_arg(order),
                         next ? next->token() : std::string_view(), next ? next->ttl.count() : 0, service_id_,
                         next ? next->streak : 0);
      req.options.timeout = opts_.io_timeout;
      // Resending is safe (the token check); a resent release only answers "not owned".
      req.options.resend_safe = true;
      return req;
    };
    auto [ec, r] = co_await conn_.async_exec(make(), use_tuple);
    if (needs_reload(ec, r)) {
      std::tie(ec, r) = co_await conn_.async_exec(with_load(release_, make()), use_tuple);
      unpack_reload(ec, r);
    }
    check(ec, r, name);
    const auto& a = r.as_array();
    release_result out;
    out.owned = a.at(0).as_integer() == 1;
    if (a.size() > 2)
      out.fifo_handed.emplace(a[2].as_string(), a[1].as_integer());
    else if (a.size() > 1 && a[1].as_integer() < 0)
      out.yielded = true;
    else if (a.size() > 1)
      out.handed = a[1].as_integer();
    co_return out;
  }

  // One pipelined request of one script call per lock: one round trip for all of them, and each
  // call touches one lock's slot only, so it works on Redis Cluster too (a single script over
  // every lock's key would not).
  asio::awaitable<std::vector<bool>> renew(std::vector<renew_item> items, std::chrono::milliseconds limit) override {
    redis::request req;
    for (auto& item : items) {
      std::array<std::string, 1> keys{lock_key(item.name)};
      std::array<std::string, 2> args{item.token, std::to_string(item.ttl.count())};
      req.append(extend_.make_request(keys, args));
    }
    req.options.timeout = std::min(limit, opts_.io_timeout);
    req.options.resend_safe = true;
    auto again = req;
    auto [ec, r] = co_await conn_.async_exec(std::move(req), asio::as_tuple(asio::use_awaitable));
    // One command's reply comes alone, a pipeline's as an array: make both an array.
    auto as_list = [n = items.size()](boost::system::error_code& code, redis::reply& rep) {
      if (n == 1 && (!code || code == error::server_error)) {
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
      std::tie(ec, r) = co_await conn_.async_exec(std::move(load), asio::as_tuple(asio::use_awaitable));
      if (!ec) {
        auto& all = r.as_array();
        all.erase(all.begin());
      }
    }
    if (ec) throw system_error(ec, ec == error::not_connected ? conn_.last_error() : std::string());
    std::vector<bool> out;
    for (auto& e : r.as_array()) {
      if (e.is_error()) throw system_error(error::server_error, std::string(e.error_message()));
      out.push_back(e.as_integer() == 1);
    }
    co_return out;
  }

 private:
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

  std::string lock_key(const std::string& name) const { return fmt::format("{}{{{}}}", opts_.prefix, name); }

  // acquire() and release() call their script as redis::script::run does (EVALSHA; after
  // NOSCRIPT, SCRIPT LOAD and the same EVALSHA in one round trip), but inline in their own
  // coroutine and without keeping a copy of every request for the rare reload: they build it again.
  static bool needs_reload(const boost::system::error_code& ec, const redis::reply& r) {
    return ec == error::server_error && r.error_message().starts_with("NOSCRIPT");
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
    if (r.is_error()) ec = error::server_error;
  }

  // Throws for a failed call, with the connection's own words on why (e.g. "connect to
  // redis://...: Connection refused") or the server's error.
  void check(const boost::system::error_code& ec, const redis::reply& r, const std::string& name) const {
    if (!ec) return;
    std::string failure = r.is_error() ? std::string(r.error_message()) : std::string();
    if (ec == error::not_connected) failure = conn_.last_error();
    throw system_error(ec, fmt::format("lock '{}'", name) + (failure.empty() ? "" : ": " + failure));
  }

  // Wake-ups: 'r|<name>' (released: one local waiter retries) or 'g|<token>|<fence>|<name>'
  // (handed to that FIFO waiter). After every (re)subscription, every waiter retries: messages
  // published while the subscriber was away are lost.
  // It holds the core only while it handles a message: parked in the subscriber, which the core
  // owns, it would keep the core alive in a cycle (see start_and_let_go).
  static asio::awaitable<void> receive_loop(std::weak_ptr<redis_lock_core> weak) {
    for (;;) {
      auto self = weak.lock();
      if (!self) co_return;
      auto [ec, m] = co_await start_and_let_go<void(boost::system::error_code, redis::message)>(
          self, [](redis_lock_core& c, auto handler) { c.sub_.async_receive(std::move(handler)); }, use_tuple);
      self = weak.lock();
      if (ec || !self || self->closed()) co_return;
      if (m.confirmation) {
        self->wake_all();
        continue;
      }
      std::string_view p = m.payload;
      if (p.starts_with("r|")) {
        self->wake(p.substr(2));
      } else if (p.starts_with("g|")) {
        p.remove_prefix(2);
        auto bar = p.find('|');
        if (bar == std::string_view::npos) continue;
        auto token = p.substr(0, bar);
        p.remove_prefix(bar + 1);
        bar = p.find('|');
        if (bar == std::string_view::npos) continue;
        std::int64_t fence = 0;
        auto [ptr, err] = std::from_chars(p.data(), p.data() + bar, fence);
        if (err != std::errc() || ptr != p.data() + bar) continue;
        self->grant(p.substr(bar + 1), token, fence);
      }
    }
  }

  redis_lock_options opts_;
  std::string channel_;
  std::string service_id_ = make_service_id();
  redis::connection conn_;
  redis::subscriber sub_;
  redis::script acquire_, release_, extend_;
};

std::shared_ptr<lock_core> make_redis_core(asio::any_io_executor ex, redis::config cfg, redis_lock_options o) {
  auto core = std::make_shared<redis_lock_core>(std::move(ex), std::move(cfg), std::move(o));
  core->begin();
  return core;
}

}  // namespace
}  // namespace detail

redis_lock_service::redis_lock_service(asio::any_io_executor ex, redis::config cfg, redis_lock_options o)
    : lock_service(detail::make_redis_core(std::move(ex), std::move(cfg), std::move(o))) {}

redis_lock_service::~redis_lock_service() = default;

}  // namespace jobrt
