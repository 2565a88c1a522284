#include "support/redis_sentinel.hpp"
#include "support/shell.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace jobrt::test {

redis_sentinels::redis_sentinels(std::string password, std::string sentinel_password, bool tls)
    : password_(std::move(password)), sentinel_password_(std::move(sentinel_password)), tls_(tls) {
  std::istringstream in(
      output_of(fmt::format("PASSWORD={} SENTINEL_PASSWORD={} TLS={} " JOBRT_SCRIPTS "/sentinel.sh start",
                            quoted(password_), quoted(sentinel_password_), tls_ ? 1 : 0)));
  servers_.resize(2);
  sentinels_.resize(3);
  in >> servers_[0] >> servers_[1] >> sentinels_[0] >> sentinels_[1] >> sentinels_[2] >> dir_;
  if (dir_.empty()) throw std::runtime_error("scripts/sentinel.sh start printed no ports and directory");
}

redis_sentinels::~redis_sentinels() {
  (void)std::system(fmt::format(JOBRT_SCRIPTS "/sentinel.sh stop {}", dir_).c_str());
}

std::string redis_sentinels::url() const {
  std::vector<std::string> params;
  if (!sentinel_password_.empty()) params.push_back("sentinel_password=" + sentinel_password_);
  if (tls_) params.push_back(fmt::format("ca={}/ca.crt", dir_));
  return fmt::format("{}+sentinel://{}127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}/jobrt{}{}", tls_ ? "rediss" : "redis",
                     password_.empty() ? "" : ":" + password_ + "@", sentinels_[0], sentinels_[1], sentinels_[2],
                     params.empty() ? "" : "?", fmt::join(params, "&"));
}

std::string redis_sentinels::cli(int port, const std::vector<std::string>& args) const {
  bool at_sentinel = std::find(sentinels_.begin(), sentinels_.end(), port) != sentinels_.end();
  const auto& password = at_sentinel ? sentinel_password_ : password_;
  auto command = fmt::format("redis-cli -p {}", port);
  if (tls_) command += fmt::format(" --tls --cacert {}/ca.crt", dir_);
  if (!password.empty()) command = fmt::format("REDISCLI_AUTH={} {}", quoted(password), command);
  for (const auto& a : args) command += " " + quoted(a);
  return output_of(command + " 2>&1");
}

int redis_sentinels::primary() const {
  for (int s : sentinels_) {
    try {
      std::istringstream out(cli(s, {"SENTINEL", "GET-MASTER-ADDR-BY-NAME", "jobrt"}));
      std::string host;
      int port = 0;
      if (out >> host >> port && port > 0) return port;
    } catch (const std::exception&) {
      // (this one is down: ask the next)
    }
  }
  throw std::runtime_error("no sentinel names the primary");
}

std::string redis_sentinels::role_of(int port) const {
  try {
    std::istringstream out(cli(port, {"ROLE"}));
    std::string role;
    out >> role;
    return role == "master" || role == "slave" ? role : "";
  } catch (const std::exception&) {
    return "";
  }
}

void redis_sentinels::signal(int port, int sig) const {
  bool at_sentinel = std::find(sentinels_.begin(), sentinels_.end(), port) != sentinels_.end();
  std::ifstream in(fmt::format("{}/{}/{}.pid", dir_, port, at_sentinel ? "sentinel" : "redis"));
  pid_t pid = 0;
  if (!(in >> pid) || pid <= 0) throw std::runtime_error(fmt::format("no pid file for port {}", port));
  ::kill(pid, sig);
}

void redis_sentinels::restart(int port) const {
  output_of(fmt::format("PASSWORD={} SENTINEL_PASSWORD={} " JOBRT_SCRIPTS "/sentinel.sh restart {} {}",
                        quoted(password_), quoted(sentinel_password_), dir_, port));
}

}  // namespace jobrt::test
