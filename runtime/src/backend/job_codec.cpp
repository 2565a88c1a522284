#include "job_codec.hpp"

#include "backend/views.hpp"

#include <fmt/format.h>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <iterator>
#include <limits>

namespace jobrt {

failure_policy parse_failure_policy(std::string_view text) {
  if (text == "hold") return failure_policy::hold;
  if (text == "skip") return failure_policy::skip;
  if (text == "halt") return failure_policy::halt;
  throw std::invalid_argument(fmt::format("failure policy '{}' is not one of hold, skip, halt", text));
}

std::string_view to_string(failure_policy p) noexcept {
  switch (p) {
    case failure_policy::hold: return "hold";
    case failure_policy::skip: return "skip";
    case failure_policy::halt: return "halt";
  }
  return "hold";
}

std::chrono::milliseconds backoff::delay_after(int attempt, double random) const noexcept {
  double d = static_cast<double>(initial.count());
  for (int i = 1; i < attempt && d < static_cast<double>(max.count()); ++i) d *= factor;
  d = std::min(d, static_cast<double>(max.count()));
  d *= 1.0 + jitter * (2.0 * random - 1.0);
  // A cap near the largest duration (a "no cap") must not overflow the conversion: that is
  // undefined, and on x86 gives a negative delay, a retry at once, in a loop. NaN (0 ms times an
  // infinite factor) is 0.
  constexpr double longest = 9.2e18;  // ms, below 2^63
  if (!(d > 0.0)) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::min(d, longest)));
}

void check_rate_limit(const rate_limit& limit, std::string_view what) {
  if (limit.max < 1 || limit.max > max_rate_starts)
    throw std::invalid_argument(fmt::format("{} max is {}; it must be from 1 to {}", what, limit.max, max_rate_starts));
  if (limit.window.count() < 1 || limit.window > max_rate_window)
    throw std::invalid_argument(fmt::format("{} window is {} ms; it must be from 1 to {}", what, limit.window.count(),
                                            max_rate_window.count()));
}

void check_group_concurrency(std::size_t n, std::string_view what) {
  if (n < 1 || n > max_group_concurrency)
    throw std::invalid_argument(fmt::format("{} is {}; it must be from 1 to {}", what, n, max_group_concurrency));
}

void check_group_weight(std::size_t w, std::string_view what) {
  if (w < 1 || w > max_group_weight)
    throw std::invalid_argument(fmt::format("{} is {}; it must be from 1 to {}", what, w, max_group_weight));
}

job decode_job(std::string_view record, std::string_view group) {
  return detail::decode(detail::split_record(record), group);
}

}  // namespace jobrt

