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

TEST_CASE("bridge mapping: a RabbitMQ message's body is its payload") {
  bridge_message m;
  m.fields = {{"type", "import"}, {"group", "t7"}};
  m.body = R"({"file":"a.csv"})";
  m.default_id = "sha256-00";
  auto mapped = map_message(m, bridge_mapping{});
  CHECK(mapped.rejected.empty());
  CHECK(mapped.job.payload == boost::json::parse(R"({"file":"a.csv"})"));
  CHECK(mapped.job.id == "sha256-00");
  m.body = "not json";
  CHECK(map_message(m, bridge_mapping{}).rejected.starts_with("the message body is not JSON: "));
}

TEST_CASE("bridge mapping: AMQP URLs, amqps:// with its TLS parameters, and the ones refused naming what is wrong") {
  auto s = amqp_source::from_url("amqp://u:p%40ss@mq.example:5673/prod%2Fa?queue=imports&prefetch=50&batch=10");
  CHECK(s.host == "mq.example");
  CHECK(s.port == 5673);
  CHECK(s.user == "u");
  CHECK(s.password == "p@ss");
  CHECK(s.vhost == "prod/a");
  CHECK(s.queue == "imports");
  CHECK(s.dead == "imports.dead");
  CHECK(s.prefetch == 50);
  CHECK(s.batch == 10);
  CHECK(s.address() == "amqp://u@mq.example:5673/prod%2Fa?queue=imports");
  // Names percent-decoded, and address() writes what parses back.
  auto spaced = amqp_source::from_url("amqp://h/v%20h?queue=my%20imports%2Bx%26y");
  CHECK(spaced.queue == "my imports+x&y");
  CHECK(spaced.vhost == "v h");
  CHECK(spaced.address() == "amqp://guest@h:5672/v%20h?queue=my%20imports%2Bx%26y");
  CHECK(amqp_source::from_url(spaced.address()).queue == spaced.queue);
  CHECK(amqp_source::from_url(spaced.address()).vhost == spaced.vhost);
  auto plain = amqp_source::from_url("amqp://h?queue=q");
  CHECK(plain.user == "guest");
  CHECK(plain.vhost == "/");
  CHECK(plain.port == 5672);
  auto refusal = [](const char* url) {
    try {
      amqp_source::from_url(url);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(refusal("amqp://h?queue=a+b") ==
        "AMQP URL 'amqp://h?queue=a+b': parameter queue 'a+b' holds a bare '+': write %2B for a plus, %20 for a space");
  CHECK(refusal("amqp://h?queue=q&dead=d+1").find("parameter dead 'd+1' holds a bare '+'") != std::string::npos);
  auto marked = amqp_source::from_url("amqp://h/%7Bv%7D?queue=%7Bq%7D%5B1%5D");
  CHECK(marked.address() == "amqp://guest@h:5672/%7Bv%7D?queue=%7Bq%7D%5B1%5D");
  CHECK(amqp_source::from_url(marked.address()).queue == "{q}[1]");
  CHECK(refusal("amqp://u:secret@h/") == "AMQP URL 'amqp://u:***@h/': the queue is missing (?queue=<queue>)");
  auto tls = amqp_source::from_url("amqps://u:p@mq.example/%2F?queue=q&ca=/ca.pem&cert=/c.pem&key=/k.pem");
  CHECK(tls.tls);
  CHECK(tls.port == 5671);
  CHECK(tls.tls_ca_file == "/ca.pem");
  CHECK(tls.tls_cert_file == "/c.pem");
  CHECK(tls.tls_key_file == "/k.pem");
  CHECK(tls.tls_verify);
  CHECK(tls.address() == "amqps://u@mq.example:5671/%2F?queue=q");
  CHECK_FALSE(amqp_source::from_url("amqps://h?queue=q&verify=none").tls_verify);
  CHECK_FALSE(plain.tls);
  CHECK(refusal("amqps://h?queue=q&verify=maybe").find("verify='maybe': it is 'peer' (the default) or 'none'") !=
        std::string::npos);
  CHECK(refusal("amqps://h?queue=q&cert=/c.pem").find("cert and key go together") != std::string::npos);
  CHECK(refusal("amqp://h?queue=q&ca=/ca.pem").find("unknown parameter 'ca'") != std::string::npos);
  CHECK(refusal("amqp://h?queue=q&ca=/ca.pem").find("amqps:// also takes ca, cert, key, verify") != std::string::npos);
  CHECK(refusal("amqpx://h?queue=q").find("scheme 'amqpx' is neither amqp:// nor amqps://") != std::string::npos);
  CHECK(refusal("amqp://h?queue=q&prefetch=0").find("parameter prefetch '0' is not a whole number from 1 to 65535") !=
        std::string::npos);
  CHECK(refusal("amqp://h?queue=q&exchange=x").find("unknown parameter 'exchange'") != std::string::npos);
  CHECK(refusal("amqp://h?queue=q&dead=q").find("the dead-letter queue is the queue itself") != std::string::npos);
}
