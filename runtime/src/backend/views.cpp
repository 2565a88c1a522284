#include "backend/views.hpp"

#include "backend/job_codec.hpp"

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <stdexcept>

namespace jobrt::detail {

namespace json = boost::json;

namespace {

std::int64_t int_in(const json::object& o, std::string_view name) {
  auto* v = o.if_contains(name);
  return v && v->is_int64() ? v->as_int64() : 0;
}

std::string text_in(const json::object& o, std::string_view name) {
  auto* v = o.if_contains(name);
  return v && v->is_string() ? std::string(v->as_string()) : std::string();
}

std::optional<json::object> object_of(std::string_view text) {
  boost::system::error_code ec;
  auto v = json::parse(text, ec);
  if (ec || !v.is_object()) return std::nullopt;
  return std::move(v.as_object());
}

// The counters and gauges, by the names `stats` and the CLI use.
template <class Counts, class F>
void each_count(Counts& c, F f) {
  f("ready_lanes", c.ready_lanes);
  f("running", c.running);
  f("delayed", c.delayed);
  f("paused", c.paused);
  f("groups", c.groups);
  f("dead", c.dead);
  f("enqueued", c.enqueued);
  f("started", c.started);
  f("completed", c.completed);
  f("failed", c.failed);
  f("retried", c.retried);
  f("deferred", c.deferred);
  f("unhandled", c.unhandled);
  f("halted", c.halted);
  f("recovered", c.recovered);
}

std::string lowered(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

}  // namespace

json::object report_object(const worker_report& r) {
  json::object o;
  o["id"] = r.id;
  o["host"] = r.host;
  o["pid"] = r.pid;
  o["concurrency"] = r.concurrency;
  o["started"] = r.started_ms;
  o["running"] = r.running;
  json::array jobs;
  for (std::size_t i = 0; i < r.jobs.size() && i < max_reported_jobs; ++i) {
    const auto& j = r.jobs[i];
    json::object e;
    e["id"] = j.id;
    e["group"] = j.group;
    e["type"] = j.type;
    e["since"] = j.since_ms;
    jobs.push_back(std::move(e));
  }
  o["jobs"] = std::move(jobs);
  return o;
}

std::string report_json(const worker_report& r) { return json::serialize(report_object(r)); }

worker_report parse_report(std::string_view text) {
  worker_report r;
  auto o = object_of(text);
  if (!o) return r;
  r.id = text_in(*o, "id");
  r.host = text_in(*o, "host");
  r.pid = int_in(*o, "pid");
  r.concurrency = int_in(*o, "concurrency");
  r.started_ms = int_in(*o, "started");
  r.running = int_in(*o, "running");
  if (auto* jobs = o->if_contains("jobs"); jobs && jobs->is_array()) {
    for (const auto& e : jobs->as_array()) {
      if (!e.is_object()) continue;
      const auto& j = e.as_object();
      r.jobs.push_back({text_in(j, "id"), text_in(j, "group"), text_in(j, "type"), int_in(j, "since")});
    }
  }
  return r;
}

json::object counts_object(const queue_counts& c) {
  json::object o;
  each_count(c, [&](std::string_view name, std::int64_t v) { o[name] = v; });
  return o;
}

std::string counts_json(const queue_counts& c) { return json::serialize(counts_object(c)); }

queue_counts parse_counts(std::string_view text) {
  queue_counts c;
  if (auto o = object_of(text)) each_count(c, [&](std::string_view name, std::int64_t& v) { v = int_in(*o, name); });
  return c;
}

std::string type_of_record(std::string_view record) {
  auto body = split_record(record).body;
  auto o = object_of(body);
  return o ? text_in(*o, "type") : std::string();
}

bool passes(const dead_filter& f, const dead_letter& d) {
  if (!f.group.empty() && d.group != f.group) return false;
  if (!f.type.empty() && type_of_record(d.record) != f.type) return false;
  if (!f.text.empty() && lowered(d.error).find(lowered(f.text)) == std::string::npos) return false;
  return true;
}

std::string to_string(const dead_cursor& c) {
  return std::to_string(c.at_ms) + ":" + std::to_string(c.skip) + ":" + c.last_id;
}

std::optional<dead_cursor> parse_dead_cursor(std::string_view text) {
  if (text.empty()) return std::nullopt;
  dead_cursor c;
  auto number = [](std::string_view s, std::int64_t& out) {
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && end == s.data() + s.size() && out >= 0;
  };
  auto first = text.find(':');
  auto second = first == std::string_view::npos ? first : text.find(':', first + 1);
  if (second == std::string_view::npos || !number(text.substr(0, first), c.at_ms) ||
      !number(text.substr(first + 1, second - first - 1), c.skip) || second + 1 == text.size())
    throw std::invalid_argument("dead letter cursor '" + std::string(text) + "' is not one that a listing gave");
  c.last_id = std::string(text.substr(second + 1));
  return c;
}

std::optional<std::string> parse_group_cursor(std::string_view text) {
  if (text.empty()) return std::nullopt;
  if (!text.starts_with("g:"))
    throw std::invalid_argument("group cursor '" + std::string(text) + "' is not one that a listing gave");
  return std::string(text.substr(2));
}

}  // namespace jobrt::detail