namespace jobrt::detail {

// Written field by field: an object built first would copy the payload, however big.
std::string encode_body(const job_spec& spec, std::int64_t now_ms, std::optional<failure_policy> policy,
                        std::chrono::milliseconds keep, std::optional<rate_limit> rate, std::size_t concurrency,
                        std::size_t weight) {
  // A keep goes first, then a rate limit, then a concurrency and a weight above 1, then a
  // priority other than 0: the scripts find them there without decoding the body (enqueue.lua,
  // claim.lua).
  std::string body = keep.count() > 0 ? fmt::format(R"({{"keep":{},)", keep.count()) : std::string("{");
  if (rate) fmt::format_to(std::back_inserter(body), R"("rate":[{},{}],)", rate->max, rate->window.count());
  if (concurrency > 1) fmt::format_to(std::back_inserter(body), R"("conc":{},)", concurrency);
  if (weight > 1) fmt::format_to(std::back_inserter(body), R"("weight":{},)", weight);
  if (spec.priority != 0) fmt::format_to(std::back_inserter(body), R"("prio":{},)", spec.priority);
  body += R"("type":)";
  body += boost::json::serialize(boost::json::string_view(spec.type));
  body += R"(,"payload":)";
  body += boost::json::serialize(spec.payload);
  auto out = std::back_inserter(body);
  if (spec.max_attempts != 3) fmt::format_to(out, R"(,"max":{})", spec.max_attempts);
  if (spec.timeout.count() != 0) fmt::format_to(out, R"(,"timeout":{})", spec.timeout.count());
  if (!spec.id.empty()) body += R"(,"u":1)";
  if (spec.retry_backoff) {
    const auto& b = *spec.retry_backoff;
    body += R"(,"backoff":)";
    body += boost::json::serialize(boost::json::array{b.initial.count(), b.factor, b.max.count(), b.jitter});
  }
  if (policy) fmt::format_to(out, R"(,"policy":"{}")", to_string(*policy));
  fmt::format_to(out, R"(,"at":{}}})", now_ms);
  return body;
}

std::int64_t attempts_before(std::string_view record) noexcept {
  std::int64_t n = 0;
  auto [end, ec] = std::from_chars(record.data(), record.data() + record.size(), n);
  return ec == std::errc{} && end != record.data() && n >= 0 && end != record.data() + record.size() && *end == '|'
             ? n
             : -1;
}

std::string_view script_id(std::string_view record) noexcept {
  std::size_t i = 0;
  while (i < record.size() && record[i] >= '0' && record[i] <= '9') ++i;
  if (i == 0 || i == record.size() || record[i] != '|') return {};
  auto end = record.find('|', i + 1);
  if (end == std::string_view::npos) return {};
  return record.substr(i + 1, end - i - 1);
}

bool assigned_id(std::string_view id) noexcept {
  return !id.empty() && std::all_of(id.begin(), id.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string id_refusal(std::string_view id) {
  if (id.find('|') != std::string_view::npos) return fmt::format("job id '{}' contains '|'", id);
  if (assigned_id(id))
    return fmt::format("job id '{}' is all digits, like the ids the queue assigns; give it a prefix", id);
  auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };  // Lua's %s
  if (!id.empty() && (space(id.front()) || space(id.back())))
    return fmt::format("job id '{}' starts or ends with white space", id);
  return {};
}

std::string due_refusal(const encoded_job& job, std::size_t i) {
  constexpr std::int64_t latest = 999'999'999'999'999;  // 15 digits
  if (job.delay_ms < 0 || job.delay_ms > latest || job.run_at_ms < 0 || job.run_at_ms > latest)
    return fmt::format("job {} due time is out of range (15 digits of ms at most)", i + 1);
  return {};
}

std::string group_full_message(std::string_view group, std::int64_t count, std::int64_t max, std::size_t i,
                               std::size_t n) {
  return fmt::format("group '{}' would hold {} jobs, over its max group size of {} (job {} of {}): nothing was stored",
                     group, count, max, i + 1, n);
}

std::string body_refusal(std::string_view body) {
  // As enqueue.lua: only a body whose text may hold a max below 1 ('"max"', ':', then '-' or
  // '0', spaces between) is decoded, and its own "max" decides.
  auto may_hold = [&] {
    constexpr std::string_view key = "\"max\"";
    auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
    for (auto at = body.find(key); at != std::string_view::npos; at = body.find(key, at + 1)) {
      auto i = at + key.size();
      while (i < body.size() && space(body[i])) ++i;
      if (i == body.size() || body[i] != ':') continue;
      ++i;
      while (i < body.size() && space(body[i])) ++i;
      if (i < body.size() && (body[i] == '-' || body[i] == '0')) return true;
    }
    return false;
  };
  if (!may_hold()) return {};
  boost::system::error_code ec;
  auto v = boost::json::parse(body, ec);
  const auto* max = !ec && v.is_object() ? v.as_object().if_contains("max") : nullptr;
  if (!max || !max->is_number()) return {};
  auto m = max->to_number<double>();
  if (m < 1 || m != std::floor(m)) return fmt::format("job max_attempts is {:.14g}; it must be at least 1", m);
  return {};
}

std::string producer_id(const job_record& r) {
  if (r.id.empty()) return {};
  if (!assigned_id(r.id)) return r.id;
  boost::system::error_code ec;
  auto body = boost::json::parse(r.body, ec);
  if (ec || !body.is_object()) return {};
  auto* u = body.as_object().if_contains("u");
  bool given = u && ((u->is_int64() && u->as_int64() != 0) || (u->is_bool() && u->as_bool()));
  return given ? r.id : std::string();
}

job_record split_record(std::string_view record) {
  job_record r;
  auto first = record.find('|');
  auto second = first == std::string_view::npos ? first : record.find('|', first + 1);
  if (second == std::string_view::npos) {
    r.malformed = fmt::format("job record '{:.60}' is not '<attempts>|<id>|<body>'", record);
    return r;
  }
  r.id = std::string(record.substr(first + 1, second - first - 1));
  r.body = std::string(record.substr(second + 1));
  auto attempts = record.substr(0, first);
  auto [end, ec] = std::from_chars(attempts.data(), attempts.data() + attempts.size(), r.attempts);
  if (ec != std::errc{} || end != attempts.data() + attempts.size() || r.attempts < 0)
    r.malformed = fmt::format("job record attempts '{}' is not a number", attempts);
  return r;
}

namespace {

template <class T>
T number_field(const boost::json::object& body, std::string_view name, T fallback) {
  auto it = body.find(name);
  if (it == body.end()) return fallback;
  if (!it->value().is_int64()) throw bad_record(fmt::format("job field '{}' is not an integer", name));
  return static_cast<T>(it->value().as_int64());
}

}  // namespace

job decode(const job_record& r, std::string_view group) {
  if (!r.malformed.empty()) throw bad_record(r.malformed);
  if (r.attempts >= std::numeric_limits<int>::max())  // job::attempt is an int
    throw bad_record(fmt::format("job record attempts '{}' is not a number", r.attempts));
  job j;
  j.attempt = static_cast<int>(r.attempts) + 1;
  j.id = r.id;
  j.group = std::string(group);
  boost::system::error_code jec;
  boost::json::value body = boost::json::parse(r.body, jec);
  if (jec) throw bad_record(fmt::format("job {} body is not JSON: {}", j.id, jec.message()));
  if (!body.is_object()) throw bad_record(fmt::format("job {} body is not a JSON object", j.id));
  auto& obj = body.as_object();
  auto type = obj.find("type");
  if (type == obj.end() || !type->value().is_string() || type->value().as_string().empty())
    throw bad_record(fmt::format("job {} has no type", j.id));
  j.type = std::string(type->value().as_string());
  if (auto payload = obj.find("payload"); payload != obj.end()) j.payload = std::move(payload->value());
  j.max_attempts = number_field<int>(obj, "max", 3);
  j.timeout = std::chrono::milliseconds(number_field<std::int64_t>(obj, "timeout", 0));
  j.enqueued_at_ms = number_field<std::int64_t>(obj, "at", 0);
  if (auto keep = keep_in_body(r.body)) j.keep = std::chrono::milliseconds(*keep);  // (as the scripts see it)
  j.group_rate = rate_in_body(r.body);
  j.group_concurrency = conc_in_body(r.body);
  j.group_weight = weight_in_body(r.body);
  j.priority = prio_in_body(r.body);
  const auto* u = obj.if_contains("u");  // as the scripts read it: anything but false (and 0)
  bool flagged = u && !(u->is_bool() && !u->as_bool()) && !(u->is_int64() && u->as_int64() == 0);
  j.unique_id = flagged || (!j.id.empty() && !assigned_id(j.id));
  if (auto* b = obj.if_contains("backoff")) {
    auto* a = b->if_array();
    if (!a || a->size() != 4 || !(*a)[0].is_int64() || !(*a)[1].is_number() || !(*a)[2].is_int64() ||
        !(*a)[3].is_number())
      throw bad_record(fmt::format("job {} backoff is not [initial ms, factor, max ms, jitter]", j.id));
    j.retry_backoff = backoff{std::chrono::milliseconds((*a)[0].as_int64()), (*a)[1].to_number<double>(),
                              std::chrono::milliseconds((*a)[2].as_int64()), (*a)[3].to_number<double>()};
  }
  if (auto* p = obj.if_contains("policy")) {
    if (!p->is_string()) throw bad_record(fmt::format("job {} policy is not a string", j.id));
    try {
      j.on_failure = parse_failure_policy(p->as_string());
    } catch (const std::invalid_argument& e) {
      throw bad_record(fmt::format("job {}: {}", j.id, e.what()));
    }
  }
  return j;
}

std::int64_t enqueued_at(std::string_view record) noexcept {
  for (auto pos = record.find("\"at\":"); pos != std::string_view::npos; pos = record.find("\"at\":", pos + 1)) {
    std::int64_t at = 0;
    auto digits = record.substr(pos + 5);
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), at);
    if (ec == std::errc{} && end != digits.data() && digits.front() != '-') return at;
  }
  return 0;
}

}  // namespace jobrt::detail
