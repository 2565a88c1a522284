// Each operation mirrors its Lua script (runtime/lua/) step by step, including the scripts' edge
// cases, so that the two backends can be checked against each other. Comments name the Redis
// command a step stands for where the correspondence is not obvious.
#include <jobrt/memory_backend.hpp>

#include <jobrt/error.hpp>

#include "backend/check_walk.hpp"
#include "backend/job_codec.hpp"
#include "backend/wakeups.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <boost/json/parse.hpp>

#include <boost/asio/async_result.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>

#include <algorithm>
#include <charconv>
#include <deque>
#include <functional>
#include <iterator>
#include <list>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string_view>
#include <tuple>
#include <unordered_set>
#include <utility>

namespace jobrt {

namespace asio = boost::asio;

namespace {

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool is_group_lane(std::string_view lane) { return lane.starts_with("g:"); }

// A lease token is '<fence>|<lane>'. Only tokens found in `active` are parsed, and those were
// all made by claim or finish, so the separator is there.
std::string lane_of(const std::string& token) { return token.substr(token.find('|') + 1); }

std::string make_token(std::int64_t fence, const std::string& lane) {
  std::string token = std::to_string(fence);
  token += '|';
  token += lane;
  return token;
}

// finish.lua: string.match(record, '^%d+|([^|]*)|') or ''.
std::string record_id(std::string_view record) { return std::string(detail::script_id(record)); }

// The record with the attempts in its header changed by `change`; a malformed record is left as
// it is (the worker dead-letters it when it runs).
template <class Change>
std::string with_attempts(const std::string& record, Change change) {
  std::size_t digits = 0;
  while (digits < record.size() && record[digits] >= '0' && record[digits] <= '9') ++digits;
  if (digits == 0 || digits == record.size() || record[digits] != '|') return record;
  return std::to_string(change(std::stoll(record.substr(0, digits)))) + record.substr(digits);
}

// One more attempt (reap.lua's `counted`).
std::string counted(const std::string& record) {
  return with_attempts(record, [](long long n) { return n + 1; });
}

// One fewer, not below 0 (resume.lua's skip of a halted job).
std::string uncounted(const std::string& record) {
  return with_attempts(record, [](long long n) { return n > 0 ? n - 1 : n; });
}

// Attempts reset to 0 (resume.lua, requeue.lua).
std::string reset(const std::string& record) {
  return with_attempts(record, [](long long) { return 0LL; });
}

// The records after a group's head, `n` of them, split.
std::vector<job_record> split_all(const std::deque<std::string>& list, std::size_t n) {
  std::vector<job_record> out;
  out.reserve(n);
  for (std::size_t i = 1; i <= n; ++i) out.push_back(detail::split_record(list[i]));
  return out;
}

// How many parked or stale lanes one claim passes over, taking the next lane for each (claim.lua).
constexpr std::size_t claim_passes = 100;

// A refusal, as the scripts make it (JOBRT:<code> on Redis): nothing was changed.
[[noreturn]] void refuse(errc code, const std::string& message) { throw boost::system::system_error(code, message); }

// reap.lua's string.match(record, '"type":"([^"]*)"') or '(unknown)'.
std::string type_in(std::string_view record) {
  auto at = record.find("\"type\":\"");
  if (at == std::string_view::npos) return "(unknown)";
  auto begin = at + 8;
  auto end = record.find('"', begin);
  if (end == std::string_view::npos) return "(unknown)";
  return std::string(record.substr(begin, end - begin));
}

// Whether a record's id was given by the producer: it is not all digits, or (a record written
// before enqueue checked ids) the body's "u" flag says so.
bool unique_of(std::string_view record) {
  auto first = record.find('|');
  auto second = first == std::string_view::npos ? first : record.find('|', first + 1);
  if (second == std::string_view::npos) return false;
  auto id = detail::script_id(record);
  if (!id.empty() && !detail::assigned_id(id)) return true;
  boost::system::error_code ec;
  auto body = boost::json::parse(record.substr(second + 1), ec);
  if (ec || !body.is_object()) return false;
  auto* u = body.as_object().if_contains("u");
  return u && !(u->is_bool() && !u->as_bool());  // Lua's truth: all but nil and false
}

// Starts the timer's wait while holding `m`. Wakers touch a waiter's timer (expires_at) only
// under that mutex too: Asio timers are not thread-safe, and a strand would not do, since the
// waiting coroutine may run on a plain multi-threaded io_context.
template <class Token>
auto async_wait_locked(std::mutex& m, asio::steady_timer& timer, Token&& token) {
  return asio::async_initiate<Token, void(boost::system::error_code)>(
      [&m, &timer](auto handler) {
        std::lock_guard lock(m);
        timer.async_wait(std::move(handler));
      },
      token);
}

}  // namespace

// One queue: what the Redis backend keeps under jobrt:{<queue>}:.
struct memory_backend::queue_state {
  std::deque<std::string> ready;  // lanes: 'j:<record>' or 'g:<group>'
  // g:<group>: pending records; the running job stays at the head. Erased when empty, as Redis
  // deletes an empty list, so that "no entry" and "empty" mean the same thing.
  std::unordered_map<std::string, std::deque<std::string>> groups;
  std::unordered_map<std::string, std::int64_t> active;  // token -> lease deadline (ms)
  // claimed:<worker>. On Redis only BLMOVE fills it; memory has no BLMOVE, so nothing ever does,
  // but claim and release read it as the scripts do.
  std::unordered_map<std::string, std::deque<std::string>> claimed;
  std::unordered_map<std::string, std::int64_t> workers;                // heartbeat deadlines (ms)
  std::unordered_map<std::string, std::vector<std::string>> leases_of;  // leases:<worker>
  std::unordered_set<std::string> ids;                                  // producer-given ids pending or running
  std::unordered_map<std::string, dead_letter> dead;
  // delayed: (due ms, member) in the zset's order; members as in Redis: 'j:<record>', 'g:<group>',
  // 'd:<order>:<length of group>:<group><record>'.
  std::set<std::pair<std::int64_t, std::string>> delayed;
  std::map<std::string, paused_group> paused;
  std::unordered_set<std::string> parked;  // paused groups whose lane is nowhere else
  std::int64_t seq = 0;
  std::int64_t recovered = 0;
  std::int64_t fence = 0;
  std::int64_t enqueued = 0;
  std::int64_t started = 0;
  std::int64_t completed = 0;
  std::int64_t failed = 0;
  std::int64_t retried = 0;
  std::int64_t deferred = 0;
  std::int64_t unhandled = 0;
  std::int64_t halted = 0;
  std::unordered_map<std::string, std::int64_t> types;  // job types workers can run -> until when (ms)
  std::list<waiter*> waiters;                           // claim_waits asleep, first come first woken
};

struct memory_backend::waiter {
  explicit waiter(asio::any_io_executor ex) : timer(std::move(ex)) {}
  asio::steady_timer timer;
  queue_state* queue = nullptr;  // the queue it waits on
  std::list<waiter*>::iterator pos;
  bool listed = false;  // in queue->waiters
  bool woken = false;   // taken off the list by a waker and not yet back to claim
};

// However claim_wait ends (a result, a cancellation, an exception, or its frame destroyed
// unresumed), the waiter leaves the list; a wake it got but did not use goes to the next waiter,
// or a ready lane could be left behind sleeping waiters.
struct memory_backend::wait_guard {
  memory_backend& self;
  waiter& w;
  ~wait_guard() {
    std::lock_guard lock(self.mutex_);
    if (self.leave_locked(w) && !w.queue->ready.empty()) self.wake_locked(*w.queue, 1);
  }
};

memory_backend::memory_backend(asio::any_io_executor ex)
    : executor_(std::move(ex)), delayed_wakeups_(std::make_shared<detail::wakeups>()) {}

memory_backend::~memory_backend() = default;

memory_backend::queue_state& memory_backend::queue_locked(const std::string& name) {
  auto& q = queues_[name];
  if (!q) q = std::make_unique<queue_state>();
  return *q;
}

void memory_backend::wake_locked(queue_state& q, std::size_t lanes) {
  for (; lanes > 0 && !q.waiters.empty(); --lanes) {
    waiter* w = q.waiters.front();
    q.waiters.pop_front();
    w->listed = false;
    w->woken = true;
    // Unlike cancel(), this also covers a waiter that registered but has not started its wait
    // yet: that wait then completes at once.
    w->timer.expires_at(std::chrono::steady_clock::time_point::min());
  }
}

bool memory_backend::leave_locked(waiter& w) {
  if (w.listed) w.queue->waiters.erase(w.pos);
  w.listed = false;
  return std::exchange(w.woken, false);
}

// ZADD delayed, and PUBLISH when the earliest entry is new.
void memory_backend::delay_locked(const std::string& queue, queue_state& q,
                                  std::vector<std::pair<std::int64_t, std::string>> entries) {
  if (entries.empty()) return;
  bool earlier = q.delayed.empty();
  for (auto& e : entries) {
    if (!q.delayed.empty() && e.first < q.delayed.begin()->first) earlier = true;
  }
  for (auto& e : entries) q.delayed.insert(std::move(e));
  if (earlier) delayed_wakeups_->bump(queue);
}

asio::awaitable<std::vector<enqueue_result>> memory_backend::enqueue(std::string queue, std::vector<encoded_job> jobs) {
  std::vector<enqueue_result> out;
  out.reserve(jobs.size());
  std::lock_guard lock(mutex_);
  queue_state& q = queue_locked(queue);

  for (std::size_t i = 0; i < jobs.size(); ++i) {  // as enqueue.lua, before anything is stored
    const auto& job = jobs[i];
    if (auto problem = detail::id_refusal(job.id); !problem.empty()) refuse(errc::bad_job_id, problem);
    if (auto problem = detail::body_refusal(job.body); !problem.empty()) refuse(errc::bad_max_attempts, problem);
    if (auto problem = detail::due_refusal(job, i); !problem.empty()) refuse(errc::bad_due, problem);
  }
  auto missing = std::count_if(jobs.begin(), jobs.end(), [](const encoded_job& j) { return j.id.empty(); });
  auto timed_grouped = std::count_if(jobs.begin(), jobs.end(), [](const encoded_job& j) {
    return (j.run_at_ms > 0 || j.delay_ms > 0) && !j.group.empty();
  });
  std::int64_t next_id = q.seq, next_order = q.seq + missing;
  q.seq += static_cast<std::int64_t>(missing + timed_grouped);

  // The batch's lanes in order; a group's lane takes the place of its first job and is filled in
  // only if the group turns out to be idle.
  std::vector<std::optional<std::string>> lanes;
  struct batch_group {
    std::string name;
    std::vector<std::string> records;
    std::size_t slot = 0;
  };
  std::vector<batch_group> groups;
  std::unordered_map<std::string_view, std::size_t> group_index;
  std::vector<std::pair<std::int64_t, std::string>> later;
  std::int64_t stored = 0;
  std::int64_t now = now_ms();
  for (auto& job : jobs) {
    std::string id = job.id;
    bool duplicate = false;
    if (id.empty()) {
      id = std::to_string(++next_id);
    } else if (!q.ids.insert(id).second) {
      duplicate = true;
    }
    out.push_back({id, duplicate});
    if (duplicate) continue;
    ++stored;
    std::string record = "0|" + id + '|' + job.body;
    std::int64_t due = job.run_at_ms > 0 ? job.run_at_ms : job.delay_ms > 0 ? now + job.delay_ms : 0;
    if (due > now) {
      later.emplace_back(due, job.group.empty()
                                  ? "j:" + std::move(record)
                                  : fmt::format("d:{:016}:{}:{}{}", ++next_order, job.group.size(), job.group, record));
      continue;
    }
    if (job.group.empty()) {
      lanes.emplace_back("j:" + std::move(record));
      continue;
    }
    auto [it, added] = group_index.try_emplace(job.group, groups.size());
    if (added) {
      lanes.emplace_back();
      groups.push_back({job.group, {}, lanes.size() - 1});
    }
    groups[it->second].records.push_back(std::move(record));
  }

  for (auto& g : groups) {
    auto& list = q.groups[g.name];
    // RPUSH returned the batch's own length: the group had no pending or running job.
    bool idle = list.empty();
    std::move(g.records.begin(), g.records.end(), std::back_inserter(list));
    if (idle) lanes[g.slot] = "g:" + g.name;
  }
  std::size_t made_ready = 0;
  for (auto& lane : lanes) {
    if (!lane) continue;
    q.ready.push_back(std::move(*lane));
    ++made_ready;
  }
  q.enqueued += stored;
  wake_locked(q, made_ready);
  delay_locked(queue, q, std::move(later));
  co_return out;
}

std::vector<claimed_job> memory_backend::claim_locked(queue_state& q, const claim_options& opts) {
  std::vector<claimed_job> out;
  auto max = std::min(opts.max, max_claim), ahead = std::min(opts.ahead, max_ahead);
  if (max == 0) return out;
  // The lanes the worker's blocking claim moved first (LPOP claimed max), then from ready. A lane
  // parked or dropped on the way is replaced by the next, up to claim_passes of them (claim.lua).
  std::vector<std::string> batch;
  if (auto mine = q.claimed.find(opts.worker); mine != q.claimed.end()) {
    auto& list = mine->second;
    while (batch.size() < max && !list.empty()) {
      batch.push_back(std::move(list.front()));
      list.pop_front();
    }
    if (list.empty()) q.claimed.erase(mine);
  }
  // Which lanes are live and how many fences they take, then one INCRBY, as in claim.lua.
  std::vector<std::pair<std::string, std::deque<std::string>*>> taken;
  std::int64_t fences = 0;
  std::size_t passed = 0, asked = 0;  // asked: how many lanes the last pop from ready asked for
  for (;;) {
    for (auto& lane : batch) {
      if (!is_group_lane(lane)) {
        taken.emplace_back(std::move(lane), nullptr);
        ++fences;
        continue;
      }
      auto group = q.groups.find(lane.substr(2));
      if (group == q.groups.end()) {  // a stale lane of an emptied group is dropped
        ++passed;
        continue;
      }
      if (q.paused.contains(group->first)) {
        q.parked.insert(group->first);
        ++passed;
        continue;
      }
      fences += static_cast<std::int64_t>(std::min(group->second.size() - 1, ahead) + 1);
      taken.emplace_back(std::move(lane), &group->second);
    }
    auto need = max - taken.size();
    if (need == 0 || passed >= claim_passes || batch.size() < asked) break;
    batch.clear();
    asked = need;
    while (batch.size() < need && !q.ready.empty()) {  // LPOP ready need
      batch.push_back(std::move(q.ready.front()));
      q.ready.pop_front();
    }
    if (batch.empty()) break;
  }
  if (taken.empty()) return out;
  std::int64_t deadline = now_ms() + opts.lease_ttl.count();
  q.fence += fences;
  std::int64_t fence = q.fence - fences;
  out.reserve(taken.size());
  for (auto& [lane, list] : taken) {
    claimed_job job;
    job.fence = ++fence;
    job.token = make_token(fence, lane);
    if (list) {
      job.group = lane.substr(2);
      job.job = detail::split_record(list->front());
      auto followers = std::min(list->size() - 1, ahead);
      job.ahead = split_all(*list, followers);
      fence += static_cast<std::int64_t>(followers);
    } else {
      job.job = detail::split_record(std::string_view(lane).substr(2));
    }
    q.active[job.token] = deadline;
    out.push_back(std::move(job));
  }
  q.started += static_cast<std::int64_t>(out.size());
  return out;
}

asio::awaitable<std::vector<claimed_job>> memory_backend::claim(std::string queue, claim_options opts) {
  std::lock_guard lock(mutex_);
  co_return claim_locked(queue_locked(queue), opts);
}

asio::awaitable<std::vector<claimed_job>> memory_backend::claim_wait(std::string queue, claim_options opts,
                                                                     std::chrono::milliseconds wait) {
  auto deadline = std::chrono::steady_clock::now() + wait;
  waiter w(co_await asio::this_coro::executor);
  {
    std::lock_guard lock(mutex_);
    w.queue = &queue_locked(queue);
  }
  wait_guard guard{*this, w};
  for (;;) {
    // Checked before every claim, not only after a wait: jobs claimed for a cancelled caller
    // would stay leased to nobody until a reaper took them back.
    auto state = co_await asio::this_coro::cancellation_state;
    if (state.cancelled() != asio::cancellation_type::none) {
      throw boost::system::system_error(asio::error::operation_aborted, "claim_wait");
    }
    std::vector<claimed_job> jobs;
    bool waiting = false, again = false;
    {
      std::lock_guard lock(mutex_);
      queue_state& q = *w.queue;
      bool woken = leave_locked(w);
      jobs = claim_locked(q, opts);
      // This wake may have stood for more lanes than this claim took.
      if (woken && !q.ready.empty()) wake_locked(q, 1);
      // Nothing, though lanes are ready: the claim passed over claim_passes parked ones. Again.
      again = jobs.empty() && opts.max > 0 && !q.ready.empty();
      waiting = jobs.empty() && !again && opts.max > 0 && std::chrono::steady_clock::now() < deadline;
      if (waiting) {
        w.timer.expires_at(deadline);
        w.pos = q.waiters.insert(q.waiters.end(), &w);
        w.listed = true;
      }
    }
    if (again) continue;
    if (!waiting) co_return jobs;

    boost::system::error_code ec;  // operation_aborted when woken too; the loop finds out why
    co_await async_wait_locked(mutex_, w.timer, asio::redirect_error(asio::use_awaitable, ec));
  }
}

asio::awaitable<std::vector<finish_result>> memory_backend::finish(std::string queue, std::string /*worker*/,
                                                                   std::vector<finish_item> items,
                                                                   std::chrono::milliseconds lease_ttl) {
  std::vector<finish_result> out(items.size());
  std::lock_guard lock(mutex_);
  queue_state& q = queue_locked(queue);

  // Every token is looked up before anything changes. Items are taken in order: a token is held
  // until an item that is not a keep ends its lease (as in finish.lua).
  std::vector<bool> held(items.size());
  std::unordered_set<std::string_view> gone;
  bool any = false;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const auto& token = items[i].token;
    held[i] = q.active.contains(token) && !gone.contains(token);
    if (!held[i]) continue;
    any = true;
    if (items[i].kind != finish_kind::keep || !is_group_lane(lane_of(token))) gone.insert(token);
  }
  if (!any) co_return out;
  for (auto token : gone) q.active.erase(std::string(token));

