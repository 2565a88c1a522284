// The jobrt command: shared pieces of its subcommands.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace jobrt::cli {

using args = std::vector<std::string>;

/// Wrong use of the command line: printed with the usage, exit code 2.
class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The value after option a[i] (advances i); throws usage_error when missing.
std::string string_arg(const args& a, std::size_t& i);
/// The same, as a non-negative integer.
std::size_t number_arg(const args& a, std::size_t& i);

int demo(const args& a);
/// Hidden: a worker process of `jobrt demo --redis` (not in the usage).
int demo_worker(const args& a);

}  // namespace jobrt::cli
