// Each operation mirrors its Lua script (runtime/lua/) step by step, including the scripts' edge
// cases, so that the model can be checked against Redis. Comments name the Redis command a step
// stands for where the correspondence is not obvious.
#include "backend/queue_model.hpp"

#include <jobrt/error.hpp>

#include "backend/check_walk.hpp"
#include "backend/job_codec.hpp"
#include "backend/views.hpp"
#include "clock.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <boost/json/parse.hpp>
#include <boost/system/system_error.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace jobrt::detail {

namespace {

bool is_group_lane(std::string_view lane) { return lane.starts_with("g:"); }

// A lease's lane for a job of a group that runs several at once (claim.lua's conc_lane): the job
// leaves its group's list and travels in the lane, 'c:<length of group>:<group><record>'.
std::string conc_lane(const std::string& group, const std::string& record) {
  return fmt::format("c:{}:{}{}", group.size(), group, record);
}

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
std::string id_in(std::string_view record) { return std::string(script_id(record)); }

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
  for (std::size_t i = 1; i <= n; ++i) out.push_back(split_record(list[i]));
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
  auto id = script_id(record);
  if (!id.empty() && !assigned_id(id)) return true;
  boost::system::error_code ec;
  auto body = boost::json::parse(record.substr(second + 1), ec);
  if (ec || !body.is_object()) return false;
  auto* u = body.as_object().if_contains("u");
  return u && !(u->is_bool() && !u->as_bool());  // Lua's truth: all but nil and false
}

}  // namespace

// One queue: what the Redis backend keeps under jobrt:{<queue>}:.
struct queue_model::queue_state {
  std::deque<std::string> ready;  // lanes: 'j:<record>' or 'g:<group>' (or 'w:', a wake entry)
  // ready:2, ready:1, ready:-1, ready:-2 (priority_levels' order): the lanes of jobs with a
  // priority (enqueue.lua's levels). While one holds lanes, ready is not empty.
  std::array<std::deque<std::string>, 4> levels;
  // levels: whether grouped jobs with a priority were stored (enqueue.lua's mark).
  bool grouped_levels = false;
  // g:<group>: pending records; the running job stays at the head. Erased when empty, as Redis
  // deletes an empty list, so that "no entry" and "empty" mean the same thing. Ordered, so that
  // a listing by prefix goes on from the last name it gave.
  std::map<std::string, std::deque<std::string>> groups;
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
  // Groups whose jobs run several at once (job_spec::group_concurrency): running, group -> jobs
  // of it leased now (lanes 'c:...'); full, groups whose lane waits for one of them to end.
  std::unordered_map<std::string, std::int64_t> running;
  std::unordered_set<std::string> full;
  // A weighted one of those whose turn goes on: its starts in the turn, and its name (claim.lua's
  // turn, '<starts>:<group>').
  std::optional<std::pair<std::int64_t, std::string>> turn;
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
  std::map<std::string, std::pair<std::int64_t, worker_report>> reports;  // worker -> (until when, report)
  std::map<std::int64_t, queue_counts> history;                           // by minute
  std::int64_t history_claimed = 0;                                       // history:claim
  // Jobs enqueued with a keep: jobs, id -> entry (views.hpp's kept_entry); done, the zset of
  // completed ones by when their entry goes, as (score, id) and id -> score.
  std::unordered_map<std::string, std::string> kept;
  std::set<std::pair<std::int64_t, std::string>> done;
  std::unordered_map<std::string, std::int64_t> done_at;
  // throttled: group -> until when (ms), groups throttled with no job left (finish.lua's
  // throttle); rate:<group>: a rate-limited group's last starts, newest first, while its window
  // lasts (claim.lua's rate_wait; the list's expiry is its window after the last start).
  std::unordered_map<std::string, std::int64_t> throttled;
  struct starts {
    std::deque<std::int64_t> times;
    std::int64_t until = 0;
  };
  std::unordered_map<std::string, starts> rates;
  // rate: the queue's rate limit's starts (claim.lua's queue_rate), fence -> when, and by when;
  // the zset expires a window after the last claim that added to it.
  struct queue_starts_set {
    std::map<std::int64_t, std::int64_t> at;
    std::set<std::pair<std::int64_t, std::int64_t>> by_time;
    std::int64_t until = 0;
    void erase(std::int64_t fence) {
      if (auto f = at.find(fence); f != at.end()) {
        by_time.erase({f->second, fence});
        at.erase(f);
      }
    }
  } queue_starts;

  // finish.lua's throttle: the group starts nothing before now + ms.
  void throttle(const std::string& group, std::int64_t now, std::int64_t ms) {
    std::erase_if(throttled, [&](const auto& t) { return t.second <= now; });
    auto& until = throttled[group];
    until = std::max(until, now + ms);
  }
  // claim.lua's throttled_until: when the group's throttle ends, if after now.
  std::optional<std::int64_t> throttled_until(const std::string& group, std::int64_t now) {
    auto t = throttled.find(group);
    if (t == throttled.end()) return std::nullopt;
    if (t->second > now) return t->second;
    throttled.erase(t);
    return std::nullopt;
  }
  // claim.lua's rate_wait: when the group may start its head job, if after now; else the start
  // is counted.
  std::size_t prune_rates_at = 1024;
  std::optional<std::int64_t> rate_wait(const std::string& group, const rate_limit& limit, std::int64_t now) {
    if (rates.size() >= prune_rates_at) {  // expired lists go, as Redis's do (amortised)
      std::erase_if(rates, [&](const auto& r) { return r.second.until <= now; });
      prune_rates_at = std::max<std::size_t>(1024, rates.size() * 2);
    }
    auto& r = rates[group];
    if (r.until <= now) r.times.clear();  // the list expired
    if (r.times.size() >= limit.max) {
      auto oldest = r.times[limit.max - 1];
      if (oldest + limit.window.count() > now) return oldest + limit.window.count();
    }
    r.times.push_front(now);
    if (r.times.size() > limit.max) r.times.resize(limit.max);
    r.until = now + limit.window.count();
    return std::nullopt;
  }

  const std::deque<std::string>& level_list(int level) const {
    if (level == 0) return ready;
    auto at = std::find(priority_levels.begin(), priority_levels.end(), level) - priority_levels.begin();
    return levels.at(static_cast<std::size_t>(at));
  }
  std::deque<std::string>& level_list(int level) {
    return const_cast<std::deque<std::string>&>(std::as_const(*this).level_list(level));
  }
  // enqueue.lua's level_of: an ungrouped job's priority; a group's lane, its head job's.
  int level_of(std::string_view lane) const {
    if (lane.starts_with("j:")) return prio_in(lane.substr(2));
    if (!lane.starts_with("g:") || !grouped_levels) return 0;
    auto g = groups.find(std::string(lane.substr(2)));
    return g == groups.end() || g->second.empty() ? 0 : prio_in(g->second.front());
  }
  bool any_levels() const {
    return std::any_of(levels.begin(), levels.end(), [](const auto& l) { return !l.empty(); });
  }
  // enqueue.lua's push_list to ready's head: a wake entry there makes way for the lanes.
  template <class It>
  void ready_front(It first, It last) {
    if (first != last && !ready.empty() && ready.front() == "w:") ready.pop_front();
    ready.insert(ready.begin(), first, last);
  }
  // enqueue.lua's push_lanes: lanes to their levels' lists, in their order, at the tails or (at_head)
  // the heads; the wake entry when a level's list got lanes and ready has none (unless quiet: a
  // claim's, which wakes the levels once it is done). Returns whether any went to a level's list,
  // and the list of the last lane.
  std::pair<bool, const std::deque<std::string>*> push_lanes(std::vector<std::string> lanes, bool at_head,
                                                             bool quiet = false) {
    auto push = [&](std::deque<std::string>& list, auto first, auto last) {
      if (at_head && &list == &ready) return ready_front(std::make_move_iterator(first), std::make_move_iterator(last));
      list.insert(at_head ? list.begin() : list.end(), std::make_move_iterator(first), std::make_move_iterator(last));
    };
    std::vector<int> of(lanes.size());
    std::transform(lanes.begin(), lanes.end(), of.begin(), [this](const std::string& l) { return level_of(l); });
    if (std::all_of(of.begin(), of.end(), [](int level) { return level == 0; })) {
      push(ready, lanes.begin(), lanes.end());
      return {false, &ready};
    }
    for (int level : {2, 1, 0, -1, -2}) {
      std::vector<std::string> mine;
      for (std::size_t i = 0; i < lanes.size(); ++i)
        if (of[i] == level) mine.push_back(std::move(lanes[i]));
      push(level_list(level), mine.begin(), mine.end());
    }
    if (!quiet && ready.empty()) ready.push_back("w:");
    return {true, &level_list(of.back())};
  }
  // enqueue.lua's wake_levels: after lanes left ready.
  void wake_levels() {
    if (ready.empty() && any_levels()) ready.push_back("w:");
  }

