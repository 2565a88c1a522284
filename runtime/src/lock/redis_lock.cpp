// The lock on Redis: three scripts (runtime/lua/lock_*.lua) on one shared connection, and one
// subscriber connection that carries every lock's wake-ups to the waiters of this service.
#include "lock/lock_core.hpp"
#include "lock/lock_lua.hpp"

#include <jobrt/redis/connection.hpp>
#include <jobrt/redis/script.hpp>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <array>
#include <charconv>
#include <random>

namespace asio = boost::asio;
using boost::system::system_error;

namespace jobrt {
namespace detail {
namespace {

std::string_view order_arg(lock_order o) { return o == lock_order::fifo ? "fifo" : "any"; }

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
    auto keys = keys_of(name);
    std::array<std::string, 6> args{token,
                                    std::to_string(o.ttl.count()),
                                    std::string(order_arg(o.order)),
                                    queue ? "1" : "0",
                                    std::to_string(ticket.count()),
                                    service_id_};
    auto req = acquire_.make_request(keys, args);
    req.options.timeout = opts_.io_timeout;
    req.options.resend_safe = true;  // a second run finds the lock ours and answers its fence
    redis::reply r = co_await run(acquire_, std::move(req), name);
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
    auto keys = keys_of(name);
    std::array<std::string, 8> args{token,
                                    channel_,
                                    name,
                                    std::string(order_arg(order)),
                                    next ? next->token : std::string(),
                                    next ? std::to_string(next->ttl.count()) : std::string("0"),
                                    service_id_,
                                    std::to_string(next ? next->streak : 0)};
    auto req = release_.make_request(keys, args);
    req.options.timeout = opts_.io_timeout;
    // Resending is safe (the token check); a resent release only answers "not owned".
    req.options.resend_safe = true;
    redis::reply r = co_await run(release_, std::move(req), name);
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

  std::array<std::string, 5> keys_of(const std::string& name) const {
    auto key = lock_key(name);
    return {key, key + ":fence", key + ":q", key + ":qi", key + ":w"};
  }

  asio::awaitable<redis::reply> run(const redis::script& s, redis::request req, const std::string& name) {
    std::string failure;
    boost::system::error_code code;
    try {
      co_return co_await s.run(conn_, std::move(req));
    } catch (const system_error& e) {
      code = e.code();
      failure = e.what();
      // what() is "<what_arg>: <message of the code> [...]"; the code's message is added again below.
      if (auto at = failure.rfind(": " + code.message()); at != std::string::npos) failure.resize(at);
      if (failure == code.message() || failure.starts_with(code.message() + " [")) failure.clear();
    }
    // The connection's own words say why (e.g. "connect to redis://...: Connection refused").
    throw system_error(code, fmt::format("lock '{}'", name) + (failure.empty() ? "" : ": " + failure));
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
          self, [](redis_lock_core& c, auto handler) { c.sub_.async_receive(std::move(handler)); },
          asio::as_tuple(asio::use_awaitable));
      self = weak.lock();
      if (ec || !self || self->closed()) co_return;
      if (m.confirmation) {
        self->wake_all();
        continue;
      }
      std::string_view p = m.payload;
      if (p.starts_with("r|")) {
        self->wake(std::string(p.substr(2)));
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
        self->grant(std::string(p.substr(bar + 1)), std::string(token), fence);
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