  std::int64_t now = now_ms();
  std::vector<std::string> back, front;
  std::vector<std::pair<std::int64_t, std::string>> later;
  std::vector<std::pair<std::size_t, std::string>> nexts;  // item, lane: leased after the loop
  std::int64_t completed = 0, failed = 0, retried = 0, deferred = 0, halted = 0, started = 0, unhandled = 0;
  // finish.lua's to_front: after a keep, the follower `id` becomes its group's head.
  auto to_front = [](std::deque<std::string>& list, const std::string& id) {
    if (list.empty() || id.empty() || record_id(list.front()) == id) return;
    for (std::size_t i = 1; i < list.size(); ++i) {
      if (record_id(list[i]) != id) continue;
      auto record = std::move(list[i]);
      list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));  // LREM, LPUSH
      list.push_front(std::move(record));
      return;
    }
  };
  // Keyed as finish.lua does: the id, or '<id>#<fence>' when that is taken or there is no id.
  auto dead_letter_of = [&](const std::optional<std::string>& record, std::string group, std::string error,
                            std::string_view token) {
    std::string key = record_id(record.value_or(""));
    while (key.empty() || q.dead.contains(key)) {
      key += '#';
      key += token.substr(0, token.find('|'));
    }
    auto runs = detail::attempts_before(record.value_or("")) + 1;
    q.dead[key] = dead_letter{key, std::move(group), record.value_or(""), std::move(error), now, runs};
    ++failed;
  };
  // A lane that goes back: later (a paused group keeps its backoff: promote parks the lane when
  // it is due), parked when its group is paused, or to the tail of ready.
  auto send_back = [&](std::string lane, std::chrono::milliseconds delay) {
    if (delay.count() > 0)
      later.emplace_back(now + delay.count(), std::move(lane));
    else if (is_group_lane(lane) && q.paused.contains(lane.substr(2)))
      q.parked.insert(lane.substr(2));
    else
      back.push_back(std::move(lane));
  };
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!held[i]) continue;
    const finish_item& item = items[i];
    out[i].lease_held = true;
    std::string lane = lane_of(item.token);
    bool grouped = is_group_lane(lane);
    finish_kind kind = item.kind;
    if (kind == finish_kind::halt && !grouped) kind = finish_kind::fail;
    if (kind == finish_kind::keep && !grouped) kind = finish_kind::ack;
    if (kind == finish_kind::keep) {
      if (!item.unique_id.empty()) q.ids.erase(item.unique_id);
      if (auto group = q.groups.find(lane.substr(2)); group != q.groups.end()) {
        group->second.pop_front();
        to_front(group->second, item.id);
        if (group->second.empty()) q.groups.erase(group);  // drift: its follower is gone (check reports it)
      }
      ++completed;
      ++started;
    } else if (kind == finish_kind::release) {  // as release(): to the head, no attempt counted
      front.push_back(std::move(lane));
      --started;
    } else if (kind == finish_kind::ack || kind == finish_kind::fail || kind == finish_kind::give_up) {
      bool ack = kind == finish_kind::ack;
      if (!item.unique_id.empty()) q.ids.erase(item.unique_id);
      std::optional<std::string> record;  // nullopt: LPOP of an empty group list (nil)
      if (grouped) {
        auto group = q.groups.find(lane.substr(2));
        if (group != q.groups.end()) {
          auto& list = group->second;
          record = std::move(list.front());
          list.pop_front();
          if (list.empty()) {
            q.groups.erase(group);
          } else if (ack && !q.paused.contains(group->first) &&
                     (item.want_next == finish_item::next_policy::yes ||
                      (item.want_next == finish_item::next_policy::if_nobody_waits && q.ready.empty() && back.empty() &&
                       front.empty()))) {
            claimed_job next;
            next.group = group->first;
            next.job = detail::split_record(list.front());
            next.ahead = split_all(list, std::min({list.size() - 1, item.ahead, max_ahead}));
            nexts.emplace_back(i, lane);
            out[i].next = std::move(next);
          } else if (kind == finish_kind::give_up && !q.paused.contains(group->first)) {
            front.push_back(lane);  // it has waited already: its place
          } else {
            send_back(lane, std::chrono::milliseconds(0));  // round robin: behind every other lane
          }
        }
      } else {
        record = lane.substr(2);
      }
      if (ack)
        ++completed;
      else
        dead_letter_of(record, grouped ? lane.substr(2) : std::string(), item.error, item.token);
    } else if (grouped) {  // retry, defer, hand back or halt: the job stays at its group's head
      auto group = q.groups.find(lane.substr(2));
      if (group != q.groups.end()) {
        auto& head = group->second.front();
        if (kind == finish_kind::retry || kind == finish_kind::halt) head = counted(head);
        if (kind == finish_kind::halt) {
          q.paused[group->first] = paused_group{group->first, true, item.error, now};
          q.parked.insert(group->first);
          ++halted;
        } else {
          send_back(lane, item.delay);
        }
      }
      if (kind == finish_kind::retry) ++retried;
      if (kind == finish_kind::defer) ++deferred;
      if (kind == finish_kind::hand_back) {
        ++unhandled;
        --started;
      }
    } else {  // retry, defer or hand back, ungrouped: the lane carries the record
      std::string record = lane.substr(2);
      if (kind == finish_kind::retry) {
        record = counted(record);
        ++retried;
      } else if (kind == finish_kind::defer) {
        ++deferred;
      } else {
        ++unhandled;
        --started;
      }
      send_back("j:" + record, item.delay);
    }
  }
  for (auto& lane : back) q.ready.push_back(std::move(lane));
  q.ready.insert(q.ready.begin(), std::make_move_iterator(front.begin()), std::make_move_iterator(front.end()));
  // Fences and leases after the loop, in item order (one INCRBY in finish.lua); a lease given
  // here replaces nothing that the loop looked at.
  for (auto& [i, lane] : nexts) {
    auto& next = *out[i].next;
    next.fence = ++q.fence;
    next.token = make_token(next.fence, lane);
    q.fence += static_cast<std::int64_t>(next.ahead.size());
    q.active[next.token] = now + lease_ttl.count();
  }
  started += static_cast<std::int64_t>(nexts.size());
  q.started += started;
  q.completed += completed;
  q.failed += failed;
  q.retried += retried;
  q.deferred += deferred;
  q.unhandled += unhandled;
  q.halted += halted;
  wake_locked(q, back.size() + front.size());
  delay_locked(queue, q, std::move(later));
  co_return out;
}

