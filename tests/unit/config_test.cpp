#include <jobrt/redis/config.hpp>

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

using jobrt::redis::config;

namespace {
std::string error_of(const char* url) {
  try {
    config::from_url(url);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("redis URLs") {
  auto c = config::from_url("redis://127.0.0.1:6390/3");
  CHECK(c.host == "127.0.0.1");
  CHECK(c.port == "6390");
  CHECK(c.database == 3);
  CHECK(c.password.empty());

  c = config::from_url("redis://alice:s%40cret@localhost");
  CHECK(c.username == "alice");
  CHECK(c.password == "s@cret");
  CHECK(c.port == "6379");
  CHECK(c.database == 0);

  c = config::from_url("redis://:pw@[::1]:7000");
  CHECK(c.username.empty());
  CHECK(c.password == "pw");
  CHECK(c.host == "::1");
  CHECK(c.address() == "redis://[::1]:7000/0");

  // A user without a password would log in as the default user: refused, naming it.
  CHECK(error_of("redis://alice@localhost") ==
        "invalid Redis URL 'redis://alice@localhost': user 'alice' has no password (redis://user:password@host)");
  CHECK(error_of("redis://alice:@localhost").find("user 'alice' has no password") != std::string::npos);
}

TEST_CASE("unix URLs") {
  auto c = config::from_url("unix:///tmp/redis.sock?db=2");
  CHECK(c.unix_path == "/tmp/redis.sock");
  CHECK(c.database == 2);
  CHECK(c.address() == "unix:///tmp/redis.sock");
}

TEST_CASE("a bad URL names the part that is wrong") {
  CHECK(error_of("http://localhost:6379") ==
        "invalid Redis URL 'http://localhost:6379': scheme 'http' is none of redis://, rediss:// and unix://");
  CHECK(error_of("redis://localhost:abc").find("port 'abc'") != std::string::npos);
  CHECK(error_of("redis://localhost:70000").find("port '70000'") != std::string::npos);
  CHECK(error_of("redis://localhost/x1").find("database 'x1'") != std::string::npos);
  CHECK(error_of("redis://:6379").find("host is empty") != std::string::npos);
  CHECK(error_of("unix://").find("path is empty") != std::string::npos);
  CHECK(error_of("unix:///s?foo=1").find("unknown parameter 'foo'") != std::string::npos);
  CHECK(error_of("not a url").find("not a URL") != std::string::npos);
}

TEST_CASE("a bad URL's error never shows its password") {
  CHECK(error_of("redis://:hunter2@localhost:abc") ==
        "invalid Redis URL 'redis://:***@localhost:abc': port 'abc' is not a number from 1 to 65535");
  CHECK(error_of("redis://bob:hunter2@localhost/x1").find("'redis://bob:***@localhost/x1'") != std::string::npos);
  CHECK(error_of("http://bob:hunter2@localhost").find("hunter2") == std::string::npos);
  CHECK(error_of("redis://alice@localhost").find("'redis://alice@localhost'") != std::string::npos);  // no password
}