  // The end of a run of a group that runs several at once: one run less. Returns whether the
  // group's lane waited for it (in full).
  bool run_ended(const std::string& group) {
    if (auto r = running.find(group); r != running.end() && --r->second <= 0) running.erase(r);
    return full.erase(group) > 0;
  }
  // Such a run going back to its group's head, before every job that has not started. Returns
  // whether the group needs a lane now: nothing held one (LPUSH returned 1), or it waited in full.
  bool run_back(const std::string& group, std::string record) {
    bool was_full = run_ended(group);
    auto& list = groups[group];
    list.push_front(std::move(record));
    return list.size() == 1 || was_full;
  }

  // finish.lua's unstarted: a group's job that never started gives back its counted start.
  void unstart(const std::string& group) {
    if (auto r = rates.find(group); r != rates.end() && !r->second.times.empty()) r->second.times.pop_front();
  }
  // finish.lua's unstarted_in_queue: any job that never started gives its lease's start back to
  // the queue's own rate limit.
  void unstart_in_queue(const std::string& token) {
    std::int64_t lease = 0;
    std::from_chars(token.data(), token.data() + token.size(), lease);
    queue_starts.erase(lease);
  }

  // ZADD done: the entry of kept job `id` goes at `until`.
  void set_done(const std::string& id, std::int64_t until) {
    if (auto old = done_at.find(id); old != done_at.end()) {
      done.erase({old->second, id});
      old->second = until;
    } else {
      done_at.emplace(id, until);
    }
    done.emplace(until, id);
  }
  // Whether a kept job's entry holds producer id `id` (enqueue.lua's kept_holds): any entry but
  // a completed or cancelled job's whose keep ran out.
  bool kept_holds(const std::string& id, std::int64_t now) const {
    auto e = kept.find(id);
    if (e == kept.end()) return false;
    if (e->second[0] != 'c' && e->second[0] != 'k') return true;
    auto gone = done_at.find(id);
    return gone == done_at.end() || gone->second > now;
  }
  // Whether the record is a kept job's whose cancel waits (cancel.lua's 'n' entry).
  bool cancel_waits(std::string_view record) const {
    auto k = kept_in(record);
    if (!k) return false;
    auto e = kept.find(std::string(k->id));
    return e != kept.end() && e->second.starts_with('n');
  }
  // claim.lua's drop: such a job leaves where it would be leased; its entry says so ('k') and
  // goes after its keep, and a producer's id is free again.
  void drop_cancelled(std::string_view record, std::int64_t now) {
    auto k = kept_in(record);
    std::string id(k->id);
    auto& entry = kept[id];
    entry = fmt::format("k{}", now) + entry.substr(entry.find(':'));
    set_done(id, now + k->keep_ms);
    if (!assigned_id(id)) ids.erase(id);
  }
};

std::int64_t queue_model::system_now() { return detail::unix_ms(); }

queue_model::queue_model(clock now) : now_(now), s_(std::make_unique<queue_state>()) {}
queue_model::~queue_model() = default;
queue_model::queue_model(queue_model&&) noexcept = default;
queue_model& queue_model::operator=(queue_model&&) noexcept = default;

queue_model::effects queue_model::take_effects() noexcept { return std::exchange(effects_, {}); }

bool queue_model::has_ready() const noexcept { return !s_->ready.empty(); }

void queue_model::delay(std::vector<std::pair<std::int64_t, std::string>> entries) {
  auto& q = *s_;
  if (entries.empty()) return;
  bool earlier = q.delayed.empty();
  for (auto& e : entries) {
    if (!q.delayed.empty() && e.first < q.delayed.begin()->first) earlier = true;
  }
  for (auto& e : entries) q.delayed.insert(std::move(e));
  if (earlier) effects_.earlier_due = true;
}