asio::awaitable<std::vector<bool>> memory_backend::extend(std::string queue, std::string worker,
                                                          std::vector<std::string> tokens,
                                                          std::chrono::milliseconds lease_ttl) {
  std::vector<bool> out;
  out.reserve(tokens.size());
  std::lock_guard lock(mutex_);
  queue_state& q = queue_locked(queue);
  std::int64_t deadline = now_ms() + lease_ttl.count();
  q.workers[worker] = deadline;
  std::vector<std::string> held;
  for (auto& token : tokens) {
    auto lease = q.active.find(token);
    out.push_back(lease != q.active.end());
    if (lease == q.active.end()) continue;
    lease->second = deadline;  // ZADD XX
    held.push_back(token);
  }
  if (held.empty())
    q.leases_of.erase(worker);
  else
    q.leases_of[worker] = std::move(held);
  co_return out;
}

asio::awaitable<void> memory_backend::advertise(std::string queue, std::vector<std::string> types,
                                                std::chrono::milliseconds ttl) {
  std::lock_guard lock(mutex_);
  auto& known = queue_locked(queue).types;
  auto until = now_ms() + ttl.count();
  for (auto& t : types) known[t] = std::max(known[t], until);  // ZADD GT
  co_return;
}

asio::awaitable<std::chrono::milliseconds> memory_backend::unrunnable_for(std::string queue, std::string type) {
  std::lock_guard lock(mutex_);
  auto& known = queue_locked(queue).types;
  auto it = known.find(type);
  if (it == known.end()) co_return std::chrono::milliseconds::max();
  co_return std::chrono::milliseconds(std::max<std::int64_t>(0, now_ms() - it->second));
}

