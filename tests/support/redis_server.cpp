#include "support/redis_server.hpp"
#include "support/run.hpp"
#include "support/shell.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace jobrt::test {
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) throw std::runtime_error("bind failed");
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

namespace {

// A minimal blocking RESP exchange, independent of the code under test.
std::string raw_command(int port, const std::vector<std::string>& args, std::chrono::milliseconds wait) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  timeval tv{static_cast<time_t>(wait.count() / 1000), static_cast<suseconds_t>((wait.count() % 1000) * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return {};
  }
  std::string out = fmt::format("*{}\r\n", args.size());
  for (auto& a : args) out += fmt::format("${}\r\n{}\r\n", a.size(), a);
  (void)!::write(fd, out.data(), out.size());
  char buf[4096];
  ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

}  // namespace

redis_server::redis_server(std::vector<std::string> extra_args) : extra_(std::move(extra_args)) {
  char tmpl[] = "/tmp/jobrt-redis-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  port_ = free_port();
  start();
}

redis_server::~redis_server() {
  stop(true);
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

void redis_server::start() {
  std::vector<std::string> args{"redis-server",
                                "--port",
                                std::to_string(port_),
                                "--bind",
                                "127.0.0.1",
                                "--save",
                                "",
                                "--appendonly",
                                "no",
                                "--dir",
                                dir_,
                                "--unixsocket",
                                unix_socket(),
                                "--unixsocketperm",
                                "700",
                                "--daemonize",
                                "no",
                                "--loglevel",
                                "warning",
                                "--logfile",
                                dir_ + "/redis.log"};
  args.insert(args.end(), extra_.begin(), extra_.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (::posix_spawnp(&pid_, "redis-server", nullptr, nullptr, argv.data(), environ) != 0)
    throw std::runtime_error("cannot start redis-server (is it installed?)");
  // Wait until it answers (bounded).
  auto answers = [&] {
    std::string r = raw_command(port_, {"PING"}, std::chrono::milliseconds(200));
    return r.starts_with("+PONG") || r.starts_with("-NOAUTH");
  };
  if (eventually_here(answers, std::chrono::seconds(10))) return;
  throw std::runtime_error(fmt::format("redis-server on port {} did not come up", port_));
}

void redis_server::stop(bool hard) {
  if (pid_ <= 0) return;
  ::kill(pid_, hard ? SIGKILL : SIGTERM);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

std::string redis_server::url() const { return fmt::format("redis://127.0.0.1:{}", port_); }

redis::config redis_server::config() const { return redis::config::from_url(url()); }

redis::config shared_redis() {
  if (const char* url = std::getenv("JOBRT_TEST_REDIS_URL"); url != nullptr && *url != '\0')
    return redis::config::from_url(url);
  static redis_server server;  // one per test process, gone at exit
  return server.config();
}

redis::config shared_tls_redis() {
  if (const char* url = std::getenv("JOBRT_TEST_TLS_URL"); url != nullptr && *url != '\0')
    return redis::config::from_url(url);
  struct private_server {
    int port = 0, tls_port = 0;
    std::string dir;
    private_server() {
      std::istringstream in(output_of("TLS=1 " JOBRT_SCRIPTS "/redis.sh"));
      if (!(in >> port >> dir >> tls_port)) throw std::runtime_error("TLS=1 scripts/redis.sh printed no ports");
    }
    ~private_server() { (void)std::system(fmt::format(JOBRT_SCRIPTS "/redis.sh stop {}", dir).c_str()); }
  };
  static private_server server;  // one per test process, gone at exit
  return redis::config::from_url(fmt::format("rediss://127.0.0.1:{}/?ca={}/ca.crt", server.tls_port, server.dir));
}

std::string key_prefix() {
  // The process id alone would repeat: ctest runs each case in a process of its own, and a
  // server shared by several runs may still hold the keys of an earlier process of that id.
  static const std::uint32_t run = std::random_device()();
  static std::atomic<int> counter{0};
  return fmt::format("test:{}.{:08x}:{}:", ::getpid(), run, counter++);
}

std::string redis_cli(const redis::config& cfg, const std::vector<std::string>& args) {
  return raw_command(std::stoi(cfg.port), args, std::chrono::milliseconds(5000));
}

}  // namespace jobrt::test
