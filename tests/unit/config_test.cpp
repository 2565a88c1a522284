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

TEST_CASE("redis+sentinel URLs name the sentinels, the primary's name, and who logs in where") {
  auto c = config::from_url("redis+sentinel://:pw@10.0.0.1,10.0.0.2:26380,[::1]:26381/orders?db=2");
  REQUIRE(c.sentinels.size() == 3);
  CHECK(c.sentinels[0].host == "10.0.0.1");
  CHECK(c.sentinels[0].port == "26379");  // Sentinel's port when none is written
  CHECK(c.sentinels[1].port == "26380");
  CHECK(c.sentinels[2].host == "::1");
  CHECK(c.sentinel_master == "orders");
  CHECK(c.password == "pw");  // the primary's
  CHECK(c.sentinel_password.empty());
  CHECK(c.database == 2);
  CHECK_FALSE(c.tls);
  CHECK(c.address() == "redis+sentinel://10.0.0.1:26379,10.0.0.2:26380,[::1]:26381/orders?db=2");
  // How sentinel 1 is reached: its own address and credentials, no database.
  c = config::from_url("redis+sentinel://u:pw@h1,h2:5/m?sentinel_user=watch&sentinel_password=s3");
  auto at = c.sentinel(1);
  CHECK(at.host == "h2");
  CHECK(at.port == "5");
  CHECK(at.username == "watch");
  CHECK(at.password == "s3");
  CHECK(at.database == 0);
  CHECK(at.sentinels.empty());
  CHECK(at.address() == "redis://h2:5/0");
  // With TLS: the same parameters as rediss://.
  c = config::from_url("rediss+sentinel://h1/m?ca=/ca.pem&sni=cache");
  CHECK(c.tls);
  CHECK(c.tls_ca_file == "/ca.pem");
  CHECK(c.sentinel(0).tls);
  CHECK(c.sentinel(0).tls_ca_file == "/ca.pem");
  CHECK(c.address() == "rediss+sentinel://h1:26379/m");
}

TEST_CASE("a bad redis+sentinel URL names what is wrong, and never shows a password") {
  CHECK(error_of("redis+sentinel://h1,h2") ==
        "invalid Redis URL 'redis+sentinel://h1,h2': the primary's name is missing "
        "(redis+sentinel://host:26379/<name>)");
  CHECK(error_of("redis+sentinel://h1,,h2/m").find("a sentinel's host is empty") != std::string::npos);
  CHECK(error_of("redis+sentinel://h1,h2:x/m").find("port 'x' is not a number") != std::string::npos);
  CHECK(error_of("redis+sentinel://h1/m?ca=/x") ==
        "invalid Redis URL 'redis+sentinel://h1/m?ca=/x': unknown parameter 'ca' (redis+sentinel:// takes db, "
        "sentinel_user and sentinel_password)");
  CHECK(error_of("redis+sentinel://h1/m?db=x").find("database 'x'") != std::string::npos);
  CHECK(error_of("redis://h1/?db=1").find("parameters are for rediss:// and redis+sentinel://") != std::string::npos);
  CHECK(error_of("rediss://h1/?db=1").find("unknown parameter 'db' (rediss:// takes ca,") != std::string::npos);
  CHECK(error_of("redis+sentinel://h1/m?sentinel_user=w").find("sentinel_user 'w' has no sentinel_password") !=
        std::string::npos);
  auto shown = error_of("redis+sentinel://:hunter2@h1/m?sentinel_password=hunter3&db=x");
  CHECK(shown.find("hunter") == std::string::npos);
  CHECK(shown.find("sentinel_password=***&db=x") != std::string::npos);
  // A parameter misspelt, or one jobrt does not take, may hold a secret too.
  shown = error_of("redis+sentinel://h1/m?sentinel_pasword=hunter4&ca=/ca.pem");
  CHECK(shown ==
        "invalid Redis URL 'redis+sentinel://h1/m?sentinel_pasword=***&ca=/ca.pem': unknown parameter "
        "'sentinel_pasword' (redis+sentinel:// takes db, sentinel_user and sentinel_password)");
}

TEST_CASE("a bad URL names the part that is wrong") {
  CHECK(error_of("http://localhost:6379") ==
        "invalid Redis URL 'http://localhost:6379': scheme 'http' is none of redis://, rediss://, redis+sentinel://, "
        "rediss+sentinel:// and unix://");
  CHECK(error_of("redis://localhost:abc").find("port 'abc'") != std::string::npos);
  CHECK(error_of("redis://localhost:70000").find("port '70000'") != std::string::npos);
  CHECK(error_of("redis://localhost/x1").find("database 'x1'") != std::string::npos);
  CHECK(error_of("redis://:6379").find("host is empty") != std::string::npos);
  CHECK(error_of("unix://").find("path is empty") != std::string::npos);
  CHECK(error_of("unix:///s?foo=1").find("unknown parameter 'foo'") != std::string::npos);
  CHECK(error_of("not a url").find("not a URL") != std::string::npos);
}

TEST_CASE("a bad URL's error never shows a password that holds '/', '@' or '&', nor a query's values") {
  auto shown = error_of("redis://:ab/hunter5@localhost:abc");
  CHECK(shown.find("hunter5") == std::string::npos);
  shown = error_of("redis://:p@hunter6@localhost:abc");
  CHECK(shown.find("hunter6") == std::string::npos);
  CHECK(shown.find("'redis://:***@localhost:abc'") != std::string::npos);
  shown = error_of("redis+sentinel://h1/m?sentinel_password=hunter7&tail8");
  CHECK(shown.find("hunter7") == std::string::npos);
  CHECK(shown.find("tail8") == std::string::npos);
  CHECK(shown.find("a parameter without a value") != std::string::npos);
  shown = error_of("redis://h/0?password=hunter9");  // (as redis-py users may write it)
  CHECK(shown.find("hunter9") == std::string::npos);
  CHECK(shown.find("parameters are for rediss:// and redis+sentinel:// only") != std::string::npos);
}

TEST_CASE("a bad URL's error never shows its password") {
  CHECK(error_of("redis://:hunter2@localhost:abc") ==
        "invalid Redis URL 'redis://:***@localhost:abc': port 'abc' is not a number from 1 to 65535");
  CHECK(error_of("redis://bob:hunter2@localhost/x1").find("'redis://bob:***@localhost/x1'") != std::string::npos);
  CHECK(error_of("http://bob:hunter2@localhost").find("hunter2") == std::string::npos);
  CHECK(error_of("redis://alice@localhost").find("'redis://alice@localhost'") != std::string::npos);  // no password
}