asio::awaitable<std::int64_t> memory_backend::expire_own(std::string queue, std::string worker) {
  std::lock_guard lock(mutex_);
  queue_state& q = queue_locked(queue);
  auto found = q.leases_of.find(worker);
  if (found == q.leases_of.end()) co_return 0;
  std::int64_t n = 0;
  for (auto& token : found->second) {
    if (auto lease = q.active.find(token); lease != q.active.end()) {
      lease->second = 0;
      ++n;
    }
  }
  q.leases_of.erase(found);
  co_return n;
}

asio::awaitable<void> memory_backend::release(std::string queue, std::string worker, std::vector<std::string> tokens) {
  std::lock_guard lock(mutex_);
  queue_state& q = queue_locked(queue);
  std::vector<std::string> lanes;
  std::int64_t released = 0;
  for (auto& token : tokens) {
    if (q.active.erase(token) == 0) continue;
    lanes.push_back(lane_of(token));
    ++released;
  }
  if (auto mine = q.claimed.find(worker); mine != q.claimed.end()) {
    std::move(mine->second.begin(), mine->second.end(), std::back_inserter(lanes));
    q.claimed.erase(mine);
  }
  q.ready.insert(q.ready.begin(), std::make_move_iterator(lanes.begin()), std::make_move_iterator(lanes.end()));
  q.started -= released;
  wake_locked(q, lanes.size());
  co_return;
}

