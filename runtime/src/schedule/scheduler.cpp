#include "clock.hpp"
#include "schedule/due_firings.hpp"

#include <jobrt/log.hpp>
#include <jobrt/scheduler.hpp>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <stdexcept>

namespace jobrt {
namespace {

namespace json = boost::json;
using std::chrono::milliseconds;

void check_name(std::string_view name) {
  if (name.empty() || name.size() > 200)
    throw std::invalid_argument(fmt::format("schedule name '{}' must be 1 to 200 bytes", name));
  if (name.find('|') != std::string_view::npos)
    throw std::invalid_argument(fmt::format("schedule name '{}' holds a '|'", name));
  if (std::isspace(static_cast<unsigned char>(name.front())) || std::isspace(static_cast<unsigned char>(name.back())))
    throw std::invalid_argument(fmt::format("schedule name '{}' starts or ends with white space", name));
}

// A firing's job: the schedule's, due at once, under the firing's id (given by the backend).
job_spec firing_job(job_spec job) {
  job.id.clear();
  job.delay = milliseconds(0);
  job.run_at.reset();
  return job;
}

// A walk over a cron schedule's missed firings that takes this many steps starts again from a
// day before now: firings before that are past any catch-up (a day holds at most 90,000 of
// them, an hour repeated at a fall-back included), so the walk is bounded.
constexpr std::size_t long_walk = 100'000;
constexpr std::int64_t day_ms = 86'400'000;

}  // namespace

namespace detail {

due due_firings(const schedule_spec& s, std::int64_t first, std::int64_t now) {
  due out;
  const auto& t = s.timing;
  if (!t.is_cron()) {  // every interval: counted, not walked
    auto step = t.interval().count();
    auto latest = first + (now - first) / step * step;
    for (auto at = latest; at >= first && out.firings.size() <= s.catch_up; at -= step) out.firings.push_back(at);
    std::reverse(out.firings.begin(), out.firings.end());
    out.next = latest + step;
    return out;
  }
  std::deque<std::int64_t> kept{first};
  sys_ms at{milliseconds(first)};
  bool restarted = false;
  for (std::size_t walked = 0;; ++walked) {
    auto next = t.next_after(at);
    if (next.time_since_epoch().count() > now) {
      // (From the last due firing, not from now: a time a fall-back repeats fires once.)
      out.next = next.time_since_epoch().count();
      break;
    }
    if (walked == long_walk && !restarted) {
      restarted = true;
      kept.clear();
      at = std::max(at, sys_ms(milliseconds(now - day_ms)));
      continue;
    }
    kept.push_back(next.time_since_epoch().count());
    if (kept.size() > s.catch_up + 1) kept.pop_front();
    at = next;
  }
  out.firings.assign(kept.begin(), kept.end());
  return out;
}

}  // namespace detail

std::string to_stored(const schedule_spec& s) {
  json::object o;
  if (s.timing.is_cron()) {
    o["cron"] = s.timing.expression();
    o["tz"] = s.timing.time_zone();
  } else {
    o["every_ms"] = s.timing.interval().count();
    o["anchor_ms"] = s.timing.anchor().time_since_epoch().count();
  }
  o["catch_up"] = s.catch_up;
  o["job"] = to_json(s.job);
  return json::serialize(o);
}

namespace {

// The start of a stored form as one line of at most 80 bytes (cut between characters of UTF-8),
// for an error that quotes it.
std::string excerpt(std::string_view stored) {
  std::size_t end = std::min<std::size_t>(stored.size(), 80);
  while (end < stored.size() && end > 0 && (static_cast<unsigned char>(stored[end]) & 0xC0) == 0x80) --end;
  std::string out;
  for (char c : stored.substr(0, end)) {
    auto byte = static_cast<unsigned char>(c);
    out += byte < 0x20 || byte == 0x7F ? ' ' : c;
  }
  if (end < stored.size()) out += "...";
  return out;
}

}  // namespace

schedule_spec schedule_from_stored(std::string name, std::string_view stored) {
  boost::system::error_code ec;
  auto v = json::parse(stored, ec);
  auto bad = [&](std::string_view what) {
    return std::invalid_argument(fmt::format("schedule '{}': {}: {}", name, what, excerpt(stored)));
  };
  if (ec || !v.is_object()) throw bad("its stored form is not a JSON object");
  const auto& o = v.as_object();
  schedule_spec s;
  auto number = [&](std::string_view field) {
    auto* f = o.if_contains(field);
    if (!f || !f->is_int64()) throw bad(fmt::format("its stored form has no whole number \"{}\"", field));
    return f->as_int64();
  };
  if (auto* cron = o.if_contains("cron"); cron && cron->is_string()) {
    auto* tz = o.if_contains("tz");
    s.timing =
        schedule_timing::cron(cron->as_string(), tz && tz->is_string() ? std::string_view(tz->as_string()) : "UTC");
  } else {
    s.timing = schedule_timing::every(milliseconds(number("every_ms")), sys_ms(milliseconds(number("anchor_ms"))));
  }
  s.catch_up = static_cast<std::size_t>(std::clamp<std::int64_t>(number("catch_up"), 0, max_catch_up));
  auto* job = o.if_contains("job");
  if (!job) throw bad("its stored form has no \"job\"");
  try {
    s.job = job_spec_from_json(*job);
  } catch (const std::invalid_argument& e) {
    throw bad(fmt::format("its job: {}", e.what()));
  }
  s.name = std::move(name);
  return s;
}

schedule_book::schedule_book(backend& b, std::string queue, producer_options opts)
    : backend_(b), queue_(std::move(queue)), opts_(std::move(opts)) {}

boost::asio::awaitable<schedule_info> schedule_book::add(schedule_spec s) {
  check_name(s.name);
  if (s.job.retry_backoff)
    throw std::invalid_argument(
        fmt::format("schedule '{}': its job's retry_backoff is not kept with it (the worker's applies)", s.name));
  if (s.catch_up > max_catch_up)
    throw std::invalid_argument(
        fmt::format("schedule '{}': catch_up {} is over the most, {}", s.name, s.catch_up, max_catch_up));
  // What the producer's rules and defaults decide for the job is decided now and kept with it,
  // so that every worker's scheduler fires the same job (in the same group, and shard).
  auto& job = s.job;
  if (!job.group) {
    if (auto choice = opts_.rules.choose(job.type, job.payload)) {
      job.group = std::move(choice->group);
      if (!job.on_failure) job.on_failure = choice->on_failure;
      if (!job.max_group_size) job.max_group_size = choice->max_group_size;
      if (!job.group_rate) job.group_rate = choice->rate;
      if (!job.group_concurrency) job.group_concurrency = choice->concurrency;
      if (!job.group_weight) job.group_weight = choice->weight;
    }
  }
  if (!job.keep && opts_.keep.count() > 0) job.keep = opts_.keep;
  if (job.group && !job.max_group_size && opts_.max_group_size > 0) job.max_group_size = opts_.max_group_size;
  if (job.group && !job.group_rate && opts_.group_rate) job.group_rate = opts_.group_rate;
  if (job.group && !job.group_concurrency && opts_.group_concurrency > 1)
    job.group_concurrency = opts_.group_concurrency;
  if (job.group && !job.group_weight && opts_.group_weight > 1) job.group_weight = opts_.group_weight;
  auto now = detail::unix_ms();
  auto encoded = producer::encode(firing_job(job), now, opts_);  // (throws what is wrong with the job)
  auto next = s.timing.next_after(sys_ms(milliseconds(now)));
  stored_schedule stored;  // (g++ 12: no braced temporaries in a coroutine's co_await)
  stored.name = s.name;
  stored.spec = to_stored(s);
  stored.group = std::move(encoded.group);
  stored.next_ms = next.time_since_epoch().count();
  co_await backend_.put_schedule(queue_, std::move(stored));
  schedule_info out;
  out.spec = std::move(s);
  out.next = next;
  co_return out;
}

boost::asio::awaitable<bool> schedule_book::remove(std::string name) {
  co_return co_await backend_.remove_schedule(queue_, std::move(name));
}

boost::asio::awaitable<page<schedule_info>> schedule_book::list(std::string cursor, std::size_t limit) {
  auto stored = co_await backend_.schedules(queue_, std::move(cursor), limit);
  page<schedule_info> out;
  out.cursor = std::move(stored.cursor);
  for (auto& s : stored.items) {
    schedule_info info;
    try {
      info.spec = schedule_from_stored(s.name, s.spec);
    } catch (const std::invalid_argument& e) {
      info.spec.name = s.name;
      info.error = e.what();
    }
    info.next = sys_ms(milliseconds(s.next_ms));
    out.items.push_back(std::move(info));
  }
  co_return out;
}

scheduler::scheduler(backend& b, std::string queue) : backend_(b), queue_(std::move(queue)) {
  opts_.max_body_bytes = std::numeric_limits<std::size_t>::max();  // (add checked it, with its producer's limit)
}

boost::asio::awaitable<std::optional<sys_ms>> scheduler::fire_due(std::size_t max) {
  std::optional<std::pair<std::string, std::int64_t>> stale;  // the last step found not taken
  for (std::size_t i = 0; i < max; ++i) {
    auto s = co_await backend_.next_schedule(queue_);
    if (!s) co_return std::nullopt;
    auto now = detail::unix_ms();
    if (s->next_ms > now) co_return sys_ms(milliseconds(s->next_ms));
    schedule_step step;
    std::string name = s->name;
    try {
      auto spec = schedule_from_stored(s->name, s->spec);
      auto firings = detail::due_firings(spec, s->next_ms, now);
      step.firings = std::move(firings.firings);
      step.next_ms = firings.next;
      step.job = producer::encode(firing_job(spec.job), now, opts_);
    } catch (const std::exception& e) {
      // (Written by something else, or by a version that read it otherwise: it is looked at
      // again in an hour, and fires nothing until it is put right.)
      log(log_level::error, "scheduler", "queue '{}': schedule '{}' cannot fire: {}; looking again in an hour", queue_,
          name, e.what());
      step.firings.clear();
      step.next_ms = now + 3'600'000;
    }
    auto was_next = s->next_ms;
    step.was = std::move(*s);
    auto fired = co_await backend_.fire_schedule(queue_, std::move(step));
    if (!fired.taken) {
      // Another worker took it, or it changed: read again. The same step refused twice cannot be
      // taken (a value written by something else): looked at again in a second.
      if (stale && stale->first == name && stale->second == was_next) co_return sys_ms(milliseconds(now + 1000));
      stale.emplace(name, was_next);
    }
    if (!fired.refused.empty())
      log(log_level::warn, "scheduler", "queue '{}': schedule '{}' moved on without its firing: {}", queue_, name,
          fired.refused);
  }
  co_return sys_ms(milliseconds(detail::unix_ms()));
}

}  // namespace jobrt
