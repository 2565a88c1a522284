#include "redis/shard_listener.hpp"

#include "redis/redis_link.hpp"

#include <jobrt/log.hpp>
#include <jobrt/redis/cluster.hpp>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <vector>

namespace jobrt::detail {

namespace asio = boost::asio;

namespace {
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
}

shard_listener::shard_listener(asio::any_io_executor ex, std::shared_ptr<redis_link> link, std::string role,
                               handler on_message, std::chrono::milliseconds recheck)
    : strand_(asio::make_strand(ex)),
      link_(std::move(link)),
      role_(std::move(role)),
      on_message_(std::move(on_message)),
      recheck_(recheck),
      recheck_timer_(strand_) {}

void shard_listener::listen(std::string channel) {
  asio::post(strand_, [self = shared_from_this(), channel = std::move(channel)]() mutable {
    if (self->closed_ || !self->channels_.insert(channel).second) return;
    asio::co_spawn(self->strand_, place(self, std::move(channel), std::string()), asio::detached);
  });
}

void shard_listener::close() {
  closed_ = true;
  asio::post(strand_, [self = shared_from_this()] {
    self->recheck_timer_.cancel();
    for (auto& [address, sub] : self->subscribers_) sub->close();
  });
}

// Subscribes `channel` at the node serving it now. After a node dropped it (`dropped_by`), the
// slot map is read again first, and while the map still names that node (a map read before the
// move was over, or a cluster that is down) the pause grows: a channel that keeps being refused
// is not asked for again and again. (Each subscription that holds sends a confirmation notice
// that names the channel: one wake-up of its waiters per placement, none per refusal.) Retried
// after a pause while the node cannot be found out; the cluster question is bounded, so a
// listener closed while Redis is unreachable ends within that bound.
asio::awaitable<void> shard_listener::place(std::shared_ptr<shard_listener> self, std::string channel,
                                            std::string dropped_by) {
  auto pause = std::chrono::milliseconds(100);
  bool read_map = !dropped_by.empty();
  while (!self->closed_) {
    std::string failure;
    try {
      auto* cluster = co_await self->link_->cluster(std::chrono::seconds(5));
      if (cluster && read_map) co_await cluster->refresh();
      auto node = co_await self->link_->node_of(channel);
      if (self->closed_) co_return;
      if (node.address() != dropped_by) {
        self->where_[channel] = node.address();
        self->subscriber_at(node).ssubscribe(std::vector<std::string>(1, channel));
        if (cluster && !std::exchange(self->rechecking_, true))
          asio::co_spawn(self->strand_, recheck_loop(self), asio::detached);
        co_return;
      }
      failure = fmt::format("{} dropped it, and the slot map still names it", dropped_by);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    jobrt::log(log_level::warn, "redis", "listening to {}: {} (again in {} ms)", channel, failure, pause.count());
    asio::steady_timer t(self->strand_, pause);
    co_await t.async_wait(use_tuple);
    pause = std::min(pause * 2, std::chrono::milliseconds(5000));
    read_map = true;
  }
}

redis::subscriber& shard_listener::subscriber_at(const redis::config& node) {
  auto& sub = subscribers_[node.address()];
  if (!sub) {
    auto cfg = node;
    cfg.client_name = fmt::format("{}:{}", node.client_name, role_);
    sub = std::make_unique<redis::subscriber>(strand_, std::move(cfg));
    sub->start();
    // The loop holds the subscriber by pointer: it ends when the subscriber is closed (by
    // close(), or by leave() when no channel is left there), which frees it then.
    asio::co_spawn(strand_, receive(shared_from_this(), sub.get(), node.address()), asio::detached);
  }
  return *sub;
}

// `channel` is no longer subscribed where it was; a subscriber left with no channel is closed (a
// node that serves none of them, such as a failed primary, is not reconnected to for ever).
void shard_listener::leave(const std::string& channel) {
  auto at = where_.find(channel);
  if (at == where_.end()) return;
  auto address = std::move(at->second);
  where_.erase(at);
  for (const auto& e : where_)
    if (e.second == address) return;
  auto it = subscribers_.find(address);
  if (it == subscribers_.end()) return;
  it->second->close();
  retired_.push_back(std::move(it->second));  // (its receive loop still looks at it)
  subscribers_.erase(it);
}

asio::awaitable<void> shard_listener::receive(std::shared_ptr<shard_listener> self, redis::subscriber* sub,
                                              std::string address) {
  for (;;) {
    auto [ec, m] = co_await sub->async_receive(use_tuple);
    if (ec || self->closed_) break;
    if (!m.dropped) {
      self->on_message_(m);
      continue;
    }
    // Its slot moved (or this node never served it): placed again where it is now.
    auto at = self->where_.find(m.channel);
    if (at == self->where_.end() || at->second != address) continue;  // (placed elsewhere since)
    self->leave(m.channel);
    asio::co_spawn(self->strand_, place(self, std::move(m.channel), address), asio::detached);
  }
  std::erase_if(self->retired_, [sub](const auto& r) { return r.get() == sub; });
}

// A failover moves slots to another node without a word to the subscribers of the one that
// failed (it is gone): the cluster client's slot map says so; each channel whose slot is
// served elsewhere now is subscribed there.
asio::awaitable<void> shard_listener::recheck_loop(std::shared_ptr<shard_listener> self) {
  while (!self->closed_) {
    self->recheck_timer_.expires_after(self->recheck_);
    co_await self->recheck_timer_.async_wait(use_tuple);
    auto before = self->where_;  // (a copy: place() changes it while this waits)
    for (const auto& e : before) {
      if (self->closed_) co_return;
      const auto& channel = e.first;
      try {
        auto node = co_await self->link_->node_of(channel);  // (the map as known: no command)
        auto now = self->where_.find(channel);
        if (node.address() == e.second || now == self->where_.end() || now->second != e.second) continue;
        self->leave(channel);
        co_await place(self, channel, std::string());
      } catch (const std::exception&) {
        // No primary known for it now: looked at again next time.
      }
    }
  }
}

}  // namespace jobrt::detail
