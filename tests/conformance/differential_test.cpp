// A randomized differential test of the two backends: one seeded sequence of operations runs on a
// memory_backend and on a redis_backend (a fresh queue on the test Redis), and after every
// operation what each returned and what each shows of its state (counts, dead letters, paused
// groups, group sizes) must be the same. The first difference stops the run and is reported with
// the seed, the operation's index and the operations that led to it.
//
// Environment: JOBRT_DIFF_OPS operations (10,000), JOBRT_DIFF_SEED the seed (else one from the
// clock), JOBRT_DIFF_HISTORY how many of the last operations a failure prints (16). The test's
// self-check: JOBRT_DIFF_SABOTAGE_AT=<n> enqueues one job on Redis alone before operation n,
// and the run must fail right there. JOBRT_DIFF_KEEP=1 leaves the Redis queue behind.
//
// The sequence keeps to the worker protocol: each lease token is finished at most once (its keeps
// aside), a keep only while the token still holds followers, a lost lease is treated as lost on
// both backends. Leases last 60 s, so only expire_own (then reap) expires them. Delays are 0,
// hours, or a few milliseconds ("short"): a short entry is promoted only once the wall clock is
// surely past it on both backends (same machine: Redis TIME and system_clock agree), and short
// entries are made so that their order is the same on both (see pending_short).
#include "support/records.hpp"
#include "support/redis_server.hpp"
#include "support/run.hpp"

#include <jobrt/memory_backend.hpp>
#include <jobrt/redis_backend.hpp>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <boost/core/demangle.hpp>
#include <boost/system/system_error.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <typeinfo>
#include <utility>
#include <vector>

namespace asio = boost::asio;
using namespace jobrt;
using namespace std::chrono_literals;
using asio::awaitable;

