// How a bridge turns a message into a job (bridge_mapping), with no server.
#include <jobrt/bridge.hpp>
#include <jobrt/settings.hpp>

#include <doctest/doctest.h>
#include <boost/json.hpp>

using namespace jobrt;

namespace {

bridge_message message(std::vector<std::pair<std::string, std::string>> fields) {
  bridge_message m;
  m.fields = std::move(fields);
  m.default_id = "s@1-0";
  return m;
}

std::string refusal(const std::string& json) {
  try {
    bridge_mapping::from_json(boost::json::parse(json));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("bridge mapping: type, payload, id and group from the fields") {
  auto m = map_message(message({{"type", "import"}, {"payload", R"({"tenant":7})"}, {"id", "msg-1"}, {"group", "t7"}}),
                       bridge_mapping{});
  CHECK(m.rejected.empty());
  CHECK(m.job.type == "import");
  CHECK(m.job.payload == boost::json::parse(R"({"tenant":7})"));
  CHECK(m.job.id == "msg-1");
  CHECK(m.job.group == std::optional<std::string>("t7"));
  CHECK(m.job.keep == std::chrono::hours(1));
}

TEST_CASE(
    "bridge mapping: without a payload field, the other fields are the payload, and without an id the source gives "
    "it") {
  auto m = map_message(message({{"type", "import"}, {"tenant", "7"}, {"entity", "stock"}}), bridge_mapping{});
  CHECK(m.rejected.empty());
  CHECK(m.job.payload == boost::json::parse(R"({"tenant":"7","entity":"stock"})"));
  CHECK(m.job.id == "s@1-0");
  CHECK_FALSE(m.job.group);  // the producer's grouping rules decide
}

TEST_CASE("bridge mapping: renamed fields, a default type and a keep") {
  auto how = bridge_mapping::from_json(boost::json::parse(
      R"({"type_field": "kind", "type": "fallback", "payload_field": "body", "id_field": "key", "group_field": "tenant",
          "keep_ms": 60000})"));
  auto m = map_message(message({{"body", "[1,2]"}, {"key", "k-9"}, {"tenant", "acme"}, {"type", "ignored"}}), how);
  CHECK(m.rejected.empty());
  CHECK(m.job.type == "fallback");
  CHECK(m.job.payload == boost::json::parse("[1,2]"));
  CHECK(m.job.id == "k-9");
  CHECK(m.job.group == std::optional<std::string>("acme"));
  CHECK(m.job.keep == std::chrono::minutes(1));
  CHECK(map_message(message({{"kind", "x"}}), how).job.type == "x");
}

TEST_CASE("bridge mapping: messages that cannot be jobs are refused, naming the field") {
  CHECK(map_message(message({{"payload", "{}"}}), bridge_mapping{}).rejected ==
        "no field type to give the job's type, and no default type");
  CHECK(map_message(message({{"type", ""}}), bridge_mapping{}).rejected == "field type (the job's type) is empty");
  CHECK(map_message(message({{"type", "t"}, {"id", ""}}), bridge_mapping{}).rejected ==
        "field id (the job's id) is empty");
  CHECK(map_message(message({{"type", "t"}, {"payload", "{1"}}), bridge_mapping{})
            .rejected.starts_with("field payload is not JSON: "));
}

TEST_CASE("bridge mapping: a bad mapping is refused, naming the field") {
  CHECK(refusal("[]") == "bridge: must be an object");
  CHECK(refusal(R"({"type_field": ""})") == "bridge.type_field: is empty");
  CHECK(refusal(R"({"type": 3})") == "bridge.type: must be a string");
  CHECK(refusal(R"({"keep_ms": 0})") == "bridge.keep_ms: 0 is not a whole number from 1 to 31536000000");
  CHECK(refusal(R"({"kep_ms": 1})").starts_with("bridge: unknown field \"kep_ms\" (known: type_field, type,"));
  CHECK_THROWS_WITH_AS(
      settings::from_json(boost::json::parse(R"({"queues": [{"name": "q", "bridge": {"keep_ms": -1}}]})")),
      "config.queues[0].bridge.keep_ms: -1 is not a whole number from 1 to 31536000000", std::invalid_argument);
}
