#include <jobrt/redis/cluster.hpp>

#include "redis/cluster_map.hpp"

#include <jobrt/error.hpp>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>

namespace jobrt::redis {

namespace asio = boost::asio;
using boost::system::error_code;
using boost::system::system_error;
using clock = std::chrono::steady_clock;

namespace detail {

namespace {

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

// Awaits an operation co_spawned on the cluster's strand without handing it the caller's
// cancellation: Asio 1.81's co_spawn forwards a cancellation from another executor by posting a
// pointer into its handler, which may be gone by the time it runs (the operation just completed).
// A request ends by its own timeout instead.
auto on_strand() { return asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable); }

std::chrono::milliseconds ms_until(clock::time_point t) {
  return std::max(std::chrono::ceil<std::chrono::milliseconds>(t - clock::now()), std::chrono::milliseconds(1));
}

// The reply the route decides by: for a pipeline, its first command's reply that is the cluster's
// (a redirect or a wait: every command of the slot met it), else the whole reply.
const reply& deciding(const reply& r, bool pipeline) {
  if (!pipeline || r.kind() != reply_kind::array) return r;
  for (const auto& element : r.as_array())
    if (element.is_error() && classify(element.error_message()).kind != cluster_error::other) return element;
  return r;
}

// The name of the request's first command, in capitals ("" when it has none).
std::string first_command(const request& req) {
  // The payload starts "*<argc>\r\n$<length>\r\n<command>\r\n".
  const std::string& p = req.payload();
  auto length_at = p.find("\r\n$");
  auto name_at = length_at == std::string::npos ? length_at : p.find("\r\n", length_at + 3);
  if (name_at == std::string::npos) return {};
  std::size_t length = 0;
  std::from_chars(p.data() + length_at + 3, p.data() + name_at, length);
  std::string name = p.substr(name_at + 2, length);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::toupper(c); });
  return name;
}

// Whether the request may follow an ASK (see cluster_route): one command, not a script's call.
bool follows_ask(const request& req) {
  if (req.size() != 1) return false;
  auto name = first_command(req);
  return !name.starts_with("EVAL") && !name.starts_with("FCALL");
}

// Whether some command of a pipeline ran, by its replies: one that is not an error did (a
// transaction, MULTI ... EXEC, runs whole or not at all: by EXEC's reply). A SCRIPT LOAD ahead of
// the call it loads for (script::run after NOSCRIPT) does not count: loading again is harmless.
bool partly_ran(const request& req, const reply& r) {
  if (r.kind() != reply_kind::array || r.as_array().empty()) return false;
  const auto& replies = r.as_array();
  auto first = first_command(req);
  if (first == "MULTI") return !replies.back().is_error();
  auto from = replies.begin() + (first == "SCRIPT" ? 1 : 0);
  return std::any_of(from, replies.end(), [](const reply& e) { return !e.is_error(); });
}

}  // namespace

class cluster_impl : public std::enable_shared_from_this<cluster_impl> {
 public:
  cluster_impl(asio::any_io_executor ex, std::vector<config> seeds, cluster_options o)
      : strand_(asio::make_strand(ex)),
        seeds_(std::move(seeds)),
        opts_(o),
        refresh_timer_(strand_),
        refreshed_(strand_, clock::time_point::max()) {
    if (seeds_.empty()) throw std::invalid_argument("a cluster connection needs at least one seed node");
    for (const auto& s : seeds_) {
      std::uint16_t port = 0;
      auto [end, ec] = std::from_chars(s.port.data(), s.port.data() + s.port.size(), port);
      if (ec != std::errc() || end != s.port.data() + s.port.size() || port == 0 || !s.unix_path.empty())
        throw std::invalid_argument(fmt::format("cluster seed {}: a host and a port are needed", s.address()));
      seed_nodes_.push_back(node_address{s.host, port});
    }
  }

  void start() {
    asio::post(strand_, [self = shared_from_this()] {
      if (std::exchange(self->started_, true) || self->closed_) return;
      asio::co_spawn(self->strand_, refresh_loop(self), asio::detached);
    });
  }

