// The logging layer: levels filter, text and JSON lines.
#include <jobrt/log.hpp>

#include <doctest/doctest.h>
#include <boost/json/parse.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace {

// What the body writes to stderr.
template <class Body>
std::string captured(Body body) {
  char path[] = "/tmp/jobrt-log-XXXXXX";
  int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  int saved = ::dup(STDERR_FILENO);
  ::dup2(fd, STDERR_FILENO);
  body();
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  ::close(fd);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path);
  return text;
}

}  // namespace

TEST_CASE("log - levels filter and the two formats") {
  using namespace jobrt;
  auto text = captured([] {
    set_log_level(log_level::warn);
    log(log_level::info, "worker w1", "dropped {}", 1);
    log(log_level::error, "worker w1", "kept {}", 2);
  });
  CHECK(text == "jobrt error worker w1: kept 2\n");
  auto json = captured([] {
    set_log_json(true);
    log(log_level::warn, "job 7", "say \"{}\"", "hi");
    set_log_json(false);
    set_log_level(log_level::info);
  });
  auto v = boost::json::parse(json);
  CHECK(v.at("level") == "warn");
  CHECK(v.at("source") == "job 7");
  CHECK(v.at("msg") == "say \"hi\"");
  CHECK(v.at("ts").as_int64() > 0);
  CHECK(parse_log_level("debug") == log_level::debug);
  CHECK_THROWS_AS(parse_log_level("loud"), std::invalid_argument);
}
