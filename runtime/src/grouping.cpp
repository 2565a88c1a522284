#include <jobrt/grouping.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <boost/json/serialize.hpp>

#include <algorithm>
#include <stdexcept>

namespace jobrt {
namespace {

// A field's value as text: strings as they are, other scalars as JSON; objects, arrays and null
// have no text (they cannot be part of a key).
std::optional<std::string> field_text(std::string_view name, std::string_view type, const boost::json::value& payload) {
  if (name == "type") return std::string(type);
  if (!payload.is_object()) return std::nullopt;
  auto* v = payload.as_object().if_contains(name);
  if (v == nullptr || v->is_null() || v->is_object() || v->is_array()) return std::nullopt;
  if (v->is_string()) return std::string(v->as_string());
  return boost::json::serialize(*v);
}

// A number as an error shows it: as written (Boost.JSON writes 2.5 as 2.5E0).
std::string shown(const boost::json::value& v) {
  return v.is_double() ? fmt::format("{}", v.as_double()) : boost::json::serialize(v);
}

void check_template(const std::string& key) {
  if (key.empty()) throw std::invalid_argument("grouping rule 'key' is empty");
  for (std::size_t i = 0; i < key.size(); ++i) {
    if (key[i] == '{') {
      auto close = key.find('}', i);
      if (close == std::string::npos || close == i + 1)
        throw std::invalid_argument(fmt::format("grouping rule key '{}' has an unclosed or empty {{}}", key));
      i = close;
    } else if (key[i] == '}') {
      throw std::invalid_argument(fmt::format("grouping rule key '{}' has a '}}' without '{{'", key));
    }
  }
}

// As the config file's other objects: an unknown field (a typo of "on_failure", say) is refused,
// naming the known ones, instead of being ignored.
void check_fields(const boost::json::object& o, std::string_view where, std::initializer_list<std::string_view> known) {
  for (auto& [key, value] : o)
    if (std::find(known.begin(), known.end(), key) == known.end())
      throw std::invalid_argument(
          fmt::format("{}: unknown field \"{}\" (known: {})", where, std::string_view(key), fmt::join(known, ", ")));
}

}  // namespace

rate_limit rate_limit_from_json(const boost::json::value& v, std::string_view where) {
  if (!v.is_object()) throw std::invalid_argument(fmt::format("{} is not an object", where));
  check_fields(v.as_object(), where, {"max", "window_ms"});
  auto number = [&](std::string_view name) -> std::int64_t {
    auto* f = v.as_object().if_contains(name);
    if (f == nullptr) throw std::invalid_argument(fmt::format("{}.{} is missing", where, name));
    if (!f->is_int64())
      throw std::invalid_argument(fmt::format("{}.{} is {}, not a whole number", where, name, shown(*f)));
    return f->as_int64();
  };
  auto max = number("max"), window = number("window_ms");
  if (max < 1 || static_cast<std::uint64_t>(max) > max_rate_starts)
    throw std::invalid_argument(fmt::format("{}.max is {}; it must be from 1 to {}", where, max, max_rate_starts));
  if (window < 1 || window > max_rate_window.count())
    throw std::invalid_argument(
        fmt::format("{}.window_ms is {}; it must be from 1 to {}", where, window, max_rate_window.count()));
  return rate_limit{static_cast<std::size_t>(max), std::chrono::milliseconds(window)};
}

grouping_rules& grouping_rules::add(grouping_rule rule) {
  check_template(rule.key);
  if (rule.rate) check_rate_limit(*rule.rate, "grouping rule rate");
  rules_.push_back(std::move(rule));
  return *this;
}

grouping_rules grouping_rules::from_json(const boost::json::value& config) {
  grouping_rules out;
  if (!config.is_object()) throw std::invalid_argument("grouping config is not a JSON object");
  check_fields(config.as_object(), "grouping", {"rules"});
  auto* rules = config.as_object().if_contains("rules");
  if (rules == nullptr) return out;
  if (!rules->is_array()) throw std::invalid_argument("grouping 'rules' is not an array");
  std::size_t index = 0;
  for (auto& r : rules->as_array()) {
    auto where = fmt::format("grouping rules[{}]", index++);
    if (!r.is_object()) throw std::invalid_argument(fmt::format("{} is not an object", where));
    check_fields(r.as_object(), where,
                 {"match", "key", "on_failure", "max_group_size", "rate", "concurrency", "weight"});
    grouping_rule rule;
    auto* key = r.as_object().if_contains("key");
    if (key == nullptr || !key->is_string())
      throw std::invalid_argument(fmt::format("{}.key is missing or not a string", where));
    rule.key = std::string(key->as_string());
    if (auto* match = r.as_object().if_contains("match")) {
      if (!match->is_object()) throw std::invalid_argument(fmt::format("{}.match is not an object", where));
      for (auto& [name, value] : match->as_object()) {
        if (!value.is_string())
          throw std::invalid_argument(fmt::format("{}.match.{} is not a string", where, std::string_view(name)));
        rule.match[std::string(name)] = std::string(value.as_string());
      }
    }
    if (auto* policy = r.as_object().if_contains("on_failure")) {
      if (!policy->is_string()) throw std::invalid_argument(fmt::format("{}.on_failure is not a string", where));
      try {
        rule.on_failure = parse_failure_policy(policy->as_string());
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(fmt::format("{}.on_failure: {}", where, e.what()));
      }
    }
    if (auto* max = r.as_object().if_contains("max_group_size")) {
      if (!max->is_int64() && !max->is_uint64())
        throw std::invalid_argument(fmt::format("{}.max_group_size is not a whole number", where));
      if (!max->is_int64() || max->as_int64() < 1 || static_cast<std::uint64_t>(max->as_int64()) > max_group_size_limit)
        throw std::invalid_argument(
            fmt::format("{}.max_group_size is {}; it must be from 1 to {}", where, shown(*max), max_group_size_limit));
      rule.max_group_size = static_cast<std::size_t>(max->as_int64());
    }
    if (auto* rate = r.as_object().if_contains("rate")) rule.rate = rate_limit_from_json(*rate, where + ".rate");
    if (auto* n = r.as_object().if_contains("concurrency")) {
      if (!n->is_int64() || n->as_int64() < 1 || static_cast<std::uint64_t>(n->as_int64()) > max_group_concurrency)
        throw std::invalid_argument(fmt::format("{}.concurrency is {}; it must be a whole number from 1 to {}", where,
                                                shown(*n), max_group_concurrency));
      rule.concurrency = static_cast<std::size_t>(n->as_int64());
    }
    if (auto* w = r.as_object().if_contains("weight")) {
      if (!w->is_int64() || w->as_int64() < 1 || static_cast<std::uint64_t>(w->as_int64()) > max_group_weight)
        throw std::invalid_argument(
            fmt::format("{}.weight is {}; it must be a whole number from 1 to {}", where, shown(*w), max_group_weight));
      rule.weight = static_cast<std::size_t>(w->as_int64());
    }
    try {
      out.add(std::move(rule));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(fmt::format("{}: {}", where, e.what()));
    }
  }
  return out;
}

std::optional<std::string> grouping_rules::group_for(std::string_view type, const boost::json::value& payload) const {
  auto choice = choose(type, payload);
  if (!choice) return std::nullopt;
  return std::move(choice->group);
}

std::optional<group_choice> grouping_rules::choose(std::string_view type, const boost::json::value& payload) const {
  for (const auto& rule : rules_) {
    bool matches = true;
    for (const auto& [name, wanted] : rule.match) {
      auto value = field_text(name, type, payload);
      if (!value || (wanted != "*" && *value != wanted)) {
        matches = false;
        break;
      }
    }
    if (!matches) continue;
    std::string key;
    for (std::size_t i = 0; i < rule.key.size() && matches; ++i) {
      if (rule.key[i] != '{') {
        key += rule.key[i];
        continue;
      }
      auto close = rule.key.find('}', i);
      auto value = field_text(std::string_view(rule.key).substr(i + 1, close - i - 1), type, payload);
      if (!value)
        matches = false;
      else
        key += *value;
      i = close;
    }
    if (!matches) continue;
    // "" would mean ungrouped: not what the rule asks for.
    if (key.empty())
      throw std::invalid_argument(fmt::format("grouping rule with key '{}' gives this job an empty group", rule.key));
    return group_choice{std::move(key), rule.on_failure, rule.max_group_size, rule.rate, rule.concurrency, rule.weight};
  }
  return std::nullopt;
}

}  // namespace jobrt