  void close() {
    asio::post(strand_, [self = shared_from_this()] {
      self->closed_ = true;
      self->refresh_timer_.cancel();
      self->refreshed_.cancel();
      for (auto& [node, conn] : self->conns_) conn->close();
    });
  }

  // An error reply comes back as (errc::server_error, the reply); other failures are thrown.
  static asio::awaitable<std::pair<error_code, reply>> exec(std::shared_ptr<cluster_impl> self, request req,
                                                            std::optional<std::uint16_t> slot) {
    co_return co_await asio::co_spawn(self->strand_, self->run(std::move(req), slot), on_strand());
  }

  static asio::awaitable<config> primary_of(std::shared_ptr<cluster_impl> self, std::uint16_t slot) {
    co_return co_await asio::co_spawn(self->strand_, self->find_primary(slot), on_strand());
  }

  static asio::awaitable<void> refresh_now(std::shared_ptr<cluster_impl> self) {
    co_await asio::co_spawn(self->strand_, self->refresh(clock::now() + self->opts_.request_timeout), on_strand());
  }

  static asio::awaitable<std::pair<error_code, reply>> exec_at(std::shared_ptr<cluster_impl> self, node_address node,
                                                               request req) {
    co_return co_await asio::co_spawn(self->strand_, self->run_at(std::move(node), std::move(req)), on_strand());
  }

  std::vector<std::string> primaries() const {
    std::lock_guard lock(mutex_);
    return primaries_;
  }
  std::size_t connections() const { return connections_.load(std::memory_order_relaxed); }
  std::uint64_t refreshes() const { return refreshes_.load(std::memory_order_relaxed); }

 private:
  asio::awaitable<std::pair<error_code, reply>> run(request req, std::optional<std::uint16_t> slot) {
    auto limit = req.options.timeout.count() > 0 ? req.options.timeout : opts_.request_timeout;
    auto deadline = clock::now() + limit;
    if (!refreshes()) co_await refresh(deadline);
    cluster_route route(map_, slot, any_node(), deadline, follows_ask(req));
    auto a = route.next(clock::now());
    for (;;) {
      if (closed_) throw system_error(errc::closed, "cluster connection");
      if (a.refresh) refresh_soon();
      if (a.kind == cluster_route::action::fail) {
        auto why = last_refresh_error_.empty() ? a.error : fmt::format("{}; {}", a.error, last_refresh_error_);
        throw system_error(errc::timeout, why);
      }
      if (a.kind == cluster_route::action::wait) {
        asio::steady_timer pause(strand_, a.delay);
        co_await pause.async_wait(use_tuple);
        a = route.next(clock::now());
        continue;
      }
      auto& conn = at(a.node);
      request sent;
      if (a.asking) sent.push("ASKING");
      sent.append(req);
      sent.options = req.options;
      sent.options.timeout = ms_until(deadline);
      // A primary whose connection is down is not waited for: it may be failing over, and the
      // map may name another one by now.
      sent.options.wait_for_reconnect = false;
      auto [ec, r] = co_await conn.async_exec(std::move(sent), use_tuple);
      // Not sent, or lost on the way where sending again is safe: the primary may be failing over.
      if (ec == errc::not_connected || (ec == errc::connection_lost && req.options.resend_safe)) {
        a = route.on_unreachable(fmt::format("{} cannot be reached: {}", a.node.text(), conn.last_error()),
                                 clock::now());
        continue;
      }
      if (ec && ec != errc::server_error) throw system_error(ec, fmt::format("at {}", a.node.text()));
      if (a.asking && r.kind() == reply_kind::array && r.as_array().size() == 2) {
        reply answer = std::move(r.as_array()[1]);  // (ASKING's own reply first; one command follows ASK)
        r = std::move(answer);
      }
      a = route.on_reply(deciding(r, req.size() > 1), clock::now());
      // A pipeline that met a redirect or a wait after some of its commands ran is not sent
      // again whole (they would run twice) unless that is safe (resend_safe): its caller gets
      // the replies, the cluster's error in place of each command that did not run.
      if (a.kind == cluster_route::action::done || (req.size() > 1 && !req.options.resend_safe && partly_ran(req, r)))
        co_return std::pair(r.is_error() ? error_code(errc::server_error) : error_code(), std::move(r));
    }
  }

