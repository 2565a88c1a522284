#include <jobrt/redis/request.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

using jobrt::redis::request;

TEST_CASE("a command is encoded as a RESP array of bulk strings") {
  request r("SET", "key", "value");
  CHECK(r.payload() == "*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nvalue\r\n");
  CHECK(r.size() == 1);
  CHECK_FALSE(r.has_blocking_command());
}

TEST_CASE("integers - ranges and binary arguments") {
  std::vector<std::string> keys{"a", "b"};
  using namespace std::string_literals;
  std::string binary = "x\0y\r\n"s;
  request r("MSET", keys, 42, binary, -7);
  CHECK(r.payload() == "*6\r\n$4\r\nMSET\r\n$1\r\na\r\n$1\r\nb\r\n$2\r\n42\r\n$5\r\nx\0y\r\n\r\n$2\r\n-7\r\n"s);
}

TEST_CASE("a pipeline counts its commands and flags blocking ones in any case") {
  request r;
  r.push("GET", "a").push("blmove", "a", "b", "LEFT", "RIGHT", 1);
  CHECK(r.size() == 2);
  CHECK(r.has_blocking_command());
  request s("subscribe", "ch");
  CHECK(s.has_blocking_command());
  CHECK(s.has_pubsub_command());
  request both("GET", "x");
  both.append(r);
  CHECK(both.size() == 3);
  CHECK(both.has_blocking_command());
}

TEST_CASE("a MULTI without its EXEC or DISCARD in the same request, and HELLO, disturb the connection") {
  CHECK(request("multi").disturbs_connection());
  CHECK(request("HELLO", "3").disturbs_connection());
  CHECK_FALSE(request("GET", "a").disturbs_connection());
  request tx("MULTI");
  tx.push("SET", "a", "1");
  CHECK(tx.disturbs_connection());
  tx.push("exec");
  CHECK_FALSE(tx.disturbs_connection());
  request dropped("MULTI");
  dropped.push("DISCARD");
  CHECK_FALSE(dropped.disturbs_connection());
  // Pipelines joined: an EXEC in the second ends the first's MULTI; a MULTI of its own reopens.
  request open("MULTI");
  open.append(request("EXEC"));
  CHECK_FALSE(open.disturbs_connection());
  request again("MULTI");
  request closes_then_opens("EXEC");
  closes_then_opens.push("MULTI");
  again.append(closes_then_opens);
  CHECK(again.disturbs_connection());
  request plain("GET", "a");
  plain.append(request("EXEC"));  // (an EXEC with no MULTI: an error reply, one like any other)
  CHECK_FALSE(plain.disturbs_connection());
}

TEST_CASE("commands that change the connection itself disturb it - other CLIENT subcommands do not") {
  for (const char* command : {"select", "AUTH", "reset", "QUIT"}) CHECK(request(command, "1").disturbs_connection());
  CHECK(request("CLIENT", "reply", "OFF").disturbs_connection());
  CHECK(request("client", "REPLY", "SKIP").disturbs_connection());
  CHECK_FALSE(request("CLIENT", "SETNAME", "reply").disturbs_connection());
  CHECK_FALSE(request("CLIENT", "ID").disturbs_connection());
  CHECK_FALSE(request("GET", "reply").disturbs_connection());  // REPLY only as CLIENT's subcommand
  request later("PING");
  later.push("CLIENT", "REPLY", "ON");  // in a pipeline, and appended
  CHECK(later.disturbs_connection());
  request joined("GET", "a");
  joined.append(request("SELECT", "2"));
  CHECK(joined.disturbs_connection());
  request client("CLIENT");  // (CLIENT alone: an error reply; the next command's argument is not read)
  client.push("GET", "reply");
  CHECK_FALSE(client.disturbs_connection());
}

TEST_CASE("unsigned and nested arguments are encoded as they are") {
  using namespace std::string_literals;
  request big("SET", "k", std::uint64_t{18446744073709551615u});
  CHECK(big.payload() == "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$20\r\n18446744073709551615\r\n"s);
  std::vector<std::vector<std::string>> nested{{"a", "b"}, {"c"}};
  request r("DEL", nested);
  CHECK(r.payload() == "*4\r\n$3\r\nDEL\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n"s);
  CHECK(request("UNSUBSCRIBE", "x").has_pubsub_command());
  CHECK(request("monitor").has_pubsub_command());
}
