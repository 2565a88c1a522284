// The jobrt command.
#include <fmt/format.h>

#include <cstring>

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "version") == 0) {
    fmt::print("jobrt 0.1.0\n");
    return 0;
  }
  if (argc >= 2 && std::strcmp(argv[1], "demo") == 0) {
    fmt::print(
        "jobrt demo: the stock-arrival demo comes with the runtime core; this build has the Redis connection only.\n");
    return 0;
  }
  fmt::print(stderr, "usage: jobrt version | demo\n");
  return 2;
}