asio::awaitable<reap_result> memory_backend::reap(std::string queue, reap_options opts) {
  const std::size_t max = opts.max;
  reap_result result;
  std::lock_guard lock(mutex_);
  queue_state& q = queue_locked(queue);
  std::int64_t now = now_ms();
  // ZRANGEBYSCORE -inf now LIMIT 0 max: by deadline, then by name.
  auto due = [&](const std::unordered_map<std::string, std::int64_t>& scored) {
    std::vector<std::pair<std::int64_t, std::string>> out;
    for (const auto& [name, deadline] : scored)
      if (deadline <= now) out.emplace_back(deadline, name);
    std::sort(out.begin(), out.end());
    if (out.size() > max) out.resize(max);
    return out;
  };
  std::vector<std::string> lanes;
  for (auto& [deadline, token] : due(q.active)) {
    q.active.erase(token);
    ++result.leases;
    std::string lane = lane_of(token);
    if (is_group_lane(lane)) {
      auto group = q.groups.find(lane.substr(2));
      if (group == q.groups.end() || group->second.empty()) continue;
      result.recovered_types.push_back(type_in(group->second.front()));
      group->second.front() = counted(group->second.front());
      if (q.paused.contains(group->first))
        q.parked.insert(group->first);
      else
        lanes.push_back(std::move(lane));
    } else {
      result.recovered_types.push_back(type_in(lane));
      lanes.push_back("j:" + counted(lane.substr(2)));
    }
  }
  for (auto& [deadline, worker] : due(q.workers)) {
    if (auto mine = q.claimed.find(worker); mine != q.claimed.end()) {
      result.lanes += static_cast<std::int64_t>(mine->second.size());
      std::move(mine->second.begin(), mine->second.end(), std::back_inserter(lanes));
      q.claimed.erase(mine);
    }
    q.workers.erase(worker);
    ++result.workers;
  }
  q.ready.insert(q.ready.begin(), std::make_move_iterator(lanes.begin()), std::make_move_iterator(lanes.end()));
  q.recovered += result.leases;
  wake_locked(q, lanes.size());

  // Dead-letter retention: the oldest go first (by time, then id, as the zset orders them).
  std::vector<std::pair<std::int64_t, std::string>> dead;
  for (const auto& [id, letter] : q.dead) dead.emplace_back(letter.at_ms, id);
  std::sort(dead.begin(), dead.end());
  std::size_t expired = 0;
  if (opts.dead_max_age.count() > 0)
    while (expired < dead.size() && expired < max && dead[expired].first <= now - opts.dead_max_age.count()) ++expired;
  if (opts.dead_max_count > 0 && expired < max && dead.size() - expired > opts.dead_max_count)
    expired += std::min(dead.size() - expired - opts.dead_max_count, max - expired);
  for (std::size_t i = 0; i < expired; ++i) q.dead.erase(dead[i].second);
  result.dead_removed = static_cast<std::int64_t>(expired);
  co_return result;
}

