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
    asio::co_spawn(self->strand_, place(self, std::move(channel), false), asio::detached);
  });
}

void shard_listener::close() {
  closed_ = true;
  asio::post(strand_, [self = shared_from_this()] {
    self->recheck_timer_.cancel();
    for (auto& [address, sub] : self->subscribers_) sub->close();
  });
}

void shard_listener::notify_missed() {
  redis::message notice;
  notice.confirmation = true;
  on_message_(notice);
}

// Subscribes `channel` at the node serving it now (after reading the slot map again, when the
// last node dropped it). Retried after a pause while that cannot be found out.
asio::awaitable<void> shard_listener::place(std::shared_ptr<shard_listener> self, std::string channel, bool read_map) {
  auto pause = std::chrono::milliseconds(100);
  while (!self->closed_) {
    std::string failure;
    try {
      auto* cluster = co_await self->link_->cluster();
      if (cluster && read_map) co_await cluster->refresh();
      auto node = co_await self->link_->node_of(channel);
      if (self->closed_) co_return;
      self->where_[channel] = node.address();
      self->subscriber_at(node).ssubscribe(std::vector<std::string>(1, channel));
      if (cluster && !std::exchange(self->rechecking_, true))
        asio::co_spawn(self->strand_, recheck_loop(self), asio::detached);
      co_return;
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
    // The loop holds the subscriber by pointer: it ends when the subscriber is closed, which
    // only close() does (the subscriber lives as long as this listener).
    asio::co_spawn(strand_, receive(shared_from_this(), sub.get(), node.address()), asio::detached);
  }
  return *sub;
}

asio::awaitable<void> shard_listener::receive(std::shared_ptr<shard_listener> self, redis::subscriber* sub,
                                              std::string address) {
  for (;;) {
    auto [ec, m] = co_await sub->async_receive(use_tuple);
    if (ec || self->closed_) co_return;
    if (!m.dropped) {
      self->on_message_(m);
      continue;
    }
    // Its slot moved (or this node never served it): where it is now, and meanwhile messages
    // may have been missed.
    auto at = self->where_.find(m.channel);
    if (at == self->where_.end() || at->second != address) continue;  // (placed elsewhere since)
    self->where_.erase(at);
    self->notify_missed();
    asio::co_spawn(self->strand_, place(self, std::move(m.channel), true), asio::detached);
  }
}

// A failover moves slots to another node without a word to the subscribers of the one that
// failed (it is gone): the cluster client's slot map says so; each channel whose slot is
// served elsewhere now is subscribed there.
asio::awaitable<void> shard_listener::recheck_loop(std::shared_ptr<shard_listener> self) {
  while (!self->closed_) {
    self->recheck_timer_.expires_after(self->recheck_);
    co_await self->recheck_timer_.async_wait(use_tuple);
    auto before = self->where_;  // (a copy: place() changes it while this waits)
    std::set<std::string> left;  // addresses channels moved away from
    for (const auto& [channel, address] : before) {
      if (self->closed_) co_return;
      try {
        auto node = co_await self->link_->node_of(channel);  // (the map as known: no command)
        auto now = self->where_.find(channel);
        if (node.address() == address || now == self->where_.end() || now->second != address) continue;
        self->where_.erase(now);
        left.insert(address);
        co_await place(self, channel, false);
      } catch (const std::exception&) {
        // No primary known for it now: looked at again next time.
      }
    }
    if (left.empty()) continue;
    self->notify_missed();
    // A node that serves none of them now (a failed primary) is not reconnected to for ever.
    for (const auto& [channel, address] : self->where_) left.erase(address);
    for (const auto& address : left) {
      auto it = self->subscribers_.find(address);
      if (it == self->subscribers_.end()) continue;
      it->second->close();
      self->retired_.push_back(std::move(it->second));  // (its receive loop may still look at it)
      self->subscribers_.erase(it);
    }
  }
}

}  // namespace jobrt::detail