std::vector<enqueue_result> queue_model::enqueue(std::vector<encoded_job> jobs) {
  std::vector<enqueue_result> out;
  out.reserve(jobs.size());
  auto& q = *s_;

  for (std::size_t i = 0; i < jobs.size(); ++i) {  // as enqueue.lua, before anything is stored
    const auto& job = jobs[i];
    if (auto problem = id_refusal(job.id); !problem.empty()) refuse(errc::bad_job_id, problem);
    if (auto problem = body_refusal(job.body); !problem.empty()) refuse(errc::bad_max_attempts, problem);
    if (auto problem = due_refusal(job, i); !problem.empty()) refuse(errc::bad_due, problem);
  }
  // Max group sizes, as enqueue.lua counts them: the group's list and the batch's jobs for it
  // (not duplicates), in order.
  if (std::any_of(jobs.begin(), jobs.end(), [](const encoded_job& j) { return j.max_group_size > 0; })) {
    std::unordered_map<std::string_view, std::int64_t> held;
    std::unordered_set<std::string_view> seen;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      const auto& job = jobs[i];
      bool duplicate =
          !job.id.empty() && (seen.contains(job.id) || q.ids.contains(job.id) || q.kept_holds(job.id, now_()));
      if (!job.id.empty()) seen.insert(job.id);
      if (job.group.empty() || duplicate) continue;
      auto [it, added] = held.try_emplace(job.group, 0);
      if (added) {
        if (auto list = q.groups.find(job.group); list != q.groups.end())
          it->second = static_cast<std::int64_t>(list->second.size());
        if (auto r = q.running.find(std::string(job.group)); r != q.running.end()) it->second += r->second;
      }
      ++it->second;
      if (job.max_group_size > 0 && it->second > job.max_group_size)
        refuse(errc::group_full, group_full_message(job.group, it->second, job.max_group_size, i, jobs.size()));
    }
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
  std::int64_t now = now_();
  for (auto& job : jobs) {
    std::string id = job.id;
    bool duplicate = false;
    if (id.empty()) {
      id = std::to_string(++next_id * id_stride_ + id_offset_);
    } else if (q.kept_holds(id, now) || !q.ids.insert(id).second) {
      duplicate = true;
    }
    out.push_back({id, duplicate});
    if (duplicate) continue;
    if (!job.group.empty() && prio_in_body(job.body) != 0) q.grouped_levels = true;
    ++stored;
    std::string record = "0|" + id + '|' + job.body;
    std::int64_t due = job.run_at_ms > 0 ? job.run_at_ms : job.delay_ms > 0 ? now + job.delay_ms : 0;
    if (keep_in_body(job.body))
      q.kept[id] = due > now ? kept_entry('d', due, job.group, record) : kept_entry('p', 0, job.group, record);
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
  std::vector<std::string> final;
  for (auto& lane : lanes)
    if (lane) final.push_back(std::move(*lane));
  effects_.made_ready += final.size();
  q.push_lanes(std::move(final), false);
  q.enqueued += stored;
  delay(std::move(later));
  return out;
}

// A step passes over at most claim_passes lanes (claim.lua); stopped there with room left, the
// claim goes on with another, as redis_backend's does, so that a claim that returns fewer jobs
// than it asked for leaves nothing it could take.
std::vector<claimed_job> queue_model::claim(const claim_options& opts) {
  bool more = false;
  auto out = claim_step(opts, more);
  auto want = std::min(opts.max, max_claim);
  while (more && out.size() < want) {
    auto rest = opts;
    rest.max = want - out.size();
    std::vector<claimed_job> next;
    try {
      next = claim_step(rest, more);
    } catch (const rate_limited&) {  // (the queue's limit reached: what the steps before took, if any)
      if (out.empty()) throw;
      break;
    }
    std::move(next.begin(), next.end(), std::back_inserter(out));
  }
  return out;
}

std::vector<claimed_job> queue_model::claim_step(const claim_options& opts, bool& stopped) {
  auto& q = *s_;
  stopped = false;
  std::vector<claimed_job> out;
  auto max = std::min(opts.max, max_claim), ahead = std::min(opts.ahead, max_ahead);
  if (max == 0) return out;
  std::int64_t now = now_();
  // The queue's rate limit (claim.lua's queue_rate): starts that left the window go first;
  // no room left throws before anything is taken; else no more than the room, no followers.
  if (opts.rate) {
    check_rate_limit(*opts.rate, "claim rate");
    auto& st = q.queue_starts;
    if (st.until <= now) st = {};  // the zset expired
    auto window = opts.rate->window.count();
    while (!st.by_time.empty() && st.by_time.begin()->first <= now - window) st.erase(st.by_time.begin()->second);
    if (st.at.size() >= opts.rate->max) {
      // What the blocking claim moved to claimed:<worker> goes back to the head of ready.
      if (auto mine = q.claimed.find(opts.worker); mine != q.claimed.end()) {
        effects_.made_ready += mine->second.size();
        q.ready_front(mine->second.begin(), mine->second.end());
        q.claimed.erase(mine);
      }
      auto oldest = std::next(st.by_time.begin(), static_cast<std::ptrdiff_t>(st.at.size() - opts.rate->max));
      throw rate_limited(std::chrono::milliseconds(std::max<std::int64_t>(1, oldest->first + window - now)));
    }
    max = std::min(max, opts.rate->max - st.at.size());
    ahead = 0;
  }
  // The lanes the worker's blocking claim moved first (LPOP claimed max), then from ready; with
  // priorities, ready:2 and ready:1 before them, ready:-1 and ready:-2 after. A lane parked or
  // dropped on the way is replaced by the next, up to claim_passes of them; a wake entry is
  // dropped (claim.lua).
  std::vector<std::string> moved, batch;
  if (auto mine = q.claimed.find(opts.worker); mine != q.claimed.end()) {
    auto& list = mine->second;
    while (moved.size() < max && !list.empty()) {
      moved.push_back(std::move(list.front()));
      list.pop_front();
    }
    if (list.empty()) q.claimed.erase(mine);
  }
  bool any_levels = q.any_levels(), moved_read = false;
  std::vector<std::deque<std::string>*> sources{nullptr, &q.ready};  // nullptr: the lanes moved
  // (every level's list when one holds lanes or the queue is marked: when a group's lane went back
  // to a list read already, the lists are read again from that one as soon as the list being read
  // is done)
  if (any_levels || q.grouped_levels)
    sources = {&q.levels[0], &q.levels[1], nullptr, &q.ready, &q.levels[2], &q.levels[3]};
  std::size_t rewind = 0;  // the first source read already that a lane went back to (1-based; 0: none)
  std::size_t source = 0;  // sources[source - 1] gave the batch
  std::deque<std::string>* home = &q.ready;  // where the batch's lanes go back
  // Which lanes are live and how many fences they take, then one INCRBY, as in claim.lua.
  std::vector<std::tuple<std::string, std::deque<std::string>*, std::size_t>> taken;  // lane, group, followers
  std::int64_t fences = 0;
  std::size_t passed = 0, asked = 0;  // asked: how many lanes the last pop from ready asked for
  std::size_t again = 0;              // lanes this round put back in ready with room for more: read on
  std::vector<std::pair<std::int64_t, std::string>> later;  // lanes that may not start yet
  for (;;) {
    for (std::size_t at = 0; at < batch.size(); ++at) {
      // (A weighted group's turn took the room, or the claim passed over as many lanes as it may:
      // the rest, the turn's lane first, wait at the head; lane by lane, as claim.lua.)
      if (taken.size() >= max || passed >= claim_passes) {
        effects_.made_ready += batch.size() - at;
        auto rest = std::make_move_iterator(batch.begin() + static_cast<std::ptrdiff_t>(at));
        if (home == &q.ready)  // (push_list: a wake entry at ready's head makes way)
          q.ready_front(rest, std::make_move_iterator(batch.end()));
        else
          home->insert(home->begin(), rest, std::make_move_iterator(batch.end()));
        break;
      }
      auto& lane = batch[at];
      if (lane == "w:") continue;  // (a wake entry)
      if (!is_group_lane(lane)) {
        if (q.cancel_waits(std::string_view(lane).substr(2))) {  // dropped (claim.lua's drop)
          q.drop_cancelled(std::string_view(lane).substr(2), now);
          effects_.kept_ended = true;
          ++passed;
          continue;
        }
        taken.emplace_back(std::move(lane), nullptr, 0);
        ++fences;
        continue;
      }
      auto group = q.groups.find(lane.substr(2));
      bool more = false;  // cancelled heads left to drop when this call's bound is reached
      if (group != q.groups.end()) {
        auto& list = group->second;
        while (!list.empty() && q.cancel_waits(list.front()) && !(more = passed >= claim_passes)) {
          q.drop_cancelled(list.front(), now);
          effects_.kept_ended = true;
          list.pop_front();
          ++passed;
        }
        if (list.empty()) q.groups.erase(group);
        group = q.groups.find(lane.substr(2));
      }
      if (more) {  // (the next claim goes on)
        if (q.push_lanes({std::move(lane)}, true, true).first) any_levels = true;
        continue;
      }
      if (group == q.groups.end()) {  // a stale lane of an emptied group is dropped
        ++passed;
        continue;
      }
      if (q.paused.contains(group->first)) {
        q.parked.insert(group->first);
        ++passed;
        continue;
      }
      // A throttled group, or one whose head's rate limit is reached, waits in delayed; a limited
      // head goes without followers, and followers go up to the first cancelled (dropped as a
      // head) or limited one (claim.lua).
      auto& list = group->second;
      auto head_rate = rate_in(list.front());
      auto wait = q.throttled_until(group->first, now);
      // A group that runs several jobs at once (or whose exclusive head waits for such runs to
      // end) at its limit: the lane waits in full for an end (claim.lua).
      auto conc = static_cast<std::int64_t>(conc_in(list.front()));
      auto runs = q.running.contains(group->first) ? q.running[group->first] : 0;
      if (!wait && runs >= conc) {
        q.full.insert(group->first);
        ++passed;
        continue;
      }
      if (!wait && head_rate) wait = q.rate_wait(group->first, *head_rate, now);
      if (wait) {
        later.emplace_back(*wait, std::move(lane));
        ++passed;
        continue;
      }
      if (conc > 1) {  // its head leaves the list; the lane goes on while there is room
        auto record = std::move(list.front());
        list.pop_front();
        std::string name = group->first;
        ++q.running[name];
        // A weighted group's turn goes on until its weight of heads started: its lane is met
        // next in this call, or first in the next when this one has no room left.
        auto weight = static_cast<std::int64_t>(weight_in(record));
        bool turn_on = false;
        if (weight > 1) {
          auto starts = q.turn && q.turn->second == name ? q.turn->first + 1 : 1;
          turn_on = !list.empty() && runs + 1 < conc && starts < weight;
          if (turn_on)
            q.turn.emplace(starts, name);
          else
            q.turn.reset();
        }
        if (list.empty()) {
          q.groups.erase(group);
        } else if (turn_on) {
          // (met again below)
        } else if (runs + 1 < conc) {
          auto [leveled, to] = q.push_lanes({lane}, false, true);
          if (leveled) any_levels = true;
          ++effects_.made_ready;
          if (to == home) {
            ++again;
          } else {
            for (std::size_t k = 1; k < source; ++k)
              if (sources[k - 1] == to && (rewind == 0 || k <= rewind)) rewind = k;
          }
        } else {
          q.full.insert(name);
        }
        taken.emplace_back(conc_lane(name, record), nullptr, 0);
        ++fences;
        if (turn_on) batch.insert(batch.begin() + static_cast<std::ptrdiff_t>(at) + 1, std::string(lane));
        continue;
      }
      // A weighted head takes its weight times the followers (claim.lua's weight_of), at most
      // 1,000 jobs a lease; not under the queue's rate limit (no followers there).
      auto reach = ahead;
      if (!opts.rate) reach = std::min(weight_in(list.front()) * (ahead + 1), max_ahead + 1) - 1;
      std::size_t followers = 0;
      while (!head_rate && followers < std::min(list.size() - 1, reach) && !q.cancel_waits(list[followers + 1]) &&
             !rate_in(list[followers + 1]) && conc_in(list[followers + 1]) == 1)
        ++followers;
      fences += static_cast<std::int64_t>(followers + 1);
      taken.emplace_back(std::move(lane), &list, followers);
    }
    auto need = max - taken.size();
    if (need == 0 || passed >= claim_passes) break;
    // (the next list, unless this one may hold more: it gave all that was asked, or lanes went back to it)
    if (source == 0 || !sources[source - 1] || (batch.size() < asked && again == 0)) {
      if (rewind != 0 && sources[source - 1])  // (the lanes moved and ready count as one list)
        source = std::exchange(rewind, 0);
      else
        ++source;
    }
    if (source > sources.size()) break;
    again = 0;
    batch.clear();
    if (!sources[source - 1]) {
      if (!moved_read) batch = std::move(moved);
      home = &q.ready;
      asked = 0;
      moved_read = true;
      continue;
    }
    home = sources[source - 1];
    asked = need;
    while (batch.size() < need && !home->empty()) {  // LPOP <list> need
      batch.push_back(std::move(home->front()));
      home->pop_front();
    }
  }
  if (!moved_read) {  // (the claim's room ran out before them: back at the head of ready)
    effects_.made_ready += moved.size();
    q.ready_front(std::make_move_iterator(moved.begin()), std::make_move_iterator(moved.end()));
  }
  if (any_levels) q.wake_levels();
  delay(std::move(later));
  stopped = passed >= claim_passes && taken.size() < max;
  if (taken.empty()) return out;
  std::int64_t deadline = now + opts.lease_ttl.count();
  q.fence += fences;
  std::int64_t fence = q.fence - fences;
  out.reserve(taken.size());
  for (auto& [lane, list, followers] : taken) {
    claimed_job job;
    job.fence = ++fence;
    job.token = make_token(fence, lane);
    if (list) {
      job.group = lane.substr(2);
      job.job = split_record(list->front());
      job.ahead = split_all(*list, followers);
      fence += static_cast<std::int64_t>(followers);
    } else if (lane.starts_with("c:")) {
      auto [group, record] = conc_parts(lane);
      job.group = std::string(group);
      job.job = split_record(record);
    } else {
      job.job = split_record(std::string_view(lane).substr(2));
    }
    q.active[job.token] = deadline;
    out.push_back(std::move(job));
  }
  q.started += static_cast<std::int64_t>(out.size());
  if (opts.rate) {  // each lease is one start (no followers)
    auto& st = q.queue_starts;
    for (const auto& job : out) {
      st.at[job.fence] = now;
      st.by_time.emplace(now, job.fence);
    }
    st.until = now + opts.rate->window.count();
  }
  return out;
}

std::vector<finish_result> queue_model::finish(std::vector<finish_item> items, std::chrono::milliseconds lease_ttl) {
  std::vector<finish_result> out(items.size());
  auto& q = *s_;

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
  if (!any) return out;
  for (auto token : gone) q.active.erase(std::string(token));

  std::int64_t now = now_();
  std::vector<std::string> back, front;
  std::vector<std::pair<std::int64_t, std::string>> later;
  std::vector<std::pair<std::size_t, std::string>> nexts;  // item, lane: leased after the loop
  std::int64_t completed = 0, failed = 0, retried = 0, deferred = 0, halted = 0, started = 0, unhandled = 0;
  // finish.lua's to_front: after a keep, the follower `id` becomes its group's head.
  auto to_front = [](std::deque<std::string>& list, const std::string& id) {
    if (list.empty() || id.empty() || id_in(list.front()) == id) return;
    for (std::size_t i = 1; i < list.size(); ++i) {
      if (id_in(list[i]) != id) continue;
      auto record = std::move(list[i]);
      list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));  // LREM, LPUSH
      list.push_front(std::move(record));
      return;
    }
  };
  // finish.lua's note: a kept job's entry completed ('c'), cancelled ('k'), to run again after
  // `delay` ms ('p': unless its cancel waits), or gone ('x').
  std::size_t kept_done = 0;
  auto note = [&](const std::optional<std::string>& record, std::string_view group, char state,
                  std::chrono::milliseconds delay, std::string_view result = {}) {
    if (!record) return;
    auto k = kept_in(*record);
    if (!k) return;
    std::string id(k->id);
    if (state == 'x') {
      q.kept.erase(id);
      effects_.kept_ended = true;
      return;
    }
    if (state == 'p' && q.cancel_waits(*record)) {  // (finish.lua publishes: its run has ended)
      effects_.kept_ended = true;
      return;
    }
    std::int64_t at = 0;
    if (state == 'c' || state == 'k') {
      at = now;
      q.set_done(id, now + k->keep_ms);
      ++kept_done;
      effects_.kept_ended = true;
    } else if (delay.count() > 0) {
      state = 'd';
      at = now + delay.count();
    }
    q.kept[id] = kept_entry(state, at, group, *record, result);
  };
  // Keyed as finish.lua does: the id, or '<id>#<fence>' when that is taken or there is no id.
  auto dead_letter_of = [&](const std::optional<std::string>& record, std::string group, std::string error,
                            std::string_view token) {
    std::string key = id_in(record.value_or(""));
    while (key.empty() || q.dead.contains(key)) {
      key += '#';
      key += token.substr(0, token.find('|'));
    }
    auto runs = attempts_before(record.value_or("")) + 1;
    note(record, group, 'x', {});
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
  // finish.lua's conc_end: the end of a job whose group runs several at once (its record in its
  // lane). Taken after the other items, from the last leased to the first (see below).
  auto conc_end = [&](const finish_item& item, finish_kind kind, const std::string& lane) {
    auto [group, rec] = conc_parts(lane);
    std::string name(group);
    std::string record(rec);
    std::string group_lane = "g:" + name;
    bool ends = kind == finish_kind::ack || kind == finish_kind::fail || kind == finish_kind::give_up ||
                kind == finish_kind::cancel;
    if (ends) {
      bool was_full = q.run_ended(name);
      if (!item.unique_id.empty()) q.ids.erase(item.unique_id);
      if (kind == finish_kind::cancel) {
        note(record, name, 'k', {});
      } else if (kind == finish_kind::ack) {
        ++completed;
        note(record, name, 'c', {}, item.result);
      } else {
        dead_letter_of(record, name, item.error, item.token);
      }
      auto pause =
          (kind == finish_kind::ack || kind == finish_kind::fail) ? item.throttle : std::chrono::milliseconds(0);
      if (was_full && q.groups.contains(name)) {  // its lane waited for this end
        if (pause.count() > 0)
          send_back(group_lane, pause);
        else if (kind == finish_kind::give_up && !q.paused.contains(name))
          front.push_back(group_lane);
        else
          send_back(group_lane, std::chrono::milliseconds(0));
      } else if (pause.count() > 0) {
        q.throttle(name, now, pause.count());
      }
      return;
    }
    // Back to its group's head, before every job that has not started (a release: with no
    // attempt counted, its lane to the head of ready).
    if (kind == finish_kind::retry || kind == finish_kind::halt) record = counted(record);
    bool lane_needed = q.run_back(name, record);
    if (kind == finish_kind::release) {
      q.unstart(name);
      q.unstart_in_queue(item.token);
      --started;
      if (lane_needed) front.push_back(group_lane);
      return;
    }
    note(record, name, 'p', kind == finish_kind::halt ? std::chrono::milliseconds(0) : item.delay);
    if (kind == finish_kind::halt) {
      q.paused[name] = paused_group{name, true, item.error, now};
      if (lane_needed) q.parked.insert(name);  // (else claim or promote parks the lane it meets)
      ++halted;
    } else if (lane_needed) {
      send_back(group_lane, item.delay);
    } else if (item.delay.count() > 0) {
      q.throttle(name, now, item.delay.count());  // the group waits for its head
    }
    if (kind == finish_kind::retry) ++retried;
    if (kind == finish_kind::defer) ++deferred;
    if (kind == finish_kind::hand_back) {
      ++unhandled;
      --started;
      q.unstart(name);
      q.unstart_in_queue(item.token);
    }
  };
  std::vector<std::pair<std::int64_t, std::size_t>> conc_items;  // (fence, item)
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!held[i]) continue;
    const finish_item& item = items[i];
    out[i].lease_held = true;
    std::string lane = lane_of(item.token);
    bool grouped = is_group_lane(lane);
    finish_kind kind = item.kind;
    if (kind == finish_kind::keep && !grouped) kind = finish_kind::ack;
    if (lane.starts_with("c:")) {  // (after the others: see conc_end)
      std::int64_t fence = 0;
      std::from_chars(item.token.data(), item.token.data() + item.token.size(), fence);
      conc_items.emplace_back(fence, i);
      continue;
    }
    if (kind == finish_kind::halt && !grouped) kind = finish_kind::fail;
    if (kind == finish_kind::keep) {
      if (!item.unique_id.empty()) q.ids.erase(item.unique_id);
      if (auto group = q.groups.find(lane.substr(2)); group != q.groups.end()) {
        note(group->second.front(), group->first, 'c', {}, item.result);
        group->second.pop_front();
        to_front(group->second, item.id);
        if (group->second.empty()) q.groups.erase(group);  // drift: its follower is gone (check reports it)
      }
      ++completed;
      ++started;
    } else if (kind == finish_kind::release) {  // as release(): to the head, no attempt counted
      if (grouped) q.unstart(lane.substr(2));
      q.unstart_in_queue(item.token);
      front.push_back(std::move(lane));
      --started;
    } else if (kind == finish_kind::ack || kind == finish_kind::fail || kind == finish_kind::give_up ||
               kind == finish_kind::cancel) {
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
            if (item.throttle.count() > 0 && (ack || kind == finish_kind::fail))
              q.throttle(group->first, now, item.throttle.count());
            q.groups.erase(group);
          } else if (item.throttle.count() > 0 && (ack || kind == finish_kind::fail)) {
            send_back(lane, item.throttle);
          } else if (ack && !q.paused.contains(group->first) && !q.cancel_waits(list.front()) &&
                     !rate_in(list.front()) && conc_in(list.front()) == 1 &&
                     (item.want_next == finish_item::next_policy::yes ||
                      (item.want_next == finish_item::next_policy::if_nobody_waits && q.ready.empty() && back.empty() &&
                       front.empty()))) {
            claimed_job next;
            next.group = group->first;
            next.job = split_record(list.front());
            std::size_t followers = 0;  // up to the first cancelled one (claim drops it)
            while (followers < std::min({list.size() - 1, item.ahead, max_ahead}) &&
                   !q.cancel_waits(list[followers + 1]) && !rate_in(list[followers + 1]) &&
                   conc_in(list[followers + 1]) == 1)
              ++followers;
            next.ahead = split_all(list, followers);
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
      if (kind == finish_kind::cancel) {
        note(record, grouped ? std::string_view(lane).substr(2) : std::string_view(), 'k', {});
      } else if (ack) {
        ++completed;
        note(record, grouped ? std::string_view(lane).substr(2) : std::string_view(), 'c', {}, item.result);
      } else {
        dead_letter_of(record, grouped ? lane.substr(2) : std::string(), item.error, item.token);
      }
    } else if (grouped) {  // retry, defer, hand back or halt: the job stays at its group's head
      auto group = q.groups.find(lane.substr(2));
      if (group != q.groups.end()) {
        auto& head = group->second.front();
        if (kind == finish_kind::retry || kind == finish_kind::halt) head = counted(head);
        note(head, group->first, 'p', kind == finish_kind::halt ? std::chrono::milliseconds(0) : item.delay);
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
        q.unstart(lane.substr(2));
        q.unstart_in_queue(item.token);
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
        q.unstart_in_queue(item.token);
      }
      note(record, {}, 'p', item.delay);
      send_back("j:" + record, item.delay);
    }
  }
  // Jobs of groups that run several at once go back to their group's head from the last leased to
  // the first, so that they stand there in the order they were leased (finish.lua).
  std::sort(conc_items.begin(), conc_items.end(), std::greater<>());
  for (auto& [fence, i] : conc_items) {
    finish_kind kind = items[i].kind == finish_kind::keep ? finish_kind::ack : items[i].kind;
    conc_end(items[i], kind, lane_of(items[i].token));
  }
  auto made_ready = back.size() + front.size();
  q.push_lanes(std::move(back), false);
  q.push_lanes(std::move(front), true);
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
  effects_.made_ready += made_ready;
  delay(std::move(later));
  if (kept_done > 0) drop_done(now, kept_done + 10);
  return out;
}