  asio::awaitable<std::pair<error_code, reply>> run_at(node_address node, request req) {
    if (closed_) throw system_error(errc::closed, "cluster connection");
    if (req.options.timeout.count() <= 0) req.options.timeout = opts_.request_timeout;
    auto address = node.text();
    auto [ec, r] = co_await at(std::move(node)).async_exec(std::move(req), use_tuple);
    if (ec && ec != errc::server_error) throw system_error(ec, "at " + address);
    co_return std::pair(ec, std::move(r));
  }

  asio::awaitable<config> find_primary(std::uint16_t slot) {
    auto deadline = clock::now() + opts_.request_timeout;
    if (!refreshes()) co_await refresh(deadline);
    while (!map_.owner(slot)) {
      if (closed_) throw system_error(errc::closed, "cluster connection");
      if (clock::now() >= deadline)
        throw system_error(errc::timeout, fmt::format("no primary serves slot {}; {}", slot, last_refresh_error_));
      asio::steady_timer pause(strand_, std::chrono::milliseconds(100));
      co_await pause.async_wait(use_tuple);
      co_await refresh(deadline);
    }
    auto cfg = seeds_.front();
    cfg.host = map_.owner(slot)->host;
    cfg.port = std::to_string(map_.owner(slot)->port);
    co_return cfg;
  }

  // The connection to `node`, opened on first use with the first seed's settings.
  connection& at(node_address node) {
    if (node.host.empty()) node.host = seed_nodes_.front().host;  // (a host the route could not name)
    auto it = conns_.find(node);
    if (it == conns_.end()) {
      auto cfg = seeds_.front();
      cfg.host = node.host;
      cfg.port = std::to_string(node.port);
      it = conns_.emplace(node, std::make_unique<connection>(strand_, std::move(cfg))).first;
      it->second->start();
      connections_.fetch_add(1, std::memory_order_relaxed);
    }
    return *it->second;
  }

  node_address any_node() const {
    auto primaries = map_.primaries();
    return primaries.empty() ? seed_nodes_.front() : primaries.front();
  }

