#include <jobrt/job_status.hpp>

#include "backend/views.hpp"

#include <boost/json/parse.hpp>

#include <utility>

namespace jobrt {

std::string_view to_string(job_status::state s) noexcept {
  switch (s) {
    case job_status::state::pending: return "pending";
    case job_status::state::delayed: return "delayed";
    case job_status::state::paused: return "paused";
    case job_status::state::halted: return "halted";
    case job_status::state::running: return "running";
    case job_status::state::done: return "done";
    case job_status::state::dead: return "dead";
    case job_status::state::cancelled: return "cancelled";
  }
  return "pending";
}

boost::asio::awaitable<std::optional<job_status>> find_job(backend& store, std::string queue, std::string id,
                                                           std::string group) {
  job_status out;
  out.id = id;
  auto dead = co_await store.dead_letter_of(queue, id);
  auto kept = co_await store.kept_job_of(queue, id);
  // Dead-lettering a kept job removes its entry: an entry that waits is newer than a dead letter
  // of the id (enqueued again since), a completed one when it completed after it.
  auto ended = [](const std::optional<kept_job>& k) {
    return k && (k->status == kept_job::state::done || k->status == kept_job::state::cancelled);
  };
  if (dead && (!kept || (ended(kept) && kept->at_ms < dead->at_ms))) {
    out.status = job_status::state::dead;
    out.group = dead->group;
    out.dead = std::move(dead);
    co_return out;
  }
  bool done = ended(kept);
  // Cancelled while it ran, and its run not seen to end: it may still be running.
  bool cancel_waits = kept && kept->status == kept_job::state::cancelled && !kept->ended;
  if (kept) {
    out.group = kept->group;
    out.record = kept->record;
    out.at_ms = kept->at_ms;
    out.result = kept->result;
    switch (kept->status) {
      case kept_job::state::pending: out.status = job_status::state::pending; break;
      case kept_job::state::delayed: out.status = job_status::state::delayed; break;
      case kept_job::state::done: out.status = job_status::state::done; break;
      case kept_job::state::cancelled: out.status = job_status::state::cancelled; break;
    }
  } else {
    out.group = std::move(group);
  }
  // Running, as a worker last reported (a report may still list a run that completed or was
  // cancelled since: one that started before then is that run; the id enqueued again runs anew).
  std::string cursor;
  for (int pages = 0; pages < 10 && !out.running; ++pages) {
    auto page = co_await store.workers(queue, cursor, 100);
    for (auto& r : page.items)
      for (auto& j : r.jobs)
        if (j.id == id && !out.running && !(done && !cancel_waits && j.since_ms <= kept->at_ms)) {
          out.running = j;
          out.running_on = r;
        }
    cursor = std::move(page.cursor);
    if (cursor.empty()) break;
  }
  if (out.running) {
    done = false;
    out.cancelling = cancel_waits;
    out.status = job_status::state::running;
    out.at_ms = 0;
    if (out.group.empty() || kept) out.group = out.running->group;
  }
  if (!out.group.empty() && !done) {
    out.group_state = co_await store.group_of(queue, out.group);
    const auto& s = *out.group_state;
    if (s.head && s.head->id == id) {
      out.record = s.head;  // (its attempts as they are now)
      if (!out.running) {
        if (s.waiting_until_ms > 0) {
          out.status = job_status::state::delayed;
          out.at_ms = s.waiting_until_ms;
        } else if (s.paused) {
          out.status = s.paused->halted ? job_status::state::halted : job_status::state::paused;
        } else {
          out.status = job_status::state::pending;
        }
      }
    } else if (!kept && !out.running) {
      co_return std::nullopt;  // the group's next is another job
    }
  } else if (!kept && !out.running) {
    co_return std::nullopt;
  }
  co_return out;
}

boost::asio::awaitable<std::optional<job_status>> wait_job(backend& store, std::string queue, std::string id,
                                                           std::chrono::milliseconds timeout,
                                                           std::optional<std::uint64_t> since) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::optional<kept_job> told;  // the job as the news of its end said (wait_ended): no look needed
  std::string looked;            // the body of the job the last look found
  const bool fresh = since.has_value();
  for (bool first = true;; first = false) {
    // (Read before the look: an end after it moves the version.)
    auto seen = first && fresh ? *since : store.ended_version(queue);
    auto kept = std::exchange(told, std::nullopt);
    // (News of another job with this id, one that ended before a new one was enqueued with it
    // and came late, is not this one's: then a look. A fresh id has no other job.)
    if (kept && !fresh && kept->record.body != looked) kept.reset();
    bool skip_look = first && fresh;
    if (!kept && !skip_look) {
      kept = co_await store.kept_job_of(queue, id);
      if (kept) looked = kept->record.body;
    }
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (kept && kept->status == kept_job::state::cancelled && !kept->ended) {
      // Cancelled: ended, unless it runs (then its run's end, or the handler's, publishes).
      auto now = co_await find_job(store, queue, id);
      if (!now || now->status != job_status::state::running || left.count() <= 0) co_return now;
    } else if (kept && (kept->status == kept_job::state::done || kept->status == kept_job::state::cancelled)) {
      job_status out;  // (what find_job would say, without its reads)
      out.id = std::move(id);
      out.status = kept->status == kept_job::state::done ? job_status::state::done : job_status::state::cancelled;
      out.at_ms = kept->at_ms;
      out.group = std::move(kept->group);
      out.record = std::move(kept->record);
      out.result = std::move(kept->result);
      co_return out;
    } else if ((!kept && !skip_look) || left.count() <= 0) {
      co_return co_await find_job(store, queue, id);
    }
    // (At least once a minute it looks anyway: a message may not come, from a worker of a release
    // before this one, or to a user the server does not let subscribe.)
    told =
        co_await store.wait_ended(queue, id, seen, std::min<std::chrono::milliseconds>(left, std::chrono::minutes(1)));
  }
}

boost::json::object to_json(const job_status& s) {
  boost::json::object o;
  o["id"] = s.id;
  o["state"] = to_string(s.status);
  if (s.at_ms > 0) o["at"] = s.at_ms;
  if (s.record) o["job"] = detail::record_object(*s.record, s.group);
  if (s.running) o["running"] = detail::running_object(*s.running_on, *s.running);
  if (s.cancelling) o["cancelling"] = true;
  if (s.dead) o["dead"] = detail::dead_object(*s.dead);
  if (!s.result.empty()) {
    boost::system::error_code ec;
    auto value = boost::json::parse(s.result, ec);
    o["result"] = ec ? boost::json::value(s.result) : std::move(value);  // (another program's, not JSON: as text)
  }
  if (s.group_state) o["group"] = detail::group_object(*s.group_state);
  return o;
}

}  // namespace jobrt