std::vector<bool> queue_model::extend(const std::string& worker, std::vector<std::string> tokens,
                                      std::chrono::milliseconds lease_ttl) {
  std::vector<bool> out;
  out.reserve(tokens.size());
  auto& q = *s_;
  std::int64_t deadline = now_() + lease_ttl.count();
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
  return out;
}

void queue_model::advertise(std::vector<std::string> types, std::chrono::milliseconds ttl) {
  auto& known = s_->types;
  auto until = now_() + ttl.count();
  for (auto& t : types) known[t] = std::max(known[t], until);  // ZADD GT
  return;
}

std::chrono::milliseconds queue_model::unrunnable_for(const std::string& type) const {
  const auto& known = s_->types;
  auto it = known.find(type);
  if (it == known.end()) return std::chrono::milliseconds::max();
  return std::chrono::milliseconds(std::max<std::int64_t>(0, now_() - it->second));
}

std::int64_t queue_model::expire_own(const std::string& worker) {
  auto& q = *s_;
  auto found = q.leases_of.find(worker);
  if (found == q.leases_of.end()) return 0;
  std::int64_t n = 0;
  for (auto& token : found->second) {
    if (auto lease = q.active.find(token); lease != q.active.end()) {
      lease->second = 0;
      ++n;
    }
  }
  q.leases_of.erase(found);
  return n;
}

