#include "redis/resp_parser.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using jobrt::redis::reply;
using jobrt::redis::reply_kind;
using jobrt::redis::detail::resp_parser;

namespace {
std::vector<reply> drain(resp_parser& p) {
  std::vector<reply> out;
  reply r;
  while (p.next(r) == resp_parser::result::reply) out.push_back(std::move(r));
  return out;
}
}  // namespace

TEST_CASE("every reply kind") {
  resp_parser p;
  using namespace std::string_literals;
  std::string in = "+OK\r\n-ERR bad\r\n:42\r\n$3\r\na\0b\r\n$-1\r\n*2\r\n:1\r\n*1\r\n$1\r\nx\r\n*-1\r\n"s;
  p.feed(in.data(), in.size());
  auto r = drain(p);
  REQUIRE(r.size() == 7);
  CHECK(r[0].kind() == reply_kind::status);
  CHECK(r[0].as_string() == "OK");
  CHECK(r[1].error_message() == "ERR bad");
  CHECK(r[2].as_integer() == 42);
  CHECK(r[3].as_string() == std::string("a\0b", 3));
  CHECK(r[4].is_nil());
  CHECK(r[5].as_array().size() == 2);
  CHECK(r[5].as_array()[1].as_array()[0].as_string() == "x");
  CHECK(r[6].is_nil());
}

TEST_CASE("replies split at every byte and merged come out the same") {
  std::string in = "*3\r\n$5\r\nhello\r\n:-7\r\n*0\r\n+PONG\r\n";
  for (std::size_t chunk = 1; chunk <= in.size(); ++chunk) {
    resp_parser p;
    std::vector<reply> got;
    for (std::size_t i = 0; i < in.size(); i += chunk) {
      p.feed(in.data() + i, std::min(chunk, in.size() - i));
      for (auto& r : drain(p)) got.push_back(std::move(r));
    }
    REQUIRE(got.size() == 2);
    CHECK(got[0].as_array()[0].as_string() == "hello");
    CHECK(got[0].as_array()[1].as_integer() == -7);
    CHECK(got[0].as_array()[2].as_array().empty());
    CHECK(got[1].as_string() == "PONG");
  }
}

TEST_CASE("garbage is a protocol error - and reset starts over") {
  resp_parser p;
  std::string in = "+OK\r\n!nonsense\r\n";
  p.feed(in.data(), in.size());
  reply r;
  CHECK(p.next(r) == resp_parser::result::reply);
  CHECK(p.next(r) == resp_parser::result::error);
  CHECK_FALSE(p.error_message().empty());
  p.reset();
  std::string ok = ":1\r\n";
  p.feed(ok.data(), ok.size());
  CHECK(p.next(r) == resp_parser::result::reply);
  CHECK(r.as_integer() == 1);
}

TEST_CASE("typed accessors refuse the wrong kind with a clear message") {
  resp_parser p;
  std::string in = ":5\r\n-WRONGTYPE nope\r\n";
  p.feed(in.data(), in.size());
  auto r = drain(p);
  CHECK_THROWS_WITH_AS(r[0].as_string(), "expected string reply, got integer", jobrt::redis::reply_type_error);
  CHECK_THROWS_WITH_AS(r[1].as_integer(), "expected integer reply, got error 'WRONGTYPE nope'",
                       jobrt::redis::reply_type_error);
}