asio::awaitable<queue_counts> memory_backend::counts(std::string queue) {
  queue_counts c;
  std::lock_guard lock(mutex_);
  auto found = queues_.find(queue);
  if (found == queues_.end()) co_return c;
  const queue_state& q = *found->second;
  c.ready_lanes = static_cast<std::int64_t>(q.ready.size());
  c.running = static_cast<std::int64_t>(q.active.size());
  c.delayed = static_cast<std::int64_t>(q.delayed.size());
  c.paused = static_cast<std::int64_t>(q.paused.size());
  c.groups = static_cast<std::int64_t>(q.groups.size());
  c.dead = static_cast<std::int64_t>(q.dead.size());
  c.enqueued = q.enqueued;
  c.started = q.started;
  c.completed = q.completed;
  c.failed = q.failed;
  c.retried = q.retried;
  c.deferred = q.deferred;
  c.unhandled = q.unhandled;
  c.halted = q.halted;
  c.recovered = q.recovered;
  if (!q.ready.empty()) {  // (the head's record: inline, or its group's head)
    const auto& head = q.ready.front();
    auto group = is_group_lane(head) ? q.groups.find(head.substr(2)) : q.groups.end();
    if (!is_group_lane(head))
      c.next_enqueued_ms = detail::enqueued_at(head);
    else if (group != q.groups.end() && !group->second.empty())
      c.next_enqueued_ms = detail::enqueued_at(group->second.front());
  }
  co_return c;
}

asio::awaitable<promote_result> memory_backend::promote(std::string queue, std::size_t max) {
  promote_result result;
  std::lock_guard lock(mutex_);
  queue_state& q = queue_locked(queue);
  std::int64_t now = now_ms();
  std::vector<std::string> lanes;
  auto lane_of_group = [&](const std::string& group) {
    if (q.paused.contains(group))
      q.parked.insert(group);
    else
      lanes.push_back("g:" + group);
  };
  while (!q.delayed.empty() && q.delayed.begin()->first <= now && static_cast<std::size_t>(result.moved) < max) {
    std::string member = std::move(q.delayed.extract(q.delayed.begin()).value().second);
    ++result.moved;
    if (member.starts_with("d:")) {  // 'd:<order>:<n>:<group><record>'
      auto start = member.find(':', 2) + 1, colon = member.find(':', start);
      auto n = std::stoul(member.substr(start, colon - start));
      std::string group = member.substr(colon + 1, n);
      auto& list = q.groups[group];
      list.push_back(member.substr(colon + 1 + n));
      if (list.size() == 1) lane_of_group(group);
    } else if (is_group_lane(member)) {
      if (q.groups.contains(member.substr(2))) lane_of_group(member.substr(2));
    } else {
      lanes.push_back(std::move(member));
    }
  }
  for (auto& lane : lanes) q.ready.push_back(std::move(lane));
  wake_locked(q, lanes.size());
  if (!q.delayed.empty())
    result.next_due = std::chrono::milliseconds(std::max<std::int64_t>(0, q.delayed.begin()->first - now));
  co_return result;
}

std::uint64_t memory_backend::delayed_version(const std::string& queue) { return delayed_wakeups_->version(queue); }

asio::awaitable<void> memory_backend::wait_delayed(std::string queue, std::uint64_t seen,
                                                   std::chrono::milliseconds timeout) {
  co_await delayed_wakeups_->wait(std::move(queue), seen, timeout);
}

asio::awaitable<std::vector<dead_letter>> memory_backend::dead_letters(std::string queue, std::size_t offset,
                                                                       std::size_t limit) {
  std::vector<dead_letter> out;
  {
    std::lock_guard lock(mutex_);
    auto found = queues_.find(queue);
    if (found == queues_.end()) co_return out;
    for (auto& [id, letter] : found->second->dead) out.push_back(letter);
  }
  std::sort(out.begin(), out.end(), [](const dead_letter& a, const dead_letter& b) {
    return std::tie(a.at_ms, a.id) < std::tie(b.at_ms, b.id);
  });
  out.erase(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(std::min(offset, out.size())));
  if (out.size() > limit) out.resize(limit);
  co_return out;
}

asio::awaitable<std::optional<dead_letter>> memory_backend::dead_letter_of(std::string queue, std::string id) {
  std::lock_guard lock(mutex_);
  auto found = queues_.find(queue);
  if (found == queues_.end()) co_return std::nullopt;
  auto letter = found->second->dead.find(id);
  if (letter == found->second->dead.end()) co_return std::nullopt;
  co_return letter->second;
}