void queue_model::release(const std::string& worker, std::vector<std::string> tokens) {
  auto& q = *s_;
  std::vector<std::string> lanes;
  std::vector<std::pair<std::int64_t, std::string>> conc_back;  // (fence, lane) of 'c:' leases
  std::int64_t released = 0;
  for (auto& token : tokens) {
    if (q.active.erase(token) == 0) continue;
    q.unstart_in_queue(token);
    ++released;
    auto lane = lane_of(token);
    if (lane.starts_with("c:")) {  // (below)
      std::int64_t fence = 0;
      std::from_chars(token.data(), token.data() + token.size(), fence);
      conc_back.emplace_back(fence, std::move(lane));
      continue;
    }
    if (is_group_lane(lane)) q.unstart(lane.substr(2));
    lanes.push_back(std::move(lane));
  }
  // A job of a group that runs several at once: back to its group's head, from the last leased to
  // the first (release.lua).
  std::sort(conc_back.begin(), conc_back.end(), std::greater<>());
  for (auto& [fence, lane] : conc_back) {
    auto [group, record] = conc_parts(lane);
    std::string name(group);
    q.unstart(name);
    if (q.run_back(name, std::string(record))) lanes.push_back("g:" + name);
  }
  if (auto mine = q.claimed.find(worker); mine != q.claimed.end()) {
    std::move(mine->second.begin(), mine->second.end(), std::back_inserter(lanes));
    q.claimed.erase(mine);
  }
  effects_.made_ready += lanes.size();
  q.push_lanes(std::move(lanes), true);
  q.started -= released;
  return;
}

reap_result queue_model::reap(reap_options opts) {
  const std::size_t max = opts.max;
  reap_result result;
  auto& q = *s_;
  std::int64_t now = now_();
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
  std::vector<std::pair<std::int64_t, std::string>> conc_back;  // (fence, lane) of 'c:' leases
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
    } else if (lane.starts_with("c:")) {  // (below)
      std::int64_t fence = 0;
      std::from_chars(token.data(), token.data() + token.size(), fence);
      conc_back.emplace_back(fence, std::move(lane));
    } else {
      result.recovered_types.push_back(type_in(lane));
      lanes.push_back("j:" + counted(lane.substr(2)));
    }
  }
  // A job of a group that runs several at once: back to its group's head, its attempt counted,
  // from the last leased to the first (reap.lua).
  std::sort(conc_back.begin(), conc_back.end(), std::greater<>());
  for (auto& [fence, lane] : conc_back) {
    auto [group, record] = conc_parts(lane);
    std::string name(group);
    result.recovered_types.push_back(type_in(record));
    if (!q.run_back(name, counted(std::string(record)))) continue;
    if (q.paused.contains(name))
      q.parked.insert(name);
    else
      lanes.push_back("g:" + name);
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
  effects_.made_ready += lanes.size();
  q.push_lanes(std::move(lanes), true);
  q.recovered += result.leases;

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
  if (opts.drop_kept) {
    drop_done(now, max);
    std::size_t ended = 0;  // throttles that ended (reap.lua): up to max
    std::erase_if(q.throttled, [&](const auto& t) { return t.second <= now && ended++ < max; });
  }
  return result;
}

