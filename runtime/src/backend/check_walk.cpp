#include "backend/check_walk.hpp"

#include "backend/job_codec.hpp"
#include "backend/views.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <map>
#include <string_view>
#include <unordered_map>

namespace jobrt::detail {

std::string job_place::describe() const {
  switch (where) {
    case kind::ready: return key.empty() ? "ready" : "ready:" + key;
    case kind::claimed: return "claimed:" + key;
    case kind::delayed: return "delayed";
    case kind::lease: return "a lease";
    case kind::group: return "group " + key;
  }
  return {};
}

const char* job_place::name() const noexcept {
  switch (where) {
    case kind::ready: return "ready";
    case kind::claimed: return "claimed";
    case kind::delayed: return "delayed";
    case kind::lease: return "lease";
    case kind::group: return "group";
  }
  return "";
}

namespace {

// A record's id: '<digits>|<id>|...'; nullopt when it is not shaped so.
std::optional<std::string_view> id_of(std::string_view record) {
  std::size_t digits = 0;
  while (digits < record.size() && record[digits] >= '0' && record[digits] <= '9') ++digits;
  if (digits == 0 || digits >= record.size() || record[digits] != '|') return std::nullopt;
  auto end = record.find('|', digits + 1);
  if (end == std::string_view::npos) return std::nullopt;
  return record.substr(digits + 1, end - digits - 1);
}

// The record inside a delayed member 'd:<order>:<n>:<group><record>'.
std::string_view delayed_record(std::string_view member) {
  auto start = member.find(':', 2);
  auto colon = start == std::string_view::npos ? start : member.find(':', start + 1);
  if (colon == std::string_view::npos) return {};
  std::size_t n = 0;
  std::from_chars(member.data() + start + 1, member.data() + colon, n);
  return colon + 1 + n <= member.size() ? member.substr(colon + 1 + n) : std::string_view{};
}

}  // namespace

check_suspects analyse(const queue_walk& walk, check_report& report) {
  check_suspects out;
  std::map<std::string, std::vector<std::string>> holders;  // group -> where its lanes are
  std::unordered_map<std::string, job_place> seen;          // job id -> where first seen
  auto job_at = [&](const std::string& record, job_place place) {
    auto id = id_of(record);
    if (!id) {
      report.problems.push_back(fmt::format("malformed record in {}: {}", place.describe(), record.substr(0, 60)));
      return;
    }
    if (auto [it, added] = seen.try_emplace(std::string(*id), place); !added)
      out.copies.push_back(job_copy{it->first, it->second, std::move(place)});
    ++report.jobs;
    auto at = enqueued_at(record);
    if (at > 0 && (report.oldest_enqueued_ms == 0 || at < report.oldest_enqueued_ms)) report.oldest_enqueued_ms = at;
  };
  // A lane: a group's goes to its holders, an ungrouped job's record is a job.
  auto lane = [&](const std::string& l, job_place::kind where, const std::string& key, const std::string& member) {
    if (l == "w:") return;  // (a wake entry: see enqueue.lua's levels)
    if (l.starts_with("g:"))
      holders[l.substr(2)].push_back(job_place{where, key, {}}.describe());
    else
      job_at(l.substr(2), job_place{where, key, member});
  };

  for (auto& l : walk.ready) lane(l, job_place::kind::ready, {}, l);
  for (auto& [level, lanes] : walk.levels)
    for (auto& l : lanes) lane(l, job_place::kind::ready, level, l);
  for (auto& [worker, lanes] : walk.claimed) {
    for (auto& l : lanes) lane(l, job_place::kind::claimed, worker, l);
    if (!lanes.empty() && !walk.workers.contains(worker)) out.dead_workers.push_back(worker);
  }
  for (auto& member : walk.delayed) {
    if (member.starts_with("d:"))
      job_at(std::string(delayed_record(member)), job_place{job_place::kind::delayed, {}, member});
    else
      lane(member, job_place::kind::delayed, {}, member);
  }
  std::map<std::string, std::int64_t> runs;  // leases of jobs of groups that run several at once
  for (auto& token : walk.active) {
    auto bar = token.find('|');
    if (bar == std::string::npos) continue;
    if (token.compare(bar + 1, 2, "c:") == 0) {  // such a job: a job, and no lane
      auto [group, record] = conc_parts(std::string_view(token).substr(bar + 1));
      ++runs[std::string(group)];
      job_at(std::string(record), job_place{job_place::kind::lease, {}, token});
    } else {
      lane(token.substr(bar + 1), job_place::kind::lease, {}, token);
    }
  }
  for (auto& group : walk.parked) holders[group].push_back("parked");
  // A lane in full waits for a run's end: with none counted, nothing would put it back.
  for (auto& group : walk.full) {
    if (auto r = walk.running.find(group); r != walk.running.end() && r->second > 0)
      holders[group].push_back("full");
    else
      out.groups.push_back(group);
  }
  // The runs counted and the leases seen (confirmed one group at a time: leases come and go).
  for (auto& [group, n] : walk.running)
    if (runs[group] != n) out.groups.push_back(group);
  for (auto& [group, n] : runs)
    if (!walk.running.contains(group)) out.groups.push_back(group);

  std::int64_t with_jobs = 0;
  for (auto& [group, records] : walk.groups) {
    if (records.empty()) continue;
    ++with_jobs;
    for (auto& r : records) job_at(r, job_place{job_place::kind::group, group, r});
    auto h = holders.find(group);
    bool fine =
        h != holders.end() && h->second.size() == 1 && (h->second.front() != "parked" || walk.paused.contains(group));
    if (!fine) out.groups.push_back(group);
    if (h != holders.end()) holders.erase(h);
  }
  for (auto& [group, where] : holders) out.groups.push_back(group);  // lanes of groups without jobs
  std::unordered_set<std::string> once;                              // (a group suspect twice is confirmed once)
  std::erase_if(out.groups, [&](const std::string& g) { return !once.insert(g).second; });
  std::unordered_set<std::string_view> pending;
  for (auto& [id, place] : seen) pending.insert(id);
  for (auto& id : walk.ids)
    if (!pending.contains(id)) out.ids.push_back(id);
  report.groups = with_jobs;
  if (walk.counted_groups && *walk.counted_groups != with_jobs) out.groups_seen = with_jobs;
  return out;
}

std::vector<std::string> missing_twice(const std::vector<std::string>& ids, const queue_walk& again) {
  check_report ignored;
  auto second = analyse(again, ignored);
  std::unordered_set<std::string> missing(second.ids.begin(), second.ids.end());
  std::vector<std::string> out;
  for (auto& id : ids)
    if (missing.contains(id)) out.push_back(id);
  return out;
}

std::string stuck_problem(const std::string& group, std::int64_t jobs) {
  return fmt::format("group {} has {} jobs and no lane, lease or parked lane", group, jobs);
}
std::string lanes_problem(const std::string& group, const std::vector<std::string>& holders) {
  return fmt::format("group {} has {} lanes: {}", group, holders.size(), fmt::join(holders, ", "));
}
std::string parked_problem(const std::string& group) { return fmt::format("group {} is parked but not paused", group); }
std::string empty_group_problem(const std::string& group, const std::string& where) {
  return fmt::format("a lane of group {}, which has no jobs, is in {}", group, where);
}
std::string copy_problem(const std::string& id, const job_place& first, const job_place& second) {
  return fmt::format("job {} is in {} and in {}", id, first.describe(), second.describe());
}
std::string dead_worker_problem(const std::string& worker, std::size_t lanes) {
  return fmt::format("{} lanes held by worker {}, which has no heartbeat", lanes, worker);
}
std::string id_problem(const std::string& id) { return fmt::format("id {} is taken but no pending job has it", id); }
std::string runs_problem(const std::string& group, std::int64_t counted, std::int64_t leases) {
  return fmt::format("group {} counts {} jobs running at once; {} leases run them", group, counted, leases);
}
std::string count_problem(std::int64_t counted, std::int64_t seen) {
  return fmt::format("stats counts {} groups with jobs; there are {}", counted, seen);
}

}  // namespace jobrt::detail
