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

// A job's record: its parts decoded, or as stored with why it does not decode.
json::object record_object(const job_record& r, std::string_view group) {
  json::object o;
  o["id"] = r.id;
  o["attempts"] = r.attempts;
  try {
    auto j = decode(r, group);
    o["type"] = j.type;
    o["payload"] = j.payload;
    o["max_attempts"] = j.max_attempts;
    o["enqueued_at"] = j.enqueued_at_ms;
    if (j.keep.count() > 0) o["keep_ms"] = j.keep.count();
  } catch (const std::exception& e) {
    o["record"] = r.body;
    o["malformed"] = r.malformed.empty() ? std::string(e.what()) : r.malformed;
  }
  return o;
}

json::object dead_object(const dead_letter& d) {
  json::object o;
  o["id"] = d.id;
  o["group"] = d.group;
  try {
    auto j = decode_job(d.record, d.group);
    o["type"] = j.type;
    o["payload"] = j.payload;
    o["max_attempts"] = j.max_attempts;
    o["enqueued_at"] = j.enqueued_at_ms;
  } catch (const std::exception&) {
    o["record"] = d.record;
  }
  o["runs"] = d.runs;
  o["error"] = d.error;
  o["at"] = d.at_ms;
  return o;
}

json::object group_object(const group_status& s) {
  json::object o;
  o["group"] = s.group;
  o["depth"] = s.depth;
  o["runs"] = s.running;
  o["head"] = s.head ? json::value(record_object(*s.head, s.group)) : json::value(nullptr);
  if (s.paused) {
    json::object p;
    p["halted"] = s.paused->halted;
    p["error"] = s.paused->error;
    p["at"] = s.paused->at_ms;
    o["paused"] = std::move(p);
  } else {
    o["paused"] = nullptr;
  }
  o["parked"] = s.parked;
  o["waiting_until"] = s.waiting_until_ms;
  return o;
}

json::object running_object(const worker_report& r, const worker_report::job& j) {
  json::object o;
  o["worker"] = r.id;
  o["host"] = r.host;
  o["pid"] = r.pid;
  o["id"] = j.id;
  o["group"] = j.group;
  o["type"] = j.type;
  o["since"] = j.since_ms;
  o["reported_at"] = r.at_ms;
  return o;
}

std::optional<std::int64_t> keep_in_body(std::string_view body) noexcept {
  constexpr std::string_view head = "{\"keep\":";
  if (!body.starts_with(head) || body.size() == head.size() || body[head.size()] < '0' || body[head.size()] > '9')
    return std::nullopt;
  std::int64_t keep = 0;
  auto [end, ec] = std::from_chars(body.data() + head.size(), body.data() + body.size(), keep);
  if (ec != std::errc{} || end == body.data() + head.size()) return std::nullopt;
  return keep;
}

std::optional<kept_record> kept_in(std::string_view record) noexcept {
  auto id = script_id(record);
  if (id.data() == nullptr) return std::nullopt;  // not '<digits>|<id>|'
  auto body = record.substr(static_cast<std::size_t>(id.data() + id.size() - record.data()) + 1);
  auto keep = keep_in_body(body);
  if (!keep) return std::nullopt;
  return kept_record{id, *keep};
}

namespace {
// The digits at the start of `text` as a number, and `text` after them; nullopt without any.
std::optional<std::int64_t> take_number(std::string_view& text) noexcept {
  std::int64_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc{} || end == text.data() || text.front() == '-') return std::nullopt;
  text.remove_prefix(static_cast<std::size_t>(end - text.data()));
  return n;
}
}  // namespace

std::optional<rate_limit> rate_in_body(std::string_view body) noexcept {
  constexpr std::string_view keep = "{\"keep\":", rate = "\"rate\":[";
  if (body.starts_with(keep)) {
    body.remove_prefix(keep.size());
    if (!take_number(body) || !body.starts_with(',')) return std::nullopt;
    body.remove_prefix(1);
  } else if (body.starts_with('{')) {
    body.remove_prefix(1);
  } else {
    return std::nullopt;
  }
  if (!body.starts_with(rate)) return std::nullopt;
  body.remove_prefix(rate.size());
  if (body.starts_with('0')) return std::nullopt;  // a max of at least 1, as '[1-9]%d*'
  auto max = take_number(body);
  if (!max || *max < 1 || !body.starts_with(',')) return std::nullopt;
  body.remove_prefix(1);
  auto window = take_number(body);
  if (!window || !body.starts_with(']')) return std::nullopt;
  return rate_limit{static_cast<std::size_t>(*max), std::chrono::milliseconds(*window)};
}