  // Reads the slot map from the first node that gives one: the primaries known, then the seeds.
  // One read at a time; a caller that comes during one waits for it (up to its deadline).
  asio::awaitable<void> refresh(clock::time_point deadline) {
    if (refreshing_) {
      // Until the refresh ends (refreshed_, which never expires, is cancelled) or this caller's
      // deadline: each waiter has a timer of its own, since moving refreshed_'s expiry would
      // cancel every other waiter's wait, and they would wake one another in turn until the end.
      using namespace asio::experimental::awaitable_operators;
      asio::steady_timer limit(strand_, deadline);
      while (refreshing_ && !closed_ && clock::now() < deadline)
        co_await (refreshed_.async_wait(use_tuple) || limit.async_wait(use_tuple));
      co_return;
    }
    refreshing_ = true;
    auto candidates = map_.primaries();
    for (const auto& seed : seed_nodes_)
      if (std::find(candidates.begin(), candidates.end(), seed) == candidates.end()) candidates.push_back(seed);
    // Those connected now first: a primary that just died would hold the read up for a connect
    // timeout.
    std::stable_partition(candidates.begin(), candidates.end(), [&](const node_address& n) {
      auto it = conns_.find(n);
      return it != conns_.end() && it->second->is_connected();
    });
    std::string errors;
    bool read = false;
    for (const auto& node : candidates) {
      if (closed_ || clock::now() >= deadline) break;
      auto& conn = at(node);
      auto ask = [&](const char* subcommand) -> asio::awaitable<std::tuple<error_code, reply>> {
        request r("CLUSTER", subcommand);
        r.options.timeout = std::min(ms_until(deadline), conn.get_config().connect_timeout);
        r.options.resend_safe = true;
        co_return co_await conn.async_exec(std::move(r), use_tuple);
      };
      auto [ec, r] = co_await ask("SHARDS");
      bool shards = true;
      if (ec == errc::server_error && r.error_message().find("unknown subcommand") != std::string_view::npos) {
        std::tie(ec, r) = co_await ask("SLOTS");  // before Redis 7
        shards = false;
      }
      try {
        if (ec) throw std::runtime_error(ec == errc::server_error ? std::string(r.error_message()) : ec.message());
        auto asked = conn.get_config().host;  // (a node learned from a MOVED without a host: the seed's)
        auto topology = shards ? parse_cluster_shards(r, asked) : parse_cluster_slots(r, asked);
        if (topology.empty()) throw std::runtime_error("it serves no slot");
        map_ = slot_map(topology);
        read = true;
        break;
      } catch (const std::exception& e) {
        errors += fmt::format("{}{}: {}", errors.empty() ? "" : "; ", node.text(), e.what());
      }
    }
    if (read) {
      last_refresh_error_.clear();
      std::vector<std::string> names;
      for (const auto& p : map_.primaries()) names.push_back(p.text());
      {
        std::lock_guard lock(mutex_);
        primaries_ = std::move(names);
      }
      refreshes_.fetch_add(1, std::memory_order_relaxed);
      retire_unserving();
    } else if (!errors.empty()) {
      last_refresh_error_ = "reading the slot map: " + errors;
    }
    last_refresh_ = clock::now();
    refreshing_ = false;
    refreshed_.cancel();
  }

  // Connections to nodes that serve no slot now and cannot be reached (a primary that failed),
  // seeds aside, are closed: they would reconnect for ever. (Kept until the client closes: run()
  // may still look at one after its request ended.)
  void retire_unserving() {
    auto primaries = map_.primaries();
    auto among = [](const std::vector<node_address>& nodes, const node_address& n) {
      return std::find(nodes.begin(), nodes.end(), n) != nodes.end();
    };
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (it->second->is_connected() || among(primaries, it->first) || among(seed_nodes_, it->first)) {
        ++it;
        continue;
      }
      it->second->close();
      retired_.push_back(std::move(it->second));
      it = conns_.erase(it);
    }
  }

  // A refresh in the background (after a MOVED, or a primary that cannot be reached), unless one
  // is under way or one ended just now.
  void refresh_soon() {
    if (refreshing_ || closed_ || clock::now() - last_refresh_ < std::chrono::milliseconds(100)) return;
    asio::co_spawn(
        strand_,
        [self = shared_from_this()]() -> asio::awaitable<void> {
          co_await self->refresh(clock::now() + self->opts_.request_timeout);
        },
        asio::detached);
  }

  static asio::awaitable<void> refresh_loop(std::shared_ptr<cluster_impl> self) {
    while (!self->closed_) {
      if (self->refreshes() > 0) {
        self->refresh_timer_.expires_after(self->opts_.refresh_period);
        co_await self->refresh_timer_.async_wait(use_tuple);
        if (self->closed_) break;
      }
      co_await self->refresh(clock::now() + self->opts_.request_timeout);
      if (self->refreshes() == 0 && !self->closed_) {  // no seed answered yet: again after a pause
        self->refresh_timer_.expires_after(std::chrono::milliseconds(500));
        co_await self->refresh_timer_.async_wait(use_tuple);
      }
    }
  }

  asio::strand<asio::any_io_executor> strand_;
  std::vector<config> seeds_;
  std::vector<node_address> seed_nodes_;
  cluster_options opts_;
  slot_map map_;
  std::map<node_address, std::unique_ptr<connection>> conns_;
  std::vector<std::unique_ptr<connection>> retired_;  // closed (see retire_unserving)
  asio::steady_timer refresh_timer_;
  asio::steady_timer refreshed_;  // waits for a refresh under way; cancelled when it ends
  clock::time_point last_refresh_{};
  std::string last_refresh_error_;
  bool refreshing_ = false;
  bool started_ = false;
  bool closed_ = false;
  mutable std::mutex mutex_;  // guards primaries_
  std::vector<std::string> primaries_;
  std::atomic<std::size_t> connections_{0};
  std::atomic<std::uint64_t> refreshes_{0};
};

}  // namespace detail

