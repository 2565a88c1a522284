#include <jobrt/settings.hpp>

#include <jobrt/redis_backend.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <boost/json/parse.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <stdexcept>

namespace jobrt {
namespace {

namespace json = boost::json;

[[noreturn]] void bad(std::string_view where, std::string_view what) {
  throw std::invalid_argument(fmt::format("{}: {}", where, what));
}

// The refusal of an unknown field lists the known ones: a typo is fixed at a glance, and the unit
// test that holds docs/CONFIG.md to the parser reads the list from there.
const json::object& object_at(const json::value& v, std::string_view where,
                              std::initializer_list<std::string_view> known) {
  if (!v.is_object()) bad(where, "is not an object");
  for (auto& [key, value] : v.as_object())
    if (std::find(known.begin(), known.end(), key) == known.end())
      bad(where, fmt::format("unknown field \"{}\" (known: {})", std::string_view(key), fmt::join(known, ", ")));
  return v.as_object();
}

std::string text_at(const json::value& v, std::string_view where) {
  if (!v.is_string() || v.as_string().empty()) bad(where, "is not a non-empty string");
  return std::string(v.as_string());
}

std::int64_t count_at(const json::value& v, std::string_view where, std::int64_t min,
                      std::int64_t max = std::numeric_limits<std::int64_t>::max()) {
  if (!v.is_int64() || v.as_int64() < min || v.as_int64() > max) {
    if (max == std::numeric_limits<std::int64_t>::max())
      bad(where, fmt::format("is not an integer of at least {}", min));
    bad(where, fmt::format("is not an integer from {} to {}", min, max));
  }
  return v.as_int64();
}

double number_at(const json::value& v, std::string_view where, double min, double max) {
  if (!v.is_number()) bad(where, "is not a number");
  auto d = v.to_number<double>();
  if (d < min || d > max) bad(where, fmt::format("is not between {} and {}", min, max));
  return d;
}

backoff backoff_at(const json::value& v, std::string_view where) {
  const auto& o = object_at(v, where, {"initial_ms", "factor", "max_ms", "jitter"});
  backoff b;
  auto field = [&](std::string_view name) { return fmt::format("{}.{}", where, name); };
  if (auto* f = o.if_contains("initial_ms"))
    b.initial = std::chrono::milliseconds(count_at(*f, field("initial_ms"), 0));
  if (auto* f = o.if_contains("factor")) b.factor = number_at(*f, field("factor"), 1.0, 100.0);
  if (auto* f = o.if_contains("max_ms")) b.max = std::chrono::milliseconds(count_at(*f, field("max_ms"), 0));
  if (auto* f = o.if_contains("jitter")) b.jitter = number_at(*f, field("jitter"), 0.0, 1.0);
  if (b.max < b.initial)  // every wait would be max_ms: a typo, most likely
    bad(field("max_ms"), fmt::format("is below initial_ms ({})", b.initial.count()));
  return b;
}

failure_policy policy_at(const json::value& v, std::string_view where) {
  try {
    return parse_failure_policy(text_at(v, where));
  } catch (const std::invalid_argument& e) {
    bad(where, e.what());
  }
}

queue_settings queue_at(const json::value& v, const std::string& where) {
  const auto& o = object_at(v, where,
                            {"name",
                             "concurrency",
                             "lease_ttl_ms",
                             "watchdog_ms",
                             "burst",
                             "max_result_bytes",
                             "follow",
                             "claim_wait_ms",
                             "on_failure",
                             "retry",
                             "grouping",
                             "dead_letters",
                             "unhandled_delay_ms",
                             "unhandled_limit_ms",
                             "shards",
                             "max_group_size",
                             "group_rate",
                             "group_concurrency",
                             "group_weight",
                             "rate_limit",
                             "bridge",
                             "schedules"});
  auto field = [&](std::string_view name) { return fmt::format("{}.{}", where, name); };
  queue_settings q;
  auto* name = o.if_contains("name");
  if (!name) bad(where, "has no \"name\"");
  q.worker.queue = text_at(*name, field("name"));
  if (q.worker.queue.find_first_of("{}") != std::string::npos)
    bad(field("name"), fmt::format("\"{}\" holds '{{' or '}}', which would break its keys' hash tag", q.worker.queue));
  if (auto* f = o.if_contains("shards")) q.shards = static_cast<std::size_t>(count_at(*f, field("shards"), 1, 1024));
  if (auto* f = o.if_contains("max_group_size"))
    q.max_group_size = static_cast<std::size_t>(
        count_at(*f, field("max_group_size"), 1, static_cast<std::int64_t>(max_group_size_limit)));
  if (auto* f = o.if_contains("group_rate")) q.group_rate = rate_limit_from_json(*f, field("group_rate"));
  if (auto* f = o.if_contains("group_concurrency"))
    q.group_concurrency = static_cast<std::size_t>(
        count_at(*f, field("group_concurrency"), 1, static_cast<std::int64_t>(max_group_concurrency)));
  if (auto* f = o.if_contains("group_weight"))
    q.group_weight =
        static_cast<std::size_t>(count_at(*f, field("group_weight"), 1, static_cast<std::int64_t>(max_group_weight)));
  if (auto* f = o.if_contains("rate_limit")) q.worker.rate_limit = rate_limit_from_json(*f, field("rate_limit"));
  if (auto* f = o.if_contains("bridge")) {
    try {
      q.bridge = bridge_mapping::from_json(*f);
    } catch (const std::invalid_argument& e) {  // "bridge.type: ..." as "queues[0].bridge.type: ..."
      std::string what = e.what();
      auto colon = what.find(": ");
      bad(fmt::format("{}.{}", where, what.substr(0, colon)), what.substr(colon + 2));
    }
  }
  if (auto* f = o.if_contains("concurrency"))
    q.worker.concurrency = static_cast<std::size_t>(count_at(*f, field("concurrency"), 1, 100'000));
  if (auto* f = o.if_contains("lease_ttl_ms"))
    q.worker.lease_ttl = std::chrono::milliseconds(count_at(*f, field("lease_ttl_ms"), 100, 86'400'000));
  if (auto* f = o.if_contains("watchdog_ms"))
    q.worker.watchdog_period = std::chrono::milliseconds(count_at(*f, field("watchdog_ms"), 10, 86'400'000));
  if (q.worker.watchdog_period.count() > 0 && q.worker.watchdog_period >= q.worker.lease_ttl)
    bad(field("watchdog_ms"), "must be shorter than lease_ttl_ms");
  if (auto* f = o.if_contains("burst"))
    q.worker.burst = static_cast<std::size_t>(count_at(*f, field("burst"), 1, 1000));
  if (auto* f = o.if_contains("max_result_bytes"))
    q.worker.max_result_bytes = static_cast<std::size_t>(count_at(*f, field("max_result_bytes"), 0, 16 * 1024 * 1024));
  if (auto* f = o.if_contains("follow")) {
    auto text = text_at(*f, field("follow"));
    try {
      q.worker.follow = parse_follow_policy(text);
    } catch (const std::invalid_argument& e) {
      bad(field("follow"), e.what());
    }
  }
  if (auto* f = o.if_contains("claim_wait_ms"))
    q.worker.claim_wait = std::chrono::milliseconds(count_at(*f, field("claim_wait_ms"), 1, 86'400'000));
  if (auto* f = o.if_contains("schedules")) {
    if (!f->is_bool()) bad(field("schedules"), "must be true or false");
    q.worker.schedules = f->get_bool();
  }
  if (auto* f = o.if_contains("unhandled_delay_ms"))
    q.worker.unhandled_delay = std::chrono::milliseconds(count_at(*f, field("unhandled_delay_ms"), 0, 86'400'000));
  if (auto* f = o.if_contains("unhandled_limit_ms"))
    q.worker.unhandled_limit = std::chrono::milliseconds(count_at(*f, field("unhandled_limit_ms"), 0, 86'400'000));
  if (auto* f = o.if_contains("on_failure")) q.worker.on_failure = policy_at(*f, field("on_failure"));
  if (auto* f = o.if_contains("retry")) q.worker.retry_backoff = backoff_at(*f, field("retry"));
  if (auto* f = o.if_contains("grouping")) {
    try {
      q.rules = grouping_rules::from_json(*f);
    } catch (const std::invalid_argument& e) {
      bad(field("grouping"), e.what());
    }
  }
  if (auto* f = o.if_contains("dead_letters")) {
    auto where_dl = field("dead_letters");
    const auto& d = object_at(*f, where_dl, {"max_count", "max_age_ms"});
    if (auto* c = d.if_contains("max_count"))
      q.worker.dead_max_count = static_cast<std::size_t>(count_at(*c, where_dl + ".max_count", 0));
    if (auto* a = d.if_contains("max_age_ms"))
      q.worker.dead_max_age = std::chrono::milliseconds(count_at(*a, where_dl + ".max_age_ms", 0));
  }
  return q;
}

}  // namespace

settings settings::from_json(const json::value& v) {
  const auto& o = object_at(v, "config", {"redis", "durability", "plugins", "handlers", "queues"});
  settings s;
  if (auto* f = o.if_contains("redis")) s.redis_url = text_at(*f, "config.redis");
  if (auto* f = o.if_contains("durability")) {
    try {
      s.durability = durability_of(text_at(*f, "config.durability"));
    } catch (const std::invalid_argument& e) {
      bad("config.durability", e.what());
    }
  }
  if (auto* f = o.if_contains("plugins")) {
    if (!f->is_array()) bad("config.plugins", "is not an array");
    for (std::size_t i = 0; i < f->as_array().size(); ++i)
      s.plugins.push_back(text_at(f->as_array()[i], fmt::format("config.plugins[{}]", i)));
  }
  if (auto* f = o.if_contains("handlers")) {
    if (!f->is_object()) bad("config.handlers", "is not an object");
    for (auto& [type, h] : f->as_object()) {
      auto where = fmt::format("config.handlers.{}", std::string_view(type));
      const auto& ho = object_at(h, where, {"retry"});
      if (auto* r = ho.if_contains("retry")) s.type_backoffs[std::string(type)] = backoff_at(*r, where + ".retry");
    }
  }
  if (auto* f = o.if_contains("queues")) {
    if (!f->is_array()) bad("config.queues", "is not an array");
    std::set<std::string> names;
    for (std::size_t i = 0; i < f->as_array().size(); ++i) {
      auto q = queue_at(f->as_array()[i], fmt::format("config.queues[{}]", i));
      if (!names.insert(q.worker.queue).second)
        bad(fmt::format("config.queues[{}].name", i), fmt::format("queue \"{}\" is named twice", q.worker.queue));
      s.queues.push_back(std::move(q));
    }
  }
  return s;
}

settings settings::from_file(const std::string& path) {
  std::error_code fec;
  if (std::filesystem::is_directory(path, fec))
    throw std::invalid_argument(fmt::format("config {}: is a directory, not a file", path));
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(fmt::format("config {}: cannot open it", path));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::invalid_argument(fmt::format("config {}: cannot read it", path));
  boost::system::error_code ec;
  auto v = json::parse(text, ec);
  if (ec) throw std::invalid_argument(fmt::format("config {}: not JSON: {}", path, ec.message()));
  try {
    return from_json(v);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("config {}: {}", path, e.what()));
  }
}

}  // namespace jobrt
