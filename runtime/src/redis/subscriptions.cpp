#include "redis/subscriptions.hpp"

#include <algorithm>
#include <utility>

namespace jobrt::redis::detail {

std::vector<subscriptions::command> subscriptions::change(std::vector<std::string> names, channel_kind kind, bool add) {
  if (kind == channel_kind::shard && !add) return {};
  auto& set = set_of(kind);
  std::vector<std::string> changed;
  for (auto& n : names)
    if (add ? set.insert(n).second : set.erase(n) > 0) changed.push_back(std::move(n));
  std::vector<command> out;
  if (changed.empty()) return out;
  if (kind == channel_kind::shard) {
    for (auto& n : changed) out.push_back({"SSUBSCRIBE", {std::move(n)}, kind});
    return out;
  }
  bool pattern = kind == channel_kind::pattern;
  const char* name = add ? (pattern ? "PSUBSCRIBE" : "SUBSCRIBE") : (pattern ? "PUNSUBSCRIBE" : "UNSUBSCRIBE");
  out.push_back({name, std::move(changed), kind});
  return out;
}

std::vector<subscriptions::command> subscriptions::resubscribe() const {
  std::vector<command> out;
  if (!channels_.empty()) out.push_back({"SUBSCRIBE", {channels_.begin(), channels_.end()}, channel_kind::channel});
  if (!patterns_.empty()) out.push_back({"PSUBSCRIBE", {patterns_.begin(), patterns_.end()}, channel_kind::pattern});
  for (const auto& n : shards_) out.push_back({"SSUBSCRIBE", {n}, channel_kind::shard});
  return out;
}

void subscriptions::forget(const std::vector<std::string>& names, channel_kind kind) {
  auto& set = set_of(kind);
  for (const auto& n : names) set.erase(n);
}

std::optional<message> subscriptions::from_push(reply& r) {
  if (r.kind() != reply_kind::array) return std::nullopt;
  auto& e = r.as_array();
  if (e.empty() || e[0].kind() != reply_kind::string) return std::nullopt;
  const std::string& kind = e[0].as_string();
  // The reply is the caller's and dropped after this: its strings move into the message.
  auto take = [](reply& part) { return std::move(const_cast<std::string&>(part.as_string())); };
  auto strings = [&](std::size_t from) {
    for (auto i = from; i < e.size(); ++i)
      if (e[i].kind() != reply_kind::string) return false;
    return true;
  };
  if ((kind == "message" || kind == "smessage") && e.size() == 3 && strings(1))
    return message{take(e[1]), take(e[2]), {}, false};
  if (kind == "pmessage" && e.size() == 4 && strings(1)) return message{take(e[2]), take(e[3]), take(e[1]), false};
  // (Never a reply: no SUNSUBSCRIBE is sent.)
  if (kind == "sunsubscribe" && e.size() == 3 && e[1].kind() == reply_kind::string) {
    shards_.erase(e[1].as_string());
    message m{take(e[1]), {}, {}, false};
    m.dropped = true;
    return m;
  }
  return std::nullopt;
}

std::size_t subscriptions::queue(message m, std::size_t limit) {
  if (messages_.size() >= std::max<std::size_t>(limit, 1) && !m.confirmation && !m.dropped) {
    // The dropped channels' notices stay (nothing else would tell that a channel is gone).
    std::deque<message> kept;
    for (auto& q : messages_)
      if (q.dropped) kept.push_back(std::move(q));
    auto dropped = messages_.size() + 1 - kept.size();
    kept.push_back(message{{}, {}, {}, true});
    messages_ = std::move(kept);
    return dropped;
  }
  messages_.push_back(std::move(m));
  return 0;
}

std::optional<message> subscriptions::next() {
  if (messages_.empty()) return std::nullopt;
  auto m = std::move(messages_.front());
  messages_.pop_front();
  return m;
}

}  // namespace jobrt::redis::detail