namespace {
// `text` past the digits at its start (as many as there are, as '%d+'); false without any.
bool skip_digits(std::string_view& text) noexcept {
  auto n = std::min(text.find_first_not_of("0123456789"), text.size());
  text.remove_prefix(n);
  return n > 0;
}

// `body` past its '{' and, each optional, '"keep":<digits>,' and '"rate":[<digits>,<digits>],'
// (then, with `conc`, '"conc":<digits>,'); false when what is there is none of those.
bool skip_header(std::string_view& body, bool conc) noexcept {
  constexpr std::string_view keep = "\"keep\":", rate = "\"rate\":[", conc_field = "\"conc\":";
  if (!body.starts_with('{')) return false;
  body.remove_prefix(1);
  if (body.starts_with(keep)) {
    body.remove_prefix(keep.size());
    if (!skip_digits(body) || !body.starts_with(',')) return false;
    body.remove_prefix(1);
  }
  if (body.starts_with(rate)) {  // '[%d+,%d+],'
    body.remove_prefix(rate.size());
    if (!skip_digits(body) || !body.starts_with(',')) return false;
    body.remove_prefix(1);
    if (!skip_digits(body) || !body.starts_with("],")) return false;
    body.remove_prefix(2);
  }
  if (conc && body.starts_with(conc_field)) {
    body.remove_prefix(conc_field.size());
    if (!skip_digits(body) || !body.starts_with(',')) return false;
    body.remove_prefix(1);
  }
  return true;
}

// The number N of '"<field>":N,' at the start of `body`, N at least 1 ('[1-9]%d*,'); else 1.
std::size_t count_field(std::string_view body, std::string_view field) noexcept {
  if (!body.starts_with(field)) return 1;
  body.remove_prefix(field.size());
  if (body.starts_with('0')) return 1;
  auto n = take_number(body);
  if (!n || *n < 1 || !body.starts_with(',')) return 1;
  return static_cast<std::size_t>(*n);
}

std::string_view body_of(std::string_view record) noexcept {
  auto id = script_id(record);
  if (id.data() == nullptr) return {};
  return record.substr(static_cast<std::size_t>(id.data() + id.size() - record.data()) + 1);
}
}  // namespace

std::size_t conc_in_body(std::string_view body) noexcept {
  constexpr std::string_view conc = "\"conc\":";
  if (body.find(conc) == std::string_view::npos) return 1;  // (a plain find first, as claim.lua)
  return skip_header(body, false) ? count_field(body, conc) : 1;
}

std::size_t conc_in(std::string_view record) noexcept { return conc_in_body(body_of(record)); }

std::size_t weight_in_body(std::string_view body) noexcept {
  constexpr std::string_view weight = "\"weight\":";
  if (body.find(weight) == std::string_view::npos) return 1;  // (a plain find first, as claim.lua)
  if (!skip_header(body, true) || !body.starts_with(weight)) return 1;
  // (as '[1-9]%d?%d?,', at most 100)
  auto digits = body.substr(weight.size());
  auto n = std::min(digits.find_first_not_of("0123456789"), digits.size());
  if (n == 0 || n > 3 || digits.front() == '0' || !digits.substr(n).starts_with(',')) return 1;
  return std::min<std::size_t>(count_field(body, weight), max_group_weight);
}

std::size_t weight_in(std::string_view record) noexcept { return weight_in_body(body_of(record)); }

int prio_in_body(std::string_view body) noexcept {
  constexpr std::string_view prio = "\"prio\":", weight = "\"weight\":";
  if (body.find(prio) == std::string_view::npos) return 0;  // (a plain find first, as enqueue.lua)
  if (!skip_header(body, true)) return 0;
  if (body.starts_with(weight)) {
    body.remove_prefix(weight.size());
    if (!skip_digits(body) || !body.starts_with(',')) return 0;
    body.remove_prefix(1);
  }
  if (!body.starts_with(prio)) return 0;
  body.remove_prefix(prio.size());
  bool below = body.starts_with('-');  // ('%-?[12],')
  if (below) body.remove_prefix(1);
  if (body.size() < 2 || (body[0] != '1' && body[0] != '2') || body[1] != ',') return 0;
  return (below ? -1 : 1) * (body[0] - '0');
}

int prio_in(std::string_view record) noexcept { return prio_in_body(body_of(record)); }