asio::awaitable<std::vector<std::string>> memory_backend::requeue(std::string queue, std::vector<std::string> ids,
                                                                  bool at_head) {
  std::vector<std::string> out;
  std::lock_guard lock(mutex_);
  queue_state& q = queue_locked(queue);
  std::size_t made_ready = 0;
  // Several jobs to a head go there in the order given (as requeue.lua): behind the ones before.
  std::size_t in_front = 0;
  std::map<std::string, std::size_t, std::less<>> behind_head;
  for (auto& id : ids) {
    auto found = q.dead.find(id);
    if (found == q.dead.end()) continue;
    std::string record = reset(found->second.record);
    if (unique_of(record) && !q.ids.insert(record_id(record)).second) continue;  // a pending job has it
    const std::string& group = found->second.group;
    if (group.empty()) {
      if (at_head)
        q.ready.insert(q.ready.begin() + static_cast<std::ptrdiff_t>(in_front++), "j:" + record);
      else
        q.ready.push_back("j:" + record);
      ++made_ready;
    } else {
      auto& list = q.groups[group];
      bool had_jobs = !list.empty();
      auto& behind = behind_head[group];  // (0 for a group that had none: its first is the head)
      if (had_jobs && at_head) {
        list.insert(list.begin() + 1 + static_cast<std::ptrdiff_t>(behind++), std::move(record));  // LINSERT AFTER
      } else {
        list.push_back(std::move(record));
        if (list.size() == 1) {
          if (q.paused.contains(group)) {
            q.parked.insert(group);
          } else {
            q.ready.push_back("g:" + group);
            ++made_ready;
          }
        }
      }
    }
    q.dead.erase(found);
    out.push_back(id);
  }
  wake_locked(q, made_ready);
  co_return out;
}

asio::awaitable<std::int64_t> memory_backend::purge(std::string queue, std::vector<std::string> ids) {
  std::lock_guard lock(mutex_);
  queue_state& q = queue_locked(queue);
  std::int64_t n = 0;
  if (ids.empty()) {
    n = static_cast<std::int64_t>(q.dead.size());
    q.dead.clear();
  } else {
    for (auto& id : ids) n += static_cast<std::int64_t>(q.dead.erase(id));
  }
  co_return n;
}

asio::awaitable<bool> memory_backend::pause(std::string queue, std::string group) {
  std::lock_guard lock(mutex_);
  queue_state& q = queue_locked(queue);
  if (!q.paused.try_emplace(group, paused_group{group, false, {}, now_ms()}).second) co_return false;
  // As pause.lua: a lane in ready is parked now; one waiting in delayed, as it comes due.
  auto in_ready = std::find(q.ready.begin(), q.ready.end(), "g:" + group);  // LREM ready 1 lane
  if (in_ready != q.ready.end()) {
    q.ready.erase(in_ready);
    q.parked.insert(group);
  }
  co_return true;
}

asio::awaitable<bool> memory_backend::resume(std::string queue, std::string group, resume_mode mode) {
  std::lock_guard lock(mutex_);
  queue_state& q = queue_locked(queue);
  auto state = q.paused.find(group);
  if (state == q.paused.end()) co_return false;
  bool is_parked = q.parked.contains(group);
  if (mode == resume_mode::skip && !is_parked)
    refuse(errc::group_busy,
           fmt::format("group '{}' is running or waiting to run; pause it and let it stop first", group));
  bool halted = state->second.halted;
  std::string why = "skipped by an operator";
  if (halted) why += " after it halted its group: " + state->second.error;
  q.paused.erase(state);
  if (!is_parked) co_return true;
  q.parked.erase(group);
  auto list = q.groups.find(group);
  if (list != q.groups.end() && mode == resume_mode::skip) {
    std::string head = std::move(list->second.front());
    list->second.pop_front();
    // As resume.lua: it did not run again, so its runs are the header's (a halt counted its last);
    // a halted job's record is kept as its last run saw it.
    auto runs = std::max<std::int64_t>(detail::attempts_before(head), 0);
    if (halted) head = uncounted(head);
    std::string id = record_id(head);
    if (unique_of(head)) q.ids.erase(id);
    std::string key = id;  // as resume.lua: a key of its own when the id is taken or missing
    while (key.empty() || q.dead.contains(key)) key += "#" + std::to_string(++q.fence);
    q.dead[key] = dead_letter{key, group, std::move(head), std::move(why), now_ms(), runs};
    ++q.failed;
    if (list->second.empty()) q.groups.erase(list);
  } else if (list != q.groups.end() && halted) {
    list->second.front() = reset(list->second.front());
  }
  if (q.groups.contains(group)) {
    q.ready.push_back("g:" + group);
    wake_locked(q, 1);
  }
  co_return true;
}

asio::awaitable<std::vector<paused_group>> memory_backend::paused_groups(std::string queue) {
  std::vector<paused_group> out;
  std::lock_guard lock(mutex_);
  auto found = queues_.find(queue);
  if (found == queues_.end()) co_return out;
  for (auto& [name, state] : found->second->paused) out.push_back(state);
  co_return out;
}

asio::awaitable<std::int64_t> memory_backend::purge_queue(std::string queue) {
  std::lock_guard lock(mutex_);
  auto found = queues_.find(queue);
  if (found == queues_.end()) co_return 0;
  auto& q = *found->second;
  // Waiting claims keep their pointer to the state: it is emptied, not erased. The fence and id
  // counters stay, as on Redis (a token given out before must never match a new lease).
  auto waiters = std::move(q.waiters);
  auto fence = q.fence, seq = q.seq;
  q = queue_state{};
  q.waiters = std::move(waiters);
  q.fence = fence;
  q.seq = seq;
  co_return 1;  // (one queue's state: the memory backend has no keys to count)
}

asio::awaitable<std::int64_t> memory_backend::group_size(std::string queue, std::string group) {
  std::lock_guard lock(mutex_);
  auto found = queues_.find(queue);
  if (found == queues_.end()) co_return 0;
  auto g = found->second->groups.find(group);
  co_return g == found->second->groups.end() ? 0 : static_cast<std::int64_t>(g->second.size());
}

