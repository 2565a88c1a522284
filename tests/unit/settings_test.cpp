// The worker config file: what it accepts, and that a bad one is refused naming the field.
#include <jobrt/redis_backend.hpp>
#include <jobrt/settings.hpp>

#include <doctest/doctest.h>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace jobrt;

namespace {

std::string refusal(std::string_view text) {
  try {
    settings::from_json(boost::json::parse(text));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("settings - a full config file") {
  auto s = settings::from_json(boost::json::parse(R"({
    "redis": "redis://127.0.0.1:7000",
    "durability": "replicated",
    "plugins": ["a.so", "b.so"],
    "handlers": {"tenant_import": {"retry": {"initial_ms": 500, "factor": 3, "max_ms": 9000, "jitter": 0}}},
    "queues": [
      {"name": "imports", "concurrency": 20, "lease_ttl_ms": 6000, "watchdog_ms": 1000, "burst": 2, "shards": 16,
       "max_result_bytes": 1000, "max_group_size": 500, "group_rate": {"max": 7, "window_ms": 2000},
       "group_concurrency": 4, "group_weight": 3,
       "follow": "pipelined", "claim_wait_ms": 2000, "on_failure": "halt", "retry": {"initial_ms": 100},
       "grouping": {"rules": [{"match": {"app": "crm"}, "key": "{entity}:{tenant}", "on_failure": "skip",
                               "max_group_size": 20, "rate": {"max": 3, "window_ms": 100},
                               "concurrency": 2, "weight": 5}]},
       "dead_letters": {"max_count": 50, "max_age_ms": 60000}, "schedules": false},
      {"name": "mail", "rate_limit": {"max": 50, "window_ms": 1000}}
    ]})"));
  CHECK(s.redis_url == "redis://127.0.0.1:7000");
  CHECK(s.durability == durability::replicated);
  CHECK(s.plugins == std::vector<std::string>{"a.so", "b.so"});
  REQUIRE(s.type_backoffs.count("tenant_import") == 1);
  CHECK(s.type_backoffs["tenant_import"].factor == 3.0);
  CHECK(s.type_backoffs["tenant_import"].max == std::chrono::milliseconds(9000));
  REQUIRE(s.queues.size() == 2);
  auto& q = s.queues[0];
  CHECK(q.worker.queue == "imports");
  CHECK(q.worker.concurrency == 20);
  CHECK(q.worker.lease_ttl == std::chrono::milliseconds(6000));
  CHECK(q.worker.watchdog_period == std::chrono::milliseconds(1000));
  CHECK(q.worker.burst == 2);
  CHECK(q.worker.max_result_bytes == 1000);
  CHECK(q.shards == 16);
  CHECK(s.queues[1].shards == 0);  // (not given: as stored)
  CHECK(q.worker.follow == follow_policy::pipelined);
  CHECK(q.worker.on_failure == failure_policy::halt);
  CHECK(q.worker.retry_backoff.initial == std::chrono::milliseconds(100));
  CHECK(q.worker.dead_max_count == 50);
  CHECK_FALSE(q.worker.schedules);
  CHECK(s.queues[1].worker.schedules);  // (not given: on)
  auto choice = q.rules.choose("import", boost::json::parse(R"({"app":"crm","entity":"orders","tenant":"t7"})"));
  REQUIRE(choice);
  CHECK(choice->group == "orders:t7");
  CHECK(choice->on_failure == failure_policy::skip);
  CHECK(choice->max_group_size == std::size_t{20});
  CHECK(choice->rate == rate_limit{3, std::chrono::milliseconds(100)});
  CHECK(choice->concurrency == std::size_t{2});
  CHECK(q.group_concurrency == 4);
  CHECK(s.queues[1].group_concurrency == 1);
  CHECK(q.group_weight == 3);
  CHECK(s.queues[1].group_weight == 1);
  CHECK(q.max_group_size == 500);
  CHECK(q.group_rate == rate_limit{7, std::chrono::milliseconds(2000)});
  CHECK_FALSE(s.queues[1].group_rate);
  CHECK_FALSE(q.worker.rate_limit);
  CHECK(s.queues[1].worker.rate_limit == rate_limit{50, std::chrono::milliseconds(1000)});
  CHECK(s.queues[1].max_group_size == 0);
  CHECK(s.queues[1].worker.concurrency == worker_options{}.concurrency);
  CHECK(s.queues[1].worker.follow == follow_policy::after_commit);
}

TEST_CASE("settings - a bad file is refused naming the field") {
  CHECK(refusal(R"([])") == "config: is not an object");
  CHECK(refusal(R"({"queus": []})") ==
        "config: unknown field \"queus\" (known: redis, durability, plugins, handlers, queues)");
  CHECK(refusal(R"({"durability": "sync"})") ==
        "config.durability: 'sync' is not a durability: 'primary' or 'replicated'");
  CHECK(refusal(R"({"queues": [{"concurrency": 2}]})") == "config.queues[0]: has no \"name\"");
  CHECK(refusal(R"({"queues": [{"name": "a", "concurrency": 0}]})") ==
        "config.queues[0].concurrency: is not an integer from 1 to 100000");
  CHECK(refusal(R"({"queues": [{"name": "a", "lease_ttl_ms": 99999999999999}]})") ==
        "config.queues[0].lease_ttl_ms: is not an integer from 100 to 86400000");
  CHECK(refusal(R"({"queues": [{"name": "a", "schedules": "no"}]})") ==
        "config.queues[0].schedules: must be true or false");
  CHECK(refusal(R"({"queues": [{"name": "a", "burst": 5000}]})") ==
        "config.queues[0].burst: is not an integer from 1 to 1000");
  CHECK(refusal(R"({"queues": [{"name": "a", "max_group_size": 0}]})") ==
        "config.queues[0].max_group_size: is not an integer from 1 to 1000000000");
  CHECK(refusal(R"({"queues": [{"name": "a", "grouping": {"rules": [{"key": "{t}", "max_group_size": -2}]}}]})") ==
        "config.queues[0].grouping: grouping rules[0].max_group_size is -2; it must be from 1 to 1000000000");
  CHECK(refusal(R"({"queues": [{"name": "a", "group_concurrency": 0}]})") ==
        "config.queues[0].group_concurrency: is not an integer from 1 to 10000");
  CHECK(refusal(R"({"queues": [{"name": "a", "group_weight": 101}]})") ==
        "config.queues[0].group_weight: is not an integer from 1 to 100");
  CHECK(refusal(R"({"queues": [{"name": "a", "grouping": {"rules": [{"key": "{t}", "weight": 0}]}}]})") ==
        "config.queues[0].grouping: grouping rules[0].weight is 0; it must be a whole number from 1 to 100");
  CHECK(refusal(R"({"queues": [{"name": "a", "grouping": {"rules": [{"key": "{t}", "concurrency": 0}]}}]})") ==
        "config.queues[0].grouping: grouping rules[0].concurrency is 0; it must be a whole number from 1 to 10000");
  CHECK(refusal(R"({"queues": [{"name": "a", "max_result_bytes": -1}]})") ==
        "config.queues[0].max_result_bytes: is not an integer from 0 to 16777216");
  CHECK(refusal(R"({"queues": [{"name": "a", "lease_ttl_ms": 99999999999999999999}]})") ==
        "config.queues[0].lease_ttl_ms: is not an integer from 100 to 86400000");
  CHECK(refusal(R"({"queues": [{"name": "a", "on_failure": "retry"}]})") ==
        "config.queues[0].on_failure: failure policy 'retry' is not one of hold, skip, halt");
  CHECK(refusal(R"({"queues": [{"name": "a", "follow": "eager"}]})") ==
        "config.queues[0].follow: follow policy 'eager' is not one of after-commit, pipelined");
  CHECK(refusal(R"({"queues": [{"name": "a"}, {"name": "a"}]})") ==
        "config.queues[1].name: queue \"a\" is named twice");
  CHECK(refusal(R"({"queues": [{"name": "a", "retry": {"jitter": 2}}]})") ==
        "config.queues[0].retry.jitter: is not between 0 and 1");
  CHECK(refusal(R"({"queues": [{"name": "a", "lease_ttl_ms": 1000, "watchdog_ms": 1000}]})") ==
        "config.queues[0].watchdog_ms: must be shorter than lease_ttl_ms");
  CHECK(refusal(R"({"queues": [{"name": "a", "grouping": {"rules": [{"match": {}}]}}]})") ==
        "config.queues[0].grouping: grouping rules[0].key is missing or not a string");
  CHECK(refusal(R"({"handlers": {"t": {"retries": 3}}})") ==
        "config.handlers.t: unknown field \"retries\" (known: retry)");
  CHECK(refusal(R"({"queues": [{"name": "a", "grouping": {"rule": []}}]})") ==
        "config.queues[0].grouping: grouping: unknown field \"rule\" (known: rules)");
  CHECK(refusal(R"({"queues": [{"name": "a", "grouping": {"rules": [{"key": "{t}", "on_faliure": "halt"}]}}]})") ==
        "config.queues[0].grouping: grouping rules[0]: unknown field \"on_faliure\" (known: match, key, on_failure, "
        "max_group_size, rate, concurrency, weight)");
  CHECK(refusal(R"({"queues": [{"name": "a", "group_rate": {"max": 0, "window_ms": 1000}}]})") ==
        "config.queues[0].group_rate.max is 0; it must be from 1 to 10000");
  CHECK(refusal(R"({"queues": [{"name": "a", "group_rate": {"max": 5}}]})") ==
        "config.queues[0].group_rate.window_ms is missing");
  CHECK(
      refusal(
          R"({"queues": [{"name": "a", "grouping": {"rules": [{"key": "{t}", "rate": {"max": 2, "window_ms": 0}}]}}]})") ==
      "config.queues[0].grouping: grouping rules[0].rate.window_ms is 0; it must be from 1 to 86400000");
  CHECK(refusal(R"({"plugins": "a.so"})") == "config.plugins: is not an array");
  CHECK(refusal(R"({"queues": [{"name": "a", "retry": {"initial_ms": 5000, "max_ms": 4000}}]})") ==
        "config.queues[0].retry.max_ms: is below initial_ms (5000)");
  CHECK(refusal(R"({"queues": [{"name": "a}:b"}]})") ==
        "config.queues[0].name: \"a}:b\" holds '{' or '}', which would break its keys' hash tag");
}

TEST_CASE("settings - from_file names the file") {
  try {
    settings::from_file("/nonexistent/jobrt.json");
    FAIL("accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) == "config /nonexistent/jobrt.json: cannot open it");
  }
}

// docs/CONFIG.md against the parser. Its tables list every key as a path ("queues[].burst",
// "handlers.<type>.retry"), one row each, with "required" in the default column of the keys that
// must be given; its complete example uses every key.
namespace {

namespace json = boost::json;

std::string read_doc() {
  std::ifstream in(JOBRT_CONFIG_DOC);
  if (!in) throw std::runtime_error("cannot open " JOBRT_CONFIG_DOC);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string trim(std::string_view s) {
  auto b = s.find_first_not_of(' ');
  auto e = s.find_last_not_of(' ');
  return b == std::string_view::npos ? std::string() : std::string(s.substr(b, e - b + 1));
}

std::vector<std::string> split(std::string_view s, char by) {
  std::vector<std::string> parts;
  for (std::size_t at = 0;;) {
    auto next = s.find(by, at);
    parts.emplace_back(s.substr(at, next - at));
    if (next == std::string_view::npos) return parts;
    at = next + 1;
  }
}

struct doc_key {
  std::string path;
  bool required = false;
};

// The rows of the key tables: "| `path` | type | default | allowed | meaning |".
std::vector<doc_key> documented_keys(const std::string& doc) {
  std::vector<doc_key> keys;
  std::istringstream in(doc);
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("| `")) continue;
    auto cells = split(line, '|');
    auto key = trim(cells.at(1));
    keys.push_back({key.substr(1, key.size() - 2), trim(cells.at(3)) == "required"});
  }
  return keys;
}

// Every ```json block, and which of them follows the heading "## Complete example".
struct doc_examples {
  std::vector<std::string> all;
  std::optional<std::string> complete;
};

doc_examples examples_of(const std::string& doc) {
  doc_examples out;
  std::istringstream in(doc);
  bool under_complete = false, in_block = false;
  std::string block;
  for (std::string line; std::getline(in, line);) {
    if (in_block && line == "```") {
      in_block = false;
      out.all.push_back(block);
      if (under_complete && !out.complete) out.complete = block;
    } else if (in_block) {
      block += line + "\n";
    } else if (line == "```json") {
      in_block = true;
      block.clear();
    } else if (line.starts_with("#")) {
      under_complete = line == "## Complete example";
    }
  }
  return out;
}

std::string parent_of(const std::string& path) {
  auto dot = path.rfind('.');
  return dot == std::string::npos ? std::string() : path.substr(0, dot);
}
std::string last_of(const std::string& path) { return split(path, '.').back(); }
// "queues[]" names the field "queues"; "<type>" stands for any field name.
std::string field_of(const std::string& token) {
  return token.ends_with("[]") ? token.substr(0, token.size() - 2) : token;
}
bool any_name(const std::string& token) { return token.starts_with("<"); }

// The part of `example` (an object at the level `prefix`) that leads to the key
// tokens[i...], with the required keys of every level on the way; nullopt when the example
// does not have that key.
std::optional<json::object> lead_to(const json::object& example, const std::vector<std::string>& tokens, std::size_t i,
                                    const std::string& prefix, const std::set<std::string>& required) {
  json::object out;
  for (const auto& r : required)
    if (parent_of(r) == prefix)
      if (auto* v = example.if_contains(field_of(last_of(r)))) out[field_of(last_of(r))] = *v;
  const auto& token = tokens[i];
  auto path = prefix.empty() ? token : prefix + "." + token;
  std::string key;
  const json::value* child = nullptr;
  if (any_name(token)) {
    if (example.empty()) return std::nullopt;
    key = example.begin()->key();
    child = &example.begin()->value();
  } else {
    key = field_of(token);
    child = example.if_contains(key);
    if (!child) return std::nullopt;
  }
  if (i + 1 == tokens.size()) {
    out[key] = *child;
    return out;
  }
  if (token.ends_with("[]")) {
    if (!child->is_array()) return std::nullopt;
    for (const auto& e : child->as_array()) {
      if (!e.is_object()) continue;
      if (auto inner = lead_to(e.as_object(), tokens, i + 1, path, required)) {
        out[key] = json::array{json::value(std::move(*inner))};
        return out;
      }
    }
    return std::nullopt;
  }
  if (!child->is_object()) return std::nullopt;
  auto inner = lead_to(child->as_object(), tokens, i + 1, path, required);
  if (!inner) return std::nullopt;
  out[key] = std::move(*inner);
  return out;
}

// The object at `path` inside a config built by lead_to (the first entry of arrays and maps).
json::object& object_at_path(json::object& root, const std::string& path) {
  json::object* o = &root;
  if (path.empty()) return *o;
  for (const auto& token : split(path, '.')) {
    json::value* v = any_name(token) ? &o->begin()->value() : &o->at(field_of(token));
    if (v->is_array()) v = &v->as_array().at(0);
    o = &v->as_object();
  }
  return *o;
}

std::string listed(const std::set<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

struct doc_and_parser {
  std::vector<doc_key> keys;
  std::set<std::string> required;
  doc_examples examples;
  json::object complete;

  doc_and_parser() {
    auto doc = read_doc();
    keys = documented_keys(doc);
    for (const auto& k : keys)
      if (k.required) required.insert(k.path);
    examples = examples_of(doc);
    if (!examples.complete) throw std::runtime_error("docs/CONFIG.md has no json block under \"## Complete example\"");
    complete = json::parse(*examples.complete).as_object();
  }

  // The smallest config that sets `path` to the complete example's value.
  std::optional<json::object> minimal(const std::string& path) const {
    return lead_to(complete, split(path, '.'), 0, "", required);
  }
};

}  // namespace

TEST_CASE("settings - docs/CONFIG.md: every JSON example is a config the parser accepts") {
  doc_and_parser d;
  CHECK(d.examples.all.size() >= 2);
  for (const auto& example : d.examples.all) {
    INFO("example: ", example);
    CHECK(refusal(example) == "accepted");
  }
}

TEST_CASE("settings - docs/CONFIG.md: each key it lists is accepted on its own, and required ones are required") {
  doc_and_parser d;
  REQUIRE(d.keys.size() > 10);
  std::set<std::string> seen;
  for (const auto& k : d.keys) {
    INFO("key: ", k.path);
    CHECK(seen.insert(k.path).second);  // listed once
    auto config = d.minimal(k.path);
    REQUIRE_MESSAGE(config, "the complete example does not use it");
    INFO("config: ", json::serialize(*config));
    CHECK(refusal(json::serialize(*config)) == "accepted");
    if (k.required) {
      object_at_path(*config, parent_of(k.path)).erase(field_of(last_of(k.path)));
      auto why = refusal(json::serialize(*config));
      CHECK(why != "accepted");
      CHECK(why.find(field_of(last_of(k.path))) != std::string::npos);  // naming it
    }
  }
}

TEST_CASE("settings - docs/CONFIG.md: at each level it lists exactly the keys the parser knows") {
  doc_and_parser d;
  std::map<std::string, std::set<std::string>> documented;  // level → its keys' names
  for (const auto& k : d.keys) documented[parent_of(k.path)].insert(field_of(last_of(k.path)));
  std::size_t levels = 0;
  for (const auto& [level, names] : documented) {
    INFO("level: \"", level, "\"");
    if (any_name(*names.begin())) continue;  // a map (handlers: job type → settings), any name goes
    ++levels;
    // The parser's refusal of an unknown field lists the fields it knows there.
    auto config = d.minimal(level.empty() ? *names.begin() : level);
    REQUIRE(config);
    object_at_path(*config, level).emplace("no_such_field", 0);
    auto why = refusal(json::serialize(*config));
    INFO("refusal: ", why);
    auto at = why.find("unknown field \"no_such_field\" (known: ");
    REQUIRE(at != std::string::npos);
    REQUIRE(why.ends_with(")"));
    auto list = why.substr(why.find("(known: ", at) + 8);
    list.pop_back();
    std::set<std::string> known;
    for (auto& name : split(list, ',')) known.insert(trim(name));
    CHECK(listed(known) == listed(names));
  }
  // the file, handlers.<type>, two backoffs, a queue, grouping, a rule, dead_letters, bridge,
  // group_rate, a rule's rate and rate_limit
  CHECK(levels == 12);
}
