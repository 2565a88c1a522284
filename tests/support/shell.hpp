// Test support: running shell commands (the scripts that start servers, redis-cli).
#pragma once

#include <string>

namespace jobrt::test {

/// Runs a shell command and returns what it printed; throws std::runtime_error, with that
/// output, when its exit status is not 0.
std::string output_of(const std::string& command);

/// `arg` quoted for the shell.
std::string quoted(const std::string& arg);

}  // namespace jobrt::test