asio::awaitable<check_report> memory_backend::check(std::string queue, bool repair) {
  check_report out;
  std::lock_guard lock(mutex_);  // the walk and every confirmation at one instant: what it finds is so
  queue_state& q = queue_locked(queue);
  detail::queue_walk walk;
  walk.ready.assign(q.ready.begin(), q.ready.end());
  for (auto& [worker, lanes] : q.claimed)
    walk.claimed.emplace_back(worker, std::vector<std::string>(lanes.begin(), lanes.end()));
  for (auto& [due, member] : q.delayed) walk.delayed.push_back(member);
  for (auto& [token, deadline] : q.active) walk.active.push_back(token);
  walk.parked.assign(q.parked.begin(), q.parked.end());
  for (auto& [group, state] : q.paused) walk.paused.insert(group);
  for (auto& [worker, deadline] : q.workers) walk.workers.insert(worker);
  for (auto& [group, records] : q.groups)
    walk.groups.emplace_back(group, std::vector<std::string>(records.begin(), records.end()));
  walk.ids.assign(q.ids.begin(), q.ids.end());
  walk.calls = 1;
  auto suspects = detail::analyse(walk, out);
  out.calls = walk.calls;

  // check_fix.lua's confirmations, step by step.
  auto erase_first = [](auto& list, const std::string& value) {
    if (auto it = std::find(list.begin(), list.end(), value); it != list.end()) list.erase(it);
  };
  for (auto& group : suspects.groups) {
    std::string lane = "g:" + group;
    struct holder {
      std::string where;
      std::function<void()> remove;
      bool lease = false;
    };
    std::vector<holder> holders;
    for (auto& l : q.ready)
      if (l == lane) holders.push_back({"ready", [&] { erase_first(q.ready, lane); }});
    for (auto& [worker, lanes] : q.claimed)
      for (auto& l : lanes)
        if (l == lane) holders.push_back({"claimed:" + worker, [&, w = worker] { erase_first(q.claimed[w], lane); }});
    auto delayed = std::find_if(q.delayed.begin(), q.delayed.end(), [&](const auto& e) { return e.second == lane; });
    if (delayed != q.delayed.end()) holders.push_back({"delayed", [&q, delayed] { q.delayed.erase(delayed); }});
    for (auto& [token, deadline] : q.active)
      if (lane_of(token) == lane) holders.push_back({"a lease", [&q, t = token] { q.active.erase(t); }, true});
    if (q.parked.contains(group)) holders.push_back({"parked", [&] { q.parked.erase(group); }});
    auto records = q.groups.find(group);
    bool is_paused = q.paused.contains(group);
    if (records != q.groups.end() && !records->second.empty()) {
      if (holders.empty()) {
        ++out.stuck_groups;
        out.problems.push_back(detail::stuck_problem(group, static_cast<std::int64_t>(records->second.size())));
        if (repair) {
          if (is_paused)
            q.parked.insert(group);
          else
            q.ready.push_back(lane);
          ++out.repaired;
        }
      } else if (holders.size() > 1) {
        std::vector<std::string> where;
        for (auto& h : holders) where.push_back(h.where);
        out.problems.push_back(detail::lanes_problem(group, where));
        if (repair) {  // keep a lease if there is one (it cannot be dropped), else the first holder
          std::size_t keep = 0;
          for (std::size_t i = 0; i < holders.size(); ++i)
            if (holders[i].lease) keep = i;
          for (std::size_t i = 0; i < holders.size(); ++i)
            if (i != keep && !holders[i].lease) holders[i].remove();
          ++out.repaired;
        }
      }
      if (!holders.empty() && holders.front().where == "parked" && !is_paused) {
        out.problems.push_back(detail::parked_problem(group));
        if (repair) {
          q.parked.erase(group);
          q.ready.push_back(lane);
          ++out.repaired;
        }
      }
    } else {
      for (auto& h : holders) {
        if (h.where != "parked") out.problems.push_back(detail::empty_group_problem(group, h.where));
        if (repair) {
          h.remove();
          if (h.where != "parked") ++out.repaired;
        }
      }
    }
  }
  for (auto& c : suspects.copies) {
    // Whether a copy is where the walk saw it, and what drops it. `nth` 2: the second copy is
    // the same entry as the first (one list, one text, read twice as the list moved): there only
    // when the list holds it twice. (A zset holds a member once.)
    auto find = [&](const detail::job_place& p, std::size_t nth) -> std::function<void()> {
      using kind = detail::job_place::kind;
      auto in = [&](auto& list) -> std::function<void()> {
        if (static_cast<std::size_t>(std::count(list.begin(), list.end(), p.member)) < nth) return {};
        return [&list, &erase_first, m = p.member] { erase_first(list, m); };
      };
      switch (p.where) {
        case kind::ready: return in(q.ready);
        case kind::claimed: return q.claimed.contains(p.key) ? in(q.claimed[p.key]) : nullptr;
        case kind::group: return q.groups.contains(p.key) ? in(q.groups[p.key]) : nullptr;
        case kind::lease: return nth == 1 && q.active.contains(p.member) ? [] {} : std::function<void()>{};
        case kind::delayed: {
          auto it =
              std::find_if(q.delayed.begin(), q.delayed.end(), [&](const auto& e) { return e.second == p.member; });
          if (nth != 1 || it == q.delayed.end()) return {};
          return [&q, it] { q.delayed.erase(it); };
        }
      }
      return {};
    };
    bool same = c.first.where == c.second.where && c.first.key == c.second.key && c.first.member == c.second.member;
    auto first = find(c.first, 1), second = find(c.second, same ? 2 : 1);
    if (!first || !second) continue;
    out.problems.push_back(detail::copy_problem(c.id, c.first, c.second));
    if (repair && (c.second.droppable() || c.first.droppable())) {
      (c.second.droppable() ? second : first)();
      ++out.repaired;
    }
  }
  for (auto& worker : suspects.dead_workers) {
    auto found = q.claimed.find(worker);
    if (found == q.claimed.end() || found->second.empty() || q.workers.contains(worker)) continue;
    out.problems.push_back(detail::dead_worker_problem(worker, found->second.size()));
    if (repair) {
      q.ready.insert(q.ready.begin(), found->second.begin(), found->second.end());
      q.claimed.erase(found);
      ++out.repaired;
    }
  }
  // (No second walk for ids, as Redis has: this one was at one instant.)
  for (auto& id : suspects.ids) {
    if (!q.ids.contains(id)) continue;
    out.problems.push_back(detail::id_problem(id));
    if (repair) {
      q.ids.erase(id);
      ++out.repaired;
    }
  }
  if (out.repaired > 0) wake_locked(q, q.ready.size());  // lanes made ready: waiting claims take them
  co_return out;
}

}  // namespace jobrt