queue_counts queue_model::counts() const {
  queue_counts c;
  const auto& q = *s_;
  // (every level's lanes; a wake entry at a list's head is no lane, as redis_backend counts)
  const std::string* next = nullptr;  // the next lane a claim takes
  for (int level : {2, 1, 0, -1, -2}) {
    const auto& list = q.level_list(level);
    c.ready_lanes += static_cast<std::int64_t>(list.size());
    std::size_t at = 0;
    if (!list.empty() && list.front() == "w:") {
      --c.ready_lanes;
      ++at;
    }
    if (!next && at < list.size()) next = &list[at];
  }
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
  if (next) {  // (the head's record: inline, or its group's head)
    const auto& head = *next;
    auto group = is_group_lane(head) ? q.groups.find(head.substr(2)) : q.groups.end();
    if (!is_group_lane(head))
      c.next_enqueued_ms = enqueued_at(head);
    else if (group != q.groups.end() && !group->second.empty())
      c.next_enqueued_ms = enqueued_at(group->second.front());
  }
  return c;
}

promote_result queue_model::promote(std::size_t max) {
  promote_result result;
  auto& q = *s_;
  std::int64_t now = now_();
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
  effects_.made_ready += lanes.size();
  q.push_lanes(std::move(lanes), false);
  if (!q.delayed.empty())
    result.next_due = std::chrono::milliseconds(std::max<std::int64_t>(0, q.delayed.begin()->first - now));
  return result;
}

std::vector<dead_letter> queue_model::dead_letters(std::size_t offset, std::size_t limit) const {
  std::vector<dead_letter> out;
  for (auto& [id, letter] : s_->dead) out.push_back(letter);
  std::sort(out.begin(), out.end(), [](const dead_letter& a, const dead_letter& b) {
    return std::tie(a.at_ms, a.id) < std::tie(b.at_ms, b.id);
  });
  out.erase(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(std::min(offset, out.size())));
  if (out.size() > limit) out.resize(limit);
  return out;
}

std::optional<dead_letter> queue_model::dead_letter_of(const std::string& id) const {
  auto letter = s_->dead.find(id);
  if (letter == s_->dead.end()) return std::nullopt;
  return letter->second;
}

std::vector<std::string> queue_model::requeue(std::vector<std::string> ids, bool at_head) {
  std::vector<std::string> out;
  auto& q = *s_;
  std::size_t made_ready = 0;
  // Several jobs to a head go there in the order given (as requeue.lua): behind the ones before.
  std::vector<std::string> front;
  // Where a group's next record to its head goes: behind the head, which may be running, or in
  // front of it when its group runs several at once (its running jobs are out of the list, and
  // its head is the next to start). Decided on the head the group had.
  std::map<std::string, std::size_t, std::less<>> head_at;
  // A record joins its group's tail; a group that had no jobs gets its lane (or is parked).
  auto join = [&](const std::string& group, std::string record) {
    auto& list = q.groups[group];
    list.push_back(std::move(record));
    if (list.size() > 1) return;
    if (q.paused.contains(group)) {
      q.parked.insert(group);
    } else {
      q.push_lanes({"g:" + group}, false);
      ++made_ready;
    }
  };
  // Records to the head of a group with no jobs join it after the ungrouped ones went to the
  // head of ready (as requeue.lua does it).
  std::vector<std::pair<std::string, std::string>> joins;
  for (auto& id : ids) {
    auto found = q.dead.find(id);
    if (found == q.dead.end()) continue;
    std::string record = reset(found->second.record);
    if (unique_of(record) && !q.ids.insert(id_in(record)).second) continue;  // a pending job has it
    const std::string& group = found->second.group;
    if (auto k = kept_in(record)) q.kept[std::string(k->id)] = kept_entry('p', 0, group, record);
    if (group.empty()) {
      if (at_head)
        front.push_back("j:" + record);
      else
        q.push_lanes({"j:" + record}, false);
      ++made_ready;
    } else if (!at_head) {
      join(group, std::move(record));
    } else if (auto list = q.groups.find(group); list == q.groups.end() || list->second.empty()) {
      joins.emplace_back(group, std::move(record));
    } else {
      auto at = head_at.find(group);
      if (at == head_at.end()) at = head_at.emplace(group, conc_in(list->second.front()) > 1 ? 0 : 1).first;
      list->second.insert(list->second.begin() + static_cast<std::ptrdiff_t>(at->second++), std::move(record));
    }
    q.dead.erase(found);
    out.push_back(id);
  }
  q.push_lanes(std::move(front), true);
  for (auto& [group, record] : joins) join(group, std::move(record));
  effects_.made_ready += made_ready;
  return out;
}

std::int64_t queue_model::purge(std::vector<std::string> ids) {
  auto& q = *s_;
  std::int64_t n = 0;
  if (ids.empty()) {
    n = static_cast<std::int64_t>(q.dead.size());
    q.dead.clear();
  } else {
    for (auto& id : ids) n += static_cast<std::int64_t>(q.dead.erase(id));
  }
  return n;
}

bool queue_model::pause(const std::string& group) {
  auto& q = *s_;
  if (!q.paused.try_emplace(group, paused_group{group, false, {}, now_()}).second) return false;
  // As pause.lua: a lane in ready or a level's list is parked now; one waiting in delayed, as it
  // comes due.
  const std::string lane = "g:" + group;
  for (int level : {0, 2, 1, -1, -2}) {
    auto& list = q.level_list(level);
    if (auto at = std::find(list.begin(), list.end(), lane); at != list.end()) {  // LREM <list> 1 lane
      list.erase(at);
      q.parked.insert(group);
      q.wake_levels();  // (ready may be empty now)
      break;
    }
  }
  return true;
}

bool queue_model::resume(const std::string& group, resume_mode mode) {
  auto& q = *s_;
  auto state = q.paused.find(group);
  if (state == q.paused.end()) return false;
  bool is_parked = q.parked.contains(group);
  if (mode == resume_mode::skip && !is_parked)
    refuse(errc::group_busy,
           fmt::format("group '{}' is running or waiting to run; pause it and let it stop first", group));
  bool halted = state->second.halted;
  std::string why = "skipped by an operator";
  if (halted) why += " after it halted its group: " + state->second.error;
  q.paused.erase(state);
  if (!is_parked) return true;
  q.parked.erase(group);
  auto list = q.groups.find(group);
  if (list != q.groups.end() && mode == resume_mode::skip) {
    std::string head = std::move(list->second.front());
    list->second.pop_front();
    // As resume.lua: it did not run again, so its runs are the header's (a halt counted its last);
    // a halted job's record is kept as its last run saw it.
    auto runs = std::max<std::int64_t>(attempts_before(head), 0);
    if (halted) head = uncounted(head);
    std::string id = id_in(head);
    if (unique_of(head)) q.ids.erase(id);
    if (kept_in(head)) {
      q.kept.erase(id);
      effects_.kept_ended = true;
    }
    std::string key = id;  // as resume.lua: a key of its own when the id is taken or missing
    while (key.empty() || q.dead.contains(key)) key += "#" + std::to_string(++q.fence);
    q.dead[key] = dead_letter{key, group, std::move(head), std::move(why), now_(), runs};
    ++q.failed;
    if (list->second.empty()) q.groups.erase(list);
  } else if (list != q.groups.end() && halted) {
    list->second.front() = reset(list->second.front());
  }
  if (q.groups.contains(group)) {
    q.push_lanes({"g:" + group}, false);
    effects_.made_ready += 1;
  }
  return true;
}

std::vector<paused_group> queue_model::paused_groups() const {
  std::vector<paused_group> out;
  for (auto& [name, state] : s_->paused) out.push_back(state);
  return out;
}

void queue_model::drop_done(std::int64_t now, std::size_t max) {
  auto& q = *s_;
  for (std::size_t n = 0; n < max && !q.done.empty() && q.done.begin()->first <= now; ++n) {
    auto id = q.done.begin()->second;
    q.done.erase(q.done.begin());
    q.done_at.erase(id);
    if (auto e = q.kept.find(id); e != q.kept.end() && (e->second.starts_with('c') || e->second.starts_with('k')))
      q.kept.erase(e);  // (else enqueued again)
  }
}