cluster_connection::cluster_connection(asio::any_io_executor ex, std::vector<config> seeds, cluster_options o)
    : impl_(std::make_shared<detail::cluster_impl>(std::move(ex), std::move(seeds), o)) {}

cluster_connection::~cluster_connection() { close(); }

void cluster_connection::start() { impl_->start(); }
void cluster_connection::close() { impl_->close(); }

asio::awaitable<std::pair<error_code, reply>> cluster_connection::try_exec(request req, std::vector<std::string> keys) {
  auto slot = detail::common_slot(keys);  // (throws before anything is sent)
  co_return co_await detail::cluster_impl::exec(impl_, std::move(req), slot);
}

asio::awaitable<reply> cluster_connection::exec(request req, std::vector<std::string> keys) {
  auto [ec, r] = co_await try_exec(std::move(req), std::move(keys));
  if (ec) throw system_error(ec, std::string(r.error_message()));
  co_return r;
}

asio::awaitable<config> cluster_connection::primary_of(std::string key) {
  co_return co_await detail::cluster_impl::primary_of(impl_, detail::key_slot(key));
}

asio::awaitable<void> cluster_connection::refresh() { co_await detail::cluster_impl::refresh_now(impl_); }

asio::awaitable<std::pair<error_code, reply>> cluster_connection::try_exec_at(const config& node, request req) {
  auto address = detail::parse_address(fmt::format("{}:{}", node.host, node.port));
  if (!address)
    throw std::invalid_argument(fmt::format("cluster node {}: a host and a port are needed", node.address()));
  co_return co_await detail::cluster_impl::exec_at(impl_, std::move(*address), std::move(req));
}

std::vector<std::string> cluster_connection::primaries() const { return impl_->primaries(); }
std::size_t cluster_connection::connections() const { return impl_->connections(); }
std::uint64_t cluster_connection::refreshes() const { return impl_->refreshes(); }

std::vector<config> cluster_seeds(std::string_view url) {
  auto scheme_end = url.find("://");
  // (A URL without a scheme gets an error naming what is wrong; a Sentinel URL's hosts are
  // sentinels, not nodes.)
  if (scheme_end == std::string_view::npos || url.substr(0, scheme_end).ends_with("+sentinel"))
    return {config::from_url(url)};
  auto authority_begin = scheme_end + 3;
  auto authority_end = url.find_first_of("/?#", authority_begin);
  if (authority_end == std::string_view::npos) authority_end = url.size();
  auto authority = url.substr(authority_begin, authority_end - authority_begin);
  auto at = authority.rfind('@');
  auto userinfo = at == std::string_view::npos ? std::string_view() : authority.substr(0, at + 1);
  auto hosts = at == std::string_view::npos ? authority : authority.substr(at + 1);
  std::vector<config> seeds;
  for (std::size_t begin = 0;;) {
    auto end = hosts.find(',', begin);
    auto host = hosts.substr(begin, end == std::string_view::npos ? std::string_view::npos : end - begin);
    seeds.push_back(config::from_url(
        fmt::format("{}{}{}{}", url.substr(0, authority_begin), userinfo, host, url.substr(authority_end))));
    if (end == std::string_view::npos) break;
    begin = end + 1;
  }
  return seeds;
}

asio::awaitable<bool> is_cluster(connection& c) {
  auto info = co_await exec(c, request("INFO", "cluster"));
  co_return info.as_string().find("cluster_enabled:1") != std::string::npos;
}

}  // namespace jobrt::redis
