#include "support/redis_cluster.hpp"
#include "support/shell.hpp"

#include <fmt/format.h>

#include <signal.h>
#include <sys/types.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace jobrt::test {

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

std::string redis_cluster::id_of(int port) const {
  auto out = cli(port - first_, {"CLUSTER", "MYID"});
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

namespace {
// CLUSTER NODES' primaries: port → the slot ranges it serves ("<first>-<last>" or "<slot>").
std::vector<std::pair<int, std::vector<std::string>>> primaries_in(const std::string& nodes) {
  std::vector<std::pair<int, std::vector<std::string>>> out;
  std::istringstream lines(nodes);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string id, address, flags, master, ping, pong, epoch, link;
    if (!(fields >> id >> address >> flags >> master >> ping >> pong >> epoch >> link)) continue;
    if (flags.find("master") == std::string::npos || flags.find("fail") != std::string::npos) continue;
    auto colon = address.rfind(':', address.find('@'));
    std::vector<std::string> ranges;
    for (std::string range; fields >> range;)
      if (range.front() != '[') ranges.push_back(range);  // (not "[slot->-id]", a migration under way)
    out.emplace_back(std::atoi(address.c_str() + colon + 1), std::move(ranges));
  }
  return out;
}
}  // namespace

std::vector<int> redis_cluster::primaries() const {
  std::vector<int> out;
  for (auto& p : primaries_in(cli(0, {"CLUSTER", "NODES"}))) out.push_back(p.first);
  return out;
}

int redis_cluster::owner_of(int slot) const {
  for (auto& [port, ranges] : primaries_in(cli(0, {"CLUSTER", "NODES"}))) {
    for (auto& range : ranges) {
      auto dash = range.find('-');
      int first = std::atoi(range.c_str());
      int last = dash == std::string::npos ? first : std::atoi(range.c_str() + dash + 1);
      if (slot >= first && slot <= last) return port;
    }
  }
  throw std::runtime_error(fmt::format("no primary serves slot {}", slot));
}

int redis_cluster::slot_of(const std::string& key) const {
  return std::atoi(cli(0, {"CLUSTER", "KEYSLOT", key}).c_str());
}

void redis_cluster::move_slot(int slot, int from, int to, int step, std::chrono::milliseconds pause) const {
  auto from_id = id_of(from), to_id = id_of(to);
  auto s = std::to_string(slot);
  cli(to - first_, {"CLUSTER", "SETSLOT", s, "IMPORTING", from_id});
  cli(from - first_, {"CLUSTER", "SETSLOT", s, "MIGRATING", to_id});
  for (;;) {  // (redis-cli --cluster reshard moves a hundred keys a MIGRATE)
    std::istringstream keys(cli(from - first_, {"CLUSTER", "GETKEYSINSLOT", s, std::to_string(step)}));
    std::vector<std::string> migrate{"MIGRATE", "127.0.0.1", std::to_string(to), "", "0", "5000", "KEYS"};
    for (std::string key; std::getline(keys, key);)
      if (!key.empty()) migrate.push_back(key);
    if (migrate.size() == 7) break;
    cli(from - first_, migrate);
    std::this_thread::sleep_for(pause);
  }
  for (int port : primaries()) cli(port - first_, {"CLUSTER", "SETSLOT", s, "NODE", to_id});
}

long redis_cluster::errors(const std::string& kind) const {
  long sum = 0;
  for (int node = 0; node < nodes; ++node) {
    std::string stats;
    try {
      stats = cli(node, {"INFO", "errorstats"});
    } catch (const std::exception&) {
      continue;  // (a node down)
    }
    auto at = stats.find("errorstat_" + kind + ":count=");
    if (at != std::string::npos) sum += std::atol(stats.c_str() + at + kind.size() + 17);
  }
  return sum;
}

std::string redis_cluster::cli(int node, const std::vector<std::string>& args) const {
  std::string command = fmt::format("redis-cli -p {}", first_ + node);
  for (const auto& a : args) command += " " + quoted(a);
  return output_of(command + " 2>&1");
}

}  // namespace jobrt::test