namespace {

// --- small helpers ------------------------------------------------------------------------------

constexpr std::chrono::milliseconds lease_ttl = 60s;
constexpr std::int64_t hours_ms = 3LL * 3600 * 1000;
constexpr std::int64_t short_ms = 5;
constexpr std::size_t everything = 1'000'000;  // dead_letters' limit: all of them
const std::array<std::string, 3> worker_names{"w0", "w1", "w2"};

std::int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Waits (without sleeping: at most a few milliseconds) until the wall clock reads more than `ms`.
void until_past(std::int64_t ms) {
  while (wall_ms() <= ms) {
  }
}

std::int64_t env_number(const char* name, std::int64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return std::stoll(v);
}

// splitmix64: the same sequence for a seed on every platform and library.
struct random_source {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  std::size_t below(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(next() % n); }
  bool chance(int percent) { return below(100) < static_cast<std::size_t>(percent); }
  template <class C>
  const auto& pick(const C& c) {
    return c[below(c.size())];
  }
};

// The id in a record '<attempts>|<id>|<body>' (as the scripts read it).
std::string id_of(std::string_view record) {
  auto bar = record.find('|');
  if (bar == std::string_view::npos) return {};
  auto end = record.find('|', bar + 1);
  if (end == std::string_view::npos) return {};
  return std::string(record.substr(bar + 1, end - bar - 1));
}

bool all_digits(std::string_view id) {
  return !id.empty() && std::all_of(id.begin(), id.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// What a worker passes as finish_item::unique_id: the job's id when the producer gave it (not all
// digits, or flagged "u" in the body: job_codec's producer_id).
std::string producer_id(std::string_view record) {
  auto id = id_of(record);
  if (!all_digits(id)) return id;
  return record.find(R"("u":true)") != std::string_view::npos ? id : std::string();
}

std::string show_group(const std::string& g) { return g.empty() ? "-" : g; }

std::string show(const claimed_job& j) {
  std::string ahead;
  for (auto& r : j.ahead) ahead += (ahead.empty() ? "" : " ; ") + jobrt::test::text(r);
  return fmt::format("fence={} group={} record={} ahead=[{}]", j.fence, show_group(j.group), jobrt::test::text(j.job),
                     ahead);
}

std::string show(const queue_counts& c) {
  return fmt::format(
      "counts ready_lanes={} running={} delayed={} paused={} groups={} dead={} enqueued={} started={} completed={} "
      "failed={} retried={} deferred={} unhandled={} halted={} recovered={} next_enqueued_ms={}",
      c.ready_lanes, c.running, c.delayed, c.paused, c.groups, c.dead, c.enqueued, c.started, c.completed, c.failed,
      c.retried, c.deferred, c.unhandled, c.halted, c.recovered, c.next_enqueued_ms);
}

std::string show_error(const std::exception& e) {
  std::string code;
  if (auto* s = dynamic_cast<const boost::system::system_error*>(&e)) code = fmt::format(" ({})", s->code().value());
  return fmt::format("threw {}{}: {}", boost::core::demangle(typeid(e).name()), code, e.what());
}

// "threw <type> (<code>)" of an error shown by show_error: what both backends must agree on (the
// messages are each backend's own).
std::string thrown_type(const std::string& error) { return error.substr(0, error.find(':')); }

// What one backend answered: its value, or the exception it threw.
template <class T>
struct outcome {
  std::optional<T> value;
  std::string error;  // set when it threw
};

template <class T>
awaitable<outcome<T>> attempt(awaitable<T> call) {
  outcome<T> out;
  try {
    out.value = co_await std::move(call);
  } catch (const std::exception& e) {
    out.error = show_error(e);
  }
  co_return out;
}

awaitable<outcome<bool>> attempt_void(awaitable<void> call) {
  outcome<bool> out;
  try {
    co_await std::move(call);
    out.value = true;
  } catch (const std::exception& e) {
    out.error = show_error(e);
  }
  co_return out;
}

// A lease as the test's workers hold it: one handle, a token on each backend.
struct lease {
  std::string worker;
  std::array<std::string, 2> token;  // [0] memory's, [1] Redis's
  std::string group;
  std::string record;                 // the job it runs now
  std::deque<std::string> followers;  // handed over with it, not yet kept to
};

enum class op_kind {
  enqueue,
  claim,
  finish,
  extend,
  expire_own,
  reap,
  release,
  promote,
  pause,
  resume,
  requeue,
  purge,
  check,
  purge_queue,
  advertise,
  dead_letter_of,
  claim_wait,
  kept_job_of,
  cancel
};

struct weighted {
  op_kind kind;
  int weight;
};

// The priorities a job body may carry (job_spec::priority; 0 writes nothing).
const std::array<int, 4> priority_of{2, 1, -1, -2};

const std::array<weighted, 19> op_weights{{{op_kind::enqueue, 160},
                                           {op_kind::claim, 140},
                                           {op_kind::finish, 300},
                                           {op_kind::extend, 60},
                                           {op_kind::expire_own, 35},
                                           {op_kind::reap, 30},
                                           {op_kind::release, 20},
                                           {op_kind::promote, 55},
                                           {op_kind::pause, 35},
                                           {op_kind::resume, 45},
                                           {op_kind::requeue, 55},
                                           {op_kind::purge, 20},
                                           {op_kind::check, 8},
                                           {op_kind::purge_queue, 1},
                                           {op_kind::advertise, 12},
                                           {op_kind::dead_letter_of, 15},
                                           {op_kind::claim_wait, 30},
                                           {op_kind::kept_job_of, 15},
                                           {op_kind::cancel, 12}}};

class differential {
 public:
  differential(backend& memory, backend& redis, std::string queue, std::uint64_t seed, std::int64_t ops,
               std::size_t history, std::int64_t sabotage_at)
      : b_{&memory, &redis},
        queue_(std::move(queue)),
        seed_(seed),
        ops_(ops),
        history_size_(history),
        sabotage_at_(sabotage_at),
        rng_{seed} {
    for (int i = 0; i < 5; ++i) new_group();
  }

  const std::optional<std::string>& failure() const { return failure_; }
  std::int64_t done() const { return done_; }
  std::string summary() const {
    std::string s;
    for (auto& [name, n] : tally_) s += fmt::format("{}{}={}", s.empty() ? "" : " ", name, n);
    return s;
  }

  awaitable<void> run() {
    for (index_ = 0; index_ < ops_ && !failure_; ++index_) {
      try {
        if (index_ == sabotage_at_) co_await sabotage();
        co_await step();
        if (!failure_) co_await compare_state(index_ % 100 == 99);
        if (!failure_ && index_ % 250 == 249) co_await do_check();
      } catch (const std::exception& e) {
        fail(fmt::format("the test itself threw {}", show_error(e)));
      }
      ++done_;
    }
    if (!failure_) co_await compare_state(true);
    if (!failure_) co_await do_check();
  }

 private:
  // --- reporting ---

  void note(std::string text) {
    history_.push_back(fmt::format("#{} {}", index_, std::move(text)));
    if (history_.size() > history_size_) history_.pop_front();
  }

  void fail(std::string what) {
    if (failure_) return;
    std::string past;
    for (auto& h : history_) past += "  " + h + "\n";
    failure_ = fmt::format(
        "backends differ: seed {} (JOBRT_DIFF_SEED={}), operation #{} of {}\n{}\nthe last operations (each "
        "with the answer both gave):\n{}",
        seed_, seed_, index_, ops_, what, past);
  }

  // Compares what the two backends answered to one operation; true when they agree.
  bool same(const std::string& op, const std::string& memory, const std::string& redis) {
    if (memory == redis) return true;
    note(op + " -> (differs)");
    fail(fmt::format("{}\n  memory: {}\n  redis:  {}", op, memory, redis));
    return false;
  }

  template <class T, class Show>
  std::string text(const outcome<T>& o, Show show_value) {
    if (!o.error.empty()) return o.error;
    return show_value(*o.value);
  }

  // --- the state both show ---

  awaitable<std::vector<std::string>> observe(backend& b, bool all_groups, std::vector<dead_letter>* dead_out) {
    std::vector<std::string> lines;
    auto counts = co_await b.counts(queue_);
    lines.push_back(show(counts));
    // Sorted by id: dead_letters() is oldest first, and the two clocks may order letters made in
    // the same millisecond on one backend and the next on the other differently.
    auto dead = co_await b.dead_letters(queue_, 0, everything);
    std::sort(dead.begin(), dead.end(), [](const dead_letter& x, const dead_letter& y) { return x.id < y.id; });
    for (auto& d : dead)
      lines.push_back(fmt::format("dead {} group={} runs={} error={} record={}", d.id, show_group(d.group), d.runs,
                                  d.error, d.record));
    auto paused = co_await b.paused_groups(queue_);
    for (auto& p : paused) lines.push_back(fmt::format("paused {} halted={} error={}", p.group, p.halted, p.error));
    const auto& groups = all_groups ? all_groups_ : active_groups_;
    for (auto& g : groups) {
      auto n = co_await b.group_size(queue_, g);
      lines.push_back(fmt::format("group_size {} {}", g, n));
    }
    if (dead_out) *dead_out = std::move(dead);
    co_return lines;
  }

  awaitable<void> compare_state(bool all_groups) {
    std::vector<dead_letter> dead;
    auto m = co_await observe(*b_[0], all_groups, &dead);
    auto r = co_await observe(*b_[1], all_groups, nullptr);
    dead_ = std::move(dead);
    auto counts = co_await b_[0]->counts(queue_);
    ready_lanes_ = counts.ready_lanes;
    if (m == r) co_return;
    std::size_t first = 0;
    while (first < m.size() && first < r.size() && m[first] == r[first]) ++first;
    auto around = [&](const std::vector<std::string>& lines) {
      std::string out;
      for (std::size_t i = first; i < std::min(lines.size(), first + 6); ++i) out += "\n    " + lines[i];
      if (first >= lines.size()) out += "\n    (no more lines)";
      return out;
    };
    auto head = [&](const std::vector<std::string>& lines) { return first == 0 ? std::string() : lines.front(); };
    fail(
        fmt::format("the state after the last operation differs (lines {} and {} in all; the first that differs, "
                    "and after it):\n  memory: {}{}\n  redis:  {}{}",
                    m.size(), r.size(), head(m), around(m), head(r), around(r)));
  }

  // --- the model the operations need ---

  void new_group() {
    auto name = fmt::format("g{}", next_group_++);
    active_groups_.push_back(name);
    all_groups_.push_back(name);
  }

  // A group whose lane waits hours in the delayed set runs nothing more in this test: new jobs go
  // to a new group instead.
  void freeze(const std::string& group) {
    auto it = std::find(active_groups_.begin(), active_groups_.end(), group);
    if (it == active_groups_.end()) return;
    active_groups_.erase(it);
    new_group();
  }

  std::string any_group() {
    if (rng_.chance(85)) return rng_.pick(active_groups_);
    return rng_.pick(all_groups_);
  }

  // Short delayed entries, oldest first, as [earliest, latest] due time: each backend put its
  // copy somewhere in that range. A new one starts after every other one ends, so that both
  // backends order them alike; promote waits until the last one is surely due.
  struct due_range {
    std::int64_t lo, hi;
  };
  std::int64_t pending_end() const { return pending_short_.empty() ? 0 : pending_short_.back().hi; }
  void before_short() { until_past(pending_end() - short_ms); }
  void add_short(std::int64_t t0, std::int64_t t1, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) pending_short_.push_back({t0 + short_ms, t1 + short_ms});
  }

  std::vector<int> handles_of(const std::string& worker) const {
    std::vector<int> out;
    for (auto& [h, l] : leases_)
      if (l.worker == worker) out.push_back(h);
    return out;
  }

  int add_lease(const std::string& worker, const claimed_job& m, const claimed_job& r) {
    lease l;
    l.worker = worker;
    l.token = {m.token, r.token};
    l.group = m.group;
    l.record = jobrt::test::text(m.job);
    for (auto& f : m.ahead) l.followers.push_back(jobrt::test::text(f));
    int h = next_handle_++;
    leases_.emplace(h, std::move(l));
    return h;
  }

  // A body as the producer encodes it (job_codec's encode_body): "at" is made up, so that
  // next_enqueued_ms and oldest_enqueued_ms are the same on both backends. A third keep their
  // status (kept for 3 hours: none runs out during the test).
  // Now and then a group rate limit of 1 to 3 starts in 3 hours (a group that reaches it waits
  // out the test in delayed).
  std::string job_body(std::int64_t n, bool flagged) {
    const char* type = rng_.chance(80) ? "t" : "x";
    std::string head = rng_.chance(33) ? R"({"keep":10800000,)" : "{";
    if (rng_.chance(8)) head += fmt::format(R"("rate":[{},10800000],)", 1 + rng_.below(3));
    if (rng_.chance(15)) head += fmt::format(R"("conc":{},)", 2 + rng_.below(3));    // group concurrency
    if (rng_.chance(15)) head += fmt::format(R"("weight":{},)", 2 + rng_.below(3));  // group weight
    if (rng_.chance(20)) head += fmt::format(R"("prio":{},)", priority_of[rng_.below(4)]);
    return fmt::format(R"({}"type":"{}","payload":{{"n":{}}},{}"at":{}}})", head, type, n,
                       flagged ? R"("u":true,)" : "", 1'700'000'000'000LL + n);
  }

  // --- the operations ---

  awaitable<void> step() {
    op_kind kind = op_kind::reap;
    if (!reap_next_) {
      int total = 0;
      for (auto& w : op_weights) total += w.weight;
      auto roll = static_cast<int>(rng_.below(static_cast<std::size_t>(total)));
      for (auto& w : op_weights) {
        if (roll < w.weight) {
          kind = w.kind;
          break;
        }
        roll -= w.weight;
      }
    }
    reap_next_ = false;
    bool no_leases = leases_.empty();
    if (no_leases && (kind == op_kind::finish || kind == op_kind::extend || kind == op_kind::release))
      kind = op_kind::claim;
    switch (kind) {
      case op_kind::enqueue: co_await do_enqueue(); break;
      case op_kind::claim: co_await do_claim(); break;
      case op_kind::finish: co_await do_finish(); break;
      case op_kind::extend: co_await do_extend(); break;
      case op_kind::expire_own: co_await do_expire_own(); break;
      case op_kind::reap: co_await do_reap(); break;
      case op_kind::release: co_await do_release(); break;
      case op_kind::promote: co_await do_promote(); break;
      case op_kind::pause: co_await do_pause(); break;
      case op_kind::resume: co_await do_resume(); break;
      case op_kind::requeue: co_await do_requeue(); break;
      case op_kind::purge: co_await do_purge(); break;
      case op_kind::check: co_await do_check(); break;
      case op_kind::purge_queue: co_await do_purge_queue(); break;
      case op_kind::advertise: co_await do_advertise(); break;
      case op_kind::dead_letter_of: co_await do_dead_letter_of(); break;
      case op_kind::claim_wait: co_await do_claim(true); break;
      case op_kind::kept_job_of: co_await do_kept_job_of(); break;
      case op_kind::cancel: co_await do_cancel(); break;
    }
  }

  // The test's self-check (JOBRT_DIFF_SABOTAGE_AT): one job enqueued on Redis alone, which the
  // comparison after this operation must report.
  awaitable<void> sabotage() {
    encoded_job j;
    j.body = job_body(0, false);
    std::vector<encoded_job> one;
    one.push_back(std::move(j));
    co_await b_[1]->enqueue(queue_, std::move(one));
    note("(sabotage: one job enqueued on Redis alone)");
  }

  awaitable<void> do_enqueue() {
    ++tally_["enqueue"];
    std::vector<encoded_job> jobs;
    std::size_t n = rng_.chance(70) ? 1 : 2 + rng_.below(3);
    std::string what = "enqueue [";
    std::vector<bool> is_short;
    for (std::size_t i = 0; i < n; ++i) {
      encoded_job j;
      auto number = ++jobs_made_;
      j.body = job_body(number, false);
      if (rng_.chance(65)) j.group = rng_.pick(active_groups_);
      auto id_roll = rng_.below(100);
      if (id_roll < 45) {
        // assigned; now and then flagged "u" (the producer's, as records written before enqueue
        // refused all-digit ids have it)
        if (rng_.chance(5)) j.body = job_body(number, true);
      } else if (id_roll < 60 && !dead_.empty()) {
        j.id = id_of(rng_.pick(dead_).record);  // the id of a dead-lettered job
        if (all_digits(j.id)) j.id.clear();
      } else if (id_roll < 95) {
        j.id = fmt::format("p{}", rng_.below(40));
      } else if (id_roll < 98) {
        // ids that look like the keys of a second dead letter of one id ('<id>#<fence>')
        j.id = fmt::format("p{}#{}", rng_.below(4), rng_.below(40));
      } else {
        auto bad = rng_.below(3);  // refused by both
        if (bad == 0) j.id = "12";
        if (bad == 1) j.id = "a|b";
        if (bad == 2) j.body = fmt::format(R"({{"type":"t","payload":{{"n":{}}},"max":0,"at":{}}})", number, number);
      }
      auto due = rng_.below(100);
      std::string when = "now";
      bool short_one = false;
      if (due < 70) {
      } else if (due < 78) {
        j.run_at_ms = rng_.chance(50) ? 1000 + number : wall_ms() - hours_ms;
        when = "run_at in the past";
      } else if (due < 84) {
        j.delay_ms = hours_ms;
        when = "delay 3h";
      } else if (due < 88) {
        j.run_at_ms = wall_ms() + hours_ms;
        when = "run_at in 3h";
      } else if (due < 89) {
        // not a due time: below zero
        if (rng_.chance(50))
          j.delay_ms = -5;
        else
          j.run_at_ms = -5;
        when = j.delay_ms ? "delay -5ms" : "run_at -5";
      } else {
        j.delay_ms = short_ms;
        when = fmt::format("delay {}ms", short_ms);
        short_one = true;
      }
      is_short.push_back(short_one);
      // Now and then a max group size, near the sizes groups have here (refused by both, or by neither).
      if (!j.group.empty() && rng_.chance(10)) {
        j.max_group_size = static_cast<std::int64_t>(1 + rng_.below(8));
        when += fmt::format(" max {}", j.max_group_size);
      }
      what += fmt::format("{}{{id='{}' group={} n={} {}}}", i ? ", " : "", j.id, show_group(j.group), number, when);
      jobs.push_back(std::move(j));
    }
    what += "]";
    if (std::find(is_short.begin(), is_short.end(), true) != is_short.end()) before_short();
    auto t0 = wall_ms();
    auto m = co_await attempt(b_[0]->enqueue(queue_, jobs));
    auto r = co_await attempt(b_[1]->enqueue(queue_, jobs));
    auto t1 = wall_ms();
    auto show_results = [](const std::vector<enqueue_result>& v) {
      std::string s = "[";
      for (auto& e : v) s += fmt::format("{}{}{}", s.size() > 1 ? ", " : "", e.id, e.duplicate ? " (duplicate)" : "");
      return s + "]";
    };
    auto mt = text(m, show_results), rt = text(r, show_results);
    if (!m.error.empty() && !r.error.empty()) {
      // Both refused the batch (a bad id, max or due time): with the same errc.
      if (!same(what, thrown_type(mt), thrown_type(rt))) co_return;
      auto code = mt.find('(');  // the errc, as "(26)"
      ++tally_[fmt::format("enqueue refused {}", code == std::string::npos ? mt : mt.substr(code, 4))];
      note(fmt::format("{} -> both threw (memory {} / redis {})", what, mt, rt));
      co_return;
    }
    if (!same(what, mt, rt)) co_return;
    note(what + " -> " + mt);
    for (auto& e : *m.value) {
      ids_.push_back(e.id);
      if (ids_.size() > 300) ids_.pop_front();
    }
    std::size_t shorts = 0;
    for (std::size_t i = 0; i < jobs.size(); ++i)
      if (is_short[i] && !(*m.value)[i].duplicate) ++shorts;
    add_short(t0, t1, shorts);
  }

  // claim, or claim_wait for 1 ms when the last state compared had lanes ready (so that it seldom
  // waits: on Redis a worker's second claim_wait goes by BLMOVE and its claimed list).
  awaitable<void> do_claim(bool wait = false) {
    if (wait && ready_lanes_ == 0) wait = false;
    ++tally_[wait ? "claim_wait" : "claim"];
    claim_options o;
    o.worker = rng_.pick(worker_names);
    o.max = rng_.chance(3) ? 0 : 1 + rng_.below(4);
    o.ahead = rng_.chance(40) ? 0 : 1 + rng_.below(2);
    if (rng_.chance(2)) o.ahead = std::numeric_limits<std::size_t>::max();
    o.lease_ttl = lease_ttl;
    // Now and then under a queue rate limit of 3 hours (the starts it counts stay in the window).
    if (rng_.chance(4)) o.rate = rate_limit{1 + rng_.below(40), std::chrono::milliseconds(hours_ms)};
    std::string what = fmt::format("{} {} max={} ahead={}{}", wait ? "claim_wait 1ms" : "claim", o.worker, o.max,
                                   o.ahead, o.rate ? fmt::format(" rate={}", o.rate->max) : std::string());
    outcome<std::vector<claimed_job>> m, r;
    if (wait) {
      m = co_await attempt(b_[0]->claim_wait(queue_, o, 1ms));
      r = co_await attempt(b_[1]->claim_wait(queue_, o, 1ms));
    } else {
      m = co_await attempt(b_[0]->claim(queue_, o));
      r = co_await attempt(b_[1]->claim(queue_, o));
    }
    auto show_jobs = [](const std::vector<claimed_job>& v) {
      std::string s;
      for (auto& j : v) s += "\n      {" + show(j) + "}";
      return fmt::format("{} jobs{}", v.size(), s);
    };
    if (!same(what, text(m, show_jobs), text(r, show_jobs))) co_return;
    if (!m.error.empty()) {
      note(what + " -> both threw");
      co_return;
    }
    tally_["claimed jobs"] += static_cast<int>(m.value->size());
    for (auto& c : *m.value)  // (leases of groups that run several jobs at once)
      if (c.token.find("|c:") != std::string::npos) ++tally_["concurrent leases"];
    for (auto& c : *m.value)  // (leases of a weighted group: more followers than asked for)
      if (c.ahead.size() > o.ahead) ++tally_["weighted leases"];
    for (auto& c : *m.value)  // (leases of jobs with a priority: ungrouped, and groups' next jobs)
      if (c.job.body.find("\"prio\":") != std::string::npos)
        ++tally_[c.group.empty() ? "prioritised leases" : "prioritised group leases"];
    std::string got;
    for (std::size_t i = 0; i < m.value->size(); ++i) {
      int h = add_lease(o.worker, (*m.value)[i], (*r.value)[i]);
      got += fmt::format(" h{}={{{}}}", h, show((*m.value)[i]));
    }
    note(fmt::format("{} -> {} jobs{}", what, m.value->size(), got));
  }

  struct planned {
    int handle;
    finish_item item;
    bool short_delay = false;
    bool long_delay = false;
  };

  std::string describe(const planned& p) {
    const auto& it = p.item;
    std::string s = fmt::format("h{} ", p.handle);
    switch (it.kind) {
      case finish_kind::ack: {
        const char* want = it.want_next == finish_item::next_policy::yes               ? "yes"
                           : it.want_next == finish_item::next_policy::if_nobody_waits ? "if_nobody_waits"
                                                                                       : "no";
        s += fmt::format("ack next={} ahead={} result='{}'", want, it.ahead, it.result);
        break;
      }
      case finish_kind::keep: s += fmt::format("keep id={} result='{}'", it.id, it.result); break;
      case finish_kind::fail: s += fmt::format("fail '{}'", it.error); break;
      case finish_kind::give_up: s += fmt::format("give_up '{}'", it.error); break;
      case finish_kind::halt: s += fmt::format("halt '{}'", it.error); break;
      case finish_kind::retry: s += fmt::format("retry {}ms", it.delay.count()); break;
      case finish_kind::defer: s += fmt::format("defer {}ms", it.delay.count()); break;
      case finish_kind::hand_back: s += fmt::format("hand_back {}ms", it.delay.count()); break;
      case finish_kind::release: s += "release"; break;
      case finish_kind::cancel: s += "cancel"; break;
    }
    if (!it.unique_id.empty()) s += fmt::format(" unique_id={}", it.unique_id);
    if (it.throttle.count() > 0) s += fmt::format(" throttle={}ms", it.throttle.count());
    return s;
  }

  void plan_end(std::vector<planned>& plan, int h, const std::string& current) {
    planned p;
    p.handle = h;
    p.item.unique_id = producer_id(current);
    auto roll = rng_.below(100);
    auto delay = [&] {
      auto d = rng_.below(100);
      if (d < 45) return;
      if (d < 90) {
        p.item.delay = std::chrono::milliseconds(short_ms);
        p.short_delay = true;
      } else {
        p.item.delay = std::chrono::milliseconds(hours_ms);
        p.long_delay = true;
      }
    };
    if (roll < 36) {
      p.item.kind = finish_kind::ack;
      auto w = rng_.below(100);
      p.item.want_next = w < 40   ? finish_item::next_policy::no
                         : w < 75 ? finish_item::next_policy::yes
                                  : finish_item::next_policy::if_nobody_waits;
      p.item.ahead = rng_.below(3);
      if (rng_.chance(40)) p.item.result = fmt::format(R"({{"r":{}}})", index_);  // (kept with a kept job)
      if (rng_.chance(5)) p.item.throttle = std::chrono::milliseconds(hours_ms);  // throttle_group
    } else if (roll < 45) {
      p.item.kind = finish_kind::fail;
      p.item.error = fmt::format("e{}", index_);
      if (rng_.chance(5)) p.item.throttle = std::chrono::milliseconds(hours_ms);
    } else if (roll < 51) {
      p.item.kind = finish_kind::give_up;
      p.item.error = fmt::format("gave up {}", index_);
    } else if (roll < 63) {
      p.item.kind = finish_kind::retry;
      delay();
    } else if (roll < 73) {
      p.item.kind = finish_kind::defer;
      delay();
    } else if (roll < 79) {
      p.item.kind = finish_kind::halt;
      p.item.error = fmt::format("halted {}", index_);
    } else if (roll < 87) {
      p.item.kind = finish_kind::release;
    } else if (roll < 90) {
      p.item.kind = finish_kind::cancel;
    } else {
      p.item.kind = finish_kind::hand_back;
      delay();
    }
    plan.push_back(std::move(p));
  }

  awaitable<void> do_finish() {
    ++tally_["finish"];
    // One worker's call: one to three of its leases, a lease's keeps (a burst, pipelined) and
    // perhaps its end.
    std::vector<int> all;
    for (auto& [h, l] : leases_) all.push_back(h);
    const std::string worker = leases_.at(rng_.pick(all)).worker;
    auto mine = handles_of(worker);
    std::size_t want = rng_.chance(70) ? 1 : 2 + rng_.below(2);
    std::vector<int> chosen;
    while (chosen.size() < want && !mine.empty()) {
      auto at = rng_.below(mine.size());
      chosen.push_back(mine[at]);
      mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(at));
    }
    std::vector<planned> plan;
    for (int h : chosen) {
      const lease& l = leases_.at(h);
      std::string current = l.record;
      if (!l.group.empty() && !l.followers.empty() && rng_.chance(55)) {
        std::size_t keeps = 1 + rng_.below(l.followers.size());
        for (std::size_t k = 0; k < keeps; ++k) {
          planned p;
          p.handle = h;
          p.item.kind = finish_kind::keep;
          p.item.id = id_of(l.followers[k]);
          p.item.unique_id = producer_id(current);
          if (rng_.chance(40)) p.item.result = fmt::format(R"({{"r":{}}})", index_);
          current = l.followers[k];
          plan.push_back(std::move(p));
        }
        if (rng_.chance(50)) continue;  // the burst goes on; its end comes in a later call
      }
      plan_end(plan, h, current);
    }
    std::array<std::vector<finish_item>, 2> items;
    std::string what = fmt::format("finish {} [", worker);
    bool any_short = false;
    for (std::size_t i = 0; i < plan.size(); ++i) {
      for (int side = 0; side < 2; ++side) {
        finish_item it = plan[i].item;
        it.token = leases_.at(plan[i].handle).token[static_cast<std::size_t>(side)];
        items[static_cast<std::size_t>(side)].push_back(std::move(it));
      }
      any_short = any_short || plan[i].short_delay;
      what += (i ? ", " : "") + describe(plan[i]);
    }
    what += "]";
    if (any_short) before_short();
    auto t0 = wall_ms();
    auto m = co_await attempt(b_[0]->finish(queue_, worker, items[0], lease_ttl));
    auto r = co_await attempt(b_[1]->finish(queue_, worker, items[1], lease_ttl));
    auto t1 = wall_ms();
    auto show_results = [](const std::vector<finish_result>& v) {
      std::string s = "[";
      for (std::size_t i = 0; i < v.size(); ++i) {
        s += i ? ", " : "";
        s += v[i].lease_held ? "held" : "lost";
        if (v[i].next) s += " next={" + show(*v[i].next) + "}";
      }
      return s + "]";
    };
    auto mt = text(m, show_results);
    if (!same(what, mt, text(r, show_results))) co_return;
    if (!m.error.empty()) {
      note(what + " -> both threw");
      co_return;
    }
    // The workers' side: keeps move on, every other item ends its lease, next jobs are new leases.
    std::set<int> ended;
    std::string nexts;
    std::size_t shorts = 0;
    for (std::size_t i = 0; i < plan.size(); ++i) {
      const auto& p = plan[i];
      const auto& res = (*m.value)[i];
      if (ended.contains(p.handle)) continue;
      lease& l = leases_.at(p.handle);
      if (p.item.kind == finish_kind::keep) {
        if (!res.lease_held) {
          ended.insert(p.handle);
          continue;
        }
        ++tally_["held keep"];
        l.record = l.followers.front();
        l.followers.pop_front();
        continue;
      }
      ended.insert(p.handle);
      if (!res.lease_held) continue;
      ++tally_[fmt::format("held {}", describe(p).substr(describe(p).find(' ') + 1, 4))];
      if (res.next) ++tally_["next jobs"];
      if (p.short_delay) ++shorts;
      bool delays_lane = p.item.kind == finish_kind::retry || p.item.kind == finish_kind::defer ||
                         p.item.kind == finish_kind::hand_back;
      if (p.long_delay && delays_lane && !l.group.empty()) freeze(l.group);
      if (res.next) {
        int h = add_lease(worker, *res.next, *(*r.value)[i].next);
        nexts += fmt::format(" h{}", h);
      }
    }
    // A short delay of a job whose group runs several at once may throttle its group instead
    // (its lane elsewhere): a claim would race its end, so the test waits it out.
    bool throttles = false;
    for (std::size_t i = 0; i < plan.size(); ++i)
      throttles = throttles || (plan[i].short_delay && (*m.value)[i].lease_held &&
                                items[0][i].token.find("|c:") != std::string::npos);
    if (throttles) until_past(t1 + short_ms);
    for (int h : ended) leases_.erase(h);
    add_short(t0, t1, shorts);
    note(fmt::format("{} -> {}{}", what, mt, nexts.empty() ? "" : " as" + nexts));
  }

  awaitable<void> do_extend() {
    ++tally_["extend"];
    std::vector<int> all;
    for (auto& [h, l] : leases_) all.push_back(h);
    const std::string worker = leases_.at(rng_.pick(all)).worker;
    std::array<std::vector<std::string>, 2> tokens;
    std::string what = fmt::format("extend {} [", worker);
    bool only_some = rng_.chance(30);
    for (int h : handles_of(worker)) {
      if (only_some && rng_.chance(50)) continue;
      tokens[0].push_back(leases_.at(h).token[0]);
      tokens[1].push_back(leases_.at(h).token[1]);
      what += fmt::format("{}h{}", tokens[0].size() > 1 ? " " : "", h);
    }
    what += "]";
    auto m = co_await attempt(b_[0]->extend(queue_, worker, tokens[0], lease_ttl));
    auto r = co_await attempt(b_[1]->extend(queue_, worker, tokens[1], lease_ttl));
    auto show_held = [](const std::vector<bool>& v) {
      std::string s = "[";
      for (bool b : v) s += b ? '1' : '0';
      return s + "]";
    };
    auto mt = text(m, show_held);
    if (same(what, mt, text(r, show_held))) note(what + " -> " + mt);
  }

  awaitable<void> do_expire_own() {
    ++tally_["expire_own"];
    std::string worker = rng_.pick(worker_names);
    if (!leases_.empty() && rng_.chance(70)) {
      std::vector<int> all;
      for (auto& [h, l] : leases_) all.push_back(h);
      worker = leases_.at(rng_.pick(all)).worker;
    }
    std::string what = fmt::format("expire_own {}", worker);
    auto m = co_await attempt(b_[0]->expire_own(queue_, worker));
    auto r = co_await attempt(b_[1]->expire_own(queue_, worker));
    auto show_n = [](std::int64_t n) { return fmt::format("{}", n); };
    auto mt = text(m, show_n);
    if (!same(what, mt, text(r, show_n))) co_return;
    note(what + " -> " + mt);
    reap_next_ = rng_.chance(60);
  }

  awaitable<void> do_reap() {
    ++tally_["reap"];
    reap_options o;
    auto max_roll = rng_.below(10);
    o.max = max_roll < 2 ? 1 : max_roll < 4 ? 2 : 100;
    bool retention = rng_.chance(15);
    auto keep = 1 + rng_.below(4);
    o.dead_max_count = 10000;
    o.dead_max_age = rng_.chance(50) ? std::chrono::milliseconds(0) : std::chrono::hours(24 * 30);
    std::string note_retention;
    if (retention) {
      // Which letters the count limit removes: the oldest by each backend's own clock. Only when
      // both would remove the same ones (letters made in one millisecond on one backend and the
      // next on the other may be ordered differently) is the limit used.
      auto removed = [&](std::vector<dead_letter> d) {
        std::sort(d.begin(), d.end(), [](const dead_letter& a, const dead_letter& b) {
          return std::tie(a.at_ms, a.id) < std::tie(b.at_ms, b.id);
        });
        std::set<std::string> out;
        std::size_t n = d.size() > keep ? std::min(d.size() - keep, o.max) : 0;
        for (std::size_t i = 0; i < n; ++i) out.insert(d[i].id);
        return out;
      };
      auto md = co_await b_[0]->dead_letters(queue_, 0, everything);
      auto rd = co_await b_[1]->dead_letters(queue_, 0, everything);
      if (removed(md) == removed(rd))
        o.dead_max_count = keep;
      else
        note_retention = " (count limit not used: the clocks order the oldest letters differently)";
    }
    std::string what = fmt::format("reap max={} dead_max_count={} dead_max_age={}ms{}", o.max, o.dead_max_count,
                                   o.dead_max_age.count(), note_retention);
    auto m = co_await attempt(b_[0]->reap(queue_, o));
    auto r = co_await attempt(b_[1]->reap(queue_, o));
    auto show_reap = [](const reap_result& x) {
      std::string types;
      for (auto& t : x.recovered_types) types += (types.empty() ? "" : " ") + t;
      return fmt::format("leases={} workers={} lanes={} dead_removed={} types=[{}]", x.leases, x.workers, x.lanes,
                         x.dead_removed, types);
    };
    auto mt = text(m, show_reap);
    if (!same(what, mt, text(r, show_reap))) co_return;
    note(what + " -> " + mt);
    tally_["recovered leases"] += static_cast<int>(m.value->leases);
    tally_["dead removed"] += static_cast<int>(m.value->dead_removed);
  }

  awaitable<void> do_release() {
    ++tally_["release"];
    std::vector<int> all;
    for (auto& [h, l] : leases_) all.push_back(h);
    const std::string worker = leases_.at(rng_.pick(all)).worker;
    std::array<std::vector<std::string>, 2> tokens;
    std::vector<int> gone;
    std::string what = fmt::format("release {} [", worker);
    for (int h : handles_of(worker)) {
      if (rng_.chance(40)) continue;
      tokens[0].push_back(leases_.at(h).token[0]);
      tokens[1].push_back(leases_.at(h).token[1]);
      gone.push_back(h);
      what += fmt::format("{}h{}", gone.size() > 1 ? " " : "", h);
    }
    what += "]";
    auto m = co_await attempt_void(b_[0]->release(queue_, worker, tokens[0]));
    auto r = co_await attempt_void(b_[1]->release(queue_, worker, tokens[1]));
    auto show_done = [](bool) { return std::string("done"); };
    auto mt = text(m, show_done);
    if (!same(what, mt, text(r, show_done))) co_return;
    for (int h : gone) leases_.erase(h);
    note(what + " -> " + mt);
  }

  awaitable<void> do_promote() {
    ++tally_["promote"];
    auto roll = rng_.below(10);
    std::size_t max = roll == 0 ? 0 : roll < 3 ? 1 : roll < 5 ? 2 : 100;
    // Every short entry surely due on both backends (those due in hours are not).
    if (!pending_short_.empty()) until_past(pending_end());
    std::string what = fmt::format("promote max={} (short entries due: {})", max, pending_short_.size());
    auto m = co_await attempt(b_[0]->promote(queue_, max));
    auto r = co_await attempt(b_[1]->promote(queue_, max));
    // next_due is a time: compared as there or not.
    auto show_promote = [](const promote_result& x) {
      return fmt::format("moved={} next_due={}", x.moved, x.next_due ? "some" : "none");
    };
    auto mt = text(m, show_promote);
    if (!same(what, mt, text(r, show_promote))) co_return;
    note(what + " -> " + mt);
    tally_["promoted"] += static_cast<int>(m.value->moved);
    if (m.value) {
      auto moved = std::min<std::size_t>(static_cast<std::size_t>(m.value->moved), pending_short_.size());
      pending_short_.erase(pending_short_.begin(), pending_short_.begin() + static_cast<std::ptrdiff_t>(moved));
    }
  }

  awaitable<void> do_pause() {
    ++tally_["pause"];
    auto group = any_group();
    std::string what = fmt::format("pause {}", group);
    auto m = co_await attempt(b_[0]->pause(queue_, group));
    auto r = co_await attempt(b_[1]->pause(queue_, group));
    auto show_bool = [](bool b) { return std::string(b ? "true" : "false"); };
    auto mt = text(m, show_bool);
    if (same(what, mt, text(r, show_bool))) note(what + " -> " + mt);
  }

  awaitable<void> do_resume() {
    ++tally_["resume"];
    // Mostly a group that is paused (or halted): the last state compared lists them.
    std::string group;
    std::vector<std::string> paused;
    auto listed = co_await b_[0]->paused_groups(queue_);
    for (auto& p : listed) paused.push_back(p.group);
    if (!paused.empty() && rng_.chance(80))
      group = rng_.pick(paused);
    else
      group = any_group();
    auto mode = rng_.chance(50) ? resume_mode::retry : resume_mode::skip;
    std::string what = fmt::format("resume {} {}", group, mode == resume_mode::skip ? "skip" : "retry");
    auto m = co_await attempt(b_[0]->resume(queue_, group, mode));
    auto r = co_await attempt(b_[1]->resume(queue_, group, mode));
    auto show_bool = [](bool b) { return std::string(b ? "true" : "false"); };
    auto mt = text(m, show_bool), rt = text(r, show_bool);
    if (!m.error.empty() && !r.error.empty()) {
      ++tally_["resume refused"];
      // A refused skip: both must throw errc::group_busy.
      if (!same(what, thrown_type(mt), thrown_type(rt))) co_return;
      note(fmt::format("{} -> both threw (memory {} / redis {})", what, mt, rt));
      co_return;
    }
    if (same(what, mt, rt)) note(what + " -> " + mt);
  }

  awaitable<void> do_requeue() {
    ++tally_["requeue"];
    std::vector<std::string> ids;
    std::size_t n = 1 + rng_.below(3);
    // Often letters of groups that run a burst now (followers handed over): a job requeued to the
    // head goes in front of those followers, and the burst's keeps must put them back in front.
    std::vector<const dead_letter*> of_bursts;
    for (auto& d : dead_)
      for (auto& [h, l] : leases_)
        if (!l.group.empty() && l.group == d.group && !l.followers.empty()) {
          of_bursts.push_back(&d);
          break;
        }
    bool burst_bias = !of_bursts.empty() && rng_.chance(60);
    if (burst_bias) ++tally_["requeue into a burst"];
    for (std::size_t i = 0; i < n && !dead_.empty(); ++i)
      ids.push_back(burst_bias ? rng_.pick(of_bursts)->id : rng_.pick(dead_).id);
    if (ids.empty() || rng_.chance(10)) ids.push_back("no-such-letter");
    bool at_head = rng_.chance(50);
    std::string what = fmt::format("requeue at_head={} [", at_head);
    for (std::size_t i = 0; i < ids.size(); ++i) what += (i ? " " : "") + ids[i];
    what += "]";
    auto m = co_await attempt(b_[0]->requeue(queue_, ids, at_head));
    auto r = co_await attempt(b_[1]->requeue(queue_, ids, at_head));
    auto show_ids = [](const std::vector<std::string>& v) {
      std::string s = "[";
      for (std::size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + v[i];
      return s + "]";
    };
    auto mt = text(m, show_ids);
    if (same(what, mt, text(r, show_ids))) note(what + " -> " + mt);
  }

  awaitable<void> do_purge() {
    ++tally_["purge"];
    std::vector<std::string> ids;
    if (rng_.chance(75)) {
      std::size_t n = 1 + rng_.below(2);
      for (std::size_t i = 0; i < n && !dead_.empty(); ++i) ids.push_back(rng_.pick(dead_).id);
      if (ids.empty() || rng_.chance(15)) ids.push_back("no-such-letter");
    }
    std::string what = "purge [";
    for (std::size_t i = 0; i < ids.size(); ++i) what += (i ? " " : "") + ids[i];
    what += ids.empty() ? "(all)]" : "]";
    auto m = co_await attempt(b_[0]->purge(queue_, ids));
    auto r = co_await attempt(b_[1]->purge(queue_, ids));
    auto show_n = [](std::int64_t n) { return fmt::format("{}", n); };
    auto mt = text(m, show_n);
    if (same(what, mt, text(r, show_n))) note(what + " -> " + mt);
  }

  awaitable<void> do_check() {
    ++tally_["check"];
    std::string what = "check (no repair)";
    auto m = co_await attempt(b_[0]->check(queue_, false));
    auto r = co_await attempt(b_[1]->check(queue_, false));
    // calls differs by design (one walk at one instant in memory, pages on Redis).
    auto show_report = [](const check_report& c) {
      std::string problems;
      for (auto& p : c.problems) problems += "\n      " + p;
      return fmt::format("groups={} jobs={} oldest_enqueued_ms={} stuck_groups={} repaired={} problems={}{}", c.groups,
                         c.jobs, c.oldest_enqueued_ms, c.stuck_groups, c.repaired, c.problems.size(), problems);
    };
    auto mt = text(m, show_report);
    if (!same(what, mt, text(r, show_report))) co_return;
    if (m.value && !m.value->problems.empty()) {
      note(what + " -> (problems)");
      fail(fmt::format("check found problems on both backends: {}", mt));
      co_return;
    }
    note(what + " -> " + mt);
  }

  awaitable<void> do_purge_queue() {
    ++tally_["purge_queue"];
    std::string what = "purge_queue";
    auto m = co_await attempt(b_[0]->purge_queue(queue_));
    auto r = co_await attempt(b_[1]->purge_queue(queue_));
    // Allowed to differ (backend.hpp): Redis counts the keys it removed, memory answers 1 when the
    // queue had state. Compared: whether each threw, and that memory's queue had state.
    auto show_done = [](std::int64_t) { return std::string("done"); };
    auto mt = text(m, show_done);
    if (!same(what, mt, text(r, show_done))) co_return;
    note(fmt::format("{} -> memory {} / redis {}", what, m.value.value_or(-1), r.value.value_or(-1)));
    leases_.clear();  // every lease is lost (their tokens find nothing)
    pending_short_.clear();
  }

  awaitable<void> do_advertise() {
    ++tally_["advertise"];
    // Types with and without a worker that says it runs them (for hours: no clock in the answer).
    std::vector<std::string> types;
    if (rng_.chance(50)) types.push_back(rng_.chance(50) ? "t" : "x");
    const char* asked = rng_.chance(50) ? "t" : rng_.chance(50) ? "x" : "never";
    std::string what =
        fmt::format("advertise [{}] for 3h, then unrunnable_for {}", types.empty() ? "" : types[0], asked);
    auto ma = co_await attempt_void(b_[0]->advertise(queue_, types, std::chrono::milliseconds(hours_ms)));
    auto ra = co_await attempt_void(b_[1]->advertise(queue_, types, std::chrono::milliseconds(hours_ms)));
    auto mu = co_await attempt(b_[0]->unrunnable_for(queue_, asked));
    auto ru = co_await attempt(b_[1]->unrunnable_for(queue_, asked));
    auto show_for = [](std::chrono::milliseconds d) {
      return d == std::chrono::milliseconds::max() ? std::string("never advertised") : fmt::format("{}ms", d.count());
    };
    auto show_done = [](bool) { return std::string("done"); };
    auto mt = text(ma, show_done) + "; " + text(mu, show_for);
    if (same(what, mt, text(ra, show_done) + "; " + text(ru, show_for))) note(what + " -> " + mt);
  }

  awaitable<void> do_dead_letter_of() {
    ++tally_["dead_letter_of"];
    std::string id = dead_.empty() || rng_.chance(20) ? "no-such-letter" : rng_.pick(dead_).id;
    std::string what = fmt::format("dead_letter_of {}", id);
    auto m = co_await attempt(b_[0]->dead_letter_of(queue_, id));
    auto r = co_await attempt(b_[1]->dead_letter_of(queue_, id));
    auto show_letter = [](const std::optional<dead_letter>& d) {  // (not at_ms: each backend's clock)
      if (!d) return std::string("none");
      return fmt::format("{} group={} runs={} error={} record={}", d->id, show_group(d->group), d->runs, d->error,
                         d->record);
    };
    auto mt = text(m, show_letter);
    if (!same(what, mt, text(r, show_letter))) co_return;
    note(what + " -> " + mt);
    // A page of dead_letters(): how many (their order is by each backend's clock).
    auto offset = rng_.below(dead_.size() + 2), limit = rng_.below(4);
    std::string paged = fmt::format("dead_letters offset={} limit={}", offset, limit);
    auto mp = co_await attempt(b_[0]->dead_letters(queue_, offset, limit));
    auto rp = co_await attempt(b_[1]->dead_letters(queue_, offset, limit));
    auto show_size = [](const std::vector<dead_letter>& v) { return fmt::format("{} letters", v.size()); };
    auto pt = text(mp, show_size);
    if (same(paged, pt, text(rp, show_size))) note(paged + " -> " + pt);
  }

  // A job by id in the index of kept jobs: its state (pending and delayed as one: a short delay
  // comes due by each backend's clock), group and record.
  awaitable<void> do_kept_job_of() {
    ++tally_["kept_job_of"];
    std::string id = ids_.empty() || rng_.chance(10) ? "no-such-job" : ids_[rng_.below(ids_.size())];
    std::string what = fmt::format("kept_job_of {}", id);
    auto m = co_await attempt(b_[0]->kept_job_of(queue_, id));
    auto r = co_await attempt(b_[1]->kept_job_of(queue_, id));
    auto show_kept = [](const std::optional<kept_job>& k) {
      if (!k) return std::string("none");
      return fmt::format("{} {} group={} record={}|{}|{} result='{}'", k->id,
                         k->status == kept_job::state::pending || k->status == kept_job::state::delayed
                             ? "waiting"
                             : to_string(k->status),
                         show_group(k->group), k->record.attempts, k->record.id, k->record.body, k->result);
    };
    auto mt = text(m, show_kept);
    if (same(what, mt, text(r, show_kept))) note(what + " -> " + mt);
  }

  // A cancel by id (kept jobs), and then what a worker asks after them: both answers compared.
  awaitable<void> do_cancel() {
    ++tally_["cancel"];
    std::string id = ids_.empty() || rng_.chance(10) ? "no-such-job" : ids_[rng_.below(ids_.size())];
    std::string what = fmt::format("cancel {}", id);
    auto m = co_await attempt(b_[0]->cancel(queue_, id));
    auto r = co_await attempt(b_[1]->cancel(queue_, id));
    auto show = [](cancel_outcome o) { return std::string(to_string(o)); };
    auto mt = text(m, show);
    if (!same(what, mt, text(r, show))) co_return;
    ++tally_[fmt::format("cancel {}", mt)];
    std::vector<held_job> asked(2);
    asked[0].id = id;
    asked[1].id = ids_.empty() ? std::string("no-such-job") : ids_[rng_.below(ids_.size())];
    std::string which = fmt::format("cancelled [{} {}]", asked[0].id, asked[1].id);
    auto mc = co_await attempt(b_[0]->cancelled(queue_, asked));
    auto rc = co_await attempt(b_[1]->cancelled(queue_, asked));
    auto show_all = [](const std::vector<bool>& v) {
      std::string out;
      for (bool b : v) out += b ? "1" : "0";
      return out;
    };
    auto ct = text(mc, show_all);
    if (same(which, ct, text(rc, show_all))) note(what + " -> " + mt + "; " + which + " -> " + ct);
  }

  std::array<backend*, 2> b_;
  std::string queue_;
  std::uint64_t seed_;
  std::int64_t ops_;
  std::size_t history_size_;
  std::int64_t sabotage_at_;
  random_source rng_;
  std::int64_t index_ = 0;
  std::int64_t done_ = 0;
  std::optional<std::string> failure_;
  std::deque<std::string> history_;
  std::map<std::string, int> tally_;

  std::map<int, lease> leases_;
  int next_handle_ = 1;
  std::vector<std::string> active_groups_, all_groups_;
  int next_group_ = 0;
  std::int64_t jobs_made_ = 0;
  std::deque<std::string> ids_;    // the last 300 ids enqueue gave
  std::vector<dead_letter> dead_;  // as the last comparison saw them
  std::vector<due_range> pending_short_;
  bool reap_next_ = false;
  std::int64_t ready_lanes_ = 0;  // as the last comparison saw them
};

}  // namespace

TEST_CASE("differential: memory and redis backends agree on a random sequence of operations") {
  auto ops = env_number("JOBRT_DIFF_OPS", 10000);
  auto seed = static_cast<std::uint64_t>(
      env_number("JOBRT_DIFF_SEED", std::chrono::system_clock::now().time_since_epoch().count() & 0x7fffffffffff));
  auto history = static_cast<std::size_t>(env_number("JOBRT_DIFF_HISTORY", 16));
  auto sabotage_at = env_number("JOBRT_DIFF_SABOTAGE_AT", -1);
  bool keep = env_number("JOBRT_DIFF_KEEP", 0) != 0;  // leave the Redis queue behind (to look at it)
  fmt::print(stderr, "differential: seed {} (JOBRT_DIFF_SEED), {} operations (JOBRT_DIFF_OPS)\n", seed, ops);
  INFO("seed " << seed << ", " << ops << " operations");
  std::optional<std::string> failure;
  std::int64_t done = 0;
  std::string summary;
  auto started = std::chrono::steady_clock::now();
  jobrt::test::run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        memory_backend memory(ctx.get_executor());
        redis_backend redis(ctx.get_executor(), jobrt::test::shared_redis());
        auto queue = jobrt::test::key_prefix() + "diff";
        differential d(memory, redis, queue, seed, ops, history, sabotage_at);
        co_await d.run();
        failure = d.failure();
        done = d.done();
        summary = d.summary();
        if (keep)
          fmt::print(stderr, "differential: the Redis queue stays for a look: keys jobrt:{{{}}}:*\n", queue);
        else
          co_await redis.purge_queue(queue);
      },
      std::chrono::milliseconds(30000 + ops * 15));
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
  fmt::print(stderr, "differential: seed {}: {} operations in {} ms ({})\n", seed, done, took.count(), summary);
  if (failure) FAIL(*failure);
}
