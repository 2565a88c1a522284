#include "support/redis_cluster.hpp"

#include <fmt/format.h>

#include <signal.h>
#include <sys/types.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>

namespace jobrt::test {

namespace {

// Runs a shell command and returns what it printed (its exit status must be 0).
std::string output_of(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), ::pclose);
  if (!pipe) throw std::runtime_error("could not run: " + command);
  std::string out;
  char buf[4096];
  while (auto n = std::fread(buf, 1, sizeof buf, pipe.get())) out.append(buf, n);
  if (::pclose(pipe.release()) != 0) throw std::runtime_error(fmt::format("failed: {}\n{}", command, out));
  return out;
}

std::string quoted(const std::string& arg) {
  std::string q = "'";
  for (char c : arg) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

redis_cluster::redis_cluster() {
  std::istringstream in(output_of(JOBRT_SCRIPTS "/cluster.sh start"));
  in >> first_ >> dir_;
  if (first_ <= 0 || dir_.empty()) throw std::runtime_error("scripts/cluster.sh start printed no port and directory");
}

redis_cluster::~redis_cluster() { (void)std::system(fmt::format(JOBRT_SCRIPTS "/cluster.sh stop {}", dir_).c_str()); }

redis::config redis_cluster::config(int node) const {
  redis::config cfg;
  cfg.host = "127.0.0.1";
  cfg.port = std::to_string(first_ + node);
  return cfg;
}

void redis_cluster::kill(int node) const {
  std::ifstream in(fmt::format("{}/{}/redis.pid", dir_, first_ + node));
  pid_t pid = 0;
  if (!(in >> pid) || pid <= 0) throw std::runtime_error(fmt::format("no pid file for node {}", first_ + node));
  ::kill(pid, SIGKILL);
}

void redis_cluster::restart(int node) const {
  auto command = fmt::format(JOBRT_SCRIPTS "/cluster.sh restart {} {}", dir_, first_ + node);
  if (std::system(command.c_str()) != 0) throw std::runtime_error(command + " failed");
}

redis::config shared_cluster() {
  if (const char* url = std::getenv("JOBRT_TEST_CLUSTER_URL"); url != nullptr && *url != '\0')
    return redis::config::from_url(url);
  static redis_cluster cluster;  // one per test process, gone at exit
  return cluster.config(0);
}

std::string redis_cluster::url() const { return fmt::format("redis://127.0.0.1:{},127.0.0.1:{}", first_, first_ + 1); }

std::string redis_cluster::cli(int node, const std::vector<std::string>& args) const {
  std::string command = fmt::format("redis-cli -p {}", first_ + node);
  for (const auto& a : args) command += " " + quoted(a);
  return output_of(command + " 2>&1");
}

}  // namespace jobrt::test
