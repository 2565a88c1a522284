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
  // A time first: 2026-11-26T01:23:45.678Z
  REQUIRE(text.size() > 25);
  CHECK(text[4] == '-');
  CHECK(text[10] == 'T');
  CHECK(text[19] == '.');
  CHECK(text[23] == 'Z');
  CHECK(text.substr(23) == "Z jobrt error worker w1: kept 2\n");
  auto year = std::stoi(text.substr(0, 4));
  CHECK(year >= 2024);
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
  auto job = boost::json::parse(captured([] {
    set_log_json(true);
    log(log_level::info, log_fields{"17", "tenant-3", "import", 2, "w1"}, "job 17", "halfway");
    set_log_json(false);
  }));
  CHECK(job.at("job") == "17");
  CHECK(job.at("group") == "tenant-3");
  CHECK(job.at("type") == "import");
  CHECK(job.at("attempt") == 2);
  CHECK(job.at("worker") == "w1");
  CHECK(job.at("msg") == "halfway");
  auto bare = boost::json::parse(captured([] {
    set_log_json(true);
    log_fields fields;
    fields.job = "18";
    log(log_level::info, fields, "job 18", "ungrouped");
    set_log_json(false);
  }));
  CHECK(bare.as_object().contains("job"));
  CHECK_FALSE(bare.as_object().contains("group"));  // fields not set are left out
  CHECK_FALSE(bare.as_object().contains("attempt"));
  CHECK(parse_log_level("debug") == log_level::debug);
  CHECK_THROWS_AS(parse_log_level("loud"), std::invalid_argument);
}
