#include "redis/redis_link.hpp"

#include "reason.hpp"
#include "redis/cluster_map.hpp"

#include <jobrt/error.hpp>

#include <fmt/format.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>

#include <algorithm>

namespace jobrt::detail {

namespace asio = boost::asio;
using redis::reply;
using redis::request;

redis_link::redis_link(asio::any_io_executor ex, std::vector<redis::config> seeds)
    : ex_(ex), cfg_(seeds.at(0)), plain_(ex, seeds.at(0)) {
  plain_.start();
  if (seeds.size() > 1) {
    cluster_ = std::make_unique<redis::cluster_connection>(ex_, std::move(seeds));
    cluster_->start();
    mode_.store(clustered, std::memory_order_release);
  }
}

redis_link::~redis_link() {
  std::lock_guard lock(mutex_);
  if (cluster_) cluster_->close();
  for (auto& [node, conns] : replicated_)
    for (auto& c : conns) c->close();
}

asio::awaitable<redis::cluster_connection*> redis_link::cluster(std::chrono::milliseconds timeout) {
  switch (mode_.load(std::memory_order_acquire)) {
    case plain_server: co_return nullptr;
    case clustered: co_return cluster_.get();
    default: break;
  }
  // The first callers each ask (a few INFO calls at most); the first answer decides. A server
  // that refuses INFO (an ACL, a proxy) is taken for a plain one, as it always was.
  request info("INFO", "cluster");
  info.options.resend_safe = true;
  info.options.timeout = timeout;
  auto [ec, r] = co_await plain_.async_exec(std::move(info), asio::as_tuple(asio::use_awaitable));
  if (ec && ec != errc::server_error) throw boost::system::system_error(ec, "INFO cluster at " + cfg_.address());
  bool is_cluster = !ec && r.as_string().find("cluster_enabled:1") != std::string::npos;
  std::lock_guard lock(mutex_);
  if (mode_.load(std::memory_order_relaxed) == unknown) {
    if (is_cluster) {
      std::vector<redis::config> seeds{cfg_};
      cluster_ = std::make_unique<redis::cluster_connection>(ex_, std::move(seeds));
      cluster_->start();
    }
    mode_.store(is_cluster ? clustered : plain_server, std::memory_order_release);
  }
  co_return cluster_.get();
}

asio::awaitable<reply> redis_link::exec(request req, const std::string& route) {
  if (auto* c = co_await cluster()) {
    std::vector<std::string> keys{route};
    co_return co_await c->exec(std::move(req), std::move(keys));
  }
  co_return co_await redis::exec(plain_, std::move(req));
}

asio::awaitable<reply> redis_link::run(const redis::script& s, request evalsha, const std::string& route) {
  if (auto* c = co_await cluster()) {
    std::vector<std::string> keys{route};
    co_return co_await s.run(*c, std::move(keys), std::move(evalsha));
  }
  co_return co_await s.run(plain_, std::move(evalsha));
}

asio::awaitable<reply> redis_link::run_replicated(const redis::script& s, request evalsha, const std::string& route,
                                                  int replicas, std::chrono::milliseconds wait) {
  using clock = std::chrono::steady_clock;
  // The call's own timeout, or on a cluster the cluster's (a call without one on a plain server
  // waits, as ever), and the WAIT's on top.
  auto limit = evalsha.options.timeout.count() > 0 ? evalsha.options.timeout : std::chrono::milliseconds(10'000);
  auto deadline = clock::now() + limit + wait;
  auto backoff = std::chrono::milliseconds(10);
  bool load = false;  // after NOSCRIPT: SCRIPT LOAD first, in the same request
  for (;;) {
    auto node = co_await node_of(route);
    auto* c = known_cluster();
    request req;
    if (load) req.push("SCRIPT", "LOAD", s.source());
    req.append(evalsha);
    req.push("WAIT", replicas, wait.count());
    req.options = evalsha.options;
    if (c != nullptr || evalsha.options.timeout.count() > 0) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - clock::now());
      if (left.count() <= 0) throw boost::system::system_error(errc::timeout, "a replicated call at " + node.address());
      req.options.timeout = left;
    }
    // On a cluster a primary that cannot be reached is not waited for: it may be failing over.
    if (c != nullptr) req.options.wait_for_reconnect = false;
    auto [ec, r] = co_await replicated_at(node).async_exec(std::move(req), asio::as_tuple(asio::use_awaitable));
    if (ec == errc::not_connected && c != nullptr && clock::now() + backoff < deadline) {  // (not sent)
      co_await c->refresh();
      asio::steady_timer pause(ex_, backoff);
      co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
      continue;
    }
    if (ec && ec != errc::server_error) throw boost::system::system_error(ec, "at " + node.address());
    auto& parts = r.as_array();
    reply answer = std::move(parts.at(parts.size() - 2));
    if (load && parts.front().is_error()) answer = std::move(parts.front());  // (a script that does not compile)
    if (answer.is_error()) {
      auto why = redis::detail::classify(answer.error_message());
      if (!load && answer.error_message().starts_with("NOSCRIPT")) {
        load = true;
        continue;
      }
      // Sent where the slot no longer is, or while it moves: the script wrote nothing. The map
      // is read again, and the call goes again.
      if (why.kind != redis::detail::cluster_error::other && c != nullptr) {
        if (clock::now() + backoff > deadline)
          throw boost::system::system_error(errc::timeout,
                                            fmt::format("{} (at {})", answer.error_message(), node.address()));
        if (why.kind == redis::detail::cluster_error::moved) co_await c->refresh();
        asio::steady_timer pause(ex_, backoff);
        co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
        backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
        continue;
      }
    }
    reply out = redis::script::result(answer.is_error() ? errc::server_error : boost::system::error_code(),
                                      std::move(answer), std::string());
    if (parts.back().is_error())  // (WAIT refused: a replica, or an ACL without it)
      throw boost::system::system_error(errc::server_error,
                                        fmt::format("WAIT at {}: {}", node.address(), parts.back().error_message()));
    auto acknowledged = parts.back().as_integer();
    if (acknowledged < replicas)
      throw boost::system::system_error(errc::not_replicated,
                                        fmt::format("written at {}, but {} of {} replicas acknowledged it within {} ms",
                                                    node.address(), acknowledged, replicas, wait.count()));
    co_return out;
  }
}

