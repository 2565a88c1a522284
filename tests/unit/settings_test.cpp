// The worker config file: what it accepts, and that a bad one is refused naming the field.
#include <jobrt/settings.hpp>

#include <doctest/doctest.h>
#include <boost/json/parse.hpp>

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
    "plugins": ["a.so", "b.so"],
    "handlers": {"tenant_import": {"retry": {"initial_ms": 500, "factor": 3, "max_ms": 9000, "jitter": 0}}},
    "queues": [
      {"name": "imports", "concurrency": 20, "lease_ttl_ms": 6000, "watchdog_ms": 1000, "burst": 2,
       "follow": "pipelined", "claim_wait_ms": 2000, "on_failure": "halt", "retry": {"initial_ms": 100},
       "grouping": {"rules": [{"match": {"app": "crm"}, "key": "{entity}:{tenant}", "on_failure": "skip"}]},
       "dead_letters": {"max_count": 50, "max_age_ms": 60000}},
      {"name": "mail"}
    ]})"));
  CHECK(s.redis_url == "redis://127.0.0.1:7000");
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
  CHECK(q.worker.follow == follow_policy::pipelined);
  CHECK(q.worker.on_failure == failure_policy::halt);
  CHECK(q.worker.retry_backoff.initial == std::chrono::milliseconds(100));
  CHECK(q.worker.dead_max_count == 50);
  auto choice = q.rules.choose("import", boost::json::parse(R"({"app":"crm","entity":"orders","tenant":"t7"})"));
  REQUIRE(choice);
  CHECK(choice->group == "orders:t7");
  CHECK(choice->on_failure == failure_policy::skip);
  CHECK(s.queues[1].worker.concurrency == worker_options{}.concurrency);
  CHECK(s.queues[1].worker.follow == follow_policy::after_commit);
}

TEST_CASE("settings - a bad file is refused naming the field") {
  CHECK(refusal(R"([])") == "config: is not an object");
  CHECK(refusal(R"({"queus": []})") == "config: unknown field \"queus\" (known: redis, plugins, handlers, queues)");
  CHECK(refusal(R"({"queues": [{"concurrency": 2}]})") == "config.queues[0]: has no \"name\"");
  CHECK(refusal(R"({"queues": [{"name": "a", "concurrency": 0}]})") ==
        "config.queues[0].concurrency: is not an integer from 1 to 100000");
  CHECK(refusal(R"({"queues": [{"name": "a", "lease_ttl_ms": 99999999999999}]})") ==
        "config.queues[0].lease_ttl_ms: is not an integer from 100 to 86400000");
  CHECK(refusal(R"({"queues": [{"name": "a", "burst": 5000}]})") ==
        "config.queues[0].burst: is not an integer from 1 to 1000");
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
        "config.queues[0].grouping: grouping rules[0]: unknown field \"on_faliure\" (known: match, key, on_failure)");
  CHECK(refusal(R"({"plugins": "a.so"})") == "config.plugins: is not an array");
}

TEST_CASE("settings - from_file names the file") {
  try {
    settings::from_file("/nonexistent/jobrt.json");
    FAIL("accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) == "config /nonexistent/jobrt.json: cannot open it");
  }
}