std::string level_key(std::string_view prefix, int level) {
  std::string key(prefix);
  key += "ready";
  if (level != 0) key += ":" + std::to_string(level);
  return key;
}

std::pair<std::string_view, std::string_view> conc_parts(std::string_view lane) noexcept {
  auto colon = lane.find(':', 2);
  if (!lane.starts_with("c:") || colon == std::string_view::npos) return {};
  std::size_t n = 0;
  auto [end, ec] = std::from_chars(lane.data() + 2, lane.data() + colon, n);
  if (ec != std::errc() || end != lane.data() + colon || n > lane.size() - colon - 1) return {};
  return {lane.substr(colon + 1, n), lane.substr(colon + 1 + n)};
}

std::optional<rate_limit> rate_in(std::string_view record) noexcept {
  auto id = script_id(record);
  if (id.data() == nullptr) return std::nullopt;
  return rate_in_body(record.substr(static_cast<std::size_t>(id.data() + id.size() - record.data()) + 1));
}

std::string kept_entry(char state, std::int64_t at_ms, std::string_view group, std::string_view record,
                       std::string_view result) {
  std::string out(1, state);
  out += std::to_string(at_ms);
  out += ':';
  out += std::to_string(group.size());
  out += ':';
  out += group;
  if (state == 'c' && !result.empty()) {
    out += std::to_string(result.size());
    out += ':';
    out += result;
  }
  out += record;
  return out;
}

std::optional<kept_job> parse_kept_entry(std::string id, std::string_view entry, std::int64_t now_ms,
                                         std::optional<std::int64_t> gone_at_ms) {
  if (entry.empty()) return std::nullopt;
  kept_job k;
  k.id = std::move(id);
  switch (entry[0]) {
    case 'p': k.status = kept_job::state::pending; break;
    case 'd': k.status = kept_job::state::delayed; break;
    case 'c': k.status = kept_job::state::done; break;
    case 'n':
    case 'k': k.status = kept_job::state::cancelled; break;
    default: return std::nullopt;
  }
  auto number = [&](std::size_t& pos, std::int64_t& value) {
    auto colon = entry.find(':', pos);
    if (colon == std::string_view::npos) return false;
    auto [end, ec] = std::from_chars(entry.data() + pos, entry.data() + colon, value);
    pos = colon + 1;
    return ec == std::errc{} && end == entry.data() + colon;
  };
  std::size_t pos = 1;
  std::int64_t length = 0;
  if (!number(pos, k.at_ms) || !number(pos, length) || length < 0 ||
      static_cast<std::size_t>(length) > entry.size() - pos)
    return std::nullopt;
  k.group = entry.substr(pos, static_cast<std::size_t>(length));
  pos += static_cast<std::size_t>(length);
  // A completed job's result: '<length>:' (a record starts '<digits>|': none).
  auto digits = entry.find_first_not_of("0123456789", pos);
  if (k.status == kept_job::state::done && digits != std::string_view::npos && digits > pos && entry[digits] == ':') {
    if (!number(pos, length) || length < 0 || static_cast<std::size_t>(length) > entry.size() - pos)
      return std::nullopt;
    k.result = entry.substr(pos, static_cast<std::size_t>(length));
    pos += static_cast<std::size_t>(length);
  }
  k.record = split_record(entry.substr(pos));
  k.ended = entry[0] == 'k';
  if (k.status == kept_job::state::delayed && k.at_ms <= now_ms) k.status = kept_job::state::pending;
  // (A cancelled job's entry goes after its keep once it is dropped, 'k': not while it waits, 'n'.)
  if ((entry[0] == 'c' || entry[0] == 'k') && gone_at_ms && *gone_at_ms <= now_ms) return std::nullopt;
  return k;
}

}  // namespace jobrt::detail

namespace jobrt {

std::string_view to_string(cancel_outcome o) noexcept {
  switch (o) {
    case cancel_outcome::cancelled: return "cancelled";
    case cancel_outcome::already: return "already cancelled";
    case cancel_outcome::done: return "done";
    case cancel_outcome::not_found: return "not found";
  }
  return "not found";
}

std::string_view to_string(kept_job::state s) noexcept {
  switch (s) {
    case kept_job::state::pending: return "pending";
    case kept_job::state::delayed: return "delayed";
    case kept_job::state::done: return "done";
    case kept_job::state::cancelled: return "cancelled";
  }
  return "pending";
}

}  // namespace jobrt
