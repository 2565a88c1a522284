#include "redis/subscriptions.hpp"

#include <algorithm>
#include <utility>

namespace jobrt::redis::detail {

std::optional<subscriptions::command> subscriptions::change(std::vector<std::string> names, bool pattern, bool add) {
  auto& set = pattern ? patterns_ : channels_;
  std::vector<std::string> changed;
  for (auto& n : names)
    if (add ? set.insert(n).second : set.erase(n) > 0) changed.push_back(std::move(n));
  if (changed.empty()) return std::nullopt;
  const char* name = add ? (pattern ? "PSUBSCRIBE" : "SUBSCRIBE") : (pattern ? "PUNSUBSCRIBE" : "UNSUBSCRIBE");
  return command{name, std::move(changed), pattern};
}

std::vector<subscriptions::command> subscriptions::resubscribe() const {
  std::vector<command> out;
  if (!channels_.empty()) out.push_back({"SUBSCRIBE", {channels_.begin(), channels_.end()}, false});
  if (!patterns_.empty()) out.push_back({"PSUBSCRIBE", {patterns_.begin(), patterns_.end()}, true});
  return out;
}

void subscriptions::forget(const std::vector<std::string>& names, bool pattern) {
  auto& set = pattern ? patterns_ : channels_;
  for (const auto& n : names) set.erase(n);
}

std::optional<message> subscriptions::from_push(reply& r) {
  if (r.kind() != reply_kind::array) return std::nullopt;
  auto& e = r.as_array();
  if (e.empty() || e[0].kind() != reply_kind::string) return std::nullopt;
  const std::string& kind = e[0].as_string();
  // The reply is the caller's and dropped after this: its strings move into the message.
  auto take = [](reply& part) { return std::move(const_cast<std::string&>(part.as_string())); };
  if (kind == "message" && e.size() == 3 && e[1].kind() == reply_kind::string && e[2].kind() == reply_kind::string)
    return message{take(e[1]), take(e[2]), {}, false};
  if (kind == "pmessage" && e.size() == 4 && e[2].kind() == reply_kind::string && e[3].kind() == reply_kind::string)
    return message{take(e[2]), take(e[3]), take(e[1]), false};
  return std::nullopt;
}

std::size_t subscriptions::queue(message m, std::size_t limit) {
  if (messages_.size() >= std::max<std::size_t>(limit, 1) && !m.confirmation) {
    auto dropped = messages_.size() + 1;
    messages_.clear();
    messages_.push_back(message{{}, {}, {}, true});
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