cancel_outcome queue_model::cancel(const std::string& id) {
  auto e = s_->kept.find(id);
  if (e == s_->kept.end()) return cancel_outcome::not_found;
  auto& entry = e->second;
  switch (entry[0]) {
    case 'p':
    case 'd': break;
    case 'c': return cancel_outcome::done;
    default: return cancel_outcome::already;
  }
  entry = fmt::format("n{}", now_()) + entry.substr(entry.find(':'));
  effects_.kept_ended = true;
  return cancel_outcome::cancelled;
}

std::vector<bool> queue_model::cancelled(const std::vector<held_job>& jobs) const {
  std::vector<bool> out;
  out.reserve(jobs.size());
  for (auto& j : jobs) {
    auto e = s_->kept.find(j.id);
    out.push_back(e != s_->kept.end() && (e->second.starts_with('n') || e->second.starts_with('k')));
  }
  return out;
}

std::optional<kept_job> queue_model::kept_job_of(const std::string& id) const {
  auto e = s_->kept.find(id);
  if (e == s_->kept.end()) return std::nullopt;
  std::optional<std::int64_t> gone_at;
  if (auto d = s_->done_at.find(id); d != s_->done_at.end()) gone_at = d->second;
  return parse_kept_entry(id, e->second, now_(), gone_at);
}

void queue_model::put_schedule(stored_schedule s) {
  remove_schedule(s.name);
  schedule_due_.emplace(s.next_ms, s.name);
  auto name = s.name;
  schedules_.emplace(std::move(name), std::move(s));
  effects_.schedules_changed = true;
}

bool queue_model::remove_schedule(const std::string& name) {
  auto found = schedules_.find(name);
  if (found == schedules_.end()) return false;
  schedule_due_.erase({found->second.next_ms, name});
  schedules_.erase(found);
  effects_.schedules_changed = true;
  return true;
}

page<stored_schedule> queue_model::schedules(const std::string& cursor, std::size_t limit) const {
  page<stored_schedule> out;
  auto it = cursor.empty() ? schedules_.begin() : schedules_.upper_bound(cursor);
  for (; it != schedules_.end() && out.items.size() < std::max<std::size_t>(limit, 1); ++it)
    out.items.push_back(it->second);
  if (it != schedules_.end()) out.cursor = out.items.back().name;
  return out;
}

std::optional<stored_schedule> queue_model::next_schedule() const {
  if (schedule_due_.empty()) return std::nullopt;
  return schedules_.at(schedule_due_.begin()->second);
}

schedule_fired queue_model::fire_schedule(const schedule_step& step) {
  schedule_fired out;
  auto found = schedules_.find(step.was.name);
  const auto* now = found == schedules_.end() ? nullptr : &found->second;
  if (!now || now->spec != step.was.spec || now->group != step.was.group || now->next_ms != step.was.next_ms)
    return out;
  out.taken = true;
  std::vector<encoded_job> jobs;
  for (auto at : step.firings) {
    auto& j = jobs.emplace_back(step.job);
    j.id = fmt::format("{}@{}", step.was.name, at);
    j.delay_ms = j.run_at_ms = 0;
  }
  try {
    if (!jobs.empty()) out.results = enqueue(std::move(jobs));
  } catch (const boost::system::system_error& e) {
    if (e.code().category() != error_category()) throw;
    out.refused = e.what();
  }
  schedule_due_.erase({found->second.next_ms, found->first});
  found->second.next_ms = step.next_ms;
  schedule_due_.emplace(step.next_ms, found->first);
  return out;
}

void queue_model::purge_queue() {
  // The fence and id counters stay, as on Redis (a token given out before must never match a
  // new lease, an id never be given twice).
  auto fence = s_->fence, seq = s_->seq;
  *s_ = queue_state{};
  schedules_.clear();
  schedule_due_.clear();
  s_->fence = fence;
  s_->seq = seq;
}

std::int64_t queue_model::group_size(const std::string& group) const {
  auto g = s_->groups.find(group);
  auto r = s_->running.find(group);
  return (g == s_->groups.end() ? 0 : static_cast<std::int64_t>(g->second.size())) +
         (r == s_->running.end() ? 0 : r->second);
}