redis::blocking_connection& redis_link::replicated_at(const redis::config& node) {
  constexpr std::size_t per_server = 4;  // (a WAIT holds its connection: calls behind it wait)
  std::lock_guard lock(mutex_);
  auto& conns = replicated_[node.address()];
  if (conns.empty()) {
    auto cfg = node;
    if (!cfg.client_name.empty()) cfg.client_name += ":replicated";
    for (std::size_t i = 0; i < per_server; ++i) {
      conns.push_back(std::make_unique<redis::blocking_connection>(ex_, cfg));
      conns.back()->start();
    }
    drop_former_primaries_locked(node.address());
  }
  return *conns[next_replicated_++ % conns.size()];
}

// On a cluster, when a server gets a pool (a failover, a slot moved to a new node), the pools
// of servers that are no longer primaries are closed, so they do not reconnect for ever to a
// failed node (a call still on its way there ends with errc::closed, as at a lost connection).
void redis_link::drop_former_primaries_locked(const std::string& keep) {
  if (!cluster_) return;
  auto primaries = cluster_->primaries();
  auto is_primary = [&](const redis::config& cfg) {
    return std::any_of(primaries.begin(), primaries.end(), [&](const std::string& text) {
      auto a = redis::detail::parse_address(text);
      return a && a->host == cfg.host && std::to_string(a->port) == cfg.port;
    });
  };
  std::erase_if(replicated_, [&](auto& e) {
    if (e.first == keep || e.second.empty() || is_primary(e.second.front()->get_config())) return false;
    for (auto& c : e.second) c->close();
    return true;
  });
}

reply reply_of(const boost::system::system_error& e) {
  auto why = reason_of(e);
  return why.empty() ? reply() : reply::make_string(std::move(why), redis::reply_kind::error);
}

asio::awaitable<std::pair<boost::system::error_code, reply>> redis_link::try_exec(request req,
                                                                                  const std::string& route) {
  try {
    if (auto* c = co_await cluster(req.options.timeout)) {
      std::vector<std::string> keys{route};
      co_return co_await c->try_exec(std::move(req), std::move(keys));
    }
  } catch (const boost::system::system_error& e) {
    co_return std::pair(e.code(), reply_of(e));
  }
  auto [ec, r] = co_await plain_.async_exec(std::move(req), asio::as_tuple(asio::use_awaitable));
  co_return std::pair(ec, std::move(r));
}

asio::awaitable<redis::config> redis_link::node_of(const std::string& route) {
  if (auto* c = co_await cluster()) co_return co_await c->primary_of(route);
  co_return cfg_;
}

void redis_link::exec_at(const redis::config& node, request req,
                         std::function<void(boost::system::error_code, reply)> done) {
  if (mode_.load(std::memory_order_acquire) != clustered) {
    plain_.async_exec(std::move(req), std::move(done));
    return;
  }
  asio::co_spawn(ex_, cluster_->try_exec_at(node, std::move(req)),
                 [done = std::move(done)](std::exception_ptr e, std::pair<boost::system::error_code, reply> r) {
                   if (!e) return done(r.first, std::move(r.second));
                   try {
                     std::rethrow_exception(e);
                   } catch (const boost::system::system_error& failed) {
                     done(failed.code(), reply_of(failed));
                   } catch (...) {
                     done(errc::closed, reply());
                   }
                 });
}

}  // namespace jobrt::detail
