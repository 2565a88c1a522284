// The lock in this process: the same steps as runtime/lua/lock_*.lua on a map under a mutex.
// Releases wake waiters directly (no pub/sub), expiry is checked lazily against steady_clock.
#include "lock/lock_core.hpp"

#include <deque>

namespace asio = boost::asio;

namespace jobrt {
namespace detail {
namespace {

class memory_lock_core final : public lock_core {
 public:
  explicit memory_lock_core(asio::any_io_executor ex) : lock_core(std::move(ex)) {}

  asio::awaitable<acquire_result> acquire(const std::string& name, const std::string& token, const lock_options& o,
                                          bool queue, std::chrono::milliseconds left,
                                          std::chrono::milliseconds) override {
    std::lock_guard lock(m_);
    auto now = lock_clock::now();
    auto& e = locks_[name];
    bool held = !e.token.empty() && now < e.expires;
    if (held && e.token == token) co_return acquire_result{true, fences_[name], {}};

    const ticket_entry* head = nullptr;
    if (o.order == lock_order::fifo) {
      while (!e.queue.empty() && e.queue.front().deadline <= now) e.queue.pop_front();  // dead waiters
      if (!e.queue.empty()) head = &e.queue.front();
    }
    if (!held && (head == nullptr || head->token == token)) {
      if (head != nullptr) e.queue.pop_front();
      e.token = token;
      e.expires = now + o.ttl;
      co_return acquire_result{true, ++fences_[name], {}};
    }
    if (queue && o.order == lock_order::fifo) {
      auto it = std::find_if(e.queue.begin(), e.queue.end(), [&](const ticket_entry& t) { return t.token == token; });
      if (it == e.queue.end()) it = e.queue.insert(e.queue.end(), ticket_entry{token, {}, o.ttl});
      it->deadline = now + left + std::chrono::seconds(1);
      head = &e.queue.front();
    }
    auto until = held ? e.expires : head->deadline;
    co_return acquire_result{false, 0, std::chrono::ceil<std::chrono::milliseconds>(until - now)};
  }

  asio::awaitable<release_result> release(const std::string& name, const std::string& token, lock_order order,
                                          const local_handoff* next) override {
    std::string granted;
    std::int64_t fence = 0;
    bool owned = false;
    std::optional<std::int64_t> handed;
    {
      std::lock_guard lock(m_);
      auto it = locks_.find(name);
      if (it == locks_.end()) co_return release_result{};
      auto& e = it->second;
      auto now = lock_clock::now();
      if (order == lock_order::fifo) std::erase_if(e.queue, [&](const ticket_entry& t) { return t.token == token; });
      bool free = e.token.empty() || now >= e.expires;
      owned = !free && e.token == token;
      if (owned || free) e.token.clear();
      // As lock_release.lua: a free lock goes to the head of the FIFO queue; also when the one
      // leaving was a waiter (it may have been the head the free lock waited for).
      if (order == lock_order::fifo && (owned || free)) {
        while (!e.queue.empty() && e.queue.front().deadline <= now) e.queue.pop_front();
        if (!e.queue.empty()) {
          e.token = granted = e.queue.front().token;
          e.expires = now + e.queue.front().ttl;
          e.queue.pop_front();
          fence = ++fences_[name];
        }
      }
      if (owned && order == lock_order::any && next != nullptr) {  // to a waiter of the caller's
        e.token = next->token();
        e.expires = now + next->ttl;
        handed = ++fences_[name];
      }
      if (e.token.empty() && e.queue.empty()) locks_.erase(it);
    }
    release_result out;
    out.owned = owned;
    out.handed = handed;
    if (handed) co_return out;
    if (!granted.empty())
      grant(name, granted, fence);
    else if (owned)
      wake(name);
    co_return out;
  }

  asio::awaitable<std::vector<bool>> renew(std::vector<renew_item> items, std::chrono::milliseconds) override {
    std::vector<bool> out;
    std::lock_guard lock(m_);
    auto now = lock_clock::now();
    for (auto& item : items) {
      auto it = locks_.find(item.name);
      bool held = it != locks_.end() && it->second.token == item.token && now < it->second.expires;
      if (held) it->second.expires = now + item.ttl;
      out.push_back(held);
    }
    co_return out;
  }

 private:
  struct ticket_entry {
    std::string token;
    lock_clock::time_point deadline;
    std::chrono::milliseconds ttl;
  };
  struct entry {
    std::string token;  // empty: free
    lock_clock::time_point expires;
    std::deque<ticket_entry> queue;
  };

  std::mutex m_;
  std::unordered_map<std::string, entry> locks_;
  // Kept for good, as Redis keeps the fence keys: a fence must grow across the lock's lifetimes.
  std::unordered_map<std::string, std::int64_t> fences_;
};

}  // namespace
}  // namespace detail

memory_lock_service::memory_lock_service(asio::any_io_executor ex)
    : lock_service(std::make_shared<detail::memory_lock_core>(std::move(ex))) {}

memory_lock_service::~memory_lock_service() = default;

}  // namespace jobrt