check_report queue_model::check(bool repair) {
  check_report out;
  auto& q = *s_;
  queue_walk walk;
  walk.ready.assign(q.ready.begin(), q.ready.end());
  for (int level : priority_levels) {
    const auto& list = q.level_list(level);
    walk.levels.emplace_back(std::to_string(level), std::vector<std::string>(list.begin(), list.end()));
  }
  for (auto& [worker, lanes] : q.claimed)
    walk.claimed.emplace_back(worker, std::vector<std::string>(lanes.begin(), lanes.end()));
  for (auto& [due, member] : q.delayed) walk.delayed.push_back(member);
  for (auto& [token, deadline] : q.active) walk.active.push_back(token);
  walk.parked.assign(q.parked.begin(), q.parked.end());
  walk.full.assign(q.full.begin(), q.full.end());
  walk.running.insert(q.running.begin(), q.running.end());
  for (auto& [group, state] : q.paused) walk.paused.insert(group);
  for (auto& [worker, deadline] : q.workers) walk.workers.insert(worker);
  for (auto& [group, records] : q.groups)
    walk.groups.emplace_back(group, std::vector<std::string>(records.begin(), records.end()));
  walk.ids.assign(q.ids.begin(), q.ids.end());
  walk.calls = 1;
  auto suspects = analyse(walk, out);
  out.calls = walk.calls;

  // check_fix.lua's confirmations, step by step.
  auto erase_first = [](auto& list, const std::string& value) {
    if (auto it = std::find(list.begin(), list.end(), value); it != list.end()) list.erase(it);
  };
  // (check_fix.lua wakes the levels after each call that repaired: what it removed may have been
  // ready's last lane)
  auto woken = [&](std::int64_t before) {
    if (out.repaired > before) q.wake_levels();
  };
  for (auto& group : suspects.groups) {
    auto before = out.repaired;
    std::string lane = "g:" + group;
    struct holder {
      std::string where;
      std::function<void()> remove;
      bool lease = false;
    };
    std::vector<holder> holders;
    for (int level : {0, 2, 1, -1, -2}) {  // (a group's lane waits in its head's level)
      auto& list = q.level_list(level);
      auto where = level == 0 ? std::string("ready") : "ready:" + std::to_string(level);
      for (auto& l : list)
        if (l == lane) holders.push_back({where, [&erase_first, &lane, at = &list] { erase_first(*at, lane); }});
    }
    for (auto& [worker, lanes] : q.claimed)
      for (auto& l : lanes)
        if (l == lane) holders.push_back({"claimed:" + worker, [&, w = worker] { erase_first(q.claimed[w], lane); }});
    auto delayed = std::find_if(q.delayed.begin(), q.delayed.end(), [&](const auto& e) { return e.second == lane; });
    if (delayed != q.delayed.end()) holders.push_back({"delayed", [&q, delayed] { q.delayed.erase(delayed); }});
    for (auto& [token, deadline] : q.active)
      if (lane_of(token) == lane) holders.push_back({"a lease", [&q, t = token] { q.active.erase(t); }, true});
    if (q.parked.contains(group)) holders.push_back({"parked", [&] { q.parked.erase(group); }});
    // The runs counted of a group that runs several jobs at once, against its leases; full
    // holds the lane only while such a run goes on, whose end puts it back.
    std::int64_t leases = 0;
    for (auto& [token, deadline] : q.active)
      if (auto l = lane_of(token); l.starts_with("c:") && conc_parts(l).first == group) ++leases;
    auto counted = q.running.find(group);
    if (auto n = counted == q.running.end() ? 0 : counted->second; n != leases) {
      out.problems.push_back(runs_problem(group, n, leases));
      if (repair) {
        if (leases > 0)
          q.running[group] = leases;
        else
          q.running.erase(group);
        ++out.repaired;
      }
    }
    if (q.full.contains(group)) {
      if (leases > 0)
        holders.push_back({"full", [&] { q.full.erase(group); }});
      else if (repair)
        q.full.erase(group);
    }
    auto records = q.groups.find(group);
    bool is_paused = q.paused.contains(group);
    if (records != q.groups.end() && !records->second.empty()) {
      if (holders.empty()) {
        ++out.stuck_groups;
        out.problems.push_back(stuck_problem(group, static_cast<std::int64_t>(records->second.size())));
        if (repair) {
          if (is_paused)
            q.parked.insert(group);
          else
            q.push_lanes({lane}, false);
          ++out.repaired;
        }
      } else if (holders.size() > 1) {
        std::vector<std::string> where;
        for (auto& h : holders) where.push_back(h.where);
        out.problems.push_back(lanes_problem(group, where));
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
        out.problems.push_back(parked_problem(group));
        if (repair) {
          q.parked.erase(group);
          q.push_lanes({lane}, false);
          ++out.repaired;
        }
      }
    } else {
      for (auto& h : holders) {
        if (h.where != "parked") out.problems.push_back(empty_group_problem(group, h.where));
        if (repair) {
          h.remove();
          if (h.where != "parked") ++out.repaired;
        }
      }
    }
    woken(before);
  }
  for (auto& c : suspects.copies) {
    // Whether a copy is where the walk saw it, and what drops it. `nth` 2: the second copy is
    // the same entry as the first (one list, one text, read twice as the list moved): there only
    // when the list holds it twice. (A zset holds a member once.)
    auto find = [&](const job_place& p, std::size_t nth) -> std::function<void()> {
      using kind = job_place::kind;
      auto in = [&](auto& list) -> std::function<void()> {
        if (static_cast<std::size_t>(std::count(list.begin(), list.end(), p.member)) < nth) return {};
        return [&list, &erase_first, m = p.member] { erase_first(list, m); };
      };
      switch (p.where) {
        case kind::ready: return in(p.key.empty() ? q.ready : q.level_list(std::stoi(p.key)));
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
    out.problems.push_back(copy_problem(c.id, c.first, c.second));
    if (repair && (c.second.droppable() || c.first.droppable())) {
      (c.second.droppable() ? second : first)();
      ++out.repaired;
      q.wake_levels();
    }
  }
  for (auto& worker : suspects.dead_workers) {
    auto found = q.claimed.find(worker);
    if (found == q.claimed.end() || found->second.empty() || q.workers.contains(worker)) continue;
    out.problems.push_back(dead_worker_problem(worker, found->second.size()));
    if (repair) {
      q.ready_front(found->second.begin(), found->second.end());
      q.claimed.erase(found);
      ++out.repaired;
      q.wake_levels();
    }
  }
  // (No second walk for ids, as Redis has: this one was at one instant.)
  for (auto& id : suspects.ids) {
    if (!q.ids.contains(id)) continue;
    out.problems.push_back(id_problem(id));
    if (repair) {
      q.ids.erase(id);
      ++out.repaired;
      q.wake_levels();
    }
  }
  if (out.repaired > 0) effects_.made_ready += q.ready.size();  // lanes made ready: waiting claims take them
  return out;
}

// --- the operators' views ---

void queue_model::report_worker(worker_report r, std::chrono::milliseconds ttl) {
  auto now = now_();
  r.at_ms = now;
  auto id = r.id;
  auto& all = s_->reports;
  all[id] = {now + ttl.count(), std::move(r)};  // (reports.lua: HSET)
  // Reports that ran out go here, not when listed (the model keeps no second index: it looks
  // at every report, as many as the live workers and those stopped since the last report).
  std::erase_if(all, [&](const auto& e) { return e.second.first <= now; });
}

page<worker_report> queue_model::workers(const std::string& cursor, std::size_t limit) const {
  // By id from the cursor (the last id of the page before); those that ran out are skipped.
  page<worker_report> out;
  limit = std::max<std::size_t>(limit, 1);
  auto now = now_();
  const auto& all = s_->reports;
  auto it = cursor.empty() ? all.begin() : all.upper_bound(cursor);
  for (; it != all.end() && out.items.size() < limit; ++it)
    if (it->second.first > now) out.items.push_back(it->second.second);
  if (it != all.end() && !out.items.empty()) out.cursor = out.items.back().id;
  return out;
}

bool queue_model::claim_history() {
  auto now = now_();
  auto minute = now - now % minute_ms;
  if (s_->history.contains(minute) || s_->history_claimed == minute) return false;
  s_->history_claimed = minute;
  return true;
}

bool queue_model::record_history(const queue_counts& c) {
  auto now = now_();
  auto minute = now - now % minute_ms;
  auto& h = s_->history;
  if (!h.try_emplace(minute, c).second) return false;
  h.erase(h.begin(), h.lower_bound(minute - history_keep_ms));  // (ZREMRANGEBYSCORE)
  return true;
}

std::vector<history_point> queue_model::history(std::chrono::minutes span) const {
  std::vector<history_point> out;
  auto from = now_() - std::min<std::int64_t>(span.count() * minute_ms, history_keep_ms);
  for (auto it = s_->history.lower_bound(from); it != s_->history.end(); ++it) out.push_back({it->first, it->second});
  return out;
}

page<std::string> queue_model::groups(const std::string& prefix, const std::string& cursor, std::size_t limit) const {
  // In name order from the cursor ('g:' and the last name of the page before), groups with a
  // list and those whose jobs all run (several at once, out of their lists): a group with jobs
  // throughout is listed once, whatever else comes and goes.
  auto after = parse_group_cursor(cursor);
  const auto& all = s_->groups;
  auto it = after ? all.upper_bound(std::max(*after, prefix)) : all.lower_bound(prefix);
  std::vector<std::string_view> only_running;  // (few: at most one per run)
  for (const auto& [name, n] : s_->running)
    if (name.starts_with(prefix) && (!after || name > *after) && !all.contains(name)) only_running.push_back(name);
  std::sort(only_running.begin(), only_running.end());
  auto r = only_running.begin();
  page<std::string> out;
  limit = std::max<std::size_t>(limit, 1);
  for (;;) {
    bool list = it != all.end() && it->first.starts_with(prefix);
    if (!list && r == only_running.end()) return out;
    if (out.items.size() == limit) {
      out.cursor = "g:" + out.items.back();
      return out;
    }
    if (list && (r == only_running.end() || it->first < *r))
      out.items.push_back((it++)->first);
    else
      out.items.emplace_back(*r++);
  }
}

group_status queue_model::group_of(const std::string& group) const {
  const auto& q = *s_;
  group_status out;
  out.group = group;
  if (auto r = q.running.find(group); r != q.running.end()) out.running = r->second;
  out.depth = out.running;
  if (auto g = q.groups.find(group); g != q.groups.end()) {
    out.depth += static_cast<std::int64_t>(g->second.size());
    out.head = split_record(g->second.front());
  }
  if (auto p = q.paused.find(group); p != q.paused.end()) out.paused = p->second;
  out.parked = q.parked.contains(group);
  // (ZSCORE on Redis; the model keeps the set by due time only, so it looks through it.)
  const std::string lane = "g:" + group;
  for (const auto& [due, member] : q.delayed)
    if (member == lane) out.waiting_until_ms = due;
  return out;
}

page<dead_letter> queue_model::find_dead(const dead_filter& filter, const std::string& cursor,
                                         std::size_t limit) const {
  // Newest first, and by id backwards within a millisecond: ZRANGE BYSCORE REV's order.
  std::vector<const dead_letter*> all;
  for (const auto& [id, d] : s_->dead) all.push_back(&d);
  std::sort(all.begin(), all.end(), [](const dead_letter* a, const dead_letter* b) {
    return a->at_ms != b->at_ms ? a->at_ms > b->at_ms : a->id > b->id;
  });
  auto from = parse_dead_cursor(cursor);
  auto it = all.begin();
  if (from) {
    it = std::find_if(all.begin(), all.end(), [&](const dead_letter* d) { return d->at_ms <= from->at_ms; });
    auto anchor = std::find_if(it, all.end(),
                               [&](const dead_letter* d) { return d->at_ms != from->at_ms || d->id == from->last_id; });
    if (anchor != all.end() && (*anchor)->at_ms == from->at_ms) {
      it = std::next(anchor);  // right after the letter last seen
    } else {
      for (std::int64_t n = 0; n < from->skip && it != all.end() && (*it)->at_ms == from->at_ms; ++n) ++it;
    }
  }
  page<dead_letter> out;
  dead_cursor at = from.value_or(dead_cursor{});
  std::size_t looked = 0;
  for (; it != all.end(); ++it) {
    if (out.items.size() == limit || looked == dead_scan_bound) {
      out.cursor = to_string(at);
      return out;
    }
    ++looked;
    const auto& d = **it;
    if (d.at_ms == at.at_ms && (from || looked > 1))
      ++at.skip;
    else
      at = {d.at_ms, 1, {}};
    at.last_id = d.id;
    if (passes(filter, d)) out.items.push_back(d);
  }
  return out;
}

}  // namespace jobrt::detail
